"""Tests for linker/: layout arithmetic, real programs the kernel (and qemu-user) loads and runs,
a file that ends with its loaded bytes and has section headers only with symbols, every check of
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
SHSTRTAB = b"\0.text\0.data\0.bss\0.shstrtab\0.symtab\0.strtab\0"
QEMU = [("qemu-x86_64", "-cpu", "Nehalem"), ("qemu-x86_64", "-cpu", "Haswell")]
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


def section_fields(elf: bytes) -> tuple[int, int, int]:
    """(e_shoff, e_shnum, e_shstrndx) read straight from the ELF header."""
    return (struct.unpack_from("<Q", elf, 40)[0], *struct.unpack_from("<HH", elf, 60))


def without_section_fields(elf: bytes) -> bytes:
    """`elf` with e_shoff, e_shnum and e_shstrndx zeroed: the rest of the headers is what the
    build without symbols writes."""
    out = bytearray(elf)
    struct.pack_into("<Q", out, 40, 0)
    struct.pack_into("<HH", out, 60, 0, 0)
    return bytes(out)


def hello(lay: linker.Layout) -> str:
    return WRITE.format(addr=lay.data_addr, size=lay.data_size) + EXIT.format(code=0)


# ---------------------------------------------------------------- layout

@pytest.mark.parametrize("text_size", [0, 1, 23, 24, 25, 100, 3864, 3865, 4095, 4096, 5000])
@pytest.mark.parametrize("data_size", [0, 1, 70])
def test_layout_rules(text_size, data_size):
    lay = linker.layout(text_size, data_size, 12345)
    text_end = HEADERS + text_size
    assert (lay.text_off, lay.text_addr) == (HEADERS, BASE + HEADERS)
    assert lay.data_off % 64 == 0, lay
    if data_size:
        # .data: the next multiple of 64 in the file, no more padding than that
        assert 0 <= lay.data_off - text_end < 64, lay
        assert lay.file_end == lay.data_off + data_size
    else:
        # no .data bytes: the file ends with .text and the rw segment's offset is inside it
        assert 0 <= text_end - lay.data_off < 64, lay
        assert lay.file_end == text_end
    assert lay.data_addr % 64 == 0 and lay.data_addr % PAGE == lay.data_off % PAGE, lay
    # the rw segment's first page lies after the last page of the r-x segment
    assert lay.data_addr // PAGE > (BASE + text_end - 1) // PAGE, lay
    assert lay.bss_addr == lay.data_addr + data_size and lay.bss_size == 12345
    assert lay.text_end == lay.text_addr + text_size


@pytest.mark.parametrize("sizes", [(-1, 0, 0), (0, -1, 0), (0, 0, -1), (1.0, 0, 0)])
def test_layout_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError):
        linker.layout(*sizes)


@pytest.mark.parametrize("base", [0x10000, 0x200000, BASE])
def test_layout_without_rw_segment(base):
    """writable=False (the packed program): two program headers from e_phoff 8 on
    (PT_GNU_STACK's p_type and p_flags in e_ident's last 8 bytes, PT_LOAD right after the ELF
    header), .text from PT_LOAD's p_align on at `base`, the file at least the headers; no
    .data or .bss allowed; `base` must be a page multiple below 2^31."""
    lay = linker.layout(100, 0, 0, base=base, writable=False)
    assert (lay.phnum, lay.writable, lay.phoff, lay.text_off, lay.text_addr) == \
        (2, False, 8, 112, base + 112)
    assert lay.file_end == lay.code_file_end == 212
    assert linker.layout(5, 0, 0, base=base, writable=False).file_end == 120
    assert lay.paddr_addr == base + 64 + 24                 # PT_LOAD's p_paddr
    for sizes in ((100, 1, 0), (100, 0, 1)):
        with pytest.raises(ValueError, match="no .data and no .bss"):
            linker.layout(*sizes, base=base, writable=False)
    for bad in (0, base + 1, 1 << 31, -PAGE):
        with pytest.raises(ValueError, match="base"):
            linker.layout(100, 0, 0, base=bad)


@pytest.mark.parametrize("symbols", [None, []])
def test_code_only_program_runs(tmp_path, symbols):
    """A program laid out without an rw segment (one r-x PT_LOAD at another base, and
    PT_GNU_STACK; with symbols no .data or .bss section) passes the checks and runs."""
    lay = linker.layout(0, 0, 0, base=0x200000, writable=False)
    text = assemble(EXIT.format(code=42), lay)
    lay = linker.layout(len(text), 0, 0, base=0x200000, writable=False)
    syms = None if symbols is None else [Symbol("start", lay.text_addr, len(text), ".text")]
    elf = linker.link(text, b"", 0, lay.text_addr, lay, syms)
    linker.check(elf)
    assert [(s["p_type"], s["p_flags"]) for s in elf_file(elf).iter_segments()] == \
        [("PT_GNU_STACK", 6), ("PT_LOAD", 5)]
    if symbols is not None:
        names = [s.name for s in elf_file(elf).iter_sections()]
        assert names == ["", ".text", ".shstrtab", ".symtab", ".strtab"]
        with pytest.raises(ValueError, match="unknown section '.data'"):
            linker.link(text, b"", 0, lay.text_addr, lay, [Symbol("d", lay.text_end, 0, ".data")])
    assert run(elf, tmp_path).returncode == 42
    # PT_GNU_STACK's p_type and p_flags are e_ident's last 8 bytes; the code starts over
    # PT_LOAD's p_align
    assert lay.text_off == 64 + 48 and elf[8:16] == struct.pack("<II", 0x6474E551, 6)
    assert elf_file(elf).get_segment(1)["p_align"] == int.from_bytes(text[:8], "little")
    bad = bytearray(elf)
    struct.pack_into("<Q", bad, 24, lay.text_addr - 1)
    with pytest.raises(linker.ElfCheckError, match="'entry' failed"):
        linker.check(bytes(bad))
    bad = bytearray(elf)                # a PT_LOAD there would be read over e_type on
    struct.pack_into("<II", bad, 8, 1, 5)
    with pytest.raises(linker.ElfCheckError, match=r"'overlap' failed: program header 0 "
                       r"\(PT_LOAD\) reads file bytes \[0x8, 0x38\)"):
        linker.check(bytes(bad))


@pytest.mark.parametrize("runner", [(), QEMU[0]], ids=["native", "qemu"])
def test_paddr_holds_data_the_program_reads(tmp_path, runner):
    """link(paddr=...) writes 8 bytes into the r-x PT_LOAD's p_paddr (layout.paddr_addr),
    which no loader reads: the checks pass and the program runs and reads them there."""
    lay = linker.layout(0, 0, 0, base=0x200000, writable=False)
    code = f"mov eax, 0xe7\nmov edi, dword ptr [{lay.paddr_addr:#x}]\nsyscall\n"
    text = assemble(code, lay)
    lay = linker.layout(len(text), 0, 0, base=0x200000, writable=False)
    elf = linker.link(text, b"", 0, lay.text_addr, lay, paddr=0x9E3779B97F4A7C2A)
    linker.check(elf)
    load = elf_file(elf).get_segment(1)
    assert (load["p_type"], load["p_paddr"], load["p_vaddr"]) == \
        ("PT_LOAD", 0x9E3779B97F4A7C2A, 0x200000)
    assert run(elf, tmp_path, runner).returncode == 0x2A
    assert elf_file(linker.link(text, b"", 0, lay.text_addr, lay)) \
        .get_segment(1)["p_paddr"] == 0x200000                 # (by default p_vaddr)


# ---------------------------------------------------------------- programs the kernel runs

@pytest.mark.parametrize("filler", [0, 5, 40, 3900, 4700])
def test_hello_runs(tmp_path, filler):
    """write(1, .data, n) + exit_group(0), with .text of various sizes (one or two pages,
    .data after 0..63 bytes of padding); the file ends with .data."""
    elf, lay = build(hello, b"hello from .data\n", 0, filler)
    linker.check(elf)
    assert len(elf) == lay.data_off + 17 and elf.endswith(b"hello from .data\n")
    res = run(elf, tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"hello from .data\n", b"")


def bss_is_zero(lay: linker.Layout) -> str:
    """Exit 3 if any .bss byte is non-zero; else go on at the label `clean`."""
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
        """)


