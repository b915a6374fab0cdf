"""The instruction forms the model (emu_tests/harness/avx.py) is checked on against the CPU,
the routine that runs each, its inputs, and the recording of the CPU's answers.

Contract:
- `FORMS`: one `Form` per instruction form, in fasm syntax: destination register 1, sources
  registers 2 and 3, write mask k1 (and k2), memory operand [rdx], general register eax; with
  the CPU features the SDM says it needs (the model's table must agree), how its inputs are
  drawn (`kind`) and a crafted first trial where one matters (`crafted`: register number, or
  0 for memory, -> 32-bit lanes).
- `build(forms) -> Image`: the routines assembled by fasm (keystone mis-encodes EVEX
  displacements and refuses AVX512BW/DQ/VL), one per 256-byte slot from BASE, named
  `form.key`: `routine(out, in, mem, trials)`: per trial, load registers 1-3 (ymm, or zmm for
  forms that need AVX-512), k1 and k2 (AVX-512 only) and rax from `in`, point rdx at the
  trial's MEM bytes of `mem`, run the instruction, store register 1 whole, rax and k1 to `out`.
- `inputs(form) -> (in, mem)`: TRIALS trials of bytes from a PCG64 stream seeded by the
  form's key (raw 64-bit draws: the same on every numpy), with IEEE special values, exact
  ties, denormals and overflow for float kinds, extreme values for integer kinds; masks all
  ones in trial 1 and all zeros in trial 2; the crafted values in trial 0; for float32 forms
  every pair of SPECIALS (NaNs, infinities, zeros) across two operands in trials PAIRS.
- `run(runner, form, inp, mem) -> (out, mem)`: one call by an Emulator or a NativeRunner.
- `RECORD`: the CPU's outputs for every form (`python -m emu_tests.model.record` on a host
  with every feature writes it); `load_record()` -> {key: Recorded(digest of the inputs, out,
  mem or None when the form leaves memory as it was)}.
- `DOUBLE_ROUNDING`: float32 (a, b, c) whose a x b + c computed in float64 and then rounded
  to float32 is not the correctly rounded result (the crafted trial of the FMA forms).
"""
from __future__ import annotations

import hashlib
import subprocess
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emu_tests.harness import In, Out
from emu_tests.harness.image import Image, Segment, Symbol

BASE = 0x400000
SLOT = 256
TRIALS = 24
PAIRS = range(3, 11)            # f32 forms: trials where registers 2 and 3 (and memory) take
                                # every pair of SPECIALS, register 1 a third one
MEM = 64                                        # bytes of memory operand per trial
RECORD = Path(__file__).with_name("cpu_record.npz")


def _f32(*xs: float) -> np.ndarray:
    return np.array(xs, np.float32).view(np.uint32)


def _double_rounding() -> list[tuple[float, float, float]]:
    """c + a b lands within 2^-70 of a float32 midpoint: float64 rounds onto the midpoint and
    float32 then breaks the tie the wrong way. Mirrored in sign and scaled by 2^s."""
    u = 2.0 ** -23
    near = (1 + u) * 2.0 ** -12, (1 - u) * 2.0 ** -12            # a b = 2^-24 (1 - 2^-46)
    cases = []
    for s in (-60, 0, 60):
        for sign in (1, -1):
            for a_sign in (1, -1):                   # a b just below / above the midpoint
                scale = sign * 2.0 ** s
                cases.append((a_sign * near[0] * scale, near[1], (1 + u) * scale))
    return cases


DOUBLE_ROUNDING = _double_rounding()
_A, _B, _C = (_f32(*col) for col in zip(*DOUBLE_ROUNDING))


@dataclass(frozen=True)
class Form:
    text: str
    features: frozenset[str]
    kind: str = "f32"                # f32, f16, i16, i32, bytes
    crafted: dict[int, np.ndarray] = field(default_factory=dict, compare=False, hash=False)
    zmm: bool = False                # in the zmm harness even without AVX-512 features

    @property
    def key(self) -> str:
        ident = f"{self.text} {'zmm' if self.wide else 'ymm'}"
        return f"{self.text.split()[0]}_{zlib.crc32(ident.encode()):08x}"

    @property
    def wide(self) -> bool:
        """Runs in the zmm harness (k registers, 64-byte registers)."""
        return self.zmm or any(f.startswith("avx512") for f in self.features)

    @property
    def needs(self) -> frozenset[str]:
        """What running the form natively takes: its features, and AVX-512F for the zmm
        harness's loads and stores (vzeroupper in that harness needs only AVX itself)."""
        return self.features | {"avx512f"} if self.wide else self.features

    @property
    def width(self) -> int:
        return 64 if self.wide else 32

    @property
    def in_stride(self) -> int:
        return 3 * self.width + 24

    @property
    def out_stride(self) -> int:
        return self.width + 16


