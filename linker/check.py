"""Reopen an executable with pyelftools and check what the engine relies on.

The shipped program has no section headers (linker.link writes them only with symbols): the
checks then work from the program headers alone. With section headers they also check the
sections against the segments.

Contract: `check(path_or_bytes, budget=None)` returns None when every check passes, else raises
`ElfCheckError("ELF check 'NAME' failed: detail")` for the first failing check, in this order:
  parse       pyelftools can read the ELF header
  class       ELFCLASS64, little-endian
  machine     EM_X86_64
  type        ET_EXEC
  parse       pyelftools can read the program headers, and the section headers and the
              section names when there are any
  overlap     a program header's bytes that are read (of PT_GNU_STACK p_type and p_flags, of
              PT_LOAD all but p_align, of others all 56) lie after the ELF header or in
              e_ident's last 8 bytes (EI_ABIVERSION and EI_PAD, which nothing reads): only
              there may they overlap it
  interp      no PT_INTERP segment
  dynamic     no PT_DYNAMIC segment
  wx          no segment both writable and executable
  stack       a PT_GNU_STACK segment, not executable
  segments    one r-x PT_LOAD (headers and code) that maps the program headers, and at most one
              rw- (data and bss; the packed program's stub has none)
  sections    without section headers: e_shoff, e_shnum and e_shstrndx all 0; with them:
              .text (PROGBITS, AX), .shstrtab (STRTAB, not allocated) and, when there is an
              rw- PT_LOAD, .data (PROGBITS, WA) and .bss (NOBITS, WA) present, section
              names read from e_shstrndx
  entry       e_entry inside the r-x PT_LOAD's file bytes after the ELF header and the bytes
              read of the program headers (PT_GNU_STACK: p_type and p_flags; PT_LOAD of an
              ET_EXEC: all but p_align), and inside .text when there are section headers
  bounds      every PT_LOAD's file bytes inside the file, p_filesz <= p_memsz, PT_LOADs do
              not share a page in memory (of PT_GNU_STACK, whose other fields nothing
              reads, only p_type and p_flags are checked: the packed program's other 48
              bytes are its ELF header's, linker/layout.py)
A PT_LOAD's p_paddr is not checked: no loader reads it, and the packed program keeps a
constant of its decoder there (linker.link's `paddr`).
  congruence  every PT_LOAD has p_offset == p_vaddr modulo the page size (its p_align, read for
              ET_DYN only, is not checked: the packed program's code starts over it)
  coverage    (with section headers) .text inside a readable, executable PT_LOAD; .data and
              .bss, where present, inside a writable one; file bytes of .text/.data where the segment maps them
  tail        (without section headers) the file ends where the last PT_LOAD's file bytes
              end: nothing else in it is ever read
  budget      file size <= budget (when a budget is given)
"""
import io
import os
import struct
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.constants import P_FLAGS, SH_FLAGS
from elftools.elf.elffile import ELFFile

from .layout import EHDR_SIZE, LOAD_READ, PAGE, STACK_AT, STACK_READ

REQUIRED = {  # name: (sh_type, flags among SHF_ALLOC|SHF_WRITE|SHF_EXECINSTR)
    ".text": ("SHT_PROGBITS", SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_EXECINSTR),
    ".data": ("SHT_PROGBITS", SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_WRITE),
    ".bss": ("SHT_NOBITS", SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_WRITE),
    ".shstrtab": ("SHT_STRTAB", 0),
}
EI_NIDENT = 16           # sizeof(e_ident)
FLAG_MASK = SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_WRITE | SH_FLAGS.SHF_EXECINSTR
PARSE_ERRORS = (ELFError, struct.error, ValueError, KeyError, IndexError, UnicodeDecodeError)


class ElfCheckError(Exception):
    """One failed check: the message names it ("ELF check 'wx' failed: ...")."""

    def __init__(self, check: str, detail: str):
        super().__init__(f"ELF check '{check}' failed: {detail}")
        self.check = check


def _read(elf: ELFFile) -> tuple[list, dict]:
    """Program headers, and the header of the first section of each name."""
    segments = [seg.header for seg in elf.iter_segments()]
    sections = {}
    for sec in elf.iter_sections():
        sections.setdefault(sec.name, sec.header)
    return segments, sections


def _perm(flags: int) -> str:
    return "".join(c if flags & f else "-" for c, f in
                   (("r", P_FLAGS.PF_R), ("w", P_FLAGS.PF_W), ("x", P_FLAGS.PF_X)))


