"""`python -m builder`: asm/ -> the verified, checked image and the packed ./gemma.

Contract: `build(root, out=root/"gemma", budget=None) -> BuildResult` runs the front end
(fasm.parse), assembly (assemble), verification (verify), `linker.link` and the ELF checks on
asm/gemma.asm: the image, the program as it runs, with section headers and symbols. Then
packed.pack_program packs it behind the stub (asm/stub.asm) into the packed program, and the
size budget (`[tool.gemma] size_budget` in root/pyproject.toml unless `budget` is given)
applies to that file. It writes `out` (the packed program), `out.elf` (the image; it runs
too) — both mode 0755, byte-identical for identical sources — and `out.map.json`, the image's
symbols: {"NAME": {"address", "size", "file", "line"}} for every global label, size running to
the next global label of the same segment or to the segment's end. Any failure raises
BuildError with one line; over the budget nothing is written (the error's `report` attribute
holds the size table). `main(argv)` is the command line: prints the size table, or the error
on stderr and returns 1.
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

from . import pack
from .assemble import Image, assemble
from .errors import BuildError
from .fasm import Label, parse
from .packed import Packed, pack_program
from .verify import verify

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class BuildResult:
    """A finished build: the packed program (`binary`, `size` bytes, within `budget`), the
    image it unpacks (`elf`, its file; `image`, its assembly; `symbols`, its map, also in
    `map_path`), the packed program's parts (`packed`; `stub_symbols`, the stub's labels in
    the map's form) and the size table."""
    binary: Path
    elf: Path
    map_path: Path
    size: int
    budget: int
    image: Image
    symbols: dict
    packed: Packed
    stub_symbols: dict
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
        if addr <= lay.text_end:          # (a label may end .text; .data is pages later)
            return ".text"
        return ".data" if addr < lay.bss_addr else ".bss"
    return [linker.Symbol(name, s["address"], s["size"], section(s["address"]))
            for name, s in table.items()]


def per_file(image: Image) -> dict[str, list[int]]:
    """Bytes of .text, .data and .bss per source file."""
    lay = image.layout
    sizes: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for p in image.placed:
        if p.segment == "text":
            sizes[p.stmt.where.file][0] += p.size
        elif p.segment == "data":
            start, end = p.address, p.address + p.size
            in_data = max(0, min(end, lay.bss_addr) - start)
            sizes[p.stmt.where.file][1] += in_data
            sizes[p.stmt.where.file][2] += p.size - in_data
    return sizes


def size_table(image: Image, packed: Packed, budget: int) -> str:
    """Bytes per section and per source file of the image, then the packed file's parts and
    its total against the budget."""
    lay = image.layout
    sizes = per_file(image)
    stub_files = {name: t for name, (t, _, _) in per_file(packed.stub).items()}
    width = max([len(f) for f in (*sizes, *stub_files)] + [14])
    head = 1 + 2 * packed.payload[0]
    model, coded = packed.payload[:head], packed.payload[head:]
    total = len(packed.elf)
    rows = [f"{'image section':<{width}} {'bytes':>6}",
            f"{'headers etc.':<{width}} {lay.file_end - len(image.text) - len(image.data):>6}",
            f"{'.text':<{width}} {len(image.text):>6}",
            f"{'.data':<{width}} {len(image.data):>6}",
            f"{'.bss':<{width}} {image.bss_size:>6}  (memory only)",
            "",
            f"{'source file':<{width}} {'text':>6} {'data':>6} {'bss':>6}"]
    rows += [f"{name:<{width}} {t:>6} {d:>6} {b:>6}" for name, (t, d, b) in sizes.items()]
    rows += ["", f"{'image total':<{width}} {lay.file_end:>6}  (gemma.elf without its "
                 "symbols: the program as it runs)",
             "",
             f"{'packed file':<{width}} {'bytes':>6}",
             f"{'headers':<{width}} {packed.headers:>6}"]
    machine = packed.stub.symbols["unpack.fielded"] - packed.stub.symbols["unpack.fields"]
    notes = {"asm/unpack.asm": f"the decoder; its field machine's step {machine}",
             "asm/stub.asm": "the start-up"}
    rows += [f"{name:<{width}} {t:>6}  ({notes.get(name, 'the stub')})"
             for name, t in stub_files.items()]
    image_coded = len(coded) - packed.tables
    rows += [f"{'payload':<{width}} {len(packed.payload):>6}",
             f"{'  model':<{width}} {len(model):>6}  ({len(model) // 2} context models)",
             f"{'  field tables':<{width}} {packed.tables:>6}  (their {len(pack.TABLES)} "
             "bytes, coded ahead of the image)",
             f"{'  image':<{width}} {image_coded:>6}  (its {packed.image_bytes} bytes coded: "
             f"{image_coded / packed.image_bytes:.1%})",
             "", f"{'file total':<{width}} {total:>6} of {budget} bytes budget "
                 f"({budget - total} left); {lay.file_end} bytes of image when it runs"]
    return "\n".join(rows)


def build(root: Path = REPO_ROOT, out: Path | None = None,
          budget: int | None = None) -> BuildResult:
    """Build the image and the packed program (see module docstring)."""
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
        elf = linker.link(image.text, image.data, image.bss_size, image.entry, image.layout,
                          linker_symbols(image, table))
        linker.check(elf)
    except (ValueError, linker.ElfCheckError) as exc:
        raise BuildError(f"link: {exc}") from None
    packed = pack_program(root, image)
    report = size_table(image, packed, budget)
    size = len(packed.elf)
    if size > budget:
        error = BuildError(f"{out.name} would be {size} bytes, {size - budget} over the "
                           f"budget of {budget} bytes (pyproject.toml [tool.gemma] "
                           "size_budget)")
        error.report = report
        raise error
    elf_path = out.with_name(out.name + ".elf")
    map_path = out.with_name(out.name + ".map.json")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        for path, blob in ((elf_path, elf), (out, packed.elf)):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(blob)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        map_path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise BuildError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    try:
        linker.check(out, budget)
        linker.check(elf_path)
    except linker.ElfCheckError as exc:
        raise BuildError(f"check: {exc}") from None
    return BuildResult(out, elf_path, map_path, size, budget, image, table, packed,
                       symbol_map(packed.stub), report)


def main(argv: list[str]) -> int:
    """The command line (see module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m builder build",
        description="Build ./gemma from asm/gemma.asm: FASM-subset front end, keystone, "
                    "capstone verification, ELF link and checks; the image (gemma.elf, with "
                    "symbols for gdb and perf) packed behind asm/stub.asm into ./gemma, "
                    "within the size budget.")
    parser.add_argument("-o", "--output", type=Path, help="packed program to write "
                        "(default: ROOT/gemma); the image (OUTPUT.elf) and its symbol map "
                        "(OUTPUT.map.json) go beside it")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="project directory holding asm/ and pyproject.toml")
    args = parser.parse_args(argv)
    try:
        result = build(args.root, args.output)
    except BuildError as exc:
        if getattr(exc, "report", None):
            print(exc.report)
        print(exc, file=sys.stderr)
        return 1
    print(result.table)
    print(f"wrote {result.binary}, {result.elf.name} and {result.map_path.name}")
    return 0