def _form(text: str, *features: str, kind: str = "f32", crafted=None, zmm: bool = False) -> Form:
    return Form(text, frozenset(features), kind, crafted or {}, zmm)


FMA231 = {1: _C, 2: _A, 3: _B}                  # register 1 = 2 x 3 + 1
FMA213 = {2: _A, 1: _B, 3: _C}                  # register 1 = 2 x 1 + 3
PMADDWD_MIN = {2: np.full(1, 0x80008000, np.uint32), 3: np.full(1, 0x80008000, np.uint32)}
F, BW, DQ, VL, VNNI = "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"

FORMS = [
    # --- VEX: what matmul_f16_avx2 and matmul_q8_avx2 run, and their neighbours ---
    _form("vfmadd231ps ymm1, ymm2, ymm3", "fma", crafted=FMA231),
    _form("vfmadd231ps ymm1, ymm2, [rdx]", "fma"),
    _form("vfmadd231ps xmm1, xmm2, xmm3", "fma", crafted=FMA231),
    _form("vfmadd213ps ymm1, ymm2, ymm3", "fma", crafted=FMA213),
    _form("vfmadd132ps ymm1, ymm2, [rdx]", "fma"),
    _form("vcvtph2ps ymm1, [rdx]", "f16c", kind="f16"),
    _form("vcvtph2ps ymm1, xmm2", "f16c", kind="f16"),
    _form("vcvtph2ps xmm1, xmm2", "f16c", kind="f16"),
    _form("vcvtps2ph xmm1, ymm2, 0", "f16c"),
    _form("vcvtps2ph [rdx], ymm2, 4", "f16c"),
    _form("vcvtps2ph xmm1, xmm2, 4", "f16c"),
    _form("vpbroadcastw xmm1, [rdx]", "avx2", kind="bytes"),
    _form("vpbroadcastw ymm1, xmm2", "avx2", kind="bytes"),
    _form("vpbroadcastd ymm1, [rdx]", "avx2", kind="bytes"),
    _form("vpbroadcastb ymm1, [rdx]", "avx2", kind="bytes"),
    _form("vbroadcastss ymm1, [rdx]", "avx"),
    _form("vbroadcastss ymm1, xmm2", "avx2"),
    _form("vpmovsxbd ymm1, [rdx]", "avx2", kind="bytes"),
    _form("vpmovsxbd xmm1, xmm2", "avx", kind="bytes"),
    _form("vpmovsxbw ymm1, [rdx]", "avx2", kind="bytes"),
    _form("vpmovsxwd ymm1, xmm2", "avx2", kind="i16"),
    _form("vpmovzxbd ymm1, [rdx]", "avx2", kind="bytes"),
    _form("vcvtdq2ps ymm1, ymm2", "avx", kind="i32"),
    _form("vcvtdq2ps xmm1, [rdx]", "avx", kind="i32"),
    _form("vmulps ymm1, ymm2, ymm3", "avx"),
    _form("vmulps xmm1, xmm2, [rdx]", "avx"),
    _form("vaddps ymm1, ymm2, [rdx]", "avx"),
    _form("vaddps xmm1, xmm2, xmm3", "avx"),
    _form("vsubps ymm1, ymm2, ymm3", "avx"),
    _form("vhaddps ymm1, ymm2, ymm3", "avx"),
    _form("vhaddps xmm1, xmm2, [rdx]", "avx"),
    _form("vaddss xmm1, xmm2, [rdx]", "avx"),
    _form("vaddss xmm1, xmm2, xmm3", "avx"),
    _form("vmulss xmm1, xmm2, xmm3", "avx"),
    _form("vmovss [rdx], xmm2", "avx"),
    _form("vmovss xmm1, [rdx]", "avx"),
    _form("vmovss xmm1, xmm2, xmm3", "avx"),
    _form("vextractf128 xmm1, ymm2, 1", "avx"),
    _form("vextractf128 [rdx], ymm2, 1", "avx"),
    _form("vextracti128 xmm1, ymm2, 1", "avx2", kind="bytes"),
    _form("vpermilps xmm1, xmm2, 0x39", "avx"),
    _form("vpermilps ymm1, ymm2, 0x1b", "avx"),
    _form("vpermilps ymm1, ymm2, ymm3", "avx"),
    _form("vpermps ymm1, ymm2, ymm3", "avx2"),
    _form("vxorps ymm1, ymm2, ymm3", "avx"),
    _form("vpxor ymm1, ymm2, [rdx]", "avx2", kind="bytes"),
    _form("vpaddd ymm1, ymm2, ymm3", "avx2", kind="bytes"),
    _form("vpmaddwd ymm1, ymm2, ymm3", "avx2", kind="i16", crafted=PMADDWD_MIN),
    _form("vmovups ymm1, [rdx]", "avx"),
    _form("vmovups [rdx], ymm2", "avx"),
    _form("vmovaps xmm1, [rdx]", "avx"),
    _form("vmovdqu ymm1, [rdx]", "avx", kind="bytes"),
    _form("vmovdqa [rdx], ymm2", "avx", kind="bytes"),
    _form("vzeroupper", "avx"),
    _form("vzeroall", "avx"),
    # --- EVEX: what AVX-512 versions of the kernels need ---
    _form("vmovups zmm1, [rdx]", F),
    _form("vmovups [rdx], zmm2", F),
    _form("vmovups zmm1{k1}{z}, [rdx]", F),
    _form("vmovups zmm1{k1}, [rdx]", F),
    _form("vmovups [rdx]{k1}, zmm2", F),
    _form("vmovups zmm1{k1}, zmm2", F),
    _form("vmovups ymm1{k1}{z}, [rdx]", F, VL),
    _form("vmovaps zmm1{k1}{z}, [rdx]", F),
    _form("vmovdqu8 zmm1{k1}{z}, [rdx]", BW, kind="bytes"),
    _form("vmovdqu8 [rdx]{k1}, zmm2", BW, kind="bytes"),
    _form("vmovdqu16 zmm1{k1}, [rdx]", BW, kind="bytes"),
    _form("vmovdqu32 zmm1{k1}{z}, [rdx]", F, kind="bytes"),
    _form("vmovdqu32 [rdx]{k1}, zmm2", F, kind="bytes"),
    _form("vmovdqu64 zmm1{k1}, zmm2", F, kind="bytes"),
    _form("vmovdqa32 zmm1, [rdx]", F, kind="bytes"),
    _form("vmovdqa64 zmm1{k1}{z}, [rdx]", F, kind="bytes"),
    _form("vfmadd132ps zmm1{k1}, zmm2, zmm3", F),
    _form("vcvtph2ps zmm1, [rdx]", F, kind="f16"),
    _form("vcvtph2ps zmm1{k1}, [rdx]", F, kind="f16"),
    _form("vcvtph2ps zmm1{k1}{z}, ymm2", F, kind="f16"),
    _form("vcvtps2ph [rdx]{k1}, zmm2, 4", F),
    _form("vcvtps2ph ymm1, zmm2, 0", F),
    _form("vfmadd231ps zmm1, zmm2, [rdx]", F),
    _form("vfmadd231ps zmm1{k1}, zmm2, [rdx]{1to16}", F),
    _form("vfmadd231ps zmm1{k1}{z}, zmm2, zmm3", F, crafted=FMA231),
    _form("vfmadd213ps zmm1, zmm2, zmm3", F, crafted=FMA213),
    _form("vfmadd213ps zmm1{k1}, zmm2, [rdx]", F),
    _form("vfmadd231ps ymm1{k1}, ymm2, ymm3", F, VL),
    _form("vmulps zmm1{k1}, zmm2, zmm3", F),
    _form("vaddps zmm1, zmm2, [rdx]{1to16}", F),
    _form("vaddps zmm1{k1}{z}, zmm2, zmm3", F),
    _form("vaddps xmm1{k1}{z}, xmm2, [rdx]{1to4}", F, VL),
    _form("vbroadcastss zmm1, [rdx]", F),
    _form("vbroadcastss zmm1{k1}{z}, xmm2", F),
    _form("vpbroadcastd zmm1{k1}, [rdx]", F, kind="bytes"),
    _form("vpbroadcastd zmm1, eax", F, kind="bytes"),
    _form("vpbroadcastw zmm1, xmm2", BW, kind="bytes"),
    _form("vpmovsxbd zmm1, [rdx]", F, kind="bytes"),
    _form("vpmovsxbd zmm1{k1}, [rdx]", F, kind="bytes"),
    _form("vpmovsxbd zmm1{k1}{z}, xmm2", F, kind="bytes"),
    _form("vpmovsxbw zmm1, [rdx]", BW, kind="bytes"),
    _form("vpmovsxbw zmm1{k1}, ymm2", BW, kind="bytes"),
    _form("vcvtdq2ps zmm1, zmm2", F, kind="i32"),
    _form("vcvtdq2ps zmm1{k1}, [rdx]{1to16}", F, kind="i32"),
    _form("vpermps zmm1, zmm2, zmm3", F),
    _form("vpermps zmm1{k1}, zmm2, [rdx]", F),
    _form("vshuff32x4 zmm1, zmm2, zmm3, 0x4e", F),
    _form("vshuff32x4 zmm1{k1}{z}, zmm2, [rdx], 0xb1", F),
    _form("vshuff32x4 ymm1, ymm2, ymm3, 1", F, VL),
    _form("vextractf32x8 ymm1, zmm2, 1", DQ),
    _form("vextractf32x8 [rdx]{k1}, zmm2, 1", DQ),
    _form("vextractf32x4 xmm1, zmm2, 3", F),
    _form("vextractf64x4 ymm1{k1}{z}, zmm2, 1", F),
    _form("vextractf64x4 [rdx], zmm2, 0", F),
    _form("vextractf32x4 xmm1{k1}{z}, ymm2, 1", F, VL),
    _form("vpermilps zmm1, zmm2, 0x93", F),
    _form("vxorps zmm1, zmm2, zmm3", DQ),
    _form("vpxord zmm1{k1}, zmm2, [rdx]{1to16}", F, kind="bytes"),
    _form("vpxorq zmm1, zmm2, zmm3", F, kind="bytes"),
    _form("vpaddd zmm1{k1}, zmm2, [rdx]{1to16}", F, kind="bytes"),
    _form("vpmaddwd zmm1, zmm2, zmm3", BW, kind="i16", crafted=PMADDWD_MIN),
    _form("vpmaddwd zmm1{k1}, zmm2, [rdx]", BW, kind="i16"),
    _form("vpdpbusd zmm1, zmm2, zmm3", VNNI, kind="bytes"),
    _form("vpdpbusd zmm1{k1}, zmm2, [rdx]{1to16}", VNNI, kind="bytes"),
    _form("kmovw k1, eax", F, kind="bytes"),
    _form("kmovw eax, k1", F, kind="bytes"),
    _form("kmovw k1, [rdx]", F, kind="bytes"),
    _form("kmovw [rdx], k1", F, kind="bytes"),
    _form("kxnorw k1, k2, k1", F, kind="bytes"),
    _form("kmovq k1, rax", BW, kind="bytes"),
    _form("kmovd eax, k2", BW, kind="bytes"),
    _form("kxnorw k1, k1, k1", F, kind="bytes"),
    _form("vzeroupper", "avx", zmm=True),
]


