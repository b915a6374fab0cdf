"""Every kernel of the shipped binary against a numpy twin, on seeded random inputs.

Each kernel runs from the bytes inside the built ./gemma (located by the symbol map): in
Unicorn, where every memory access and ABI rule is checked (harness.unicorn_run), and natively
(harness.native) on the same inputs. The fast matrix product (matmul_f16_avx2: more tokens
per call, a row stride, fused multiply-adds) has its own tests in test_speed_paths.py.
Tolerances are stated beside each check; a failure names the kernel and sizes, the index, the
expected and the actual value. Sizes are small and odd on purpose (the tails of every loop),
with one Gemma-sized case per kernel; Unicorn with hooks is slow.
"""
from __future__ import annotations

import math
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from builder.models.modelfile import LayerAttn, rope_freqs
from conftest import KERNEL_COUNTS
from emu_tests.harness import BASELINE, I64, Cpu, Emulator, In, Out, load_elf
from emu_tests.harness.header import read_header
from emu_tests.harness.image import with_routines
from emu_tests.harness.native import NativeRunner

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32
U = 2.0 ** -24                          # unit roundoff of float32


# --- the machinery ---------------------------------------------------------------------------

# The x87 helpers (st0 in, st0 out) get SysV wrappers here: y[i] = f(x[i]) for i < n.
X87_WRAPPERS = {
    f"{f}_each": f"""
        push rbx
        xor ebx, ebx
    top:
        cmp ebx, edx
        jae done
        fld dword ptr [rsi + rbx*4]
        call {{{f}}}
        fstp dword ptr [rdi + rbx*4]
        inc ebx
        jmp top
    done:
        pop rbx
        ret""" for f in ("exp_x87", "exp2_x87")}


@pytest.fixture(scope="module")
def image(gemma):
    return with_routines(load_elf(gemma.elf, gemma.symbols), X87_WRAPPERS)


@pytest.fixture(scope="module")
def emu(image, gemma, request):
    """The emulator for this module; its instruction counts go to the run's summary
    (conftest.py: `pytest --kernel-counts` prints them)."""
    emu = HeaderCheckedEmulator(image, gemma.symbols)
    yield emu
    request.config.stash.setdefault(KERNEL_COUNTS, {}).update(emu.counts)


class HeaderCheckedEmulator(Emulator):
    """An Emulator that also holds each routine to its header: registers the header does not
    list as clobbered (or as outputs) must come back unchanged (see harness.header)."""

    def __init__(self, image, symbols: dict, cpu: Cpu = BASELINE):
        super().__init__(image, cpu=cpu)
        self.sources = symbols
        self.counts: dict[str, list[int]] = {}

    def call(self, name: str, *args, **kw):
        info = self.sources.get(name)
        if info is not None:
            header = read_header((ROOT / info["file"]).read_text(), name)
            kw.setdefault("preserves", header.preserved())
        result = super().call(name, *args, **kw)
        self.counts.setdefault(name, []).append(result.instructions)
        return result


@pytest.fixture(scope="module")
def cpu(image):
    return NativeRunner(image)


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def check(what: str, got, want, tol) -> None:
    """Every |got - want| <= tol (elementwise; inf must equal inf); else name the first miss."""
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    tol = np.broadcast_to(np.asarray(tol, np.float64), want.shape).ravel()
    with np.errstate(invalid="ignore"):
        ok = (np.abs(got - want) <= tol) | (got == want)
    if not ok.all():
        i = int(np.argmin(ok))
        raise AssertionError(f"{what}: {np.count_nonzero(~ok)} of {want.size} values wrong; "
                             f"first at index {i}: expected {want[i]!r}, got {got[i]!r} "
                             f"(tolerance {tol[i]:.3g})")


def ulp(x) -> np.ndarray:
    """The float32 ulp at |x| (spacing of the float32 nearest to x), as float64."""
    with np.errstate(over="ignore"):
        return np.spacing(np.abs(np.asarray(x, np.float64).astype(F32))).astype(np.float64)


