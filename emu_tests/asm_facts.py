"""The engine's constants and small tables, read from asm/ by the builder's own front end
(builder.asm.fasm, builder.asm.expr), so that no test repeats a number of the engine's by hand.

`constant(name)`: the value of `NAME = expr` anywhere in asm/ (constants that depend on a
label's address are refused: they differ from build to build); `constants_in(file)`: every
constant a file defines ("asm/format.asm"), by name. `bytes_after(label)`: the
values of the `db` statements that directly follow `label:` (a table such as dim_bits).
"""
from __future__ import annotations

from functools import lru_cache

from builder.asm.assemble import SymbolEnv
from builder.asm.build import REPO_ROOT
from builder.asm.expr import evaluate
from builder.asm.fasm import Data, Label, Program, parse


class _NoLabels(dict):
    """SymbolEnv's addresses without a layout: every constant at 0, no label at all."""

    def __init__(self, program: Program):
        super().__init__()
        self.labels = program.labels

    def __missing__(self, name: str) -> int:
        if name in self.labels:
            raise LookupError(f"{name} is a label: its address depends on the layout")
        return 0


@lru_cache(maxsize=1)
def _env() -> SymbolEnv:
    program = parse(REPO_ROOT)
    return SymbolEnv(program, _NoLabels(program))


def constant(name: str) -> int:
    return _env().value(name)


def constants_in(file: str) -> dict[str, int]:
    consts = _env().program.consts
    return {name: constant(name) for name, c in consts.items() if c.where.file == file}


def bytes_after(label: str) -> list[int]:
    env = _env()
    statements = env.program.statements
    start = next(i for i, s in enumerate(statements) if isinstance(s, Label) and s.name == label)
    values = []
    for s in statements[start + 1:]:
        if not (isinstance(s, Data) and s.unit == 1):
            break
        for kind, node in s.values:
            assert kind == "expr", f"{label}: only numbers expected, got {kind}"
            values.append(evaluate(node, env.at(s.where, 0), s.where).number(s.where))
    return values