# --- the routines ----------------------------------------------------------------------------

def _routine(form: Form) -> str:
    w = form.width
    reg, mov = ("zmm", "vmovdqu32") if form.wide else ("ymm", "vmovdqu")
    kmov = "kmovq" if "avx512bw" in form.features else "kmovw"
    k_in = (f"        {kmov} k1, [rsi+{3 * w}]\n        {kmov} k2, [rsi+{3 * w + 8}]\n"
            if form.wide else "")
    k_out = f"        {kmov} [rdi+{w + 8}], k1\n" if form.wide else ""
    return (f"        align {SLOT}\n{form.key}:\n.next:\n"
            f"        {mov} {reg}1, [rsi]\n        {mov} {reg}2, [rsi+{w}]\n"
            f"        {mov} {reg}3, [rsi+{2 * w}]\n{k_in}"
            f"        mov rax, [rsi+{3 * w + 16}]\n"
            f"        {form.text}\n"
            f"        {mov} [rdi], {reg}1\n        mov [rdi+{w}], rax\n{k_out}"
            f"        add rsi, {form.in_stride}\n        add rdi, {form.out_stride}\n"
            f"        add rdx, {MEM}\n        dec ecx\n        jnz .next\n"
            f"        vzeroupper\n        ret\n"
            f"        assert $ - {form.key} <= {SLOT}\n")


