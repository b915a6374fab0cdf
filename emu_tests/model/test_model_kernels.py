"""The shipped fast kernels (asm/fast.asm: matmul_f16_avx2, matmul_q8_avx2) in Unicorn, their
VEX instructions run by the instruction model on an emulated AVX2 CPU (a Haswell: nothing
beyond AVX2, FMA and F16C may run), with every memory access bounds-checked and their
header's register contract held (HeaderCheckedEmulator), against the native run on the same
inputs: bit for bit, no tolerance. The AVX-512 kernels (asm/fast512.asm) the same way on an
emulated AVX-512 CPU, against the AVX2 kernels' native results (their promise: the same bits),
on every host; where this CPU has AVX-512F, natively too.

Shapes are small (Unicorn with the model runs ~20k instructions/s) and cover what the code
branches on: k = 1..4 tokens (the computed jump into the unrolled tokens; AVX-512: k = 8, its
3 x 8 tiles, against the AVX2 kernel four tokens a call), accumulate or not,
an output row stride with gaps, FP16 edge values (65504, denormals, signed zeros); for FP16
decode four rows at once (k = 1, d a multiple of 4: rows i + j d/4) or one; for Q8_0 the
decode pairs (k = 1, d even: rows i and i + d/2 together), d odd (one row at a time),
edge blocks (zero, denormal and largest scales, q = -128); one Gemma-sized n each.
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.bench.machine import cpu_flags
from emu_tests.harness import AVX2, AVX512, NativeRunner, load_elf
from emu_tests.kernels.test_kernels import HeaderCheckedEmulator, rng_for
from emu_tests.kernels.test_q8_kernels import Q8_FAST, call_q8_fast, q8_blocks
from emu_tests.speed.test_speed_paths import FAST, call_fast, kernel_case, same_bits


@pytest.fixture(scope="module")
def image(gemma):
    return load_elf(gemma.elf, gemma.symbols)


@pytest.fixture(scope="module")
def model(image, gemma):
    return HeaderCheckedEmulator(image, gemma.symbols, cpu=AVX2)


@pytest.fixture(scope="module")
def model512(image, gemma):
    return HeaderCheckedEmulator(image, gemma.symbols, cpu=AVX512)


@pytest.fixture(scope="module")
def native(image):
    return NativeRunner(image)


@pytest.mark.parametrize("d,n,k,accumulate", [
    (1, 16, 1, 0), (2, 32, 4, 1), (3, 48, 3, 0), (5, 16, 2, 1), (4, 64, 1, 1), (3, 2048, 2, 0),
    (16, 2048, 4, 1), (6, 32, 1, 0), (3, 64, 1, 1), (2, 2048, 1, 1), (8, 32, 1, 1),
    (4, 32, 3, 1), (2, 2048, 3, 0),
])
def test_matmul_f16_avx2_in_the_model(model, native, d, n, k, accumulate):
    w, x, old = kernel_case(d, n, k, d * 101 + n + k)
    same_bits(f"{FAST} d={d} n={n} k={k} acc={accumulate}: model vs CPU",
              call_fast(model, w, x, old, accumulate), call_fast(native, w, x, old, accumulate))


@pytest.mark.parametrize("d,n,k,accumulate", [
    (1, 32, 1, 0), (4, 64, 1, 1), (6, 32, 1, 0), (3, 64, 1, 1), (2, 64, 4, 1), (5, 96, 3, 0),
    (2, 2048, 1, 1), (4, 2048, 4, 0), (9, 2048, 1, 0),
])
def test_matmul_q8_avx2_in_the_model(model, native, d, n, k, accumulate):
    rng = rng_for("q8 in the model", d, n, k)
    blocks = q8_blocks(rng, d, n, edge=True)
    x = rng.standard_normal((k, n)).astype(np.float32)
    old = rng.standard_normal((k, d)).astype(np.float32)
    same_bits(f"{Q8_FAST} d={d} n={n} k={k} acc={accumulate}: model vs CPU",
              call_q8_fast(model, blocks, n, x, old, accumulate),
              call_q8_fast(native, blocks, n, x, old, accumulate))


# (d, n, k, accumulate): decode (k = 1) straight rows and Q8_0 pairs (d even), d odd; prompt
# blocks (k = 8) in tiles of three rows, the last tile with 1, 2 or 3 rows (d mod 3: its rows
# past d are row a or b again, their sums not stored); k = 2-4 (the AVX2 kernel); one
# Gemma-sized n
AVX512_CASES = [(1, 32, 1, 0), (4, 64, 1, 1), (3, 32, 1, 0), (3, 32, 8, 1), (4, 64, 8, 0),
                (5, 32, 8, 1), (1, 32, 8, 0), (7, 96, 8, 1), (8, 32, 4, 0), (2, 32, 2, 1),
                (3, 64, 3, 0), (2, 2048, 1, 1), (4, 2048, 8, 0)]


def by_fours(call, x: np.ndarray, old: np.ndarray) -> np.ndarray:
    """An AVX2 kernel's results for k tokens, four at a time (the most it takes a call):
    `call(x, old)` for each group of tokens, the (k, d) results stacked."""
    return np.concatenate([call(x[t:t + 4], old[t:t + 4]) for t in range(0, len(x), 4)])


def avx512_natively(native, call, kernel):
    """The kernel's native results where this CPU has AVX-512F (else None: the model's
    comparison with the AVX2 kernel stands alone)."""
    return call(native, kernel) if "avx512f" in cpu_flags() else None


@pytest.mark.parametrize("d,n,k,accumulate", AVX512_CASES)
def test_matmul_f16_avx512_gives_the_avx2_bits(model512, native, d, n, k, accumulate):
    w, x, old = kernel_case(d, n, k, d * 103 + n + k)
    def call(cpu, kernel):
        return call_fast(cpu, w, x, old, accumulate, kernel=kernel)
    want = by_fours(lambda xs, olds: call_fast(native, w, xs, olds, accumulate), x, old)
    what = f"matmul_f16_avx512 d={d} n={n} k={k} acc={accumulate}"
    same_bits(f"{what} in the model vs {FAST} natively", call(model512, "matmul_f16_avx512"), want)
    if (got := avx512_natively(native, call, "matmul_f16_avx512")) is not None:
        same_bits(f"{what} natively vs {FAST}", got, want)


@pytest.mark.parametrize("d,n,k,accumulate", AVX512_CASES)
def test_matmul_q8_avx512_gives_the_avx2_bits(model512, native, d, n, k, accumulate):
    rng = rng_for("q8 avx512", d, n, k)
    blocks = q8_blocks(rng, d, n, edge=True)
    x = rng.standard_normal((k, n)).astype(np.float32)
    old = rng.standard_normal((k, d)).astype(np.float32)
    def call(cpu, kernel):
        return call_q8_fast(cpu, blocks, n, x, old, accumulate, kernel=kernel)
    want = by_fours(lambda xs, olds: call_q8_fast(native, blocks, n, xs, olds, accumulate), x, old)
    what = f"matmul_q8_avx512 d={d} n={n} k={k} acc={accumulate}"
    same_bits(f"{what} in the model vs {Q8_FAST} natively", call(model512, "matmul_q8_avx512"), want)
    if (got := avx512_natively(native, call, "matmul_q8_avx512")) is not None:
        same_bits(f"{what} natively vs {Q8_FAST}", got, want)
