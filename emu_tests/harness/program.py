"""Run a whole program image in Unicorn with emulated Linux syscalls.

Contract: `run_program(image, argv, files={path: bytes}, stdin=b"", ...) -> ProgramResult`
starts the image at its entry point with a Linux-like initial stack (argc, argv, an empty
environment, an auxiliary vector) on the baseline CPU (see unicorn_run.new_machine) and serves
its syscalls from memory. Every general register but rsp starts with junk (a different value
each): Linux would give zeros, but the packed program's stub hands the image the registers
as its decoder left them, so the image must not read one before it writes it. Its syscalls:
read write open openat close fstat lseek mmap munmap mprotect madvise rt_sigprocmask
sched_getaffinity (one CPU: the emulated process runs one thread) exit exit_group.
- `files` are the readable files (the model file, say); a file opened for writing is created
  in memory and returned in `ProgramResult.files`. stdout and stderr are captured;
  `fail_writes={fd: errno}` makes writes to that fd fail, to test the engine's error path;
  with EPIPE the process dies of SIGPIPE as on Linux, unless it has blocked that signal.
- mmap places every mapping in its own address range with an unmapped gap after it; pages of
  a file mapping wholly beyond the file's end stay unmapped (Linux raises SIGBUS there).
- `count=True` counts the instructions the program executes (`ProgramResult.instructions`;
  a hook on every translated block, so slower): the tests measure the engine's cost with it.
- Anything the engine must never do raises `ProgramFault` (an AssertionError): an unexpected
  syscall (with its number), a fault (the signal Linux would send, the address, the
  instruction), executing a VEX/EVEX instruction (refused: Unicorn miscomputes them), not
  exiting within `timeout` seconds, or a syscall use this emulation does not model.
"""
from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass, field

from unicorn import (UC_ERR_INSN_INVALID, UC_HOOK_BLOCK, UC_HOOK_CODE, UC_HOOK_INSN, UC_HOOK_MEM_PROT,
                     UC_HOOK_MEM_UNMAPPED, UC_MEM_FETCH_PROT, UC_MEM_FETCH_UNMAPPED,
                     UC_MEM_READ_PROT, UC_MEM_READ_UNMAPPED, UC_MEM_WRITE_PROT, UC_PROT_EXEC,
                     UC_PROT_READ, UC_PROT_WRITE, UcError)
from unicorn import x86_const as R

from . import code
from .image import PAGE, Image, page_up
from .unicorn_run import JUNK_GPR, new_machine

STACK_TOP = 0x7FFF_FFFF_0000
STACK_SIZE = 8 << 20
MMAP_BASE = 0x7F00_0000_0000
DEFAULT_MEM_LIMIT = 4 << 30
AT_FDCWD = -100
O_ACCMODE, O_CREAT, O_TRUNC, O_APPEND = 3, 0o100, 0o1000, 0o2000
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
S_IFREG, S_IFCHR = 0o100000, 0o020000
STAT = struct.Struct("<QQQIIIIQqqq6q3q")   # struct stat (x86-64): dev ino nlink mode uid gid
                                            # pad rdev size blksize blocks times[6] unused[3]
AT_PAGESZ, AT_RANDOM, AT_NULL = 6, 25, 0
SIGSET_SIZE = 8
SIGPIPE_BIT = 1 << 12                       # signal 13
ARGS = (R.UC_X86_REG_RDI, R.UC_X86_REG_RSI, R.UC_X86_REG_RDX, R.UC_X86_REG_R10,
        R.UC_X86_REG_R8, R.UC_X86_REG_R9)
MASK64 = (1 << 64) - 1
GPRS = [getattr(R, f"UC_X86_REG_{n}") for n in
        ("RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", *(f"R{i}" for i in range(8, 16)))]


class ProgramFault(AssertionError):
    """The program did something the engine must never do (or this emulation cannot model)."""


@dataclass
class ProgramResult:
    status: int
    stdout: bytes
    stderr: bytes
    files: dict[str, bytes]             # files the program wrote, by path
    syscalls: list[str]                 # names of the syscalls made, in order
    advice: list[tuple[int, int, int]]  # (address, length, advice) of each madvise
    instructions: int | None = None     # executed, with run_program(..., count=True)


