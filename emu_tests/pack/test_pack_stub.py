"""The packed ./gemma: asm/unpack.asm's decoder against the Python codec, and asm/stub.asm's
start-up — memory never writable and executable at once, the table unmapped, and the image
entered with the stack Linux gives a new program.

- The decoder is the shipped bytes (the packed file's `unpack`, found through the stub's map):
  in Unicorn, bounds-checked and held to its header like every kernel, on the shipped payload
  and on adversarial images (zeros, random bytes); natively (guard pages after every buffer)
  on a 64 KB image, which would take minutes in Unicorn (its Python hook on every stack
  access: the decoder keeps its per-model records on the stack).
- The start-up is watched by gdb (installed by CI like fasm and qemu-user): every mmap,
  mprotect and munmap the stub makes, then, stopped at the image's entry point, rsp, the
  x87 and SSE state, the stack and the memory map, against the state at the program's first
  instruction (the general registers hold the decoder's leftovers).
"""
from __future__ import annotations

import json
import random
import resource
import subprocess
import textwrap

import numpy as np
import pytest

from builder.asm import pack
from builder.asm import pack_fields as fields
from builder.asm.fasm import Instr, parse
from builder.asm.build import REPO_ROOT
from builder.asm.packed import STUB_ENTRY_FILE, image_bytes
from emu_tests.harness import I64, Emulator, In, NativeRunner, Out, load_elf
from emu_tests.harness.header import read_header

PROT_WRITE, PROT_EXEC = 2, 4


@pytest.fixture(scope="module")
def stub(gemma):
    """The packed program as an image the harness can call into, with the stub's map."""
    return load_elf(gemma.binary, gemma.result.stub_symbols)


def unpack_in(runner, payload: bytes, size: int, **kw) -> bytes:
    """The shipped decoder on `payload`: the field tables and `size` bytes out (those
    returned), a zeroed out and table (it keeps no register: not SysV)."""
    tables = len(pack.TABLES)
    out = runner.call("unpack", Out(np.zeros(tables + size, np.uint8), "out"),
                      In(np.frombuffer(payload, np.uint8), "src"), I64(tables + size),
                      Out(np.zeros(pack.SCRATCH, np.uint8), "scratch"), sysv=False, **kw)
    got = out.outputs[0].tobytes()
    assert got[:tables] == pack.TABLES
    return got[tables:]


def test_constants_mirror_the_codec(gemma):
    consts = gemma.result.packed.stub.symbols
    names = ("PACK_TABLE_BITS", "PACK_SCRATCH", "PACK_HASH", "PACK_PRIOR", "PACK_CALL",
             "PACK_TABLES", "PACK_MODRM", "PACK_LOOKUPS", "PACK_VEXP", "PACK_P0",
             "PACK_DISP32")
    assert tuple(consts[n] for n in names) == (
        pack.TABLE_BITS, pack.SCRATCH, pack.HASH, pack.PRIOR, pack.CALL, len(pack.TABLES),
        fields.MODRM, fields.LOOKUPS, fields.VEXP, fields.P0, fields.DISP32)


def calls_and_small_dwords(size: int) -> bytes:
    """Bytes 0xE8, 0, 1 and 2: many a 0xE8 before a dword below 2^16, which the call filter
    codes (none here it refuses: a refused one needs a dword in 2^16 - offset - 5 .. 2^16)."""
    rng = random.Random(4)
    return bytes(rng.choice(b"\xe8\x00\x01\x02") for _ in range(size))


ADVERSARIAL = {"zeros": bytes(1500), "random": random.Random(3).randbytes(800),
               "calls": calls_and_small_dwords(900)}


@pytest.mark.parametrize("name", ["shipped", *ADVERSARIAL])
def test_decoder_in_unicorn_matches_the_codec(gemma, stub, name):
    """Bit for bit the Python decoder's output, every access inside its buffers, the
    registers its header does not clobber preserved (the shipped payload: ~25M
    instructions, ~20 s). The budget only catches an endless loop: per bit, ~32 instructions
    per context model (its loop and its share of the byte's hashes) and ~22 more (the range
    decoder), with some margin."""
    data = image_bytes(gemma.result.image) if name == "shipped" else ADVERSARIAL[name]
    payload = gemma.result.packed.payload if name == "shipped" else pack.compress(data)
    assert pack.decompress(payload, len(data)) == data
    info = gemma.result.stub_symbols["unpack"]
    header = read_header((REPO_ROOT / info["file"]).read_text(), "unpack")
    budget = (len(pack.TABLES) + len(data)) * 8 * (40 + 35 * payload[0])  # [0]: the models
    got = unpack_in(Emulator(stub), payload, len(data), budget=budget,
                    preserves=header.preserved())
    assert got == data, next(i for i in range(len(data)) if got[i] != data[i])


