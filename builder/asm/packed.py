"""The packed program: the image's bytes, packed, behind the stub of asm/stub.asm.

Contract: `pack_program(root, image) -> Packed` takes the assembled image (assemble.Image of
asm/gemma.asm), packs the bytes it loads from its first code byte on (`image_bytes`: .text,
and when there is a .data, the zeros up to it and .data) with pack.compress (which decodes its
payload again before it returns it), assembles asm/stub.asm at STUB_BASE with the image's
addresses as constants (`stub_defines`), verifies it like every program, appends the payload
at its `payload` label and links the whole into an ELF with one r-x PT_LOAD and a
non-executable stack, which linker.check then checks. The packed program depends only on the
image and the sources (byte-identical for identical inputs). Failures raise BuildError.

Memory at run time: the stub's segment at STUB_BASE (headers, stub, payload; read+execute),
and what the stub maps: the image's pages at the image's base (its code, then .data and .bss
as they were linked) and, below them, a page that ends with the field machine's tables
(pack_fields.TABLES, decoded just before the image's first code byte) and the decoder's
table (PACK_SCRATCH bytes), both unmapped before the jump.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import linker

from . import pack
from .assemble import Image, assemble
from .errors import BuildError
from .fasm import parse
from .verify import verify

STUB_BASE = 0x200000     # below the image's 0x400000: the image's mapping can grow upwards
STUB_ENTRY_FILE = "stub.asm"


@dataclass
class Packed:
    """The packed program: its file, the stub's assembly, and the sizes of its parts."""
    elf: bytes
    stub: Image
    payload: bytes
    tables: int               # the payload's bytes that code the field tables (pack.encode)
    image_bytes: int          # bytes of the image the stub decodes

    @property
    def headers(self) -> int:
        return self.stub.layout.text_off


def image_bytes(image: Image) -> bytes:
    """What the stub decodes: the image's memory from its first code byte to the end of its
    initialised data (bss is the mapping's zeros)."""
    lay = image.layout
    if not image.data:
        return image.text
    return image.text + bytes(lay.data_addr - lay.text_end) + image.data


def stub_defines(image: Image) -> dict[str, int]:
    """The constants asm/stub.asm expects (its header says what each one is)."""
    lay = image.layout
    return {"IMAGE_BASE": lay.base, "IMAGE_TEXT": lay.text_addr,
            "IMAGE_BYTES": len(image_bytes(image)), "IMAGE_CODE_END": lay.text_end,
            "IMAGE_END": lay.bss_end if lay.writable else lay.text_end,
            "IMAGE_ENTRY": image.entry,
            "PACK_HASH_AT": linker.layout(0, 0, 0, base=STUB_BASE, writable=False).paddr_addr}


def pack_program(root: Path, image: Image) -> Packed:
    """Pack `image` behind the stub (see the module docstring)."""
    raw = image_bytes(image)
    try:
        payload, tables = pack.encode(raw)      # (decoded again before it returns)
    except pack.PackError as exc:
        raise BuildError(f"pack: {exc}") from None
    stub = assemble(parse(root, STUB_ENTRY_FILE, stub_defines(image)),
                    partial(linker.layout, base=STUB_BASE, writable=False))
    verify(stub.placed)
    if "payload" not in stub.symbols or stub.symbols["payload"] != stub.layout.text_end:
        raise BuildError(f"asm/{STUB_ENTRY_FILE}: `payload:` must be the last label of its "
                         "code, where the packed bytes go")
    text = stub.text + payload
    lay = linker.layout(len(text), 0, 0, base=STUB_BASE, writable=False)
    try:
        elf = linker.link(text, b"", 0, stub.entry, lay, paddr=pack.HASH)
        linker.check(elf)
    except (ValueError, linker.ElfCheckError) as exc:
        raise BuildError(f"link (packed): {exc}") from None
    return Packed(elf, stub, payload, tables, len(raw))