@dataclass
class OpenFile:
    path: str
    data: bytearray
    readable: bool
    writable: bool
    pos: int = 0
    stdio: bool = False
    append: bool = False


@dataclass
class _Process:
    image: Image
    files: dict[str, bytes]
    stdin: bytes
    fail_writes: dict[int, int]
    mem_limit: int
    written: dict[str, bytearray] = field(default_factory=dict)
    out: dict[int, bytearray] = field(default_factory=lambda: {1: bytearray(), 2: bytearray()})
    log: list[str] = field(default_factory=list)
    status: int | None = None
    fault: str | None = None
    mapped: int = 0
    sigmask: int = 0
    advice: list[tuple[int, int, int]] = field(default_factory=list)
    instructions: int | None = None

    def __post_init__(self) -> None:
        self.fds = {0: OpenFile("<stdin>", bytearray(self.stdin), True, False, stdio=True),
                    1: OpenFile("<stdout>", self.out[1], False, True, stdio=True),
                    2: OpenFile("<stderr>", self.out[2], False, True, stdio=True)}
        self.next_map = MMAP_BASE
        self.uc = new_machine(self.image)
        self.uc.hook_add(UC_HOOK_INSN, self._syscall, aux1=R.UC_X86_INS_SYSCALL)
        self.uc.hook_add(UC_HOOK_MEM_UNMAPPED | UC_HOOK_MEM_PROT, self._on_fault)
        for lo, hi in self._vex_ranges():
            self.uc.hook_add(UC_HOOK_CODE, self._on_vex, begin=lo, end=hi - 1)

    # --- set-up ------------------------------------------------------------------------------
    def _vex_ranges(self) -> list[tuple[int, int]]:
        """Address ranges of the VEX/EVEX instructions found by linear sweeps from the entry,
        every symbol and every executable segment's start (a sweep through data can only add
        ranges that never execute)."""
        starts = {self.image.entry, *(s.address for s in self.image.symbols.values()),
                  *(s.address for s in self.image.segments if s.executable)}
        found = set()
        for a in starts:
            seg = self.image.segment_at(a)
            if seg is None or not seg.executable:
                continue
            for insn in code.sweep(self.image, a, seg.end - a):
                if code.vex_kind(insn):
                    found.add((insn.address, insn.address + insn.size))
        return sorted(found)

    def start(self, argv: list[str], timeout: float) -> None:
        uc = self.uc
        uc.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE, UC_PROT_READ | UC_PROT_WRITE)
        strings = b"".join(a.encode() + b"\0" for a in argv) + os.urandom(16)
        sp = (STACK_TOP - len(strings) - 64) & ~15
        uc.mem_write(sp, strings)
        ptrs, p = [], sp
        for a in argv:
            ptrs.append(p)
            p += len(a.encode()) + 1
        words = [len(argv), *ptrs, 0, 0, AT_PAGESZ, PAGE, AT_RANDOM, p, AT_NULL, 0]
        sp = (sp - 8 * len(words)) & ~15
        uc.mem_write(sp, struct.pack(f"<{len(words)}Q", *words))
        uc.reg_write(R.UC_X86_REG_RSP, sp)
        for i, reg in enumerate(GPRS):
            uc.reg_write(reg, (JUNK_GPR + i * 0x0101_0101_0101) & MASK64)
        try:
            uc.emu_start(self.image.entry, 0, timeout=int(timeout * 1e6))
        except UcError as e:
            if self.fault is None:
                what = ("SIGILL: an invalid instruction (outside the baseline SSE..SSE4.1?)"
                        if e.errno == UC_ERR_INSN_INVALID else f"emulation stopped: {e}")
                self.fault = f"{what} at {self._where()}"
        if self.fault:
            raise ProgramFault(f"gemma: {self.fault}")
        if self.status is None:
            raise ProgramFault(f"gemma: did not exit within {timeout} s; "
                               f"stopped at {self._where()}")

    def count_instructions(self) -> None:
        """Count every instruction executed from now on into self.instructions."""
        self.instructions = 0
        sizes: dict[int, int] = {}

        def on_block(uc, address, size, data) -> None:
            n = sizes.get(address)
            if n is None:
                n = sizes[address] = len(code.decode_all(bytes(uc.mem_read(address, size)),
                                                         address))
            self.instructions += n
        self.uc.hook_add(UC_HOOK_BLOCK, on_block)

    # --- faults ------------------------------------------------------------------------------
    def _where(self) -> str:
        rip = self.uc.reg_read(R.UC_X86_REG_RIP)
        insn = code.decode(self.image.read(rip, code.MAX_INSN), rip)
        return code.describe(self.image, insn) if insn else self.image.where(rip)

    def _stop(self, fault: str) -> None:
        if self.fault is None:
            self.fault = fault
        self.uc.emu_stop()

    def _on_fault(self, uc, access, a, size, value, data) -> bool:
        kind = {UC_MEM_READ_UNMAPPED: "read", UC_MEM_READ_PROT: "read",
                UC_MEM_WRITE_PROT: "write", UC_MEM_FETCH_UNMAPPED: "execution",
                UC_MEM_FETCH_PROT: "execution"}.get(access, "write")
        self._stop(f"SIGSEGV/SIGBUS: {kind} of {size} bytes at {a:#x} at {self._where()}")
        return False

    def _on_vex(self, uc, address, size, data) -> None:
        insn = code.decode(self.image.read(address, code.MAX_INSN), address)
        self._stop(f"refusing to emulate the {code.vex_kind(insn)} instruction at "
                   f"{code.describe(self.image, insn)} (Unicorn has no AVX)")

    # --- guest memory ------------------------------------------------------------------------
    def _accessible(self, a: int, n: int, prot: int) -> bool:
        """[a, a+n) is mapped with `prot` everywhere (regions are sorted and disjoint)."""
        need = a
        for lo, hi, p in self.uc.mem_regions():
            if lo <= need <= hi:
                if p & prot != prot:
                    return False
                need = hi + 1
                if need >= a + n:
                    return True
        return n == 0

    def _read_guest(self, a: int, n: int) -> bytes | None:
        return bytes(self.uc.mem_read(a, n)) if self._accessible(a, n, UC_PROT_READ) else None

    def _read_path(self, a: int) -> str | None:
        raw = bytearray()
        while len(raw) < 4096:
            chunk = self._read_guest(a + len(raw), 1)
            if chunk is None:
                return None
            if chunk == b"\0":
                return raw.decode("utf-8", "surrogateescape")
            raw += chunk
        return None

    # --- syscalls ----------------------------------------------------------------------------
    def _syscall(self, uc, data) -> None:
        nr = uc.reg_read(R.UC_X86_REG_RAX)
        args = [uc.reg_read(r) for r in ARGS]
        handler = getattr(self, f"sys_{SYSCALL_NAMES.get(nr)}", None)
        if handler is None:
            self._stop(f"unexpected syscall {nr} at {self._where()}")
            return
        self.log.append(SYSCALL_NAMES[nr])
        result = handler(*args)
        if result is not None:
            uc.reg_write(R.UC_X86_REG_RAX, result & MASK64)
            uc.reg_write(R.UC_X86_REG_RCX, uc.reg_read(R.UC_X86_REG_RIP) + 2)
            uc.reg_write(R.UC_X86_REG_R11, uc.reg_read(R.UC_X86_REG_RFLAGS))

    def _file(self, fd: int) -> OpenFile | None:
        return self.fds.get(fd & MASK64)

    def sys_read(self, fd, buf, n, *_):
        f = self._file(fd)
        if f is None or not f.readable:
            return -errno.EBADF
        chunk = bytes(f.data[f.pos:f.pos + n])
        if not self._accessible(buf, len(chunk), UC_PROT_WRITE):
            return -errno.EFAULT
        self.uc.mem_write(buf, chunk)
        f.pos += len(chunk)
        return len(chunk)

    def sys_write(self, fd, buf, n, *_):
        f = self._file(fd)
        if f is None or not f.writable:
            return -errno.EBADF
        if fd in self.fail_writes:
            if self.fail_writes[fd] == errno.EPIPE and not self.sigmask & SIGPIPE_BIT:
                self._stop(f"killed by SIGPIPE (a write to fd {fd} with SIGPIPE not blocked)")
                return None
            return -self.fail_writes[fd]
        chunk = self._read_guest(buf, n)
        if chunk is None:
            return -errno.EFAULT
        if f.stdio or f.append:
            f.pos = len(f.data)
        if f.pos > len(f.data):                      # written after a seek past the end
            f.data += bytes(f.pos - len(f.data))
        f.data[f.pos:f.pos + n] = chunk
        f.pos += n
        return n

    def sys_open(self, path, flags, mode, *_):
        return self.sys_openat(AT_FDCWD, path, flags, mode)

    def sys_openat(self, dirfd, path_ptr, flags, mode, *_):
        path = self._read_path(path_ptr)
        if path is None:
            return -errno.EFAULT
        acc = flags & O_ACCMODE
        writable = acc in (1, 2)
        if writable:
            if path not in self.written:
                if path not in self.files and not flags & O_CREAT:
                    return -errno.ENOENT
                self.written[path] = bytearray(self.files.get(path, b""))
            if flags & O_TRUNC:
                del self.written[path][:]
            data = self.written[path]
        elif path in self.written:
            data = self.written[path]
        elif path in self.files:
            data = bytearray(self.files[path])
        else:
            return -errno.ENOENT
        fd = min(set(range(len(self.fds) + 1)) - set(self.fds))
        self.fds[fd] = OpenFile(path, data, acc in (0, 2), writable,
                                append=bool(flags & O_APPEND))
        return fd

    def sys_close(self, fd, *_):
        return 0 if self.fds.pop(fd & MASK64, None) else -errno.EBADF

    def sys_fstat(self, fd, buf, *_):
        f = self._file(fd)
        if f is None:
            return -errno.EBADF
        mode = (S_IFCHR | 0o620) if f.stdio else (S_IFREG | 0o644)
        size = 0 if f.stdio else len(f.data)
        st = STAT.pack(0, fd, 1, mode, 0, 0, 0, 0, size, PAGE, (size + 511) // 512,
                       *[0] * 6, *[0] * 3)
        if not self._accessible(buf, len(st), UC_PROT_WRITE):
            return -errno.EFAULT
        self.uc.mem_write(buf, st)
        return 0

    def sys_lseek(self, fd, off, whence, *_):
        f = self._file(fd)
        if f is None:
            return -errno.EBADF
        if f.stdio:
            return -errno.ESPIPE
        off = off - (1 << 64) if off >> 63 else off
        base = {0: 0, 1: f.pos, 2: len(f.data)}.get(whence)
        if base is None or base + off < 0:
            return -errno.EINVAL
        f.pos = base + off
        return f.pos

    def sys_mmap(self, addr, length, prot, flags, fd, off):
        if flags & MAP_FIXED or (flags & MAP_SHARED and prot & 2 and not flags & MAP_ANONYMOUS):
            self._stop(f"mmap flags {flags:#x} prot {prot:#x} are not modelled here")
            return None
        if length == 0 or off % PAGE or (flags & 3) not in (MAP_SHARED, MAP_PRIVATE):
            return -errno.EINVAL
        size = page_up(length)
        if size < length or self.mapped + size > self.mem_limit:
            return -errno.ENOMEM
        content = b""
        if not flags & MAP_ANONYMOUS:
            f = self._file(fd)
            if f is None or f.stdio:
                return -errno.EBADF if f is None else -errno.ENODEV
            if not f.readable:
                return -errno.EACCES
            content = bytes(f.data[off:off + length])
        base = self.next_map
        self.next_map += size + PAGE                 # an unmapped gap after every mapping
        present = size if flags & MAP_ANONYMOUS else min(size, page_up(len(content)))
        uc_prot = ((UC_PROT_READ if prot & 1 else 0) | (UC_PROT_WRITE if prot & 2 else 0)
                   | (UC_PROT_EXEC if prot & 4 else 0))
        if present:
            self.uc.mem_map(base, present, uc_prot)
            self.uc.mem_write(base, content)
        self.mapped += size
        return base

    def _mapped_parts(self, addr: int, length: int):
        end = addr + page_up(length)
        for lo, hi, _ in list(self.uc.mem_regions()):
            a, b = max(lo, addr), min(hi + 1, end)
            if a < b and lo >= MMAP_BASE:
                yield a, b

    def sys_munmap(self, addr, length, *_):
        if addr % PAGE or length == 0:
            return -errno.EINVAL
        for a, b in self._mapped_parts(addr, length):
            self.uc.mem_unmap(a, b - a)
            self.mapped -= b - a
        return 0

    def sys_mprotect(self, addr, length, prot, *_):
        if addr % PAGE:
            return -errno.EINVAL
        uc_prot = ((UC_PROT_READ if prot & 1 else 0) | (UC_PROT_WRITE if prot & 2 else 0)
                   | (UC_PROT_EXEC if prot & 4 else 0))
        parts = list(self._mapped_parts(addr, length))
        if sum(b - a for a, b in parts) != page_up(length):
            return -errno.ENOMEM
        for a, b in parts:
            self.uc.mem_protect(a, b - a, uc_prot)
        return 0

    def sys_madvise(self, addr, length, advice, *_):
        if addr % PAGE:
            return -errno.EINVAL
        self.advice.append((addr, length, advice))     # advice only: nothing to emulate
        return 0

    def sys_rt_sigprocmask(self, how, new, old, setsize, *_):
        if setsize != SIGSET_SIZE or how > 2:
            return -errno.EINVAL
        if old:
            if not self._accessible(old, SIGSET_SIZE, UC_PROT_WRITE):
                return -errno.EFAULT
            self.uc.mem_write(old, self.sigmask.to_bytes(SIGSET_SIZE, "little"))
        if new:
            raw = self._read_guest(new, SIGSET_SIZE)
            if raw is None:
                return -errno.EFAULT
            bits = int.from_bytes(raw, "little")
            self.sigmask = (self.sigmask | bits if how == 0 else
                            self.sigmask & ~bits if how == 1 else bits)
        return 0

    def sys_sched_getaffinity(self, pid, size, mask, *_):
        """The emulated process may run on CPU 0 only (the engine then starts no thread)."""
        if pid != 0 or size < 8 or size % 8:
            return -errno.EINVAL
        if not self._accessible(mask, 8, UC_PROT_WRITE):
            return -errno.EFAULT
        self.uc.mem_write(mask, (1).to_bytes(8, "little"))
        return 8

    def sys_exit_group(self, status, *_):
        self.status = status & 0xFF
        self.uc.emu_stop()
        return None

    sys_exit = sys_exit_group


SYSCALL_NAMES = {0: "read", 1: "write", 2: "open", 3: "close", 5: "fstat", 8: "lseek",
                 9: "mmap", 10: "mprotect", 11: "munmap", 14: "rt_sigprocmask", 28: "madvise",
                 60: "exit",
                 204: "sched_getaffinity", 231: "exit_group", 257: "openat"}


def run_program(image: Image, argv: list[str], files: dict[str, bytes] | None = None,
                stdin: bytes = b"", fail_writes: dict[int, int] | None = None,
                timeout: float = 60.0, mem_limit: int = DEFAULT_MEM_LIMIT,
                count: bool = False) -> ProgramResult:
    """Run `image` as a process with `argv` (argv[0] included); see the module docstring."""
    proc = _Process(image, dict(files or {}), stdin, dict(fail_writes or {}), mem_limit)
    if count:
        proc.count_instructions()
    proc.start(argv, timeout)
    return ProgramResult(proc.status, bytes(proc.out[1]), bytes(proc.out[2]),
                         {p: bytes(d) for p, d in proc.written.items()}, proc.log, proc.advice,
                         proc.instructions)
