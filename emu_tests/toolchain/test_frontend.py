"""The FASM-subset front end (builder/asm/fasm.py, expr.py, assemble.py): every directive of the
subset assembles to what fasm 1.73 makes of it, and every error class stops the build with
"asm/FILE.asm:LINE: message". Each test writes a small project into a temporary directory
(conftest's `asm_tree`); expected values are written out by hand (fasm's documented
semantics, checked against fasm 1.73 where noted), never taken from the builder itself."""
from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from capstone import CS_ARCH_X86, CS_MODE_64, Cs

from builder.asm.build import build
from builder.asm.errors import BuildError
from conftest import PROLOGUE

EXIT = "        mov eax, 60\n        syscall\n"


def assemble_tree(root):
    return build(root, root / "gemma")


def disasm(result) -> list[str]:
    """'mnemonic op_str' of every instruction in the program's .text (no data there)."""
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    return [f"{i.mnemonic} {i.op_str}".strip()
            for i in md.disasm(result.image.text, result.image.layout.text_addr)]


def run(binary) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary)], capture_output=True, timeout=10)


def test_segments_entry_and_rip_relative_data(asm_tree):
    # entry is not the first label; data and bss are reached RIP-relatively from code.
    root = asm_tree({"gemma.asm": """format ELF64 executable 3
entry start
segment readable executable
unused: ret
start:  mov     eax, 1
        mov     edi, 1
        lea     rsi, [msg]
        mov     edx, msg_len
        syscall
        mov     edi, [status]
        add     edi, [counter]
""" + EXIT + """
msg:    db 'hello', 10
msg_len = $ - msg
segment readable writeable
status: dd 40
counter rd 1
"""})
    result = assemble_tree(root)
    out = run(result.binary)
    assert (out.stdout, out.returncode) == (b"hello\n", 40)
    lay = result.image.layout
    assert result.symbols["start"]["address"] == lay.text_addr + 1
    assert result.symbols["status"] == {"address": lay.data_addr, "size": 4,
                                        "file": "asm/gemma.asm", "line": 18}
    assert result.symbols["counter"]["address"] == lay.bss_addr
    assert (len(result.image.data), result.image.bss_size) == (4, 4)


def test_include_is_relative_to_asm_and_counted_per_file(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + "include 'part.asm'\n" + EXIT,
                     "part.asm": "        xor edi, edi\n        mov edi, 7\n"})
    result = assemble_tree(root)
    assert run(result.binary).returncode == 7
    rows = {line.split()[0]: line.split()[1:] for line in result.table.splitlines() if line}
    assert rows["asm/part.asm"] == ["7", "0", "0"]          # xor (2) + mov (5) bytes of text
    assert rows["asm/gemma.asm"] == ["7", "0", "0"]         # mov eax, 60 (5) + syscall (2)


def test_local_labels_are_scoped_to_the_last_global_label(asm_tree):
    root = asm_tree("""        jmp     first.done
first:  nop
.done:  jmp     .done
second: jmp     .done
.done:  jmp     first.done
""")
    result = assemble_tree(root)
    syms = result.symbols
    assert set(syms) == {"start", "first", "second"}           # locals belong to their parent
    a = result.image.symbols
    assert a["first.done"] == syms["first"]["address"] + 1
    assert a["second.done"] == syms["second"]["address"] + 2
    text = disasm(result)
    assert text == [f"jmp {a['first.done']:#x}", "nop", f"jmp {a['first.done']:#x}",
                    f"jmp {a['second.done']:#x}", f"jmp {a['first.done']:#x}"]
    assert syms["first"]["size"] == 3                          # nop + jmp .done (2 bytes)


# fasm 1.73 priorities, lowest first: + -, * /, mod, and or xor, shl shr; then unary.
# Each value below is what fasm 1.73 assembled for `db EXPR` (checked by hand).
PRIORITIES = [("1 + 2 shl 2", 9), ("6 and 3 + 1", 3), ("2 * 3 mod 4", 6), ("7 mod 4 * 2", 6),
              ("1 or 2 shl 1", 5), ("12 / 2 * 3", 18), ("5 - 2 - 1", 2), ("-7 / 2", -3),
              ("-7 mod 3", -1), ("1 xor 3 and 2", 2), ("6 or 1 and 3", 3),
              ("5 and 3 * 2", 2), ("0x10 shr 1 + 1", 9), ("-(2+3)", -5), ("not 0xfe and 0xff", 1),
              ("1 shl 2 * 3", 12), ("(1 + 2) * 3", 9)]


