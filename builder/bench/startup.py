"""The start-up cost of the packed ./gemma, for `python -m builder bench`: what unpacking costs
on every run, as the packed program's wall time less its image's (BINARY.elf, written beside
it by every build; the same engine unpacked, which runs too) on the same command line.

`measure([(packed, tiny), ...], extra) -> [Startup, ...]` times two command lines: `-h`
(usage, then exit: start-up alone) and a one-token run of the tiny preset's model (`-m MODEL
-p Hello -n 1 --temp 0` and the bench's --engine-args, with the engine's default thread count,
as users run it: start-up, mapping the model, one forward pass). For each, the two programs
run alternately, packed, image, packed, image, ... (so drift in the machine's load hits both
alike; with a second packed program, bench --compare's B, its pair runs after the first's in
every round), each run's wall time taken from spawn to exit (posix_spawn, output to
/dev/null; the spawning costs both programs the same). The cost is the difference of the two medians: the median ignores the runs
another process delayed, as long as those are under half, and is stable where a minimum is
not (one lucky run sets a minimum). Its ± is the difference's standard error: each median's
1.2533 s / sqrt(n), with s estimated from the interquartile range (s = IQR / 1.349, robust to
those delayed runs), combined in quadrature.

RUNS: 200 pairs of `-h` and 50 pairs of one-token runs: under 2 s on a 2-CPU machine (a `-h`
run takes ~0.3 ms unpacked and ~3 ms packed there, a one-token run ~0.5 ms more). Six
measurements in a row on that machine, busy with other work, gave ± 0.01-0.06 ms for `-h` and
0.02-0.6 ms for the one-token run, while the cost itself ranged over 2.1-3.1 ms (4.6 ms a few
minutes before, at a load average of 9): unpacking is arithmetic, so its cost follows the CPU
time the machine leaves it, which more runs of the same minute do not average out. So the
counts are kept small enough for every bench run to include the block, and the report shows
the load average beside it.
"""
from __future__ import annotations

import math
import os
import shlex
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from builder.bench.report import Startup, StartupRow
from builder.bench.run import Run, checked

HELP, ONE_TOKEN = "-h", "one token (tiny)"
RUNS = {HELP: 200, ONE_TOKEN: 50}  # pairs of runs (see the module docstring)
PROMPT = "Hello"


def image_of(binary: Path) -> Path:
    """Where a build puts the image of the packed program `binary`: BINARY.elf beside it."""
    return binary.with_name(binary.name + ".elf")


def _wall(argv: list[str], err) -> float:
    """Seconds from spawning argv to its exit (stdout to /dev/null, stderr to the file err);
    BenchError with its error line when it fails."""
    err.seek(0)
    err.truncate()
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=quiet)
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - t0
    err.seek(0)
    checked(Run(argv, os.waitstatus_to_exitcode(status), seconds, err.read().decode(errors="replace"),
                0, 0, 0), f"the start-up run {shlex.join(argv)}")
    return seconds


def _median_error(xs: list[float]) -> float:
    """The standard error of the median of xs, from their interquartile range."""
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(xs))


def measure(programs: list[tuple[Path, Callable[[], Path]]], extra: list[str]) -> list[Startup]:
    """Time each packed program against its image on each command line (see the module
    docstring), one Startup per program: with several (bench --compare: the engine and B),
    every round runs each of them and its image in turn, so that drift in the machine's load
    hits all alike and their costs compare. Each program's tiny() gives the tiny model it
    reads (made when missing). A program with no image beside it is not run: its rows n/a,
    with the reason."""
    timed = [(i, packed, image_of(packed), tiny) for i, (packed, tiny) in enumerate(programs)
             if image_of(packed).is_file()]              # (by index: B may be the engine itself)
    commands = {i: {HELP: ["-h"], ONE_TOKEN: ["-m", str(tiny()), "-p", PROMPT, "-n", "1", "--temp", "0", *extra]}
                for i, _, _, tiny in timed}
    rows: dict[int, list[StartupRow]] = {i: [] for i, _, _, _ in timed}
    with tempfile.TemporaryFile() as err, \
            tqdm(total=2 * len(timed) * sum(RUNS.values()), desc="start-up runs", leave=False) as bar:
        for what in RUNS:
            times: dict[tuple[int, Path], list[float]] = {(i, p): [] for i, packed, image, _ in timed
                                                          for p in (packed, image)}
            for _ in range(RUNS[what]):
                for i, packed, image, _ in timed:
                    for program in (packed, image):
                        times[i, program].append(_wall([str(program), *commands[i][what]], err))
                        bar.update()
            for i, packed, image, _ in timed:
                a, b = (1e3 * statistics.median(times[i, p]) for p in (packed, image))
                error = 1e3 * math.hypot(_median_error(times[i, packed]), _median_error(times[i, image]))
                rows[i].append(StartupRow(what, shlex.join(commands[i][what]), RUNS[what], a, b, a - b, error))
    return [Startup(str(packed), str(image_of(packed)), "", rows[i]) if i in rows else
            Startup(str(packed), "", f"no image {image_of(packed)} beside the engine (a build writes one)",
                    [StartupRow(what, "", 0, None, None, None, None) for what in RUNS])
            for i, (packed, _) in enumerate(programs)]
