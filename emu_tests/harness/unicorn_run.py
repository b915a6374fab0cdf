"""Call one routine of an image in Unicorn, with every rule of the engine's ABI checked.

Contract: `Emulator(image, cpu=BASELINE).call(name, *args, budget=...) -> CallResult`
(arguments: see call.py; integer arguments 7 and 8 go to the stack, as natively). Each call
gets a fresh CPU (Unicorn's model Penryn runs the legacy code: SSE..SSE4.1, anything beyond
faults as invalid) with the image's segments, one mapping per buffer followed by an unmapped
guard page, a stack, and a sentinel return address. VEX and EVEX instructions, CPUID and
XGETBV run in the instruction model (avx.py) as the CPU `cpu` (cpus.py: BASELINE, AVX2,
AVX512) would: Unicorn stops before each (a code hook on its address, set when its block is
first seen), the model computes it on its shadow ymm/zmm/k registers and Unicorn's xmm0-15,
and Unicorn resumes after it. An instruction `cpu` lacks faults as invalid; one the model
does not cover is refused (`RefusedCode`, naming it): before running when it is reachable
from the routine by direct branches, else when its block is first reached. During the call:
- every read and write must fall inside a buffer (writes: Out buffers only), the image's
  segments (writes: writable ones), the routine's stack frame (below its return address,
  and no deeper than the 128-byte red zone under the current rsp) or its stack arguments
  (read only) — byte-exact, through memory hooks on the stack and on every page that a region
  covers only in part, and for the model's accesses through the same check;
- at every `call` the routine makes rsp must be 16-byte aligned;
- no more than `budget` instructions may run (the count is returned; a modelled instruction
  counts as one).
After it returns: rbx rbp r12-r15 (unless `sysv=False`: a routine that keeps none of them,
the packed program's decoder), rsp and every register named in `preserves` (e.g. those
its header does not list as clobbered: GPR names like "rdi", or "xmm6") are as before, DF is
clear, MXCSR and the x87 control word are unchanged, the x87 stack is empty and ymm0-15 are
zero above bit 127 (a vzeroupper before returning to SSE code). Any breach raises
`KernelFault` (an AssertionError) naming the routine, what happened, the address, the
instruction and the nearest buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from unicorn import (UC_ARCH_X86, UC_ERR_INSN_INVALID, UC_HOOK_BLOCK, UC_HOOK_CODE,
                     UC_HOOK_MEM_PROT, UC_HOOK_MEM_READ, UC_HOOK_MEM_UNMAPPED,
                     UC_HOOK_MEM_WRITE, UC_MEM_FETCH,
                     UC_MEM_FETCH_PROT, UC_MEM_FETCH_UNMAPPED, UC_MEM_READ, UC_MEM_READ_PROT,
                     UC_MEM_READ_UNMAPPED, UC_MEM_WRITE, UC_MODE_64, UC_PROT_EXEC,
                     UC_PROT_READ, UC_PROT_WRITE, Uc, UcError)
from unicorn import x86_const as R

from . import avx, code
from .call import INT_REGS, JUNK_XMM, CallResult, plan, place
from .cpus import BASELINE, MXCSR_DEFAULT, Cpu
from .image import PAGE, Image, page_down, page_up

CPU_MODEL = R.UC_CPU_X86_PENRYN
CR4_OSFXSR_OSXMMEXCPT = 0x600      # without them every SSE instruction is #UD
FPCW_DEFAULT = 0x037F              # x87: 64-bit mantissa, all exceptions masked
EFLAGS_DF = 0x400
RFLAGS_START = 0x202

BUF_BASE = 0x10000000
STACK_TOP = 0x7FF00000
STACK_SIZE = 0x40000
RETURN = 0x7FFE0000                # sentinel return address (a page of hlt)
RSP_ENTRY = STACK_TOP - 0x48       # rsp at entry: (rsp + 8) % 16 == 0 as after a call
RED_ZONE = 128                     # SysV: below rsp, safe from signal handlers
STRADDLE = 64                      # widest access (zmm) that can start before a hooked page
DEFAULT_BUDGET = 5_000_000
TIMEOUT_US = 120_000_000

REG = {n: getattr(R, f"UC_X86_REG_{n.upper()}") for n in
       (*INT_REGS, "rax", "rbx", "rbp", "r10", "r11", "r12", "r13", "r14", "r15", "rsp", "rip")}
CALLEE_SAVED = {"rbx": 0x0B0B0B0B_1BADF00D, "rbp": 0x0B0B0B0B_2BADF00D,
                "r12": 0x0B0B0B0B_3BADF00D, "r13": 0x0B0B0B0B_4BADF00D,
                "r14": 0x0B0B0B0B_5BADF00D, "r15": 0x0B0B0B0B_6BADF00D}
JUNK_GPR = 0x5A5A5A5A_DEADBEEF
XMM = [getattr(R, f"UC_X86_REG_XMM{i}") for i in range(16)]


def _reg_id(name: str) -> int:
    return getattr(R, f"UC_X86_REG_{name.upper()}")


class KernelFault(AssertionError):
    """A routine broke a rule of the ABI or touched memory it was not given."""


class RefusedCode(KernelFault):
    """The routine contains code neither Unicorn nor the instruction model can run."""


class _Halt(Exception):
    """A modelled instruction's access was refused (the fault is recorded)."""


