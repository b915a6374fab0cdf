"""The metadata of a GGUF file (key/values and tensor infos), read with struct.

Why not gguf.GGUFReader: it builds two numpy memmap views per string of every array, which for
Gemma's 256,000-token vocabulary costs ~670 MB of memory and ~15 s before any weight is read
(measured); this reader keeps plain Python values (~60 MB, under a second). It uses the gguf
package's constants (value types, GGML tensor types and sizes), and emu_tests/models/test_convert.py
checks it against gguf.GGUFReader.

read_gguf_meta(path) -> GGUFMeta with `kv` (key -> int | float | bool | str | list) and
`tensors` (name -> GGUFTensor: type name, numpy-order shape, absolute data offset, nbytes).
Malformed input raises GGUFError with a one-line message.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from linker.layout import align_up

SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
           GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
           GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
           GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
MAX_COUNT = 1 << 28  # any count beyond this is a corrupt file, not a model


class GGUFError(Exception):
    """A file is not a readable GGUF; str() is one line."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: str               # GGMLQuantizationType name: "F16", "BF16", "Q8_0", ...
    shape: tuple[int, ...]  # numpy order (rows first): GGUF's dims reversed
    offset: int             # absolute offset of the data in the file
    nbytes: int


@dataclass
class GGUFMeta:
    kv: dict[str, Any]
    tensors: dict[str, GGUFTensor]


class _Reader:
    def __init__(self, f: BinaryIO):
        self.f = f

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise GGUFError("file is truncated")
        return data

    def scalar(self, code: str):
        return struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]

    def count(self) -> int:
        n = self.scalar("Q")
        if n > MAX_COUNT:
            raise GGUFError(f"implausible count {n}")
        return n

    def string(self) -> str:
        try:
            return self.take(self.count()).decode()
        except UnicodeDecodeError:
            raise GGUFError("a string is not UTF-8") from None

    def value(self, vtype: int):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            sub, n = self.scalar("I"), self.count()
            if sub == GGUFValueType.STRING:
                return [self.string() for _ in range(n)]
            if sub == GGUFValueType.ARRAY or sub not in SCALARS:
                raise GGUFError(f"unsupported array element type {sub}")
            code = SCALARS[GGUFValueType(sub)]
            return np.frombuffer(self.take(n * struct.calcsize(code)), "<" + code).tolist()
        if vtype not in SCALARS:
            raise GGUFError(f"unknown value type {vtype}")
        return self.scalar(SCALARS[GGUFValueType(vtype)])


def read_gguf_meta(path: Path) -> GGUFMeta:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = _Reader(f)
        if r.take(4) != struct.pack("<I", GGUF_MAGIC):
            raise GGUFError("bad magic: not a GGUF file")
        version = r.scalar("I")
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = r.count(), r.count()
        kv = {}
        for _ in range(n_kv):
            key = r.string()
            kv[key] = r.value(r.scalar("I"))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = r.string(), r.scalar("I")
            if n_dims > 4:
                raise GGUFError(f"tensor {name} has {n_dims} dimensions")
            dims = [r.scalar("Q") for _ in range(n_dims)]
            infos.append((name, dims, r.scalar("I"), r.scalar("Q")))
        align = kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(f"invalid general.alignment {align!r}")
        data = align_up(f.tell(), align)
    tensors = {}
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFError(f"tensor {name} has unknown type {type_id}") from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        n = math.prod(dims)
        if not dims or n > 1 << 40 or dims[0] % block:
            raise GGUFError(f"tensor {name} has invalid dimensions {dims}")
        nbytes = n // block * block_bytes
        if data + offset + nbytes > size:
            raise GGUFError(f"tensor {name} extends past the end of the file")
        tensors[name] = GGUFTensor(name, qtype.name, tuple(reversed(dims)), data + offset, nbytes)
    return GGUFMeta(kv, tensors)
