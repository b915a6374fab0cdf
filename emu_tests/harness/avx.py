"""An executable model of VEX and EVEX instructions (and CPUID, XGETBV), for emulators that
cannot run them: decode with capstone, compute in numpy on a shadow register file, write back.

Contract:
- `is_site(insn)`: the instruction is one this module executes in place of the emulator
  (VEX, EVEX, cpuid, xgetbv); `plan(insn) -> Plan` decodes one for `VectorModel.execute`, or
  raises `Unsupported` naming what the model lacks (a mnemonic without an entry in
  avx_table.SEMANTICS, embedded rounding, a segment override, 32-bit addressing ...).
- `VectorModel(cpu, port)` holds the register state of one emulated call: zmm0-31 (64 bytes
  each) and k0-k7. At the start zmm0-15 are zero above bit 127 (as after the caller's
  vzeroupper), zmm16-31 and the opmasks hold junk. Bits 0-127 of zmm0-15 are the emulator's
  xmm0-15: read from the `port` before an instruction uses them, written back after it
  changes them, so legacy SSE code and modelled code share them both ways.
- `execute(plan)` runs one instruction: InvalidOpcode if `cpu` lacks a feature it needs (the
  #UD a real CPU raises), CpuFault for a #GP (a misaligned aligned move) or for MXCSR control
  bits other than the default under a float instruction (the model rounds to nearest even
  only, no DAZ/FTZ; it does not set MXCSR's sticky exception flags). Memory goes through
  `port.read` / `port.write` only, whose bounds checks are the emulator's: a masked EVEX
  access touches only its active elements (each run of consecutive active elements is one
  access), a {1toN} broadcast reads one element; unmasked, the whole operand is one access.
  A write to an xmm/ymm/zmm register zeroes its bits above the destination (VEX, EVEX); a
  write mask merges or zeroes per element; a 32-bit general register is zero-extended.
- `port` is the emulator's side (`Port`): general registers by capstone name, xmm i as 16
  bytes, MXCSR, checked memory.
- `dirty_uppers()`: the registers among zmm0-15 with bits above 127 set (a routine must
  vzeroupper before returning to SSE code).
- `features(insns)`: the /proc/cpuinfo flags the instructions need beyond SSE3: the model's
  for those it plans (capstone's groups miss some EVEX forms), capstone's for the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from capstone import x86_const as X

from .avx_table import SEMANTICS, Sem, Unsupported
from .call import JUNK_LANE
from .code import LEGACY_PREFIXES, cpu_features, vex_kind
from .cpus import MXCSR_DEFAULT, Cpu

MXCSR_CONTROL = 0xFFC0
JUNK_MASK = 0x5A5A_5A5A_DEAD_BEEF
SYSTEM = frozenset({"cpuid", "xgetbv"})
GPR32 = {"eax": "rax", "ebx": "rbx", "ecx": "rcx", "edx": "rdx", "esi": "rsi", "edi": "rdi",
         "ebp": "rbp", "esp": "rsp", **{f"r{i}d": f"r{i}" for i in range(8, 16)}}
GPR64 = frozenset({*GPR32.values()})

__all__ = ["CpuFault", "InvalidOpcode", "Plan", "Port", "Unsupported", "VectorModel",
           "features", "is_site", "plan"]


class InvalidOpcode(Exception):
    """#UD: the emulated CPU does not have the instruction."""


class CpuFault(Exception):
    """A fault a real CPU raises (#GP), or a CPU state the model does not compute with."""


class Port(Protocol):
    def gpr(self, name: str) -> int: ...
    def set_gpr(self, name: str, value: int) -> None: ...
    def xmm(self, i: int) -> bytes: ...
    def set_xmm(self, i: int, value: bytes) -> None: ...
    def mxcsr(self) -> int: ...
    def read(self, address: int, size: int) -> bytes: ...
    def write(self, address: int, data: bytes) -> None: ...