def test_decoder_natively_on_a_64k_image(gemma, stub):
    """A 64 KB image (the engine's code four times over, with a different tail each time,
    then noise): the native decoder equals the codec, and never touches the guard pages."""
    code = image_bytes(gemma.result.image)
    rng = random.Random(11)
    data = b"".join(code[:12000] + rng.randbytes(200) for _ in range(4))
    data = (data + rng.randbytes(65536))[:65536]
    payload = pack.compress(data)
    assert unpack_in(NativeRunner(stub), payload, len(data)) == data


def test_only_sys_and_stub_hold_syscall():
    """The system interface lives in asm/sys.asm (the engine) and asm/stub.asm (the packed
    program's start-up); no other source file makes a system call."""
    for entry in ("gemma.asm", STUB_ENTRY_FILE):
        defines = {} if entry == "gemma.asm" else {name: 0x400000 for name in (
            "IMAGE_BASE", "IMAGE_TEXT", "IMAGE_BYTES", "IMAGE_CODE_END", "IMAGE_END",
            "IMAGE_ENTRY")}
        files = {s.where.file for s in parse(REPO_ROOT, entry, defines).statements
                 if isinstance(s, Instr) and s.mnemonic == "syscall"}
        assert files == {"asm/sys.asm" if entry == "gemma.asm" else "asm/stub.asm"}, files


GDB_SCRIPT = r'''
import gdb, json
def read(names):
    out = {}
    for n in names:
        try:
            v = gdb.parse_and_eval("$" + n)
        except gdb.error:
            continue
        if v.type.code == gdb.TYPE_CODE_VOID:   # a register this CPU lacks (zmm, k: no AVX-512)
            continue
        out[n] = str(v) if v.type.code in (gdb.TYPE_CODE_UNION, gdb.TYPE_CODE_STRUCT) \
            else int(v) & (2 ** 64 - 1)
    return out
GPRS = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp"] + ["r%d" % i for i in range(8, 16)]
OTHER = ["eflags", "fs_base", "gs_base", "fctrl", "fstat", "ftag", "fop", "mxcsr"] + \
    ["st%d" % i for i in range(8)] + ["ymm%d" % i for i in range(16)] + \
    ["zmm%d" % i for i in range(32)] + ["k%d" % i for i in range(8)]
def state():
    rsp = int(gdb.parse_and_eval("$rsp"))
    maps = gdb.execute("info proc mappings", to_string=True)
    rows = [line.split() for line in maps.splitlines() if line.strip().startswith("0x")]
    top = next(int(r[1], 16) for r in rows if int(r[0], 16) <= rsp < int(r[1], 16))
    stack = bytes(gdb.selected_inferior().read_memory(rsp, top - rsp)).hex()
    perms = open("/proc/%d/maps" % gdb.selected_inferior().pid).read()
    return {"regs": read(GPRS + OTHER), "stack": stack, "maps": perms}
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("starti")
result = {"start": state(), "syscalls": []}
gdb.execute("catch syscall mmap mprotect munmap")
entering = True
while True:
    gdb.execute("continue", to_string=True)
    regs = read(["orig_rax", "rdi", "rsi", "rdx", "r10", "rax"])
    if entering:
        result["syscalls"].append(regs)
    else:
        result["syscalls"][-1]["ret"] = regs["rax"]
        if regs["orig_rax"] == 10:        # mprotect: the stub's last call
            break
    entering = not entering
gdb.execute("delete")
gdb.execute("break *%d" % ENTRY)
gdb.execute("continue", to_string=True)
result["entry"] = state()
result["entry"]["bss"] = bytes(gdb.selected_inferior().read_memory(BSS, BSS_SIZE)).hex()
print("RESULT " + json.dumps(result))
gdb.execute("kill")
'''