def run_everywhere(emu, cpu, kernel: str, args: tuple, what: str, twin_check) -> list:
    """Run `kernel` in Unicorn and natively; apply `twin_check(label, outputs)` to each."""
    base = emu.call(kernel, *args)
    twin_check(f"{what} [Unicorn]", base.outputs)
    native = cpu.call(kernel, *args)
    twin_check(f"{what} [native]", native.outputs)
    return base.outputs


# --- matmul_f16 ------------------------------------------------------------------------------

def f16_weights(rng, d: int, n: int, edge: bool) -> np.ndarray:
    w = (rng.standard_normal((d, n)) * 0.5).astype(np.float16)
    if edge:   # subnormal halves, signed zeros, the largest and smallest normal halves
        special = np.array([6e-8, -6e-8, 3e-5, -0.0, 0.0, 65504, -65504, 6.104e-5], np.float16)
        flat = w.reshape(-1)
        flat[rng.choice(flat.size, min(flat.size, 2 * len(special)), replace=False)] = \
            np.resize(special, min(flat.size, 2 * len(special)))
    return w


def matmul_f16_in_order(w: np.ndarray, x: np.ndarray, old: np.ndarray | None) -> np.ndarray:
    """The header's float32 order: products rounded, lanes j mod 8 over whole groups of 8,
    leftover columns into lane 0, then ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)),
    then + old."""
    d, n = w.shape
    p = w.astype(F32) * x
    lanes = np.zeros((d, 8), F32)
    whole = n // 8 * 8
    for j in range(0, whole, 8):
        lanes += p[:, j:j + 8]
    for j in range(whole, n):
        lanes[:, 0] += p[:, j]
    h = lanes[:, :4] + lanes[:, 4:]
    s = (h[:, 0] + h[:, 1]) + (h[:, 2] + h[:, 3])
    return s if old is None else s + old


@pytest.mark.parametrize("d,n,accumulate,edge", [
    (1, 1, 0, False), (1, 3, 0, False), (3, 4, 1, False), (5, 7, 0, True), (2, 9, 1, True),
    (7, 33, 0, False), (16, 64, 1, True), (64, 257, 0, False), (48, 2048, 1, False),
])
def test_matmul_f16(emu, cpu, d, n, accumulate, edge):
    rng = rng_for("matmul_f16", d, n, accumulate)
    w = f16_weights(rng, d, n, edge)
    x = rng.standard_normal(n).astype(F32)
    old = rng.standard_normal(d).astype(F32)
    what = f"matmul_f16 d={d} n={n} accumulate={accumulate}"
    exact = w.astype(np.float64) @ x.astype(np.float64) + (old if accumulate else 0)
    # float32 error bound: every product and every addition on the path of one row rounds
    # once (n//8 lane additions, n%8 leftovers into lane 0, 3 combining, 1 accumulate,
    # 1 product): relative U each, on the sum of magnitudes.
    bound = (n // 8 + n % 8 + 5) * U * (np.abs(w.astype(np.float64)) @ np.abs(x)
                                          + (np.abs(old) if accumulate else 0))
    in_order = matmul_f16_in_order(w, x, old if accumulate else None)

    def twin(label, outs):
        check(label + " vs float64", outs[0], exact, bound)
        # exact: the header fixes the order of every float32 operation, so the same IEEE
        # operations in numpy give the same bits (FP16 -> FP32 is exact)
        check(label + " vs header order", outs[0], in_order, 0)

    run_everywhere(emu, cpu, "matmul_f16",
                   (Out(old.copy(), "xout"), In(x, "x"), In(w, "W"), n, d, accumulate),
                   what, twin)


# --- matvec_f32, matvec_t_f32 ---------------------------------------------------------------

def sequential_f32(terms: np.ndarray) -> np.ndarray:
    """Sum float32 terms [rows, k] left to right in one float32 accumulator per row."""
    acc = np.zeros(terms.shape[0], F32)
    for j in range(terms.shape[1]):
        acc = acc + terms[:, j]
    return acc