def data_and_bss(lay: linker.Layout) -> str:
    """Exit 3 if any .bss byte is non-zero; else copy .data to the end of .bss, change .data's
    first byte to 'H', write .data then the copy."""
    copy = lay.bss_end - lay.data_size
    return bss_is_zero(lay) + textwrap.dedent(f"""\
        clean: mov rsi, {lay.data_addr:#x}
        mov rdi, {copy:#x}
        mov ecx, {lay.data_size:#x}
        rep movsb
        mov byte ptr [{lay.data_addr:#x}], 0x48
        """) + WRITE.format(addr=lay.data_addr, size=lay.data_size) + \
        WRITE.format(addr=copy, size=lay.data_size) + EXIT.format(code=0)


@pytest.mark.parametrize("runner", [(), *QEMU], ids=["native", "qemu-nehalem", "qemu-haswell"])
@pytest.mark.parametrize("filler", [0, 4000])
@pytest.mark.parametrize("bss_size", [64, 3 * PAGE + 100])
def test_data_writable_and_bss_zeroed(tmp_path, bss_size, filler, runner):
    """.data is readable and writable; .bss is zero (also the rest of its first page, which the
    loader maps from the file where the file has bytes) and writable up to its last byte."""
    elf, lay = build(data_and_bss, b"hello\n", bss_size, filler)
    linker.check(elf)
    res = run(elf, tmp_path, runner)
    assert (res.returncode, res.stdout) == (0, b"Hello\nhello\n"), res