def check(path_or_bytes: bytes | str | os.PathLike, budget: int | None = None) -> None:
    """Run every check above on the file (a path or its bytes); raise ElfCheckError on the
    first failure."""
    blob = (bytes(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray))
            else Path(path_or_bytes).read_bytes())
    try:
        elf = ELFFile(io.BytesIO(blob))
    except PARSE_ERRORS as exc:
        raise ElfCheckError("parse", f"pyelftools cannot read the ELF header of this "
                            f"{len(blob)}-byte file: {exc}") from None
    hdr = elf.header
    if elf.elfclass != 64 or not elf.little_endian:
        raise ElfCheckError("class", f"ELFCLASS{elf.elfclass}, "
                            f"{'little' if elf.little_endian else 'big'}-endian; want "
                            "ELFCLASS64 little-endian")
    if hdr.e_machine != "EM_X86_64":
        raise ElfCheckError("machine", f"e_machine is {hdr.e_machine}, want EM_X86_64")
    if hdr.e_type != "ET_EXEC":
        raise ElfCheckError("type", f"e_type is {hdr.e_type}, want ET_EXEC")
    try:
        segments, sections = _read(elf)
    except PARSE_ERRORS as exc:
        raise ElfCheckError("parse", f"pyelftools cannot read the program or section "
                            f"headers: {exc}") from None
    _check_overlap(hdr, segments)
    for seg_type, name in (("PT_INTERP", "interp"), ("PT_DYNAMIC", "dynamic")):
        found = [i for i, s in enumerate(segments) if s.p_type == seg_type]
        if found:
            raise ElfCheckError(name, f"program header {found[0]} is {seg_type}")
    for i, seg in enumerate(segments):
        if seg.p_flags & P_FLAGS.PF_W and seg.p_flags & P_FLAGS.PF_X:
            raise ElfCheckError("wx", f"program header {i} ({seg.p_type}) is "
                                f"{_perm(seg.p_flags)}: writable and executable")
    stacks = [s for s in segments if s.p_type == "PT_GNU_STACK"]
    if not stacks:
        raise ElfCheckError("stack", "no PT_GNU_STACK: the stack's permissions are left "
                            "to the loader's default")
    if stacks[0].p_flags & P_FLAGS.PF_X:
        raise ElfCheckError("stack", f"PT_GNU_STACK is {_perm(stacks[0].p_flags)}: "
                            "executable stack")
    code = _check_loads(hdr, segments)
    has_sections = hdr.e_shoff != 0 or hdr.e_shnum != 0
    if has_sections:
        writable = any(s.p_type == "PT_LOAD" and s.p_flags & P_FLAGS.PF_W for s in segments)
        _check_sections(hdr, sections, writable)
    elif hdr.e_shstrndx != 0:
        raise ElfCheckError("sections", f"no section headers, but e_shstrndx is "
                            f"{hdr.e_shstrndx}")
    _check_entry(hdr, code, sections, segments)
    _check_segments(segments, len(blob))
    if has_sections:
        _check_coverage(segments, sections)
    else:
        end = max(s.p_offset + s.p_filesz for s in segments if s.p_type == "PT_LOAD")
        if len(blob) != end:
            raise ElfCheckError("tail", f"the file is {len(blob)} bytes but its loaded bytes "
                                f"end at {end}: {len(blob) - end} bytes never read")
    if budget is not None and len(blob) > budget:
        raise ElfCheckError("budget", f"{len(blob)} bytes, budget {budget} "
                            f"({len(blob) - budget} over)")


def _check_loads(hdr, segments: list):
    """The 'segments' check; returns the r-x PT_LOAD's header."""
    loads = [s for s in segments if s.p_type == "PT_LOAD"]
    perms = sorted(_perm(s.p_flags) for s in loads)
    if perms not in (["r-x"], ["r-x", "rw-"]):
        raise ElfCheckError("segments", f"PT_LOADs are [{', '.join(perms)}], want one r-x "
                            "and at most one rw-")
    code = next(s for s in loads if s.p_flags & P_FLAGS.PF_X)
    phdrs_end = hdr.e_phoff + hdr.e_phnum * hdr.e_phentsize
    if not (code.p_offset <= hdr.e_phoff and phdrs_end <= code.p_offset + code.p_filesz):
        raise ElfCheckError("segments", f"the r-x PT_LOAD (file bytes [{code.p_offset:#x}, "
                            f"+{code.p_filesz:#x})) does not map the program headers "
                            f"[{hdr.e_phoff:#x}, {phdrs_end:#x})")
    return code


def _check_sections(hdr, sections: dict, writable: bool) -> None:
    """The 'sections' check, for a file with section headers."""
    if hdr.e_shoff == 0 or hdr.e_shnum == 0:
        raise ElfCheckError("sections", f"e_shoff {hdr.e_shoff:#x} and e_shnum "
                            f"{hdr.e_shnum}: want both 0 or both set")
    for name, (sh_type, flags) in REQUIRED.items():
        if not writable and name in (".data", ".bss"):
            continue
        sec = sections.get(name)
        if sec is None:
            raise ElfCheckError("sections", f"no {name} section")
        if sec.sh_type != sh_type or sec.sh_flags & FLAG_MASK != flags:
            raise ElfCheckError("sections", f"{name} is {sec.sh_type} flags "
                                f"{sec.sh_flags:#x}, want {sh_type} flags {flags:#x}")


