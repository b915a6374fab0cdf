"""Where the linker puts things: file offsets and virtual addresses of .text, .data and .bss.

Contract: `layout(text_size, data_size, bss_size, base=BASE, writable=True) -> Layout`, a pure
function of its arguments (the front end calls it before assembling, to know the addresses its labels
get).

File                                    Memory
0x000  ELF header (64)                  base + offset       first PT_LOAD, r-x, offset 0:
0x040  3 program headers (3 x 56)                           headers + .text
0x0e8  .text                            text_addr = base + 0xe8
       zero padding to a multiple of 64 (only when .data is not empty)
       .data                            data_addr = base + 0x1000 + data_off  second PT_LOAD, rw-
                                        bss_addr  = data_addr + data_size (memory only)
       end of file (= file_end, the end of the loaded bytes)
       [.shstrtab .symtab .strtab, section header table: only with symbols, not loaded]

A program laid out with writable=False (the packed program: its stub has no writeable
segment) has no rw segment, no .data and no .bss: two program headers, PT_GNU_STACK then the
r-x PT_LOAD, overlapping the ELF header. Of PT_GNU_STACK, Linux (binfmt_elf), qemu-user and
gdb read p_type and p_flags only, so that header starts at e_phoff = 8, where its 8 bytes read
are e_ident's last 8 (EI_ABIVERSION and EI_PAD, which nothing reads); its other 48 bytes are the
ELF header's from e_type on, which mean nothing to it. PT_LOAD follows at 0x40, right after
the ELF header, and .text starts over its p_align, at 0x70: loaders read an ET_EXEC's PT_LOAD
up to p_memsz (Linux reads p_align for ET_DYN only; qemu-user ORs it into the alignment it
checks AT_PAGESZ against, which is 4 KiB either way on an x86-64 host; BFD warns of a p_align
that is no power of two):

File                                    Memory
0x000  ELF header (64; PT_GNU_STACK's   base + offset       the PT_LOAD, r-x, offset 0:
       p_type and p_flags at 0x08)                          headers + .text
0x040  PT_LOAD r-x (56)
0x070  .text (its first 8 bytes are     text_addr = base + 0x70
       PT_LOAD's p_align)

The r-x segment maps at least the headers: a .text under 8 bytes is followed by zeros up to
0x78.

The rw segment starts on the page after the last page of .text in memory while its file bytes
follow .text directly: data_addr = BASE + PAGE + data_off keeps offset and address congruent
modulo the page size without page padding in the file. data_off is a multiple of DATA_ALIGN so
data_addr is DATA_ALIGN-aligned (the asm's `align` is relative to addresses); .bss follows
.data with no gap, because the front end lays both out in one address space. A non-empty .data
starts at the first multiple of DATA_ALIGN at or after the end of .text. An empty .data has no
file bytes, so nothing needs padding: data_off is then the last multiple of DATA_ALIGN at or
before the end of .text, and the rw segment's p_offset (data_off, file size 0) stays inside the
file, which ends with .text.
"""
from dataclasses import dataclass

BASE = 0x400000          # virtual address of file offset 0
PAGE = 0x1000            # page size: segments are congruent modulo this
DATA_ALIGN = 64          # alignment of data_addr (and data_off): room for zmm-sized vectors
EHDR_SIZE = 64           # sizeof(Elf64_Ehdr)
PHDR_SIZE = 56           # sizeof(Elf64_Phdr)
SHDR_SIZE = 64           # sizeof(Elf64_Shdr)
PHNUM = 3                # PT_LOAD r-x, PT_LOAD rw-, PT_GNU_STACK (2 without the rw-)
STACK_READ = 8           # the bytes of PT_GNU_STACK anything reads: p_type and p_flags
STACK_AT = 8             # without an rw segment, e_phoff: e_ident[EI_ABIVERSION:], 8 bytes no
                         # loader reads, hold PT_GNU_STACK's p_type and p_flags