def bss_only(lay: linker.Layout) -> str:
    """No .data: exit 3 if any .bss byte is non-zero; else write 'bss\\n' to the last 4 bytes
    of .bss and to its first 4 (little-endian dword), and write both to stdout."""
    word = int.from_bytes(b"bss\n", "little")
    return bss_is_zero(lay) + textwrap.dedent(f"""\
        clean: mov dword ptr [{lay.bss_end - 4:#x}], {word:#x}
        mov dword ptr [{lay.bss_addr:#x}], {word:#x}
        """) + WRITE.format(addr=lay.bss_end - 4, size=4) + \
        WRITE.format(addr=lay.bss_addr, size=4) + EXIT.format(code=0)


@pytest.mark.parametrize("runner", [(), *QEMU], ids=["native", "qemu-nehalem", "qemu-haswell"])
@pytest.mark.parametrize("symbols", [False, True], ids=["plain", "symbols"])
@pytest.mark.parametrize("filler", [0, 23, 3800, 4000])
@pytest.mark.parametrize("bss_size", [64, 744, 3 * PAGE + 100])
def test_empty_data_file_ends_with_text(tmp_path, bss_size, filler, symbols, runner):
    """With no .data (like the engine) the file without symbols ends with .text; the rw
    segment has no file bytes, its p_offset (a multiple of 64 inside the file) is congruent to
    its address, and .bss is zero and writable there, with and without the section headers
    that follow the loaded bytes in the symbols build. The fillers put the end of .text
    at 64-byte multiples and not, on the first and second page."""
    make_symbols = (lambda lay: [Symbol("start", lay.text_addr, 1, ".text"),
                                 Symbol("buffer", lay.bss_addr, bss_size, ".bss")]) \
        if symbols else None
    elf, lay = build(bss_only, b"", bss_size, filler, make_symbols)
    linker.check(elf)
    rw = elf_file(elf).get_segment(1).header
    assert (rw.p_type, rw.p_filesz, rw.p_memsz) == ("PT_LOAD", 0, bss_size)
    assert rw.p_offset <= lay.text_file_end and rw.p_offset % 64 == 0
    assert rw.p_vaddr == lay.bss_addr and rw.p_vaddr % PAGE == rw.p_offset % PAGE
    assert (len(elf) == lay.text_file_end) != symbols
    res = run(elf, tmp_path, runner)
    assert (res.returncode, res.stdout) == (0, b"bss\nbss\n"), res


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
@pytest.mark.parametrize("data_size", [0, 9])
def test_file_is_minimal(text_size, data_size):
    """Exactly headers + .text, then (only when .data is not empty) zero padding to a multiple
    of 64 and .data: no section headers, no section names, nothing after the loaded bytes."""
    text = EXIT5.ljust(text_size, b"\xcc")
    data = b"\x11" * data_size
    lay = linker.layout(len(text), len(data), 100)
    elf = linker.link(text, data, 100, lay.text_addr, lay)
    pad = (-(HEADERS + text_size)) % 64 if data else 0
    assert len(elf) == HEADERS + text_size + pad + data_size == lay.file_end, (pad, len(elf))
    linker.check(elf)
    assert section_fields(elf) == (0, 0, 0)
    assert elf_file(elf).num_sections() == 0
    assert b".text" not in elf and b".shstrtab" not in elf
    assert elf[HEADERS:HEADERS + text_size] == text
    assert elf[HEADERS + text_size:HEADERS + text_size + pad] == bytes(pad)
    assert elf[lay.data_off:lay.data_off + len(data)] == data
    loads = [s.header for s in elf_file(elf).iter_segments() if s.header.p_type == "PT_LOAD"]
    assert len(elf) == max(s.p_offset + s.p_filesz for s in loads)


