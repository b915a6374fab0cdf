"""The include order of asm/gemma.asm that packs smallest: a greedy search.

Contract: `search_order(root, passes) -> (lines, size, start)` returns the `include` lines of
the code segment of root/asm/gemma.asm in the order found, the packed program's size with it
and with the file's own order;
`write_order(root, lines)` puts them in that order in the file, the rest untouched. The code
is the same in every order; what changes is what the packer sees (which routines sit next to
each other, every call's target offset) and which jumps stay short.

A pass tries every move of one include line to another place, packs each candidate's image
(assembled from a copy of root's asm/; the size budget plays no part) and keeps the smallest;
the search stops after `passes` passes or at a pass that finds nothing smaller. A candidate
that does not assemble (a file that must come before another) is skipped.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from .assemble import assemble
from .errors import BuildError
from .fasm import parse
from .packed import pack_program

ENTRY = "gemma.asm"


def _code_includes(text: str) -> list[int]:
    """Indices of the `include` lines of the first (code) segment."""
    lines, out, segment = text.splitlines(), [], 0
    for i, line in enumerate(lines):
        if line.startswith("segment "):
            segment += 1
        elif line.startswith("include ") and segment == 1:
            out.append(i)
    return out


def _with_order(text: str, order: list[str]) -> str:
    lines = text.splitlines()
    for i, line in zip(_code_includes(text), order):
        lines[i] = line
    return "\n".join(lines) + "\n"


def packed_size(root: Path) -> int:
    """Bytes of the packed program of the sources at root (not written anywhere)."""
    return len(pack_program(root, assemble(parse(root))).elf)


def search_order(root: Path, passes: int = 3,
                 progress: bool = True) -> tuple[list[str], int, int]:
    """The include lines in the order found, the packed size with them and with the file's
    order (see the module docstring)."""
    text = (root / "asm" / ENTRY).read_text()
    order = [text.splitlines()[i] for i in _code_includes(text)]
    if len(order) < 2:
        raise BuildError(f"asm/{ENTRY}: fewer than two include lines to order")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(root / "asm", work / "asm")

        def size(candidate: list[str]) -> int | None:
            (work / "asm" / ENTRY).write_text(_with_order(text, candidate))
            try:
                return packed_size(work)
            except BuildError:
                return None

        best = start = size(order)
        if start is None:
            raise BuildError(f"asm/{ENTRY} does not build as it is")
        for n in range(passes):
            moves = [(i, j) for i in range(len(order)) for j in range(len(order)) if i != j]
            found = None
            for i, j in tqdm(moves, desc=f"pass {n + 1}: {best} bytes", disable=not progress,
                             leave=False):
                candidate = list(order)
                candidate.insert(j, candidate.pop(i))
                got = size(candidate)
                if got is not None and got < best and (found is None or got < found[0]):
                    found = (got, candidate)
            if found is None:
                break
            best, order = found
    return order, best, start


def write_order(root: Path, order: list[str]) -> None:
    """Rewrite root/asm/gemma.asm with its code segment's include lines in `order`."""
    path = root / "asm" / ENTRY
    text = path.read_text()
    if sorted(order) != sorted(text.splitlines()[i] for i in _code_includes(text)):
        raise BuildError(f"asm/{ENTRY}: the include lines changed during the search")
    path.write_text(_with_order(text, order))