def build(forms: list[Form]) -> Image:
    src = f"format binary\nuse64\norg {BASE:#x}\n" + "".join(_routine(f) for f in forms)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "forms.asm").write_text(src)
        r = subprocess.run(["fasm", "forms.asm", "forms.bin"], cwd=tmp, capture_output=True,
                           text=True)
        if r.returncode:
            raise RuntimeError(f"fasm failed on the forms: {(r.stdout + r.stderr)[-600:]}")
        code = (Path(tmp) / "forms.bin").read_bytes()
    symbols = {f.key: Symbol(BASE + SLOT * i, SLOT) for i, f in enumerate(forms)}
    return Image([Segment(BASE, code, len(code), executable=True)], symbols, BASE)


# --- the inputs ------------------------------------------------------------------------------

def _f32_lanes(u: np.ndarray) -> np.ndarray:
    """A float32 per 64-bit draw: category in the low 4 bits, the rest the value's bits."""
    cat, v = u & 15, u >> 4
    sign = (v & 1).astype(np.uint32) << 31
    mant = ((v >> 1) & 0x7FFFFF).astype(np.uint32)
    exps = ((v >> 24) & 0xFF).astype(np.uint32)
    near_one = (127 + exps % 7 - 3) << 23 | mant                          # 0.125 .. 8
    few_bits = (127 + exps % 53 - 26) << 23 | (mant & 0x780001)          # ties in sums
    small_int = np.array((v >> 32) % 512, np.float32).view(np.uint32)
    denormal = mant >> (exps % 23)                                        # exponent field 0
    tiny = (1 + exps % 8) << 23 | mant
    huge = (247 + exps % 8) << 23 | mant
    specials = np.array([0, 0x7F800000, 0x7FC00000 | 0x1234, 0x7F800001 | 0x2A0000,
                         0xFFC00000, 0x7F7FFFFF, 0x00000001, 0x7FBFFFFF], np.uint32)
    special = specials[exps % len(specials)]
    table = np.stack([near_one, near_one, near_one, near_one, near_one, near_one, few_bits,
                      few_bits, small_int, denormal, tiny, huge, special, mant | exps << 23,
                      (v & 0x7FFFFFFF).astype(np.uint32), (v & 0x7FFFFFFF).astype(np.uint32)])
    return sign | table[cat, np.arange(len(u))]


