"""Command-line plumbing shared by the model tools: an argparse parser whose errors are one
line, `run`, which turns the tools' expected failures into one line on stderr, and
`model_summary`, the line convert and synth end with (and their one-line warning on stderr
when the file written is of a version other than ENGINE_VERSION, the one ./gemma runs)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from builder.models.modelfile import Q8_0
from builder.models.modelfile4 import OP_REC, VERSION, Op

# The model file version the engine built from this tree runs: asm/format.asm's MODEL_VERSION,
# and the opcodes it runs: asm/program.asm's op table (OPC_*; Gemma 4 MoE's ROUTE, SKIP and WADD
# are not in its budget: docs/build.md); emu_tests/models/test_format_mirror.py holds them equal.
ENGINE_VERSION = VERSION
ENGINE_OPS = frozenset(Op) - {Op.ROUTE, Op.SKIP, Op.WADD}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we print one line
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def run(prog: str, body: Callable[[], object], errors: tuple[type[BaseException], ...],
        summary: Callable[[object], str] | None = None) -> int:
    """Call body(); print summary(its result) when given. On one of `errors` (or OSError,
    KeyboardInterrupt) print one line, return 1 (an OSError as "FILE: what the system said")."""
    try:
        result = body()
    except OSError as e:
        what = f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)
        print(f"{prog}: error: {what}", file=sys.stderr)
        return 1
    except errors as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    if summary:
        print(summary(result))
    return 0


def opcodes(path: Path, h) -> set[int]:
    """The opcodes of a version 4 file's program, read from its records (the file just written
    and validated: no second validation)."""
    with open(path, "rb") as f:
        f.seek(h.program_off)
        data = f.read(OP_REC * h.n_ops)
    return {int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), OP_REC)}


def model_summary(prog: str, path: Path) -> Callable[[object], str]:
    """The one line convert and synth end with: the file, its size, the model's shapes and
    the matrices' type; before it, on stderr, one line when ./gemma cannot run the file (its
    version is not ENGINE_VERSION, or its program has ops not in ENGINE_OPS). The file is
    written either way."""
    def line(header) -> str:
        h = header
        if h.version != ENGINE_VERSION:
            print(f"{prog}: warning: ./gemma cannot run {path} yet: it is model file version {h.version}, "
                  f"this build's engine runs version {ENGINE_VERSION}", file=sys.stderr)
        elif missing := sorted(opcodes(path, h) - ENGINE_OPS):
            print(f"{prog}: warning: ./gemma cannot run {path} yet: its program has "
                  f"{', '.join(Op(o).name for o in missing)} (MoE), which this build's engine lacks "
                  "(it refuses the file: bad program); the numpy twins and `show` run it", file=sys.stderr)
        if h.version == 4:
            return (f"wrote {path}: {h.file_size:,} bytes; version 4 (Gemma {h.generation}), vocab {h.vocab}, "
                    f"{h.n_ops} ops on {h.n_slots} slots, context {h.max_ctx}")
        if h.version == 3:
            extra = (f", per-layer inputs of {h.ple_dim}" if h.ple_dim else "") + \
                (f", {h.experts} experts of {h.expert_ffn} (top {h.top_k})" if h.experts else "")
            return (f"wrote {path}: {h.file_size:,} bytes; version 3, vocab {h.vocab}, d {h.dim}, {h.layers} layers, "
                    f"{h.heads} heads{extra}, {'q8_0' if h.flags & Q8_0 else 'f16'} weights, context {h.max_ctx}")
        return (f"wrote {path}: {h.file_size:,} bytes; vocab {h.vocab}, d {h.dim}, ffn {h.ffn}, "
                f"{h.layers} layers, {h.heads} heads ({h.kv_heads} kv) of {h.head_dim}, "
                f"flags {h.flags}, {'q8_0' if h.flags & Q8_0 else 'f16'} weights, context {h.max_ctx}")
    return line
