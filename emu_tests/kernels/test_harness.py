"""The harness's own tests: well-behaved routines pass and give numpy's answers; deliberately
faulty ones are each caught, in Unicorn and natively, with a message that names the fault.
The routines are assembled with keystone into a small synthetic image (harness.assemble);
keystone encodes EVEX displacements wrongly, so the EVEX routines here use none."""
from __future__ import annotations

import errno

import subprocess
from pathlib import Path

import numpy as np
import pytest

from emu_tests.harness import (I64, Emulator, In, KernelFault, Out, RefusedCode, assemble,
                               load_elf)
from emu_tests.harness import avx, code, native
from emu_tests.harness.cpus import AVX2, AVX512
from emu_tests.harness.native import NativeRunner
from emu_tests.harness.program import MMAP_BASE, ProgramFault, run_program

ROOT = Path(__file__).resolve().parents[2]

ADD_LOOP = """
        xor eax, eax
    top:
        cmp {cmp}, {n}
        {jexit} done
        movss xmm1, dword ptr [rsi + rax*4]
        addss xmm1, xmm0
        movss dword ptr [rdi + rax*4], xmm1
        inc {i}
        jmp top
    done:
        ret"""

ROUTINES = {
    # add_scalar(xout, x, n, s): xout[i] = x[i] + s; keeps its counter in rbx, saved and restored
    "add_scalar": """
        push rbx
        xor ebx, ebx
    top:
        cmp ebx, edx
        jae done
        movss xmm1, dword ptr [rsi + rbx*4]
        addss xmm1, xmm0
        movss dword ptr [rdi + rbx*4], xmm1
        inc ebx
        jmp top
    done:
        pop rbx
        ret""",
    "reads_past_input": ADD_LOOP.replace("{cmp}", "eax").replace("{n}", "edx")
                                .replace("{jexit}", "ja").replace("{i}", "eax"),
    "uses_rdx_not_edx": ADD_LOOP.replace("{cmp}", "rax").replace("{n}", "rdx")
                                .replace("{jexit}", "jae").replace("{i}", "rax"),
    # add_scalar_avx2(xout, x, n, s), n a multiple of 8
    "add_scalar_avx2": """
        vbroadcastss ymm0, xmm0
        xor eax, eax
    top:
        cmp eax, edx
        jae done
        vaddps ymm1, ymm0, ymmword ptr [rsi + rax*4]
        vmovups ymmword ptr [rdi + rax*4], ymm1
        add eax, 8
        jmp top
    done:
        vzeroupper
        ret""",
    "uses_own_image": """
        movss xmm0, dword ptr [{three_halves}]
        inc dword ptr [{counter}]
        ret""",
    "calls_aligned": """
        sub rsp, 8
        call {seven}
        add rsp, 8
        ret""",
    "seven": "mov eax, 7\nret",
    "misaligned_call": "call {seven}\nret",
    "clobbers_rbx": "mov ebx, 1\nret",
    "leaves_df_set": "std\nret",
    "has_vex": "vsqrtps xmm0, xmm1\nret",
    "vex_in_callee": "sub rsp, 8\ncall {has_vex}\nadd rsp, 8\nret",
    "vex_by_indirect_jump": "mov rax, {has_vex}\njmp rax",
    "vex_after_endless_loop": "xor eax, eax\njz spin\nvsqrtps xmm0, xmm1\nspin: jmp spin",
    "leaves_upper_set": "vbroadcastss ymm1, xmm0\nret",
    "misaligned_movaps": "vmovaps xmm0, xmmword ptr [rsi + 4]\nret",
    "rounds_up": """
        sub rsp, 8
        stmxcsr dword ptr [rsp]
        or dword ptr [rsp], 0x4000
        ldmxcsr dword ptr [rsp]
        vaddps xmm0, xmm0, xmm0
        add rsp, 8
        ret""",
    # masked_copy(xout, x, n): xout[i] = x[i] for i < n <= 16, one masked zmm load and store
    "masked_copy": """
        mov ecx, edx
        mov eax, 1
        shl eax, cl
        dec eax
        kmovw k1, eax
        vmovups zmm0 {{k1}} {{z}}, zmmword ptr [rsi]
        vmovups zmmword ptr [rdi] {{k1}}, zmm0
        vzeroupper
        ret""",
    "unmasked_copy": """
        vmovups zmm0, zmmword ptr [rsi]
        vmovups zmmword ptr [rdi], zmm0
        vzeroupper
        ret""",
    # seventh(a1, ..., a6, a7, a8): the stack arguments, a7 + 2 a8; writes_seventh writes a7
    "seventh": "mov rax, qword ptr [rsp + 16]\nadd rax, rax\nadd rax, qword ptr [rsp + 8]\nret",
    "writes_seventh": "mov qword ptr [rsp + 8], 0\nret",
    "loops_forever": "spin: jmp spin",
    "writes_past_output": "mov eax, edx\nmov dword ptr [rdi + rax*4], 0\nret",
    "writes_input": "mov dword ptr [rsi], 0\nret",
    "writes_code": "mov dword ptr [{seven}], 0\nret",
    "reads_caller_frame": "mov rax, qword ptr [rsp + 8]\nret",
    "uses_red_zone": "mov dword ptr [rsp - 128], 7\nmov eax, dword ptr [rsp - 128]\nret",
    "writes_below_red_zone": "mov dword ptr [rsp - 132], 7\nret",
    "wild_pointer": "mov eax, dword ptr [0x1234]\nret",
    "jumps_to_buffer": "jmp rdi",
    "unbalanced_stack": "mov rax, qword ptr [rsp]\nadd rsp, 16\njmp rax",
    "leaves_x87_value": "fld1\nret",
    "changes_mxcsr": """
        sub rsp, 8
        stmxcsr dword ptr [rsp]
        or dword ptr [rsp], 0x6000
        ldmxcsr dword ptr [rsp]
        add rsp, 8
        ret""",
    "uses_sse42": "popcnt eax, edi\nret",
}


