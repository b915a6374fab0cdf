"""Static views of an image's machine code, through capstone.

Contract:
- `reachable(image, start)` disassembles by recursive descent from `start`: it follows
  fall-through, direct jumps, conditional branches and direct calls (not indirect ones), stops
  at ret/jmp/hlt/ud2 and at bytes that do not decode, and returns the instructions in address
  order. This sees only real code, never the strings and constants between routines.
- `vex_kind(insn)` is "VEX", "EVEX" or None: Unicorn runs no AVX and silently miscomputes some
  128-bit VEX forms, so the routine emulator runs them in its model (avx.py) and the
  whole-program emulator refuses them.
- `sweep(image, start, size)` is a linear disassembly (stops at the first undecodable byte).
- `cpu_features(insns)` names the /proc/cpuinfo flags the instructions need beyond SSE3.
- `describe(image, insn)` is "0xADDR (symbol+0xOFF): mnemonic operands".
"""
from __future__ import annotations

from functools import lru_cache

import capstone
from capstone import x86_const as X

from .image import Image

LEGACY_PREFIXES = frozenset(b"\x66\x67\xf2\xf3\xf0\x2e\x36\x3e\x26\x64\x65")
STOPS = frozenset({"ret", "retf", "jmp", "hlt", "ud2", "iretq"})
MAX_INSN = 15

# capstone group -> the /proc/cpuinfo flag a CPU must report to run it
FEATURE_OF_GROUP = {
    X.X86_GRP_SSSE3: "ssse3", X.X86_GRP_SSE41: "sse4_1", X.X86_GRP_SSE42: "sse4_2",
    X.X86_GRP_AVX: "avx", X.X86_GRP_AVX2: "avx2", X.X86_GRP_FMA: "fma",
    X.X86_GRP_F16C: "f16c", X.X86_GRP_AVX512: "avx512f", X.X86_GRP_BWI: "avx512bw",
    X.X86_GRP_DQI: "avx512dq", X.X86_GRP_VLX: "avx512vl", X.X86_GRP_BMI: "bmi1",
    X.X86_GRP_BMI2: "bmi2",
}


@lru_cache(maxsize=1)
def _cs() -> capstone.Cs:
    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.detail = True
    return cs


def decode(code: bytes, address: int):
    """The first instruction of `code` at `address`, or None when it does not decode."""
    return next(_cs().disasm(code[:MAX_INSN], address, 1), None)


def decode_all(code: bytes, address: int) -> list:
    return list(_cs().disasm(code, address))


def vex_kind(insn) -> str | None:
    raw = bytes(insn.bytes)
    i = 0
    while i < len(raw) and raw[i] in LEGACY_PREFIXES:
        i += 1
    op = raw[i] if i < len(raw) else None
    # in 64-bit mode C4/C5 are always VEX and 62 always EVEX (LES/LDS/BOUND do not exist)
    return {0xC4: "VEX", 0xC5: "VEX", 0x62: "EVEX"}.get(op)


def _direct_target(insn) -> int | None:
    ops = insn.operands
    if len(ops) == 1 and ops[0].type == X.X86_OP_IMM:
        return ops[0].imm
    return None


def reachable(image: Image, start: int) -> list:
    """Instructions reachable from `start` (see module docstring), sorted by address."""
    seen: dict[int, object] = {}
    work = [start]
    while work:
        addr = work.pop()
        while addr not in seen:
            seg = image.segment_at(addr)
            if seg is None or not seg.executable:
                break
            insn = decode(image.read(addr, MAX_INSN), addr)
            if insn is None:
                break
            seen[addr] = insn
            groups = set(insn.groups)
            target = _direct_target(insn) if groups & {X.X86_GRP_JUMP, X.X86_GRP_CALL} else None
            if target is not None:
                work.append(target)
            if insn.mnemonic in STOPS:
                break
            addr += insn.size
    return [seen[a] for a in sorted(seen)]


def sweep(image: Image, start: int, size: int) -> list:
    return decode_all(image.read(start, size), start)


def cpu_features(insns) -> set[str]:
    need = set()
    for insn in insns:
        for g in insn.groups:
            if g in FEATURE_OF_GROUP:
                need.add(FEATURE_OF_GROUP[g])
    return need


def describe(image: Image, insn) -> str:
    return f"{image.where(insn.address)}: {insn.mnemonic} {insn.op_str}".rstrip()
