"""What each modelled instruction computes: one `Sem` entry per mnemonic (avx.py executes them).

Contract: `SEMANTICS[mnemonic]` (capstone's mnemonic) is a `Sem`:
- `fn(n, *sources) -> result`: the sources are numpy arrays in the order of capstone's
  operands after the destination (the destination's old value first when `reads_dest`),
  viewed as `src` elements (a register or memory operand whole, an EVEX {1toN} broadcast
  already repeated to the vector length; a general register as its bytes, an opmask as its
  8 bytes); an immediate is an int. It returns the destination's new value: `n` elements of
  `dst`, n = destination bytes / dst itemsize. Write masks act on these elements; the bits
  above the destination are zeroed (VEX and EVEX) by the executor, never here.
- `vex`, `evex`, `legacy`: the /proc/cpuinfo feature each encoding needs (a (128-bit, 256-bit)
  pair where they differ; "": none; None: no such form). EVEX below 512 bits adds avx512vl unless
  `scalar`. `vex_reg_source` is the VEX feature when the source is a register (vbroadcastss).
- `permute`: a memory source is read whole under a write mask (no per-element fault
  suppression); otherwise element i of a memory source belongs to destination element i and
  only active elements are read. `align`: the memory operand must be aligned to its size.
- `float`: computes with MXCSR (the executor requires its default control bits).
- `state`: fn(model) acts on the model itself (vzeroupper, cpuid, xgetbv: no operands).
Adding an instruction is one entry here (and a form in emu_tests/model/forms.py, which checks
it against the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import fp

F32, U8, I8, U16, I16, I32, U32, U64 = (np.float32, np.uint8, np.int8, np.uint16, np.int16,
                                        np.int32, np.uint32, np.uint64)


class Unsupported(Exception):
    """An instruction, or a form of one, the model does not compute."""


@dataclass(frozen=True)
class Sem:
    fn: Callable
    vex: str | tuple[str, str] | None = None
    evex: str | None = None
    legacy: str | None = None
    src: type = U32
    dst: type = U32
    reads_dest: bool = False
    permute: bool = False
    align: bool = False
    float: bool = False
    scalar: bool = False
    state: bool = False
    vex_reg_source: str | None = None


# --- building blocks -----------------------------------------------------------------------

def pad(x: np.ndarray, n: int) -> np.ndarray:
    """x followed by zeros up to n elements."""
    return np.concatenate([x, np.zeros(n - len(x), x.dtype)]) if len(x) < n else x[:n]


def lanes128(x: np.ndarray) -> np.ndarray:
    """x as rows of 128 bits."""
    return x.reshape(-1, 16 // x.itemsize)


def binary(op) -> Sem:
    return Sem(lambda n, a, b: fp.arith(op, a, b), vex="avx", evex="avx512f", src=F32, dst=F32,
               float=True)


def scalar_binary(op) -> Sem:
    """op on element 0; elements 1-3 from the first source."""
    return Sem(lambda n, a, b: np.concatenate([fp.arith(op, a[:1], b[:1]), a[1:n]]),
               vex="avx", evex="avx512f", src=F32, dst=F32, float=True, scalar=True)


def fmadd(order: str) -> Sem:
    """vfmadd{order}ps: operands 1, 2, 3 multiplied and added in the order its digits name."""
    i, j, k = (int(c) - 1 for c in order)
    return Sem(lambda n, *ops: fp.fma(ops[i], ops[j], ops[k]), vex="fma", evex="avx512f",
               src=F32, dst=F32, reads_dest=True, float=True)


def move(dtype, align: bool = False, vex: str | None = "avx", evex: str | None = "avx512f") -> Sem:
    return Sem(lambda n, a: a, vex=vex, evex=evex, src=dtype, dst=dtype, align=align)


def bitwise(op, dtype, vex: str | tuple[str, str] | None, evex: str | None) -> Sem:
    return Sem(lambda n, a, b: op(a, b), vex=vex, evex=evex, src=dtype, dst=dtype)


def extend(src, dst, vex: tuple[str, str] | None, evex: str) -> Sem:
    """Sign or zero extension of the low n elements (vpmovsx*, vpmovzx*)."""
    return Sem(lambda n, a: a[:n].astype(dst), vex=vex, evex=evex, src=src, dst=dst)


def broadcast(dtype, vex: str | tuple[str, str] | None, evex: str,
              vex_reg_source: str | None = None) -> Sem:
    return Sem(lambda n, a: np.full(n, a[0], dtype), vex=vex, evex=evex, src=dtype, dst=dtype,
               vex_reg_source=vex_reg_source)


def extract(vex: str | None, evex: str | None, dtype=U32) -> Sem:
    """Destination-sized block `imm` of the source (vextractf128, vextractf32x4/x8 ...);
    `dtype`: the elements a write mask selects."""
    return Sem(lambda n, a, imm: a.reshape(-1, n)[imm % (len(a) // n)], vex=vex, evex=evex,
               src=dtype, dst=dtype, permute=True)


def kmov(dtype, feature: str) -> Sem:
    """kmov{w,d,q}: the low element, zero-extended to the destination (k, r32/r64, memory)."""
    return Sem(lambda n, a: pad(a[:1], n), vex=feature, src=dtype, dst=dtype)


def movss(n: int, *s: np.ndarray) -> np.ndarray:
    """vmovss: load (zero-extended), store (element 0) or merge (element 0 of the second
    source over the first)."""
    if len(s) == 2:
        return np.concatenate([s[1][:1], s[0][1:n]])
    return pad(s[0][:1], n)


def haddps(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per 128-bit lane: a0+a1, a2+a3, b0+b1, b2+b3; of two NaNs the CPU returns the even
    element's (the SDM writes the sum odd + even)."""
    x = np.concatenate([lanes128(a), lanes128(b)], axis=1)
    return fp.arith(np.add, x[:, 0::2], x[:, 1::2]).reshape(-1)


