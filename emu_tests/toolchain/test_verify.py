"""builder/asm/verify.py: every instruction keystone produced is read back with capstone and
compared with its source line. Mis-encodings (keystone's EVEX displacement bug, truncated
immediates, wrong registers, addresses or targets) must stop the build with file:line and
both forms; correct encodings, including alias spellings, must pass."""
from __future__ import annotations

import pytest

from builder.asm.assemble import Expected, Placed
from builder.asm.build import build
from builder.asm.errors import BuildError, Where
from builder.asm.fasm import Instr
from builder.asm.verify import verify

ADDR = 0x401000
EXIT = "        mov eax, 60\n        syscall\n"


def check(mnemonic: str, operands: list, code: str, prefix: str | None = None) -> None:
    """verify() one instruction: `code` (hex) at ADDR claimed to be `mnemonic operands`."""
    data = bytes.fromhex(code)
    stmt = Instr(Where("asm/t.asm", 7), prefix, mnemonic, [], f"{mnemonic} ...")
    verify([Placed(stmt, "text", ADDR, len(data), data,
                   Expected(prefix, mnemonic, operands, ""))])


@pytest.mark.parametrize("keystone_text,expected,message", [
    ("vmovaps zmmword ptr [rdi + 0x100], zmm3",
     Expected(None, "vmovaps", [("mem", 64, {"rdi": 1}, 256), ("reg", "zmm3")], ""),
     "asm/t.asm:7: keystone encoded 'vmovaps [rdi+256], zmm3' as 'vmovaps zmmword ptr [rdi], "
     "zmm3' (62f17c48295f00): operand 1: expected displacement 0x100, got 0x0"),
    ("vcvtph2ps zmm1, ymmword ptr [rsi + rax*0x2 + 0x20]",
     Expected(None, "vcvtph2ps", [("reg", "zmm1"), ("mem", 32, {"rsi": 1, "rax": 2}, 32)], ""),
     "asm/t.asm:7: keystone encoded 'vcvtph2ps zmm1, [rsi+rax*2+32]' as 'vcvtph2ps zmm1, "
     "ymmword ptr [rsi + rax*2 + 0x400]' (62f27d48134c4620): operand 2: expected displacement "
     "0x20, got 0x400"),
])
def test_keystone_evex_displacement_bug_is_caught(keystone_text, expected, message):
    # The front end refuses EVEX displacements (test_frontend), so the verifier is driven
    # directly with keystone's real output.
    from builder.asm.kstone import Keystone
    with Keystone() as ks:
        [code] = ks.assemble([(keystone_text, ADDR)])
    source = message.split("'")[1]
    stmt = Instr(Where("asm/t.asm", 7), None, expected.mnemonic, [], source)
    with pytest.raises(BuildError) as err:
        verify([Placed(stmt, "text", ADDR, len(code), code, expected)])
    assert str(err.value) == message


def test_keystone_silently_wrapped_short_branch_is_caught():
    # jrcxz reaches -128..127; e3 00 at ADDR goes to ADDR+2, not to the target asked for.
    with pytest.raises(BuildError, match=r"^asm/t\.asm:7: .*expected target 0x401102, "
                                         r"got imm 0x401002$"):
        check("jrcxz", [("target", ADDR + 0x102)], "e300")


@pytest.mark.parametrize("mnemonic,operands,code,why", [
    ("mov", [("reg", "eax"), ("reg", "ecx")], "89d8", "operand 2: expected register ecx, "
                                                      "got ebx"),
    ("mov", [("reg", "al"), ("imm", 300)], "b02c", "operand 2: expected immediate 300"),
    # 0xffffffff fits a 32-bit operand as -1, but not a 64-bit one (sign-extended imm8 -1).
    ("add", [("reg", "rax"), ("imm", 0xFFFFFFFF)], "4883c0ff",
     "operand 2: expected immediate 4294967295"),
    ("mov", [("reg", "eax"), ("mem", 4, {"rsi": 1, "rdx": 4}, 16)], "8b445610",
     "operand 2: expected address registers rsi + rdx*4, got rsi + rdx*2"),
    ("mov", [("reg", "eax"), ("mem", 4, {"rsi": 1}, 16)], "8b4620",
     "operand 2: expected displacement 0x10, got 0x20"),
    ("mov", [("reg", "eax"), ("mem", 2, {"rsi": 1}, 0)], "8b06",
     "operand 2: expected memory size 2, got 4"),
    ("lea", [("reg", "rsi"), ("rip", None, ADDR + 0x100)], "488d3500010000",
     "operand 2: expected address 0x401100, got 0x401107"),
    ("jmp", [("target", ADDR + 0x10)], "eb00", "operand 1: expected target 0x401010"),
    ("nop", [("mem", 4, {"rax": 1}, 0)], "0f1800", "mnemonic nop, got prefetchnta"),
    ("movsb", [], "a4", "prefix rep, got None"),
    ("inc", [("reg", "eax")], "ffc0ffc0", "expected one instruction of 4 bytes"),
])
def test_differences_are_reported(mnemonic, operands, code, why):
    prefix = "rep" if why.startswith("prefix") else None
    with pytest.raises(BuildError) as err:
        check(mnemonic, operands, code, prefix)
    text = str(err.value)
    assert text.startswith(f"asm/t.asm:7: keystone encoded '{mnemonic} ...' as '"), text
    assert why in text, text