def test_expressions_follow_fasm_priorities(asm_tree):
    root = asm_tree(EXIT + "".join(f"        db {e}\n" for e, _ in PRIORITIES))
    data = assemble_tree(root).image.text[7:]
    for n, (text, value) in enumerate(PRIORITIES):
        assert data[n] == value & 0xFF, f"db {text}: expected {value}, got {data[n]}"


def test_constants_forward_references_dollar_and_label_differences(asm_tree):
    root = asm_tree(EXIT + """A = B * 2 + 1
C equ B + 1
B = 3
here = $
        dd here - start, A, table_end - table, C, D.x
table:  dq 1, 2
table_end:
D:
.x = 5
""")
    result = assemble_tree(root)
    assert struct.unpack_from("<5I", result.image.text, 7) == (7, 7, 16, 4, 5)


def test_equ_substitutes_tokens(asm_tree):
    root = asm_tree("count equ ecx\nsize equ dword\n        mov count, 5\n"
                    "        mov size [rsi], count\n" + EXIT)
    assert disasm(assemble_tree(root))[:2] == ["mov ecx, 5", "mov dword ptr [rsi], ecx"]


def test_number_formats(asm_tree):
    root = asm_tree(EXIT + "        db 31, 0x1F, 1Fh, $1F, 11111b, 37o, 37q, 31d, 'a'\n"
                    "        dw 'ab'\n        dd 'abcd'\n")
    text = assemble_tree(root).image.text[7:]
    assert text == bytes([31] * 8) + b"a" + b"ab" + b"abcd"


def test_data_directives(asm_tree):
    root = asm_tree(EXIT + """        db 'It''s', 0, -1, 255, "q"
        dw 0x1234, -2, 65535
        dd 0xdeadbeef, -1, 1.0, -0.5, 1e-6
        dq -1, 0x123456789abcdef0, 0.1, -2.5e10
        db 2 dup (1, 2), 3 dup 7, 2 dup (2 dup (5), 6)
        dd 2 dup 1.5
""")
    text = assemble_tree(root).image.text[7:]
    expected = (b"It's\x00\xff\xff" + b"q"
                + struct.pack("<HhH", 0x1234, -2, 65535)
                + struct.pack("<Iifff", 0xdeadbeef, -1, 1.0, -0.5, 1e-6)
                + struct.pack("<qQdd", -1, 0x123456789abcdef0, 0.1, -2.5e10)
                + bytes([1, 2, 1, 2, 7, 7, 7, 5, 5, 6, 5, 5, 6])
                + struct.pack("<ff", 1.5, 1.5))
    assert text == expected


def test_float_literals_round_like_fasm(asm_tree):
    # 1 + 2^-24 + 2^-54 lies just above the midpoint between two float32 values: rounding
    # once (fasm 1.73 gives 0x3f800001) differs from rounding through a double (0x3f800000).
    above_midpoint = "1.000000059604644830901776231257827021181583404541015625"
    root = asm_tree(EXIT + f"        dd {above_midpoint}, 0.1, 1e-45, 3.4028234e38, -0.0\n"
                    "        dw 1.0, -2.5, 0.1, 65504.0, 1e-7\n")
    text = assemble_tree(root).image.text
    words = struct.unpack_from("<5I", text, 7)
    assert words == (0x3F800001, 0x3DCCCCCD, 0x00000001, 0x7F7FFFFF, 0x80000000)
    # dw takes IEEE half precision; fasm 1.73 gave 003c 00c1 662e ff7b 0200 for this line.
    assert text[27:37] == bytes.fromhex("003c00c1662eff7b0200")


def test_reservations_are_bss_at_the_end_and_zeros_inside(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + EXIT + """segment readable writeable
a       rb 3
b       db 1
c       rw 2
d       rd 1
e       rq 2
"""})
    result = assemble_tree(root)
    assert result.image.data == b"\0\0\0\x01"                    # rb before db: zeros in file
    assert result.image.bss_size == 4 + 4 + 16
    syms = result.symbols
    assert [syms[n]["address"] - syms["a"]["address"] for n in "abcde"] == [0, 3, 4, 8, 12]
    assert [syms[n]["size"] for n in "abcde"] == [3, 1, 4, 4, 16]


