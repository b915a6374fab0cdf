"""Statements -> machine code and data at final addresses (keystone does the encoding).

Contract: `assemble(program, layout=linker.layout) -> Image`. Every instruction is turned into
keystone's Intel syntax with every symbol resolved to a number written in 0x form (keystone's
number-base trap), size operators as `dword ptr`, `[label]` as `[rip + 0x...]` with the
displacement computed here, and branch targets as absolute addresses (keystone encodes them
relative to the instruction's address). Each instruction also records what the source asked
for (`Expected`), which `verify` compares with capstone's reading of the bytes.

Layout is iterated: each pass encodes everything at the previous pass's addresses and lays
the results out again (segment addresses from `layout(text_size, data_size, bss_size)`),
until no address changes. Errors found in a pass that is not final may be artefacts of
provisional addresses, so the first error of the final (stable) pass is the one raised.
A layout can oscillate (an `add eax, a - b` whose own length decides whether a - b fits a
byte); after GROW_ONLY_AFTER passes an instruction that comes out shorter than before keeps
its old size, the difference padded with nop bytes after it (`Placed.pad`), so the layout
settles.

Checks made before keystone sees an instruction (it silently truncates or aborts on these):
immediates and displacements in range for their operand, address registers 64-bit with a
valid scale, no ah/bh/ch/dh beside a register that needs REX, an explicit size where fasm
needs one. Memory sizes fasm infers but keystone needs spelled out (data labels, VEX scalar
operands, fasm's defaults) are written as `... ptr`. Statements in the writeable segment
after its last initialised byte are .bss.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import linker

from .errors import BuildError, Where
from .expr import Linear, evaluate, symbols_in
from .fasm import (Align, Const, Data, Imm, Instr, Label, Mem, Program, Reg, Reserve, Segment,
                   Statement)
from .kstone import Keystone, KeystoneCrash
from .x86 import BRANCHES, KEYSTONE_NAMES, KEYSTONE_SIZES, REGISTERS, canonical_mnemonic

MAX_PASSES = 50
GROW_ONLY_AFTER = 8           # passes after which an instruction never shrinks (see below)
MAX_DATA = 1 << 24            # bytes one data statement may produce
FILL = 0x90                   # what `align` puts in the file (fasm fills with nop)

# Memory operands without a register operand that need no size operator (fasm agrees).
IMPLIED_SIZE = {"lea", "prefetcht0", "prefetcht1", "prefetcht2", "prefetchnta",
                "prefetchw", "clflush", "clflushopt", "fldcw", "fnstcw", "fstcw", "fnstsw",
                "fstsw", "ldmxcsr", "stmxcsr", "vldmxcsr", "vstmxcsr", "fxsave", "fxrstor",
                "fxsave64", "fxrstor64", "xsave", "xrstor", "fldenv", "fnstenv", "fstenv",
                "frstor", "fnsave", "fsave", "invlpg", "cmpxchg8b", "cmpxchg16b", "fbld",
                "fbstp"} | {"set" + cc for cc in ("o", "no", "b", "c", "nae", "ae", "nb", "nc",
                                                  "e", "z", "ne", "nz", "be", "na", "a",
                                                  "nbe", "s", "ns", "p", "pe", "np", "po",
                                                  "l", "nge", "ge", "nl", "le", "ng", "g",
                                                  "nle")}
# ... and instructions whose register operand does not fix the memory operand's size.
NEEDS_SIZE = {"movzx", "movsx", "shl", "shr", "sal", "sar", "rol", "ror", "rcl",
              "rcr", "vcvtsi2ss", "vcvtsi2sd", "crc32"}
DEFAULT_SIZE = {"cvtsi2ss": 4, "cvtsi2sd": 4, "movsxd": 4}     # fasm's defaults
# String instructions keystone only knows with explicit operands (movsd/cmpsd are SSE to it).
KEYSTONE_STRINGS = {"movsd": "movs dword ptr [rdi], dword ptr [rsi]",
                    "cmpsd": "cmps dword ptr [rsi], dword ptr [rdi]"}
SHORT_BRANCHES = {"jcxz", "jecxz", "jrcxz", "loop", "loope", "loopne", "loopz", "loopnz"}
IMM8 = {"shl", "shr", "sal", "sar", "rol", "ror", "rcl", "rcr", "bt", "bts", "btr", "btc",
        "int", "shld", "shrd"}


@dataclass
class Expected:
    """What the source line asked for, operands resolved: ('reg', name), ('imm', value),
    ('target', address), ('mem', size|None, {reg: coef}, disp), ('rip', size|None, target)."""
    prefix: str | None
    mnemonic: str
    operands: list
    keystone: str             # the text keystone was given
    note: str = ""            # where an operand size came from, for error messages


@dataclass
class Placed:
    """A statement at its final address; `data` None means reserved (zero) memory."""
    stmt: Statement
    segment: str
    address: int
    size: int
    data: bytes | None = None
    expected: Expected | None = None
    pad: int = 0              # nop bytes after the instruction (see module docstring)


@dataclass
class Image:
    """The assembled program, ready for the linker."""
    layout: "linker.Layout"
    text: bytes
    data: bytes
    bss_size: int
    entry: int
    placed: list[Placed]
    program: Program
    symbols: dict[str, int] = field(default_factory=dict)   # labels and constants


class SymbolEnv:
    """Symbol values: labels (and constants' positions) at the addresses in `addrs`,
    constants evaluated on demand at their own position (for `$`). The assembler makes one
    per pass from the previous pass's addresses."""

    def __init__(self, program: Program, addrs: dict[str, int]):
        self.program = program
        self.addrs = addrs
        self.memo: dict[str, int] = {}
        self.active: list[str] = []
        self.cur = 0
        self.where: Where | None = None

    def at(self, where: Where, address: int) -> "SymbolEnv":
        self.where, self.cur = where, address
        return self

    def here(self) -> int:
        return self.cur

    def value(self, name: str) -> int:
        if name in self.program.labels:
            return self.addrs[name]
        const = self.program.consts.get(name)
        if const is None:
            raise BuildError(f"undefined symbol '{name}'", self.where)
        if name not in self.memo:
            if name in self.active:
                raise BuildError(f"circular definition of '{name}'", const.where)
            saved = (self.where, self.cur)
            self.active.append(name)
            self.at(const.where, self.addrs[name])
            self.memo[name] = evaluate(const.expr, self, const.where).number(const.where)
            self.active.pop()
            self.where, self.cur = saved
        return self.memo[name]

    def number(self, node, where: Where, address: int) -> int:
        return evaluate(node, self.at(where, address), where).number(where)


def hexnum(value: int) -> str:
    return f"-0x{-value:x}" if value < 0 else f"0x{value:x}"


def check_range(value: int, lo: int, hi: int, what: str, where: Where) -> None:
    if not lo <= value <= hi:
        raise BuildError(f"{what} {value} (0x{value & (2**64 - 1):x}) out of range "
                         f"[{lo}, {hi}]", where)


def split_address(regs: dict[str, int], where: Where) -> tuple[str | None, str | None, int]:
    """(base, index, scale) for `sum(coef * reg)`; fasm's rules, e.g. rax*3 = rax+rax*2."""
    for name in regs:
        if REGISTERS[name].kind != "gpr" or REGISTERS[name].size != 8:
            raise BuildError(f"'{name}' cannot address memory (use a 64-bit register)", where)
    terms = sorted(regs.items(), key=lambda t: (t[1] != 1, t[0] != "rsp"))
    bad = BuildError("invalid address (base + index*1/2/4/8 + displacement)", where)
    if len(terms) == 1:
        reg, coef = terms[0]
        if coef == 1:
            return reg, None, 1
        if reg != "rsp" and coef in (2, 3, 5, 9):      # rax*2 = rax+rax: no disp32 needed
            return reg, reg, coef - 1
        if reg != "rsp" and coef in (4, 8):
            return None, reg, coef
        raise bad
    if len(terms) == 2:
        (base, one), (index, scale) = terms
        if one == 1 and scale == 1 and base in ("rbp", "r13") and index not in ("rbp", "r13"):
            base, index = index, base                   # rbp/r13 as base cost a disp8
        if one == 1 and scale in (1, 2, 4, 8) and index != "rsp":
            return base, index, scale
    raise bad


def imm_range(mnemonic: str, first: Reg | Mem | None, size: int | None,
              vector: bool, position: int) -> tuple[int, int] | None:
    """Allowed values for an immediate operand, None if keystone/capstone must judge."""
    if mnemonic in ("ret", "retn", "retf") or (mnemonic == "enter" and position == 0):
        return 0, 0xFFFF
    if mnemonic == "enter":
        return 0, 0xFF
    if mnemonic in IMM8 or vector:
        return -0x80, 0xFF
    if mnemonic == "push":
        return -2**31, 2**31 - 1
    if size is None:
        return None
    if size == 8:
        if mnemonic in ("mov", "movabs") and isinstance(first, Reg):
            return -2**63, 2**64 - 1
        return -2**31, 2**31 - 1
    return -(1 << (8 * size - 1)), (1 << (8 * size)) - 1


def vex_scalar_size(mnemonic: str) -> int | None:
    """Memory size of a VEX scalar instruction (vaddss: 4, vfmadd231sd: 8, vcvtsd2ss: 8):
    keystone wants it spelled out, fasm infers it."""
    source = mnemonic.split("2")[0] if mnemonic.startswith("vcvt") else mnemonic
    if mnemonic.startswith("v") and source[-2:] in ("ss", "sd"):
        return 4 if source.endswith("ss") else 8
    return None


def plan(instr: Instr, env: SymbolEnv, address: int, length: int,
         label_sizes: dict[str, int]) -> Expected:
    """The keystone text and expectations of one instruction assembled at `address`, taking
    its length to be `length` (for RIP-relative displacements)."""
    where = instr.where
    mn = instr.mnemonic
    regs = [REGISTERS[op.name] for op in instr.operands if isinstance(op, Reg)]
    mem_regs: list = []
    vector = any(r.kind in ("xmm", "ymm", "zmm", "mm") for r in regs)
    evex = any(r.kind == "zmm" for r in regs)
    first = instr.operands[0] if instr.operands and not isinstance(instr.operands[0], Imm) \
        else None
    op_size = None
    for op in instr.operands:
        if isinstance(op, Reg) and REGISTERS[op.name].kind == "gpr":
            op_size = REGISTERS[op.name].size
            break
        if isinstance(op, Mem):
            op_size = op.size or next((label_sizes[s] for s in symbols_in(op.expr)
                                       if s in label_sizes), None)
            break
    texts, expected, note = [], [], ""
    for position, op in enumerate(instr.operands):
        if isinstance(op, Reg):
            reg = REGISTERS[op.name]
            texts.append(f"st({reg.name[2]})" if reg.kind == "st" else reg.name)
            expected.append(("reg", reg.name))
        elif isinstance(op, Imm):
            value = env.number(op.expr, where, address)
            if mn in BRANCHES:
                check_range(value, 0, 2**64 - 1, "branch target", where)
                if (mn in SHORT_BRANCHES or op.short) \
                        and not -128 <= value - address - max(length, 2) < 128:
                    raise BuildError("relative jump out of range (short jumps, jrcxz and "
                                     "loop reach -128..127 bytes)", where)
                expected.append(("target", value))
            else:
                if op.short:
                    raise BuildError("'short' applies to jump targets only", where)
                check_range(value, -2**63, 2**64 - 1, "immediate", where)
                limits = imm_range(mn, first, op_size, vector, position)
                if limits:
                    check_range(value, *limits, "immediate", where)
                expected.append(("imm", value))
            texts.append(hexnum(value))
        else:
            sized = next((s for s in symbols_in(op.expr) if s in label_sizes), None)
            size = op.size
            if size is None and sized:
                size = label_sizes[sized]
                note = (f"'{sized}' is a {size}-byte data label; use `{sized}:` on its own "
                        "line or a size operator")
            if mn == "lea":                            # an address, not an access
                size = None
            size = size or DEFAULT_SIZE.get(mn) or vex_scalar_size(mn)
            if size is None and mn not in IMPLIED_SIZE and (not regs or mn in NEEDS_SIZE):
                raise BuildError("operand size not specified", where)
            if size is not None and size not in KEYSTONE_SIZES:
                raise BuildError(f"no {size}-byte memory operands in the subset", where)
            ptr = f"{KEYSTONE_SIZES[size]} ptr " if size else ""
            lin: Linear = evaluate(op.expr, env.at(where, address), where)
            if evex and (lin.disp or not lin.regs):
                raise BuildError("an AVX-512 (zmm) instruction's address must have no "
                                 "displacement: keystone mis-encodes EVEX displacements "
                                 "(write [reg] or [reg+reg*s])", where)
            if not lin.regs:
                target = lin.disp
                check_range(target, 0, 2**64 - 1, "address", where)
                disp = target - (address + length)
                check_range(disp, -2**31, 2**31 - 1, "RIP-relative displacement", where)
                texts.append(f"{ptr}[rip + {hexnum(disp)}]")
                expected.append(("rip", size, target))
            else:
                base, index, scale = split_address(lin.regs, where)
                check_range(lin.disp, -2**31, 2**31 - 1, "displacement", where)
                mem_regs += [REGISTERS[r] for r in lin.regs]
                parts = ([base] if base else []) + ([f"{index}*0x{scale:x}"] if index else [])
                texts.append(f"{ptr}[{' + '.join(parts)} + {hexnum(lin.disp)}]")
                expected.append(("mem", size, dict(lin.regs), lin.disp))
    if any(r.high for r in regs) and (any(r.rex or (r.kind == "gpr" and r.size == 8)
                                          for r in regs) or any(r.rex for r in mem_regs)):
        raise BuildError("ah/bh/ch/dh cannot be used with a register that needs a REX prefix",
                         where)
    if not texts and mn in KEYSTONE_STRINGS:
        body = KEYSTONE_STRINGS[mn]
    else:
        body = " ".join(filter(None, (KEYSTONE_NAMES.get(mn, mn), ", ".join(texts))))
    text = " ".join(filter(None, (instr.prefix, body)))
    return Expected(instr.prefix, canonical_mnemonic(mn), expected, text, note)


_FLOAT_FORMATS = {2: ("<e", "<H", 10, 0x1F), 4: ("<f", "<I", 23, 0xFF)}


def float_bytes(text: str, unit: int, where: Where) -> bytes:
    """A decimal float literal as IEEE-754 binary16/32/64 (dw/dd/dq), correctly rounded
    (ties to even), as fasm does."""
    exact = Fraction(text)
    if exact == 0:
        return struct.pack({2: "<e", 4: "<f", 8: "<d"}[unit],
                           -0.0 if text.startswith("-") else 0.0)
    try:
        if unit == 8:
            return struct.pack("<d", float(exact))
        fmt, raw, mantissa, exp_mask = _FLOAT_FORMATS[unit]
        bits = struct.unpack(raw, struct.pack(fmt, float(exact)))[0]
    except OverflowError:
        raise BuildError(f"float literal {text} out of range", where) from None
    # float(exact) rounds once to double, packing rounds again: pick the nearest of the
    # neighbours (same sign, finite) by exact arithmetic.
    sign = 1 << (8 * unit - 1)
    candidates = [b for b in (bits - 1, bits, bits + 1) if 0 <= b < 2 * sign
                  and (b >> mantissa) & exp_mask != exp_mask and (b & sign) == (bits & sign)]

    def error(b: int) -> tuple:
        value = struct.unpack(fmt, struct.pack(raw, b))[0]
        return abs(Fraction(value) - exact), b & 1
    return struct.pack(raw, min(candidates, key=error))


def data_bytes(stmt: Data, env: SymbolEnv, address: int) -> bytes:
    """The bytes of a db/dw/dd/dq statement."""
    unit, where = stmt.unit, stmt.where
    bits = 8 * unit
    out = bytearray()

    def emit(values: list) -> None:
        for value in values:
            kind = value[0]
            if kind == "bytes":
                out.extend(value[1])
            elif kind == "float":
                out.extend(float_bytes(value[1], unit, where))
            elif kind == "dup":
                count = env.number(value[1], where, address + len(out))
                check_range(count, 0, MAX_DATA, "dup count", where)
                for _ in range(count):
                    emit(value[2])
                    if len(out) > MAX_DATA:
                        raise BuildError(f"data statement larger than {MAX_DATA} bytes", where)
            else:
                number = env.number(value[1], where, address + len(out))
                check_range(number, -(1 << (bits - 1)), (1 << bits) - 1, "value", where)
                out.extend((number & ((1 << bits) - 1)).to_bytes(unit, "little"))
    emit(stmt.values)
    return bytes(out)


def assemble(program: Program, layout: Callable = linker.layout) -> Image:
    """Assemble `program` (see module docstring)."""
    stmts = program.statements
    label_sizes = {name: lab.size for name, lab in program.labels.items() if lab.size}
    addrs = [0] * len(stmts)
    lengths = [0] * len(stmts)        # statement sizes (instructions with their padding)
    code_lens = [0] * len(stmts)      # instruction lengths, for RIP-relative displacements
    sizes = (0, 0, 0)
    with Keystone() as ks:
        for npass in range(MAX_PASSES):
            try:
                lay = layout(*sizes)
            except ValueError as exc:       # e.g. data in a program laid out without any
                raise BuildError(f"layout: {exc}") from None
            symbols = {s.name: addrs[i] for i, s in enumerate(stmts)
                       if isinstance(s, (Label, Const))}
            env = SymbolEnv(program, symbols)
            errors: dict[int, BuildError] = {}
            plans: dict[int, Expected] = {}
            for i, s in enumerate(stmts):
                if isinstance(s, Instr):
                    try:
                        plans[i] = plan(s, env, addrs[i], code_lens[i], label_sizes)
                    except BuildError as exc:
                        errors[i] = exc
            order = list(plans)
            try:
                codes = ks.assemble([(plans[i].keystone, addrs[i]) for i in order])
            except KeystoneCrash as exc:
                i = order[exc.index]
                raise BuildError(f"{exc} (on '{plans[i].keystone}')", stmts[i].where) from None
            code = dict(zip(order, codes))
            placed, new_addrs, new_lengths, new_code_lens, sizes_now = _place(
                stmts, plans, code, errors, env, lay, lengths, npass >= GROW_ONLY_AFTER)
            stable = (new_addrs, new_lengths, new_code_lens, sizes_now) == \
                (addrs, lengths, code_lens, sizes)
            addrs, lengths, code_lens, sizes = new_addrs, new_lengths, new_code_lens, sizes_now
            if stable:
                break
        else:
            if not errors:
                raise BuildError(f"layout did not settle after {MAX_PASSES} passes")
    if errors:
        raise errors[min(errors)]
    text = b"".join(p.data if p.data is not None else bytes(p.size)
                    for p in placed if p.segment == "text")
    data_items = [p for p in placed if p.segment == "data"]
    data = b"".join(p.data if p.data is not None else bytes(p.size)
                    for p in data_items)[:sizes[1]]
    if program.entry is None or program.entry[0] not in program.labels:
        name, where = program.entry or ("", None)
        raise BuildError(f"entry label '{name}' is not defined", where)
    entry = symbols[program.entry[0]]
    if not lay.text_addr <= entry < lay.text_end:
        raise BuildError(f"entry '{program.entry[0]}' is not in the executable segment",
                         program.entry[1])
    env.memo.clear()
    values = {name: env.value(name) for name in list(program.labels) + list(program.consts)}
    return Image(lay, text, data, sizes[2], entry, placed, program, values)


def _place(stmts, plans, code, errors, env, lay, lengths, grow_only):
    """One sequential walk: sizes and bytes of every statement at this pass's addresses."""
    placed: list[Placed] = []
    addrs = [0] * len(stmts)
    new_lengths = list(lengths)
    code_lens = [0] * len(stmts)
    cursor = {"text": lay.text_addr, "data": lay.data_addr}
    segment = None
    last_init = None          # end address of the last initialised byte in the data segment
    for i, s in enumerate(stmts):
        if isinstance(s, Segment):
            segment = s.kind
            continue
        if segment is None:           # a constant before the first segment
            continue
        addr = cursor[segment]
        addrs[i] = addr
        size, data, expected, pad = 0, None, None, 0
        try:
            if isinstance(s, Instr) and i in plans:
                result = code[i]
                if isinstance(result, str):
                    note = f" ({plans[i].note})" if plans[i].note else ""
                    raise BuildError(f"keystone rejected '{plans[i].keystone}': {result}{note}",
                                     s.where)
                code_lens[i] = len(result)
                if grow_only and len(result) < lengths[i]:
                    pad = lengths[i] - len(result)
                data, expected = result + bytes([FILL]) * pad, plans[i]
                size = new_lengths[i] = len(data)
            elif isinstance(s, Instr):
                size = lengths[i]
            elif isinstance(s, Data):
                data = data_bytes(s, env, addr)
                size = len(data)
            elif isinstance(s, Reserve):
                count = env.number(s.count, s.where, addr)
                check_range(count, 0, 1 << 32, "reserve count", s.where)
                size = count * s.unit
            elif isinstance(s, Align):
                boundary = env.number(s.boundary, s.where, addr)
                if boundary <= 0 or boundary & (boundary - 1) or boundary > 4096:
                    raise BuildError(f"align {boundary}: not a power of two <= 4096", s.where)
                size = -addr % boundary
                data = bytes([FILL]) * size
        except BuildError as exc:
            errors.setdefault(i, exc)
        cursor[segment] = addr + size
        if segment == "data" and isinstance(s, (Data, Instr)) and size:
            last_init = addr + size
        placed.append(Placed(s, segment, addr, size, data, expected, pad))
    text_size = cursor["text"] - lay.text_addr
    data_end = cursor["data"]
    init_end = last_init if last_init is not None else lay.data_addr
    sizes = (text_size, init_end - lay.data_addr, data_end - init_end)
    return placed, addrs, new_lengths, code_lens, sizes
