"""Call one routine of an image natively, through a checking trampoline, in a forked child.

Contract: `NativeRunner(image).call(name, *args) -> CallResult` takes the same arguments as the
Unicorn emulator (call.py) and runs the routine's own bytes on this CPU. This is how the AVX2
kernels are tested.
- The image's segments are copied into fresh memory at an arbitrary base, keeping their
  relative layout (RIP-relative references work; an absolute address does not).
- Each buffer gets its own pages followed by an inaccessible guard page (inputs are
  read-only); the slack around a buffer inside its pages holds canary bytes, checked after the
  call, so a write outside an output buffer is caught byte-exact (a read past the end is caught
  once it reaches the guard page).
- The call runs in a forked child (a crash or hang cannot take pytest down) through a
  trampoline that loads the SysV argument registers and the two stack slots, junk in the
  others, sentinels in rbx rbp r12-r15, and records after the return: rax, xmm0, the
  callee-saved registers (unless `sysv=False`, as in the emulator), rsp, RFLAGS (DF), MXCSR,
  the x87 control and status words. Breaches raise `KernelFault`.
- Before the call, the CPU features the reachable code needs (avx.features) are compared
  with /proc/cpuinfo; a missing one makes the test skip and says which.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import struct

import numpy as np

from builder.bench.machine import cpu_flags

from . import avx, code
from .call import INT_REGS, JUNK_XMM, N_STACK_ARGS, CallResult, plan, place
from .image import PAGE, Image, page_down, page_up
from .unicorn_run import CALLEE_SAVED, EFLAGS_DF, FPCW_DEFAULT, JUNK_GPR, MXCSR_DEFAULT, KernelFault

PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS = 0x01, 0x02, 0x20
CANARY = 0xA5
TIMEOUT_S = 30

# the control block shared with the child: offsets of its fields
IN_GPR, IN_XMM, FN, SAVED_RSP = 0, 64, 320, 328
OUT_RAX, OUT_XMM0, OUT_SAVED, OUT_RSP, OUT_FLAGS = 336, 352, 368, 416, 424
OUT_MXCSR, OUT_FPCW, OUT_FPSW, IN_MXCSR = 432, 436, 438, 440
IN_STACK = 448                                # arguments 7 and 8 (N_STACK_ARGS qwords)

TRAMPOLINE = """
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
    sub rsp, 0x8
    mov r11, {ctl}
    mov qword ptr [r11 + {saved_rsp}], rsp
    fninit
    ldmxcsr dword ptr [r11 + {in_mxcsr}]
    {load_xmm}
    {set_saved}
    mov rdi, qword ptr [r11 + {gpr0}]
    mov rsi, qword ptr [r11 + {gpr1}]
    mov rdx, qword ptr [r11 + {gpr2}]
    mov rcx, qword ptr [r11 + {gpr3}]
    mov r8, qword ptr [r11 + {gpr4}]
    mov r9, qword ptr [r11 + {gpr5}]
    push qword ptr [r11 + {stack1}]
    push qword ptr [r11 + {stack0}]
    mov rax, {junk}
    mov r10, {junk}
    mov r11, qword ptr [r11 + {fn}]
    call r11
    add rsp, 0x10
    mov r11, {ctl}
    mov qword ptr [r11 + {out_rax}], rax
    movdqu xmmword ptr [r11 + {out_xmm0}], xmm0
    {store_saved}
    mov qword ptr [r11 + {out_rsp}], rsp
    pushfq
    pop rax
    mov qword ptr [r11 + {out_flags}], rax
    stmxcsr dword ptr [r11 + {out_mxcsr}]
    fnstcw word ptr [r11 + {out_fpcw}]
    fnstsw word ptr [r11 + {out_fpsw}]
    cld
    mov rsp, qword ptr [r11 + {saved_rsp}]
    add rsp, 0x8
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    ret
"""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


def _mmap(size: int, flags: int) -> int:
    addr = _libc.mmap(None, size, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return addr


def _mprotect(addr: int, size: int, prot: int) -> None:
    if _libc.mprotect(addr, size, prot):
        raise OSError(ctypes.get_errno(), "mprotect failed")


class NativeRunner:
    """Holds one copy of the image in executable memory, a control page and the trampoline."""

    def __init__(self, image: Image):
        from keystone import KS_ARCH_X86, KS_MODE_64, Ks

        self.image = image
        lo = page_down(min(s.address for s in image.segments))
        hi = page_up(max(s.end for s in image.segments))
        base = _mmap(hi - lo, MAP_PRIVATE)
        self.delta = base - lo
        prot: dict[int, int] = {}
        for s in image.segments:
            ctypes.memmove(s.address + self.delta, s.data, len(s.data))
            for p in range(page_down(s.address), page_up(s.end), PAGE):
                prot[p] = prot.get(p, 0) | (PROT_READ | (PROT_WRITE if s.writable else 0)
                                            | (PROT_EXEC if s.executable else 0))
        for p, pr in prot.items():
            _mprotect(p + self.delta, PAGE, pr)
        self.ctl = _mmap(PAGE, MAP_SHARED)
        saved = list(CALLEE_SAVED)
        src = TRAMPOLINE.format(
            ctl=hex(self.ctl), saved_rsp=hex(SAVED_RSP), in_mxcsr=hex(IN_MXCSR),
            load_xmm="\n".join(f"movdqu xmm{i}, xmmword ptr [r11 + {hex(IN_XMM + 16 * i)}]"
                               for i in range(16)),
            set_saved="\n".join(f"mov {r}, {hex(v)}" for r, v in CALLEE_SAVED.items()),
            store_saved="\n".join(f"mov qword ptr [r11 + {hex(OUT_SAVED + 8 * i)}], {r}"
                                  for i, r in enumerate(saved)),
            **{f"gpr{i}": hex(IN_GPR + 8 * i) for i in range(6)}, junk=hex(JUNK_GPR),
            stack0=hex(IN_STACK), stack1=hex(IN_STACK + 8),
            fn=hex(FN), out_rax=hex(OUT_RAX), out_xmm0=hex(OUT_XMM0), out_rsp=hex(OUT_RSP),
            out_flags=hex(OUT_FLAGS), out_mxcsr=hex(OUT_MXCSR), out_fpcw=hex(OUT_FPCW),
            out_fpsw=hex(OUT_FPSW))
        self.tramp = _mmap(PAGE, MAP_PRIVATE)
        enc, _ = Ks(KS_ARCH_X86, KS_MODE_64).asm(src, self.tramp)
        ctypes.memmove(self.tramp, bytes(enc), len(enc))
        _mprotect(self.tramp, PAGE, PROT_READ | PROT_EXEC)

    def needs(self, name: str) -> set[str]:
        """CPU flags the code reachable from `name` needs that this CPU lacks."""
        insns = code.reachable(self.image, self.image.symbol(name).address)
        return avx.features(insns) - cpu_flags()

    def call(self, name: str, *args, sysv: bool = True) -> CallResult:
        missing = self.needs(name)
        if missing:
            import pytest
            pytest.skip(f"{name}: this CPU lacks {', '.join(sorted(missing))}")
        p = plan(args)
        layout, size = [], 0
        for buf in p.buffers:
            pages, off = place(buf.nbytes)
            layout.append((size, pages, off))
            size += (pages + 1) * PAGE
        arena = _mmap(max(size, PAGE), MAP_SHARED)
        try:
            address_of = self._fill(arena, p, layout)
            self._run(name, self.image.symbol(name).address + self.delta, p, address_of)
            return self._collect(name, arena, p, layout, address_of, sysv)
        finally:
            _libc.munmap(arena, max(size, PAGE))

    def _fill(self, arena: int, p, layout) -> dict[int, int]:
        address_of = {}
        for buf, (start, pages, off) in zip(p.buffers, layout):
            region = arena + start
            ctypes.memset(region, CANARY, pages * PAGE)
            ctypes.memmove(region + off, buf.array.tobytes(), buf.nbytes)
            if not buf.writable:
                _mprotect(region, pages * PAGE, PROT_READ)
            _mprotect(region + pages * PAGE, PAGE, PROT_NONE)
            address_of[id(buf)] = region + off
        ctl = bytearray(PAGE)
        for i in range(len(INT_REGS) + N_STACK_ARGS):
            value = p.int_value(p.ints[i], address_of) if i < len(p.ints) else JUNK_GPR
            at = IN_GPR + 8 * i if i < len(INT_REGS) else IN_STACK + 8 * (i - len(INT_REGS))
            struct.pack_into("<Q", ctl, at, value)
        for i in range(16):
            value = p.xmms[i] if i < len(p.xmms) else JUNK_XMM
            ctl[IN_XMM + 16 * i:IN_XMM + 16 * i + 16] = value.to_bytes(16, "little")
        struct.pack_into("<I", ctl, IN_MXCSR, MXCSR_DEFAULT)
        ctypes.memmove(self.ctl, bytes(ctl), PAGE)
        return address_of

    def _run(self, name: str, fn: int, p, address_of) -> None:
        struct.pack_into("<Q", (ctypes.c_char * PAGE).from_address(self.ctl), FN, fn)
        pid = os.fork()
        if pid == 0:                                  # child: call, then leave at once
            try:
                faulthandler.disable()                # a crash here is the expected report
                signal.alarm(TIMEOUT_S)
                ctypes.CFUNCTYPE(None)(self.tramp)()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status))
            why = (f"did not return within {TIMEOUT_S} s" if sig == signal.SIGALRM else
                   f"crashed with {sig.name} (an access beyond a buffer's guard page, a "
                   f"write to an input, or a broken stack?)")
            raise KernelFault(f"{name}: natively {why}")

    def _collect(self, name: str, arena: int, p, layout, address_of,
                 sysv: bool) -> CallResult:
        ctl = ctypes.string_at(self.ctl, PAGE)
        saved = struct.unpack_from("<6Q", ctl, OUT_SAVED)
        bad = [f"{r} ({want:#x} -> {got:#x})"
               for (r, want), got in zip(CALLEE_SAVED.items(), saved) if got != want and sysv]
        if bad:
            raise KernelFault(f"{name}: natively clobbers callee-saved {', '.join(bad)}")
        (rsp,) = struct.unpack_from("<Q", ctl, OUT_RSP)
        (saved_rsp,) = struct.unpack_from("<Q", ctl, SAVED_RSP)
        if rsp != saved_rsp:
            raise KernelFault(f"{name}: natively returns with rsp off by {rsp - saved_rsp}")
        (flags,) = struct.unpack_from("<Q", ctl, OUT_FLAGS)
        if flags & EFLAGS_DF:
            raise KernelFault(f"{name}: returns with the direction flag set (no cld)")
        mxcsr, fpcw, fpsw = struct.unpack_from("<IHH", ctl, OUT_MXCSR)
        if mxcsr & 0xFFC0 != MXCSR_DEFAULT & 0xFFC0 or fpcw != FPCW_DEFAULT:
            raise KernelFault(f"{name}: changes MXCSR ({mxcsr:#x}) or the x87 control word "
                              f"({fpcw:#x})")
        if (fpsw >> 11) & 7:
            raise KernelFault(f"{name}: leaves {8 - ((fpsw >> 11) & 7)} values on the x87 stack")
        outputs = []
        for buf, (start, pages, off) in zip(p.buffers, layout):
            if not buf.writable:
                continue
            raw = ctypes.string_at(arena + start, pages * PAGE)
            changed = np.frombuffer(raw, np.uint8) != CANARY
            changed[off:off + buf.nbytes] = False
            slack = np.flatnonzero(changed)
            if slack.size:
                i = int(slack[0])
                raise KernelFault(f"{name}: natively writes {slack.size} bytes outside "
                                  f"{buf.label()} ({buf.nbytes} bytes), the first at byte "
                                  f"offset {i - off} from its start")
            data = raw[off:off + buf.nbytes]
            outputs.append(np.frombuffer(data, buf.array.dtype).reshape(buf.array.shape).copy())
        rax = struct.unpack_from("<Q", ctl, OUT_RAX)[0]
        return CallResult(outputs, rax, ctl[OUT_XMM0:OUT_XMM0 + 16], None)
