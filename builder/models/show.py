"""`python -m builder show MODEL`: a version 4 model file's program, one op per line.

The file has no names: a slot is shown by its number (from 1, as ops name it) and the width the
op reads it at, `s4[64]` (`s3[4x16]`: m groups or heads of n; a CACHE slot `k9[16]`, rows by
position), a weight by its offset from weights_off, type and shape, `w@0x1040 f32[64]`; `<-`
writes the destination, `+=` adds to it (ACC). Fields an op does not use are not shown (a ROPE
with k = 0 shows no s1: it is not touched); ROUTE's weight (the router's [n, m] rows, then the n
expert scales) shows as one F32 vector. Before the ops, a summary of the header, the slots
and the chat strings. The file is validated first (modelfile4.ModelFile4): what is shown is
what the engine would run.

    NORM   s2[64] <- s1[64] w@0x40000 f32[64] eps 1e-06
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from builder.cli import Parser, run
from builder.models.modelfile import ModelFormatError
from builder.models.modelfile3 import file_version
from builder.models.modelfile4 import ACC, CACHE, DTYPES, RULES, STRINGS, VERSION, ModelFile4, Op, OpRec


def num(v: float) -> str:
    """A float32 field's value, in the fewest digits that name it exactly."""
    return str(np.float32(v))


class Listing:
    def __init__(self, f: ModelFile4):
        self.f = f

    def slot(self, s: int, n: int, m: int = 1) -> str:
        kind = "k" if self.f.slots[s - 1].flags & CACHE else "s"
        return f"{kind}{s}[{n}]" if m == 1 else f"{kind}{s}[{m}x{n}]"

    def weight(self, o: OpRec) -> str:
        shape = ",".join(map(str, self.f.weight_shape(o)))
        return f"w@{o.w:#x} {DTYPES[o.wtype]}[{shape}]"

    def op(self, o: OpRec) -> str:
        """One op as `NAME operands`."""
        s, w, to = self.slot, self.weight(o) if RULES[Op(o.op)].weight else "", "+=" if o.flags & ACC else "<-"
        text = {
            Op.EMBED: lambda: f"{s(o.s0, o.n)} <- {w} cols {o.j}..{o.j + o.n - 1} * {num(o.a)}",
            Op.NORM: lambda: f"{s(o.s0, o.n, o.m)} {to} {s(o.s1, o.n, o.m)} {w} eps {num(o.a)}",
            Op.MATMUL: lambda: f"{s(o.s0, o.m)} {to} {w} {s(o.s1, o.n)}" + (
                f"; {s(o.s2, o.m)} <- gelu({s(o.s2, o.m)}) * {s(o.s0, o.m)}" if o.s2 else ""),
            Op.ROPE: lambda: f"{s(o.s0, o.n, o.m)}" + (f" {s(o.s1, o.n, o.k)}" if o.k else "") + f" {w}",
            Op.ATTN: lambda: (f"{s(o.s0, o.n, o.m)} <- {s(o.s1, o.n, o.m)} K {s(o.s2, o.n, o.k)} V {s(o.s3, o.n, o.k)}"
                              f" window {o.j} scale {num(o.a)} softcap {num(o.c)}"),
            Op.GEGLU: lambda: f"{s(o.s0, o.n)} <- gelu({s(o.s0, o.n)}) * {s(o.s1, o.n)}",
            Op.SCALE: lambda: f"{s(o.s0, o.n)} *= {num(o.a)}",
            Op.ADD: lambda: f"{s(o.s0, o.n)} += {s(o.s1, o.n)}",
            Op.LOGITS: lambda: f"<- {w} {s(o.s1, o.n)} softcap {num(o.c)}",
            Op.ROUTE: lambda: f"{s(o.s0, o.n)} <- top {o.k} of softmax({w} {s(o.s1, o.m)})",
            Op.SKIP: lambda: f"the next {o.k} ops when {s(o.s0, o.n)} column {o.j} is 0 in every row",
            Op.WADD: lambda: f"{s(o.s0, o.n)} += {s(o.s2, o.m)} column {o.j} * {s(o.s1, o.n)}",
        }[Op(o.op)]()
        return f"{o.name:<6} {text}"

    def lines(self) -> list[str]:
        f, h = self.f, self.f.header
        caches = [x.width for x in f.slots if x.flags & CACHE]
        out = [f"model file version {h.version}, Gemma {h.generation}; vocab {h.vocab}"
               + (f" ({h.n_merges} merges)" if h.n_merges else "") + f", context {h.max_ctx}; bos {h.bos}, "
               f"eos {h.eos}, eot {h.eot}",
               f"weights: {h.weights_size:,} bytes at {h.weights_off:#x}; file {h.file_size:,} bytes",
               f"slots ({h.n_slots}, k: a K/V cache, rows by position): "
               + " ".join(self.slot(i, x.width) for i, x in enumerate(f.slots, 1)),
               f"  {len(caches)} caches, {sum(caches)} floats a position"]
        out += [f"{name:<10} {s!r}" for name, s in zip(STRINGS, f.strings)]
        out += [f"program ({h.n_ops} ops):"]
        out += [f"{i:5d}  {self.op(o)}" for i, o in enumerate(f.ops)]
        return out


def show(path: Path) -> str:
    version = file_version(path)
    if version != VERSION:
        raise ModelFormatError(f"{path}: model file version {version}: show reads version {VERSION} "
                               "(convert again with --format 4)")
    return "\n".join(Listing(ModelFile4(path)).lines())


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder show",
               description="Print a version 4 model file's program, one op per line, after a summary of its header.")
    p.add_argument("model", type=Path, help="model file (version 4)")
    args = p.parse_args(argv)
    return run(p.prog, lambda: print(show(args.model)), (ModelFormatError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