@dataclass(frozen=True)
class Operand:
    kind: str                   # "vec", "k", "gpr", "mem", "imm"
    size: int                   # bytes (a broadcast memory operand: one element)
    reg: int | str = 0          # vec/k: index; gpr: capstone name
    base: str | None = None     # mem: register names ("rip": the next instruction)
    index: str | None = None
    scale: int = 1
    disp: int = 0
    imm: int = 0


@dataclass(frozen=True)
class Plan:
    address: int
    size: int
    text: str                   # "vaddps ymm0, ymm1, ymm2"
    sem: Sem
    features: frozenset[str]
    dest: Operand | None
    sources: tuple[Operand, ...]
    mask: int = 0               # EVEX opmask register (0: none)
    zeroing: bool = False
    broadcast: bool = False
    vl: int = 0                 # vector length in bytes


def is_site(insn) -> bool:
    return vex_kind(insn) is not None or insn.mnemonic in SYSTEM


def features(insns) -> set[str]:
    need = set()
    for insn in insns:
        try:
            need |= plan(insn).features if is_site(insn) else cpu_features([insn])
        except Unsupported:
            need |= cpu_features([insn])
    return need


def _operand(insn, op) -> Operand:
    if op.type == X.X86_OP_IMM:
        return Operand("imm", op.size, imm=op.imm & ((1 << (8 * op.size)) - 1))
    if op.type == X.X86_OP_MEM:
        m = op.mem
        if m.segment != X.X86_REG_INVALID:
            raise Unsupported("a segment override")
        base = insn.reg_name(m.base) if m.base else None
        index = insn.reg_name(m.index) if m.index else None
        if (base and base not in GPR64 | {"rip"}) or (index and index not in GPR64):
            raise Unsupported("an address that is not 64-bit registers (a VSIB gather, 32-bit "
                              "addressing)")
        return Operand("mem", op.size, base=base, index=index, scale=m.scale, disp=m.disp)
    name = insn.reg_name(op.reg)
    if name[:3] in ("xmm", "ymm", "zmm"):
        return Operand("vec", op.size, reg=int(name[3:]))
    if name[0] == "k" and name[1:].isdigit():      # 64 bits (capstone says 2 bytes for all)
        return Operand("k", 8, reg=int(name[1:]))
    if name in GPR32 or name in GPR64:
        return Operand("gpr", op.size, reg=name)
    raise Unsupported(f"register operand {name}")


def _prefix(raw: bytes) -> tuple[int, bytes]:
    """(offset of the VEX/EVEX byte, its payload bytes) after any legacy prefixes."""
    i = 0
    while raw[i] in LEGACY_PREFIXES:
        i += 1
    return i, raw[i:i + 4]


def _features(sem: Sem, kind: str | None, mnemonic: str, vl: int, reg_source: bool) -> set[str]:
    if kind == "EVEX":
        if sem.evex is None:
            raise Unsupported(f"the EVEX form of {mnemonic}")
        return {sem.evex} | ({"avx512vl"} if vl < 64 and not sem.scalar else set())
    if kind == "VEX":
        need = sem.vex_reg_source if reg_source and sem.vex_reg_source else sem.vex
        if need is None:
            raise Unsupported(f"the VEX form of {mnemonic}")
        return {need[vl == 32] if isinstance(need, tuple) else need}
    if sem.legacy is None:
        raise Unsupported(f"the legacy form of {mnemonic}")
    return {sem.legacy} - {""}


def plan(insn) -> Plan:
    """Decode `insn` for the model (raises Unsupported, naming the instruction)."""
    text = f"{insn.mnemonic} {insn.op_str}".rstrip()
    try:
        return _plan(insn, text)
    except Unsupported as e:
        raise Unsupported(f"{text}: the model has no {e}") from None