def lanes_then_sequential(terms: np.ndarray) -> np.ndarray:
    """Row sums of terms (d, n) in the order matvec_strided takes for contiguous rows: lane l
    of chain c sums columns j = 8m + 4c + l of the first n - n mod 8 in order of m, then
    l_i = c0_i + c1_i, then (l0 + l1) + (l2 + l3), then the last n mod 8 terms left to
    right."""
    q = terms.shape[1] - terms.shape[1] % 8
    s = [sequential_f32(terms[:, lane:q:8]) + sequential_f32(terms[:, lane + 4:q:8])
         for lane in range(4)]
    acc = (s[0] + s[1]) + (s[2] + s[3])
    for j in range(q, terms.shape[1]):
        acc = acc + terms[:, j]
    return acc


@pytest.mark.parametrize("d,n,pad", [(1, 1, 0), (3, 5, 0), (4, 7, 3), (9, 16, 48), (256, 33, 5),
                                     (2, 4, 0), (3, 256, 0), (5, 12, 1), (2, 15, 0), (7, 8, 2)])
def test_matvec_f32(emu, cpu, d, n, pad):
    rng = rng_for("matvec_f32", d, n, pad)
    stride = n + pad                                 # floats from one row to the next
    w_flat = rng.standard_normal((d - 1) * stride + n).astype(F32)   # ends with the last row
    w = np.lib.stride_tricks.as_strided(w_flat, (d, n), (4 * stride, 4))
    x = rng.standard_normal(n).astype(F32)
    what = f"matvec_f32 d={d} n={n} stride={stride}"

    def twin(label, outs):
        # exact: the kernel's order (lanes_then_sequential), the same IEEE operations as here
        check(label, outs[0], lanes_then_sequential(w * x), 0)

    run_everywhere(emu, cpu, "matvec_f32",
                   (Out(np.full(d, np.nan, F32), "xout"), In(x, "x"), In(w_flat, "W"), n, d,
                    I64(4 * stride)), what, twin)


@pytest.mark.parametrize("d,n,pad", [(1, 1, 0), (4, 3, 0), (5, 6, 2), (16, 9, 48), (256, 40, 0),
                                     (1, 9, 0), (12, 7, 1), (8, 5, 0), (24, 6, 0), (37, 11, 3)])
def test_matvec_t_f32(emu, cpu, d, n, pad):
    rng = rng_for("matvec_t_f32", d, n, pad)
    stride = d + pad                                 # floats from row i to row i+1 of W
    w_flat = rng.standard_normal((n - 1) * stride + d).astype(F32)
    w = np.lib.stride_tricks.as_strided(w_flat, (n, d), (4 * stride, 4))   # W[i, j]
    x = rng.standard_normal(n).astype(F32)
    what = f"matvec_t_f32 d={d} n={n} stride={stride}"

    def twin(label, outs):
        # exact: xout[j] = sum over i in index order, one float32 accumulator, for the outputs
        # that fill four SSE registers; the last d mod 16 go to matvec_strided, whose column
        # stride is here the row stride: 4 bytes (d = 1, no padding) takes its lane order
        terms, q = (w * x[:, None]).T, d - d % 16
        tail = lanes_then_sequential if stride == 1 else sequential_f32
        check(label, outs[0], np.concatenate([sequential_f32(terms[:q]), tail(terms[q:])]), 0)

    run_everywhere(emu, cpu, "matvec_t_f32",
                   (Out(np.full(d, np.nan, F32), "xout"), In(x, "x"), In(w_flat, "W"), n, d,
                    I64(4 * stride)), what, twin)


# --- rmsnorm ---------------------------------------------------------------------------------

def rmsnorm_exact(x: np.ndarray, w: np.ndarray, eps: float) -> list[Fraction]:
    """x * r * w exactly, with r = float32(1 / sqrt(mean(x^2) + eps)) as the header states
    (r from float64 with an exactly rounded sum of squares)."""
    x64 = x.astype(np.float64)
    r = F32(1.0 / math.sqrt(math.fsum(x64 * x64) / x.size + float(F32(eps))))
    return [Fraction(float(a)) * Fraction(float(r)) * Fraction(float(b)) for a, b in zip(x, w)]


