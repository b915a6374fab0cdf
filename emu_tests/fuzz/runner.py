"""Runs fuzz Cases against the real binary, a few at a time, and judges every run.

`run(binary, models, cases, workdir, ...)` feeds the cases to a pool of `workers` processes;
`models` maps each case's `model` name to a file. A worker writes the case's model file (that
file with the case's edits) when it has edits, starts the binary
with the case's argv (placeholders filled in) under an address-space limit, with a per-case
timeout, and returns an Outcome. `judge(case, outcome)` lists what is wrong with it:
  - a hang (no exit within the timeout) or death by any signal;
  - an exit status other than 0, 1 or 2, or other than the case's `status` when it has one;
  - a refusal whose stderr is not exactly one line "gemma: ...\\n", or that wrote to stdout;
  - a success with anything on stderr, or of an input the contract says is invalid;
  - a refusal of an input the case marks valid;
  - a change to the model file (checked when the case ran on its own copy);
  - an accepted case whose second run prints or writes anything else (reads of memory
    nothing wrote would show up so: addresses differ between runs), or hangs. The second run
    adds --avx2 where the argv names no kernel level: on an AVX-512 host it then runs the
    other fast level, which gives the same bits (docs/speed.md), so both are held.
Past `budget` seconds no new case is started; the Report says how many ran.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .model import read_prefix, write_case
from .mutate import DIR, EMPTY, FIFO, HARDLINK, LINK, LOGITS, LOOP, MODEL, NOFILE, Case

ADDRESS_SPACE = 8 << 30     # per run: room for the 5 GB sparse model's mapping; a runaway
                            # allocation fails (ENOMEM) instead of taking the box down
KEEP = 600                  # bytes of stdout/stderr kept for reports


@dataclass
class Outcome:
    status: int | None          # exit status, -N for death by signal N, None for a timeout
    stdout: bytes
    stderr: bytes
    seconds: float
    model_changed: bool = False
    differs: bool = False       # a second run of an accepted case printed or wrote otherwise
    second_hang: bool = False   # or did not exit within the timeout


@dataclass
class Failure:
    index: int
    case: Case
    outcome: Outcome
    problems: list[str]

    def __str__(self) -> str:
        o = self.outcome
        return (f"case {self.index}: {'; '.join(self.problems)}\n  recipe: {self.case.recipe()}\n"
                f"  status {o.status}, {o.seconds:.2f} s, stderr {o.stderr[:200]!r}, "
                f"stdout {o.stdout[:80]!r}")


@dataclass
class Report:
    ran: int = 0
    accepted: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    outcomes: dict[int, Outcome] = field(default_factory=dict)   # all of them, when kept

    def summary(self) -> str:
        rate = self.ran / self.seconds if self.seconds else 0.0
        return (f"{self.ran} cases in {self.seconds:.1f} s ({rate:.0f}/s), {self.accepted} "
                f"accepted, {self.ran - self.accepted} refused, {len(self.failures)} failures")


def judge(case: Case, o: Outcome, timeout: float) -> list[str]:
    """What is wrong with one run ([] when nothing is)."""
    if o.status is None:
        return [f"hang: no exit within {timeout:g} s"]
    if o.status < 0:
        return [f"killed by {signal.Signals(-o.status).name}"]
    out = ["the model file changed"] if o.model_changed else []
    if o.differs:
        out.append("a second run gave other output (stdout or --logits)")
    if o.second_hang:
        out.append(f"hang: the second run did not exit within {timeout:g} s")
    if o.status not in (0, 1, 2):
        out.append(f"exit status {o.status}")
    elif case.status is not None and o.status != case.status:
        out.append(f"exit status {o.status}, not {case.status}")
    if o.status == 0:
        if case.reject:
            out.append("accepted an input the contract says is invalid")
        if o.stderr:
            out.append("exit 0 with output on stderr")
    else:
        if case.accept:
            out.append("refused a valid input")
        if 2 not in case.closed and not (o.stderr.startswith(b"gemma: ")
                                         and o.stderr.endswith(b"\n")
                                         and o.stderr.count(b"\n") == 1):
            out.append("refusal is not exactly one 'gemma: ...' line on stderr")
        if case.stdout == "pipe" and 1 not in case.closed and o.stdout:
            out.append("refusal wrote to stdout")
    return out


# -- worker process ------------------------------------------------------------------------
_W: dict = {}


def _init(binary: str, models: dict[str, str], root: str, launcher: tuple[str, ...]) -> None:
    # the runs' default limits, inherited: a run then needs no code between fork and exec, so
    # subprocess can vfork (a fork and preexec_fn cost ~4 ms a run, most of the campaign's time)
    _limits((), ADDRESS_SPACE)()
    wdir = Path(root) / f"w{os.getpid()}"
    (wdir / "dir").mkdir(parents=True, exist_ok=True)
    (wdir / "empty").write_bytes(b"")
    os.mkfifo(wdir / "fifo")
    (wdir / "loop").symlink_to(wdir / "loop")
    _W.update(binary=binary, launcher=launcher, models=models, bases={}, wdir=wdir, subs={
        LOGITS: bytes(wdir / "logits.bin"), NOFILE: bytes(wdir / "nofile"),
        EMPTY: bytes(wdir / "empty"), DIR: bytes(wdir / "dir"), LINK: bytes(wdir / "link.bin"),
        HARDLINK: bytes(wdir / "hard.bin"), FIFO: bytes(wdir / "fifo"), LOOP: bytes(wdir / "loop")})


def _limits(closed: tuple[int, ...], memory: int):
    """What sets a run's limits and closes its descriptors (in the child, before exec)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        for fd in closed:
            os.close(fd)
    return apply