def _plan(insn, text: str) -> Plan:
    sem = SEMANTICS.get(insn.mnemonic)
    if sem is None:
        raise Unsupported("semantics for this mnemonic")
    kind = vex_kind(insn)
    ops = [_operand(insn, op) for op in insn.operands]
    raw = bytes(insn.bytes)
    at, p = _prefix(raw)
    if at and kind:
        raise Unsupported(f"prefix {raw[0]:#04x} before {kind}")
    mask, zeroing, bcast = 0, False, False
    if kind == "EVEX":
        p2 = p[3]
        mask, zeroing, b, ll = p2 & 7, bool(p2 & 0x80), bool(p2 & 0x10), (p2 >> 5) & 3
        vl = 16 << ll
        if ll == 3:
            raise Unsupported("EVEX.L'L = 3")
        if b and not any(o.kind == "mem" for o in ops):
            raise Unsupported("embedded rounding or SAE")
        bcast = b
        if mask:
            if len(ops) < 2 or ops[1] != Operand("k", ops[1].size, reg=mask):
                raise Unsupported(f"a decoding of the write mask k{mask}")
            del ops[1]
            if sem.scalar:
                raise Unsupported("masked scalar forms")
        elif zeroing:
            raise Unsupported("zeroing without a mask")
    elif kind == "VEX":
        vl = 32 if (p[1] if p[0] == 0xC5 else p[2]) & 4 else 16
    else:
        vl = 0
    if sem.state:
        dest, sources = None, ()
    else:
        if not ops or ops[0].kind == "imm":
            raise Unsupported("destination operand")
        dest, sources = ops[0], tuple(ops[0 if sem.reads_dest else 1:])
        if dest.kind == "mem" and zeroing:
            raise Unsupported("zeroing into memory")
        if dest.size % np.dtype(sem.dst).itemsize:
            raise Unsupported(f"a {dest.size}-byte destination of {np.dtype(sem.dst)} elements")
    reg_source = len(sources) > 0 and sources[-1].kind != "mem"
    features = frozenset(_features(sem, kind, insn.mnemonic, vl, reg_source))
    return Plan(insn.address, insn.size, text, sem, features, dest, sources, mask, zeroing,
                bcast, vl)


