"""SysV arguments and results shared by the Unicorn and native runners.

Contract:
- A routine is called as `runner.call(name, *args)`; each arg is one of
  * `Out(array, name)`: a buffer the routine may read and write (its initial contents are the
    array's); it comes back in `CallResult.outputs`, in argument order; passing the same
    `Out` object twice passes the same address (aliased arguments, e.g. xout == x);
  * `In(array, name)` or a bare numpy array: a read-only buffer;
  * a Python/numpy int: a 32-bit scalar (the contract's esi/edx/ecx/r8d/r9d). The upper half
    of the 64-bit register is set to junk, as the ABI allows; `I64(v)` passes all 64 bits;
  * a float / np.float32: a float32 in the low lane of the next xmm register (other lanes are
    junk NaNs); `np.float64` / `F64(v)` passes a double.
  Pointers and ints take rdi rsi rdx rcx r8 r9 in order, then two more 8-byte stack slots,
  [rsp+8] and [rsp+16] at entry; floats xmm0..xmm7.
- `place(nbytes, align)` lays out one buffer: it starts `align`-aligned and ends less than
  `align` bytes before the end of its last page, so the guard page that follows is as close as
  alignment allows. Both runners use it, so a buffer has the same page offset in both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .image import PAGE

INT_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
N_STACK_ARGS = 2                             # integer-class arguments 7 and 8, on the stack
N_XMM_ARGS = 8
JUNK_HIGH = 0xDEADBEEF << 32                 # upper half of a register holding a 32-bit scalar
JUNK_LANE = 0x7FC0BAD1                       # a quiet NaN: lanes nobody should use
JUNK_XMM = int.from_bytes(JUNK_LANE.to_bytes(4, "little") * 4, "little")
DEFAULT_ALIGN = 64


@dataclass
class Buffer:
    array: np.ndarray
    writable: bool
    name: str

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def label(self) -> str:
        return f"{'output' if self.writable else 'input'} buffer {self.name}"


def Out(array: np.ndarray, name: str | None = None) -> Buffer:
    return Buffer(np.ascontiguousarray(array), True, name or "")


def In(array: np.ndarray, name: str | None = None) -> Buffer:
    return Buffer(np.ascontiguousarray(array), False, name or "")


@dataclass(frozen=True)
class I64:
    value: int


@dataclass(frozen=True)
class F64:
    value: float


@dataclass
class CallPlan:
    """Integer-class slots (ints or Buffers, in register order) and xmm register values."""
    ints: list
    xmms: list[int]
    buffers: list[Buffer]

    def int_value(self, slot, address_of) -> int:
        if isinstance(slot, Buffer):
            return address_of[id(slot)]
        return slot


def _xmm(raw: bytes) -> int:
    return int.from_bytes(raw + JUNK_XMM.to_bytes(16, "little")[len(raw):], "little")


def plan(args: tuple) -> CallPlan:
    ints, xmms, buffers = [], [], []
    seen: dict[int, Buffer] = {}
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            a = In(a)
        if isinstance(a, Buffer):
            b = seen.get(id(a))
            if b is None:                           # the same Out twice: aliased arguments
                b = seen[id(a)] = a if a.name else Buffer(a.array, a.writable, f"arg{i}")
                buffers.append(b)
            ints.append(b)
        elif isinstance(a, I64):
            ints.append(a.value & (2**64 - 1))
        elif isinstance(a, (bool, np.bool_)):
            raise TypeError(f"arg{i}: pass a bool as an int")
        elif isinstance(a, (int, np.integer)):
            ints.append(JUNK_HIGH | (int(a) & 0xFFFFFFFF))
        elif isinstance(a, (F64, np.float64)):
            xmms.append(_xmm(np.float64(getattr(a, "value", a)).tobytes()))
        elif isinstance(a, (float, np.float32)):
            xmms.append(_xmm(np.float32(a).tobytes()))
        else:
            raise TypeError(f"arg{i}: cannot pass {type(a).__name__}")
    if len(ints) > len(INT_REGS) + N_STACK_ARGS or len(xmms) > N_XMM_ARGS:
        raise ValueError("more arguments than the runners pass")
    return CallPlan(ints, xmms, buffers)


def place(nbytes: int, align: int = DEFAULT_ALIGN) -> tuple[int, int]:
    """(pages, offset): the buffer occupies [offset, offset+nbytes) of `pages` pages."""
    span = -(-nbytes // align) * align
    pages = max(1, -(-span // PAGE))
    return pages, pages * PAGE - span


@dataclass
class CallResult:
    outputs: list[np.ndarray]     # final contents of the Out buffers, in argument order
    rax: int
    xmm0: bytes                    # 16 bytes
    instructions: int | None       # executed instructions (Unicorn only)

    @property
    def f32(self) -> float:
        return float(np.frombuffer(self.xmm0[:4], np.float32)[0])

    @property
    def out(self) -> np.ndarray:
        return self.outputs[0]
