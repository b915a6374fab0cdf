"""Float arithmetic lane by lane on numpy arrays, bit for bit as x86 SSE/AVX computes it with
MXCSR's default: round to nearest even, denormals kept (no DAZ, no FTZ), exceptions masked.

Contract (float32 arrays in and out unless stated):
- `arith(op, a, b)` for op in np.add / np.subtract / np.multiply: IEEE rounding (numpy's own,
  which is the CPU's for these), then x86's NaN rules: a NaN operand gives that operand quieted,
  the first source's when both are NaN; an invalid operation (inf - inf, 0 x inf) gives the
  default NaN (0xFFC00000).
- `fma(a, b, c)`: a x b + c rounded ONCE. The product is exact in float64 (24 + 24 bits); the
  sum is computed in float64 rounded to odd (TwoSum gives its exact error, then a last bit of
  0 is stepped towards the exact value), and float64 rounded to odd, then to float32 (nearest
  even) is the exactly rounded result, since 53 >= 24 + 2 bits (Boldo and Melquiond). A plain
  float64 sum rounded twice is wrong when it lands on a float32 midpoint. NaN operands: the
  first NaN of (a, b, c) quieted; invalid: the default NaN.
- `f16_to_f32(h)` (uint16 or float16 bits): exact; a NaN keeps its payload and is quieted.
- `f32_to_f16(x)` -> uint16 bits: round to nearest even (overflow to inf, gradual underflow);
  a NaN keeps the top 10 payload bits and is quieted.
- `i32_to_f32(i)`: nearest even (exact in float64 first: one rounding).
`bits(x)` / `floats(u)` view float32 arrays as uint32 and back.
"""
from __future__ import annotations

import numpy as np

F32, U32 = np.float32, np.uint32
QUIET32 = U32(0x0040_0000)
DEFAULT_NAN = U32(0xFFC0_0000)
QUIET16 = np.uint16(0x0200)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, F32).view(U32)


def floats(u: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(u, U32).view(F32)


def _nan_rules(result: np.ndarray, operands: tuple[np.ndarray, ...]) -> np.ndarray:
    """`result` with x86's NaN choices: the first NaN operand quieted, else the default NaN
    where the operation was invalid."""
    undecided = np.isnan(result)
    if not undecided.any():
        return result
    out = bits(result).copy()
    for x in operands:
        nan = undecided & np.isnan(x)
        out[nan] = bits(x)[nan] | QUIET32
        undecided &= ~nan
    out[undecided] = DEFAULT_NAN
    return floats(out)


def arith(op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = op(a.astype(F32), b.astype(F32)).astype(F32)
    return _nan_rules(r, (a, b))


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)            # exact
        c64 = c.astype(np.float64)
        s = p + c64
        t = s - p
        err = (p - (s - t)) + (c64 - t)                             # s + err == p + c exactly
        even = (s.view(np.int64) & 1) == 0
        step = np.isfinite(s) & (err != 0) & even
        s = np.where(step, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        r = s.astype(F32)
    return _nan_rules(r, (a, b, c))


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    h = np.ascontiguousarray(h).view(np.uint16)
    r = bits(h.view(np.float16).astype(F32)).copy()
    nan = (h & 0x7C00) == 0x7C00
    nan &= (h & 0x03FF) != 0
    r[nan] = ((h[nan].astype(U32) & 0x8000) << 16 | 0x7F80_0000 | QUIET32
              | (h[nan].astype(U32) & 0x03FF) << 13)
    return floats(r)


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, F32)
    with np.errstate(all="ignore"):
        h = x.astype(np.float16).view(np.uint16).copy()
    u = bits(x)
    nan = np.isnan(x)
    h[nan] = ((u[nan] >> 16) & 0x8000 | 0x7C00 | (u[nan] >> 13) & 0x03FF).astype(np.uint16) \
        | QUIET16
    return h


def i32_to_f32(i: np.ndarray) -> np.ndarray:
    return np.asarray(i, np.int32).astype(np.float64).astype(F32)