@pytest.mark.parametrize("n,scale,aliased,accumulate", [
    (1, 1.0, False, 0), (2, 1e-3, True, 0), (3, 30.0, False, 0), (7, 1.0, True, 0),
    (64, 1.0, False, 0), (2048, 4.0, True, 0), (1, 1.0, False, 1), (5, 1e-3, False, 1),
    (66, 3.0, False, 1), (2048, 0.5, False, 1),
])
def test_rmsnorm(emu, cpu, n, scale, aliased, accumulate):
    rng = rng_for("rmsnorm", n, scale)
    x = (rng.standard_normal(n) * scale).astype(F32)
    w = (1 + rng.standard_normal(n) * 0.1).astype(F32)       # the file holds 1 + weight
    old = (rng.standard_normal(n) * 2).astype(F32)            # xout before, when accumulating
    eps = 1e-6
    product = rmsnorm_exact(x, w, eps)
    added = [Fraction(float(o)) if accumulate else Fraction(0) for o in old]
    exact = [p + a for p, a in zip(product, added)]
    what = f"rmsnorm n={n} scale={scale} aliased={aliased} accumulate={accumulate}"

    def twin(label, outs):
        # the header: x * r * w (+ xout) in x87 extended precision, rounded once to float32.
        # Each x87 operation errs by at most 2^-64 of its result (64-bit mantissa): the
        # product by 2^-63 |x r w|, the sum by 2^-64 more of |x r w| + |xout|; so the result
        # is within 0.5 ulp of the exact value plus 2^-62 (|x r w| + |xout|) (without
        # accumulating, 2^-62 |x r w| is below 2^-38 ulp). r itself: float32 from an
        # extended (here float64) value, the same float32 unless the exact value is within
        # ~2^-50 of a rounding boundary.
        got = outs[0].astype(np.float64)
        err = [abs(Fraction(float(g)) - e) / Fraction(float(u))
               for g, e, u in zip(got, exact, ulp(got))]
        bound = [0.5 + float((abs(p) + abs(a)) / 2**62 / Fraction(float(u)))
                 for p, a, u in zip(product, added, ulp(got))]
        check(label + " (error in ulps)", np.array(err, np.float64), np.zeros(n), np.array(bound))

    if aliased:                                      # "xout may be x"
        buf = Out(x.copy(), "x")
        args = (buf, buf, In(w, "w"), n, accumulate, eps)
    else:
        out = old.copy() if accumulate else np.full(n, np.nan, F32)
        args = (Out(out, "xout"), In(x, "x"), In(w, "w"), n, accumulate, eps)
    run_everywhere(emu, cpu, "rmsnorm", args, what, twin)


