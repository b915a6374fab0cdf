"""Tests for linker/: layout arithmetic, real programs the kernel loads and runs, every check of
linker.check against a deliberately broken file, symbols read back, determinism.

The programs are assembled here with keystone directly (no front end), and their addresses come
from linker.layout, as the build does it. Expected values (sizes, offsets) are written out from
the ELF rules, not taken from the linker's own code."""
import io
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from keystone import KS_ARCH_X86, KS_MODE_64, Ks

import linker
from linker import ElfCheckError, Symbol

BASE, PAGE = 0x400000, 0x1000
HEADERS = 64 + 3 * 56                       # Elf64_Ehdr + 3 Elf64_Phdr
SHSTRTAB = b"\0.text\0.data\0.bss\0.shstrtab\0"
KS = Ks(KS_ARCH_X86, KS_MODE_64)

# keystone source of exit_group(code) and of write(1, addr, size)
EXIT = "mov eax, 0xe7\nmov edi, {code:#x}\nsyscall\n"
WRITE = "mov eax, 0x1\nmov edi, 0x1\nmov esi, {addr:#x}\nmov edx, {size:#x}\nsyscall\n"


def assemble(source: str, lay: linker.Layout) -> bytes:
    """keystone's encoding of `source` at .text's address (every number written 0x...)."""
    code, _ = KS.asm(source, lay.text_addr)
    return bytes(code)


def build(make_source, data: bytes, bss_size: int, filler: int = 0,
          symbols=None) -> tuple[bytes, linker.Layout]:
    """Link the program `make_source(layout) -> str`, followed by `filler` int3 bytes, as the
    builder does: lay out, assemble, lay out again with the real size, reassemble."""
    lay = linker.layout(0, len(data), bss_size)
    for _ in range(3):
        text = assemble(make_source(lay), lay) + b"\xcc" * filler
        new = linker.layout(len(text), len(data), bss_size)
        if new == lay:
            break
        lay = new
    text = assemble(make_source(lay), lay) + b"\xcc" * filler
    assert len(text) == lay.text_size, "program size did not settle"
    syms = symbols(lay) if symbols else None
    return linker.link(text, data, bss_size, lay.text_addr, lay, syms), lay


