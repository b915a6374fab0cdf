"""gemma's linker: lays .text/.data/.bss into a static ELF64 x86-64 executable and checks it.

    lay = linker.layout(text_size, data_size, bss_size)   # addresses, before assembling
    elf = linker.link(text, data, bss_size, entry, lay, symbols=None)
    linker.check(elf_or_path, budget=6144)                # raises linker.ElfCheckError
"""
from .check import ElfCheckError, check
from .layout import Layout, layout
from .link import link
from .symbols import Symbol

__all__ = ["ElfCheckError", "Layout", "Symbol", "check", "layout", "link"]
