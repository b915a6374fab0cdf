"""This machine's memory read bandwidth, FMA peak and the engine's kernels' speed in cache
(decode and prompt calls), measured natively, for `python -m builder bench`.

`bandwidths(thread_counts, size, files)` measures the read ceiling: the best GB/s (10^9 bytes
per second), per thread count, of several read-only vector loops over a buffer of `size`
bytes (much larger than the caches; the benchmark uses 2 GiB) and over each file given (the
model files, mapped as the engines map them). One sequential stream per thread is not the
ceiling on every host (engines that read a few rows at once, or whose hardware prefetchers
keep more lines in flight, beat it), so the loops are 16- and 32-byte loads (SSE2, AVX2) in 1,
2 and 4 concurrent streams per thread, and the best of them all counts. With N threads the
memory is cut into N contiguous slices and each thread reads its own slice, all started
together (see below); bandwidth = total bytes read / the time from that start to the last
thread's end.

`fma_peaks(thread_counts, level)` runs, on N threads at once, a loop of ten independent
vfmadd231ps chains in the vectors of a kernel level (builder.bench.level): ymm for "avx2", zmm
for "avx512" (register operands only: keystone encodes register-only EVEX correctly, its EVEX
memory displacements wrongly). Ten chains are more than FMA latency x FMA pipes on any x86
CPU, so the pipes never wait. It returns the best GFLOP/s over a few trials (one FMA on 8
floats = 16 FLOPs, on 16 = 32): the arithmetic ceiling of that level's kernels at the clock
the cores actually run, which on a shared or turbo-boosting machine is not the clock
/proc/cpuinfo reports. (A CPU that splits a zmm FMA in two 256-bit halves, as AMD Zen 4 does,
gives about the AVX2 peak: the loop measures, it assumes nothing.) Empty when the CPU lacks
the level's flags (level.NEEDS).

`kernel_speeds(binary, level, wtypes, thread_counts)` runs the engine's own decode kernel of
that level for each weight type (level.KERNELS: matmul_f16_avx2 and matmul_q8_avx2, or the
_avx512 ones; the very bytes of the built ./gemma, one token, as decode calls it) on N threads
at once, each over its own 128 KB matrix of 2,048 columns (Gemma-2B's width), which stays in
the core's own cache, and returns the best GB/s of weights consumed: the kernel's arithmetic
ceiling. Decode cannot read weights from memory faster than its kernel consumes them from the
cache, so where that speed is below the read ceiling, the arithmetic, not the memory, bounds
decode. With `prompt=True` it calls the same kernels as a prompt block does: the tokens a call
takes at that level (level.PROMPT_TOKENS) over a chunk of PROMPT_ROWS rows (as
asm/threads.asm's MM_CHUNK) of 2,048 columns, again in the core's cache, and returns the best
GFLOP/s (2 per weight and token): the prompt's arithmetic ceiling, to set against the FMA peak.
Every buffer starts on a 64-byte boundary, as the engine's do (a zmm load across two cache
lines costs the AVX-512 prompt kernel ~1.3x).

The loops are machine code (eight aligned loads per iteration), assembled with keystone,
checked instruction by instruction with capstone (keystone is untrusted, see docs/build.md),
copied into an executable mapping and called through ctypes, which releases the GIL, so the
threads run in parallel. N threads start together at a native gate (_together): each counts
itself in and spins until all are in, then reads CLOCK_MONOTONIC before and after its loop, so
the time measured excludes the milliseconds Python threads take to enter ctypes one by one.
The buffer is written before it is read: untouched anonymous pages would all map the one
shared zero page and the loop would measure the cache instead of memory.
"""
from __future__ import annotations

import ctypes
import functools
import json
import mmap
import threading
from dataclasses import dataclass
from pathlib import Path

import capstone
import keystone
import numpy as np
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from builder.bench.level import KERNELS, NEEDS, PROMPT_TOKENS
from builder.models.modelfile import Q8_0_BLOCK, QK8_0, quantize_q8_0