# --- softmax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,spread", [
    (1, 1.0), (2, 0.75), (5, 0.0), (17, 2.5), (33, 200.0), (300, 1.25), (1000, 3.0), (64, 20.0),
])
def test_softmax(emu, cpu, n, spread):
    rng = rng_for("softmax", n, spread)
    x = (rng.standard_normal(n) * spread).astype(F32)
    d = x.astype(np.float64) - x.max()
    e = np.exp(d)
    exact = e / e.sum()
    room = np.full(-(-n // 4) * 4, np.nan, F32)      # the header: room for n rounded up to 4
    room[:n] = x
    what = f"softmax n={n} spread={spread}"

    def twin(label, outs):
        # the header's bound. An exponential: y = float32(float32(x - max) float32(log2 e))
        # errs by 2.22 |y| u (two roundings and log2(e)'s own, 0.22 u), so 2^y by
        # ln(2) 2.22 |y| u < 1.6 |y| u relative; p's 1.7 ulp (ulp <= 2u relative near 1)
        # 3.4 u more; the sum carries its terms' errors: (3.4 + 1.6 ybar) u, ybar the mean
        # of |y| weighted by the results; the quotient's rounding u; the x87 steps a few
        # 2^-64. Results below 2^-126 (y clamped there, and subnormal quotients) may be off
        # by up to 2^-126.
        y = np.abs(d) * math.log2(math.e)
        ybar = float((y * exact).sum())
        rel = (7.8 + 1.6 * (y + ybar)) * U * (1 + 2.0 ** -20)
        check(label, outs[0][:n], exact, exact * rel + 2.0 ** -126)

    run_everywhere(emu, cpu, "softmax", (Out(room, "x"), n), what, twin)


# --- softcap ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,s,c,spread", [
    (1, 1.0, 3.0, 1.0), (2, 0.0625, 50.0, 300.0), (7, 1.0, 0.0, 5.0), (33, 0.25, 4.0, 30.0),
    (300, 1.0, 30.0, 100.0), (1000, 0.125, 1e-3, 1.0), (64, 1.0, 3.0, 1e-6),
])
def test_softcap(emu, cpu, n, s, c, spread):
    rng = rng_for("softcap", n, s, c, spread)
    x = (rng.standard_normal(n) * spread).astype(F32)
    if n >= 7:   # saturation both ways (e^(2z) overflows / underflows), zeros, FLT_MAX
        x[:7] = [0.0, -0.0, 1e30, -1e30, 3.4e38, -3.4e38, 1e-30]
    y = float(F32(s)) * x.astype(np.float64)
    exact = float(F32(c)) * np.tanh(y / float(F32(c))) if c else y
    what = f"softcap n={n} s={s} c={c} spread={spread}"

    def twin(label, outs):
        # the header: c tanh(s x / c) in x87 extended precision, rounded once to float32.
        # c = 0: s x rounded once: exact to 0.5 ulp. Otherwise tanh(z) = 1 - 2/(e^(2z) + 1)
        # cancels where |z| is small: the x87 terms are good to a few 2^-64 (exp_x87: 2^-58
        # relative, QEMU's x87 f2xm1 in double 2^-51) relative to 1, so the result errs by
        # up to ~2^-50 c absolute, beyond 1 ulp only for |result| < 2^-26 c. Bound: 1 ulp +
        # 2^-48 c.
        check(label, outs[0], exact, ulp(exact) + float(F32(c)) * 2.0 ** -48)

    run_everywhere(emu, cpu, "softcap", (Out(x.copy(), "x"), n, s, c), what, twin)


# --- geglu -----------------------------------------------------------------------------------

GELU_KAPPA = float(F32(0.044715))            # the float32 constants, as in transformers' kernel
GELU_M2BETA = float(F32(-2 * math.sqrt(2 / math.pi)))   # (the kernel folds in log2(e))


def geglu_exact(hb: np.ndarray, hb2: np.ndarray) -> np.ndarray:
    z = hb.astype(np.float64)
    with np.errstate(over="ignore"):
        return z / (1 + np.exp(GELU_M2BETA * (z + GELU_KAPPA * z ** 3))) * hb2


@pytest.mark.parametrize("n,edge", [(4, False), (8, True), (28, False), (16, True), (1000, False)])
def test_geglu(emu, cpu, n, edge):
    rng = rng_for("geglu", n, edge)
    hb = (rng.standard_normal(n) * 2).astype(F32)
    hb2 = rng.standard_normal(n).astype(F32)
    if edge:
        special = np.array([0.0, -0.0, 1e-3, -1e-3, 10.0, -10.0, 30.0, -30.0], F32)[:n]
        hb[:special.size] = special
    exact = geglu_exact(hb, hb2)
    what = f"geglu n={n}"

    def twin(label, outs):
        # the header: float32 arithmetic, as torch's. The exponent y is rounded to float32 (as
        # torch rounds tanh's argument), so far from 0 the result's relative error grows with
        # |y|; its error stays below 4 u |z hb2| (u = 2^-24): 2.9 u at most, measured over
        # 400,000 values at scales 0.01 .. 100. z = 0 gives 0 exactly.
        check(label, outs[0], exact, 4 * 2.0**-24 * np.abs(hb.astype(np.float64) * hb2))

    run_everywhere(emu, cpu, "geglu", (Out(hb.copy(), "hb"), In(hb2, "hb2"), n), what, twin)


