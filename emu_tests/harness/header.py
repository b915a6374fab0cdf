"""Read a routine's header block (the engine's convention) from its asm source.

Contract: `read_header(source_text, name) -> Header` finds the comment block that contains the
line `; name: ...` (a block may describe several routines that share code) and collects the
registers named after `in:`, `out:` and `clobbers:` in it. `Header.preserved()` is this
harness's reading of the convention: every general-purpose and xmm register that the header
names neither as clobbered nor as an output must come back unchanged (rsp and the SysV
callee-saved registers are checked anyway). Registers may be written as 64- or 32-bit names
(`rcx`, `ecx`, `r8d`) or ranges (`r8-r11`, `xmm0-xmm7`); other words are ignored.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", *(f"r{i}" for i in range(8, 16)))
XMMS = tuple(f"xmm{i}" for i in range(16))
CALLEE_SAVED = {"rbx", "rbp", "r12", "r13", "r14", "r15"}
_LEGACY = {"a": "rax", "b": "rbx", "c": "rcx", "d": "rdx", "si": "rsi", "di": "rdi",
           "bp": "rbp"}
_FIELD = re.compile(r"\b(in|out|clobbers):")
_WORD = re.compile(r"[a-z]+\d*[a-z]?(?:-[a-z]+\d*[a-z]?)?")


def register(word: str) -> str | None:
    """The 64-bit GPR or xmm name that `word` denotes (rax, eax, ax, al; r8, r8d; xmm3)."""
    if word in GPRS or word in XMMS:
        return word
    m = re.fullmatch(r"(r\d+)[dwb]?", word)
    if m and m.group(1) in GPRS:
        return m.group(1)
    m = re.fullmatch(r"e?([abcd])x|([abcd])[lh]|e?(si|di|bp)", word)
    if m:
        return _LEGACY[next(g for g in m.groups() if g)]
    return None


def registers(text: str) -> set[str]:
    """Every register named in `text`, ranges expanded."""
    found = set()
    for word in _WORD.findall(text.lower()):
        lo, _, hi = word.partition("-")
        a, b = register(lo), register(hi) if hi else None
        if a and b:
            names = XMMS if a.startswith("xmm") else GPRS
            found.update(names[names.index(a):names.index(b) + 1])
        elif a:
            found.add(a)
    return found


@dataclass
class Header:
    text: str
    ins: set[str]
    outs: set[str]
    clobbers: set[str]

    def preserved(self) -> tuple[str, ...]:
        changed = self.outs | self.clobbers | CALLEE_SAVED
        return tuple(r for r in GPRS + XMMS if r not in changed)


def read_header(source: str, name: str) -> Header:
    lines = source.splitlines()
    at = next((i for i, line in enumerate(lines)
               if re.match(rf"\s*;\s*{re.escape(name)}:", line)), None)
    if at is None:
        raise LookupError(f"no header line '; {name}: ...' in the source")
    lo, hi = at, at
    while lo > 0 and lines[lo - 1].lstrip().startswith(";"):
        lo -= 1
    while hi + 1 < len(lines) and lines[hi + 1].lstrip().startswith(";"):
        hi += 1
    block = lines[lo:hi + 1]
    fields: dict[str, set[str]] = {"in": set(), "out": set(), "clobbers": set()}
    for line in block:
        parts = _FIELD.split(line)
        for key, value in zip(parts[1::2], parts[2::2]):
            fields[key] |= registers(value)
    return Header("\n".join(block), fields["in"], fields["out"], fields["clobbers"])
