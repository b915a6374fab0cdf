"""The kernel level ./gemma runs, as asm/cpu.asm chooses it at start-up, for `python -m
builder bench`: which kernels its in-cache figures run and which vectors its FMA peak uses.

`kernel_level(engine_args, flags)` is the level for the engine's extra arguments on a CPU
with these /proc/cpuinfo flags: "baseline" with --baseline or without AVX2, FMA and F16C;
"avx2" with --avx2 or without AVX-512F; else "avx512". cpu.asm asks CPUID and XGETBV; Linux
lists avx2, fma and f16c only where the OS saves the ymm state and avx512f only where it saves
the zmm and opmask state (XCR0 bits 5-7), so the flags say the same. (cpu.asm also takes the
baseline for a model whose dim, ffn or heads x head_dim is not a multiple of 16: no Gemma.)
NEEDS gives the flags the code of each fast level (avx2, avx512) needs, TITLE a level's name
in the report, KERNELS its kernels by weight type (symbols of the engine's image; decode
calls them with one token, prompt blocks with PROMPT_TOKENS, as cpu.asm's kernel records say),
FMA_VECTORS the name of the vectors of a fast level's FMA peak loop (fma_level: the baseline
has no FMA, so its prompt is set against the AVX2 peak, what the CPU offers the fast path).
"""
from __future__ import annotations

NEEDS = {"avx2": frozenset({"avx2", "fma", "f16c"}),
         "avx512": frozenset({"avx2", "fma", "f16c", "avx512f"})}
TITLE = {"baseline": "SSE baseline", "avx2": "AVX2+FMA+F16C", "avx512": "AVX-512F"}
KERNELS = {"baseline": {"f16": "matmul_f16", "q8_0": "matmul_q8"},
           "avx2": {"f16": "matmul_f16_avx2", "q8_0": "matmul_q8_avx2"},
           "avx512": {"f16": "matmul_f16_avx512", "q8_0": "matmul_q8_avx512"}}
# tokens a prompt call takes (asm/cpu.asm): AVX2 FP16 its two-row tiles' TILE_TOKENS, AVX2
# Q8_0 FAST_TOKENS, AVX-512 both TILE8_TOKENS (their 3 x 8 tiles); the bench does not time
# the baseline's kernels
PROMPT_TOKENS = {"avx2": {"f16": 3, "q8_0": 4}, "avx512": {"f16": 8, "q8_0": 8}}
FMA_VECTORS = {"avx2": "AVX2", "avx512": "AVX-512"}  # the FMA loop's levels: ymm, zmm


def kernel_level(engine_args: list[str], flags: frozenset[str]) -> str:
    """The level the engine runs with these arguments on a CPU with these flags."""
    if "--baseline" in engine_args or not NEEDS["avx2"] <= flags:
        return "baseline"
    if "--avx2" in engine_args or not NEEDS["avx512"] <= flags:
        return "avx2"
    return "avx512"


def fma_level(level: str) -> str:
    """The level whose vectors measure the FMA peak for the engine at `level`: its own, and
    AVX2's for the baseline."""
    return "avx512" if level == "avx512" else "avx2"