def _f16_lanes(u: np.ndarray) -> np.ndarray:
    """Two FP16 per draw's halves: IEEE specials, denormals, the largest values, any bits."""
    h = np.stack([u & 0xFFFF, (u >> 16) & 0xFFFF], axis=1).reshape(-1).astype(np.uint16)
    cat = np.stack([(u >> 32) & 7, (u >> 40) & 7], axis=1).reshape(-1)
    specials = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x7BFF, 0x0001,
                         0x03FF, 0xFE55, 0x7D2A], np.uint16)
    h = np.where(cat == 0, specials[h % len(specials)], h)
    return np.where(cat == 1, h & 0x83FF, h)                              # denormals


def _i16_lanes(u: np.ndarray) -> np.ndarray:
    h = np.stack([u & 0xFFFF, (u >> 16) & 0xFFFF], axis=1).reshape(-1).astype(np.uint16)
    cat = np.stack([(u >> 32) & 7, (u >> 40) & 7], axis=1).reshape(-1)
    return np.where(cat < 2, np.uint16(0x8000), np.where(cat == 2, np.uint16(0x7FFF), h))


def _i32_lanes(u: np.ndarray) -> np.ndarray:
    """int32: any bits, exact ties of the float32 rounding (odd or even below), the extremes."""
    v = (u >> 4).astype(np.uint32)
    shift = (u >> 40) % 7 + 2
    tie = ((v & 0xFFFFFF) | 0x800000).astype(np.uint64) << shift | (1 << (shift - 1))
    small = (v % 4096).astype(np.int32).view(np.uint32)
    cat = u & 7
    extreme = np.where(cat == 4, np.uint32(0x80000000), np.uint32(0x7FFFFFFF))
    return np.where(cat < 3, tie.astype(np.uint32) & 0x7FFFFFFF,
                    np.where(cat == 3, small, np.where(cat < 6, extreme, v)))


