"""The Q8_0 kernels against numpy and against the FP16 kernels they mirror.

A Q8_0 weight d q (FP16 scale, int8 q) is exact in float32, and each Q8_0 kernel is written to
do its FP16 twin's float32 operations in the same order on those weights. So:

- matmul_q8 (baseline, in Unicorn with its header's register contract, and natively) gives
  `matmul_f16_in_order` of the dequantized weights bit for bit, and dequant_q8 gives
  float32(d q s) exactly;
- matmul_q8_avx2 (natively) gives matmul_f16_avx2's bits whenever the weights are FP16 values
  (scales that are powers of two: d q then has at most 8 significant bits), and within the
  float32 bound of test_speed_paths for any blocks; its (row, token) bits do not depend on k
  or on the row split, as for FP16.
Blocks come from llama.cpp's reference quantizer (gguf.quants), with edge scales: zero blocks,
subnormal and the largest FP16 scales, and q = -128 (which the quantizer never writes, but a
file may hold).
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.models.modelfile import Q8_0_BLOCK, QK8_0, dequantize_q8_0, quantize_q8_0
from emu_tests.harness import I64, In, Out
from emu_tests.kernels.test_kernels import (F32, U, check, cpu, emu, image, matmul_f16_in_order,  # noqa: F401
                                    rng_for, run_everywhere)
from emu_tests.speed.test_speed_paths import FAST, same_bits

Q8_FAST = "matmul_q8_avx2"


def q8_blocks(rng, d: int, n: int, edge: bool = False, pow2: bool = False) -> np.ndarray:
    """(d, n/32*34) uint8 Q8_0 rows of random weights; pow2: every scale a power of two."""
    w = rng.standard_normal((d, n)).astype(F32) * F32(0.5)
    blocks = quantize_q8_0(w).reshape(d, n // QK8_0, Q8_0_BLOCK)
    if pow2:
        e = rng.integers(-12, 2, (d, n // QK8_0))
        blocks[:, :, :2] = (2.0 ** e).astype("<f2")[..., None].view(np.uint8)
    if edge:
        flat = blocks.reshape(-1, Q8_0_BLOCK)
        picks = rng.choice(len(flat), min(len(flat), 4), replace=False)
        for i, scale in zip(picks, [0.0, 6e-8, 65504.0, -3.0]):
            flat[i, :2] = np.array([scale], "<f2").view(np.uint8)
        flat[picks[-1], 2:6] = np.array([-128, 127, 0, -1], np.int8).view(np.uint8)
    return blocks.reshape(d, -1)


def weights(blocks: np.ndarray, n: int) -> np.ndarray:
    return dequantize_q8_0(blocks, n)


@pytest.mark.parametrize("d,n,accumulate,edge", [
    (1, 32, 0, False), (3, 64, 1, True), (5, 96, 0, True), (16, 256, 1, False),
    (48, 2048, 0, True),
])
def test_matmul_q8(emu, cpu, d, n, accumulate, edge):
    rng = rng_for("matmul_q8", d, n, accumulate)
    blocks = q8_blocks(rng, d, n, edge)
    w = weights(blocks, n)
    x = rng.standard_normal(n).astype(F32)
    old = rng.standard_normal(d).astype(F32)
    in_order = matmul_f16_in_order(w, x, old if accumulate else None)
    exact = w.astype(np.float64) @ x.astype(np.float64) + (old if accumulate else 0)
    bound = (n // 8 + 5) * U * (np.abs(w.astype(np.float64)) @ np.abs(x) + (np.abs(old) if accumulate else 0))

    def twin(label, outs):
        check(label + " vs float64", outs[0], exact, bound)
        # exact: d q is exact in float32 and the kernel keeps matmul_f16's order
        check(label + " vs matmul_f16's order", outs[0], in_order, 0)

    run_everywhere(emu, cpu, "matmul_q8", (Out(old.copy(), "xout"), In(x, "x"), In(blocks, "W"), n, d,
                                           accumulate), f"matmul_q8 d={d} n={n} acc={accumulate}", twin)


@pytest.mark.parametrize("n", [32, 64, 640])
def test_dequant_q8(emu, cpu, n):
    """An embedding row: every weight d q times s, rounded once (d q is exact)."""
    rng = rng_for("dequant_q8", n)
    blocks = q8_blocks(rng, 1, n, edge=True)
    s = np.array([np.sqrt(F32(n))], F32)
    want = weights(blocks, n)[0] * s[0]
    run_everywhere(emu, cpu, "dequant_q8",
                   (Out(np.full(n, F32(-7.25)), "xout"), In(s, "s"), In(blocks, "W"), 1, n, 0),
                   f"dequant_q8 n={n}", lambda label, outs: check(label, outs[0], want, 0))


def call_q8_fast(cpu, blocks: np.ndarray, n: int, x: np.ndarray, old: np.ndarray, accumulate: int,
                 kernel: str = Q8_FAST) -> np.ndarray:
    """matmul_q8_avx2 (or the FP16 kernel on FP16 weights) for k = len(x) tokens, rows of d + 3
    floats; the gaps must keep their junk."""
    d, k, gap = blocks.shape[0], len(x), 3
    out = np.full((k, d + gap), F32(-7.25))
    out[:, :d] = old[:k]
    got = cpu.call(kernel, Out(out, "xout"), In(x, "x"), In(blocks, "W"), n, d, accumulate, k,
                   I64((d + gap) * 4)).outputs[0]
    assert np.all(got[:, d:] == F32(-7.25)), "the kernel wrote between output rows"
    return got[:, :d]


@pytest.mark.parametrize("d,n,k,accumulate", [
    (1, 32, 1, 0), (2, 64, 4, 1), (3, 96, 2, 0), (7, 256, 3, 1), (16, 2048, 4, 0), (5, 2048, 1, 1),
    (2, 32, 1, 1), (6, 96, 1, 0), (16, 2048, 1, 1),
])
def test_q8_fast_kernel_gives_the_fp16_bits(cpu, d, n, k, accumulate):
    """With power-of-two scales the weights are FP16 values: then matmul_q8_avx2 must give
    matmul_f16_avx2's bits on them (the same fused multiply-adds in the same order); for k = 1
    and d even it reads rows i and i + d/2 together (decode pairs), for d odd one at a time."""
    rng = rng_for("q8 fast pow2", d, n, k)
    blocks = q8_blocks(rng, d, n, pow2=True)
    w = weights(blocks, n)
    w16 = w.astype(np.float16)
    assert np.array_equal(w16.astype(F32), w), "the test's weights must be FP16 values"
    x = rng.standard_normal((k, n)).astype(F32)
    old = rng.standard_normal((k, d)).astype(F32)
    same_bits(f"{Q8_FAST} d={d} n={n} k={k}", call_q8_fast(cpu, blocks, n, x, old, accumulate),
              call_q8_fast(cpu, w16, n, x, old, accumulate, kernel=FAST))


@pytest.mark.parametrize("d,n", [(1, 32), (5, 64), (9, 288), (16, 2048)])
def test_q8_fast_kernel_against_float64_and_itself(cpu, d, n):
    """Any blocks (edge scales included): within test_speed_paths' float32 bound of the exact
    products, and a (row, token) result the same bits for every k and row split."""
    rng = rng_for("q8 fast", d, n)
    blocks = q8_blocks(rng, d, n, edge=True)
    w64 = weights(blocks, n).astype(np.float64)
    x = rng.standard_normal((4, n)).astype(F32)
    old = rng.standard_normal((4, d)).astype(F32)
    want = np.stack([call_q8_fast(cpu, blocks, n, x[t:t + 1], old[t:t + 1], 1)[0] for t in range(4)])
    exact = x.astype(np.float64) @ w64.T + old
    bound = (n / 16 + 5) * U * (np.abs(x.astype(np.float64)) @ np.abs(w64).T + np.abs(old))
    err = np.abs(want - exact)
    assert np.all(err <= bound), f"{Q8_FAST} d={d} n={n}: error {err.max():.3g} above the bound"
    for k in (2, 3, 4):
        same_bits(f"{Q8_FAST} d={d} n={n}: k={k} vs k=1", call_q8_fast(cpu, blocks, n, x[:k], old, 1), want[:k])
    for cut in sorted({1, d // 2, d - 1} - {0, d}):
        parts = np.hstack([call_q8_fast(cpu, blocks[:cut], n, x, old[:, :cut], 1),
                           call_q8_fast(cpu, blocks[cut:], n, x, old[:, cut:], 1)])
        same_bits(f"{Q8_FAST} d={d} n={n}: rows split at {cut}", parts, want)