@pytest.fixture(scope="module")
def image():
    return assemble(ROUTINES, data={"three_halves": np.float32(1.5).tobytes()},
                    bss={"counter": 4})


@pytest.fixture(scope="module")
def emu(image):
    return Emulator(image, budget=20_000)


@pytest.fixture(scope="module")
def emu512(image):
    return Emulator(image, budget=20_000, cpu=AVX512)


@pytest.fixture(scope="module")
def cpu(image):
    return NativeRunner(image)


def add_args(n: int = 7):
    x = np.arange(n, dtype=np.float32) * np.float32(0.25)
    return x, (Out(np.full(n, np.nan, np.float32), "xout"), In(x, "x"), n, 0.5)


# --- well-behaved routines ----------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_add_scalar_matches_numpy_and_counts_instructions(emu, cpu, n):
    x, args = add_args(n)
    got = emu.call("add_scalar", *args)
    # exact: one float32 addition per element on both sides
    np.testing.assert_array_equal(got.out, x + np.float32(0.5))
    assert got.instructions == 6 + 7 * n        # push, xor, n x 7-instruction loop, exit 4
    assert np.array_equal(cpu.call("add_scalar", *args).out, got.out)


def test_routine_may_use_its_own_data_and_bss(emu):
    assert emu.call("uses_own_image").f32 == 1.5


def test_aligned_call_passes_and_returns_rax(emu):
    assert emu.call("calls_aligned").rax & 0xFFFFFFFF == 7


def test_red_zone_may_be_used(emu):
    assert emu.call("uses_red_zone").rax & 0xFFFFFFFF == 7


def test_avx2_routine_runs_natively(cpu):
    x, args = add_args(16)
    # exact: one float32 addition per element
    np.testing.assert_array_equal(cpu.call("add_scalar_avx2", *args).out, x + np.float32(0.5))