@pytest.mark.parametrize("data,data_off", [(b"abc", 0x140),   # 232 + 66 = 298 rounded up
                                            (b"", 0x100)])     # ... rounded down to 64
def test_headers_read_back(data, data_off):
    """pyelftools reads the program headers written from the ELF rules, and finds no section
    headers; with symbols (here none) the same program headers and these section headers."""
    text, bss = EXIT5 + b"\xcc" * 50, 4096
    lay = linker.layout(len(text), len(data), bss)
    plain = linker.link(text, data, bss, lay.text_addr + 0, lay)
    with_symbols = linker.link(text, data, bss, lay.text_addr + 0, lay, [])
    for blob in plain, with_symbols:
        elf = elf_file(blob)
        hdr = elf.header
        assert (hdr.e_type, hdr.e_machine, hdr.e_entry, hdr.e_phnum, hdr.e_phoff) == \
            ("ET_EXEC", "EM_X86_64", BASE + HEADERS, 3, 64)
        segs = [(s.header.p_type, s.header.p_flags, s.header.p_offset, s.header.p_vaddr,
                 s.header.p_filesz, s.header.p_memsz) for s in elf.iter_segments()]
        assert segs == [("PT_LOAD", 5, 0, BASE, HEADERS + len(text), HEADERS + len(text)),
                        ("PT_LOAD", 6, data_off, BASE + PAGE + data_off, len(data),
                         len(data) + bss),
                        ("PT_GNU_STACK", 6, 0, 0, 0, 0)]
    assert section_fields(plain) == (0, 0, 0) and len(plain) == lay.file_end
    shoff, shnum, shstrndx = section_fields(with_symbols)
    assert shoff >= len(plain) and shoff % 8 == 0 and (shnum, shstrndx) == (7, 4)
    assert len(with_symbols) == shoff + 7 * 64
    elf = elf_file(with_symbols)
    secs = [(s.name, s.header.sh_type, s.header.sh_flags, s.header.sh_addr, s.header.sh_size)
            for s in elf.iter_sections()]
    assert secs == [("", "SHT_NULL", 0, 0, 0),
                    (".text", "SHT_PROGBITS", 6, BASE + HEADERS, len(text)),
                    (".data", "SHT_PROGBITS", 3, BASE + PAGE + data_off, len(data)),
                    (".bss", "SHT_NOBITS", 3, BASE + PAGE + data_off + len(data), bss),
                    (".shstrtab", "SHT_STRTAB", 0, 0, len(SHSTRTAB)),
                    (".symtab", "SHT_SYMTAB", 0, 0, 24),     # the null symbol only
                    (".strtab", "SHT_STRTAB", 0, 0, 1)]
    assert elf.get_section_by_name(".shstrtab").data() == SHSTRTAB
    assert elf.get_section_by_name(".shstrtab").header.sh_offset == len(plain)


