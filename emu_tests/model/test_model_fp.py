"""The model's float arithmetic (emu_tests/harness/fp.py) against exact rationals.

The twin computes each result exactly with fractions.Fraction and rounds it once, to nearest
even, onto the float32 (or FP16) grid with gradual underflow and overflow to infinity. These
tests run on every host (no CPU involved); test_model_vs_cpu.py holds the same functions to
the CPU's bits, NaNs included. No tolerance: a difference names the inputs and both results.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from emu_tests.harness import fp
from emu_tests.model.forms import DOUBLE_ROUNDING

F32 = np.float32


def round_to(x: Fraction, mantissa_bits: int, emin: int, emax: int) -> float:
    """x rounded once to nearest even on the grid of a binary float with `mantissa_bits`
    stored bits, normal exponents emin..emax (denormals below), +-inf beyond."""
    if x == 0:
        return 0.0
    sign, a = (-1 if x < 0 else 1), abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += (a >= Fraction(2) ** e) - 1                      # 2^e <= a < 2^(e+1)
    quantum = Fraction(2) ** (max(e, emin) - mantissa_bits)
    q = round(a / quantum)                                 # Python rounds ties to even
    value = q * quantum
    if value >= Fraction(2) ** (emax + 1):
        return sign * float("inf")
    return sign * float(value)


def exact_f32(x: Fraction, negative_zero: bool = False) -> np.float32:
    """x rounded to float32; an exact zero is -0 when `negative_zero` (IEEE: a sum of -0
    terms only, or a product of opposite signs)."""
    if x == 0:
        return F32(-0.0 if negative_zero else 0.0)
    return F32(round_to(x, 23, -126, 127))


def finite_f32(rng, n: int) -> np.ndarray:
    """Finite float32 of every kind: near 1, few mantissa bits (ties), denormals, huge."""
    e = rng.integers(-8, 9, n)
    e[: n // 8] = rng.integers(-149, -120, n // 8)
    e[n // 8: n // 4] = rng.integers(100, 128, n // 8)
    m = rng.integers(0, 2**23, n)
    m[n // 4: n // 2] &= 0x780001
    x = np.ldexp(1 + m / 2**23, e).astype(F32) * rng.choice([-1, 1], n).astype(F32)
    x[rng.choice(n, n // 16, replace=False)] = 0
    return x


def test_twin_rounds_ties_to_even():
    assert exact_f32(Fraction(1) + Fraction(1, 2**24)) == 1.0
    assert exact_f32(Fraction(1) + Fraction(3, 2**24)) == F32(1 + 2**-22)
    assert exact_f32(Fraction(2**128) - Fraction(2**103)) == np.inf       # the overflow tie
    assert exact_f32(Fraction(1, 2**150)) == 0.0                           # the denormal tie
    assert exact_f32(Fraction(3, 2**150)) == F32(2**-148)


def test_fma_rounds_once_where_float64_rounds_twice():
    """The double-rounding cases: float64 a b + c then float32 is wrong on every one (so the
    cases are real), fp.fma is the exactly rounded value."""
    a, b, c = (np.array(col, F32) for col in zip(*DOUBLE_ROUNDING))
    exact = np.array([exact_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                      for x, y, z in zip(a, b, c)], F32)
    twice = (a.astype(np.float64) * b + c).astype(F32)
    assert np.all(twice != exact), "a case that float64 gets right is no double-rounding case"
    got = fp.fma(a, b, c)
    bad = np.flatnonzero(got.view(np.uint32) != exact.view(np.uint32))
    assert not bad.size, (f"fma({a[bad[0]]!r}, {b[bad[0]]!r}, {c[bad[0]]!r}) = {got[bad[0]]!r}, "
                          f"exactly rounded {exact[bad[0]]!r}")


@pytest.mark.parametrize("op", ["fma", "add", "sub", "mul"])
def test_arithmetic_is_exactly_rounded(op):
    rng = np.random.default_rng(["fma", "add", "sub", "mul"].index(op))
    n = 3000
    a, b, c = finite_f32(rng, n), finite_f32(rng, n), finite_f32(rng, n)
    if op != "fma":                      # b close to a's ulp: ties and cancellation
        b[: n // 4] = (a[: n // 4] * F32(2.0**-24)) * rng.choice([1, 3, -1], n // 4).astype(F32)
    with np.errstate(all="ignore"):
        got = {"fma": lambda: fp.fma(a, b, c), "add": lambda: fp.arith(np.add, a, b),
               "sub": lambda: fp.arith(np.subtract, a, b),
               "mul": lambda: fp.arith(np.multiply, a, b)}[op]()
    fa, fb, fc = ([Fraction(float(v)) for v in arr] for arr in (a, b, c))
    neg = {"a": np.signbit(a), "b": np.signbit(b), "c": np.signbit(c)}
    product_neg = neg["a"] ^ neg["b"]
    exact, negative_zero = {
        "fma": (lambda i: fa[i] * fb[i] + fc[i],
                ((a == 0) | (b == 0)) & product_neg & neg["c"] & (c == 0)),
        "add": (lambda i: fa[i] + fb[i], neg["a"] & neg["b"] & (a == 0) & (b == 0)),
        "sub": (lambda i: fa[i] - fb[i], neg["a"] & ~neg["b"] & (a == 0) & (b == 0)),
        "mul": (lambda i: fa[i] * fb[i], product_neg)}[op]
    for i in range(n):
        want = exact_f32(exact(i), bool(negative_zero[i]))
        if got[i].view(np.uint32) != want.view(np.uint32):
            raise AssertionError(f"{op}({a[i]!r}, {b[i]!r}, {c[i]!r}) = {got[i]!r}, exactly "
                                 f"rounded {want!r}")


def test_fma_zero_signs_and_infinities():
    """Exact zero sums are +0 unless both terms are -0; an infinite term passes through."""
    a = np.array([1, -1, 0, -0.0, 2, np.inf], F32)
    b = np.array([-1, 1, 5, 5, 3, 2], F32)
    c = np.array([1, 1, -0.0, -0.0, np.inf, -5], F32)
    want = np.array([0, 0, 0, -0.0, np.inf, np.inf], F32)
    got = fp.fma(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), got


def half_value(h: int) -> float:
    e, m = (h >> 10) & 31, h & 1023
    v = Fraction(m, 2**24) if e == 0 else Fraction(1024 + m, 1024) * Fraction(2) ** (e - 15)
    return -float(v) if h & 0x8000 else float(v)


def test_every_half_converts_exactly():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = fp.f16_to_f32(h)
    special = (h & 0x7C00) == 0x7C00
    want = np.array([half_value(int(v)) for v in h[~special]], F32)
    assert np.array_equal(got[~special].view(np.uint32), want.view(np.uint32))
    inf = special & ((h & 0x3FF) == 0)
    assert np.array_equal(got[inf], np.where(h[inf] & 0x8000, -np.inf, np.inf).astype(F32))
    nan = special & ~inf                        # quieted, the payload in the top mantissa bits
    u = got[nan].view(np.uint32)
    assert np.all(u & 0x7FC00000 == 0x7FC00000)
    assert np.array_equal((u >> 13) & 0x1FF, h[nan].astype(np.uint32) & 0x1FF)
    assert np.array_equal(u >> 31, h[nan].astype(np.uint32) >> 15)


def test_float_to_half_rounds_once():
    """Any float32 in and around the FP16 range, values on the FP16 grid, exact midpoints
    between neighbours (ties), the overflow boundary."""
    rng = np.random.default_rng(7)
    anywhere = np.ldexp(rng.random(6000) + 1, rng.integers(-27, 17, 6000))
    k = rng.integers(0, 0x7BFF, 2000).astype(np.uint16)
    on_grid = fp.f16_to_f32(k).astype(np.float64)
    midpoints = (on_grid + fp.f16_to_f32(k + 1)) / 2
    x = np.concatenate([anywhere, on_grid, midpoints, [65504, 65519.99, 65520, 1e9, 0]])
    x = (x * rng.choice([-1, 1], x.size)).astype(F32)
    got = fp.f32_to_f16(x)
    for i in range(x.size):
        want = np.float16(round_to(Fraction(float(x[i])), 10, -14, 15)).view(np.uint16)
        assert got[i] == want, f"f32_to_f16({x[i]!r}) = {got[i]:#06x}, exactly {want:#06x}"


def test_int_to_float_rounds_once():
    rng = np.random.default_rng(3)
    i = rng.integers(-2**31, 2**31, 5000).astype(np.int32)
    i[:1000] = (rng.integers(2**23, 2**24, 1000) * 2 + 1) << rng.integers(0, 7, 1000)
    i[1000:1004] = [-2**31, 2**31 - 1, 2**24 + 1, 2**24 + 3]
    got = fp.i32_to_f32(i)
    want = np.array([exact_f32(Fraction(int(v))) for v in i], F32)
    assert np.array_equal(got, want), i[np.flatnonzero(got != want)[:3]]
