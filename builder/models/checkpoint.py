"""What the converters share: where a tensor lies in a checkpoint file, how its rows are read,
how config values are checked, and what each Gemma generation means for the model file.

`read_rows(t, rows)` yields the first `rows` rows of a tensor as float32 chunks of whole rows,
read with plain file reads (seek + np.fromfile; no whole-file map) CHUNK_ELEMS values at a
time. Plain types (F32, F16, BF16: bfloat16 -> float32 is a bit shift) convert exactly; GGUF
quantized types (QUANTIZED) are dequantized by `gguf.quants.dequantize`, whose float32 is then
rounded to FP16 (or quantized to Q8_0) by modelfile.write_model; a Q8_0 tensor going into a
Q8_0 model file is copied block for block instead. Memory bound: a chunk holds max(CHUNK_ELEMS, one
row) values, 16 MB as float32; reading allocates at most 6 such chunks at a time (raw bytes,
gguf's dequantization temporaries, the chunk the caller still holds), whatever the tensor's
size: ~100 MB for the 5.6 GB (float32) embedding of Gemma 3 27B as for a norm. Measured peaks
of traced allocations: 2.5-3.5 chunks with the default CHUNK_ELEMS, 2.5-4.7 with 64K-value
chunks, over every type; emu_tests/models/test_convert.py holds reading to 6 with tracemalloc.

Generations (`FLAGS`, `SLIDING_PERIOD`): Gemma 1 has neither post norms nor q/k norms and no
sliding window; Gemma 2 adds the post-attention and post-feed-forward norms (its "ffn_norm" is
then the pre-feed-forward norm) and, by default, slides on even layers; Gemma 3 adds per-head
q/k norms and, by default, has one full-attention layer in 6 (layer i full when (i+1) % 6 == 0).

Every error is a ConvertError (or modelfile.ModelFormatError) whose str() is one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from builder.models.modelfile3 import Model, Rope, from_v2
from builder.models.modelfile import (DIM_LIMITS, POST_NORMS, QK_NORM, Dims, LayerAttn, ModelFormatError, TensorSpec,
                               Vocab, tensor_shapes)

CHUNK_ELEMS = 1 << 22  # rows are read and converted ~4M values at a time
PLAIN = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}
QUANTIZED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

FLAGS = {"gemma": 0, "gemma2": POST_NORMS, "gemma3": POST_NORMS | QK_NORM}
SLIDING_PERIOD = {"gemma2": 2, "gemma3": 6}  # the default: layer i slides when i % p < p - 1


class ConvertError(Exception):
    """A checkpoint cannot be converted; str() is one line."""


@dataclass(frozen=True)
class SourceTensor:
    """Where one tensor lies in a checkpoint file."""
    name: str          # its name in the checkpoint (for messages)
    path: object       # Path of the file
    offset: int        # absolute byte offset of its data
    dtype: str         # a key of PLAIN or one of QUANTIZED
    shape: tuple[int, ...]
    add_one: bool = False  # a Hugging Face norm: stored as w, written as 1 + w


@dataclass
class Checkpoint:
    """A model to convert: its shapes, vocabulary and where each engine tensor lies. Gemma 1-3
    say it with dims and attn (model file version 2, or 3 through modelfile3.from_v2); Gemma 4
    only in version 3's terms (v3: the Model and each layer's Rope; dims is then None)."""
    dims: Dims | None
    vocab: Vocab
    tensors: dict[str, SourceTensor]  # engine tensor name -> source
    attn: list[LayerAttn]             # each layer's window and rope (Gemma 1-3)
    v3: tuple[Model, list[Rope]] | None = None

    def version3(self) -> tuple[Model, list[Rope]]:
        return self.v3 if self.v3 is not None else from_v2(self.dims, self.attn)


def row_bytes(dtype: str, cols: int) -> int:
    """Bytes of one row of `cols` values of dtype (a quantized row is whole blocks)."""
    if dtype in PLAIN:
        return cols * PLAIN[dtype].itemsize
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[dtype]]
    return cols // block * block_bytes


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Rows of raw bytes (uint8 [n, row_bytes]) of dtype -> float32 [n, cols]."""
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype in PLAIN:
        return raw.view(PLAIN[dtype]).astype(np.float32)
    return dequantize(raw, GGMLQuantizationType[dtype])