LOAD_READ = 48           # the bytes of an ET_EXEC's PT_LOAD anything reads: p_type .. p_memsz
                         # (p_align counts for ET_DYN only)
P_PADDR = 24             # offsetof(Elf64_Phdr, p_paddr)


def align_up(value: int, alignment: int) -> int:
    """Smallest multiple of `alignment` (a power of two) that is >= `value`."""
    return (value + alignment - 1) & -alignment


@dataclass(frozen=True)
class Layout:
    """File offsets (`*_off`) and virtual addresses (`*_addr`) of the three sections.

    A valid entry point lies in [text_addr, text_end). `phnum` is 3, or 2 when the program
    has no rw segment."""
    base: int
    phnum: int
    text_off: int
    text_addr: int
    text_size: int
    data_off: int
    data_addr: int
    data_size: int
    bss_addr: int
    bss_size: int

    @property
    def writable(self) -> bool:
        """Whether the program has an rw segment (.data or .bss)."""
        return self.phnum == PHNUM

    @property
    def phoff(self) -> int:
        """File offset of the program headers (e_phoff): after the ELF header, or without an
        rw segment inside it, at STACK_AT."""
        return EHDR_SIZE if self.writable else STACK_AT

    @property
    def paddr_addr(self) -> int:
        """Address of the r-x PT_LOAD header's p_paddr, 8 bytes no loader reads (the linker
        writes what `link`'s `paddr` says there). That header is at 0x40 either way: the first
        with an rw segment, the second (after PT_GNU_STACK at STACK_AT) without."""
        return self.base + EHDR_SIZE + P_PADDR

    @property
    def text_end(self) -> int:
        """Address one past the last byte of .text."""
        return self.text_addr + self.text_size

    @property
    def text_file_end(self) -> int:
        """File offset one past the last byte of .text."""
        return self.text_off + self.text_size

    @property
    def code_file_end(self) -> int:
        """End of the r-x segment's file bytes: .text's end, or the program headers' end when
        .text is shorter."""
        return max(self.text_file_end, self.phoff + self.phnum * PHDR_SIZE)

    @property
    def data_file_end(self) -> int:
        """File offset one past the last byte of .data."""
        return self.data_off + self.data_size

    @property
    def file_end(self) -> int:
        """File offset one past the last loaded byte: the size of the file without symbols."""
        return self.data_file_end if self.data_size else self.code_file_end

    @property
    def bss_end(self) -> int:
        """Address one past the last byte of .bss (end of the rw segment in memory)."""
        return self.bss_addr + self.bss_size


def layout(text_size: int, data_size: int, bss_size: int, base: int = BASE,
           writable: bool = True) -> Layout:
    """Lay out .text, .data and .bss of the given sizes (bytes) at `base` (a multiple of the
    page size) as described in the module docstring; without an rw segment (`writable`
    False) .data and .bss must be empty. Raises ValueError for a negative or non-integer
    size, a bad base, or data without an rw segment."""
    for name, size in (("text_size", text_size), ("data_size", data_size),
                       ("bss_size", bss_size)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{name} must be a non-negative int, got {size!r}")
    if not isinstance(base, int) or base <= 0 or base % PAGE or base >= 1 << 31:
        raise ValueError(f"base must be a positive multiple of {PAGE:#x} below 2^31, "
                         f"got {base!r}")
    if not writable and (data_size or bss_size):
        raise ValueError("a program without an rw segment has no .data and no .bss")
    phnum = PHNUM if writable else PHNUM - 1
    text_off = EHDR_SIZE + (phnum * PHDR_SIZE if writable else LOAD_READ)
    text_file_end = text_off + text_size
    data_off = (align_up(text_file_end, DATA_ALIGN) if data_size
                else text_file_end & -DATA_ALIGN)
    data_addr = base + PAGE + data_off
    return Layout(base=base, phnum=phnum, text_off=text_off, text_addr=base + text_off, text_size=text_size,
                  data_off=data_off, data_addr=data_addr, data_size=data_size,
                  bss_addr=data_addr + data_size, bss_size=bss_size)
