"""`python -m builder`: asm/ -> verified, checked ./gemma and its symbol map.

Contract: `build(root, out=root/"gemma", symbols=False, budget=None) -> BuildResult` runs the
front end (fasm.parse), assembly (assemble), verification (verify), `linker.link`, the ELF
checks and the size budget (`[tool.gemma] size_budget` in root/pyproject.toml unless `budget`
is given; with `symbols` the budget applies to the file without section headers and
.symtab/.strtab, which is the program that ships), then writes `out` (mode 0755,
byte-identical for identical sources) and `out.map.json`: {"NAME": {"address", "size",
"file", "line"}} for every global label, size running to the next global label of the same
segment or to the segment's end. Any failure raises BuildError with one line; an over-budget
file is not written (the error's `report` attribute holds the size table). `main(argv)` is the
command line: prints the size table, or the error on stderr and returns 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import linker

from .assemble import Image, assemble
from .errors import BuildError
from .fasm import Label, parse
from .verify import verify

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class BuildResult:
    """A finished build: the executable, its map, its size and the budget it met."""
    binary: Path
    map_path: Path
    size: int
    budget: int
    image: Image
    symbols: dict
    table: str


def read_budget(root: Path) -> int:
    """`[tool.gemma] size_budget` from root/pyproject.toml."""
    path = root / "pyproject.toml"
    try:
        budget = tomllib.loads(path.read_text())["tool"]["gemma"]["size_budget"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise BuildError(f"{path}: cannot read [tool.gemma] size_budget ({exc})") from None
    if not isinstance(budget, int) or budget <= 0:
        raise BuildError(f"{path}: size_budget must be a positive integer")
    return budget


def symbol_map(image: Image) -> dict[str, dict]:
    """Global labels -> address, size, file, line (see module docstring)."""
    lay = image.layout
    ends = {"text": lay.text_end, "data": lay.bss_end}
    labels = [p for p in image.placed if isinstance(p.stmt, Label) and not p.stmt.local]
    out = {}
    for n, p in enumerate(labels):
        following = [q.address for q in labels[n + 1:] if q.segment == p.segment]
        end = following[0] if following else ends[p.segment]
        out[p.stmt.name] = {"address": p.address, "size": end - p.address,
                            "file": p.stmt.where.file, "line": p.stmt.where.line}
    return out


def linker_symbols(image: Image, table: dict[str, dict]) -> list:
    """The map's labels as linker.Symbol, in .text, .data or .bss by address."""
    lay = image.layout
    def section(addr: int) -> str:
        if addr < lay.text_end:
            return ".text"
        return ".data" if addr < lay.bss_addr else ".bss"
    return [linker.Symbol(name, s["address"], s["size"], section(s["address"]))
            for name, s in table.items()]


def size_table(image: Image, file_size: int, budget: int) -> str:
    """Bytes per section and per source file, and the total against the budget."""
    lay = image.layout
    per_file: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for p in image.placed:
        if p.segment == "text":
            per_file[p.stmt.where.file][0] += p.size
        elif p.segment == "data":
            start, end = p.address, p.address + p.size
            in_data = max(0, min(end, lay.bss_addr) - start)
            per_file[p.stmt.where.file][1] += in_data
            per_file[p.stmt.where.file][2] += p.size - in_data
    width = max([len(f) for f in per_file] + [12])
    rows = [f"{'section':<{width}} {'bytes':>6}",
            f"{'headers etc.':<{width}} {file_size - len(image.text) - len(image.data):>6}",
            f"{'.text':<{width}} {len(image.text):>6}",
            f"{'.data':<{width}} {len(image.data):>6}",
            f"{'.bss':<{width}} {image.bss_size:>6}  (memory only)",
            "",
            f"{'source file':<{width}} {'text':>6} {'data':>6} {'bss':>6}"]
    rows += [f"{name:<{width}} {t:>6} {d:>6} {b:>6}" for name, (t, d, b) in per_file.items()]
    rows += ["", f"{'file total':<{width}} {file_size:>6} of {budget} bytes budget "
                 f"({budget - file_size} left)"]
    return "\n".join(rows)


def build(root: Path = REPO_ROOT, out: Path | None = None, symbols: bool = False,
          budget: int | None = None) -> BuildResult:
    """Build the executable (see module docstring)."""
    root = Path(root)
    out = Path(out) if out is not None else root / "gemma"
    budget = read_budget(root) if budget is None else budget
    try:
        image = assemble(parse(root))
    except RecursionError:
        raise BuildError("symbol definitions nested too deeply") from None
    verify(image.placed)
    table = symbol_map(image)
    try:
        shipped = linker.link(image.text, image.data, image.bss_size, image.entry,
                              image.layout)
        elf = shipped if not symbols else linker.link(
            image.text, image.data, image.bss_size, image.entry, image.layout,
            linker_symbols(image, table))
        linker.check(shipped)
        if elf is not shipped:
            linker.check(elf)
    except (ValueError, linker.ElfCheckError) as exc:
        raise BuildError(f"link: {exc}") from None
    report = size_table(image, len(shipped), budget)
    if len(shipped) > budget:
        error = BuildError(f"{out.name} would be {len(shipped)} bytes, {len(shipped) - budget} "
                           f"over the budget of {budget} bytes (pyproject.toml [tool.gemma] "
                           f"size_budget)")
        error.report = report
        raise error
    map_path = out.with_name(out.name + ".map.json")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(elf)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        map_path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise BuildError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    try:
        linker.check(out, None if symbols else budget)
    except linker.ElfCheckError as exc:
        raise BuildError(f"check: {exc}") from None
    return BuildResult(out, map_path, len(elf), budget, image, table, report)


def main(argv: list[str]) -> int:
    """The command line (see module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m builder",
        description="Build ./gemma from asm/gemma.asm: FASM-subset front end, keystone, "
                    "capstone verification, ELF link and checks, size budget.")
    parser.add_argument("-o", "--output", type=Path, help="executable to write "
                        "(default: ROOT/gemma); the symbol map goes beside it")
    parser.add_argument("--symbols", action="store_true",
                        help="add section headers and .symtab/.strtab (for gdb and perf)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="project directory holding asm/ and pyproject.toml")
    args = parser.parse_args(argv)
    try:
        result = build(args.root, args.output, args.symbols)
    except BuildError as exc:
        if getattr(exc, "report", None):
            print(exc.report)
        print(exc, file=sys.stderr)
        return 1
    print(result.table)
    print(f"wrote {result.binary} and {result.map_path.name}")
    return 0