def test_align_pads_with_nop_bytes_and_trailing_align_is_bss(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + EXIT + """        align 8
aligned_code:
segment readable writeable
x       db 1
        align 16
y       dd 2
        align 64
z       rb 1
"""})
    result = assemble_tree(root)
    lay, syms = result.image.layout, result.symbols
    assert syms["aligned_code"]["address"] % 8 == 0
    assert result.image.text[7:] == b"\x90" * (syms["aligned_code"]["address"]
                                              - lay.text_addr - 7)
    assert syms["y"]["address"] % 16 == 0 and syms["z"]["address"] % 64 == 0
    assert result.image.data == b"\x01" + b"\x90" * 15 + struct.pack("<I", 2)
    assert result.image.bss_size == syms["z"]["address"] + 1 - (lay.data_addr + 20)


@pytest.mark.parametrize("operator,size", [("byte", 1), ("word", 2), ("dword", 4),
                                           ("qword", 8), ("tword", 10), ("dqword", 16),
                                           ("xword", 16), ("qqword", 32), ("yword", 32)])
def test_size_operators(asm_tree, operator, size):
    line = {1: "inc {} [rsi]", 2: "inc {} [rsi]", 4: "inc {} [rsi]", 8: "inc {} [rsi]",
            10: "fld {} [rsi]", 16: "movaps xmm0, {} [rsi]",
            32: "vmovaps ymm0, {} [rsi]"}[size].format(operator)
    result = assemble_tree(asm_tree(f"        {line}\n" + EXIT))
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    insn = next(md.disasm(result.image.text, 0))
    assert [op.size for op in insn.operands if op.type == 3] == [size]


def test_memory_operand_forms(asm_tree):
    root = asm_tree("""        mov eax, [table]
        mov eax, [table + 8]
        mov rax, [table + rcx*8]
        mov eax, [rsi + rdx*4 - 16]
        mov eax, [rbx*3 + 4]
        lea rax, [r13 + r14*8 + 0x7fffffff]
""" + EXIT + "table:  dq 1, 2\n")
    result = assemble_tree(root)
    table = result.symbols["table"]["address"]
    text = disasm(result)
    rip0 = result.image.placed[1].address + 6                 # end of the first mov
    assert text[0] == f"mov eax, dword ptr [rip + {table - rip0:#x}]"
    assert text[1] == f"mov eax, dword ptr [rip + {table + 8 - rip0 - 6:#x}]"
    assert text[2:6] == [f"mov rax, qword ptr [rcx*8 + {table:#x}]",
                         "mov eax, dword ptr [rsi + rdx*4 - 0x10]",
                         "mov eax, dword ptr [rbx + rbx*2 + 4]",
                         "lea rax, [r13 + r14*8 + 0x7fffffff]"]


def test_prefixes_and_label_sizes(asm_tree):
    root = asm_tree("""        rep movsb
        lock xadd [rdi], eax
        repne scasb
        mov [value], 5
        movss xmm0, [value]
""" + EXIT + "value dd 0\n")
    text = disasm(assemble_tree(root))
    assert text[0] == "rep movsb byte ptr [rdi], byte ptr [rsi]"
    assert text[1] == "lock xadd dword ptr [rdi], eax"
    assert text[2] == "repne scasb al, byte ptr [rdi]"
    assert text[3].startswith("mov dword ptr [rip + ") and text[3].endswith("], 5")


def test_empty_data_segment_and_no_data(asm_tree):
    result = assemble_tree(asm_tree(EXIT))
    assert (result.image.data, result.image.bss_size) == (b"", 0)
    assert run(result.binary).returncode == 0


