"""Record the SHA-256 digest of the `--logits` file of every case of cases.py into
logits_digests.json, so that test_logits_digests.py holds any later forward pass to these bits.

    python -m emu_tests.digests.record

When: once, on the engine whose forward pass was hard-coded (the 6,092-byte ./gemma of commit
8ad60f2, on version 2 files), before the interpreter of the op program replaced it; never
again, unless the arithmetic is meant to change (the commit then says why and which digests moved): recording again makes the
test hold whatever the engine computes now.

Needs a CPU with every level (AVX-512F, AVX2, FMA, F16C: nothing in the suite runs the whole
program's AVX-512 path on a CPU without it) and the `test` extra (the real model's package).
It builds ./gemma from asm/ and makes every model file in a temporary directory, as the tests
do. Each case runs REPEAT times at each thread count of cases.THREADS; differing digests there
stop it (the engine must be deterministic). Where every thread count gives a prompt the same
digest, as the engine promises, the file stores it once; otherwise one per thread count.

The file: "about"; "host" (the recording CPU, its CPUs and vector extensions); "engine" (the
size and SHA-256 of the ./gemma recorded); "threads"; "levels" (level -> its flags); "entries":
key -> {"steps", "prompts": [texts], LEVEL: [per prompt: a digest, or {threads: digest}]}.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from builder.asm.build import REPO_ROOT, build
from builder.bench.report import Machine
from emu_tests.digests.cases import (DIGESTS, ENTRIES, LEVELS, THREADS, Entry, logits_sha256,
                                     model_file, prompts, unavailable)

REPEAT = 2
ABOUT = ("SHA-256 of the --logits file of `gemma -m MODEL -p PROMPT -n STEPS --logits FILE "
         "LEVEL-FLAGS -t T` for each entry (emu_tests/digests/cases.py makes its model file), "
         "level, prompt and T in threads; a digest given as a string holds for every T. "
         "Recorded by python -m emu_tests.digests.record, checked by test_logits_digests.py.")


def record_entry(binary: Path, entry: Entry, model: Path) -> dict:
    texts = prompts(entry)
    found: dict = {"steps": entry.steps, "prompts": texts}
    for level in entry.levels:
        found[level] = []
        for text in texts:
            by_threads = {}
            for t in THREADS:
                flags = (*LEVELS[level], "-t", str(t))
                runs = {logits_sha256(binary, model, text, entry.steps, flags)
                        for _ in range(REPEAT)}
                if len(runs) > 1:
                    raise SystemExit(f"record: {entry.key} {' '.join(flags)} {text[:40]!r}: "
                                     f"{len(runs)} different digests in {REPEAT} runs")
                by_threads[str(t)] = runs.pop()
            one = set(by_threads.values())
            found[level].append(one.pop() if len(one) == 1 else by_threads)
    return found


def main() -> int:
    missing = {level: why for level in LEVELS if (why := unavailable(level))}
    if missing:
        print(f"record: every level needed; {'; '.join(missing.values())}", file=sys.stderr)
        return 1
    machine = Machine.here()
    with tempfile.TemporaryDirectory(prefix="digests-") as tmp:
        binary = build(REPO_ROOT, Path(tmp) / "gemma").binary
        entries = {}
        for key, entry in ENTRIES.items():
            start = time.monotonic()
            model = model_file(entry, Path(tmp), Path(tmp) / "real")
            entries[key] = record_entry(binary, entry, model)
            print(f"{key}: {len(entries[key]['prompts'])} prompts x {len(entry.levels)} levels "
                  f"x {len(THREADS)} thread counts x {REPEAT}, {time.monotonic() - start:.1f} s")
        engine = {"bytes": binary.stat().st_size,
                  "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()}
    split = [f"{k} {lv} prompt {i}" for k, e in entries.items() for lv in ENTRIES[k].levels
             for i, d in enumerate(e[lv]) if isinstance(d, dict)]
    print(f"thread counts {THREADS}: " + (f"{len(split)} cases differ, the first {split[0]}"
                                          if split else "the same digest on every case"))
    DIGESTS.write_text(json.dumps({
        "about": ABOUT,
        "host": f"{machine.cpu}, {machine.cpus} CPUs, {machine.vector}",
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "engine": engine,
        "threads": list(THREADS),
        "levels": {level: list(flags) for level, flags in LEVELS.items()},
        "entries": entries}, indent=1) + "\n")
    print(f"wrote {DIGESTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
