"""builder/asm/build.py, end to end: the shipped program's usage path, reproducible output, the
size budget on the packed file, the image's symbol map and .symtab, the two files' layouts,
the size table and the command line."""
from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys

import pytest
from elftools.elf.elffile import ELFFile

import linker
from builder.asm import pack
from builder.asm.build import REPO_ROOT, build
from builder.asm.errors import BuildError
from builder.asm.packed import STUB_BASE
from conftest import PROLOGUE

EXIT = "        mov eax, 60\n        syscall\n"
HEADERS = 64 + 48       # ./gemma's: the ELF header (PT_GNU_STACK's read bytes inside), PT_LOAD
                        # but its p_align (the stub's first code bytes)


def builder_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True,
                          text=True, timeout=300)


def test_no_arguments_prints_usage_on_stderr_and_exits_2(gemma):
    proc = subprocess.run([str(gemma.binary)], capture_output=True, timeout=10)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.startswith(b"usage: gemma -m MODEL")


@pytest.fixture
def snapshot(tmp_path):
    """A copy of the project's asm/ and pyproject.toml (the sources may change meanwhile)."""
    root = tmp_path / "snapshot"
    shutil.copytree(REPO_ROOT / "asm", root / "asm")
    shutil.copy(REPO_ROOT / "pyproject.toml", root)
    return root


def test_two_builds_are_byte_identical(snapshot, tmp_path):
    first = build(snapshot, tmp_path / "a" / "gemma")
    second = build(snapshot, tmp_path / "b" / "gemma")
    for a, b in ((first.binary, second.binary), (first.elf, second.elf)):
        assert a.read_bytes() == b.read_bytes()
        assert b.stat().st_mode & 0o777 == 0o755
    assert first.map_path.read_text() == second.map_path.read_text()
    assert (first.elf.name, first.map_path.name) == ("gemma.elf", "gemma.map.json")


def random_bytes(count: int, seed: int = 1) -> str:
    """A `db` line of `count` random bytes: data the packer cannot shrink."""
    values = random.Random(seed).randbytes(count)
    return "        db " + ", ".join(str(b) for b in values) + "\n"


def test_over_budget_build_fails_and_writes_nothing(asm_tree):
    root = asm_tree(EXIT + random_bytes(6000))
    with pytest.raises(BuildError) as err:
        build(root, root / "gemma")
    m = re.fullmatch(r"gemma would be (\d+) bytes, (\d+) over the budget of 6144 bytes "
                     r"\(pyproject.toml \[tool.gemma\] size_budget\)", str(err.value))
    assert m and int(m[1]) - 6144 == int(m[2]) and int(m[1]) > 6000, str(err.value)
    assert not (root / "gemma").exists() and not (root / "gemma.elf").exists()
    proc = builder_cli("--root", str(root))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "over the budget" in proc.stderr
    assert "file total" in proc.stdout                      # the table shows where bytes went


def test_budget_comes_from_pyproject_and_is_inclusive(asm_tree):
    root = asm_tree(EXIT)
    size = build(root, root / "gemma").size
    assert build(asm_tree(EXIT, budget=size), None).size == size
    with pytest.raises(BuildError, match=f"1 over the budget of {size - 1} bytes"):
        build(asm_tree(EXIT, budget=size - 1), None)


def test_symbol_map_has_every_global_label_with_its_extent(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + """        call    twice
""" + EXIT + """twice:  nop
.inner: nop
        ret
msg:    db 'abc'
segment readable writeable
value   dd 1, 2
later:  rb 5
last    rq 1
"""})
    result = build(root, root / "gemma")
    lay = result.image.layout
    start = lay.text_addr
    expected = {
        "start": (start, 5 + 7, 4),                 # call (5), mov eax (5) + syscall (2)
        "twice": (start + 12, 3, 8),                # nop, nop, ret: .inner belongs to it
        "msg": (start + 15, 3, 11),
        "value": (lay.data_addr, 8, 13),
        "later": (lay.data_addr + 8, 5, 14),
        "last": (lay.data_addr + 13, 8, 15)}
    got = {name: (s["address"], s["size"], s["line"]) for name, s in result.symbols.items()}
    assert got == expected
    assert {s["file"] for s in result.symbols.values()} == {"asm/gemma.asm"}
    assert json.loads(result.map_path.read_text()) == result.symbols
    assert result.map_path == root / "gemma.map.json"
    assert lay.text_end == start + 18 and lay.bss_end == lay.data_addr + 21


def test_real_map_covers_text_and_points_at_its_labels(gemma):
    syms, lay = gemma.symbols, gemma.result.image.layout
    text = sorted((s["address"], s["size"], n) for n, s in syms.items()
                  if lay.text_addr <= s["address"] < lay.text_end)
    assert text[0][0] == lay.text_addr
    for (addr, size, name), (next_addr, _, _) in zip(text, text[1:] + [(lay.text_end, 0, "")]):
        assert addr + size == next_addr, f"{name}: {addr:#x}+{size} != {next_addr:#x}"
    for name, s in syms.items():
        line = (REPO_ROOT / s["file"]).read_text().splitlines()[s["line"] - 1]
        assert line.split(";")[0].split()[0].rstrip(":") == name, (name, s, line)
    with open(gemma.elf, "rb") as f:
        code = next(ELFFile(f).iter_segments())
        assert code["p_flags"] == 5 and code["p_vaddr"] + lay.text_off == lay.text_addr
        assert code.data()[lay.text_off:] == gemma.result.image.text


