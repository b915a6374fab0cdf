"""ELF64 on-disk structures (little-endian), one `struct.pack` per structure, and the constants
the linker writes. Contract: each `pack_*` returns exactly the structure's size in bytes."""
import struct

from .layout import EHDR_SIZE, PHDR_SIZE, SHDR_SIZE

ET_EXEC = 2
EM_X86_64 = 62
EV_CURRENT = 1

PT_LOAD = 1
PT_GNU_STACK = 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4

SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS = 0, 1, 2, 3, 8
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4

STB_GLOBAL = 1
STT_OBJECT, STT_FUNC = 1, 2
SYM_SIZE = 24            # sizeof(Elf64_Sym)

E_IDENT = b"\x7fELF" + bytes([
    2,                   # EI_CLASS = ELFCLASS64
    1,                   # EI_DATA = ELFDATA2LSB
    EV_CURRENT,          # EI_VERSION
    0,                   # EI_OSABI = ELFOSABI_SYSV
]) + bytes(8)            # EI_ABIVERSION, EI_PAD


def pack_ehdr(entry: int, phoff: int, shoff: int, phnum: int, shnum: int,
              shstrndx: int) -> bytes:
    """Elf64_Ehdr of an x86-64 executable with its program headers at file offset `phoff`."""
    return struct.pack(
        "<16sHHIQQQIHHHHHH",
        E_IDENT,         # e_ident
        ET_EXEC,         # e_type
        EM_X86_64,       # e_machine
        EV_CURRENT,      # e_version
        entry,           # e_entry
        phoff,           # e_phoff
        shoff,           # e_shoff
        0,               # e_flags
        EHDR_SIZE,       # e_ehsize
        PHDR_SIZE,       # e_phentsize
        phnum,           # e_phnum
        SHDR_SIZE,       # e_shentsize
        shnum,           # e_shnum
        shstrndx,        # e_shstrndx
    )


def pack_phdr(p_type: int, flags: int, offset: int, vaddr: int, filesz: int, memsz: int,
              align: int, paddr: int | None = None) -> bytes:
    """Elf64_Phdr; p_paddr = p_vaddr unless `paddr` is given."""
    return struct.pack(
        "<IIQQQQQQ",
        p_type,          # p_type
        flags,           # p_flags
        offset,          # p_offset
        vaddr,           # p_vaddr
        vaddr if paddr is None else paddr,  # p_paddr
        filesz,          # p_filesz
        memsz,           # p_memsz
        align,           # p_align
    )


def pack_shdr(name: int, sh_type: int, flags: int, addr: int, offset: int, size: int,
              link: int = 0, info: int = 0, addralign: int = 1, entsize: int = 0) -> bytes:
    """Elf64_Shdr; `name` is an offset into .shstrtab."""
    return struct.pack(
        "<IIQQQQIIQQ",
        name,            # sh_name
        sh_type,         # sh_type
        flags,           # sh_flags
        addr,            # sh_addr
        offset,          # sh_offset
        size,            # sh_size
        link,            # sh_link
        info,            # sh_info
        addralign,       # sh_addralign
        entsize,         # sh_entsize
    )


def pack_sym(name: int, info: int, shndx: int, value: int, size: int) -> bytes:
    """Elf64_Sym with default visibility; `name` is an offset into .strtab."""
    return struct.pack(
        "<IBBHQQ",
        name,            # st_name
        info,            # st_info = bind << 4 | type
        0,               # st_other = STV_DEFAULT
        shndx,           # st_shndx
        value,           # st_value
        size,            # st_size
    )


def string_table(names: list[str]) -> tuple[bytes, dict[str, int]]:
    """An ELF string table: a NUL, then each distinct name NUL-terminated, in the order given.
    Returns the bytes and each name's offset. Raises ValueError for an empty name or one
    containing NUL."""
    table, offsets = bytearray(b"\0"), {}
    for name in names:
        if not name or "\0" in name:
            raise ValueError(f"bad ELF name {name!r}")
        if name not in offsets:
            offsets[name] = len(table)
            table += name.encode() + b"\0"
    return bytes(table), offsets