def perms(seg) -> int:
    return ((UC_PROT_READ if seg.readable else 0) | (UC_PROT_WRITE if seg.writable else 0)
            | (UC_PROT_EXEC if seg.executable else 0))


def new_machine(image: Image) -> Uc:
    """A fresh x86-64 Unicorn CPU (baseline model, SSE enabled, Linux FPU state) holding the
    image's segments at their addresses with their permissions (pages shared by two segments
    get the union)."""
    uc = Uc(UC_ARCH_X86, UC_MODE_64)
    uc.ctl_set_cpu_model(CPU_MODEL)
    uc.reg_write(R.UC_X86_REG_CR4, uc.reg_read(R.UC_X86_REG_CR4) | CR4_OSFXSR_OSXMMEXCPT)
    uc.reg_write(R.UC_X86_REG_MXCSR, MXCSR_DEFAULT)
    uc.reg_write(R.UC_X86_REG_FPCW, FPCW_DEFAULT)
    page_perms: dict[int, int] = {}
    for seg in image.segments:
        for p in range(page_down(seg.address), page_up(seg.end), PAGE):
            page_perms[p] = page_perms.get(p, 0) | perms(seg)
    for p, pr in sorted(page_perms.items()):
        uc.mem_map(p, PAGE, pr)
    for seg in image.segments:
        uc.mem_write(seg.address, seg.data)
    return uc


@dataclass(frozen=True)
class Region:
    lo: int
    hi: int
    what: str          # "output buffer xout (7 x float32)", "the stack frame", ...
    writable: bool
    itemsize: int = 1  # > 1 for buffers: relations are also given as element indices

    def distance(self, a: int, size: int) -> int:
        return max(self.lo - (a + size), a - self.hi, 0)

    def relation(self, a: int, size: int) -> str:
        span = f"{self.what} at [{self.lo:#x}, {self.hi:#x})"
        index = f" (element {(a - self.lo) // self.itemsize})" if self.itemsize > 1 else ""
        if a < self.hi < a + size:
            return f"runs {a + size - self.hi} bytes past the end of {span}"
        if a >= self.hi:
            return f"{a - self.hi} bytes after the end{index} of {span}"
        if a < self.lo:
            return f"{self.lo - a} bytes before the start of {span}"
        return f"inside{index} {span}, which is read-only"


@dataclass(frozen=True)
class _Block:
    """A translated block as first seen: its instructions' addresses, the address of a final
    `call` (or None), and the addresses of the instructions the model runs."""
    insns: tuple[int, ...]
    call: int | None
    sites: tuple[int, ...]


