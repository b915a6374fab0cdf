"""The packer's field machine: which x86 instruction field each byte is in, mirrored by
asm/unpack.asm (its `.fields` step); docs/build.md "The model" gives it field by field.

Contract: `TABLES` (bytes) are its tables, coded in the payload ahead of the image (the
decoded stream is TABLES, then the image); `Fields()` starts before the stream's first byte;
`context()` is the field context of the next byte (a 16-bit word: lane 0 its field's code,
lane 1 the opcode of its instruction); `step(byte, out)` moves past `byte`, reading the
tables from `out` (the stream decoded so far, the byte included: while the tables are
themselves being decoded the machine reads what is there, and 0 past it, as the asm reads
its zeroed buffer). It is no exact x86 decoder: the packer and the decoder only have to
compute the same thing, so rare forms are approximated (an imm64 as an imm32, a 66-prefixed
imm16 as an imm32, F6/F7 /0 `test` without its immediate, a SIB whose base is 5 under mod 0
without its disp32: 3 bytes of the image's payload, for ~12 of decoder; map 1's system
instructions as taking a ModRM).

The machine keeps a plan: the codes of the bytes still to come in the instruction, a
nibble each, the next one lowest (at most four: a dword); an empty plan (0) means the next
byte starts an instruction (code OP0: a prefix, a REX or an opcode of the one-byte map). A
byte moves the plan on by a nibble, then by its code:
- an opcode (codes OP0..OP3: maps one-byte, 0F, 0F 38, 0F 3A) or a ModRM (MODRM): the
  tables' entry for it goes first: for an opcode (256 entries per map), in two nibbles, a
  ModRM, an immediate, a branch offset's first byte, or an escape (0F to map 1, 0F 38 /
  0F 3A to maps 2 / 3; C5 a VEX payload byte and map 1; C4 and 62 the first payload byte of
  VEX3 / EVEX, and 62 one more); for a ModRM (its mod and rm: MODRM_ENTRIES entries), a SIB
  when rm is 4 and mod not 3, then a disp8 (mod 1) or a disp32's first byte (mod 2, or mod 0
  with rm 5);
- VEX3's or EVEX's first payload byte (P0): a payload byte (EVEX: two), then an opcode of
  the map in its low two bits, go after the plan;
- a 32-bit field's first byte (DISP32, IMM32, REL32): its three other bytes (code - 3) first.
"""
from __future__ import annotations

# the fields' codes: a nibble each
OP0, OP1, OP2, OP3 = 0, 1, 2, 3   # an opcode (or a prefix, a REX: OP0) of map 0..3
MODRM, VEXP, P0, SIB = 4, 5, 6, 7 # ModRM; a VEX/EVEX payload byte, the first of VEX3/EVEX's
IMM8, REL8 = 8, 9                 # an imm8 (or each byte of an imm16), a rel8
DISP, IMM32_REST, REL32_REST = 10, 11, 12   # a disp8 or a disp32's last three bytes, ...
DISP32, IMM32, REL32 = 13, 14, 15 # the first byte of a 32-bit field: code - 3 the others
LOOKUPS = 5                       # codes 0..4 look their byte up: 256 table bytes each,
MODRM_REG = 0xC7                  # but a ModRM's without its reg bits (the last table's
MODRM_ENTRIES = 0xC8              # entries: up to mod 3, rm 7)


def _plan(*codes: int) -> int:
    """A table entry: the codes of the bytes after an opcode, the first lowest."""
    return sum(code << 4 * k for k, code in enumerate(codes))


