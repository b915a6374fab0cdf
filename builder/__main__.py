"""`python -m builder [COMMAND] ...`: the project's one command line.

With no command (or options only) it builds `./gemma`; `convert`, `synth` and `bench` are the
model and benchmark tools; `demo` runs the real Gemma 3 270M model. Each command lives in its own module exposing
`main(argv: list[str]) -> int`, imported only when chosen.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "build": "builder.build",
    "convert": "builder.convert",
    "synth": "builder.synth",
    "bench": "builder.bench",
    "demo": "builder.demo",
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    else:
        name, rest = "build", argv
    return importlib.import_module(COMMANDS[name]).main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
