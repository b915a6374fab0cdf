"""The docs' figures that the build derives are the build's: the README's size table (each
source file's bytes, in the build's order; the image's and the packed file's rows) and the
sizes the README and docs/build.md state in prose, all read from the size table that
`python -m builder` prints (the `gemma` fixture's), never copied here by hand. A change of the
engine that moves a byte fails here until the docs say so."""
from __future__ import annotations

import re

import pytest

from builder.asm.build import REPO_ROOT

README = REPO_ROOT / "README.md"
BUILD_MD = REPO_ROOT / "docs" / "build.md"


def figures(table: str) -> dict:
    """The size table's figures: "sources" [(file, text + data bytes)] in its order, and the
    totals by name."""
    def row(pattern: str) -> re.Match:
        found = re.search(pattern, table, re.M)
        assert found, f"the build's size table has no line {pattern!r}:\n{table}"
        return found
    total = row(r"^file total +(\d+) of (\d+) bytes budget \((-?\d+) left\); (\d+) bytes of image")
    tables = row(r"^  field tables +(\d+) +\(their (\d+) bytes")
    image = row(r"^  image +(\d+) +\(its (\d+) bytes coded: ")
    return {
        "sources": [(f, int(t) + int(d)) for f, t, d in
                    re.findall(r"^(asm/\S+\.asm) +(\d+) +(\d+) +\d+$", table, re.M)],
        "elf_headers": int(row(r"^headers etc\. +(\d+)$")[1]),
        "text": int(row(r"^\.text +(\d+)$")[1]),
        "image": int(row(r"^image total +(\d+)")[1]),
        "headers": int(row(r"^headers +(\d+)$")[1]),
        "unpack": int(row(r"^asm/unpack\.asm +(\d+) +\(the decoder")[1]),
        "stub": int(row(r"^asm/stub\.asm +(\d+) +\(the start-up\)")[1]),
        "payload": int(row(r"^payload +(\d+)$")[1]), "model": int(row(r"^  model +(\d+) ")[1]),
        "tables_coded": int(tables[1]), "tables": int(tables[2]),
        "code": int(image[2]), "coded": int(image[1]),
        "file": int(total[1]), "budget": int(total[2]), "left": int(total[3]),
    }


@pytest.fixture(scope="module")
def built(gemma) -> dict:
    return figures(gemma.result.table)


def readme_size_table() -> list[tuple[str, str]]:
    """The README's "Size" table: (its first cell, its last cell) for each row, in order."""
    text = README.read_text().split("\n## Size\n", 1)[1].split("\n## ", 1)[0]
    return [(cells[0], cells[-1]) for cells in
            ([c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
             if line.startswith("| ") and not line.startswith(("| image: source", "|---")))]


def test_readme_size_table_is_the_builds(built):
    rows = readme_size_table()
    f = lambda n: f"{n:,}"  # noqa: E731  (the docs' thousands separator)

    def last(first: str) -> str:
        found = [c for name, c in rows if name.startswith(first)]
        assert len(found) == 1, (first, rows)
        return found[0]
    sources = [(name.strip("`"), cell) for name, cell in rows if re.fullmatch(r"`asm/\w+\.asm`", name)]
    assert sources == [(name, f(n)) for name, n in built["sources"]]
    assert last("ELF header and program headers") == f(built["elf_headers"])
    assert last("**image total**") == f"**{f(built['image'])}**"
    assert last("packed file: ELF header") == f(built["headers"])
    assert last("the stub:") == f"{built['unpack']} + {built['stub']}"
    assert last("payload") == f(built["payload"])
    assert (f"the model ({built['model']}), the field machine's {f(built['tables'])} bytes of tables coded in "
            f"{built['tables_coded']}, the image's {f(built['code'])} bytes of code coded in "
            f"{f(built['coded'])} |") in README.read_text()
    assert last(f"**file total** (of the {f(built['budget'])}-byte budget)") == \
        f"**{f(built['file'])}** ({built['left']} left)"


def test_readme_and_build_md_prose_sizes_are_the_builds(built):
    f = lambda n: f"{n:,}"  # noqa: E731
    readme = " ".join(README.read_text().split())  # (sentences wrap anywhere)
    assert f"{f(built['file'])} bytes on disk, {f(built['image'])} bytes when it runs" in readme
    assert f"`./gemma` is {f(built['file'])} bytes on disk and {f(built['image'])} bytes when it runs" in readme
    assert f"a {built['unpack'] + built['stub']}-byte stub" in readme
    assert f"({round(100 * built['coded'] / built['code'])}% of its code" in readme
    assert f"{built['left']} are free" in readme
    assert f"the size budget ({f(built['budget'])} bytes)" in readme.lower()
    build_md = " ".join(BUILD_MD.read_text().split())
    assert f"`./gemma` is {f(built['file'])} bytes on disk and unpacks {f(built['image'])} bytes of image" \
        in build_md
    assert f"(today: the {f(built['text'])} bytes of `.text`)" in build_md
    assert f"shift per model: {built['model']} bytes today" in build_md


def test_build_md_names_the_sources_that_use_evex():
    """docs/build.md's FASM subset says which source uses EVEX (zmm) forms: every such source,
    and no other."""
    users = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "asm").glob("*.asm")
                   if re.search(r"^\s+v\w+\s[^;\n]*\bzmm\d", p.read_text(), re.M))
    assert users, "no source uses zmm registers: docs/build.md says one does"
    subset = " ".join(BUILD_MD.read_text().split()).split("**Instructions**", 1)[1].split("- **", 1)[0]
    named = sorted(set(re.findall(r"`(asm/\w+\.asm)`", subset)))
    assert named == users, (named, users)
