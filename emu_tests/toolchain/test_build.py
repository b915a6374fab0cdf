"""builder/asm/build.py, end to end: the shipped program's usage path, reproducible output, the
size budget, the symbol map (and .symtab with --symbols), the size table and the command
line."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from elftools.elf.elffile import ELFFile

from builder.asm.build import REPO_ROOT, build
from builder.asm.errors import BuildError
from conftest import PROLOGUE

EXIT = "        mov eax, 60\n        syscall\n"


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


@pytest.mark.parametrize("symbols", [False, True])
def test_two_builds_are_byte_identical(snapshot, tmp_path, symbols):
    first = build(snapshot, tmp_path / "a" / "gemma", symbols=symbols)
    second = build(snapshot, tmp_path / "b" / "gemma", symbols=symbols)
    assert first.binary.read_bytes() == second.binary.read_bytes()
    assert first.map_path.read_text() == second.map_path.read_text()
    assert second.binary.stat().st_mode & 0o777 == 0o755


def test_over_budget_build_fails_and_writes_nothing(asm_tree):
    root = asm_tree(EXIT + "        db 6000 dup 0\n")
    with pytest.raises(BuildError) as err:
        build(root, root / "gemma")
    m = re.fullmatch(r"gemma would be (\d+) bytes, (\d+) over the budget of 6144 bytes "
                     r"\(pyproject.toml \[tool.gemma\] size_budget\)", str(err.value))
    assert m and int(m[1]) - 6144 == int(m[2]) and int(m[1]) > 6000, str(err.value)
    assert not (root / "gemma").exists()
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
    with open(gemma.binary, "rb") as f:
        code = next(ELFFile(f).iter_segments())
        assert code["p_flags"] == 5 and code["p_vaddr"] + lay.text_off == lay.text_addr
        assert code.data()[lay.text_off:] == gemma.result.image.text


def test_shipped_file_is_headers_and_loaded_bytes(gemma):
    """./gemma is the ELF and program headers, .text and (if any) .data after padding to a
    multiple of 64: no section headers, nothing after the loaded bytes. The size table's
    "headers etc." row is what is neither .text nor .data."""
    image, blob = gemma.result.image, gemma.binary.read_bytes()
    lay = image.layout
    pad = (-(232 + len(image.text))) % 64 if image.data else 0
    assert len(blob) == 232 + len(image.text) + pad + len(image.data) == lay.file_end
    assert blob[232:232 + len(image.text)] == image.text
    assert blob.endswith(image.data or image.text)
    with open(gemma.binary, "rb") as f:
        elf = ELFFile(f)
        assert (elf["e_shoff"], elf["e_shnum"], elf["e_shstrndx"],
                elf.num_sections()) == (0,) * 4
    headers = re.search(r"^headers etc\. +(\d+)$", gemma.result.table, re.M)
    assert int(headers[1]) == 232 + pad


def test_symbols_flag_adds_a_symtab_matching_the_map(snapshot, tmp_path):
    """--symbols adds section headers and a .symtab matching the map after the loaded bytes,
    which are those of the build without symbols (up to the ELF header's section fields)."""
    result = build(snapshot, tmp_path / "gemma", symbols=True)
    plain = build(snapshot, tmp_path / "plain" / "gemma").binary.read_bytes()
    with open(result.binary, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        got = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s.name}
        text = elf.get_section_by_name(".text")
        assert (text["sh_addr"], text.data()) == (result.image.layout.text_addr,
                                                 result.image.text)
        assert elf["e_shoff"] >= len(plain)
    assert got == {n: (s["address"], s["size"]) for n, s in result.symbols.items()}
    blob = bytearray(result.binary.read_bytes()[:len(plain)])
    blob[40:48], blob[60:64] = bytes(8), bytes(4)       # e_shoff; e_shnum, e_shstrndx
    assert bytes(blob) == plain


def test_command_line_prints_the_size_table(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + "include 'part.asm'\n" + EXIT +
                     "segment readable writeable\nv dd 1\nw rb 3\n",
                     "part.asm": "        nop\n"})
    out = root / "out" / "prog"
    proc = builder_cli("--root", str(root), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines() if line}
    size = out.stat().st_size
    assert rows[".text"] == ["8"] and rows[".data"] == ["4"]
    assert rows[".bss"][0] == "3"
    assert rows["headers"] == ["etc.", str(size - 12)]
    assert size == 256 + 4                  # 232 + 8 of .text padded to 256, .data, no more
    assert rows["asm/gemma.asm"] == ["7", "4", "3"] and rows["asm/part.asm"] == ["1", "0", "0"]
    assert rows["file"] == ["total", str(size), "of", "6144", "bytes", "budget",
                            f"({6144 - size}", "left)"]
    assert (out.parent / "prog.map.json").exists()


def test_help_and_bad_options():
    proc = builder_cli("build", "--help")  # (`--help` alone lists the commands: test_builder_cli)
    assert proc.returncode == 0 and "--symbols" in proc.stdout and "--output" in proc.stdout
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
