"""This machine's memory read bandwidth and AVX2 FMA peak, measured natively, for
`python -m builder bench`.

`bandwidths(thread_counts, size)` streams a buffer of `size` bytes (much larger than the caches;
the benchmark uses 2 GiB) through a read-only vector loop and returns, per thread count, the
best GB/s (10^9 bytes per second) over a few trials. With N threads the buffer is cut into N
contiguous slices and each thread reads its own slice, all started together from a barrier;
bandwidth = total bytes read / wall time from the barrier to the last thread's end.

`fma_peaks(thread_counts)` runs, on N threads at once, a loop of ten independent
vfmadd231ps ymm chains (more than FMA latency x FMA pipes on any x86 CPU, so the pipes never
wait) and returns the best GFLOP/s over a few trials (one FMA on 8 floats = 16 FLOPs): the
arithmetic ceiling of an AVX2 kernel at the clock the cores actually run, which on a shared
or turbo-boosting machine is not the clock /proc/cpuinfo reports. Empty without AVX2 and FMA.

The loops are machine code (eight aligned 32-byte loads per iteration, AVX2; 16-byte SSE2
loads when the CPU lacks AVX2), assembled with keystone, checked instruction by instruction
with capstone (keystone is untrusted, see docs/build.md), copied into an executable mapping and
called through ctypes, which releases the GIL, so the threads run in parallel. The buffer is
written before it is read: untouched anonymous pages would all map the one shared zero page
and the loop would measure the cache instead of memory.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import capstone
import keystone

UNROLL = 8  # loads per loop iteration
FMA_CHAINS = 10  # independent FMAs per loop iteration


@dataclass(frozen=True)
class ReadLoop:
    """An assembled read loop: `fn(ptr, bytes, passes)`; bytes a multiple of `step`."""

    fn: ctypes._CFuncPtr
    step: int
    width: int
    code: mmap.mmap  # keeps the executable mapping alive while fn is used


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags /proc/cpuinfo lists for the first CPU (the tests' harness asks too)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _source(width: int) -> list[str]:
    """The read loop in capstone's canonical spelling (so disassembly can be compared to it)."""
    reg, size, mov = ("ymm", "ymmword", "vmovdqa") if width == 32 else ("xmm", "xmmword", "movdqa")
    loads = [f"{mov} {reg}{i}, {size} ptr [rax{f' + {hex(i * width)}' if i else ''}]"
             for i in range(UNROLL)]
    step = hex(UNROLL * width)
    # rdi = buffer, rsi = bytes per pass, rdx = passes (SysV leaf; clobbers rax rcx rdx).
    return ["outer:", "mov rax, rdi", "mov rcx, rsi", "inner:", *loads, f"add rax, {step}",
            f"sub rcx, {step}", "jne inner", "dec rdx", "jne outer"] + \
           (["vzeroupper"] if width == 32 else []) + ["ret"]


def _fma_source() -> list[str]:
    """FMA_CHAINS chains of vfmadd231ps on zeros (no denormals, no NaNs); rdi = iterations."""
    chains = range(FMA_CHAINS)
    return ([f"vxorps ymm{i}, ymm{i}, ymm{i}" for i in (*chains, 14, 15)] + ["top:"]
            + [f"vfmadd231ps ymm{i}, ymm14, ymm15" for i in chains]
            + ["dec rdi", "jne top", "vzeroupper", "ret"])


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


def _callable(code: bytes, proto) -> tuple[ctypes._CFuncPtr, mmap.mmap]:
    """`code` in an executable mapping, as a ctypes function (keep the mapping alive)."""
    mem = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    mem.write(code)
    return proto(ctypes.addressof(ctypes.c_char.from_buffer(mem))), mem


def read_loop() -> ReadLoop:
    """The widest loop this CPU runs, in executable memory, callable from ctypes."""
    width = 32 if "avx2" in cpu_flags() else 16
    fn, mem = _callable(assemble(_source(width), "bandwidth loop"),
                        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t))
    return ReadLoop(fn, UNROLL * width, width, mem)


def _together(threads: int, job) -> float:
    """Seconds from a common start until the last of `threads` threads has run job(k)."""
    barrier = threading.Barrier(threads + 1)

    def worker(k: int) -> None:
        barrier.wait()
        job(k)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def fma_peaks(thread_counts: list[int], iterations: int = 50_000_000,
              trials: int = 3) -> dict[int, float]:
    """Best GFLOP/s of the FMA loop on each thread count ({} without AVX2 and FMA)."""
    if not {"avx2", "fma"} <= cpu_flags():
        return {}
    fn, mem = _callable(assemble(_fma_source(), "FMA loop"),
                        ctypes.CFUNCTYPE(None, ctypes.c_size_t))
    try:
        flops = iterations * FMA_CHAINS * 16
        return {t: max(t * flops / _together(t, lambda k: fn(iterations)) / 1e9
                       for _ in range(trials)) for t in thread_counts}
    finally:
        del fn
        mem.close()


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


def measure(loop: ReadLoop, buf: Buffer, threads: int, passes: int = 2, trials: int = 3) -> float:
    """Best read bandwidth in GB/s over `trials` of `passes` sweeps with `threads` threads."""
    slice_len = buf.size // threads // 4096 * 4096  # page-aligned slices, a multiple of step
    return max(threads * slice_len * passes / 1e9
               / _together(threads, lambda k: loop.fn(buf.addr + k * slice_len, slice_len,
                                                      passes))
               for _ in range(trials))


def bandwidths(thread_counts: list[int], size: int) -> dict[int, float]:
    """GB/s for each thread count, sharing one buffer of `size` bytes (see Buffer)."""
    loop, buf = read_loop(), Buffer(size)
    try:
        return {t: measure(loop, buf, t) for t in thread_counts}
    finally:
        buf.close()