@pytest.fixture(scope="module")
def start_up(gemma, tmp_path_factory) -> dict:
    """What gdb saw of `./gemma -h`: the state at the first instruction, the stub's memory
    calls, and the state at the image's entry point."""
    lay = gemma.result.image.layout
    script = tmp_path_factory.mktemp("gdb") / "watch.py"
    script.write_text(f"ENTRY = {gemma.result.image.entry}\nBSS = {lay.bss_addr}\n"
                      f"BSS_SIZE = {lay.bss_size}\n" + GDB_SCRIPT)
    proc = subprocess.run(["gdb", "-nx", "-batch", "-x", str(script), "--args",
                           str(gemma.binary), "-h"], capture_output=True, text=True, timeout=120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, textwrap.shorten(proc.stdout + proc.stderr, 2000)
    return json.loads(line[len("RESULT "):])


def map_base(lay) -> int:
    """Where the stub maps the decoder's table: below the page of the field tables, which
    the decoder writes just before the image's first code byte."""
    return (lay.text_addr - len(pack.TABLES) & ~0xFFF) - pack.SCRATCH


def test_stub_maps_writes_then_protects(gemma, start_up):
    """mmap the table, the field tables' page and the image's pages read+write; munmap what
    lies below the image; mprotect the code's pages read+execute. Never writable and
    executable at once."""
    lay = gemma.result.image.layout
    calls = [(c["orig_rax"], c["rdi"], c["rsi"], c["rdx"], c["ret"])
             for c in start_up["syscalls"]]
    code_pages = (lay.text_end + 0xFFF & ~0xFFF) - lay.base
    image_end = lay.bss_end + 0xFFF & ~0xFFF
    base = map_base(lay)
    assert lay.base - base == pack.SCRATCH + 0x1000          # (the image's first 232 bytes
    assert [calls[0][:4], calls[1][:3], calls[2][:4]] == [   # are its headers: too few)
        (9, base, image_end - base, 3),                     # PROT_READ | PROT_WRITE
        (11, base, lay.base - base),                        # (munmap has two arguments)
        (10, lay.base, code_pages, 5)]                      # PROT_READ | PROT_EXEC
    assert [c[4] for c in calls] == [base, 0, 0]
    assert start_up["syscalls"][0]["r10"] == 0x108022   # MAP_FIXED_NOREPLACE|POPULATE|ANON|PRIVATE
    for c in (start_up["syscalls"][0], start_up["syscalls"][2]):
        assert c["rdx"] & (PROT_WRITE | PROT_EXEC) != PROT_WRITE | PROT_EXEC, c


def test_no_mapping_is_writable_and_executable(start_up):
    for when in ("start", "entry"):
        for row in start_up[when]["maps"].splitlines():
            perms = row.split()[1]
            assert not ("w" in perms and "x" in perms), (when, row)


def test_table_is_unmapped_and_image_in_place(gemma, start_up):
    lay = gemma.result.image.layout
    rows = [(int(r.split()[0].split("-")[0], 16), int(r.split()[0].split("-")[1], 16),
             r.split()[1]) for r in start_up["entry"]["maps"].splitlines()]
    code_end = lay.text_end + 0xFFF & ~0xFFF
    image_end = lay.bss_end + 0xFFF & ~0xFFF
    assert (lay.base, code_end, "r-xp") in rows
    assert (code_end, image_end, "rw-p") in rows
    assert not [r for r in rows if map_base(lay) <= r[0] < lay.base], rows


def test_image_starts_with_the_stack_and_state_linux_gives_a_program(gemma, start_up):
    """At the image's entry: rsp and the whole initial stack (argc, argv, envp, auxv and the
    strings) as at the first instruction; DF clear; the x87 (control word, empty stack),
    MXCSR, vector and mask registers as the kernel set them; the bss zeroed. The other
    general registers hold the decoder's leftovers: the image reads none of them before it
    writes it (kernels/test_harness.py runs it with junk there)."""
    start, entry = start_up["start"], start_up["entry"]
    assert entry["regs"]["rsp"] == start["regs"]["rsp"]
    assert entry["stack"] == start["stack"]
    gprs = {n for n in entry["regs"] if n[0] == "r" and (n[1:].isdigit() or len(n) == 3)}
    assert len(gprs) == 16, gprs
    assert entry["regs"]["eflags"] & 0x400 == 0                   # DF
    for name, value in start["regs"].items():
        if name not in gprs and name != "eflags":
            assert entry["regs"][name] == value, name
    assert (entry["regs"]["fctrl"], entry["regs"]["mxcsr"]) == (0x37F, 0x1F80)
    assert set(bytes.fromhex(entry["bss"])) <= {0}


def test_no_memory_is_one_line_and_exit_1(gemma):
    """An address-space limit that lets the kernel load the stub but not the stub map the
    image: "gemma: out of memory", status 1, nothing on stdout, no signal."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (900 << 10, 900 << 10))
    proc = subprocess.run([str(gemma.binary), "-h"], capture_output=True, timeout=10,
                          preexec_fn=limit)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, b"", b"gemma: out of memory\n")