def test_shipped_file_is_headers_stub_and_payload(gemma):
    """./gemma is the ELF header, two program headers (PT_GNU_STACK rw-, whose p_type and
    p_flags, all that is read of it, are e_ident's last 8 bytes, then one r-x PT_LOAD at the
    stub's base), the stub's code and the payload: no section headers, nothing after the
    loaded bytes. The stub's code starts over PT_LOAD's p_align: 112 bytes of headers. The
    size table's rows add up to it."""
    packed, blob = gemma.result.packed, gemma.binary.read_bytes()
    stub = packed.stub
    assert len(blob) == HEADERS + len(stub.text) + len(packed.payload) == gemma.result.size
    assert blob[HEADERS:HEADERS + len(stub.text)] == stub.text
    assert blob.endswith(packed.payload)
    with open(gemma.binary, "rb") as f:
        elf = ELFFile(f)
        assert (elf["e_shoff"], elf["e_shnum"], elf["e_shstrndx"],
                elf.num_sections()) == (0,) * 4
        assert [(s["p_type"], s["p_flags"]) for s in elf.iter_segments()] == \
            [("PT_GNU_STACK", 6), ("PT_LOAD", 5)]
        load = elf.get_segment(1)
        assert (load["p_vaddr"], load["p_paddr"]) == (STUB_BASE, pack.HASH)  # (the decoder's)
    table = gemma.result.table
    parts = [int(re.search(rf"^{re.escape(name)} +(\d+)", table, re.M)[1])
             for name in ("headers", "asm/unpack.asm", "asm/stub.asm", "payload")]
    assert parts == [HEADERS, stub.symbols["stub_start"] - stub.layout.text_addr,
                     len(stub.text) - (stub.symbols["stub_start"] - stub.layout.text_addr),
                     len(packed.payload)]
    total = re.search(r"^file total +(\d+) of (\d+) bytes budget", table, re.M)
    assert (int(total[1]), int(total[2])) == (sum(parts), 6144) and sum(parts) == len(blob)


def test_image_has_a_symtab_matching_the_map(gemma):
    """The image (gemma.elf) has section headers and a .symtab matching the map after its
    loaded bytes, which are those of the same program linked without symbols (up to the ELF
    header's section fields): the program that the stub unpacks."""
    image = gemma.result.image
    plain = linker.link(image.text, image.data, image.bss_size, image.entry, image.layout)
    with open(gemma.elf, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        got = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s.name}
        text = elf.get_section_by_name(".text")
        assert (text["sh_addr"], text.data()) == (image.layout.text_addr, image.text)
        assert elf["e_shoff"] >= len(plain)
    assert got == {n: (s["address"], s["size"]) for n, s in gemma.symbols.items()}
    blob = bytearray(gemma.elf.read_bytes()[:len(plain)])
    blob[40:48], blob[60:64] = bytes(8), bytes(4)       # e_shoff; e_shnum, e_shstrndx
    assert bytes(blob) == plain
    assert len(plain) == image.layout.file_end


def test_command_line_prints_the_size_table(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + "include 'part.asm'\n" + EXIT +
                     "segment readable writeable\nv dd 1\nw rb 3\n",
                     "part.asm": "        nop\n"})
    out = root / "out" / "prog"
    proc = builder_cli("--root", str(root), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    image_part, packed_part = proc.stdout.split("\npacked file")
    rows = {line.split()[0]: line.split()[1:] for line in image_part.splitlines() if line}
    size, image = out.stat().st_size, 256 + 4   # 232 + 8 of .text padded to 256, .data
    assert rows[".text"] == ["8"] and rows[".data"] == ["4"]
    assert rows[".bss"][0] == "3"
    assert rows["headers"] == ["etc.", str(image - 12)]
    assert rows["asm/gemma.asm"] == ["7", "4", "3"] and rows["asm/part.asm"] == ["1", "0", "0"]
    assert rows["image"][:2] == ["total", str(image)]
    rows = {line.split()[0]: line.split()[1:] for line in packed_part.splitlines() if line}
    assert rows["headers"] == [str(HEADERS)]
    assert int(rows["headers"][0]) + int(rows["asm/unpack.asm"][0]) + \
        int(rows["asm/stub.asm"][0]) + int(rows["payload"][0]) == size
    assert rows["file"] == ["total", str(size), "of", "6144", "bytes", "budget",
                            f"({6144 - size}", "left);", str(image), "bytes", "of", "image",
                            "when", "it", "runs"]
    assert (out.parent / "prog.map.json").exists() and (out.parent / "prog.elf").exists()
    assert proc.stdout.endswith("wrote " + str(out) + ", prog.elf and prog.map.json\n")


def test_help_and_bad_options():
    proc = builder_cli("build", "--help")  # (`--help` alone lists the commands: test_builder_cli)
    assert proc.returncode == 0 and "OUTPUT.elf" in proc.stdout and "--output" in proc.stdout
    proc = builder_cli("--no-such-option")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--root", "/nonexistent"], "/nonexistent/pyproject.toml: cannot read [tool.gemma] "
                                 "size_budget"),
    (["-o", "/proc/no/such/dir/gemma"], "cannot write /proc/no"),
])
def test_command_line_errors_are_one_line(args, message):
    proc = builder_cli(*args)
    assert proc.returncode == 1
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