def _lanes(kind: str, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    u = rng.bit_generator.random_raw(-(-nbytes // (8 if kind == "bytes" else 4)))
    lanes = {"f32": _f32_lanes, "i32": _i32_lanes, "f16": _f16_lanes, "i16": _i16_lanes,
             "bytes": lambda w: w}[kind](u)
    return np.ascontiguousarray(lanes).view(np.uint8)[:nbytes]


SPECIALS = _f32(0.0, -0.0, np.inf, -np.inf, 1.5, -3.0).tolist() + [0x7FC01234, 0x7F812345,
                                                                     0xFFC0ABCD, 0xFF80F00D]


def _special_pairs(inp: np.ndarray, mem: np.ndarray, w: int) -> None:
    """Trials PAIRS, lane j (counted over those trials): register 2 SPECIALS[j // S], register
    3 and memory SPECIALS[j % S], register 1 SPECIALS[(j // S**2 + j) % S], S = len(SPECIALS);
    as far as the lanes go (ymm: 64 of the 100 pairs, zmm: all)."""
    s = np.array(SPECIALS, np.uint32)
    j = np.arange(len(PAIRS) * w // 4)
    lanes = {1: s[(j // len(s) ** 2 + j) % len(s)], 2: s[j // len(s) % len(s)], 3: s[j % len(s)]}
    rows = slice(PAIRS.start, PAIRS.stop)
    for r, v in lanes.items():
        inp[rows, (r - 1) * w:r * w] = v.view(np.uint8).reshape(len(PAIRS), w)
    mem[rows, :w] = lanes[3].view(np.uint8).reshape(len(PAIRS), w)[:, :MEM]


def inputs(form: Form) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(zlib.crc32(form.key.encode())))
    w = form.width
    inp = np.zeros((TRIALS, form.in_stride), np.uint8)
    for r in range(3):
        inp[:, r * w:(r + 1) * w] = _lanes(form.kind, TRIALS * w, rng).reshape(TRIALS, w)
    masks = rng.bit_generator.random_raw(2 * TRIALS).reshape(TRIALS, 2)
    masks[1], masks[2] = 2**64 - 1, 0
    inp[:, 3 * w:3 * w + 16] = masks.view(np.uint8)
    inp[:, 3 * w + 16:] = rng.bit_generator.random_raw(TRIALS).reshape(TRIALS, 1).view(np.uint8)
    mem = _lanes(form.kind, TRIALS * MEM, rng).reshape(TRIALS, MEM).copy()
    if form.kind == "f32":
        _special_pairs(inp, mem, w)
    for r, lanes in form.crafted.items():
        target = mem[0] if r == 0 else inp[0, (r - 1) * w:r * w]
        target[:] = np.resize(lanes, len(target) // 4).view(np.uint8)
    return inp, mem


def digest(inp: np.ndarray, mem: np.ndarray) -> str:
    return hashlib.sha256(inp.tobytes() + mem.tobytes()).hexdigest()


def run(runner, form: Form, inp: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((TRIALS, form.out_stride), np.uint8)
    r = runner.call(form.key, Out(out, "out"), In(inp, "in"), Out(mem.copy(), "mem"), TRIALS)
    return r.outputs[0], r.outputs[1]


@dataclass(frozen=True)
class Recorded:
    digest: str
    out: np.ndarray
    mem: np.ndarray | None


def record_arrays(form: Form, inp: np.ndarray, mem: np.ndarray, out: np.ndarray,
                  mem_after: np.ndarray) -> dict[str, np.ndarray]:
    """One form's entries of RECORD."""
    changed = not np.array_equal(mem_after, mem)
    return {f"{form.key}.digest": np.array(digest(inp, mem)), f"{form.key}.out": out,
            f"{form.key}.mem": mem_after if changed else np.zeros(0, np.uint8)}


def load_record() -> dict[str, Recorded]:
    if not RECORD.exists():
        return {}
    with np.load(RECORD) as z:
        keys = {name.rsplit(".", 1)[0] for name in z.files}
        return {k: Recorded(str(z[f"{k}.digest"]), z[f"{k}.out"],
                            z[f"{k}.mem"] if z[f"{k}.mem"].size else None) for k in keys}