@pytest.mark.parametrize("n", [0, 8, 24])
def test_avx2_routine_runs_in_the_model(image, n):
    x, args = add_args(n)
    got = Emulator(image, cpu=AVX2).call("add_scalar_avx2", *args)
    # exact: one float32 addition per element
    np.testing.assert_array_equal(got.out, x + np.float32(0.5))
    assert got.instructions == 6 + 6 * n // 8   # broadcast, xor, loop of 6 per 8, exit 4


def test_native_runner_skips_naming_the_missing_feature(cpu, monkeypatch):
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset({"sse4_1"}))
    with pytest.raises(pytest.skip.Exception, match="lacks avx, avx2"):
        cpu.call("add_scalar_avx2", *add_args(8)[1])


def test_cpu_features_of_reachable_code(image):
    def features(name):
        return avx.features(code.reachable(image, image.symbol(name).address))
    assert features("add_scalar_avx2") == {"avx", "avx2"}
    assert features("masked_copy") == {"avx", "avx512f"}            # vzeroupper: avx
    assert features("add_scalar") == set()


@pytest.mark.parametrize("n", [0, 1, 7, 16])
def test_masked_access_touches_only_active_elements(emu512, n):
    """x has n elements: the 64-byte loads and stores of masked_copy reach past it (into the
    guard page when n < 16), but only the n active elements count."""
    x = np.arange(n, dtype=np.float32) + np.float32(0.5)
    got = emu512.call("masked_copy", Out(np.full(n, np.nan, np.float32), "xout"), In(x, "x"), n)
    np.testing.assert_array_equal(got.out, x)


def test_unmasked_zmm_access_past_a_buffer_is_caught(emu512):
    x = np.ones(15, np.float32)
    with pytest.raises(KernelFault, match=r"unmasked_copy: read of 64 bytes at 0x[0-9a-f]+ "
                       r"outside .* runs 4 bytes past the end of input buffer x .* vmovups zmm0"):
        emu512.call("unmasked_copy", Out(np.zeros(16, np.float32), "xout"), In(x, "x"))


def test_stack_arguments_are_read_only(emu):
    assert emu.call("seventh", 0, 0, 0, 0, 0, 0, I64(5), I64(100)).rax == 205
    with pytest.raises(KernelFault, match=r"write of 8 bytes .* inside the stack arguments .* "
                       r"read-only"):
        emu.call("writes_seventh", 0, 0, 0, 0, 0, 0, I64(5), I64(100))


# --- faulty routines, in Unicorn -------------------------------------------------------------

FAULTS = [
    ("reads_past_input", r"reads_past_input: read of 4 bytes at 0x[0-9a-f]+ outside its "
     r"buffers.*0 bytes after the end \(element 7\) of input buffer x \(7 x float32\).*"
     r"movss xmm1, dword ptr \[rsi \+ rax\*4\]"),
    ("uses_rdx_not_edx", r"read of 4 bytes .* after the end \(element 7\) of input buffer x"),
    ("writes_past_output", r"write of 4 bytes .* after the end \(element 7\) of output buffer "
     r"xout"),
    ("writes_input", r"write of 4 bytes .* inside \(element 0\) input buffer x .* read-only"),
    ("writes_code", r"write of 4 bytes .* read-only segment"),
    ("reads_caller_frame", r"read of 8 bytes .* after the end of the stack frame"),
    ("writes_below_red_zone", r"write of 4 bytes at 0x[0-9a-f]+, 4 bytes below the red zone"),
    ("wild_pointer", r"read of 4 bytes at 0x1234 outside"),
    ("jumps_to_buffer", r"jumps to 0x[0-9a-f]+, which is not code"),
    ("clobbers_rbx", r"clobbers callee-saved rbx \(0xb0b0b0b1badf00d -> 0x1\)"),
    ("leaves_df_set", r"direction flag set"),
    ("has_vex", r"refusing to emulate the VEX instruction at 0x[0-9a-f]+ \(has_vex\): "
     r"vsqrtps xmm0, xmm1: the model has no semantics for this mnemonic"),
    ("vex_in_callee", r"vex_in_callee: refusing to emulate the VEX instruction at "
     r"0x[0-9a-f]+ \(has_vex\)"),
    ("vex_by_indirect_jump", r"vex_by_indirect_jump: refusing to emulate the VEX instruction "
     r"at 0x[0-9a-f]+ \(has_vex\): vsqrtps"),
    ("add_scalar_avx2", r"add_scalar_avx2: an invalid instruction \(the emulated CPU, baseline "
     r"\(SSE..SSE4.1\), lacks avx2\) at 0x[0-9a-f]+ \(add_scalar_avx2\): vbroadcastss ymm0"),
    ("loops_forever", r"did not return within 20000 instructions .*loops_forever"),
    ("misaligned_call", r"rsp is not 16-byte aligned \(rsp % 16 = 8\) at the call at "
     r"0x[0-9a-f]+ \(misaligned_call\)"),
    ("unbalanced_stack", r"returns with rsp off by 8"),
    ("leaves_x87_value", r"leaves 1 values on the x87 stack"),
    ("changes_mxcsr", r"changes the MXCSR control bits \(0x1f80 -> 0x7f80\)"),
    ("uses_sse42", r"invalid instruction .*popcnt eax, edi"),
]


