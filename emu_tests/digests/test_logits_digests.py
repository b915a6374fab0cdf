"""The forward pass keeps its recorded bits: the SHA-256 of every `--logits` file of cases.py's
cases (every Gemma 1-3 fixture prompt in FP16 and Q8_0, the real Gemma 3 270M; each level, -t 1
and -t 2) equals logits_digests.json, recorded by record.py on the hard-coded forward pass
that the op program's interpreter replaced (which gives the same digests). A difference names the first case that
differs (entry, flags, prompt) and how many do.

Measured when recording (AMD EPYC with AVX-512F, 2 CPUs): every digest was the same in two
runs, in two recordings and for -t 1 and -t 2 (the file stores each once); --avx2 and the
AVX-512 level gave the same digest on every case (the AVX-512 kernels' promise), --baseline a
different one on every case; a fixture converted from HF and from GGUF the same digest on every
prompt both tokenize alike. Doubling the norms' eps moves the fixtures' logits by 8e-6 (inside
the tolerance tests' 1e-4) and changes every digest.

Levels: every case runs on every CPU. Where a level's kernels are missing (the AVX-512 one on an
AVX2-only CPU), its flags make the engine take the kernels the CPU has, and the case is held to
the same recorded digests: the AVX2 kernels promise the AVX-512 ones' bits, and the recording
checked it on every case. The whole program's AVX-512 path itself runs only on a CPU with
AVX-512F: qemu-user 7.2's TCG has no AVX-512 (`-cpu Skylake-Server` drops avx512f), the
whole-program runner in Unicorn (harness/program.py) refuses every VEX/EVEX instruction and runs
one thread; its kernels run through the instruction model in emu_tests/model on such a CPU.
"""
from __future__ import annotations

import json

import pytest

from emu_tests.digests.cases import (DIGESTS, ENTRIES, LEVELS, REAL, THREADS, logits_sha256,
                                     model_file, prompts)

RECORDED = json.loads(DIGESTS.read_text())


def cases(real: bool) -> list:
    return [pytest.param(key, level, id=f"{key.replace(' ', '-')}-{level}")
            for key, entry in ENTRIES.items() if (entry.model == REAL) == real
            for level in entry.levels]


def test_recording_has_every_case():
    """The recording holds every entry of cases.py with its steps, prompts (the fixtures'
    texts today) and levels, with these flags and thread counts."""
    assert RECORDED["threads"] == list(THREADS)
    assert RECORDED["levels"] == {level: list(flags) for level, flags in LEVELS.items()}
    assert list(RECORDED["entries"]) == list(ENTRIES), "run python -m emu_tests.digests.record"
    for key, entry in ENTRIES.items():
        found = RECORDED["entries"][key]
        assert found["steps"] == entry.steps, key
        assert found["prompts"] == prompts(entry), f"{key}: the fixtures' prompts changed"
        assert [k for k in found if k in LEVELS] == list(entry.levels), key
        assert all(len(found[level]) == len(found["prompts"]) for level in entry.levels), key


def check(binary, key: str, level: str, model) -> None:
    """Every prompt and thread count of one entry at one level against the recording."""
    entry, found = ENTRIES[key], RECORDED["entries"][key]
    differ, runs = [], 0
    for i, text in enumerate(found["prompts"]):
        want = found[level][i]
        for t in THREADS:
            flags = (*LEVELS[level], "-t", str(t))
            got = logits_sha256(binary, model, text, entry.steps, flags)
            expected = want if isinstance(want, str) else want[str(t)]
            runs += 1
            if got != expected:
                differ.append(f"{key}, {level}: -n {entry.steps} {' '.join(flags)}, prompt {i} "
                              f"({text[:40]!r}): sha256 {got}, recorded {expected}")
    assert not differ, (f"{len(differ)} of {runs} --logits files differ from the recording "
                        f"(host: {RECORDED['host']}); the first: {differ[0]}")


@pytest.fixture(scope="module")
def fixtures_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("digests")


@pytest.mark.parametrize("key,level", cases(real=False))
def test_fixture_digests(gemma, fixtures_dir, key, level):
    check(gemma.binary, key, level, model_file(ENTRIES[key], fixtures_dir, fixtures_dir))


@pytest.mark.slow  # the real model: 0.3-1.8 s a short prompt, 6-15 s the 775-token one
@pytest.mark.parametrize("key,level", cases(real=True))
def test_real_model_digests(gemma, real_g3, key, level):
    """real_g3's directory is a demo cache: its Q8_0 file is converted there once."""
    check(gemma.binary, key, level, model_file(ENTRIES[key], real_g3.parent, real_g3.parent))