def _read_bytes(hdr, seg) -> int:
    """How many of a program header's bytes a loader reads: of PT_GNU_STACK p_type and
    p_flags, of an ET_EXEC's PT_LOAD all but p_align (linker/layout.py), of the others all."""
    return {"PT_GNU_STACK": STACK_READ, "PT_LOAD": LOAD_READ}.get(seg.p_type, hdr.e_phentsize)


def _check_overlap(hdr, segments: list) -> None:
    """The 'overlap' check: the program headers' bytes read avoid the ELF header's, but for
    e_ident's last 8 (EI_ABIVERSION, EI_PAD)."""
    for i, seg in enumerate(segments):
        start = hdr.e_phoff + i * hdr.e_phentsize
        end = start + _read_bytes(hdr, seg)
        if start < EHDR_SIZE and not (STACK_AT <= start and end <= EI_NIDENT):
            raise ElfCheckError("overlap", f"program header {i} ({seg.p_type}) reads file "
                                f"bytes [{start:#x}, {end:#x}), over the ELF header's fields")


def _check_entry(hdr, code, sections: dict, segments: list) -> None:
    """The 'entry' check: e_entry in the code segment's file bytes after the ELF header and
    the bytes read of the program headers (and in .text when there are sections)."""
    phdrs_end = max([EHDR_SIZE] + [hdr.e_phoff + i * hdr.e_phentsize + _read_bytes(hdr, s)
                                   for i, s in enumerate(segments)])
    start = code.p_vaddr + max(0, phdrs_end - code.p_offset)
    end = code.p_vaddr + code.p_filesz
    if not start <= hdr.e_entry < end:
        raise ElfCheckError("entry", f"e_entry {hdr.e_entry:#x} is outside the r-x "
                            f"PT_LOAD's code [{start:#x}, {end:#x})")
    text = sections.get(".text")
    if text is not None and not text.sh_addr <= hdr.e_entry < text.sh_addr + text.sh_size:
        raise ElfCheckError("entry", f"e_entry {hdr.e_entry:#x} is outside .text "
                            f"[{text.sh_addr:#x}, {text.sh_addr + text.sh_size:#x})")


def _check_segments(segments: list, file_size: int) -> None:
    """The 'bounds' and 'congruence' checks."""
    loads = sorted((s for s in segments if s.p_type == "PT_LOAD"), key=lambda s: s.p_vaddr)
    for i, seg in enumerate(segments):
        if seg.p_type == "PT_LOAD" and (seg.p_offset + seg.p_filesz > file_size
                                        or seg.p_filesz > seg.p_memsz):
            raise ElfCheckError("bounds", f"program header {i} ({seg.p_type}) file bytes "
                                f"[{seg.p_offset:#x}, +{seg.p_filesz:#x}) memsz "
                                f"{seg.p_memsz:#x}, file size {file_size:#x}")
    for low, high in zip(loads, loads[1:]):
        if (low.p_vaddr + low.p_memsz + PAGE - 1) // PAGE > high.p_vaddr // PAGE:
            raise ElfCheckError("bounds", f"PT_LOADs at {low.p_vaddr:#x} and "
                                f"{high.p_vaddr:#x} share a page in memory")
    for seg in loads:
        if (seg.p_offset - seg.p_vaddr) % PAGE:
            raise ElfCheckError("congruence", f"PT_LOAD offset {seg.p_offset:#x} and vaddr "
                                f"{seg.p_vaddr:#x} differ modulo {PAGE:#x}")


def _check_coverage(segments: list, sections: dict) -> None:
    """The 'coverage' check: each allocated section lies in a PT_LOAD with its permissions."""
    want = {".text": P_FLAGS.PF_R | P_FLAGS.PF_X, ".data": P_FLAGS.PF_R | P_FLAGS.PF_W,
            ".bss": P_FLAGS.PF_R | P_FLAGS.PF_W}
    loads = [s for s in segments if s.p_type == "PT_LOAD"]
    for name, perm in want.items():
        sec = sections.get(name)
        if sec is None:             # .data and .bss of a program without an rw segment
            continue
        start, end = sec.sh_addr, sec.sh_addr + sec.sh_size
        home = [s for s in loads if s.p_vaddr <= start and end <= s.p_vaddr + s.p_memsz
                and s.p_flags & perm == perm]
        if sec.sh_type == "SHT_PROGBITS":
            home = [s for s in home if sec.sh_offset - s.p_offset == start - s.p_vaddr
                    and end <= s.p_vaddr + s.p_filesz]
        if not home:
            raise ElfCheckError("coverage", f"{name} [{start:#x}, {end:#x}) at file offset "
                                f"{sec.sh_offset:#x} is in no {_perm(perm)} PT_LOAD that "
                                "maps it")