def read_rows(t: SourceTensor, rows: int, blocks: bool = False) -> Iterator[np.ndarray]:
    """The first `rows` rows of t as float32 chunks of whole rows (see the module docstring);
    with `blocks` (t is Q8_0), the rows' raw Q8_0 blocks instead (uint8), to be copied as
    they are: a GGUF matrix's rows are the model file's (ne[0] = the row length, blocks
    along it), so no weight is rounded twice."""
    cols = t.shape[-1]
    size = row_bytes(t.dtype, cols)
    step = max(1, CHUNK_ELEMS // cols)
    with open(t.path, "rb") as f:
        f.seek(t.offset)
        for start in range(0, rows, step):
            n = min(step, rows - start)
            raw = np.fromfile(f, np.uint8, n * size)
            if raw.size != n * size:
                raise ConvertError(f"{t.path}: file ends inside tensor {t.name}")
            if blocks:
                yield raw.reshape(n, size)
                continue
            x = decode(raw.reshape(n, size), t.dtype)
            yield (x + np.float32(1)) if t.add_one else x


def source_for(ckpt: Checkpoint):
    """A modelfile.TensorSource reading from ckpt (shapes checked by check_shapes)."""
    def source(spec: TensorSpec) -> Iterator[np.ndarray]:
        t = ckpt.tensors[spec.name]
        return read_rows(t, math.prod(spec.shape[:-1]), blocks=spec.dtype == "q8_0" and t.dtype == "Q8_0")
    return source


def check_shapes(ckpt: Checkpoint, specs: list[TensorSpec], crop_rows: set[str]) -> None:
    for spec in specs:
        t = ckpt.tensors.get(spec.name)
        if t is None:
            raise ConvertError(f"missing tensor for {spec.name}")
        ok = t.shape == spec.shape or (spec.name in crop_rows and len(t.shape) == 2 and
                                       t.shape[1] == spec.shape[1] and t.shape[0] >= spec.shape[0])
        if not ok:
            raise ConvertError(f"tensor {t.name} has shape {list(t.shape)}, expected {list(spec.shape)}")


def check_dims(dims: Dims, where: object) -> Dims:
    """The checkpoint's dims, valid for the engine, with max_ctx capped at the engine's limit
    (DIM_LIMITS: Gemma 3 4B and larger say 131072; such a model runs with up to 65536 positions)."""
    if dims.max_ctx > DIM_LIMITS["max_ctx"]:
        dims = replace(dims, max_ctx=DIM_LIMITS["max_ctx"])
    try:
        dims.check()
    except ModelFormatError as e:
        raise ConvertError(f"{where}: {e}") from None
    return dims


def check_attn(attn: list[LayerAttn], where: object) -> list[LayerAttn]:
    try:
        for i, a in enumerate(attn):
            a.check(f"layer {i}")
    except ModelFormatError as e:
        raise ConvertError(f"{where}: {e}") from None
    return attn


def is_kind(kind: type, v) -> bool:
    """v is a kind (int, float: an int too, str), never a bool."""
    return not isinstance(v, bool) and (isinstance(v, kind) or (kind is float and isinstance(v, int)))


def field(table: dict, key: str, kind: type, where: object, default=None, array: bool = False):
    """table[key] (or default), which must be a kind (int, float, str) or an array of them."""
    value = table.get(key)
    value = default if value is None else value  # configs write null for "not set"
    if value is None:
        raise ConvertError(f"{where}: no {key}")
    ok = (isinstance(value, list) and all(is_kind(kind, v) for v in value)) if array else is_kind(kind, value)
    if not ok:
        what = {int: "an integer", float: "a number", str: "a string"}[kind]
        raise ConvertError(f"{where}: {key} is not {'an array of ' + what.split()[1] + 's' if array else what}")
    return value


def sliding_by_period(period: object, layers: int, where: object, key: str) -> list[bool]:
    """Which layers slide under a period p (transformers' and llama.cpp's rule: all but every
    p-th layer, i.e. layer i slides when i % p < p - 1)."""
    if not (is_kind(int, period) and 1 <= period <= 1 << 20):
        raise ConvertError(f"{where}: {key} {period!r} is not a positive integer")
    return [i % period < period - 1 for i in range(layers)]


def tensor_name(engine_name: str, names: dict[str, str]) -> str:
    """A source format's name for an engine tensor (`embed`, `final_norm`, `layers.N.what`),
    from that format's table: whole names for embed and final_norm, a pattern for the rest."""
    if engine_name in names:
        return names[engine_name]
    _, layer, what = engine_name.split(".")
    return names["layer"].format(layer=layer, what=names[what])


def stored_tensors(dims: Dims) -> list[str]:
    """The engine tensors a checkpoint must hold (all but each layer's window and rope)."""
    return [n for n, _, _ in tensor_shapes(dims) if not n.endswith((".window", ".rope"))]
