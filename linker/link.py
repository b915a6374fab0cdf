"""Write the executable: `link(text, data, bss_size, entry, layout, symbols=None) -> bytes`.

File order: ELF header, program headers (PT_LOAD r-x over offset 0 .. end of .text, PT_LOAD rw-
over .data with .bss as memory beyond its file size, PT_GNU_STACK rw-; without an rw segment
PT_GNU_STACK, whose p_type and p_flags are e_ident's last 8 bytes, then the PT_LOAD r-x, see
layout.py), .text, and when .data is not empty, zero padding up to data_off and .data. The
file ends there, at layout.file_end: no section header table and no .shstrtab (e_shoff,
e_shnum and e_shstrndx are 0), since loading and running the program reads only the program
headers. With `symbols` (a list, even empty) the bytes up to there stay the same but for those
three ELF header fields, and the file goes on with what gdb and perf read: .shstrtab, .symtab
(8-aligned), .strtab and the section header table (8-aligned; null, .text, .data, .bss,
.shstrtab, .symtab, .strtab). The output depends only on the arguments (byte-identical for the
same input). Raises ValueError when the arguments disagree with the layout (sizes, entry
outside .text) or a symbol is bad (see symbols.py)."""
from .headers import (PF_R, PF_W, PF_X, PT_GNU_STACK, PT_LOAD, SHF_ALLOC, SHF_EXECINSTR,
                      SHF_WRITE, SHT_NOBITS, SHT_NULL, SHT_PROGBITS, SHT_STRTAB, SHT_SYMTAB,
                      SYM_SIZE, pack_ehdr, pack_phdr, pack_shdr, string_table)
from .layout import DATA_ALIGN, PAGE, STACK_READ, Layout, align_up
from .symbols import Symbol, symbol_tables

STACK_ALIGN = 16         # p_align of PT_GNU_STACK, as GNU ld writes it
SYMTAB_ALIGN = 8         # sh_addralign of .symtab (Elf64_Sym holds 8-byte fields)
SHDR_ALIGN = 8           # file alignment of the section header table (8-byte fields)
SECTIONS = [".text", ".data", ".bss", ".shstrtab", ".symtab", ".strtab"]


def natural_align(addr: int) -> int:
    """Largest power of two <= DATA_ALIGN dividing `addr`: a truthful sh_addralign."""
    return min(addr & -addr, DATA_ALIGN) if addr else DATA_ALIGN


def link(text: bytes, data: bytes, bss_size: int, entry: int, layout: Layout,
         symbols: list[Symbol] | None = None, paddr: int | None = None) -> bytes:
    """The ELF64 executable holding `text`, `data` and `bss_size` bytes of bss at the
    addresses of `layout`, starting at `entry`; with `symbols`, also section headers,
    .symtab and .strtab after the loaded bytes. The r-x PT_LOAD's p_paddr, which no loader
    reads, is its p_vaddr, or `paddr` (8 bytes the program reads at layout.paddr_addr)."""
    lay = layout
    if (len(text), len(data), bss_size) != (lay.text_size, lay.data_size, lay.bss_size):
        raise ValueError(f"sizes (text {len(text)}, data {len(data)}, bss {bss_size}) differ "
                         f"from the layout's ({lay.text_size}, {lay.data_size}, {lay.bss_size})")
    if not lay.text_addr <= entry < lay.text_end:
        raise ValueError(f"entry {entry:#x} is outside .text [{lay.text_addr:#x}, "
                         f"{lay.text_end:#x})")
    image = bytearray(lay.text_off)              # ELF and program headers, packed last
    image += text
    image.extend(bytes(lay.code_file_end - len(image)))
    if data:
        image.extend(bytes(lay.data_off - len(image)))
        image.extend(data)
    assert len(image) == lay.file_end
    shoff = shnum = shstrndx = 0
    if symbols is not None:
        shoff, shnum, shstrndx = _append_sections(image, symbols, lay)
    ehdr = pack_ehdr(entry, lay.phoff, shoff, lay.phnum, shnum, shstrndx)
    load = pack_phdr(PT_LOAD, PF_R | PF_X, 0, lay.base, lay.code_file_end, lay.code_file_end,
                     PAGE, paddr)
    stack = pack_phdr(PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0, STACK_ALIGN)
    if lay.writable:
        headers = ehdr + load + pack_phdr(PT_LOAD, PF_R | PF_W, lay.data_off, lay.data_addr,
                                          lay.data_size, lay.data_size + lay.bss_size,
                                          PAGE) + stack
    else:   # PT_GNU_STACK's bytes read over e_ident's last 8, then PT_LOAD (layout.py)
        end = lay.phoff + STACK_READ
        headers = ehdr[:lay.phoff] + stack[:STACK_READ] + ehdr[end:] + load
    image[:lay.text_off] = headers[:lay.text_off]
    return bytes(image)


def _append_sections(image: bytearray, symbols: list[Symbol],
                     lay: Layout) -> tuple[int, int, int]:
    """Append .shstrtab, .symtab, .strtab and the section header table to `image`; return
    (e_shoff, e_shnum, e_shstrndx). A layout without an rw segment has no .data and .bss."""
    names = [n for n in SECTIONS if lay.writable or n not in (".data", ".bss")]
    index = {name: i + 1 for i, name in enumerate(names)}
    shstrtab, name_off = string_table(names)
    symtab, strtab = symbol_tables(symbols, index, lay)

    def append(blob: bytes, alignment: int = 1) -> int:
        """Append `blob` at the next multiple of `alignment`; return its file offset."""
        image.extend(bytes(align_up(len(image), alignment) - len(image)))
        image.extend(blob)
        return len(image) - len(blob)

    rw = [pack_shdr(name_off[".data"], SHT_PROGBITS, SHF_ALLOC | SHF_WRITE,
                    lay.data_addr, lay.data_off, lay.data_size,
                    addralign=natural_align(lay.data_addr)),
          pack_shdr(name_off[".bss"], SHT_NOBITS, SHF_ALLOC | SHF_WRITE,
                    lay.bss_addr, lay.data_file_end, lay.bss_size,
                    addralign=natural_align(lay.bss_addr))] if lay.writable else []
    shdrs = [pack_shdr(0, SHT_NULL, 0, 0, 0, 0, addralign=0),
             pack_shdr(name_off[".text"], SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR,
                       lay.text_addr, lay.text_off, lay.text_size,
                       addralign=natural_align(lay.text_addr)),
             *rw,
             pack_shdr(name_off[".shstrtab"], SHT_STRTAB, 0, 0, append(shstrtab),
                       len(shstrtab)),
             pack_shdr(name_off[".symtab"], SHT_SYMTAB, 0, 0, append(symtab, SYMTAB_ALIGN),
                       len(symtab), link=index[".strtab"], info=1, addralign=SYMTAB_ALIGN,
                       entsize=SYM_SIZE),
             pack_shdr(name_off[".strtab"], SHT_STRTAB, 0, 0, append(strtab), len(strtab))]
    return append(b"".join(shdrs), SHDR_ALIGN), len(shdrs), index[".shstrtab"]
