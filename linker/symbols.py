"""Symbols for gdb and perf: `Symbol` and the .symtab/.strtab pair built from a list of them.

Contract: `symbol_tables(symbols, section_index, layout)` returns (.symtab bytes, .strtab bytes)
with the null symbol first, then one STB_GLOBAL symbol per entry sorted by (address, name):
STT_FUNC in .text, STT_OBJECT in .data and .bss. .symtab's sh_info (first non-local index) is
therefore 1. Raises ValueError for a duplicate or empty name, an unknown section, or a symbol
that does not start inside its section or runs past the end of its segment in memory."""
from dataclasses import dataclass

from .headers import STB_GLOBAL, STT_FUNC, STT_OBJECT, pack_sym, string_table
from .layout import Layout

SECTIONS = (".text", ".data", ".bss")


@dataclass(frozen=True)
class Symbol:
    """A global label: `address` (virtual), `size` in bytes, `section` one of SECTIONS."""
    name: str
    address: int
    size: int
    section: str


def section_bounds(layout: Layout) -> dict[str, tuple[int, int, int]]:
    """(start, end, segment end) of each section in SECTIONS that the layout has (.data and
    .bss only with an rw segment): a symbol starts in [start, end] and ends by the end of its
    segment in memory (a .data label may run on into .bss)."""
    bounds = {".text": (layout.text_addr, layout.text_end, layout.text_end)}
    if layout.writable:
        bounds[".data"] = (layout.data_addr, layout.bss_addr, layout.bss_end)
        bounds[".bss"] = (layout.bss_addr, layout.bss_end, layout.bss_end)
    return bounds


def symbol_tables(symbols: list[Symbol], section_index: dict[str, int],
                  layout: Layout) -> tuple[bytes, bytes]:
    """(.symtab, .strtab) for `symbols`; `section_index` maps SECTIONS to header indices."""
    bounds = section_bounds(layout)
    ordered = sorted(symbols, key=lambda s: (s.address, s.name))
    names = [s.name for s in ordered]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"duplicate symbol {dup!r}")
    strtab, offsets = string_table(names)
    symtab = bytearray(pack_sym(0, 0, 0, 0, 0))
    for sym in ordered:
        if sym.section not in bounds:
            raise ValueError(f"symbol {sym.name!r}: unknown section {sym.section!r}")
        start, end, limit = bounds[sym.section]
        if sym.size < 0 or not start <= sym.address <= end or sym.address + sym.size > limit:
            raise ValueError(f"symbol {sym.name!r} [{sym.address:#x}, +{sym.size:#x}) is not "
                             f"inside {sym.section} [{start:#x}, {end:#x}) and its segment "
                             f"(ending at {limit:#x})")
        kind = STT_FUNC if sym.section == ".text" else STT_OBJECT
        symtab += pack_sym(offsets[sym.name], STB_GLOBAL << 4 | kind,
                           section_index[sym.section], sym.address, sym.size)
    return bytes(symtab), strtab