UNROLL = 8  # loads per loop iteration
READ_WIDTHS = (16, 32)  # bytes per load: SSE2, AVX2 (no 512-bit loop: keystone mis-encodes
#                         EVEX displacements, docs/build.md)
STREAMS = (1, 2, 4)  # concurrent sequential streams per thread
FMA_CHAINS = 10  # independent FMAs per loop iteration
# per level: the FMA loop's register, the instruction that zeroes one (EVEX vxorps is
# AVX-512DQ, vpxord AVX-512F), its float32 lanes
FMA_VECTOR = {"avx2": ("ymm", "vxorps", 8), "avx512": ("zmm", "vpxord", 16)}
KERNEL_COLS = 2048  # columns of kernel_speeds' matrix
KERNEL_BYTES = 128 << 10  # its weights' bytes at most: inside any x86 core's own L2 cache
PROMPT_ROWS = 96  # the prompt kernel's rows: a chunk of asm/threads.asm (MM_CHUNK); 384 KB in FP16
ALIGN = 64  # every buffer's alignment (a cache line)


@dataclass(frozen=True)
class ReadLoop:
    """An assembled read loop: `fn(ptr, bytes, passes)` reads `streams` runs of `bytes` bytes
    (a multiple of `step`) one after another in memory, all advancing together."""

    fn: ctypes._CFuncPtr
    step: int
    width: int
    code: mmap.mmap  # keeps the executable mapping alive while fn is used
    streams: int = 1

    @property
    def name(self) -> str:
        return f"{8 * self.width}-bit x{self.streams}"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags /proc/cpuinfo lists for the first CPU (the tests' harness asks too)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _source(width: int, streams: int = 1) -> list[str]:
    """The read loop in capstone's canonical spelling (so disassembly can be compared to it):
    UNROLL loads per iteration, UNROLL / streams consecutive ones from each stream; stream j
    starts j x (bytes per stream) after the first (r8 = that stride, r9 = three of it)."""
    reg, size, mov = ("ymm", "ymmword", "vmovdqa") if width == 32 else ("xmm", "xmmword", "movdqa")
    base = ["rax", "rax + r8", "rax + r8*2", "rax + r9"][:streams]
    per = UNROLL // streams
    loads = [f"{mov} {reg}{i}, {size} ptr [{base[i // per]}{f' + {hex(i % per * width)}' if i % per else ''}]"
             for i in range(UNROLL)]
    step = hex(per * width)
    # rdi = buffer, rsi = bytes per stream and pass, rdx = passes (SysV leaf; clobbers rax rcx
    # rdx r8 r9).
    setup = ["mov r8, rsi", "lea r9, [rsi + rsi*2]"] if streams > 1 else []
    return setup + ["outer:", "mov rax, rdi", "mov rcx, rsi", "inner:", *loads, f"add rax, {step}",
                    f"sub rcx, {step}", "jne inner", "dec rdx", "jne outer"] + \
        (["vzeroupper"] if width == 32 else []) + ["ret"]


def _fma_source(level: str) -> list[str]:
    """FMA_CHAINS chains of vfmadd231ps on zeros (no denormals, no NaNs) in the level's
    registers (FMA_VECTOR; registers only); rdi = iterations."""
    reg, zero, _ = FMA_VECTOR[level]
    chains = range(FMA_CHAINS)
    return ([f"{zero} {reg}{i}, {reg}{i}, {reg}{i}" for i in (*chains, 14, 15)] + ["top:"]
            + [f"vfmadd231ps {reg}{i}, {reg}14, {reg}15" for i in chains]
            + ["dec rdi", "jne top", "vzeroupper", "ret"])


def _kernel_caller_source() -> list[str]:
    """Call a kernel rsi times (rdi: its arguments: kernel, xout, x, W, then n and d as dwords,
    ostride, k) as the engine does: k and ostride on the stack, accumulate 0; rsp is 0 mod 16
    at every call instruction (SysV; r13 is pushed for that). Kernels keep rbx and r12 (they are
    SysV leaf functions)."""
    return ["push rbx", "push r12", "push r13", "mov rbx, rdi", "mov r12, rsi", "top:",
            "push qword ptr [rbx + 0x28]", "push qword ptr [rbx + 0x30]", "mov rdi, qword ptr [rbx + 8]",
            "mov rsi, qword ptr [rbx + 0x10]", "mov rdx, qword ptr [rbx + 0x18]",
            "mov ecx, dword ptr [rbx + 0x20]", "mov r8d, dword ptr [rbx + 0x24]", "xor r9d, r9d",
            "call qword ptr [rbx]", "add rsp, 0x10", "dec r12", "jne top", "pop r13", "pop r12",
            "pop rbx", "ret"]


def assemble(lines: list[str], what: str) -> bytes:
    """Assemble `lines` (labels end in ':') and verify every instruction with capstone."""
    code = bytes(keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64).asm("\n".join(lines))[0])
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    insns = list(md.disasm(code, 0))
    wanted = [ln for ln in lines if not ln.endswith(":")]
    labels, k = {}, 0
    for ln in lines:
        if ln.endswith(":"):
            labels[ln[:-1]] = insns[k].address if k < len(insns) else None
        else:
            k += 1
    if len(insns) != len(wanted) or sum(i.size for i in insns) != len(code):
        raise RuntimeError(f"{what}: keystone output does not disassemble to the source")
    for insn, want in zip(insns, wanted):
        mnemonic, _, operand = want.partition(" ")
        if operand in labels:
            operand = hex(labels[operand]) if labels[operand] > 9 else str(labels[operand])
        got = f"{insn.mnemonic} {insn.op_str}".strip()
        if got != f"{mnemonic} {operand}".strip():
            raise RuntimeError(f"{what}: keystone gave {got!r} for {want!r}")
    return code


