"""`python -m builder [COMMAND] ...`: the project's one command line.

With no command (or options only) it builds `./gemma`; `convert`, `show`, `synth` and `bench` are
the model and benchmark tools; `demo` runs the real Gemma 3 270M model. Each command lives in its
own module exposing `main(argv: list[str]) -> int`, imported only when chosen; `--help` lists
them, `COMMAND --help` gives each one's options, `--version` prints the project's version.
"""
from __future__ import annotations

import importlib
import sys
from importlib import metadata

COMMANDS = {  # name: (module, one line)
    "build": ("builder.asm.build", "assemble asm/ into the image gemma.elf and pack it into "
                                   "./gemma, verified and checked (the default)"),
    "convert": ("builder.models.convert", "a Hugging Face directory or GGUF file -> a model file"),
    "show": ("builder.models.show", "a model file's program (version 4), one op per line"),
    "synth": ("builder.models.synth", "a random model of a preset's shapes (and its GGUF twin)"),
    "bench": ("builder.bench.main", "speed against memory bandwidth and llama.cpp"),
    "demo": ("builder.demo", "run ./gemma on the real Gemma 3 270M model"),
    "pack": ("builder.asm.pack_search", "the packer's model: measure it, search a new one or the include order"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m builder [COMMAND] [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "python -m builder COMMAND --help: the options of one command; "
              "python -m builder --version: the version"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if argv[:1] == ["--version"]:
        print(f"gemma-asm {metadata.version('gemma-asm')}")
        return 0
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(f"python -m builder: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    else:
        name, rest = "build", argv
    return importlib.import_module(COMMANDS[name][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
