"""The fuzz suite the test runs (and `python -m emu_tests.fuzz` replays): its models and cases.

Models: the fixtures converted to engine files (tiny_mqa and tiny_wide from Hugging Face,
tiny_mqa from GGUF, whose tables have no user-defined pieces: Gemma 1, header flags 0), a
synthetic version-2 file with every optional tensor (shapes.V2_BASE: post and q/k norms,
windows, soft-caps) and the same in Q8_0 blocks (shapes.Q8_BASE), the odd-shaped valid models and the sparse 2B file of shapes.py. Cases:
make_cases over those five mutated files and the sparse 2B file (tokenizer runs only: its 5 GB
of weights are a hole), the shape and sparse runs, then seeded random mutations up to the
count.
"""
from __future__ import annotations

from pathlib import Path

from builder.models.convert import convert

from .model import Base
from .mutate import Case, make_cases
from .shapes import Q8_BASE, SHAPES, V2_BASE, shape_cases, sparse_cases, write_bases, write_v2_base

SEED = 20261130
CASES = 11500   # every systematic case of the bases (~10,500), then seeded random ones
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MUTATED = {"tiny_mqa": ("tiny_mqa", "."), "tiny_wide": ("tiny_wide", "."),
           "tiny_mqa_gguf": ("tiny_mqa", "model-f16.gguf"), V2_BASE: None,   # None: synthetic
           Q8_BASE: None}


def models(tmp: Path) -> dict[str, Path]:
    """Every model file of the suite, written into tmp, by name."""
    out = {}
    for name, fixture in MUTATED.items():
        out[name] = tmp / f"{name}.bin"
        if fixture is None:
            write_v2_base(out[name], q8_0=name == Q8_BASE)
        else:
            convert((FIXTURES / fixture[0] / fixture[1]).resolve(), out[name], progress=False)
    return out | write_bases(tmp)


def cases(models: dict[str, Path], seed: int = SEED, count: int = CASES) -> list[Case]:
    bases = {name: Base.load(models[name]) for name in [*MUTATED, "sparse_2b"]}
    return make_cases(bases, seed, count, shape_cases(list(SHAPES)) + sparse_cases(),
                      tokens_only=frozenset({"sparse_2b"}))