class VectorModel:
    """The shadow register file of one call, and the executor."""

    def __init__(self, cpu: Cpu, port: Port):
        self.cpu, self.port = cpu, port
        self.z = np.zeros((32, 64), np.uint8)
        self.z[16:] = np.frombuffer(JUNK_LANE.to_bytes(4, "little") * 16, np.uint8)
        self.k = [JUNK_MASK] * 8

    # --- registers ------------------------------------------------------------------------
    def vec(self, i: int, size: int) -> np.ndarray:
        if i < 16:
            self.z[i, :16] = np.frombuffer(self.port.xmm(i), np.uint8)
        return self.z[i, :size].copy()

    def set_vec(self, i: int, data: np.ndarray) -> None:
        self.z[i] = 0
        self.z[i, :data.size] = data
        if i < 16:
            self.port.set_xmm(i, self.z[i, :16].tobytes())

    def zero_vectors(self, upper_only: bool) -> None:
        """vzeroupper / vzeroall: zmm0-15 above bit 127, or whole (zmm16-31 are kept)."""
        self.z[:16, 16:] = 0
        if not upper_only:
            self.z[:16, :16] = 0
            for i in range(16):
                self.port.set_xmm(i, bytes(16))

    def dirty_uppers(self) -> list[int]:
        return [i for i in range(16) if self.z[i, 16:].any()]

    # --- execution ------------------------------------------------------------------------
    def execute(self, p: Plan) -> None:
        sem = p.sem
        if not self.cpu.has(p.features):
            missing = ", ".join(sorted(p.features - self.cpu.flags))
            raise InvalidOpcode(f"the emulated CPU, {self.cpu.name}, lacks {missing}")
        if sem.float and self.port.mxcsr() & MXCSR_CONTROL != MXCSR_DEFAULT:
            raise CpuFault(f"MXCSR is {self.port.mxcsr():#x}: the model computes with the "
                           f"default {MXCSR_DEFAULT:#x} only")
        if sem.state:
            sem.fn(self)
            return
        n = p.dest.size // np.dtype(sem.dst).itemsize
        active = self._active(p, n)
        values = [self._source(p, op, n, active) for op in p.sources]
        result = np.asarray(sem.fn(n, *values))
        if result.shape != (n,) or result.dtype.itemsize != np.dtype(sem.dst).itemsize:
            raise AssertionError(f"{p.text}: semantics gave {result.shape} {result.dtype}, "
                                 f"expected {n} x {np.dtype(sem.dst)}")
        result = result.view(sem.dst)
        self._store(p, p.dest, result, active)

    def _active(self, p: Plan, n: int) -> np.ndarray | None:
        """The write mask as n booleans, or None without one."""
        if not p.mask:
            return None
        k = self.k[p.mask]
        return np.array([(k >> i) & 1 for i in range(n)], bool)

    def _address(self, p: Plan, op: Operand) -> int:
        base = 0
        if op.base:
            base = p.address + p.size if op.base == "rip" else self.port.gpr(op.base)
        index = self.port.gpr(op.index) * op.scale if op.index else 0
        return (base + index + op.disp) & (2**64 - 1)

    def _check_align(self, p: Plan, a: int, size: int) -> None:
        if p.sem.align and a % size:
            raise CpuFault(f"#GP: {p.text} needs a {size}-byte aligned address, got {a:#x}")

    def _source(self, p: Plan, op: Operand, n: int, active: np.ndarray | None):
        sem = p.sem
        if op.kind == "imm":
            return op.imm
        if op.kind == "vec":
            raw = self.vec(op.reg, op.size)
        elif op.kind == "k":
            raw = np.frombuffer(self.k[op.reg].to_bytes(8, "little")[:op.size], np.uint8)
        elif op.kind == "gpr":
            raw = np.frombuffer(self.port.gpr(op.reg).to_bytes(8, "little")[:op.size], np.uint8)
        else:
            a = self._address(p, op)
            self._check_align(p, a, op.size)
            if p.broadcast:
                data = (self.port.read(a, op.size) if active is None or active.any()
                        else bytes(op.size))
                raw = np.tile(np.frombuffer(data, np.uint8), p.vl // op.size)
            elif active is None or sem.permute or op.size % n:
                raw = np.frombuffer(self.port.read(a, op.size), np.uint8)
            else:
                raw = np.zeros(op.size, np.uint8)
                step = op.size // n
                for lo, hi in _runs(active):
                    raw[lo * step:hi * step] = np.frombuffer(
                        self.port.read(a + lo * step, (hi - lo) * step), np.uint8)
        return raw.view(sem.src)

    def _store(self, p: Plan, op: Operand, result: np.ndarray, active: np.ndarray | None) -> None:
        if op.kind == "vec":
            if active is not None:
                old = self.vec(op.reg, op.size).view(result.dtype)
                result = np.where(active, result, 0 if p.zeroing else old).astype(result.dtype)
            self.set_vec(op.reg, result.view(np.uint8))
        elif op.kind == "k":
            self.k[op.reg] = int.from_bytes(result.tobytes(), "little")
        elif op.kind == "gpr":
            value = int.from_bytes(result.tobytes(), "little")
            if op.reg in GPR32:
                self.port.set_gpr(GPR32[op.reg], value)           # zero-extended
            else:
                self.port.set_gpr(op.reg, value)
        else:
            a = self._address(p, op)
            self._check_align(p, a, op.size)
            data = result.tobytes()
            if active is None:
                self.port.write(a, data)
                return
            step = result.itemsize
            for lo, hi in _runs(active):
                self.port.write(a + lo * step, data[lo * step:hi * step])


def _runs(active: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) ranges of consecutive True elements."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], active.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))