@pytest.mark.parametrize("name,message", FAULTS, ids=[f[0] for f in FAULTS])
def test_faulty_routine_is_caught_in_unicorn(emu, name, message):
    with pytest.raises(KernelFault, match=message):
        emu.call(name, *add_args()[1])


def test_unmodelled_vex_is_refused_before_running(emu512):
    """Reachable by a branch never taken: refused before the endless loop runs."""
    with pytest.raises(RefusedCode, match=r"vex_after_endless_loop: refusing .* vsqrtps"):
        emu512.call("vex_after_endless_loop")


@pytest.mark.parametrize("name,message", [
    ("leaves_upper_set", r"leaves_upper_set: returns with bits above 127 set in ymm1 \(no "
     r"vzeroupper\)"),
    ("misaligned_movaps", r"#GP: vmovaps xmm0, xmmword ptr \[rsi \+ 4\] needs a 16-byte "
     r"aligned address"),
    ("rounds_up", r"MXCSR is 0x5f80: the model computes with the default 0x1f80 only"),
])
def test_model_faults_are_caught(image, name, message):
    with pytest.raises(KernelFault, match=message):
        Emulator(image, cpu=AVX2).call(name, *add_args()[1])


def test_i64_passes_all_bits(emu):
    x, (out, inp, n, s) = add_args(7)
    got = emu.call("uses_rdx_not_edx", out, inp, I64(7), s)
    # exact: one float32 addition per element
    np.testing.assert_array_equal(got.out, x + np.float32(0.5))


def test_sysv_false_lets_a_routine_clobber_callee_saved(emu, cpu):
    """A routine that keeps no register (the packed program's decoder) is called with
    sysv=False: rbx clobbered is then no fault, in Unicorn and natively; rsp still is."""
    for runner in (emu, cpu):
        runner.call("clobbers_rbx", *add_args()[1], sysv=False)
        with pytest.raises(KernelFault, match="rsp off by 8"):
            runner.call("unbalanced_stack", *add_args()[1], sysv=False)


# --- faulty routines, natively ---------------------------------------------------------------

NATIVE_FAULTS = [
    ("writes_past_output", r"natively writes 4 bytes outside output buffer xout \(28 bytes\), "
     r"the first at byte offset 28"),
    ("writes_input", r"crashed with SIGSEGV"),
    ("wild_pointer", r"crashed with SIGSEGV"),
    ("clobbers_rbx", r"natively clobbers callee-saved rbx \(0xb0b0b0b1badf00d -> 0x1\)"),
    ("leaves_df_set", r"direction flag set"),
    ("leaves_x87_value", r"leaves 1 values on the x87 stack"),
    ("changes_mxcsr", r"changes MXCSR \(0x7f80\)"),
    ("loops_forever", r"natively did not return within 1 s"),
]


