"""The runs whose `--logits` SHA-256 digests hold the engine's forward pass to its bits: what
record.py records into DIGESTS and test_logits_digests.py checks.

An entry (ENTRIES, by its key "MODEL SOURCE TYPE", e.g. "tiny_g3 hf q8_0") is one engine model
file, made as the tests make it: a Gemma 1-3 fixture (modelfiles.ORACLES: every fixture and
source with a transformers recording) converted by modelfiles.convert_fixture, in FP16 from each
source and in Q8_0 (`convert --type q8_0`) from its HF directory; the real Gemma 3 270M
(builder.demo.real_model, as the `real_g3` fixture makes it from its Q4_K_M GGUF) in FP16 and
Q8_0. Each entry has its `-n` steps, its levels and its prompts (`prompts(entry)`, from the
fixtures; the recording stores them):
- fixtures: the five recorded prompts (7 to 27 tokens: one block) and tiny_g4's sixth, the five
  joined, twice (181 tokens: three prompt blocks, every window exceeded), 24 greedy
  steps (the recorded ones), every level;
- real_g3: its four short recorded prompts (6 to 17 tokens), 8 steps, every level; and in
  "real_g3 gguf f16 long" its 775-token prompt (13 blocks, past the 512-token window), one step,
  on the AVX2 level only: its --logits file is 0.8 GB (every position's row: 775 products with
  the 262,144-row embedding), 6-15 s a run there and 25-48 s on the baseline (2 CPUs, AMD EPYC
  with AVX-512F, shared); the AVX-512 level gives AVX2's digest on every other case.
A case is an entry, a level, a thread count (THREADS) and a prompt.

- LEVELS: level -> the engine flags that select it on a CPU that has it (cpu.asm;
  builder.bench.level.kernel_level): "baseline" --baseline, "avx2" --avx2, "avx512" none.
- `unavailable(level)`: None where this CPU runs `level`'s kernels for its flags, else why not.
- `model_file(entry, fixtures_dir, real_dir)`: the entry's model file, converted once into
  fixtures_dir, or for the real model into real_dir (a demo cache: its GGUF is assembled there).
- `logits_sha256(binary, model, text, steps, flags)`: the hex SHA-256 of the --logits file of
  `gemma -m model -p text -n steps --logits FILE FLAGS`, read from a pipe as the engine writes
  it (nothing touches the disk); a non-zero exit raises EngineFailed with the engine's stderr.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from builder.bench.level import NEEDS, kernel_level
from builder.bench.machine import cpu_flags
from builder.demo import real_model
from emu_tests.modelfiles import ORACLES, convert_fixture, fixture_path

DIGESTS = Path(__file__).with_name("logits_digests.json")
LEVELS = {"baseline": ("--baseline",), "avx2": ("--avx2",), "avx512": ()}
THREADS = (1, 2)
REAL = "real_g3"
TIMEOUT = 300                       # seconds a run may take (the 775-token prompt: ~10 s)


@dataclass(frozen=True)
class Entry:
    model: str                      # a fixture's name, or REAL
    source: str                     # "hf" or "gguf"
    wtype: str                      # "f16" or "q8_0"
    steps: int
    levels: tuple[str, ...]
    prompts: slice                  # of the model's recorded prompts (a fixture's: + the long one)

    @property
    def key(self) -> str:
        return f"{self.model} {self.source} {self.wtype}"


def _entries() -> dict[str, Entry]:
    every = tuple(LEVELS)
    fixtures = [Entry(name, source, "f16", 24, every, slice(None)) for name, source in ORACLES]
    fixtures += [Entry(name, "hf", "q8_0", 24, every, slice(None))
                 for name in dict.fromkeys(name for name, _ in ORACLES)]
    real = [Entry(REAL, "gguf", wtype, 8, every, slice(0, 4)) for wtype in ("f16", "q8_0")]
    long = Entry(REAL, "gguf", "f16", 1, ("avx2",), slice(4, 5))
    return {e.key: e for e in fixtures + real} | {f"{long.key} long": long}


ENTRIES = _entries()


def _recorded_texts(name: str) -> list[str]:
    recorded = json.loads((fixture_path(name) / "reference.json").read_text())
    return [p["text"] for p in recorded["prompts"]]


def prompts(entry: Entry) -> list[str]:
    """The entry's prompt texts, from the fixtures' recordings."""
    texts = _recorded_texts(entry.model)
    if entry.model != REAL:
        texts += _recorded_texts("tiny_g4")[5:6]       # the five joined, twice
    return texts[entry.prompts]


def unavailable(level: str) -> str | None:
    flags = cpu_flags()
    runs = kernel_level(list(LEVELS[level]), flags)
    if runs == level:
        return None
    return (f"this CPU lacks {', '.join(sorted(NEEDS[level] - flags))}: it runs the {runs} "
            f"kernels for {' '.join(LEVELS[level]) or 'no flag'}")


def model_file(entry: Entry, fixtures_dir: Path, real_dir: Path) -> Path:
    if entry.model == REAL:
        return real_model(real_dir, progress=False, wtype=entry.wtype)
    return convert_fixture(entry.model, entry.source, fixtures_dir, wtype=entry.wtype)


class EngineFailed(AssertionError):
    """The engine exited with a non-zero status."""


def logits_sha256(binary: Path, model: Path, text: str, steps: int, flags: tuple[str, ...]) -> str:
    read, write = os.pipe()
    argv = [str(binary), "-m", str(model), "-p", text, "-n", str(steps), "--logits",
            f"/dev/fd/{write}", *flags]
    with os.fdopen(read, "rb") as pipe:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    pass_fds=(write,))
        finally:
            os.close(write)         # the engine holds the only writer: EOF when it exits
        timer = threading.Timer(TIMEOUT, proc.kill)
        timer.start()
        try:
            digest = hashlib.sha256()
            while chunk := pipe.read(1 << 20):
                digest.update(chunk)
            stderr = proc.stderr.read()
            proc.wait()
        finally:
            timer.cancel()
    if proc.returncode:
        raise EngineFailed(f"{' '.join(argv[:4])} ... {' '.join(flags)}: exit {proc.returncode}: "
                           f"{stderr.decode(errors='replace').strip()}")
    return digest.hexdigest()
