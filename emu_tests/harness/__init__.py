"""Test harness for the engine's machine code: load the shipped image, call its routines in
Unicorn (every access and ABI rule checked) or natively (AVX2), and run the whole program with
emulated syscalls. See each module's docstring for its contract."""
from .call import F64, I64, CallResult, In, Out
from .image import Image, Segment, Symbol, assemble, load_elf
from .unicorn_run import Emulator, KernelFault, RefusedCode

__all__ = ["F64", "I64", "CallResult", "In", "Out", "Image", "Segment", "Symbol", "assemble",
           "load_elf", "Emulator", "KernelFault", "RefusedCode"]