def run(elf: bytes, tmp_path: Path, runner: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run the file natively, or under `runner` (e.g. qemu-user, whose ELF loader is
    another implementation than the kernel's)."""
    path = tmp_path / "prog"
    path.write_bytes(elf)
    path.chmod(0o755)
    return subprocess.run([*runner, str(path)], capture_output=True, timeout=30)


def elf_file(elf: bytes) -> ELFFile:
    return ELFFile(io.BytesIO(elf))


def hello(lay: linker.Layout) -> str:
    return WRITE.format(addr=lay.data_addr, size=lay.data_size) + EXIT.format(code=0)


# ---------------------------------------------------------------- layout

@pytest.mark.parametrize("text_size", [0, 1, 23, 24, 25, 100, 3864, 3865, 4095, 4096, 5000])
@pytest.mark.parametrize("data_size", [0, 1, 70])
def test_layout_rules(text_size, data_size):
    lay = linker.layout(text_size, data_size, 12345)
    text_end = HEADERS + text_size
    assert (lay.text_off, lay.text_addr) == (HEADERS, BASE + HEADERS)
    # .data: the next multiple of 64 in the file, no more padding than that
    assert lay.data_off % 64 == 0 and 0 <= lay.data_off - text_end < 64, lay
    assert lay.data_addr % 64 == 0 and lay.data_addr % PAGE == lay.data_off % PAGE, lay
    # the rw segment's first page lies after the last page of the r-x segment
    assert lay.data_addr // PAGE > (BASE + text_end - 1) // PAGE, lay
    assert lay.bss_addr == lay.data_addr + data_size and lay.bss_size == 12345
    assert lay.text_end == lay.text_addr + text_size


@pytest.mark.parametrize("sizes", [(-1, 0, 0), (0, -1, 0), (0, 0, -1), (1.0, 0, 0)])
def test_layout_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError):
        linker.layout(*sizes)


# ---------------------------------------------------------------- programs the kernel runs

@pytest.mark.parametrize("filler", [0, 5, 40, 3900, 4700])
def test_hello_runs(tmp_path, filler):
    """write(1, .data, n) + exit_group(0), with .text of various sizes (one or two pages,
    .shstrtab in the padding before .data or at the end)."""
    elf, lay = build(hello, b"hello from .data\n", 0, filler)
    linker.check(elf)
    res = run(elf, tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"hello from .data\n", b"")


def data_and_bss(lay: linker.Layout) -> str:
    """Exit 3 if any .bss byte is non-zero; else copy .data to the end of .bss, change .data's
    first byte to 'H', write .data then the copy."""
    copy = lay.bss_end - lay.data_size
    return textwrap.dedent(f"""\
        mov rdi, {lay.bss_addr:#x}
        mov ecx, {lay.bss_size:#x}
        xor eax, eax
        scan: or al, byte ptr [rdi]
        inc rdi
        dec ecx
        jnz scan
        test al, al
        jz clean
        {EXIT.format(code=3)}
        clean: mov rsi, {lay.data_addr:#x}
        mov rdi, {copy:#x}
        mov ecx, {lay.data_size:#x}
        rep movsb
        mov byte ptr [{lay.data_addr:#x}], 0x48
        """) + WRITE.format(addr=lay.data_addr, size=lay.data_size) + \
        WRITE.format(addr=copy, size=lay.data_size) + EXIT.format(code=0)


@pytest.mark.parametrize("runner", [(), ("qemu-x86_64", "-cpu", "Nehalem")],
                         ids=["native", "qemu"])
@pytest.mark.parametrize("filler", [0, 4000])
@pytest.mark.parametrize("bss_size", [64, 3 * PAGE + 100])
def test_data_writable_and_bss_zeroed(tmp_path, bss_size, filler, runner):
    """.data is readable and writable; .bss is zero (also the part of its first page where the
    file holds the section headers) and writable up to its last byte."""
    elf, lay = build(data_and_bss, b"hello\n", bss_size, filler)
    linker.check(elf)
    res = run(elf, tmp_path, runner)
    assert (res.returncode, res.stdout) == (0, b"Hello\nhello\n"), res


def faults(tmp_path: Path, make_source, data: bytes = b"") -> None:
    """The program must die by SIGSEGV (it would exit 5 if the kernel let it through)."""
    elf, _ = build(make_source, data, 0)
    linker.check(elf)
    res = run(elf, tmp_path)
    assert res.returncode == -signal.SIGSEGV, (res.returncode, res.stdout, res.stderr)


EXIT5 = bytes(KS.asm(EXIT.format(code=5), 0)[0])


def test_text_not_writable(tmp_path):
    faults(tmp_path, lambda lay: f"mov byte ptr [{lay.text_addr:#x}], 0x90\n"
           + EXIT.format(code=5))


def test_data_not_executable(tmp_path):
    """.data holds the code of exit_group(5); jumping there must fault."""
    faults(tmp_path, lambda lay: f"mov eax, {lay.data_addr:#x}\njmp rax\n", EXIT5)


def test_stack_not_executable(tmp_path):
    """The code of exit_group(5) copied to the stack; jumping there must fault."""
    word = int.from_bytes(EXIT5.ljust(16, b"\x90"), "little")
    faults(tmp_path, lambda lay: textwrap.dedent(f"""\
        mov rax, {word >> 64:#x}
        push rax
        mov rax, {word & (1 << 64) - 1:#x}
        push rax
        jmp rsp
        """))


# ---------------------------------------------------------------- file structure

@pytest.mark.parametrize("text_size", [60, 61, 88, 89])   # padding before .data: 28 27 0 63
def test_file_is_minimal(text_size):
    """Exactly headers + .text + padding to 64 + .data + 5 section headers, plus .shstrtab at
    the end only when it does not fit in the padding."""
    text = EXIT5.ljust(text_size, b"\xcc")
    data = b"\x11" * 9
    lay = linker.layout(len(text), len(data), 100)
    elf = linker.link(text, data, 100, lay.text_addr, lay)
    pad = (-(HEADERS + text_size)) % 64
    tail = 0 if pad >= len(SHSTRTAB) else len(SHSTRTAB)
    assert len(elf) == HEADERS + text_size + pad + len(data) + tail + 5 * 64, (pad, len(elf))
    linker.check(elf)
    sections = {s.name: s for s in elf_file(elf).iter_sections()}
    assert sections[".shstrtab"].data() == SHSTRTAB
    assert elf[HEADERS:HEADERS + text_size] == text
    assert elf[lay.data_off:lay.data_off + len(data)] == data


def test_headers_read_back():
    """pyelftools reads the program and section headers written from the ELF rules."""
    text, data, bss = EXIT5 + b"\xcc" * 50, b"abc", 4096
    lay = linker.layout(len(text), len(data), bss)
    elf = elf_file(linker.link(text, data, bss, lay.text_addr + 0, lay))
    hdr = elf.header
    assert (hdr.e_type, hdr.e_machine, hdr.e_entry, hdr.e_phnum) == \
        ("ET_EXEC", "EM_X86_64", BASE + HEADERS, 3)
    segs = [(s.header.p_type, s.header.p_flags, s.header.p_offset, s.header.p_vaddr,
             s.header.p_filesz, s.header.p_memsz) for s in elf.iter_segments()]
    data_off = 0x140                        # 232 + 66 = 298 rounded up to 64
    assert segs == [("PT_LOAD", 5, 0, BASE, HEADERS + len(text), HEADERS + len(text)),
                    ("PT_LOAD", 6, data_off, BASE + PAGE + data_off, 3, 3 + bss),
                    ("PT_GNU_STACK", 6, 0, 0, 0, 0)]
    secs = [(s.name, s.header.sh_type, s.header.sh_flags, s.header.sh_addr, s.header.sh_size)
            for s in elf.iter_sections()]
    assert secs == [("", "SHT_NULL", 0, 0, 0),
                    (".text", "SHT_PROGBITS", 6, BASE + HEADERS, len(text)),
                    (".data", "SHT_PROGBITS", 3, BASE + PAGE + data_off, 3),
                    (".bss", "SHT_NOBITS", 3, BASE + PAGE + data_off + 3, bss),
                    (".shstrtab", "SHT_STRTAB", 0, 0, len(SHSTRTAB))]


@pytest.mark.parametrize("text_size,data_size", [(1, 0), (100, 1), (3000, 500), (4000, 2000)])
def test_congruence_and_coverage(text_size, data_size):
    """Every PT_LOAD maps file offset o to address a with o == a mod 4096, and each section's
    bytes in the file are the bytes the kernel maps at its address."""
    text, data = bytes(range(256)) * 20, bytes(reversed(range(256))) * 8
    text, data = text[:text_size], data[:data_size]
    lay = linker.layout(text_size, data_size, 8)
    blob = linker.link(text, data, 8, lay.text_addr, lay)
    loads = [s.header for s in elf_file(blob).iter_segments() if s.header.p_type == "PT_LOAD"]
    for seg in loads:
        assert seg.p_offset % PAGE == seg.p_vaddr % PAGE, seg
    image = {}                              # address -> byte, as the kernel maps the file
    for seg in loads:
        for i in range(seg.p_filesz):
            image[seg.p_vaddr + i] = blob[seg.p_offset + i]
    for addr, want in ((lay.text_addr, text), (lay.data_addr, data)):
        got = bytes(image.get(addr + i, -1) & 0xFF for i in range(len(want)))
        assert got == want, f"bytes at {addr:#x} differ"


def test_link_rejects_mismatches():
    lay = linker.layout(4, 2, 0)
    with pytest.raises(ValueError, match="sizes"):
        linker.link(b"\x90" * 5, b"ab", 0, lay.text_addr, lay)
    with pytest.raises(ValueError, match="sizes"):
        linker.link(b"\x90" * 4, b"ab", 1, lay.text_addr, lay)
    with pytest.raises(ValueError, match="entry"):
        linker.link(b"\x90" * 4, b"ab", 0, lay.text_end, lay)


# ---------------------------------------------------------------- check: each check rejects

def good() -> bytes:
    elf, _ = build(hello, b"hello\n", 256)
    return elf


def shdr_off(elf: bytes, index: int, field: int) -> int:
    return struct.unpack_from("<Q", elf, 40)[0] + 64 * index + field


def patch(fmt: str, offset, value):
    """A mutation: offset is an int or a function of the file (for section headers)."""
    def apply(elf: bytearray) -> None:
        struct.pack_into(fmt, elf, offset(elf) if callable(offset) else offset, value)
    return apply


def ph(index: int, field: int) -> int:
    """File offset of a field of program header `index` (p_type 0, p_flags 4, p_offset 8,
    p_vaddr 16, p_filesz 32, p_memsz 40)."""
    return 64 + 56 * index + field


def sh(index: int, field: int):
    """File offset of a field of section header `index` (sh_name 0, sh_type 4, sh_flags 8,
    sh_addr 16, sh_offset 24, sh_size 32); sections: 1 .text 2 .data 3 .bss 4 .shstrtab."""
    return lambda elf: shdr_off(elf, index, field)


def truncate(n: int):
    def apply(elf: bytearray) -> None:
        del elf[n:]
    return apply


def both(*mutations):
    def apply(elf: bytearray) -> None:
        for m in mutations:
            m(elf)
    return apply


LAY = build(hello, b"hello\n", 256)[1]
BAD = [  # (id, mutation, check name, fragment of the message)
    ("truncated", truncate(40), "parse", "ELF header"),
    ("shoff-past-end", patch("<Q", 40, 1 << 20), "parse", "section headers"),
    ("class32", patch("B", 4, 1), "class", "ELFCLASS32"),
    ("big-endian", patch("B", 5, 2), "class", "big-endian"),
    ("machine", patch("<H", 18, 3), "machine", "EM_386"),
    ("type-dyn", patch("<H", 16, 3), "type", "ET_DYN"),
    ("interp", patch("<I", ph(2, 0), 3), "interp", "PT_INTERP"),
    ("dynamic", patch("<I", ph(2, 0), 2), "dynamic", "PT_DYNAMIC"),
    ("text-rwx", patch("<I", ph(0, 4), 7), "wx", "rwx"),
    ("data-rwx", patch("<I", ph(1, 4), 7), "wx", "program header 1"),
    ("stack-exec", patch("<I", ph(2, 4), 5), "stack", "executable stack"),
    ("stack-missing", patch("<I", ph(2, 0), 0), "stack", "no PT_GNU_STACK"),
    ("no-data", patch("<I", sh(2, 0), SHSTRTAB.index(b".bss")), "sections", "no .data"),
    ("no-shstrtab", patch("<I", sh(4, 0), SHSTRTAB.index(b".bss")), "sections",
     "no .shstrtab"),
    ("text-not-exec", patch("<Q", sh(1, 8), 2), "sections", ".text is SHT_PROGBITS flags 0x2"),
    ("data-exec", patch("<Q", sh(2, 8), 7), "sections", ".data"),
    ("bss-progbits", patch("<I", sh(3, 4), 1), "sections", ".bss is SHT_PROGBITS"),
    ("shstrtab-alloc", patch("<Q", sh(4, 8), 2), "sections", ".shstrtab"),
    ("entry-past-text", patch("<Q", 24, LAY.text_end), "entry", "outside .text"),
    ("entry-in-data", patch("<Q", 24, LAY.data_addr), "entry", "outside .text"),
    ("filesz-past-eof", patch("<Q", ph(1, 32), 1 << 16), "bounds", "file size"),
    ("filesz-over-memsz", patch("<Q", ph(1, 40), 1), "bounds", "memsz"),
    ("loads-share-page", both(patch("<Q", ph(1, 16), BASE + LAY.data_off),
                              patch("<Q", sh(2, 16), BASE + LAY.data_off)),
     "bounds", "share a page"),
    ("not-congruent", patch("<Q", ph(1, 16), LAY.data_addr + 16), "congruence", "modulo"),
    ("data-off-wrong", patch("<Q", sh(2, 24), LAY.data_off + 1), "coverage", ".data"),
    ("bss-past-memsz", patch("<Q", sh(3, 32), 257), "coverage", ".bss"),
    ("text-past-filesz", both(patch("<Q", ph(0, 32), HEADERS), patch("<Q", ph(0, 40), HEADERS)),
     "coverage", ".text"),
]


@pytest.mark.parametrize("mutation,name,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_check_rejects(mutation, name, fragment):
    elf = bytearray(good())
    linker.check(bytes(elf))                # the unpatched file passes
    mutation(elf)
    with pytest.raises(ElfCheckError) as err:
        linker.check(bytes(elf))
    msg = str(err.value)
    assert err.value.check == name, msg
    assert msg.startswith(f"ELF check '{name}' failed: ") and "\n" not in msg, msg
    assert fragment in msg, msg


def test_check_budget(tmp_path):
    elf = good()
    linker.check(elf, budget=len(elf))
    with pytest.raises(ElfCheckError, match=rf"'budget' failed: {len(elf)} bytes, budget "
                                            rf"{len(elf) - 1} \(1 over\)"):
        linker.check(elf, budget=len(elf) - 1)
    path = tmp_path / "prog"                # a path works as well as bytes
    path.write_bytes(elf)
    linker.check(path, budget=6144)
    linker.check(str(path))


# ---------------------------------------------------------------- symbols

def program_symbols(lay: linker.Layout) -> list[Symbol]:
    return [Symbol("zeta_counter", lay.bss_addr, 8, ".bss"),
            Symbol("quit", lay.text_addr + 19, lay.text_size - 19, ".text"),
            Symbol("message", lay.data_addr, lay.data_size, ".data"),
            Symbol("start", lay.text_addr, 19, ".text"),
            Symbol("table", lay.bss_addr + 8, 248, ".bss"),
            Symbol("tail", lay.data_addr + 4, 10, ".data")]   # runs on into .bss


def test_symbols_read_back(tmp_path):
    """.symtab/.strtab as pyelftools (like gdb and perf) reads them: null first, sorted by
    address, FUNC in .text, OBJECT in .data/.bss, linked to .strtab; the program still runs and
    its loaded bytes equal the build without symbols."""
    elf, lay = build(hello, b"hello\n", 256, symbols=program_symbols)
    plain, _ = build(hello, b"hello\n", 256)
    linker.check(elf, budget=None)
    f = elf_file(elf)
    symtab = f.get_section_by_name(".symtab")
    assert symtab.header.sh_type == "SHT_SYMTAB" and symtab.header.sh_entsize == 24
    assert f.get_section(symtab.header.sh_link).name == ".strtab"
    assert symtab.header.sh_info == 1       # one past the last local symbol (the null one)
    assert symtab.header.sh_offset % 8 == 0
    got = [(s.name, s.entry.st_value, s.entry.st_size, s.entry.st_info.type,
            s.entry.st_info.bind,
            None if s.entry.st_shndx == "SHN_UNDEF" else f.get_section(s.entry.st_shndx).name)
           for s in symtab.iter_symbols()]
    want = [("", 0, 0, "STT_NOTYPE", "STB_LOCAL", None),
            ("start", lay.text_addr, 19, "STT_FUNC", "STB_GLOBAL", ".text"),
            ("quit", lay.text_addr + 19, lay.text_size - 19, "STT_FUNC", "STB_GLOBAL", ".text"),
            ("message", lay.data_addr, 6, "STT_OBJECT", "STB_GLOBAL", ".data"),
            ("tail", lay.data_addr + 4, 10, "STT_OBJECT", "STB_GLOBAL", ".data"),
            ("zeta_counter", lay.bss_addr, 8, "STT_OBJECT", "STB_GLOBAL", ".bss"),
            ("table", lay.bss_addr + 8, 248, "STT_OBJECT", "STB_GLOBAL", ".bss")]
    assert got == want
    assert elf[HEADERS:lay.text_file_end] == plain[HEADERS:lay.text_file_end]
    assert elf[lay.data_off:lay.data_file_end] == plain[lay.data_off:lay.data_file_end]
    res = run(elf, tmp_path)
    assert (res.returncode, res.stdout) == (0, b"hello\n")
    # binutils and gdb, where installed, are second readers (CI relies on pyelftools above)
    path = tmp_path / "prog"
    if shutil.which("nm"):
        nm = subprocess.run(["nm", "-n", str(path)], capture_output=True, text=True, check=True)
        kinds = {".text": "T", ".data": "D", ".bss": "B"}
        assert nm.stdout.splitlines() == [f"{s.address:016x} {kinds[s.section]} {s.name}" for s in
                                          sorted(program_symbols(lay),
                                                 key=lambda s: (s.address, s.name))]
    if shutil.which("gdb"):
        gdb = subprocess.run(["gdb", "-nx", "-batch", "-ex", "info address quit", str(path)],
                             capture_output=True, text=True, timeout=60)
        assert f'Symbol "quit" is at {lay.text_addr + 19:#x}' in gdb.stdout, gdb.stdout


@pytest.mark.parametrize("bad,match", [
    (Symbol("start", BASE + HEADERS, 1, ".text"), "duplicate"),
    (Symbol("far", BASE, 1, ".text"), "not inside .text"),
    (Symbol("big", LAY.data_addr, 6 + 257, ".data"), "not inside .data"),
    (Symbol("late", LAY.bss_addr + 1, 0, ".data"), "not inside .data"),
    (Symbol("over", LAY.bss_end - 1, 2, ".bss"), "not inside .bss"),
    (Symbol("neg", LAY.bss_addr, -1, ".bss"), "not inside .bss"),
    (Symbol("odd", LAY.data_addr, 1, ".rodata"), "unknown section"),
    (Symbol("", LAY.data_addr, 1, ".data"), "bad ELF name"),
])
def test_symbols_rejected(bad, match):
    lay = LAY
    text = assemble(hello(lay), lay)
    with pytest.raises(ValueError, match=match):
        linker.link(text, b"hello\n", 256, lay.text_addr, lay,
                    [Symbol("start", lay.text_addr, 1, ".text"), bad])


# ---------------------------------------------------------------- determinism

def test_deterministic():
    """Same input, same bytes: twice in this process, with the symbols in another order, and
    in a fresh interpreter with another hash seed."""
    first, lay = build(hello, b"hello\n", 256, symbols=program_symbols)
    second, _ = build(hello, b"hello\n", 256, symbols=program_symbols)
    shuffled = program_symbols(lay)
    random.Random(1).shuffle(shuffled)
    third = linker.link(first[HEADERS:lay.text_file_end], b"hello\n", 256, lay.text_addr, lay,
                        shuffled)
    assert first == second == third
    script = textwrap.dedent("""\
        import sys, linker
        sys.path.insert(0, sys.argv[1])
        import test_linker as t
        sys.stdout.buffer.write(t.build(t.hello, b"hello\\n", 256,
                                        symbols=t.program_symbols)[0])
        """)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)],
                         capture_output=True, env=env, timeout=60, check=True).stdout
    assert out == first
