"""builder/asm/pack_fields.py, the packer's field machine: the fields it gives x86 bytes, how
often it agrees with capstone on the image, and asm/unpack.asm's machine (the shipped bytes,
in Unicorn) against it on every byte of the image and of random inputs."""
from __future__ import annotations

import random

import capstone
import pytest
from unicorn import UC_ARCH_X86, UC_HOOK_CODE, UC_MODE_64, Uc
from unicorn.x86_const import (UC_X86_REG_R12, UC_X86_REG_RBX, UC_X86_REG_RCX,
                               UC_X86_REG_RDI, UC_X86_REG_RDX, UC_X86_REG_RSI,
                               UC_X86_REG_RSP)

from builder.asm import pack
from builder.asm import pack_fields as f
from builder.asm.packed import STUB_BASE, image_bytes


def fields_of(data: bytes) -> list[tuple[int, int, int]]:
    """(code, opcode, plan) before each byte of TABLES + data, as the Python machine sees
    the stream the coder codes (the call filter's output)."""
    stream = pack.encode_calls(f.TABLES + data)
    machine, out, seen = f.Fields(), bytearray(), []
    for byte in stream:
        seen.append((machine.field, machine.opcode, machine.plan))
        out.append(byte)
        machine.step(byte, out)
    return seen


@pytest.mark.parametrize("code,fields", [
    ("488b442408", [f.OP0, f.OP0, f.MODRM, f.SIB, f.DISP]),             # mov rax, [rsp+8]
    ("e801000000", [f.OP0, f.REL32] + [f.REL32_REST] * 3),              # call rel32
    ("8b0500010000", [f.OP0, f.MODRM, f.DISP32] + [f.DISP] * 3),        # mov eax, [rip+..]
    ("81c178563412", [f.OP0, f.MODRM, f.IMM32] + [f.IMM32_REST] * 3),   # add ecx, imm32
    ("0f8410000000", [f.OP0, f.OP1, f.REL32] + [f.REL32_REST] * 3),     # jz rel32
    ("7405", [f.OP0, f.REL8]),                                          # jz rel8
    ("c5fc58c1", [f.OP0, f.VEXP, f.OP1, f.MODRM]),                      # vaddps ymm0, ymm0, ymm1
    ("c4e37d18c101", [f.OP0, f.P0, f.VEXP, f.OP3, f.MODRM, f.IMM8]),    # vinsertf128
    ("62f27d48b8c1", [f.OP0, f.P0, f.VEXP, f.VEXP, f.OP2, f.MODRM]),    # vfmadd231ps zmm
    ("660f3a0bc001", [f.OP0, f.OP0, f.OP1, f.OP3, f.MODRM, f.IMM8]),    # roundsd
    ("c3", [f.OP0]),
])
def test_fields_of_instructions(code, fields):
    """Each byte's field, from an instruction's first byte (the tables before it decoded)."""
    got = [code for code, _, _ in fields_of(bytes.fromhex(code) + b"\xc3")[len(f.TABLES):]]
    assert got[:len(fields)] == fields and got[len(fields)] == f.OP0


def test_opcode_lane_is_the_instructions_opcode():
    seen = fields_of(bytes.fromhex("488b442408" "c3"))[len(f.TABLES):]
    assert [opcode for _, opcode, _ in seen] == [0, 0x48, 0x8B, 0x8B, 0x8B, 0x8B]


def test_tables_end_on_a_modrm_of_entry_0():
    """The tables' last byte is a ModRM whose entry is 0 (`add [rax], al`): the image starts
    at an instruction's start, and asm/unpack.asm zeroes its table after the tables with the
    eax = ecx = 0 that this byte's lookup and `.append` leave."""
    code, _, _ = fields_of(b"")[-1]
    assert code == f.MODRM and f.TABLES[f.MODRM << 8 | f.TABLES[-1] & f.MODRM_REG] == 0


