"""Test harness for the engine's machine code: load the shipped image, call its routines in
Unicorn (every access and ABI rule checked; VEX/EVEX code through an instruction model) or
natively, and run the whole program with emulated syscalls. Each module's docstring states its
contract:

  image.py        Image (segments + symbols) from an ELF and its map, or assembled by keystone
  code.py         capstone views: reachable code, VEX/EVEX detection, needed CPU features
  call.py         SysV arguments (Out / In buffers, ints, floats, I64, F64) and CallResult
  unicorn_run.py  Emulator: one checked call in Unicorn (KernelFault / RefusedCode)
  cpus.py         the emulated CPU: BASELINE, AVX2, AVX512 (CPUID and XGETBV answers)
  avx.py          the instruction model: VEX/EVEX (and CPUID, XGETBV) on shadow ymm/zmm/k
  avx_table.py    its semantics, one entry per instruction
  fp.py           float32 arithmetic as the CPU rounds it (FMA rounded once, F16C)
  native.py       NativeRunner: the same call natively, in a forked child, with guard pages
  program.py      run_program: the whole binary with argv, in-memory files, captured output
  header.py       a routine's in/out/clobbers header, read from its asm source

Typical use (the `gemma` fixture is the freshly built ./gemma and its symbol map):

    image = load_elf(gemma.elf, gemma.symbols)
    got = Emulator(image).call("rmsnorm", Out(np.zeros(n, np.float32)), x, w, n, 1e-6)
    got.out, got.instructions
    Emulator(image, cpu=AVX2).call("matmul_f16_avx2", ...)     # AVX2 code, in the model
    run_program(image, ["gemma", "-m", "m.bin", "--tokens"], files={"m.bin": data}).stdout
"""
from .call import F64, I64, CallResult, In, Out
from .cpus import AVX2, AVX512, BASELINE, Cpu
from .image import Image, Segment, Symbol, assemble, load_elf, with_routines
from .native import NativeRunner
from .program import ProgramFault, ProgramResult, run_program
from .unicorn_run import Emulator, KernelFault, RefusedCode

__all__ = ["F64", "I64", "CallResult", "In", "Out", "AVX2", "AVX512", "BASELINE", "Cpu",
           "Image", "Segment", "Symbol", "assemble", "load_elf", "with_routines",
           "NativeRunner", "ProgramFault", "ProgramResult", "run_program", "Emulator",
           "KernelFault", "RefusedCode"]