class _Call:
    """The state of one emulated call: its machine, regions, hooks and first violation; it
    is also the instruction model's port (registers and checked memory)."""

    def __init__(self, emu: Emulator, name: str, args: tuple, budget: int,
                 preserves: tuple[str, ...] = (), sysv: bool = True):
        self.emu, self.image = emu, emu.image
        self.name, self.budget, self.preserves, self.sysv = name, budget, preserves, sysv
        self.sym = self.image.symbol(name)
        self.fault: str | None = None
        self.count = 0
        self.current: _Block | None = None
        self.hooked: set[int] = set()
        self.pending_call: int | None = None
        self.plan = plan(args)
        self.uc = new_machine(self.image)
        self.model = avx.VectorModel(emu.cpu, self)
        self.regions = [Region(s.address, s.end, "the image's "
                               + ("writable" if s.writable else "read-only") + " segment",
                               s.writable) for s in self.image.segments]
        self._map_buffers()
        self._map_stack()
        self._hook()
        for address in emu.plans:
            self._hook_site(address)

    def _map_buffers(self) -> None:
        self.address_of: dict[int, int] = {}
        base = BUF_BASE
        for buf in self.plan.buffers:
            pages, off = place(buf.nbytes)
            prot = UC_PROT_READ | (UC_PROT_WRITE if buf.writable else 0)
            self.uc.mem_map(base, pages * PAGE, prot)
            addr = base + off
            self.uc.mem_write(addr, buf.array.tobytes())
            self.address_of[id(buf)] = addr
            self.regions.append(Region(addr, addr + buf.nbytes,
                                       f"{buf.label()} ({buf.array.size} x {buf.array.dtype})",
                                       buf.writable, buf.array.itemsize))
            base += (pages + 1) * PAGE          # one unmapped guard page after each buffer

    def _map_stack(self) -> None:
        uc = self.uc
        uc.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE, UC_PROT_READ | UC_PROT_WRITE)
        uc.mem_write(RSP_ENTRY, (RETURN.to_bytes(8, "little")
                                 + b"\xa5" * (STACK_TOP - RSP_ENTRY - 8)))
        uc.mem_map(RETURN, PAGE, UC_PROT_READ | UC_PROT_EXEC)
        uc.mem_write(RETURN, b"\xf4" * PAGE)
        self.stack = Region(STACK_TOP - STACK_SIZE, RSP_ENTRY + 8, "the stack frame", True)
        self.regions.append(self.stack)
        n_stack = len(self.plan.ints) - len(INT_REGS)
        if n_stack > 0:
            self.regions.append(Region(RSP_ENTRY + 8, RSP_ENTRY + 8 + 8 * n_stack,
                                       "the stack arguments", False))

    def _hook(self) -> None:
        uc = self.uc
        partial = set()
        for r in self.regions:
            for edge in (r.lo, r.hi):
                if edge % PAGE and r is not self.stack:
                    partial.add(page_down(edge))
        for p in sorted(partial):
            uc.hook_add(UC_HOOK_MEM_READ | UC_HOOK_MEM_WRITE, self._on_access,
                        begin=p - STRADDLE, end=p + PAGE - 1)
        uc.hook_add(UC_HOOK_MEM_READ | UC_HOOK_MEM_WRITE, self._on_access,
                    begin=STACK_TOP - STACK_SIZE - STRADDLE, end=STACK_TOP - 1)
        uc.hook_add(UC_HOOK_MEM_UNMAPPED | UC_HOOK_MEM_PROT, self._on_bad_access)
        uc.hook_add(UC_HOOK_BLOCK, self._on_block)

    # --- hooks -----------------------------------------------------------------------------
    def _where(self) -> str:
        rip = self.uc.reg_read(R.UC_X86_REG_RIP)
        insn = code.decode(self.image.read(rip, code.MAX_INSN), rip)
        return code.describe(self.image, insn) if insn else self.image.where(rip)

    def _stop(self, fault: str) -> None:
        if self.fault is None:
            self.fault = fault
        self.uc.emu_stop()

    def _violation(self, write: bool, a: int, size: int) -> None:
        near = min(self.regions, key=lambda r: (r.distance(a, size), not r.lo <= a < r.hi))
        self._stop(f"{self.name}: {'write' if write else 'read'} of {size} bytes at "
                   f"{a:#x} outside its buffers, image and stack frame; "
                   f"{near.relation(a, size)}; at {self._where()}")

    def _allowed(self, write: bool, a: int, size: int) -> bool:
        """The access rule (module docstring); a breach is recorded and stops the run."""
        for r in self.regions:
            if r.lo <= a and a + size <= r.hi and (r.writable or not write):
                floor = self.uc.reg_read(R.UC_X86_REG_RSP) - RED_ZONE
                if r is self.stack and a < floor:
                    self._stop(f"{self.name}: {'write' if write else 'read'} of {size} bytes "
                               f"at {a:#x}, {floor - a} bytes below the red zone (rsp - "
                               f"{RED_ZONE}); at {self._where()}")
                    return False
                return True
        self._violation(write, a, size)
        return False

    def _on_access(self, uc, access, a, size, value, data) -> None:
        self._allowed(access == UC_MEM_WRITE, a, size)

    def _on_bad_access(self, uc, access, a, size, value, data) -> bool:
        if access in (UC_MEM_FETCH_UNMAPPED, UC_MEM_FETCH_PROT, UC_MEM_FETCH):
            if self.fault is None:
                self.fault = f"{self.name}: jumps to {a:#x}, which is not code"
        else:
            write = access not in (UC_MEM_READ, UC_MEM_READ_UNMAPPED, UC_MEM_READ_PROT)
            self._violation(write, a, size)
        return False

    def _on_block(self, uc, addr, size, data) -> None:
        if addr == RETURN:
            return
        if self.pending_call is not None:
            rsp = uc.reg_read(R.UC_X86_REG_RSP) + 8     # rsp before the call pushed
            if rsp % 16:
                self._stop(f"{self.name}: rsp is not 16-byte aligned (rsp % 16 = {rsp % 16})"
                           f" at the call at {self.image.where(self.pending_call)}")
        try:
            block = self.emu.block(addr, size)
        except RefusedCode as e:
            self._stop(f"{self.name}: {e}")
            return
        new = [a for a in block.sites if a not in self.hooked]
        if new:                   # translated without their hooks: translate it again
            for a in new:
                self._hook_site(a)
            uc.ctl_remove_cache(addr, addr + size)
            uc.reg_write(R.UC_X86_REG_RIP, addr)
            self.pending_call = None
            return
        self.current, self.pending_call = block, block.call
        self.count += len(block.insns)
        if self.count > self.budget:
            self._stop(f"{self.name}: did not return within {self.budget} instructions "
                       f"(an endless loop?); stopped at {self._where()}")

    def _hook_site(self, address: int) -> None:
        self.uc.hook_add(UC_HOOK_CODE, self._on_site, begin=address, end=address)
        self.hooked.add(address)

    def _on_site(self, uc, address, size, data) -> None:
        """Run a modelled instruction in Unicorn's place, then continue after it."""
        p = self.emu.plans[address]
        try:
            self.model.execute(p)
        except _Halt:
            uc.emu_stop()
            return
        except avx.InvalidOpcode as e:
            self._stop(f"{self.name}: an invalid instruction ({e}) at {self._where()}")
            return
        except (avx.CpuFault, avx.Unsupported) as e:
            self._stop(f"{self.name}: {e} at {self._where()}")
            return
        block = self.current                    # the rest of the block is counted again
        self.count -= len(block.insns) - 1 - block.insns.index(address)
        self.pending_call = None
        uc.reg_write(R.UC_X86_REG_RIP, address + p.size)

    # --- the model's port ------------------------------------------------------------------
    def gpr(self, name: str) -> int:
        return self.uc.reg_read(_reg_id(name))

    def set_gpr(self, name: str, value: int) -> None:
        self.uc.reg_write(_reg_id(name), value)

    def xmm(self, i: int) -> bytes:
        return self.uc.reg_read(XMM[i]).to_bytes(16, "little")

    def set_xmm(self, i: int, value: bytes) -> None:
        self.uc.reg_write(XMM[i], int.from_bytes(value, "little"))

    def mxcsr(self) -> int:
        return self.uc.reg_read(R.UC_X86_REG_MXCSR)

    def read(self, address: int, size: int) -> bytes:
        if not self._allowed(False, address, size):
            raise _Halt
        return bytes(self.uc.mem_read(address, size))

    def write(self, address: int, data: bytes) -> None:
        if not self._allowed(True, address, len(data)):
            raise _Halt
        self.uc.mem_write(address, data)

    # --- run -------------------------------------------------------------------------------
    def run(self) -> CallResult:
        uc = self.uc
        for reg in ("rax", "r10", "r11", *INT_REGS):
            uc.reg_write(REG[reg], JUNK_GPR)
        for reg, value in zip(INT_REGS, self.plan.ints):
            uc.reg_write(REG[reg], self.plan.int_value(value, self.address_of))
        for i, value in enumerate(self.plan.ints[len(INT_REGS):]):
            uc.mem_write(RSP_ENTRY + 8 + 8 * i,
                         self.plan.int_value(value, self.address_of).to_bytes(8, "little"))
        for reg, value in CALLEE_SAVED.items():
            uc.reg_write(REG[reg], value)
        for i, x in enumerate(XMM):
            uc.reg_write(x, self.plan.xmms[i] if i < len(self.plan.xmms) else JUNK_XMM)
        uc.reg_write(REG["rsp"], RSP_ENTRY)
        uc.reg_write(R.UC_X86_REG_RFLAGS, RFLAGS_START)
        before = {r: uc.reg_read(_reg_id(r)) for r in self.preserves}
        try:
            uc.emu_start(self.sym.address, RETURN, timeout=TIMEOUT_US)
        except UcError as e:
            if self.fault is None:
                what = ("an invalid instruction (outside the baseline SSE..SSE4.1?)"
                        if e.errno == UC_ERR_INSN_INVALID else str(e))
                self.fault = f"{self.name}: {what} at {self._where()}"
        if self.fault:
            raise KernelFault(self.fault)
        rip = uc.reg_read(REG["rip"])
        if rip != RETURN:
            raise KernelFault(f"{self.name}: stopped at {self._where()} without returning "
                              f"(timeout after {TIMEOUT_US // 1_000_000} s?)")
        self._check_after()
        changed = [f"{r} ({v:#x} -> {uc.reg_read(_reg_id(r)):#x})" for r, v in before.items()
                   if uc.reg_read(_reg_id(r)) != v]
        if changed:
            raise KernelFault(f"{self.name}: changes {', '.join(changed)}, which it does not "
                              f"list as clobbered")
        outputs = [np.frombuffer(bytes(uc.mem_read(self.address_of[id(b)], b.nbytes)),
                                 b.array.dtype).reshape(b.array.shape).copy()
                   for b in self.plan.buffers if b.writable]
        return CallResult(outputs, uc.reg_read(REG["rax"]),
                          uc.reg_read(XMM[0]).to_bytes(16, "little"), self.count)

    def _check_after(self) -> None:
        uc = self.uc
        bad = [f"{reg} ({want:#x} -> {uc.reg_read(REG[reg]):#x})"
               for reg, want in CALLEE_SAVED.items() if uc.reg_read(REG[reg]) != want
               and self.sysv]
        if bad:
            raise KernelFault(f"{self.name}: clobbers callee-saved {', '.join(bad)}")
        rsp = uc.reg_read(REG["rsp"])
        if rsp != RSP_ENTRY + 8:
            raise KernelFault(f"{self.name}: returns with rsp off by {rsp - RSP_ENTRY - 8}")
        if uc.reg_read(R.UC_X86_REG_RFLAGS) & EFLAGS_DF:
            raise KernelFault(f"{self.name}: returns with the direction flag set (no cld)")
        mxcsr = uc.reg_read(R.UC_X86_REG_MXCSR)
        if mxcsr & 0xFFC0 != MXCSR_DEFAULT & 0xFFC0:
            raise KernelFault(f"{self.name}: changes the MXCSR control bits "
                              f"({MXCSR_DEFAULT:#x} -> {mxcsr:#x})")
        fpcw = uc.reg_read(R.UC_X86_REG_FPCW)
        if fpcw != FPCW_DEFAULT:
            raise KernelFault(f"{self.name}: changes the x87 control word "
                              f"({FPCW_DEFAULT:#x} -> {fpcw:#x})")
        top = (uc.reg_read(R.UC_X86_REG_FPSW) >> 11) & 7
        if top:
            raise KernelFault(f"{self.name}: leaves {8 - top} values on the x87 stack")
        dirty = self.model.dirty_uppers()
        if dirty:
            raise KernelFault(f"{self.name}: returns with bits above 127 set in "
                              f"{', '.join(f'ymm{i}' for i in dirty)} (no vzeroupper)")


