"""A loaded program image: its segments, its symbols, its entry point.

Contract:
- `Image` is what every runner (Unicorn routine calls, whole-program emulation, the native
  runner) works from: a list of `Segment`s (address, file bytes, memory size, permissions) and a
  `symbols` dict name -> `Symbol(address, size)`.
- `load_elf(path, symbols)` reads an ELF64 executable through its PROGRAM headers only (fasm
  writes no section headers) and takes the symbols from the builder's map (a dict or the path
  of `<binary>.map.json`).
- `assemble(routines, data, bss)` builds a small synthetic image with keystone, for the
  harness's own tests: routines are laid out in a code segment, `data` and `bss` entries in a
  writable segment after it; `{name}` in a routine's text is replaced by that symbol's absolute
  address (use it for call/jmp targets and `[{name}]` operands).
- `with_routines(image, routines)` returns the image plus test-side routines assembled above
  it, which may call the image's own routines by `{name}` (e.g. a SysV wrapper around a
  routine with a register convention of its own).
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 0x1000


def page_down(x: int) -> int:
    return x & ~(PAGE - 1)


def page_up(x: int) -> int:
    return (x + PAGE - 1) & ~(PAGE - 1)


@dataclass(frozen=True)
class Segment:
    """One loadable segment: `data` at `address`, zero-filled up to `memsz` bytes."""
    address: int
    data: bytes
    memsz: int
    readable: bool = True
    writable: bool = False
    executable: bool = False

    @property
    def end(self) -> int:
        return self.address + self.memsz


@dataclass(frozen=True)
class Symbol:
    address: int
    size: int


@dataclass
class Image:
    segments: list[Segment]
    symbols: dict[str, Symbol] = field(default_factory=dict)
    entry: int = 0

    def symbol(self, name: str) -> Symbol:
        try:
            return self.symbols[name]
        except KeyError:
            raise KeyError(f"no symbol {name!r} in the image") from None

    def segment_at(self, address: int) -> Segment | None:
        for seg in self.segments:
            if seg.address <= address < seg.end:
                return seg
        return None

    def read(self, address: int, size: int) -> bytes:
        """Bytes of the image at `address` (bss reads as zeros); stops at the segment's end."""
        seg = self.segment_at(address)
        if seg is None:
            return b""
        off = address - seg.address
        size = min(size, seg.memsz - off)
        return (seg.data[off:off + size]).ljust(size, b"\0")

    def where(self, address: int) -> str:
        """`name+0xOFF` for the symbol containing (or nearest below) `address`, else hex."""
        best = None
        for name, sym in self.symbols.items():
            if sym.address <= address and (best is None or sym.address > best[1].address):
                best = (name, sym)
        if best is None or self.segment_at(address) is not self.segment_at(best[1].address):
            return f"{address:#x}"
        off = address - best[1].address
        return f"{address:#x} ({best[0]}+{off:#x})" if off else f"{address:#x} ({best[0]})"


def load_elf(path: Path | str, symbols: dict | Path | str | None = None) -> Image:
    """Load an ELF64 x86-64 executable by its PT_LOAD program headers, plus a symbol map."""
    from elftools.elf.elffile import ELFFile

    raw = Path(path).read_bytes()
    elf = ELFFile(io.BytesIO(raw))
    if elf.elfclass != 64 or elf["e_machine"] != "EM_X86_64":
        raise ValueError(f"{path}: not an ELF64 x86-64 file")
    segments = []
    for ph in elf.iter_segments():
        if ph["p_type"] != "PT_LOAD":
            continue
        flags = ph["p_flags"]
        data = raw[ph["p_offset"]:ph["p_offset"] + ph["p_filesz"]]
        segments.append(Segment(ph["p_vaddr"], data, ph["p_memsz"],
                                readable=bool(flags & 4), writable=bool(flags & 2),
                                executable=bool(flags & 1)))
    if isinstance(symbols, (str, Path)):
        symbols = json.loads(Path(symbols).read_text())
    syms = {name: Symbol(int(v["address"]), int(v["size"])) for name, v in (symbols or {}).items()}
    return Image(segments, syms, elf["e_entry"])


CODE_BASE = 0x400000
ROUTINE_ALIGN = 16
DATA_ALIGN = 64


def _round(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def assemble(routines: dict[str, str], data: dict[str, bytes] | None = None,
             bss: dict[str, int] | None = None, base: int = CODE_BASE,
             outside: dict[str, Symbol] | None = None) -> Image:
    """Assemble `routines` (name -> keystone Intel-syntax text) into a synthetic image.

    Layout: routines from `base` (16-byte aligned each, nop-free zero padding), then a writable
    segment at the next page holding `data` (64-byte aligned entries) followed by `bss`.
    Addresses are iterated until stable (a `{name}` reference can change an encoding's size).
    `outside` symbols may be referenced too but are not laid out. Entry point: the first routine.
    """
    from keystone import KS_ARCH_X86, KS_MODE_64, Ks, KsError

    ks = Ks(KS_ARCH_X86, KS_MODE_64)   # no options set: bare numbers stay decimal
    data = data or {}
    bss = bss or {}
    addr = {name: base for name in [*routines, *data, *bss]}
    for _ in range(8):
        code = bytearray()
        new = {}
        for name, text in routines.items():
            code += bytes(_round(len(code), ROUTINE_ALIGN) - len(code))
            new[name] = base + len(code)
            src = text.format(**{k: hex(v.address) for k, v in (outside or {}).items()},
                              **{k: hex(v) for k, v in addr.items()})
            try:
                enc, _ = ks.asm(src, new[name])
            except KsError as e:
                raise ValueError(f"keystone refused routine {name!r}: {e}") from None
            code += bytes(enc or b"")
        data_base = page_up(base + len(code)) + PAGE
        blob = bytearray()
        for name, value in data.items():
            blob += bytes(_round(len(blob), DATA_ALIGN) - len(blob))
            new[name] = data_base + len(blob)
            blob += value
        memsz = len(blob)
        for name, size in bss.items():
            memsz = _round(memsz, DATA_ALIGN)
            new[name] = data_base + memsz
            memsz += size
        if new == addr:
            break
        addr = new
    else:
        raise ValueError("symbol addresses did not settle")
    ends = sorted(addr.values()) + [base + len(code), data_base + memsz]
    symbols = {}
    for name, a in addr.items():
        seg_end = base + len(code) if a < data_base else data_base + memsz
        nxt = min([e for e in ends if a < e <= seg_end] or [seg_end])
        symbols[name] = Symbol(a, nxt - a)
    segments = [Segment(base, bytes(code), len(code), executable=True)]
    if memsz:
        segments.append(Segment(data_base, bytes(blob), memsz, writable=True))
    entry = addr[next(iter(routines))] if routines else base
    return Image(segments, symbols, entry)


def with_routines(image: Image, routines: dict[str, str]) -> Image:
    """`image` plus `routines` assembled in a code segment 16 pages above its last one."""
    base = page_up(max(s.end for s in image.segments)) + 16 * PAGE
    extra = assemble(routines, base=base, outside=image.symbols)
    return Image(image.segments + extra.segments, {**image.symbols, **extra.symbols},
                 image.entry)
