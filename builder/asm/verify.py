"""Check every instruction keystone produced against what its source line asked for.

Contract: `verify(placed)` disassembles the bytes of each placed instruction with capstone
(detail mode, structured operands) and compares them with its `Expected` record: prefix,
mnemonic (aliases such as jz/je, sal/shl, movabs/mov, cmpltps/cmpps+1 mapped to one name),
registers, immediates (equal as the operand's width sees them, and within that width),
memory operands (size when the source fixed one, registers with their scale as a sum,
displacement, RIP-relative target) and branch targets; layout padding after an
instruction (`Placed.pad`) must be nop bytes. The first difference raises
BuildError "asm/FILE.asm:LINE: keystone encoded 'SOURCE' as 'DISASSEMBLY' (bytes): what".

Known presentation differences that are not errors: string instructions written without
operands (capstone shows the implicit ones), x87 forms with an implied st0/st1, the operand
order of the commutative test and xchg, `int3` as `int 3`, two-operand `imul r, imm`, and
the wait forms (fstcw = wait + fnstcw).
"""
from __future__ import annotations

from capstone import CS_ARCH_X86, CS_MODE_64, Cs
from capstone import x86 as csx86

from .assemble import Expected, Placed
from .errors import BuildError
from .fasm import Instr
from .x86 import STRING_OPS, WAIT_FORMS, canonical_mnemonic, split_pseudo_cmp

_PREFIX_WORDS = {"rep": "rep", "repe": "rep", "repz": "rep", "repne": "repne",
                 "repnz": "repne", "lock": "lock"}
_COMMUTATIVE = {"test", "xchg"}


def _disassembler() -> Cs:
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    return md


def read_back(insn) -> tuple[str | None, str, list]:
    """(prefix, mnemonic, operands) of a capstone instruction in `Expected`'s vocabulary;
    immediates carry their width: ('imm', value, bytes)."""
    words = insn.mnemonic.split()
    prefix = _PREFIX_WORDS.get(words[0]) if len(words) > 1 else None
    mnemonic = canonical_mnemonic(words[-1])
    ops = []
    for op in insn.operands:
        if op.type == csx86.X86_OP_REG:
            ops.append(("reg", insn.reg_name(op.reg).replace("(", "").replace(")", "")))
        elif op.type == csx86.X86_OP_IMM:
            ops.append(("imm", op.imm, op.size))
        else:
            mem = op.mem
            if mem.segment:
                ops.append(("segment", insn.reg_name(mem.segment)))
            if mem.base == csx86.X86_REG_RIP:
                ops.append(("rip", op.size, insn.address + insn.size + mem.disp))
                continue
            regs: dict[str, int] = {}
            for reg, coef in ((mem.base, 1), (mem.index, mem.scale)):
                if reg:
                    name = insn.reg_name(reg)
                    regs[name] = regs.get(name, 0) + coef
            ops.append(("mem", op.size, regs, mem.disp))
    return prefix, mnemonic, ops


def _pseudo(mnemonic: str, ops: list) -> tuple[str, list]:
    """cmpltps a, b -> cmpps a, b, 1 (both sides are written in the explicit form)."""
    split = split_pseudo_cmp(mnemonic)
    return (split[0], ops + [("imm", split[1], 1)]) if split else (mnemonic, ops)


def _same_operand(want: tuple, got: tuple) -> str | None:
    """None if `got` (capstone) is what `want` (source) asked for, else what differs."""
    kind = want[0]
    if kind == "target":
        if got[0] == "imm" and got[1] == want[1]:
            return None
        return f"target {want[1]:#x}, got {_show(got)}"
    if kind == "imm":
        if got[0] != "imm":
            return f"immediate {want[1]}, got {_show(got)}"
        bits = 8 * got[2]
        value = want[1]
        if -(1 << (bits - 1)) <= value < (1 << bits) and (value - got[1]) % (1 << bits) == 0:
            return None
        return f"immediate {value} ({value:#x}), got {got[1]} ({got[2]} bytes)"
    if kind != got[0]:
        return f"{_show(want)}, got {_show(got)}"
    if kind == "reg":
        return None if want[1] == got[1] else f"register {want[1]}, got {got[1]}"
    size = want[1]
    if size is not None and size != got[1]:
        return f"memory size {size}, got {got[1]}"
    if kind == "rip":
        return None if want[2] == got[2] else f"address {want[2]:#x}, got {got[2]:#x}"
    if want[2] != got[2]:
        return f"address registers {_regs(want[2])}, got {_regs(got[2])}"
    if want[3] != got[3]:
        return f"displacement {want[3]:#x}, got {got[3]:#x}"
    return None


