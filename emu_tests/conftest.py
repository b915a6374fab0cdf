"""Session fixtures shared by every test module.

`gemma`: the executable built once per session from the repository's asm/ with
`builder.build.build` into a temporary directory: `.binary` (Path), `.symbols` (the symbol
map: name -> {"address", "size", "file", "line"}), `.result` (the BuildResult).
A build failure fails the tests that use it with the builder's one-line message.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.build import REPO_ROOT, BuildResult, build
from builder.errors import BuildError


@dataclass
class Gemma:
    """The freshly built engine."""
    binary: Path
    symbols: dict
    result: BuildResult


@pytest.fixture(scope="session")
def gemma(tmp_path_factory) -> Gemma:
    out = tmp_path_factory.mktemp("build") / "gemma"
    try:
        result = build(REPO_ROOT, out)
    except BuildError as exc:
        pytest.fail(f"python -m builder failed: {exc}", pytrace=False)
    return Gemma(result.binary, result.symbols, result)