# Each error class: the files, and the exact message with its file:line.
ERRORS = [
    ("undefined symbol", PROLOGUE + "        mov eax, nowhere\n",
     "asm/gemma.asm:5: undefined symbol 'nowhere'"),
    ("undefined local", PROLOGUE + "        jmp .missing\n",
     "asm/gemma.asm:5: undefined symbol 'start.missing'"),
    ("duplicate label", PROLOGUE + "twice:\ntwice:\n",
     "asm/gemma.asm:6: symbol 'twice' is already defined at asm/gemma.asm:5"),
    ("duplicate constant", PROLOGUE + "N = 1\nN = 2\n",
     "asm/gemma.asm:6: symbol 'N' is already defined at asm/gemma.asm:5"),
    ("label named like an instruction", PROLOGUE + "out:\n",
     "asm/gemma.asm:5: 'out' is an instruction and cannot be a label or constant name"),
    ("constant named like a register", PROLOGUE + "rax = 1\n",
     "asm/gemma.asm:5: 'rax' is a register name and cannot be a label or constant name"),
    ("unknown instruction", PROLOGUE + "        frobnicate eax\n",
     "asm/gemma.asm:5: unknown instruction or directive 'frobnicate'"),
    ("macro", PROLOGUE + "macro twice x { }\n",
     "asm/gemma.asm:5: 'macro' is not in the FASM subset"),
    ("if", PROLOGUE + "if 1\n", "asm/gemma.asm:5: 'if' is not in the FASM subset"),
    ("times", PROLOGUE + "times 3 nop\n", "asm/gemma.asm:5: 'times' is not in the FASM subset"),
    ("repeat", PROLOGUE + "repeat 2\n", "asm/gemma.asm:5: 'repeat' is not in the FASM subset"),
    ("virtual", PROLOGUE + "virtual at 0\n",
     "asm/gemma.asm:5: 'virtual' is not in the FASM subset"),
    ("struc", PROLOGUE + "struc point\n", "asm/gemma.asm:5: 'struc' is not in the FASM subset"),
    ("label directive", PROLOGUE + "label vals dword\n",
     "asm/gemma.asm:5: 'label' is not in the FASM subset"),
    ("use64", PROLOGUE + "use64\n", "asm/gemma.asm:5: 'use64' is not in the FASM subset"),
    ("ymm16", PROLOGUE + "        vaddps ymm16, ymm1, ymm2\n",
     "asm/gemma.asm:5: 'ymm16' is an AVX-512 register other than zmm0-zmm31: not in the FASM "
     "subset"),
    ("xmm16", PROLOGUE + "        movaps xmm16, xmm1\n",
     "asm/gemma.asm:5: 'xmm16' is an AVX-512 register other than zmm0-zmm31: not in the FASM "
     "subset"),
    ("mask register", PROLOGUE + "        kmovw k1, eax\n",
     "asm/gemma.asm:5: 'k1' is an AVX-512 register other than zmm0-zmm31: not in the FASM "
     "subset"),
    ("EVEX displacement", PROLOGUE + "        vmovups zmm0, [rsi+64]\n",
     "asm/gemma.asm:5: an AVX-512 (zmm) instruction's address must have no displacement: "
     "keystone mis-encodes EVEX displacements (write [reg] or [reg+reg*s])"),
    ("EVEX RIP-relative", PROLOGUE + "here:\n        vfmadd231ps zmm0, zmm1, [here]\n",
     "asm/gemma.asm:6: an AVX-512 (zmm) instruction's address must have no displacement: "
     "keystone mis-encodes EVEX displacements (write [reg] or [reg+reg*s])"),
    ("segment override", PROLOGUE + "        mov eax, [fs:rax]\n",
     "asm/gemma.asm:5: segment register 'fs' is not in the FASM subset"),
    ("short not on a jump", PROLOGUE + "        mov eax, short 5\n",
     "asm/gemma.asm:5: 'short' applies to jump targets only"),
    ("ptr", PROLOGUE + "        mov dword ptr [rax], 1\n",
     "asm/gemma.asm:5: fasm writes size operators without 'ptr'"),
    ("immediate out of range", PROLOGUE + "        mov al, 300\n",
     "asm/gemma.asm:5: immediate 300 (0x12c) out of range [-128, 255]"),
    ("imm32 out of range", PROLOGUE + "        add rax, 0xFFFFFFFF\n",
     "asm/gemma.asm:5: immediate 4294967295 (0xffffffff) out of range "
     "[-2147483648, 2147483647]"),
    ("db value out of range", PROLOGUE + "        db 256\n",
     "asm/gemma.asm:5: value 256 (0x100) out of range [-128, 255]"),
    ("displacement out of range", PROLOGUE + "        mov eax, [rax + 0x80000000]\n",
     "asm/gemma.asm:5: displacement 2147483648 (0x80000000) out of range "
     "[-2147483648, 2147483647]"),
    ("size not specified", PROLOGUE + "        inc [rax]\n",
     "asm/gemma.asm:5: operand size not specified"),
    ("invalid address", PROLOGUE + "        mov eax, [rsp*2]\n",
     "asm/gemma.asm:5: invalid address (base + index*1/2/4/8 + displacement)"),
    ("32-bit address", PROLOGUE + "        mov eax, [eax]\n",
     "asm/gemma.asm:5: 'eax' cannot address memory (use a 64-bit register)"),
    ("high byte with REX", PROLOGUE + "        mov r8b, ah\n",
     "asm/gemma.asm:5: ah/bh/ch/dh cannot be used with a register that needs a REX prefix"),
    ("missing include", PROLOGUE + "include 'nothere.asm'\n",
     "asm/gemma.asm:5: file not found: asm/nothere.asm"),
    ("missing quote", PROLOGUE + "        db 'abc\n", "asm/gemma.asm:5: missing end quote"),
    ("bad character", PROLOGUE + "        mov eax, 1 % 2\n",
     "asm/gemma.asm:5: unexpected character '%'"),
    ("local without parent", "format ELF64 executable 3\nentry start\n"
     "segment readable executable\n.early:\nstart:\n",
     "asm/gemma.asm:4: local label '.early' has no preceding global label"),
    ("code before segment", "format ELF64 executable 3\nentry start\nstart: nop\n",
     "asm/gemma.asm:3: code or data before the first `segment` directive"),
    ("circular constant", PROLOGUE + "A = B\nB = A + 1\n        db A\n",
     "asm/gemma.asm:5: circular definition of 'A'"),
    ("division by zero", PROLOGUE + "        db 1 / 0\n", "asm/gemma.asm:5: division by zero"),
    ("float in db", PROLOGUE + "        db 1.0\n",
     "asm/gemma.asm:5: float literal 1.0 needs dw, dd or dq"),
    ("float in code", PROLOGUE + "        mov eax, 1.5\n",
     "asm/gemma.asm:5: float literal 1.5 is only allowed in dw/dd/dq data"),
    ("align not a power of two", PROLOGUE + "        align 6\n",
     "asm/gemma.asm:5: align 6: not a power of two <= 4096"),
    ("undefined entry", "format ELF64 executable 3\nentry begin\nsegment readable executable\n"
     "start: ret\n", "asm/gemma.asm:2: entry label 'begin' is not defined"),
    ("bad format", "format ELF executable\n",
     "asm/gemma.asm:1: only one `format ELF64 executable 3` is supported"),
    ("bad segment", PROLOGUE + "segment readable writeable executable\n",
     "asm/gemma.asm:5: segment must be `readable executable` or `readable writeable`"),
    ("uninitialised data", PROLOGUE + "        dd ?\n",
     "asm/gemma.asm:5: '?' (uninitialised data) is not in the FASM subset; use rb/rw/rd/rq"),
    ("keystone refusal", PROLOGUE + "        movups xmm0, [value]\nvalue dd 1\n",
     "asm/gemma.asm:5: keystone rejected 'movups xmm0, dword ptr [rip + 0x0]': "
     "Invalid operand (KS_ERR_ASM_INVALIDOPERAND) ('value' is a 4-byte data label; use "
     "`value:` on its own line or a size operator)"),
    ("jump out of range", PROLOGUE + "        jrcxz far_away\n        db 200 dup 0\nfar_away:\n",
     "asm/gemma.asm:5: relative jump out of range (short jumps, jrcxz and loop reach "
     "-128..127 bytes)"),
]