@pytest.mark.parametrize("text_size,data_size", [(1, 0), (100, 1), (3000, 500), (4000, 2000),
                                                (3864, 0), (4000, 0)])
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

def good(variant: str = "plain") -> bytes:
    """A correct file: "plain" (.data and .bss), "symbols" (the same with section headers and
    .symtab) or "no-data" (.bss only: the file ends with .text)."""
    if variant == "no-data":
        return build(bss_only, b"", 256)[0]
    elf, _ = build(hello, b"hello\n", 256,
                   symbols=(lambda lay: [Symbol("start", lay.text_addr, 1, ".text")])
                   if variant == "symbols" else None)
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


def append(blob: bytes):
    def apply(elf: bytearray) -> None:
        elf.extend(blob)
    return apply


def both(*mutations):
    def apply(elf: bytearray) -> None:
        for m in mutations:
            m(elf)
    return apply


LAY = build(hello, b"hello\n", 256)[1]
E_SHOFF, E_SHNUM, E_SHSTRNDX = 40, 60, 62
# LAY is the layout of "plain" and "symbols"; mutations using it apply to those two only
PLAIN, SYMS, NODATA = ("plain",), ("symbols",), ("no-data",)
BOTH, ALL, NO_SHDRS = PLAIN + SYMS, PLAIN + SYMS + NODATA, PLAIN + NODATA
BAD = [  # (id, files it applies to, mutation, check name, fragment of the message)
    ("truncated", ALL, truncate(40), "parse", "ELF header"),
    ("shoff-past-end", ALL, patch("<Q", E_SHOFF, 1 << 20), "parse", "section headers"),
    ("class32", ALL, patch("B", 4, 1), "class", "ELFCLASS32"),
    ("big-endian", ALL, patch("B", 5, 2), "class", "big-endian"),
    ("machine", ALL, patch("<H", 18, 3), "machine", "EM_386"),
    ("type-dyn", ALL, patch("<H", 16, 3), "type", "ET_DYN"),
    ("interp", ALL, patch("<I", ph(2, 0), 3), "interp", "PT_INTERP"),
    ("dynamic", ALL, patch("<I", ph(2, 0), 2), "dynamic", "PT_DYNAMIC"),
    ("text-rwx", ALL, patch("<I", ph(0, 4), 7), "wx", "rwx"),
    ("data-rwx", ALL, patch("<I", ph(1, 4), 7), "wx", "program header 1"),
    ("stack-exec", ALL, patch("<I", ph(2, 4), 5), "stack", "executable stack"),
    ("stack-missing", ALL, patch("<I", ph(2, 0), 0), "stack", "no PT_GNU_STACK"),
    ("data-read-only", ALL, patch("<I", ph(1, 4), 4), "segments", "[r--, r-x]"),
    ("text-not-exec", ALL, patch("<I", ph(0, 4), 4), "segments", "[r--, rw-]"),
    ("no-data-segment", SYMS, patch("<I", ph(1, 0), 4), "coverage", ".data"),
    ("two-code-segments", ALL, patch("<I", ph(1, 4), 5), "segments", "[r-x, r-x]"),
    ("phdrs-not-mapped", ALL, patch("<Q", ph(0, 8), 0x100), "segments",
     "does not map the program headers"),
    ("shnum-without-shoff", NO_SHDRS, patch("<H", E_SHNUM, 5), "sections", "e_shnum 5"),
    ("shstrndx-without-shdrs", NO_SHDRS, patch("<H", E_SHSTRNDX, 4), "sections",
     "e_shstrndx is 4"),
    ("shoff-without-shnum", SYMS, patch("<H", E_SHNUM, 0), "sections", "e_shnum 0"),
    ("no-data", SYMS, patch("<I", sh(2, 0), SHSTRTAB.index(b".bss")), "sections", "no .data"),
    ("no-shstrtab", SYMS, patch("<I", sh(4, 0), SHSTRTAB.index(b".bss")), "sections",
     "no .shstrtab"),
    ("text-sec-not-exec", SYMS, patch("<Q", sh(1, 8), 2), "sections",
     ".text is SHT_PROGBITS flags 0x2"),
    ("data-exec", SYMS, patch("<Q", sh(2, 8), 7), "sections", ".data"),
    ("bss-progbits", SYMS, patch("<I", sh(3, 4), 1), "sections", ".bss is SHT_PROGBITS"),
    ("shstrtab-alloc", SYMS, patch("<Q", sh(4, 8), 2), "sections", ".shstrtab"),
    ("entry-past-text", BOTH, patch("<Q", 24, LAY.text_end), "entry", "outside the r-x"),
    ("entry-in-data", BOTH, patch("<Q", 24, LAY.data_addr), "entry", "outside the r-x"),
    # (the last 48 bytes of a last PT_GNU_STACK header may be code: linker/layout.py)
    ("entry-in-headers", ALL, patch("<Q", 24, BASE + HEADERS - 49), "entry", "outside the r-x"),
    ("entry-past-text-section", SYMS, both(patch("<Q", 24, LAY.text_addr + 1),
                                           patch("<Q", sh(1, 32), 1)), "entry",
     "outside .text"),
    ("filesz-past-eof", ALL, patch("<Q", ph(1, 32), 1 << 16), "bounds", "file size"),
    ("filesz-over-memsz", BOTH, patch("<Q", ph(1, 40), 1), "bounds", "memsz"),
    ("loads-share-page", PLAIN, patch("<Q", ph(1, 16), BASE + LAY.data_off), "bounds",
     "share a page"),
    ("loads-share-page", SYMS, both(patch("<Q", ph(1, 16), BASE + LAY.data_off),
                                    patch("<Q", sh(2, 16), BASE + LAY.data_off)),
     "bounds", "share a page"),
    ("not-congruent", BOTH, patch("<Q", ph(1, 16), LAY.data_addr + 16), "congruence", "modulo"),
    ("data-off-wrong", SYMS, patch("<Q", sh(2, 24), LAY.data_off + 1), "coverage", ".data"),
    ("bss-past-memsz", SYMS, patch("<Q", sh(3, 32), 257), "coverage", ".bss"),
    ("text-past-filesz", SYMS, both(patch("<Q", ph(0, 32), HEADERS + 5),
                                    patch("<Q", ph(0, 40), HEADERS + 5)),
     "coverage", ".text"),
    ("text-past-filesz", NODATA, both(patch("<Q", ph(0, 32), HEADERS + 5),
                                     patch("<Q", ph(0, 40), HEADERS + 5)),
     "tail", "never read"),
    ("trailing-byte", NO_SHDRS, append(b"\0"), "tail", "1 bytes never read"),
    ("trailing-shdrs", NO_SHDRS, append(bytes(5 * 64)), "tail", "320 bytes never read"),
]


@pytest.mark.parametrize("variant,mutation,name,fragment",
                         [(v, *b[2:]) for b in BAD for v in b[1]],
                         ids=[f"{b[0]}-{v}" for b in BAD for v in b[1]])
def test_check_rejects(variant, mutation, name, fragment):
    elf = bytearray(good(variant))
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
    address, FUNC in .text, OBJECT in .data/.bss, linked to .strtab; the program still runs,
    and the file without symbols is this file's first bytes, up to the ELF header's section
    fields: everything the symbols add comes after the loaded bytes."""
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
    assert len(plain) == lay.file_end and len(elf) > len(plain)
    assert without_section_fields(elf[:len(plain)]) == plain
    assert section_fields(plain) == (0, 0, 0) and section_fields(elf)[0] >= len(plain)
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
    plain = [build(hello, b"hello\n", 256)[0] for _ in range(2)]
    assert plain[0] == plain[1] == linker.link(first[HEADERS:lay.text_file_end], b"hello\n",
                                               256, lay.text_addr, lay)
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
