"""Runs fuzz Cases against the real binary, a few at a time, and judges every run.

`run(binary, model, cases, workdir, ...)` feeds the cases to a pool of `workers` processes;
each writes its case's model file (the base file with the case's edits), starts the binary
with the case's argv (placeholders filled in) under an address-space limit, with a per-case
timeout, and returns an Outcome. `judge(case, outcome)` lists what is wrong with it:
  - a hang (no exit within the timeout) or death by any signal;
  - an exit status other than 0, 1 or 2;
  - a refusal whose stderr is not exactly one line "gemma: ...\\n", or that wrote to stdout;
  - a success with anything on stderr, or of an input the contract says is invalid.
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

from .mutate import DIR, EMPTY, LOGITS, MODEL, NOFILE, Case

ADDRESS_SPACE = 4 << 30     # per run: a runaway allocation fails (ENOMEM) instead of the box
KEEP = 600                  # bytes of stdout/stderr kept for reports


@dataclass
class Outcome:
    status: int | None          # exit status, -N for death by signal N, None for a timeout
    stdout: bytes
    stderr: bytes
    seconds: float


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
    out = []
    if o.status not in (0, 1, 2):
        out.append(f"exit status {o.status}")
    if o.status == 0:
        if case.reject:
            out.append("accepted an input the contract says is invalid")
        if o.stderr:
            out.append("exit 0 with output on stderr")
    else:
        if case.stdout != "closed" and not (o.stderr.startswith(b"gemma: ")
                                            and o.stderr.endswith(b"\n")
                                            and o.stderr.count(b"\n") == 1):
            out.append("refusal is not exactly one 'gemma: ...' line on stderr")
        if case.stdout == "pipe" and o.stdout:
            out.append("refusal wrote to stdout")
    return out


# -- worker process ------------------------------------------------------------------------
_W: dict = {}


def _init(binary: str, model: str, root: str) -> None:
    wdir = Path(root) / f"w{os.getpid()}"
    (wdir / "dir").mkdir(parents=True, exist_ok=True)
    (wdir / "empty").write_bytes(b"")
    _W.update(binary=binary, model=model, base=Path(model).read_bytes(), wdir=wdir, subs={
        MODEL: b"", LOGITS: bytes(wdir / "logits.bin"), NOFILE: bytes(wdir / "nofile"),
        EMPTY: bytes(wdir / "empty"), DIR: bytes(wdir / "dir")})


def materialize(base: bytes, case: Case) -> bytes:
    """The case's model file: the base bytes with its edits, cut or zero-extended to its size."""
    data = bytearray(base)
    for off, raw in case.edits:
        data[off:off + len(raw)] = raw
    if case.size is not None:
        data = data[:case.size] + bytes(max(0, case.size - len(data)))
    return bytes(data)


def _limits(close_stdout: bool):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if close_stdout:
            os.close(1)
    return apply


def run_one(case: Case, timeout: float) -> Outcome:
    """Run one case in this (worker) process."""
    model = _W["model"]
    if case.edits or case.size is not None:
        path = _W["wdir"] / "case.bin"
        path.write_bytes(materialize(_W["base"], case))
        model = str(path)
    subs = {**_W["subs"], MODEL: os.fsencode(model)}
    argv = [os.fsencode(_W["binary"])]
    for a in case.argv:
        for k, v in subs.items():
            a = a.replace(k, v)
        argv.append(a)
    stdout = open("/dev/full", "wb") if case.stdout == "full" else subprocess.PIPE
    t = time.monotonic()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
                           timeout=timeout, preexec_fn=_limits(case.stdout == "closed"))
        o = Outcome(p.returncode, (p.stdout or b"")[:KEEP], p.stderr[:KEEP], 0.0)
    except subprocess.TimeoutExpired as e:
        o = Outcome(None, (e.stdout or b"")[:KEEP], (e.stderr or b"")[:KEEP], 0.0)
    finally:
        if stdout is not subprocess.PIPE:
            stdout.close()
    o.seconds = time.monotonic() - t
    return o


# -- driver --------------------------------------------------------------------------------
def run(binary: Path, model: Path, cases: list[Case], workdir: Path, workers: int = 2,
        timeout: float = 10.0, budget: float | None = None, progress=None) -> Report:
    """Run `cases` (in order, `workers` at a time) until done or `budget` seconds passed."""
    report, start = Report(), time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                initargs=(str(binary), str(model), str(workdir))) as pool:
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
                if progress:
                    progress(1)
    report.seconds = time.monotonic() - start
    report.failures.sort(key=lambda f: f.index)
    return report
