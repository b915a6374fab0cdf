"""x86-64 names shared by the front end, the assembler driver and the verifier.

Contract: register tables (`REGISTERS`: name -> `Reg`), FASM size operators (`SIZES`),
the set of known instruction mnemonics (`MNEMONICS`, capstone's list plus the aliases fasm
accepts), `canonical_mnemonic()` mapping an alias to the name capstone prints, and the
predicate tables of the `cmpps`-style pseudo-instructions. Pure data and small functions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import capstone.x86_const as _cs


@dataclass(frozen=True)
class Reg:
    """A register: `name` as fasm spells it, `kind` (gpr, xmm, ymm, zmm, st, mm, k), `size` in
    bytes, `rex` (encoding it needs a REX/VEX extension), `high` (ah bh ch dh), `evex` (only
    AVX-512 can encode it: zmm, k, xmm16-31, ymm16-31; known here so that capstone's names
    can be read; in sources only zmm0-zmm31 are accepted, and those without displacements)."""
    name: str
    kind: str
    size: int
    rex: bool = False
    high: bool = False
    evex: bool = False


def _gprs() -> dict[str, Reg]:
    regs: dict[str, Reg] = {}
    legacy = ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di"]
    for i, base in enumerate(legacy):
        regs["r" + base] = Reg("r" + base, "gpr", 8)
        regs["e" + base] = Reg("e" + base, "gpr", 4)
        regs[base] = Reg(base, "gpr", 2)
        low = base[0] + "l" if i < 4 else base + "l"
        regs[low] = Reg(low, "gpr", 1, rex=i >= 4)       # spl bpl sil dil need REX
        if i < 4:
            regs[base[0] + "h"] = Reg(base[0] + "h", "gpr", 1, high=True)
    for n in range(8, 16):
        for suffix, size in (("", 8), ("d", 4), ("w", 2), ("b", 1)):
            name = f"r{n}{suffix}"
            regs[name] = Reg(name, "gpr", size, rex=True)
    return regs


def _vectors() -> dict[str, Reg]:
    regs: dict[str, Reg] = {}
    for kind, size in (("xmm", 16), ("ymm", 32), ("zmm", 64)):
        for n in range(32):
            regs[f"{kind}{n}"] = Reg(f"{kind}{n}", kind, size, rex=n >= 8,
                                     evex=kind == "zmm" or n >= 16)
    for n in range(8):
        regs[f"st{n}"] = Reg(f"st{n}", "st", 10)
        regs[f"mm{n}"] = Reg(f"mm{n}", "mm", 8)
        regs[f"k{n}"] = Reg(f"k{n}", "k", 8, evex=True)
    return regs


REGISTERS: dict[str, Reg] = {**_gprs(), **_vectors()}
SEGMENT_REGISTERS = {"cs", "ds", "es", "fs", "gs", "ss"}

# FASM size operators -> bytes. fasm writes them without `ptr`.
SIZES = {"byte": 1, "word": 2, "dword": 4, "fword": 6, "pword": 6, "qword": 8, "tword": 10,
         "tbyte": 10, "dqword": 16, "xword": 16, "qqword": 32, "yword": 32, "dqqword": 64,
         "zword": 64}
# bytes -> keystone's (Intel syntax) size keyword, used as "<kw> ptr [...]".
KEYSTONE_SIZES = {1: "byte", 2: "word", 4: "dword", 8: "qword", 10: "tbyte", 16: "xmmword",
                  32: "ymmword", 64: "zmmword"}

PREFIXES = {"rep": "rep", "repe": "rep", "repz": "rep", "repne": "repne", "repnz": "repne",
            "lock": "lock"}

# Condition-code aliases: fasm accepts all of them, capstone prints the first form.
_CC_ALIASES = {"z": "e", "nz": "ne", "c": "b", "nae": "b", "nc": "ae", "nb": "ae", "na": "be",
               "nbe": "a", "nge": "l", "nl": "ge", "ng": "le", "nle": "g", "pe": "p", "po": "np"}
_CC = ["o", "no", "b", "ae", "e", "ne", "be", "a", "s", "ns", "p", "np", "l", "ge", "le", "g"]
_ALIASES = {"sal": "shl", "retn": "ret", "retq": "ret", "fwait": "wait", "xlat": "xlatb",
            "loopz": "loope", "loopnz": "loopne", "movabs": "mov", "movsxd": "movsx",
            "pushf": "pushfq", "popf": "popfq", "iret": "iretq", "fcomip": "fcompi",
            "fucomip": "fucompi"}
for _cc, _canon in _CC_ALIASES.items():
    for _head in ("j", "set", "cmov"):
        _ALIASES[_head + _cc] = _head + _canon

# cmpps/cmppd/cmpss/cmpsd and their VEX forms take a predicate immediate; fasm and capstone
# also spell it inside the mnemonic (cmpltps = cmpps with 1).
SSE_PREDICATES = ["eq", "lt", "le", "unord", "neq", "nlt", "nle", "ord"]
AVX_PREDICATES = SSE_PREDICATES + [
    "eq_uq", "nge", "ngt", "false", "neq_oq", "ge", "gt", "true", "eq_os", "lt_oq", "le_oq",
    "unord_s", "neq_us", "nlt_uq", "nle_uq", "ord_s", "eq_us", "nge_uq", "ngt_uq", "false_os",
    "neq_os", "ge_oq", "gt_oq", "true_us"]
_PSEUDO_CMP = re.compile(r"^(v?)cmp([a-z_]+?)(ps|pd|ss|sd)$")

_CAPSTONE = {n[len("X86_INS_"):].lower() for n in dir(_cs)
             if n.startswith("X86_INS_") and n not in ("X86_INS_INVALID", "X86_INS_ENDING")}
_CAPSTONE -= {"rep", "repne", "lock"}
_CAPSTONE |= {"faddp"}                     # printed by capstone, missing from its enum
# x87 mnemonics that are `wait` followed by the no-wait form: two instructions in the bytes.
WAIT_FORMS = {"fstcw": "fnstcw", "fstsw": "fnstsw", "fsave": "fnsave", "fclex": "fnclex",
              "finit": "fninit", "fstenv": "fnstenv"}


def split_pseudo_cmp(mnemonic: str) -> tuple[str, int] | None:
    """('cmpps', 1) for 'cmpltps', ('vcmpps', 30) for 'vcmpgt_oqps'; None if not a pseudo-op."""
    m = _PSEUDO_CMP.match(mnemonic)
    if not m:
        return None
    vex, pred, kind = m.groups()
    table = AVX_PREDICATES if vex else SSE_PREDICATES
    return (f"{vex}cmp{kind}", table.index(pred)) if pred in table else None


# Aliases keystone does not know: the name handed to it instead.
KEYSTONE_NAMES = {"retn": "ret", "retq": "ret", "xlat": "xlatb", "loopz": "loope",
                  "loopnz": "loopne"}


def canonical_mnemonic(mnemonic: str) -> str:
    """The name capstone prints for `mnemonic` (an alias such as jz, sal, movabs is mapped)."""
    return _ALIASES.get(mnemonic, mnemonic)


def _pseudo_cmps() -> set[str]:
    names = set()
    for vex, table in (("", SSE_PREDICATES), ("v", AVX_PREDICATES)):
        for pred in table:
            names.update(f"{vex}cmp{pred}{kind}" for kind in ("ps", "pd", "ss", "sd"))
    return names


MNEMONICS: frozenset[str] = frozenset(_CAPSTONE | set(_ALIASES) | set(WAIT_FORMS)
                                      | _pseudo_cmps())
BRANCHES = frozenset({"jmp", "call", "jcxz", "jecxz", "jrcxz", "loop", "loope", "loopne",
                      "loopz", "loopnz", "xbegin"} | {"j" + cc for cc in _CC}
                     | {"j" + cc for cc in _CC_ALIASES})
# String instructions: written without operands, capstone shows implicit ones.
STRING_OPS = frozenset(f"{op}{s}" for op in ("movs", "stos", "lods", "scas", "cmps", "ins",
                                            "outs") for s in "bwdq") | {"xlatb"}