@pytest.mark.parametrize("mnemonic,operands,code,prefix", [
    ("jz", [("target", ADDR + 2)], "7400", None),
    ("cmovnz", [("reg", "eax"), ("reg", "ecx")], "0f45c1", None),
    ("sal", [("reg", "eax"), ("imm", 1)], "d1e0", None),
    ("movabs", [("reg", "rax"), ("imm", 2**40)], "48b80000000000010000", None),
    ("mov", [("reg", "rax"), ("imm", 0xFFFFFFFFFFFFFFFF)], "48c7c0ffffffff", None),
    ("and", [("reg", "eax"), ("imm", 0xFFFFFFF0)], "83e0f0", None),
    ("cmpltps", [("reg", "xmm0"), ("reg", "xmm1")], "0fc2c101", None),
    ("cmpps", [("reg", "xmm0"), ("reg", "xmm1"), ("imm", 1)], "0fc2c101", None),
    ("vcmpps", [("reg", "ymm0"), ("reg", "ymm1"), ("reg", "ymm2"), ("imm", 30)],
     "c5f4c2c21e", None),
    ("xchg", [("reg", "eax"), ("reg", "ebx")], "93", None),
    ("test", [("reg", "eax"), ("mem", None, {"rdi": 1}, 0)], "8507", None),
    ("movsb", [], "f3a4", "rep"),
    ("stosq", [], "48ab", None),
    ("fmul", [("reg", "st0"), ("reg", "st1")], "d8c9", None),
    ("faddp", [], "dec1", None),
    ("fxch", [], "d9c9", None),
    ("fld", [("reg", "st0")], "d9c0", None),
    ("fstcw", [("mem", None, {"rsp": 1}, 0)], "9bd93c24", None),
    ("fcomip", [("reg", "st0"), ("reg", "st1")], "dff1", None),
    ("int3", [], "cc", None),
    ("int", [("imm", 3)], "cd03", None),
    ("imul", [("reg", "eax"), ("imm", 5)], "6bc005", None),
    ("lea", [("reg", "rsi"), ("rip", None, ADDR + 0x107)], "488d3500010000", None),
    ("mov", [("reg", "eax"), ("mem", 4, {"rbx": 2}, 4)], "8b441b04", None),
])
def test_equivalent_spellings_pass(mnemonic, operands, code, prefix):
    check(mnemonic, operands, code, prefix)


def test_wrong_x87_register_is_caught():
    with pytest.raises(BuildError, match="register st1, got st2"):
        check("fld", [("reg", "st1")], "d9c2")


def test_a_whole_program_passes_and_every_instruction_is_checked(asm_tree):
    lines = ["jrcxz start", "loop start", "xor eax, eax", "mov rax, 0x123456789", "mov al, -128", "add rax, -0x80000000",
             "mov dword [value], 5", "lea rsi, [value + 4]", "mov eax, [value + rcx*4]",
             "mov eax, [rsi + rdx*4 - 16]", "movzx eax, byte [rsi]", "shl rax, 63",
             "test [rdi], eax", "je start", "setz al", "imul eax, ecx, 5", "rep stosq",
             "lock xadd [rdi], eax", "cdqe", "push -1", "pop rbx", "movss xmm0, [value]",
             "movups xmm1, dqword [value]", "cvtsi2ss xmm0, dword [rsi]", "movq xmm0, rax",
             "pshufd xmm1, xmm2, 255", "cmpltps xmm0, xmm1", "pinsrd xmm0, eax, 2",
             "roundps xmm0, xmm1, 1", "maxss xmm8, xmm15", "fld dword [rsi]", "fmulp st1, st0",
             "fistp qword [rsp]", "fldcw [rsp]", "vfmadd231ps ymm0, ymm1, [rdi + rcx*4]",
             "vcvtph2ps ymm2, [rsi + rax*2 + 32]", "vbroadcastss ymm3, [value]",
             "vextractf128 xmm0, ymm1, 1", "vcmpps ymm0, ymm1, ymm2, 30", "vzeroupper",
             "call qword [rax + 8]", "vfmadd213ss xmm0, xmm1, [rsi]",
             "vcvtps2ph [rdi], ymm1, 4", "vperm2f128 ymm0, ymm1, ymm2, 0x21",
             "vpslld ymm0, ymm0, 23", "vblendvps ymm0, ymm1, ymm2, ymm3", "vptest ymm0, ymm0",
             "lock cmpxchg [rdi], ecx", "xgetbv", "cpuid", "pause"]
    root = asm_tree("".join(f"        {line}\n" for line in lines) + EXIT + "value dd 0, 0\n")
    result = build(root, root / "gemma")
    assert verify(result.image.placed) == len(lines) + 2


def test_keystone_abort_is_contained_in_its_child_process():
    # keystone's LLVM aborts the process on `mov r8b, ah` (the front end refuses it first,
    # see test_frontend); the child dies, the builder reports which item killed it and
    # carries on with a new child.
    from builder.asm.kstone import Keystone, KeystoneCrash
    with Keystone() as ks:
        with pytest.raises(KeystoneCrash) as crash:
            ks.assemble([("nop", ADDR), ("mov r8b, ah", ADDR)])
        assert crash.value.index == 1
        assert "LLVM ERROR" in str(crash.value)
        assert ks.assemble([("mov eax, 0xa", ADDR), ("bogus", ADDR)]) == [
            bytes.fromhex("b80a000000"), "Invalid mnemonic (KS_ERR_ASM_MNEMONICFAIL)"]