def permilps(n: int, a: np.ndarray, control) -> np.ndarray:
    """Within each 128-bit lane, element i <- element control_i (2 bits of the immediate, or
    of dword i of a control vector)."""
    rows = lanes128(a)
    if isinstance(control, int):
        sel = np.array([(control >> (2 * i)) & 3 for i in range(4)])
        return rows[:, sel].reshape(-1)
    sel = lanes128(control) & 3
    return np.take_along_axis(rows, sel.astype(np.intp), axis=1).reshape(-1)


def shuf128(n: int, a: np.ndarray, b: np.ndarray, imm: int) -> np.ndarray:
    """vshuff32x4: 128-bit blocks, the low half of the result from a, the high half from b,
    each picked by the next imm bits (1 bit per block at 256 bits, 2 at 512)."""
    rows_a, rows_b = lanes128(a), lanes128(b)
    blocks = len(rows_a)
    width = blocks // 2
    picks = [(imm >> (width * i)) & (blocks - 1) for i in range(blocks)]
    return np.concatenate([(rows_a if i < blocks // 2 else rows_b)[p]
                           for i, p in enumerate(picks)])


def pmaddwd(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = a.astype(np.int64) * b.astype(np.int64)
    return (p[0::2] + p[1::2]).astype(np.uint32).view(I32)


def dpbusd(n: int, acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """vpdpbusd: each dword of acc + the four products unsigned byte of a x signed byte of b."""
    p = (a.astype(np.int64) * b.view(I8).astype(np.int64)).reshape(-1, 4).sum(axis=1)
    return (acc.view(I32).astype(np.int64) + p).astype(np.uint32).view(I32)


def cvtps2ph(n: int, x: np.ndarray, imm: int) -> np.ndarray:
    if imm & 4 == 0 and imm & 3:
        raise Unsupported(f"vcvtps2ph with rounding control {imm & 3} (only nearest even)")
    return pad(fp.f32_to_f16(x), n)


# --- instructions without operands: the model's state ----------------------------------------

def vzeroupper(model) -> None:
    model.zero_vectors(upper_only=True)


def vzeroall(model) -> None:
    model.zero_vectors(upper_only=False)


def cpuid(model) -> None:
    leaf, subleaf = model.port.gpr("eax"), model.port.gpr("ecx")
    for reg, value in zip(("rax", "rbx", "rcx", "rdx"), model.cpu.cpuid(leaf, subleaf)):
        model.port.set_gpr(reg, value)


def xgetbv(model) -> None:
    index = model.port.gpr("ecx")
    if index != 0:
        raise Unsupported(f"xgetbv of XCR{index} (only XCR0 is modelled)")
    model.port.set_gpr("rax", model.cpu.xcr0 & 0xFFFFFFFF)
    model.port.set_gpr("rdx", model.cpu.xcr0 >> 32)


# --- the table -------------------------------------------------------------------------------

SEMANTICS: dict[str, Sem] = {
    # moves (bit patterns: no NaN is touched)
    "vmovups": move(U32), "vmovaps": move(U32, align=True),
    "vmovdqu": move(U32, evex=None), "vmovdqa": move(U32, align=True, evex=None),
    "vmovdqu8": move(U8, vex=None, evex="avx512bw"),
    "vmovdqu16": move(U16, vex=None, evex="avx512bw"),
    "vmovdqu32": move(U32, vex=None), "vmovdqu64": move(U64, vex=None),
    "vmovdqa32": move(U32, align=True, vex=None), "vmovdqa64": move(U64, align=True, vex=None),
    "vmovss": Sem(movss, vex="avx", evex="avx512f", scalar=True),
    # broadcasts
    "vbroadcastss": broadcast(U32, "avx", "avx512f", vex_reg_source="avx2"),
    "vpbroadcastb": broadcast(U8, "avx2", "avx512bw"),
    "vpbroadcastw": broadcast(U16, "avx2", "avx512bw"),
    "vpbroadcastd": broadcast(U32, "avx2", "avx512f"),
    # float arithmetic
    "vaddps": binary(np.add), "vsubps": binary(np.subtract), "vmulps": binary(np.multiply),
    "vaddss": scalar_binary(np.add), "vmulss": scalar_binary(np.multiply),
    "vhaddps": Sem(haddps, vex="avx", src=F32, dst=F32, float=True),
    "vfmadd231ps": fmadd("231"), "vfmadd213ps": fmadd("213"), "vfmadd132ps": fmadd("132"),
    # conversions
    "vcvtph2ps": Sem(lambda n, h: fp.f16_to_f32(h[:n]), vex="f16c", evex="avx512f", src=U16,
                     dst=F32),
    "vcvtps2ph": Sem(cvtps2ph, vex="f16c", evex="avx512f", src=F32, dst=U16, float=True),
    "vcvtdq2ps": Sem(lambda n, i: fp.i32_to_f32(i), vex="avx", evex="avx512f", src=I32, dst=F32,
                     float=True),
    # integers
    "vpmovsxbd": extend(I8, I32, ("avx", "avx2"), "avx512f"),
    "vpmovsxbw": extend(I8, I16, ("avx", "avx2"), "avx512bw"),
    "vpmovsxwd": extend(I16, I32, ("avx", "avx2"), "avx512f"),
    "vpmovzxbd": extend(U8, U32, ("avx", "avx2"), "avx512f"),
    "vpaddd": Sem(lambda n, a, b: a + b, vex=("avx", "avx2"), evex="avx512f", src=U32, dst=U32),
    "vpmaddwd": Sem(pmaddwd, vex=("avx", "avx2"), evex="avx512bw", src=I16, dst=I32),
    "vpdpbusd": Sem(dpbusd, evex="avx512_vnni", src=U8, dst=I32, reads_dest=True),
    # logic
    "vxorps": bitwise(np.bitwise_xor, U32, "avx", "avx512dq"),
    "vpxor": bitwise(np.bitwise_xor, U32, ("avx", "avx2"), None),
    "vpxord": bitwise(np.bitwise_xor, U32, None, "avx512f"),
    "vpxorq": bitwise(np.bitwise_xor, U64, None, "avx512f"),
    # shuffles
    "vpermilps": Sem(permilps, vex="avx", evex="avx512f", permute=True),
    "vpermps": Sem(lambda n, idx, t: t[idx & (n - 1)], vex=("avx2", "avx2"), evex="avx512f",
                   permute=True),
    "vshuff32x4": Sem(shuf128, evex="avx512f", permute=True),
    "vextractf128": extract("avx", None),
    "vextracti128": extract("avx2", None),
    "vextractf32x4": extract(None, "avx512f"),
    "vextractf32x8": extract(None, "avx512dq"),
    "vextractf64x4": extract(None, "avx512f", U64),
    # opmasks
    "kmovw": kmov(U16, "avx512f"), "kmovd": kmov(U32, "avx512bw"),
    "kmovq": kmov(U64, "avx512bw"),
    "kxnorw": Sem(lambda n, a, b: pad(~(a[:1] ^ b[:1]), n), vex="avx512f", src=U16, dst=U16),
    # no operands
    "vzeroupper": Sem(vzeroupper, vex="avx", state=True),
    "vzeroall": Sem(vzeroall, vex="avx", state=True),
    "cpuid": Sem(cpuid, legacy="", state=True),
    "xgetbv": Sem(xgetbv, legacy="osxsave", state=True),
}