def test_machine_agrees_with_capstone_on_most_of_the_image(gemma):
    """Not a decoder, but close to one: of the image's instructions (capstone's, data
    skipped), at least 95% start where the machine expects an instruction and have their
    displacement and immediate bytes where it puts them."""
    data = image_bytes(gemma.result.image)
    seen = fields_of(data)[len(f.TABLES):]
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail, md.skipdata = True, True
    field_of = {f.DISP32: "d", f.DISP: "d", f.IMM32: "i", f.IMM32_REST: "i", f.IMM8: "i",
                f.REL32: "i", f.REL32_REST: "i", f.REL8: "i"}
    agree = total = 0
    # the call filter changed call operands, not their fields: disassemble the image itself
    for insn in md.disasm(data, 0):
        if insn.id == 0:
            continue
        expect = ["d" if insn.disp_size and insn.disp_offset <= k < insn.disp_offset +
                  insn.disp_size else "i" if insn.imm_size and insn.imm_offset <= k <
                  insn.imm_offset + insn.imm_size else None for k in range(insn.size)]
        got = [field_of.get(seen[insn.address + k][0]) for k in range(insn.size)]
        total += 1
        agree += seen[insn.address][0] == f.OP0 and got == expect
    assert agree >= 0.95 * total, (agree, total)


def asm_fields(gemma, data: bytes) -> list[tuple[int, int, int]]:
    """(code, opcode, plan) before each byte of the stream, from the shipped decoder run in
    Unicorn on compress(data): read where its machine has stepped (`unpack.fielded`), the
    first byte's from the start state."""
    packed = gemma.result.packed
    symbols = packed.stub.symbols
    payload = pack.compress(data)
    out_size = len(f.TABLES) + len(data)
    uc = Uc(UC_ARCH_X86, UC_MODE_64)
    elf = packed.elf
    uc.mem_map(STUB_BASE, len(elf) + 0xFFF & ~0xFFF)
    uc.mem_write(STUB_BASE, elf)
    src, out, table, stack = 0x10000000, 0x20000000, 0x30000000, 0x40000000
    for base, size in ((src, len(payload)), (out, out_size), (table, pack.SCRATCH),
                       (stack, 1 << 16)):
        uc.mem_map(base, size + 0xFFF & ~0xFFF)
    uc.mem_write(src, payload)
    done = stack + 0x8000                # the return address (emulation stops there)
    uc.mem_write(done, b"\xf4")
    rsp = stack + 0xF000
    uc.mem_write(rsp, done.to_bytes(8, "little"))
    for reg, value in ((UC_X86_REG_RDI, out), (UC_X86_REG_RSI, src),
                       (UC_X86_REG_RDX, out_size), (UC_X86_REG_RCX, table),
                       (UC_X86_REG_RSP, rsp)):
        uc.reg_write(reg, value)
    seen = [(0, 0, 0)]

    def stepped(uc, address, size, user) -> None:
        rbx, r12, rsp = (uc.reg_read(r) for r in (UC_X86_REG_RBX, UC_X86_REG_R12,
                                                  UC_X86_REG_RSP))
        plan = int.from_bytes(uc.mem_read(rsp + r12 + 8, 4), "little")
        seen.append((rbx & 0xFF, rbx >> 8 & 0xFF, plan))
    at = symbols["unpack.fielded"]
    uc.hook_add(UC_HOOK_CODE, stepped, begin=at, end=at)
    uc.emu_start(symbols["unpack"], done)
    assert bytes(uc.mem_read(out + len(f.TABLES), len(data))) == data
    return seen[:-1]


INPUTS = {"random": random.Random(7).randbytes(1500),
          "x86-like": bytes(random.Random(8).choice(bytes.fromhex(
              "0f384c4d488b8962c4c5e8e9f6f70466e4247405c3")) for _ in range(1500))}


@pytest.mark.parametrize("name", ["image", *INPUTS])
def test_asm_machine_agrees_on_every_byte(gemma, name):
    """The shipped machine's code, opcode and plan before every byte of the stream (the
    tables, then the input) equal the Python machine's (the image: ~10 s)."""
    data = image_bytes(gemma.result.image) if name == "image" else INPUTS[name]
    want = fields_of(data)
    got = asm_fields(gemma, data)
    assert len(got) == len(want)
    bad = next((i for i in range(len(want)) if got[i] != want[i]), None)
    assert bad is None, (bad, got[bad], want[bad])
