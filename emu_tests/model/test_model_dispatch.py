"""asm/cpu.asm's dispatch (cpu_setup) on emulated CPUs: CPUID and XGETBV answer as a baseline
CPU, an AVX2 CPU, an AVX-512 CPU, or one of them missing a feature or OS support, and the
kernels and tokens per call it stores must be the ones its header promises: the AVX2 kernels
(FP16 3 tokens a call: its prompt tiles; Q8_0 FAST_TOKENS) only with AVX, FMA, F16C, OSXSAVE,
XCR0 bits 1-2 and every product's n a multiple of 16 (fv_cols: check_program ors every MATMUL's
n into it), and not with --baseline; the AVX-512
kernels (TILE8_TOKENS both: their 3 x 8 tiles) where AVX-512F and XCR0 bits 5-7 come on top, and not with --avx2;
the baseline kernels and 1 token otherwise.

cpu_setup reads fv_cols and the flags (--baseline and --avx2: bytes 2 and 3 of opt_flags,
vars.asm) and writes the image's job variables, so a SysV wrapper (test-side, assembled above
the image) sets them and copies the four results out.
"""
from __future__ import annotations

import numpy as np
import pytest

from emu_tests.asm_facts import constant
from emu_tests.harness import AVX2, AVX512, BASELINE, Emulator, Out, load_elf, with_routines
from emu_tests.harness.cpus import XCR0_AVX, XCR0_X87_SSE

WRAPPER = {
    # cpu_setup_sysv(out u64[4], cols, baseline, avx2): out = kernel, Q8_0 kernel, their
    # tokens per call
    "cpu_setup_sysv": """
        push rbx
        push rbp
        push rdi
        mov ebp, {front_base}
        mov dword ptr [{fv_cols}], esi
        mov byte ptr [{opt_flags} + 2], dl
        mov byte ptr [{opt_flags} + 3], cl
        call {cpu_setup}
        pop rdi
        mov rax, qword ptr [{job_kernel}]
        mov qword ptr [rdi], rax
        mov rax, qword ptr [{job_kernel_q8}]
        mov qword ptr [rdi + 8], rax
        mov eax, dword ptr [{job_tokens}]
        mov qword ptr [rdi + 16], rax
        mov eax, dword ptr [{job_tokens_q8}]
        mov qword ptr [rdi + 24], rax
        pop rbp
        pop rbx
        ret""",
}
GEMMA_2B = (2048, 16384, 2048)                      # the products' n: dim, ffn, heads x head_dim
SLOW = ("matmul_f16", "matmul_q8", 1, 1)
FAST = ("matmul_f16_avx2", "matmul_q8_avx2", constant("TILE_TOKENS"), constant("FAST_TOKENS"))
FAST512 = ("matmul_f16_avx512", "matmul_q8_avx512", constant("TILE8_TOKENS"), constant("TILE8_TOKENS"))

CASES = [
    (BASELINE, GEMMA_2B, "", SLOW),
    (AVX2, GEMMA_2B, "", FAST),
    (AVX512, GEMMA_2B, "", FAST512),
    (AVX512.without("avx512f"), GEMMA_2B, "", FAST),
    (AVX512.with_xcr0(XCR0_X87_SSE | XCR0_AVX), GEMMA_2B, "", FAST),  # no zmm state saved
    (AVX2.without("fma"), GEMMA_2B, "", SLOW),
    (AVX2.without("f16c"), GEMMA_2B, "", SLOW),
    (AVX2.without("avx"), GEMMA_2B, "", SLOW),
    (AVX2.without("osxsave"), GEMMA_2B, "", SLOW),     # XGETBV would fault: not reached
    (AVX2.with_xcr0(XCR0_X87_SSE), GEMMA_2B, "", SLOW),  # the OS saves no ymm state
    (AVX512, GEMMA_2B, "--baseline", SLOW),
    (AVX512, GEMMA_2B, "--avx2", FAST),
    (AVX2, GEMMA_2B, "--avx2", FAST),
    (AVX512, GEMMA_2B, "--baseline --avx2", SLOW),
    (AVX2, (2056, 16384, 2048), "", SLOW),                # dim 8 mod 16
    (AVX2, (2048, 16392, 2048), "", SLOW),                # ffn
    (AVX2, (2048, 16384, 2056), "", SLOW),                # heads x head_dim
    (AVX2, (64, 256, 64), "", FAST),
    (AVX512, (64, 256, 64), "", FAST512),
    (AVX512, (2056, 16384, 2048), "", SLOW),
]


@pytest.fixture(scope="module")
def image(gemma):
    return with_routines(load_elf(gemma.elf, gemma.symbols), WRAPPER)


@pytest.mark.parametrize("cpu,dims,flags,want", CASES,
                         ids=[f"{c[0].name}-{c[1]}-{c[2] or 'default'}" for c in CASES])
def test_cpu_setup_picks_the_kernels(image, cpu, dims, flags, want):
    dim, ffn, q_dim = dims
    out = Emulator(image, cpu=cpu).call("cpu_setup_sysv", Out(np.zeros(4, np.uint64), "out"),
                                        dim | ffn | q_dim, int("--baseline" in flags),
                                        int("--avx2" in flags)).out
    names = {image.symbol(s).address: s for s in SLOW[:2] + FAST[:2] + FAST512[:2]}
    got = (names.get(int(out[0]), hex(int(out[0]))), names.get(int(out[1]), hex(int(out[1]))),
           int(out[2]), int(out[3]))
    assert got == want, f"{cpu.name}, dims {dims}, flags {flags!r}: chose {got}"