@pytest.mark.parametrize("name,message", NATIVE_FAULTS, ids=[f[0] for f in NATIVE_FAULTS])
def test_faulty_routine_is_caught_natively(cpu, monkeypatch, name, message):
    monkeypatch.setattr(native, "TIMEOUT_S", 1)
    with pytest.raises(KernelFault, match=message):
        cpu.call(name, *add_args()[1])


# --- whole programs --------------------------------------------------------------------------

O_WRONLY_CREAT_TRUNC = 0x241

CAT = """
        mov eax, 2
        mov edi, {path}
        xor esi, esi
        syscall
        test eax, eax
        js fail
        mov r12d, eax
        mov eax, 5
        mov edi, r12d
        mov esi, {statbuf}
        syscall
        mov r13, qword ptr [rsi + 48]
        mov eax, 9
        xor edi, edi
        mov rsi, r13
        mov edx, 1
        mov r10d, 2
        mov r8d, r12d
        xor r9d, r9d
        syscall
        mov r14, rax
        mov eax, 1
        mov edi, 1
        mov rsi, r14
        mov rdx, r13
        syscall
        test rax, rax
        js fail
        mov eax, 2
        mov edi, {outpath}
        mov esi, %d
        mov edx, 0x1a4
        syscall
        mov r15d, eax
        mov eax, 1
        mov edi, r15d
        mov rsi, r14
        mov edx, 4
        syscall
        mov eax, 3
        mov edi, r15d
        syscall
        mov eax, 11
        mov rdi, r14
        mov rsi, r13
        syscall
        mov eax, 231
        mov edi, 3
        syscall
    fail:
        mov edi, eax
        neg edi
        mov eax, 231
        syscall""" % O_WRONLY_CREAT_TRUNC

SEEK_WRITE = """
        mov eax, 2
        mov edi, {outpath}
        mov esi, %d
        mov edx, 0x1a4
        syscall
        mov r12d, eax
        mov eax, 8
        mov edi, r12d
        mov esi, 4
        xor edx, edx
        syscall
        mov eax, 1
        mov edi, r12d
        mov esi, {path}
        mov edx, 5
        syscall
        mov eax, 231
        xor edi, edi
        syscall""" % O_WRONLY_CREAT_TRUNC

PROGRAMS = {
    "cat": CAT,
    "seek_write": SEEK_WRITE,
    "bad_syscall": "mov eax, 39\nsyscall",
    "segfault": "mov eax, dword ptr [0x1000]\nud2",
    "vex": "vxorps xmm0, xmm0, xmm0\nud2",
    "spin": "spin: jmp spin",
}


def program(name: str):
    return assemble({name: PROGRAMS[name]},
                    data={"path": b"model.bin\0", "outpath": b"out.bin\0"}, bss={"statbuf": 144})


def test_program_syscalls_open_fstat_mmap_write_close_munmap():
    model = bytes(range(256)) * 20
    r = run_program(program("cat"), ["cat"], files={"model.bin": model})
    assert (r.status, r.stdout, r.stderr) == (3, model, b"")
    assert r.files == {"out.bin": model[:4]}
    assert r.syscalls == ["open", "fstat", "mmap", "write", "open", "write", "close", "munmap",
                          "exit_group"]


def test_program_write_after_seek_past_the_end_fills_zeros():
    r = run_program(program("seek_write"), ["seek_write"])
    assert (r.status, r.files) == (0, {"out.bin": b"\0\0\0\0model"})
    assert r.syscalls == ["open", "lseek", "write", "exit_group"]


def test_program_missing_file_and_failed_write_return_errno():
    assert run_program(program("cat"), ["cat"]).status == 2                      # ENOENT
    r = run_program(program("cat"), ["cat"], files={"model.bin": b"abc"}, fail_writes={1: 28})
    assert (r.status, r.stdout) == (28, b"")                                     # ENOSPC