def _tables() -> bytes:
    """The tables (see the module docstring)."""
    m, m_i8, m_i32 = _plan(MODRM), _plan(MODRM, IMM8), _plan(MODRM, IMM32)
    one = [0] * 256                                   # the one-byte map
    for op in range(0x40):                            # add/or/adc/sbb/and/sub/xor/cmp
        one[op] = (m, m, m, m, _plan(IMM8), _plan(IMM32), 0, 0)[op & 7]
    spans = {(0x70, 0x80): _plan(REL8), (0x84, 0x90): m, (0xB0, 0xB8): _plan(IMM8),
             (0xB8, 0xC0): _plan(IMM32), (0xD0, 0xD4): m, (0xD8, 0xE0): m,
             (0xE0, 0xE4): _plan(REL8), (0xE4, 0xE8): _plan(IMM8)}
    for (lo, hi), entry in spans.items():
        one[lo:hi] = [entry] * (hi - lo)
    for op, entry in {0x0F: _plan(OP1), 0x62: _plan(P0, VEXP), 0x63: m, 0x68: _plan(IMM32),
                      0x69: m_i32, 0x6A: _plan(IMM8), 0x6B: m_i8, 0x80: m_i8, 0x81: m_i32,
                      0x83: m_i8, 0xA8: _plan(IMM8), 0xA9: _plan(IMM32), 0xC0: m_i8,
                      0xC1: m_i8, 0xC2: _plan(IMM8, IMM8), 0xC4: _plan(P0),
                      0xC5: _plan(VEXP, OP1), 0xC6: m_i8, 0xC7: m_i32,
                      0xC8: _plan(IMM8, IMM8), 0xCA: _plan(IMM8, IMM8), 0xCD: _plan(IMM8),
                      0xD4: _plan(IMM8), 0xD5: _plan(IMM8), 0xE8: _plan(REL32),
                      0xE9: _plan(REL32), 0xEB: _plan(REL8), 0xF6: m, 0xF7: m, 0xFE: m,
                      0xFF: m}.items():
        one[op] = entry
    two = [m] * 256                                   # 0F: mostly a ModRM
    for op in (0x05, 0x0B, 0x31, 0x77, 0xA2, *range(0xC8, 0xD0)):  # (system ones left out)
        two[op] = 0
    two[0x80:0x90] = [_plan(REL32)] * 16
    for op in (0x70, 0x71, 0x72, 0x73, 0xA4, 0xAC, 0xBA, 0xC2, 0xC4, 0xC5, 0xC6):
        two[op] = m_i8
    two[0x38], two[0x3A] = _plan(OP2), _plan(OP3)
    modrm = [0] * MODRM_ENTRIES                       # what follows a ModRM (reg 0)
    for mod in range(3):
        for rm in range(8):
            disp = (DISP32 if rm == 5 else 0, DISP, DISP32)[mod]
            modrm[mod << 6 | rm] = _plan(SIB, disp) if rm == 4 else _plan(disp)
    return bytes(one + two + [m] * 256 + [m_i8] * 256 + modrm)


TABLES = _tables()


class Fields:
    """The machine's state: the plan, the next byte's code and index, the opcode."""

    def __init__(self) -> None:
        self.plan = 0
        self.field = OP0            # the next byte's code
        self.opcode = 0

    def context(self) -> int:
        return self.field | self.opcode << 8

    def step(self, byte: int, out: bytes | bytearray) -> None:
        code = self.field
        plan = self.plan >> 4
        if code < LOOKUPS:                              # an opcode, a ModRM: its entry
            if code < MODRM:
                self.opcode = byte
            at = code << 8 | (byte & MODRM_REG if code == MODRM else byte)
            plan = _append(plan, out[at] if at < len(out) else 0)
        elif code == P0:                                # the map after the payload
            plan = _append((byte & 3) << 4 | VEXP, plan)
        elif code >= DISP32:                            # a 32-bit field's first byte
            plan = _append(plan, (code - 3) * 0x111)
        self.field = plan & 15
        self.plan = plan


def _append(plan: int, first: int) -> int:
    """The codes of `first`, then those of `plan` (asm: `.append`)."""
    for _ in range((first.bit_length() + 3) // 4):
        plan = plan << 4 & 0xFFFFFFFF
    return plan | first
