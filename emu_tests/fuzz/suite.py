"""The fuzz suite the test runs (and `python -m emu_tests.fuzz` replays): its models and cases.

Models (every one version 4): the fixtures converted to engine files (tiny_mqa and tiny_wide
from Hugging Face, tiny_mqa from GGUF, whose tables have no user-defined pieces: Gemma 1), a
synthetic Gemma 3 file with every optional tensor (shapes.G3_BASE: post and q/k norms,
windows, soft-caps) and the same in Q8_0 blocks (shapes.Q8_BASE), the odd-shaped valid models
and the sparse 2B file of shapes.py. Cases: first mutate4's program mutations (make_cases4) of
the four programs among the five mutated files (PROGRAMS; first: the engine's newest checks,
run even when a loaded machine makes the campaign's budget cut its tail), then make_cases over
the five and the sparse 2B file (tokenizer runs only: its 5 GB of weights are a hole), the
shape and sparse runs, then seeded random mutations up to the count.

Every mutate4 case is decided here, once, by what builder.models.modelfile4.ModelFile4 does
with its file (`reader_verdicts`): the engine must refuse what the reader refuses and run what
it accepts (but for MoE's ops, which it lacks: builder.cli.ENGINE_OPS), the strings section included (for the cases mutate4 decides by the page,
emu_tests/models/test_fuzz4.py holds the reader to the same verdicts).
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from builder.cli import ENGINE_OPS
from builder.models.convert import convert
from builder.models.modelfile import ModelFormatError
from builder.models.modelfile4 import ModelFile4

from .model import Base, write_case
from .mutate import Case, make_cases
from .mutate4 import Base4, make_cases4
from .shapes import G3_BASE, Q8_BASE, SHAPES, shape_cases, sparse_cases, write_bases, write_g3_base

SEED = 20261130
CASES = 15500   # CASES4, make_cases' systematic cases (~10,700), the shape and sparse runs, then random ones
CASES4 = 4000   # make_cases4's systematic cases of PROGRAMS (~3,920), then random ones
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MUTATED = {"tiny_mqa": ("tiny_mqa", "."), "tiny_wide": ("tiny_wide", "."),
           "tiny_mqa_gguf": ("tiny_mqa", "model-f16.gguf"), G3_BASE: None,   # None: synthetic
           Q8_BASE: None}
# the bases mutate4 mutates: every program of MUTATED once (tiny_mqa_gguf's is tiny_mqa's)
PROGRAMS = [name for name in MUTATED if name != "tiny_mqa_gguf"]


def models(tmp: Path) -> dict[str, Path]:
    """Every model file of the suite, written into tmp, by name."""
    out = {}
    for name, fixture in MUTATED.items():
        out[name] = tmp / f"{name}.bin"
        if fixture is None:
            write_g3_base(out[name], q8_0=name == Q8_BASE)
        else:
            convert((FIXTURES / fixture[0] / fixture[1]).resolve(), out[name], progress=False, version=4)
    return out | write_bases(tmp)


def reader_verdict(path: Path) -> bool:
    """Whether the engine must refuse the file at path (True) or run it (False), as the Python
    reader decides, and a program with an op the engine lacks (not in ENGINE_OPS) refused."""
    try:
        return not {o.op for o in ModelFile4(path).ops} <= ENGINE_OPS
    except ModelFormatError:
        return True


def reader_verdicts(models: dict[str, Path], cases: list[Case]) -> list[Case]:
    """The cases (on the named models) with reader_verdict's verdicts."""
    prefixes = {name: Base4.load(models[name]) for name in {c.model for c in cases}}
    out = []
    with tempfile.TemporaryDirectory(prefix="gemma-fuzz4-") as tmp:
        path = Path(tmp) / "case.bin"
        for c in cases:
            path.unlink(missing_ok=True)        # (a fresh file: truncating the last one is slower)
            write_case(path, prefixes[c.model].data, prefixes[c.model].length, c.edits, c.size)
            verdict = reader_verdict(path)
            out.append(replace(c, reject=verdict, accept=not verdict))
    return out


def cases(models: dict[str, Path], seed: int = SEED, count: int = CASES) -> list[Case]:
    """CASES4 mutate4 cases, then make_cases' (with the shape and sparse runs): count in all."""
    bases = {name: Base.load(models[name]) for name in [*MUTATED, "sparse_2b"]}
    four = reader_verdicts(models, make_cases4({name: Base4.load(models[name]) for name in PROGRAMS}, seed,
                                                       min(count, CASES4)))
    return four + make_cases(bases, seed, count - len(four), shape_cases(list(SHAPES)) + sparse_cases(),
                             tokens_only=frozenset({"sparse_2b"}))