@pytest.mark.parametrize("name,source,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_error_classes_name_file_and_line(asm_tree, name, source, message):
    root = asm_tree({"gemma.asm": source})
    with pytest.raises(BuildError) as err:
        assemble_tree(root)
    assert str(err.value).startswith(message), f"{name}: got {err.value}"
    assert not (root / "gemma").exists()


def test_errors_in_included_files_name_that_file(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + "include 'a.asm'\n",
                     "a.asm": "; a comment\n\ninclude 'b.asm'\n",
                     "b.asm": "        nop\n        mov eax, [undefined_here]\n"})
    with pytest.raises(BuildError, match=r"^asm/b\.asm:2: undefined symbol 'undefined_here'$"):
        assemble_tree(root)


def test_circular_include(asm_tree):
    root = asm_tree({"gemma.asm": PROLOGUE + "include 'a.asm'\n", "a.asm": "include 'a.asm'\n"})
    with pytest.raises(BuildError, match=r"^asm/a\.asm:1: 'asm/a\.asm' includes itself$"):
        assemble_tree(root)


def test_command_line_prints_one_line_and_exits_1(asm_tree):
    root = asm_tree("        mov eax, nowhere\n")
    proc = subprocess.run([sys.executable, "-m", "builder", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == "asm/gemma.asm:5: undefined symbol 'nowhere'\n"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_keystone_gets_every_number_in_0x_form_and_ptr_sizes(asm_tree):
    # keystone reads bare numbers as hex once an option is set: "10" must never reach it.
    root = asm_tree("        mov eax, 10\n        mov dword [rsi + 16], -10\n"
                    "        lea rsi, [value]\n" + EXIT + "value: dd 0\n")
    result = assemble_tree(root)
    texts = [p.expected.keystone for p in result.image.placed if p.expected][:3]
    value = result.symbols["value"]["address"]
    lea = result.image.placed[3]
    assert texts == ["mov eax, 0xa", "mov dword ptr [rsi + 0x10], -0xa",
                     f"lea rsi, [rip + {value - lea.address - lea.size:#x}]"]


def test_fasm_conveniences(asm_tree):
    # string movsd/cmpsd without operands, fasm's default dword for cvtsi2ss/movsxd memory
    # operands, `jmp short` (which must reach).
    root = asm_tree("        rep movsd\n        cmpsd\n        cvtsi2ss xmm0, [rsi]\n"
                    "        movsxd rax, [rsi]\n        jmp short start\n" + EXIT)
    assert disasm(assemble_tree(root))[:5] == [
        "rep movsd dword ptr [rdi], dword ptr [rsi]", "cmpsd dword ptr [rsi], dword ptr [rdi]",
        "cvtsi2ss xmm0, dword ptr [rsi]", "movsxd rax, dword ptr [rsi]",
        f"jmp {assemble_tree(root).image.layout.text_addr:#x}"]
    far = asm_tree("        jmp short away\n        db 130 dup 0\naway:\n" + EXIT)
    with pytest.raises(BuildError, match=r"^asm/gemma\.asm:5: relative jump out of range"):
        assemble_tree(far)


def test_self_dependent_layout_settles_with_nop_padding(asm_tree):
    # `add eax, c - b` at an address = 62 (mod 64): as imm8 (3 bytes) the align pads 63 and
    # c - b = 128 needs an imm32; as imm32 (5 bytes) the align pads 61 and c - b = 126 fits a
    # byte: it never settles (fasm says "code cannot be generated"). The builder keeps the
    # 5-byte size: the 3-byte form plus two nops, with c - b computed for that layout.
    from linker import layout
    lead = (62 - layout(0, 0, 0).text_addr) % 64
    root = asm_tree(f"        db {lead} dup 0x90\n        add eax, c - b\nb:      align 64\n"
                    "        db 65 dup 0\nc:" + EXIT)
    result = assemble_tree(root)
    add = next(p for p in result.image.placed if p.expected)
    syms = result.image.symbols
    assert add.address % 64 == 62 and add.pad == 2
    assert add.data == bytes([0x83, 0xC0, syms["c"] - syms["b"], 0x90, 0x90])
    assert syms["c"] - syms["b"] == 126


def test_vex_scalar_memory_operands_get_their_size(asm_tree):
    # fasm infers these sizes; keystone refuses the operand unless told.
    root = asm_tree("        vaddss xmm0, xmm0, [rsi]\n        vfmadd231sd xmm0, xmm1, [rsi]\n"
                    "        vcvtsd2ss xmm0, xmm0, [rsi]\n        vcvtss2sd xmm0, xmm0, [rsi]\n"
                    + EXIT)
    assert disasm(assemble_tree(root))[:4] == [
        "vaddss xmm0, xmm0, dword ptr [rsi]", "vfmadd231sd xmm0, xmm1, qword ptr [rsi]",
        "vcvtsd2ss xmm0, xmm0, qword ptr [rsi]", "vcvtss2sd xmm0, xmm0, dword ptr [rsi]"]


def test_zmm_instructions_without_displacement(asm_tree):
    # the AVX-512F forms fast.asm uses; keystone encodes them right when no displacement is
    # involved (verify would stop the build otherwise), and fasm makes the same bytes
    root = asm_tree("        vcvtph2ps zmm23, [rdx+rcx]\n        vmovups zmm24, [rsi+r10*2]\n"
                    "        vfmadd231ps zmm19, zmm23, zmm24\n        vextractf64x4 ymm4, zmm0, 1\n"
                    "        vmovaps zmm12, zmm16\n" + EXIT)
    assert disasm(assemble_tree(root))[:5] == [
        "vcvtph2ps zmm23, ymmword ptr [rdx + rcx]", "vmovups zmm24, zmmword ptr [rsi + r10*2]",
        "vfmadd231ps zmm19, zmm23, zmm24", "vextractf64x4 ymm4, zmm0, 1", "vmovaps zmm12, zmm16"]
