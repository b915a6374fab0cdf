"""Run a child process for `python -m builder bench` and record what it cost.

`run(argv, row_bytes=...)` starts the program with stdout discarded (or kept: capture=True),
waits for it, and samples /proc/PID/status every 10 ms meanwhile: VmHWM (the peak resident set
size of the child's own address space, mapped file pages included) and RssAnon (its anonymous
memory: heap, KV cache, scratch, as opposed to the mapped model file). The wait4 rusage is not
used for memory: for a child started by vfork+exec its ru_maxrss starts from the parent's
resident size (the kernel records the old address space's peak at exec), which here would be
this Python process. wait4 does give its major page faults: pages it had to wait for the disk
for (non-zero when the model file was not in the page cache). When
`row_bytes` is given, passes a FIFO in place of the file name `{logits}` in argv and stamps the
arrival time of every complete `row_bytes` record written to it (the engine's `--logits`: one
float32 row per evaluated position). The pipe is sized to one row, so a stamp is never late by
more than the time the writer takes for one row plus this reader's wake-up (tens of µs). All times are seconds since the child was started.
`checked(run, what)` turns a failed run into a BenchError, the bench's one-line error.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), absent from older Pythons' fcntl
POLL_SECONDS = 0.01


class BenchError(Exception):
    """A failure worth one line: missing binary, failed model synthesis, engine error..."""


@dataclass
class Run:
    """What one child process did."""

    argv: list[str]
    returncode: int
    seconds: float  # wall time from spawn to exit
    stderr: str
    peak_rss: int  # bytes, last VmHWM seen (0 if it ended before a sample)
    peak_anon: int  # bytes, largest RssAnon seen
    major_faults: int  # page faults that read from disk
    rows: list[float] = field(default_factory=list)  # arrival time of each complete row
    stdout: bytes = b""  # only when run(..., capture=True)

    def error_line(self) -> str:
        """How the child ended: its last stderr line after an error exit; a crash (a signal)
        is named as one, with that line."""
        lines = self.stderr.strip().splitlines()
        if self.returncode < 0:
            crash = f"crashed: killed by signal {-self.returncode}"
            with contextlib.suppress(ValueError):
                crash += f" ({signal.Signals(-self.returncode).name})"
            return crash + (f"; its last words: {lines[-1]}" if lines else "")
        return lines[-1] if lines else f"exit status {self.returncode}"


def _memory(pid: int) -> tuple[int, int]:
    """(VmHWM, RssAnon) of a live process in bytes; zeros once it has exited."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon"):
                found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found.get("VmHWM", 0), found.get("RssAnon", 0)


class _RowReader(threading.Thread):
    """Reads a FIFO to its end, stamping each completed `row_bytes` record.

    The read end is opened (non-blocking, so no writer is needed yet) and the pipe sized to
    one row before the child starts, so the writer can never be more than one row ahead of
    the stamps. poll() waits for the first writer: a FIFO that never had one does not report
    end-of-file, so `release` connects and disconnects a writer if the child never did.
    """

    def __init__(self, path: Path, row_bytes: int, t0: float):
        super().__init__(daemon=True)
        self.path, self.row_bytes, self.t0 = path, row_bytes, t0
        self.rows: list[float] = []
        self.total = 0
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(self.fd, F_SETPIPE_SZ, row_bytes)
        except OSError:
            pass  # larger than /proc/sys/fs/pipe-max-size: the default 64 KB pipe

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while True:
                poller.poll()
                try:
                    chunk = os.read(self.fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    return
                self.total += len(chunk)
                now = time.perf_counter() - self.t0
                self.rows += [now] * (self.total // self.row_bytes - len(self.rows))
        finally:
            os.close(self.fd)

    def release(self) -> None:
        """After the child has exited: make sure the reader sees end-of-file."""
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: the reader has already closed its end
                raise


def run(argv: list[str], row_bytes: int | None = None, capture: bool = False) -> Run:
    """Run argv to its end; see the module docstring. capture: keep stdout (else discarded)."""
    with tempfile.TemporaryDirectory(prefix="gemma-bench-") as tmp, \
            tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        fifo = Path(tmp) / "logits"
        if row_bytes:
            os.mkfifo(fifo)
            argv = [str(fifo) if a == "{logits}" else a for a in argv]
        reader = _RowReader(fifo, row_bytes, time.perf_counter()) if row_bytes else None
        if reader:
            reader.start()
        t0 = reader.t0 if reader else time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=err,
                                stdout=out if capture else subprocess.DEVNULL)
        peak = [0, 0]
        done = threading.Event()

        def sample() -> None:
            while True:
                peak[:] = map(max, peak, _memory(proc.pid))
                if done.wait(POLL_SECONDS):
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if reader:
            reader.release()
            reader.join()
        err.seek(0)
        out.seek(0)
        return Run(argv, proc.returncode, seconds, err.read().decode(errors="replace"),
                   peak[0], peak[1], usage.ru_majflt, reader.rows if reader else [], out.read())


def checked(r: Run, what: str) -> Run:
    """r, or BenchError("WHAT failed: its error line") when it did not exit with status 0."""
    if r.returncode != 0:
        raise BenchError(f"{what} failed: {r.error_line()}")
    return r