class Emulator:
    """Runs routines of `image` one call at a time (a fresh machine per call) on `cpu`; the
    decoded blocks and the model's plans are kept from call to call (the code is read-only)."""

    def __init__(self, image: Image, budget: int = DEFAULT_BUDGET, cpu: Cpu = BASELINE):
        self.image, self.budget, self.cpu = image, budget, cpu
        self.plans: dict[int, avx.Plan] = {}
        self._blocks: dict[tuple[int, int], _Block] = {}
        self._scanned: set[str] = set()

    def _plan(self, insn) -> None:
        """Plan a modelled instruction once (RefusedCode if the model cannot run it)."""
        if insn.address not in self.plans:
            try:
                self.plans[insn.address] = avx.plan(insn)
            except avx.Unsupported as e:
                kind = code.vex_kind(insn) or "legacy"
                raise RefusedCode(f"refusing to emulate the {kind} instruction at "
                                  f"{self.image.where(insn.address)}: {e}") from None

    def block(self, addr: int, size: int) -> _Block:
        """A block Unicorn translated, decoded (its last instruction whole: Unicorn counts an
        instruction it cannot decode short) and its modelled instructions planned."""
        block = self._blocks.get((addr, size))
        if block is None:
            insns = [i for i in code.decode_all(self.image.read(addr, size + code.MAX_INSN), addr)
                     if i.address < addr + size]
            sites = [i for i in insns if avx.is_site(i)]
            for insn in sites:
                self._plan(insn)
            call = insns[-1].address if insns and insns[-1].mnemonic == "call" else None
            block = _Block(tuple(i.address for i in insns), call,
                           tuple(i.address for i in sites))
            self._blocks[(addr, size)] = block
        return block

    def scan(self, name: str) -> None:
        """Raise RefusedCode if an instruction reachable from `name` by direct branches needs
        the model and the model cannot run it."""
        if name in self._scanned:
            return
        for insn in code.reachable(self.image, self.image.symbol(name).address):
            if avx.is_site(insn):
                try:
                    self._plan(insn)
                except RefusedCode as e:
                    raise RefusedCode(f"{name}: {e}") from None
        self._scanned.add(name)

    def call(self, name: str, *args, budget: int | None = None,
             preserves: tuple[str, ...] = (), sysv: bool = True) -> CallResult:
        self.scan(name)
        return _Call(self, name, args, budget or self.budget, tuple(preserves), sysv).run()