def run_one(case: Case, timeout: float) -> Outcome:
    """Run one case in this (worker) process."""
    model, wdir, written = _W["models"][case.model], _W["wdir"], None
    if case.edits or case.size is not None or case.private:
        if case.model not in _W["bases"]:
            _W["bases"][case.model] = read_prefix(Path(model))
        prefix, length = _W["bases"][case.model]
        path = wdir / "case.bin"
        path.unlink(missing_ok=True)            # a fresh inode: no run sees another's file
        write_case(path, prefix, length, case.edits, case.size)
        written = _fingerprint(path, len(prefix))
        model = str(path)
    for link in (wdir / "link.bin", wdir / "hard.bin"):
        link.unlink(missing_ok=True)
    (wdir / "link.bin").symlink_to(model)
    os.link(model, wdir / "hard.bin")
    subs = {MODEL: os.fsencode(model), **_W["subs"]}
    argv = [os.fsencode(a) for a in (*_W["launcher"], _W["binary"])]
    for a in case.argv:
        for k, v in subs.items():
            a = a.replace(k, v)
        argv.append(a)
    logits = wdir / "logits.bin"
    logits.unlink(missing_ok=True)
    o, out = _execute(argv, case, wdir, timeout)
    o.model_changed = written is not None and _fingerprint(Path(model), len(prefix)) != written
    if o.status == 0 and case.stdout == "pipe" and not case.closed:
        first = logits.read_bytes() if logits.exists() else None
        level = [] if {b"--avx2", b"--baseline"} & set(argv) else [b"--avx2"]
        again, out2 = _execute(argv + level, case, wdir, timeout)
        o.second_hang = again.status is None
        o.differs = not o.second_hang and (again.status, out2, logits.read_bytes()
                                           if logits.exists() else None) != (0, out, first)
    return o


def _execute(argv: list[bytes], case: Case, wdir: Path, timeout: float) -> tuple[Outcome, bytes]:
    """One run of the binary (in wdir, so relative paths land there): its Outcome and its
    whole stdout."""
    stdout = open("/dev/full", "wb") if case.stdout == "full" else subprocess.PIPE
    t = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                           timeout=timeout, cwd=wdir,
                           preexec_fn=(_limits(case.closed, case.memory or ADDRESS_SPACE)
                                       if case.closed or case.memory else None))
        out = p.stdout or b""
        o = Outcome(p.returncode, out[:KEEP], p.stderr[:KEEP], 0.0)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        o = Outcome(None, out[:KEEP], (e.stderr or b"")[:KEEP], 0.0)
    finally:
        if stdout is not subprocess.PIPE:
            stdout.close()
    o.seconds = time.monotonic() - t
    return o, out


def _fingerprint(path: Path, n: int) -> tuple:
    """What a write to a model file changes: size, mtime, its first n bytes (header, tables)."""
    st = path.stat()
    with open(path, "rb") as f:
        return st.st_size, st.st_mtime_ns, f.read(n)


# -- driver --------------------------------------------------------------------------------
def run(binary: Path, models: dict[str, Path], cases: list[Case], workdir: Path, workers: int = 2,
        timeout: float = 10.0, budget: float | None = None, keep: bool = False,
        launcher: tuple[str, ...] = ()) -> Report:
    """Run `cases` (in order, `workers` at a time) until done or `budget` seconds passed;
    `keep`: the report keeps every outcome, not only the failures'; `launcher`: a command
    the binary runs under (qemu-x86_64 -cpu Nehalem: the baseline instruction set)."""
    report, start = Report(), time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                initargs=(str(binary), {k: str(v) for k, v in models.items()},
                                          str(workdir), launcher)) as pool:
        pending: dict[cf.Future, int] = {}
        todo = iter(range(len(cases)))
        while True:
            while len(pending) < 4 * workers and (budget is None
                                                   or time.monotonic() - start < budget):
                i = next(todo, None)
                if i is None:
                    break
                pending[pool.submit(run_one, cases[i], timeout)] = i
            if not pending:
                break
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                o = fut.result()
                report.ran += 1
                report.accepted += o.status == 0
                problems = judge(cases[i], o, timeout)
                if problems:
                    report.failures.append(Failure(i, cases[i], o, problems))
                if keep:
                    report.outcomes[i] = o
    report.seconds = time.monotonic() - start
    report.failures.sort(key=lambda f: f.index)
    return report