# --- rope ------------------------------------------------------------------------------------

def rope_twin(x: np.ndarray, heads: int, hd: int, pos: int, f: np.ndarray) -> np.ndarray:
    """The header's recipe: a, the products and sums in float32; cos, sin computed in float64
    and rounded once to float32."""
    half = hd // 2
    a = F32(pos) * f
    c, s = np.cos(a.astype(np.float64)).astype(F32), np.sin(a.astype(np.float64)).astype(F32)
    h = x.reshape(heads, hd).copy()
    x0, x1 = h[:, :half].copy(), h[:, half:].copy()
    h[:, :half] = x0 * c - x1 * s
    h[:, half:] = x1 * c + x0 * s
    return h.reshape(-1)


@pytest.mark.parametrize("heads,heads2,hd,pos,theta,scale", [
    (1, 1, 2, 0, 10000.0, 1.0), (1, 2, 2, 5, 10000.0, 1.0), (4, 1, 16, 3, 10000.0, 1.0),
    (3, 3, 6, 1023, 10000.0, 1.0), (1, 1, 16, 40000, 10000.0, 1.0), (8, 1, 256, 77, 10000.0, 1.0),
    (2, 1, 22, 600, 1e6, 8.0), (4, 2, 256, 4095, 1e6, 8.0),
])
def test_rope(emu, cpu, heads, heads2, hd, pos, theta, scale):
    """Both groups of heads (a token's q and k) rotated by the same cos and sin."""
    rng = rng_for("rope", heads, hd, pos)
    x = rng.standard_normal(heads * hd).astype(F32)
    x2 = rng.standard_normal(heads2 * hd).astype(F32)
    f = rope_freqs(hd, LayerAttn(rope_theta=theta, rope_scale=scale))  # the file's `rope`
    what = f"rope heads={heads}+{heads2} hd={hd} pos={pos} theta={theta} scale={scale}"

    def twin(label, outs):
        # exact: every float32 step is fixed by the header; cos a and sin a are rounded once
        # to float32 from values good to 2^-51 or better (x87, or QEMU's double x87), which
        # round like float64's unless within 2^-51 of a float32 boundary
        check(label, outs[0], rope_twin(x, heads, hd, pos, f), 0)
        check(label + " x2", outs[1], rope_twin(x2, heads2, hd, pos, f), 0)

    run_everywhere(emu, cpu, "rope", (Out(x.copy(), "x"), heads, hd, pos, In(f, "f"),
                                      Out(x2.copy(), "x2"), heads2), what, twin)


# --- exp_x87, exp2_x87 (through the SysV wrappers above) --------------------------------------

EXP_EDGES = [0.0, -0.0, 1.0, -1.0, 1e-10, -1e-10, 0.5, 88.5, 88.8, 89.0, -87.0, -100.0,
             -103.0, -104.0, -200.0, 1e30, -1e30]


@pytest.mark.parametrize("f,base", [("exp_x87", math.e), ("exp2_x87", 2.0)])
def test_exp_x87(emu, cpu, f, base):
    rng = rng_for(f)
    x = np.concatenate([np.array(EXP_EDGES, F32), rng.uniform(-90, 89, 200).astype(F32),
                        rng.uniform(-2, 2, 50).astype(F32)])
    if base == 2.0:
        x = (x * F32(1.4426950408889634)).astype(F32)
    with np.errstate(over="ignore"):
        exact = np.power(base, x.astype(np.float64))
        exact[np.isinf(exact.astype(F32))] = np.inf      # beyond float32: +inf, as the header

    def twin(label, outs):
        # the header: <= 0.5 ulp + 2^-27 ulp after rounding to float32 (overflow: +inf)
        check(label, outs[0], exact, (0.5 + 2.0 ** -27) * ulp(exact))

    run_everywhere(emu, cpu, f"{f}_each",
                   (Out(np.full(x.size, np.nan, F32), "y"), In(x, "x"), x.size), f, twin)
