"""The emulated CPU's identity: which instruction sets it has, as CPUID and XGETBV report them.

Contract:
- `Cpu(name, flags, xcr0)`: `flags` are /proc/cpuinfo names ("avx2", "fma", "avx512f",
  "osxsave": the OS enabled XSAVE, so XGETBV runs); `xcr0` the register state the OS saves
  (bit 1 SSE, bit 2 AVX, bits 5-7 the AVX-512 opmask and zmm state).
- `BASELINE` (SSE..SSE4.1, what Unicorn's Penryn model runs), `AVX2` (a Haswell: AVX, AVX2,
  FMA, F16C, BMI) and `AVX512` (a Skylake server plus VNNI: AVX512F/BW/DQ/VL/CD/VNNI), each
  with the XCR0 a Linux kernel sets for it. `cpu.without("fma")`, `cpu.with_xcr0(3)` derive
  variants (a CPU without one feature, an OS that saves no AVX state).
- `cpu.cpuid(leaf, subleaf) -> (eax, ebx, ecx, edx)`: leaf 0 (highest leaf, "GenuineIntel"),
  leaf 1 (ecx/edx feature bits), leaf 7 subleaf 0 (ebx/ecx feature bits); every other leaf
  reads as zeros. Only the bits of CPUID_BITS are modelled.
- `cpu.has(features)`: True when every named feature is in `flags`.
- `MXCSR_DEFAULT`: MXCSR as Linux starts a process (the state the model computes in).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# /proc/cpuinfo flag -> (leaf, subleaf, register index in (eax, ebx, ecx, edx), bit)
CPUID_BITS = {
    "fpu": (1, 0, 3, 0), "tsc": (1, 0, 3, 4), "cx8": (1, 0, 3, 8), "cmov": (1, 0, 3, 15),
    "mmx": (1, 0, 3, 23), "fxsr": (1, 0, 3, 24), "sse": (1, 0, 3, 25), "sse2": (1, 0, 3, 26),
    "pni": (1, 0, 2, 0), "ssse3": (1, 0, 2, 9), "fma": (1, 0, 2, 12), "cx16": (1, 0, 2, 13),
    "sse4_1": (1, 0, 2, 19), "sse4_2": (1, 0, 2, 20), "popcnt": (1, 0, 2, 23),
    "xsave": (1, 0, 2, 26), "osxsave": (1, 0, 2, 27), "avx": (1, 0, 2, 28), "f16c": (1, 0, 2, 29),
    "bmi1": (7, 0, 1, 3), "avx2": (7, 0, 1, 5), "bmi2": (7, 0, 1, 8), "avx512f": (7, 0, 1, 16),
    "avx512dq": (7, 0, 1, 17), "avx512cd": (7, 0, 1, 28), "avx512bw": (7, 0, 1, 30),
    "avx512vl": (7, 0, 1, 31), "avx512_vnni": (7, 0, 2, 11),
}
MAX_LEAF = 7
VENDOR = b"GenuineIntel"                      # ebx, edx, ecx in that order
XCR0_X87_SSE, XCR0_AVX, XCR0_AVX512 = 0x3, 0x4, 0xE0
MXCSR_DEFAULT = 0x1F80             # Linux start-up state: all exceptions masked, round-nearest


@dataclass(frozen=True)
class Cpu:
    name: str
    flags: frozenset[str]
    xcr0: int

    def __post_init__(self) -> None:
        unknown = self.flags - CPUID_BITS.keys()
        if unknown:
            raise ValueError(f"{self.name}: no CPUID bit modelled for {', '.join(sorted(unknown))}")

    def has(self, features) -> bool:
        return set(features) <= self.flags

    def without(self, *flags: str) -> Cpu:
        return replace(self, name=f"{self.name} without {', '.join(flags)}",
                       flags=self.flags - set(flags))

    def with_xcr0(self, xcr0: int) -> Cpu:
        return replace(self, name=f"{self.name} with XCR0 {xcr0:#x}", xcr0=xcr0)

    def cpuid(self, leaf: int, subleaf: int) -> tuple[int, int, int, int]:
        regs = [0, 0, 0, 0]
        if leaf == 0:
            v = [int.from_bytes(VENDOR[i:i + 4], "little") for i in (0, 4, 8)]
            return MAX_LEAF, v[0], v[2], v[1]
        for flag in self.flags:
            lf, sub, reg, bit = CPUID_BITS[flag]
            if (lf, sub) == (leaf, subleaf if leaf == 7 else 0):
                regs[reg] |= 1 << bit
        return tuple(regs)


_SSE = frozenset({"fpu", "tsc", "cx8", "cmov", "mmx", "fxsr", "sse", "sse2", "pni", "ssse3",
                  "cx16", "sse4_1"})
BASELINE = Cpu("baseline (SSE..SSE4.1)", _SSE, 0)
AVX2 = Cpu("AVX2 (Haswell)", _SSE | {"sse4_2", "popcnt", "xsave", "osxsave", "avx", "avx2",
                                     "fma", "f16c", "bmi1", "bmi2"}, XCR0_X87_SSE | XCR0_AVX)
AVX512 = Cpu("AVX-512 (Skylake server + VNNI)",
             AVX2.flags | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd",
                           "avx512_vnni"}, XCR0_X87_SSE | XCR0_AVX | XCR0_AVX512)