def _executable(code: bytes) -> tuple[mmap.mmap, int]:
    """`code` copied into a fresh executable mapping: the mapping (keep it alive) and its address."""
    mem = mmap.mmap(-1, len(code), prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    mem.write(code)
    return mem, ctypes.addressof(ctypes.c_char.from_buffer(mem))


def _callable(code: bytes, proto) -> tuple[ctypes._CFuncPtr, mmap.mmap]:
    """`code` in an executable mapping, as a ctypes function (keep the mapping alive)."""
    mem, address = _executable(code)
    return proto(address), mem


def read_loops() -> list[ReadLoop]:
    """Every read loop this CPU runs (READ_WIDTHS x STREAMS), in executable memory, callable
    from ctypes."""
    widths = [w for w in READ_WIDTHS if w == 16 or "avx2" in cpu_flags()]
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    out = []
    for width in widths:
        for streams in STREAMS:
            fn, mem = _callable(assemble(_source(width, streams), "bandwidth loop"), proto)
            out.append(ReadLoop(fn, UNROLL // streams * width, width, mem, streams))
    return out


def _gate_source() -> list[str]:
    """The start gate. rdi -> nine qwords: fn, a0, a1, a2, the address of the shared dword
    counter, then two struct timespecs (start, end) it fills. It counts this thread in (lock
    dec), spins until every thread is in (the counter at 0), reads CLOCK_MONOTONIC, calls
    fn(a0, a1, a2), reads it again. rsp is 0 mod 16 at the call (rbx pushed); the callees keep
    rbx (SysV)."""
    stamp = ["mov eax, 0xe4", "mov edi, 1", "syscall"]  # clock_gettime(CLOCK_MONOTONIC, rsi)
    return ["push rbx", "mov rbx, rdi", "mov rax, qword ptr [rbx + 0x20]", "lock dec dword ptr [rax]",
            "spin:", "pause", "cmp dword ptr [rax], 0", "jne spin",
            "lea rsi, [rbx + 0x28]", *stamp,
            "mov rdi, qword ptr [rbx + 8]", "mov rsi, qword ptr [rbx + 0x10]",
            "mov rdx, qword ptr [rbx + 0x18]", "call qword ptr [rbx]",
            "lea rsi, [rbx + 0x38]", *stamp, "pop rbx", "ret"]


@functools.lru_cache(maxsize=1)
def _gate() -> tuple[ctypes._CFuncPtr, mmap.mmap]:
    """The assembled start gate, callable (the mapping kept alive for the process)."""
    return _callable(assemble(_gate_source(), "start gate"), ctypes.CFUNCTYPE(None, ctypes.c_void_p))


def _address(fn: ctypes._CFuncPtr) -> int:
    """The machine address a ctypes function calls."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def _together(threads: int, job) -> float:
    """Seconds from the common start of `threads` threads until the last of them has run its
    call: job(k) = (address, a0, a1, a2) of thread k's SysV function and its arguments. The
    threads meet in native code (the start gate: a Python barrier would release them a few
    milliseconds apart, as each in turn takes the GIL to enter ctypes) and each reads the
    clock there, before and after its call: the span is the latest end less the earliest
    start."""
    gate = _gate()[0]
    counter = np.array([threads], np.int32)
    blocks = [np.array([*job(k), counter.ctypes.data, 0, 0, 0, 0], np.uint64) for k in range(threads)]
    pool = [threading.Thread(target=gate, args=(b.ctypes.data,)) for b in blocks]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    start = min(int(b[5]) * 10**9 + int(b[6]) for b in blocks)
    end = max(int(b[7]) * 10**9 + int(b[8]) for b in blocks)
    return (end - start) / 1e9


def fma_peaks(thread_counts: list[int], level: str, iterations: int = 50_000_000,
              trials: int = 3) -> dict[int, float]:
    """Best GFLOP/s of the FMA loop in the vectors of `level` ("avx2" or "avx512") on each
    thread count ({} when this CPU lacks the level's flags)."""
    if not NEEDS[level] <= cpu_flags():
        return {}
    mem, address = _executable(assemble(_fma_source(level), "FMA loop"))
    try:
        flops = iterations * FMA_CHAINS * 2 * FMA_VECTOR[level][2]
        return {t: max(t * flops / _together(t, lambda k: (address, iterations, 0, 0)) / 1e9
                       for _ in range(trials)) for t in thread_counts}
    finally:
        mem.close()


def _aligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` that starts on an ALIGN-byte boundary."""
    raw = np.empty(a.nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _kernel_matrix(wtype: str, rng: np.random.Generator, rows: int = 0) -> tuple[np.ndarray, int]:
    """A random matrix of KERNEL_COLS columns and `rows` rows, or (0) the most rows (an even
    number: decode pairs rows) in KERNEL_BYTES, in the weight type's layout (FP16 rows, or Q8_0
    blocks from the project's quantizer), and its rows."""
    row_bytes = 2 * KERNEL_COLS if wtype == "f16" else KERNEL_COLS // QK8_0 * Q8_0_BLOCK
    rows = rows or KERNEL_BYTES // row_bytes // 2 * 2
    w = rng.standard_normal((rows, KERNEL_COLS), np.float32) * np.float32(0.02)
    return _aligned(w.astype(np.float16) if wtype == "f16" else quantize_q8_0(w)), rows


@dataclass
class KernelJob:
    """One thread's work in kernel_speeds: a matrix `w` (rows x KERNEL_COLS), `x` (tokens x
    KERNEL_COLS), `xout` (tokens x rows), and the argument block of the caller loop
    (_kernel_caller_source)."""
    w: np.ndarray
    x: np.ndarray
    xout: np.ndarray
    args: np.ndarray


class Kernels:
    """The kernels of one level (KERNELS[level]) of a built ./gemma, callable here:
    the executable segment of its image (BINARY.elf, which build.py writes beside the packed
    program) copied into an executable mapping (kernels hold no absolute address, so they run
    anywhere), the kernels found through the image's symbol map (BINARY.map.json); `address`
    holds those the map has, by weight type. Raises OSError, ValueError or ELFError when the
    image or its map cannot be read."""

    def __init__(self, binary: Path, level: str):
        symbols = json.loads(binary.with_name(binary.name + ".map.json").read_text())
        with open(binary.with_name(binary.name + ".elf"), "rb") as f:
            text = next((s for s in ELFFile(f).iter_segments()
                         if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1), None)
            if text is None:
                raise ValueError(f"{binary}: no executable segment")
            code, base = text.data(), text["p_vaddr"]
        self.image, here = _executable(code)
        self.address = {w: here + symbols[k]["address"] - base for w, k in KERNELS[level].items()
                        if k in symbols and 0 <= symbols[k]["address"] - base < len(code)}
        self.call, self.mem = _callable(assemble(_kernel_caller_source(), "kernel caller"),
                                        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t))

    def job(self, wtype: str, rng: np.random.Generator, tokens: int = 1) -> KernelJob:
        """A decode call's work (one token), or a prompt call's (`tokens` > 1, PROMPT_ROWS)."""
        w, rows = _kernel_matrix(wtype, rng, PROMPT_ROWS if tokens > 1 else 0)
        x = _aligned(rng.standard_normal((tokens, KERNEL_COLS)).astype(np.float32))
        xout = _aligned(np.zeros((tokens, rows), np.float32))
        return KernelJob(w, x, xout, np.array([self.address[wtype], xout.ctypes.data, x.ctypes.data,
                                               w.ctypes.data, KERNEL_COLS | rows << 32, 4 * rows,
                                               tokens], np.uint64))

    def run(self, job: KernelJob, calls: int) -> None:
        """The kernel on job's matrix and x, `calls` times: job.xout[t] = W x[t]."""
        self.call(job.args.ctypes.data, calls)

    def gated(self, job: KernelJob, calls: int) -> tuple[int, int, int, int]:
        """run(job, calls) as _together wants it: (address, arguments)."""
        return _address(self.call), job.args.ctypes.data, calls, 0

    def close(self) -> None:
        del self.call
        self.mem.close()
        self.image.close()


def kernel_speeds(binary: Path, level: str, wtypes: list[str], thread_counts: list[int],
                  calls: int = 2000, trials: int = 5,
                  prompt: bool = False) -> dict[str, dict[int, float]]:
    """Best GB/s of weights that the engine's decode kernel of `level` (builder.bench.level)
    for each weight type consumes from the cache, per thread count; with `prompt`, the best
    GFLOP/s of its prompt calls (see the module docstring). {} at the baseline (its kernels are
    not measured), where this CPU lacks the level's flags, or when the binary or its symbol map
    cannot be read (Kernels); a type whose kernel is not in the map is left out."""
    if level == "baseline" or not NEEDS[level] <= cpu_flags():
        return {}
    try:
        kernels = Kernels(binary, level)
    except (OSError, ValueError, KeyError, ELFError):
        return {}
    rng = np.random.default_rng(0)
    try:
        out = {}
        for wtype in (w for w in wtypes if w in kernels.address):
            tokens = PROMPT_TOKENS[level][wtype] if prompt else 1
            jobs = [kernels.job(wtype, rng, tokens) for _ in range(max(thread_counts))]
            # a call's work: its weights' bytes, or 2 float operations per weight and token
            work = 2 * jobs[0].xout.size * KERNEL_COLS if prompt else jobs[0].w.nbytes
            out[wtype] = {t: max(t * work * calls / 1e9
                                 / _together(t, lambda k: kernels.gated(jobs[k], calls))
                                 for _ in range(trials)) for t in thread_counts}
        return out
    finally:
        kernels.close()


class Buffer:
    """`size` bytes of anonymous memory, every page written (so it is real RAM), in 2 MB
    pages where the kernel allows (MADV_HUGEPAGE), as the engine maps its model (in 4 KB
    pages the loop read up to 10% slower here)."""

    def __init__(self, size: int):
        self.mem = mmap.mmap(-1, size)
        try:
            self.mem.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no transparent huge pages in this kernel
            pass
        chunk = b"\x5a" * (1 << 20)
        for off in range(0, size, len(chunk)):
            self.mem[off:off + len(chunk)] = chunk[:size - off]
        self.size = size
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))

    def close(self) -> None:
        self.mem.close()


class MappedFile:
    """A file mapped read-only and shared with the page cache, in 2 MB pages where the kernel
    allows (MADV_HUGEPAGE), as ./gemma maps its model: reading it measures the very pages an
    engine streams."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            self.mem = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            self.mem.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        self.size = len(self.mem)
        self._view = np.frombuffer(self.mem, np.uint8)  # its address (ctypes wants writable buffers)
        self.addr = self._view.ctypes.data

    def close(self) -> None:
        del self._view
        self.mem.close()


def measure(loop: ReadLoop, buf: Buffer | MappedFile, threads: int, passes: int = 2,
            trials: int = 3) -> float:
    """Best read bandwidth in GB/s over `trials` of `passes` sweeps with `threads` threads,
    each reading its own contiguous slice of buf in loop.streams streams."""
    run = buf.size // threads // loop.streams // 4096 * 4096  # page-aligned, a multiple of step
    if run == 0:
        return 0.0
    slice_len, address = run * loop.streams, _address(loop.fn)
    return max(threads * slice_len * passes / 1e9
               / _together(threads, lambda k: (address, buf.addr + k * slice_len, run, passes))
               for _ in range(trials))


def bandwidths(thread_counts: list[int], size: int, files: list[Path] = ()) -> dict[int, tuple[float, str]]:
    """The read ceiling for each thread count: (GB/s, the loop that reached it), the best of
    every read loop (read_loops) over one buffer of `size` bytes (see Buffer) and over each
    of `files` (MappedFile: the model files themselves, one pass a trial, two trials)."""
    loops, buf = read_loops(), Buffer(size)
    maps = []
    try:
        maps = [MappedFile(f) for f in files]
        out = {}
        for t in thread_counts:
            runs = [(measure(loop, buf, t), f"{loop.name} buffer") for loop in loops]
            runs += [(measure(loop, m, t, passes=1, trials=2), f"{loop.name} file")
                     for loop in loops for m in maps]
            out[t] = max(runs)
        return out
    finally:
        for m in maps:
            m.close()
        buf.close()