@pytest.mark.parametrize("name,message", [
    ("bad_syscall", r"unexpected syscall 39 at 0x[0-9a-f]+ \(bad_syscall\+0x5\)"),
    ("segfault", r"SIGSEGV/SIGBUS: read of 4 bytes at 0x1000"),
    ("vex", r"refusing to emulate the VEX instruction .*vxorps"),
    ("spin", r"did not exit within 0.2 s"),
])
def test_program_faults_are_loud(name, message):
    with pytest.raises(ProgramFault, match=message):
        run_program(program(name), [name], timeout=0.2)


def test_fasm_binary_loads_by_program_headers_and_prints_usage(tmp_path):
    out = tmp_path / "gemma"
    subprocess.run(["fasm", str(ROOT / "asm" / "gemma.asm"), str(out)], check=True,
                   capture_output=True)
    image = load_elf(out)
    assert image.segments and image.segments[0].executable
    check_usage(run_program(image, ["gemma"]))


def test_built_binary_prints_usage(gemma):
    check_usage(run_program(load_elf(gemma.elf, gemma.symbols), ["gemma"]))


def test_image_reads_no_register_before_writing_it(gemma):
    """The packed program's stub enters the image with the decoder's leftovers in every
    register but rsp; run_program starts it with junk there. SIGPIPE is still blocked (its
    rt_sigprocmask takes edi, rdx and rcx): a write to a closed stdout ends the run quietly
    instead of killing it."""
    r = run_program(load_elf(gemma.elf, gemma.symbols), ["gemma", "-h"],
                    fail_writes={1: errno.EPIPE})
    assert (r.status, r.stdout, r.stderr) == (0, b"", b""), r
    assert "rt_sigprocmask" in r.syscalls


def check_usage(r) -> None:
    assert r.status == 2, r
    assert r.stdout == b""
    assert r.stderr.startswith(b"usage: gemma -m MODEL"), r.stderr


def test_engine_in_emulation_matches_native_run(gemma, tmp_path_factory, tmp_path):
    """The real binary on a converted fixture model: the emulated process (syscalls served
    from memory) prints the same bytes and writes the same logits as the native process."""
    from emu_tests.modelfiles import convert_fixture

    model = convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp())
    image = load_elf(gemma.elf, gemma.symbols)
    for flags in (["--tokens"], ["-n", "6", "--temp", "0", "--logits"]):
        logits = [str(tmp_path / "native.f32")] if flags[-1] == "--logits" else []
        # natively --baseline: the emulated CPU reports no AVX, so it runs the baseline too
        native_run = subprocess.run([str(gemma.binary), "-m", str(model), "-p", "Hello world",
                                     "--baseline", *flags, *logits], capture_output=True,
                                    timeout=60)
        emulated = run_program(image, ["gemma", "-m", "model.bin", "-p", "Hello world", *flags,
                                       *(["logits.f32"] if logits else [])],
                               files={"model.bin": model.read_bytes()})
        assert (emulated.status, emulated.stdout, emulated.stderr) == \
            (native_run.returncode, native_run.stdout, native_run.stderr), flags
        if logits:
            # bit-identical: the same baseline instructions on the same inputs
            assert emulated.files["logits.f32"] == (tmp_path / "native.f32").read_bytes()


def test_engine_asks_for_huge_pages_on_the_model(gemma, tmp_path_factory):
    """The model is mapped, then advised MADV_HUGEPAGE (asm/model.asm: 2 MB pages where the
    kernel allows), whole and before anything reads it; nothing else is advised."""
    from emu_tests.modelfiles import convert_fixture

    data = convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp()).read_bytes()
    r = run_program(load_elf(gemma.elf, gemma.symbols), ["gemma", "-m", "model.bin", "-p",
                                                            "Hi", "--tokens"],
                    files={"model.bin": data})
    assert r.status == 0, r.stderr
    first = r.syscalls.index("open")
    assert r.syscalls[first:first + 4] == ["open", "fstat", "mmap", "madvise"], r.syscalls
    assert r.advice == [(MMAP_BASE, len(data), 14)]         # the first mapping: the model