def _regs(regs: dict[str, int]) -> str:
    return " + ".join(r if c == 1 else f"{r}*{c}" for r, c in regs.items()) or "none"


def _show(op: tuple) -> str:
    kind = op[0]
    if kind == "reg":
        return op[1]
    if kind in ("imm", "target"):
        return f"{kind} {op[1]:#x}"
    if kind == "rip":
        return f"[{op[2]:#x}] (RIP-relative)"
    if kind == "mem":
        return f"[{_regs(op[2])} {op[3]:+#x}]"
    return str(op)


def compare(expected: Expected, insn) -> str | None:
    """None if the capstone instruction `insn` is what `expected` asked for, else the
    first difference in words."""
    prefix, mnemonic, got = read_back(insn)
    want_mn, want = _pseudo(canonical_mnemonic(expected.mnemonic), list(expected.operands))
    mnemonic, got = _pseudo(mnemonic, got)
    if want_mn == "int3":
        want_mn, want = "int", [("imm", 3)]
    if mnemonic == "int3":
        mnemonic, got = "int", [("imm", 3, 1)]
    if want_mn == "imul" and len(want) == 2 and want[1][0] == "imm":
        want = [want[0], want[0], want[1]]
    if prefix != expected.prefix:
        return f"prefix {expected.prefix}, got {prefix}"
    if mnemonic != want_mn:
        return f"mnemonic {want_mn}, got {mnemonic}"
    if not want and mnemonic in STRING_OPS:
        return None
    if mnemonic.startswith("f") and len(want) != len(got) \
            and all(op[0] == "reg" and op[1].startswith("st") for op in want + got):
        implied = not want
        want = [op for op in want if op != ("reg", "st0")]
        got = [op for op in got if op != ("reg", "st0")]
        if implied and got in ([], [("reg", "st1")]):
            return None
    if mnemonic in _COMMUTATIVE and len(want) == len(got) == 2 and \
            all(_same_operand(w, g) for w, g in zip(want, got)):
        got = got[::-1]
    if len(want) != len(got):
        return f"{len(want)} operands, got {len(got)}"
    for n, (w, g) in enumerate(zip(want, got), 1):
        if (why := _same_operand(w, g)):
            return f"operand {n}: expected {why}"
    return None


def verify(placed: list[Placed]) -> int:
    """Check every placed instruction (see module docstring); returns how many were checked."""
    md = _disassembler()
    count = 0
    for p in placed:
        if p.expected is None:
            continue
        code = p.data[:len(p.data) - p.pad]
        insns = list(md.disasm(code, p.address))
        stmt: Instr = p.stmt
        shown = "; ".join(f"{i.mnemonic} {i.op_str}".strip() for i in insns) or "nothing"
        expected = p.expected
        if expected.mnemonic in WAIT_FORMS and insns and insns[0].mnemonic == "wait":
            expected = Expected(expected.prefix, WAIT_FORMS[expected.mnemonic],
                                expected.operands, expected.keystone)
            insns = insns[1:]
        if len(insns) != 1 or insns[0].address + insns[0].size != p.address + len(code):
            why = f"expected one instruction of {len(code)} bytes"
        elif p.data[len(code):] != b"\x90" * p.pad:
            why = "padding is not nop bytes"
        else:
            why = compare(expected, insns[0])
        if why:
            raise BuildError(f"keystone encoded '{stmt.text}' as '{shown}' ({p.data.hex()}): "
                             f"{why}", stmt.where)
        count += 1
    return count
