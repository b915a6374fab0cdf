"""Model file version 2, defined once: header, tokenizer tables, weights (the engine's format
until it read version 4, builder/models/modelfile4.py, alone; kept for the Python side: the numpy
reference reads it, and convert/synth write it with --format 2).

Layout (little-endian; docs/format.md describes it field by field):
header (256 bytes, HEADER_FIELDS) | pieces: vocab x PIECE (blob_off, len, score, type) |
index: u32 ids of the NORMAL pieces sorted by their bytes | user: u32 ids of the pieces a
prompt matches whole (USER_DEFINED, and non-empty CONTROL ones such as <start_of_turn>, as
transformers and llama.cpp tokenize prompts), longest first | blob: piece bytes | zero padding to a multiple of 4096 |
weights: the tensors of `tensor_layout` in the order the forward pass reads them, each at an
offset (relative to weights_off) that is a multiple of 64, matrices in FP16 (or Q8_0, below)
and FP32 norms holding 1 + w. Each layer starts with its attention's own parameters, as two small tensors:
`window` (u32: 0 = full causal attention, w = only the last w positions, itself included) and
`rope` (f32, head_dim/2: RoPE's inverse frequencies for that layer, scaling included), so
per-layer sliding windows and rope thetas (Gemma 2 and 3) need no code keyed on a model.
Header `flags` say which optional norms every layer has (POST_NORMS: Gemma 2/3's norms of
the attention and feed-forward outputs; QK_NORM: Gemma 3's per-head q/k norms) and the
matrices' type: with Q8_0 every matrix whose rows hold a multiple of 32 weights is in GGUF's
Q8_0 blocks (32 weights: an FP16 scale d, then 32 int8 q, weight = d q; 34 bytes), the others
(and every matrix without the flag) FP16.

Version 3 (one format for Gemma 1-4: per-layer records) is builder/models/modelfile3.py; it
shares this module's tokenizer tables (build_tables, read_tables), Vocab (whose merges only
version 3 holds) and tensor writer (write_tensors).

`write_model` streams: it asks a source for each tensor's rows chunk by chunk, converts them
(float -> FP16 with an overflow count, float -> Q8_0 as llama.cpp's reference quantizer,
or FP32) and writes them, so a 5 GB model never sits in
memory. `ModelFile` reads and validates a file (magic, version, every size and offset) and
raises `ModelFormatError` with a one-line message; tensors come back as memory-mapped views.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields, make_dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import gguf
import numpy as np
from tqdm import tqdm

from linker.layout import align_up

MAGIC = b"GEMMAASM"
VERSION = 2
HEADER_SIZE = 256
PIECE_REC = 16
TENSOR_ALIGN = 64
WEIGHTS_ALIGN = 4096
FLT_MAX = float(np.finfo(np.float32).max)
# The largest value of each dimension: what the engine's load_model accepts (asm/model.asm,
# dim_bits: every size the engine forms stays far below 2^64; the bound on layers also keeps a
# hostile header from making readers build huge layouts). A file the engine would refuse is
# never written; emu_tests/models/test_format_mirror.py checks that the two agree.
DIM_LIMITS = {"vocab": (1 << 24) - 1, "dim": 1 << 16, "ffn": 1 << 16, "layers": 1 << 10,
              "heads": 1 << 10, "kv_heads": 1 << 10, "head_dim": 1 << 16, "max_ctx": 1 << 16}

# header flags: which optional norms every layer has
POST_NORMS = 1   # post_attn_norm and post_ffn_norm (Gemma 2, 3); ffn_norm is then the pre-norm
QK_NORM = 2      # q_norm and k_norm over head_dim, on every head before RoPE (Gemma 3)
Q8_0 = 4         # matrices with rows of a multiple of QK8_0 weights are in Q8_0 blocks
FLAGS = POST_NORMS | QK_NORM | Q8_0
QK8_0 = 32       # weights per Q8_0 block
Q8_0_BLOCK = 34  # its bytes: FP16 scale, 32 int8
WEIGHT_TYPES = ("f16", "q8_0")  # --type of convert and synth: the matrices' type

# sentencepiece piece types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

HEADER_FIELDS: list[tuple[str, int, str]] = [
    ("magic", 0, "8s"),
    ("version", 8, "I"),
    ("header_size", 12, "I"),
    ("vocab", 16, "I"),
    ("dim", 20, "I"),
    ("ffn", 24, "I"),
    ("layers", 28, "I"),
    ("heads", 32, "I"),
    ("kv_heads", 36, "I"),
    ("head_dim", 40, "I"),
    ("max_ctx", 44, "I"),
    ("eps", 48, "f"),
    ("att_scale", 52, "f"),
    ("embed_scale", 56, "f"),
    ("bos", 60, "I"),
    ("eos", 64, "I"),
    ("eot", 68, "I"),
    ("byte_base", 72, "I"),
    ("n_index", 76, "I"),
    ("n_user", 80, "I"),
    ("max_piece_len", 84, "I"),
    ("pieces_off", 88, "Q"),
    ("index_off", 96, "Q"),
    ("user_off", 104, "Q"),
    ("blob_off", 112, "Q"),
    ("blob_size", 120, "Q"),
    ("weights_off", 128, "Q"),
    ("weights_size", 136, "Q"),
    ("file_size", 144, "Q"),
    ("flags", 152, "I"),
    ("att_softcap", 156, "f"),
    ("final_softcap", 160, "f"),
]
PIECE = struct.Struct("<IIfI")  # blob_off, len, score, type
assert PIECE.size == PIECE_REC
assert all(struct.calcsize("<" + "".join(c for _, _, c in HEADER_FIELDS[:i])) == off
           for i, (_, off, _) in enumerate(HEADER_FIELDS))


class ModelFormatError(Exception):
    """A model file (or the data meant for one) is invalid; str() is one line."""


@dataclass(frozen=True)
class Dims:
    """The shapes and scalars of a Gemma model: everything the header holds about it.

    att_scale multiplies q.k (0 given: float32(head_dim ** -0.5), Gemma 1's; Gemma 2 and 3 use
    query_pre_attn_scalar ** -0.5); a soft-cap c (0: none) maps s to c tanh(s / c), on the
    attention scores after scaling (att_softcap) and on the logits (final_softcap)."""
    vocab: int
    dim: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    max_ctx: int
    eps: float = 1e-6
    flags: int = 0
    att_scale: float = 0.0
    att_softcap: float = 0.0
    final_softcap: float = 0.0

    def __post_init__(self) -> None:
        if self.att_scale == 0 and isinstance(self.head_dim, int) and self.head_dim > 0:
            object.__setattr__(self, "att_scale", float(np.float32(self.head_dim ** -0.5)))

    def check(self) -> None:
        for f, limit in DIM_LIMITS.items():
            v = getattr(self, f)
            if not 0 < v <= limit:
                raise ModelFormatError(f"{f} = {v} is out of range (1 .. {limit}, what the engine runs)")
        if self.heads % self.kv_heads:
            raise ModelFormatError(f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ModelFormatError(f"head_dim ({self.head_dim}) is odd")
        if self.ffn % 4:
            raise ModelFormatError(f"ffn ({self.ffn}) is not a multiple of 4")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelFormatError(f"eps ({self.eps}) must be positive and finite")
        if not (0 < self.att_scale <= FLT_MAX):
            raise ModelFormatError(f"att_scale ({self.att_scale}) must be positive and finite")
        for f in ("att_softcap", "final_softcap"):
            if not 0 <= getattr(self, f) <= FLT_MAX:
                raise ModelFormatError(f"{f} ({getattr(self, f)}) must be 0 (none) or positive and finite")
        if self.flags & ~FLAGS:
            raise ModelFormatError(f"flags {self.flags:#x} has unknown bits (known: {FLAGS:#x})")


@dataclass(frozen=True)
class LayerAttn:
    """One layer's attention parameters, written as its `window` and `rope` tensors."""
    window: int = 0             # 0: full causal attention; w: the last w positions only
    rope_theta: float = 10000.0
    rope_scale: float = 1.0     # linear RoPE scaling: inverse frequencies divided by it

    def check(self, where: str) -> None:
        if not (isinstance(self.window, int) and 0 <= self.window < 2**32):
            raise ModelFormatError(f"{where}: sliding window {self.window} is out of range")
        for f in ("rope_theta", "rope_scale"):
            if not 0 < getattr(self, f) <= FLT_MAX:
                raise ModelFormatError(f"{where}: {f} ({getattr(self, f)}) must be positive and finite")


def rope_freqs(head_dim: int, attn: LayerAttn) -> np.ndarray:
    """RoPE's inverse frequencies (head_dim/2,) float32, as transformers computes them in
    float32: e = float32(2i / hd), f = float32(1 / float32(theta ** e)), then f / scale."""
    e = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    power = (np.float64(np.float32(attn.rope_theta)) ** e.astype(np.float64)).astype(np.float32)
    return (np.float32(1) / power) / np.float32(attn.rope_scale)


EOT_PIECES = (b"<end_of_turn>", b"<turn|>")  # Gemma 1-3's end of a chat turn, Gemma 4's


@dataclass
class Vocab:
    """A vocabulary: piece bytes (UTF-8, U+2581 kept), score, type per id; `merges` (Gemma 4's
    BPE by merge rank: (left id, right id) pairs, rank order) is empty for a SentencePiece one,
    which merges by piece score."""
    pieces: list[bytes]
    scores: list[float]
    types: list[int]
    bos: int
    eos: int
    merges: list[tuple[int, int]] = dataclass_field(default_factory=list)

    @property
    def eot(self) -> int:
        """Id of the end of a chat turn (<end_of_turn>, <turn|>), or eos when there is none."""
        return next((self.pieces.index(p) for p in EOT_PIECES if p in self.pieces), self.eos)


def header_class(header_fields: list[tuple[str, int, str]], version: int, doc: str,
                 base: type = object) -> type:
    """The header of a model file version as a frozen dataclass: every field of
    `header_fields` (name, offset, struct code) but the magic, typed by its struct code, with
    `pack()` (the HEADER_SIZE bytes) and `unpack(data)` (which checks the magic, `version` and
    header_size first; ModelFormatError otherwise); `base` adds methods."""
    layout = struct.Struct("<" + "".join(code for _, _, code in header_fields))
    assert layout.size <= HEADER_SIZE

    class Methods(base):
        def pack(self) -> bytes:
            values = [getattr(self, f.name) for f in fields(self)]
            return layout.pack(MAGIC, *values).ljust(HEADER_SIZE, b"\0")

        @classmethod
        def unpack(cls, data: bytes):
            if len(data) < HEADER_SIZE:
                raise ModelFormatError(f"file is truncated: {len(data)} bytes, the header alone "
                                       f"is {HEADER_SIZE}")
            magic, *values = layout.unpack_from(data)
            if magic != MAGIC:
                raise ModelFormatError(f"bad magic {magic!r} (expected {MAGIC!r}): not a gemma "
                                       "model file")
            header = cls(*values)
            if header.version != version:
                raise ModelFormatError(f"unsupported version {header.version} (this reader "
                                       f"reads version {version})")
            if header.header_size != HEADER_SIZE:
                raise ModelFormatError(f"header_size is {header.header_size}, expected "
                                       f"{HEADER_SIZE}")
            return header

    made = make_dataclass("Header", [(name, {"I": int, "Q": int, "f": float}[code])
                                     for name, _, code in header_fields if name != "magic"],
                          bases=(Methods,), frozen=True)
    made.__doc__ = doc
    return made


class _HeaderDims:
    """Version 2's header beyond its fields: the dimensions the engine checks."""

    @property
    def dims(self) -> Dims:
        return Dims(self.vocab, self.dim, self.ffn, self.layers, self.heads, self.kv_heads,
                    self.head_dim, self.max_ctx, self.eps, self.flags, self.att_scale,
                    self.att_softcap, self.final_softcap)


# Every header field but the magic, in file order, typed by its struct code: the dataclass
# follows HEADER_FIELDS, so a field is added or moved in one place.
Header = header_class(HEADER_FIELDS, VERSION, "Every header field but the magic (see "
                      "HEADER_FIELDS), as the file holds it.", _HeaderDims)
Header.__module__ = __name__


@dataclass(frozen=True)
class TensorSpec:
    name: str
    offset: int  # relative to weights_off
    shape: tuple[int, ...]
    dtype: str  # "f16", "q8_0", "f32" or "u32"

    @property
    def nbytes(self) -> int:
        if self.dtype == "q8_0":
            return math.prod(self.shape) // QK8_0 * Q8_0_BLOCK
        return math.prod(self.shape) * (2 if self.dtype == "f16" else 4)


# Every tensor a layer may have, in file order (the order the forward pass reads them);
# OPTIONAL says which header flag a tensor needs.
LAYER_TENSORS = ("window", "rope", "attn_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo",
                 "post_attn_norm", "ffn_norm", "gate", "up", "down", "post_ffn_norm")
OPTIONAL = {"q_norm": QK_NORM, "k_norm": QK_NORM, "post_attn_norm": POST_NORMS,
            "post_ffn_norm": POST_NORMS}


def tensor_shapes(d: Dims) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every tensor, in file order; names: embed, layers.L.X, final_norm."""
    q, kv, hd = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.head_dim
    layer = {"window": (1,), "rope": (hd // 2,), "attn_norm": (d.dim,), "wq": (q, d.dim),
             "wk": (kv, d.dim), "wv": (kv, d.dim), "q_norm": (hd,), "k_norm": (hd,),
             "wo": (d.dim, q), "post_attn_norm": (d.dim,), "ffn_norm": (d.dim,),
             "gate": (d.ffn, d.dim), "up": (d.ffn, d.dim), "down": (d.dim, d.ffn),
             "post_ffn_norm": (d.dim,)}
    names = [n for n in LAYER_TENSORS if n not in OPTIONAL or d.flags & OPTIONAL[n]]
    out = [("embed", (d.vocab, d.dim), matrix_dtype(d, d.dim))]
    for i in range(d.layers):
        out += [(f"layers.{i}.{n}", layer[n], tensor_dtype(n) or matrix_dtype(d, layer[n][-1]))
                for n in names]
    return out + [("final_norm", (d.dim,), "f32")]


def tensor_dtype(name: str) -> str | None:
    """The dtype of a tensor that is not a matrix, by its (last) name: u32 window, f32 norms and
    rope; None for a matrix (matrix_dtype)."""
    name = name.rsplit(".", 1)[-1]
    return "u32" if name == "window" else "f32" if name == "rope" or name.endswith("norm") else None


def matrix_dtype(d: Dims, cols: int) -> str:
    """A matrix's dtype: q8_0 when the header has Q8_0 and its rows split into whole blocks
    (as llama.cpp: other shapes stay FP16), else f16."""
    return "q8_0" if d.flags & Q8_0 and cols % QK8_0 == 0 else "f16"


def quantize_q8_0(rows: np.ndarray) -> np.ndarray:
    """Float rows (r, c), c a multiple of QK8_0 -> their Q8_0 blocks (r, c/32*34) uint8, bit for
    bit llama.cpp's reference quantizer (quantize_row_q8_0_ref: roundf), by gguf.quants."""
    return gguf.quants.quantize(np.ascontiguousarray(rows, np.float32), gguf.GGMLQuantizationType.Q8_0)


def dequantize_q8_0(blocks: np.ndarray, cols: int) -> np.ndarray:
    """Q8_0 blocks (r, cols/32*34) uint8 -> the float32 weights d q (r, cols), exact."""
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(-1, cols)


def tensor_layout(header: Header | Dims) -> list[TensorSpec]:
    """Every tensor with its offset relative to weights_off (a multiple of TENSOR_ALIGN)."""
    dims = header.dims if isinstance(header, Header) else header
    specs, off = [], 0
    for name, shape, dtype in tensor_shapes(dims):
        spec = TensorSpec(name, off, shape, dtype)
        specs.append(spec)
        off = align_up(off + spec.nbytes, TENSOR_ALIGN)
    return specs


def weights_size(dims: Dims) -> int:
    last = tensor_layout(dims)[-1]
    return align_up(last.offset + last.nbytes, TENSOR_ALIGN)


@dataclass
class Tables:
    """The tokenizer sections, packed, with the header fields that describe them."""
    pieces: bytes
    index: bytes
    user: bytes
    blob: bytes
    byte_base: int
    n_index: int
    n_user: int
    max_piece_len: int


def build_tables(vocab: Vocab, n: int) -> Tables:
    """Pack a vocabulary of exactly n pieces; check the invariants the tokenizer relies on."""
    if not (len(vocab.pieces) == len(vocab.scores) == len(vocab.types) == n):
        raise ModelFormatError(f"tokenizer has {len(vocab.pieces)} pieces, the model's vocabulary is {n}")
    for what, i in (("bos", vocab.bos), ("eos", vocab.eos)):
        if not 0 <= i < n:
            raise ModelFormatError(f"{what} id {i} is outside the vocabulary ({n})")
    bad = [i for i, t in enumerate(vocab.types) if t not in range(NORMAL, BYTE + 1)]
    if bad:
        raise ModelFormatError(f"piece {bad[0]} has unknown type {vocab.types[bad[0]]}")
    try:
        byte_base = vocab.pieces.index(b"<0x00>")
    except ValueError:
        raise ModelFormatError("tokenizer has no byte pieces <0x00>..<0xFF> (byte fallback is required)") from None
    for b in range(256):
        i = byte_base + b
        if i >= n or vocab.pieces[i] != b"<0x%02X>" % b or vocab.types[i] != BYTE:
            raise ModelFormatError(f"byte pieces are not contiguous: expected <0x{b:02X}> at id {i}")
    normal = [i for i, t in enumerate(vocab.types) if t == NORMAL]
    user = [i for i, t in enumerate(vocab.types)
            if t == USER_DEFINED or (t == CONTROL and vocab.pieces[i])]
    if any(not vocab.pieces[i] for i in normal + user):
        raise ModelFormatError("a normal or user-defined piece is empty")
    index = sorted(normal, key=lambda i: (vocab.pieces[i], i))
    for a, b in zip(index, index[1:]):
        if vocab.pieces[a] == vocab.pieces[b]:
            raise ModelFormatError(f"pieces {a} and {b} are both {vocab.pieces[a]!r}")
    user.sort(key=lambda i: (-len(vocab.pieces[i]), i))
    records, blob = bytearray(), bytearray()
    for piece, score, typ in zip(vocab.pieces, vocab.scores, vocab.types):
        records += PIECE.pack(len(blob), len(piece), score, typ)
        blob += piece
    return Tables(bytes(records), np.array(index, "<u4").tobytes(), np.array(user, "<u4").tobytes(),
                  bytes(blob), byte_base, len(index), len(user), max(map(len, vocab.pieces)))


def make_header(dims: Dims, vocab: Vocab) -> tuple[Header, Tables]:
    """The header (and packed tables) of a model of these dims and vocabulary."""
    dims.check()
    if vocab.merges:
        raise ModelFormatError("a tokenizer that merges by rank (Gemma 4's) needs model file version 3 or 4")
    t = build_tables(vocab, dims.vocab)
    pieces_off = HEADER_SIZE
    index_off = pieces_off + len(t.pieces)
    user_off = index_off + len(t.index)
    blob_off = user_off + len(t.user)
    weights_off = align_up(blob_off + len(t.blob), WEIGHTS_ALIGN)
    wsize = weights_size(dims)
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    header = Header(
        VERSION, HEADER_SIZE, dims.vocab, dims.dim, dims.ffn, dims.layers, dims.heads,
        dims.kv_heads, dims.head_dim, dims.max_ctx, f32(dims.eps), f32(dims.att_scale),
        f32(math.sqrt(dims.dim)), vocab.bos, vocab.eos, vocab.eot, t.byte_base,
        t.n_index, t.n_user, t.max_piece_len, pieces_off, index_off, user_off, blob_off,
        len(t.blob), weights_off, wsize, weights_off + wsize, dims.flags,
        f32(dims.att_softcap), f32(dims.final_softcap))
    return header, t


# A tensor source: given a spec, yields float arrays of whole rows (last axis = shape[-1])
# whose concatenation is the tensor; for a q8_0 spec it may yield rows already in Q8_0 blocks
# instead (uint8, last axis shape[-1] / 32 * 34), which are written as they are.
TensorSource = Callable[[TensorSpec], Iterable[np.ndarray]]


def write_model(path: Path, dims: Dims, vocab: Vocab, source: TensorSource,
                progress: bool = True, names: dict[str, str] | None = None,
                attn: Sequence[LayerAttn] | None = None) -> Header:
    """Write a model file at path, streaming each tensor from source (see TensorSource);
    each layer's `window` and `rope` come from attn (one LayerAttn per layer; default: full
    attention, theta 10000, no scaling), not from source.

    Matrices are rounded to FP16 (round to nearest even) or quantized to Q8_0 (quantize_q8_0);
    a value that overflows FP16 (for Q8_0: a block whose scale does) raises
    ModelFormatError naming the tensor (by `names[spec.name]` when given, e.g. the name in
    the checkpoint it came from), the count and the first place.
    """
    names = names or {}
    attn = list(attn) if attn is not None else [LayerAttn()] * dims.layers
    header, t = make_header(dims, vocab)
    if len(attn) != dims.layers:
        raise ModelFormatError(f"{len(attn)} layers of attention parameters for {dims.layers} layers")
    for i, a in enumerate(attn):
        a.check(f"layer {i}")

    def chunks(spec: TensorSpec) -> Iterable[np.ndarray]:
        what = spec.name.rsplit(".", 1)[-1]
        if what == "window":
            return [np.array([attn[int(spec.name.split(".")[1])].window], np.uint32)]
        if what == "rope":
            return [rope_freqs(dims.head_dim, attn[int(spec.name.split(".")[1])])]
        return source(spec)
    with open(path, "wb") as f:
        f.write(header.pack() + t.pieces + t.index + t.user + t.blob)
        write_tensors(f, path, header.weights_off, header.file_size, tensor_layout(header), chunks, names, progress)
    return header


def write_tensors(f, path: Path, weights_off: int, file_size: int, specs: list[TensorSpec],
                  source: TensorSource, names: dict[str, str], progress: bool) -> None:
    """Write every tensor of specs at weights_off + its offset in f (zero padding between),
    then zeros up to file_size: each chunk of source's rows converted to the spec's dtype
    (FP16, Q8_0 (float rows quantized, uint8 rows copied as blocks), FP32 or u32); an FP16
    overflow or a wrong row count raises ModelFormatError naming the tensor (names[spec.name]
    when given)."""
    with tqdm(total=file_size - weights_off, unit="B", unit_scale=True, desc=f"writing {Path(path).name}",
              disable=not progress, leave=False) as bar:
        for spec in specs:
            f.write(b"\0" * (weights_off + spec.offset - f.tell()))
            rows, cols = math.prod(spec.shape[:-1]), spec.shape[-1]
            done, overflow, first = 0, 0, None
            for chunk in source(spec):
                chunk = np.asarray(chunk)
                if spec.dtype == "q8_0" and chunk.dtype == np.uint8:  # blocks, as they are
                    out = chunk.reshape(-1, cols // QK8_0 * Q8_0_BLOCK)
                    chunk = out
                elif spec.dtype == "q8_0":
                    chunk = chunk.reshape(-1, cols)
                    out = quantize_q8_0(chunk)
                    scale = out.reshape(-1, Q8_0_BLOCK)[:, :2].copy().view("<f2").reshape(len(chunk), -1)
                    bad = np.isinf(scale) & np.isfinite(chunk.reshape(len(chunk), -1, QK8_0)).all(axis=2)
                    if bad.any():
                        if first is None:
                            at = np.argwhere(bad)[0]
                            first = ([done + int(at[0]), int(at[1]) * QK8_0], float(np.abs(
                                chunk[at[0], at[1] * QK8_0:(at[1] + 1) * QK8_0]).max()))
                        overflow += int(bad.sum())
                elif spec.dtype == "u32":
                    chunk = chunk.reshape(-1, cols)
                    out = chunk.astype("<u4")
                elif spec.dtype == "f16":
                    chunk = chunk.reshape(-1, cols)
                    with np.errstate(over="ignore"):
                        out = chunk.astype("<f2")
                    bad = np.isinf(out) & np.isfinite(chunk)
                    if bad.any():
                        if first is None:
                            at = np.argwhere(bad)[0]
                            first = ([done + int(at[0])] + at[1:].tolist(), float(chunk[tuple(at)]))
                        overflow += int(bad.sum())
                else:
                    chunk = chunk.reshape(-1, cols)
                    out = chunk.astype("<f4")
                f.write(out.tobytes())
                done += chunk.shape[0]
                bar.update(out.nbytes)
            if done != rows:
                raise ModelFormatError(f"tensor {names.get(spec.name, spec.name)}: got {done} rows, expected {rows}")
            if overflow:
                what = "Q8_0 block(s) whose scale overflows" if spec.dtype == "q8_0" else "value(s) overflow"
                raise ModelFormatError(f"{overflow} {what} FP16 in {names.get(spec.name, spec.name)} "
                                       f"(first at {first[0]}: {first[1]:g})")
        f.write(b"\0" * (file_size - f.tell()))


def read_header(path: Path) -> Header:
    with open(path, "rb") as f:
        return Header.unpack(f.read(HEADER_SIZE))


def read_tables(target, m: np.ndarray, h) -> None:
    """Validate the tokenizer tables a header (of either version) places in the mapped file m
    and set them on target: pieces (list[bytes]), scores (float32 array), types (int array),
    index (sorted normal ids), user (ids of the pieces matched whole)."""
    for name in ("bos", "eos", "eot"):
        if getattr(h, name) >= h.vocab:
            raise ModelFormatError(f"{name} id {getattr(h, name)} is outside the vocabulary")
    if h.byte_base + 256 > h.vocab or h.n_index > h.vocab or h.n_user > h.vocab:
        raise ModelFormatError("byte_base, n_index or n_user is outside the vocabulary")
    rec = np.frombuffer(m, np.dtype([("off", "<u4"), ("len", "<u4"), ("score", "<f4"), ("type", "<u4")]),
                        h.vocab, h.pieces_off)
    ends = rec["off"].astype(np.uint64) + rec["len"]
    if h.vocab and ends.max() > h.blob_size:
        raise ModelFormatError(f"piece {int(ends.argmax())} extends past the blob")
    if h.vocab and rec["len"].max() != h.max_piece_len:
        raise ModelFormatError(f"max_piece_len is {h.max_piece_len}, the longest piece is {rec['len'].max()}")
    blob = bytes(m[h.blob_off:h.blob_off + h.blob_size])
    target.pieces = [blob[o:o + n] for o, n in zip(rec["off"].tolist(), rec["len"].tolist())]
    target.scores = rec["score"].copy()
    target.types = rec["type"].astype(np.int64)
    if h.vocab and not ((target.types >= NORMAL) & (target.types <= BYTE)).all():
        raise ModelFormatError("a piece has an unknown type")
    is_byte = target.types == BYTE
    if not is_byte[h.byte_base:h.byte_base + 256].all() or is_byte.sum() != 256:
        raise ModelFormatError("the 256 byte pieces are not exactly ids byte_base..byte_base+255")
    target.index = np.frombuffer(m, "<u4", h.n_index, h.index_off).astype(np.int64)
    target.user = np.frombuffer(m, "<u4", h.n_user, h.user_off).astype(np.int64)
    for what, ids, types in (("index", target.index, [NORMAL]), ("user", target.user, [USER_DEFINED, CONTROL])):
        if len(ids) and (ids.max() >= h.vocab or not np.isin(target.types[ids], types).all()):
            raise ModelFormatError(f"the {what} table holds an id that is not a piece of type {types}")
    keys = [target.pieces[i] for i in target.index]
    if keys != sorted(keys):
        raise ModelFormatError("the index is not sorted by piece bytes")


class MappedModel:
    """A model file mapped read-only, then checked by the subclass's `_validate`, which reads
    the header through `_header`; every error is a ModelFormatError that names the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{self.path}: cannot map: {e}") from None
        try:
            self._validate()
        except ModelFormatError as e:
            raise ModelFormatError(f"{self.path}: {e}") from None

    def _header(self, header_class):
        """The file's header as `header_class` (kept as `header`), its size checked."""
        size = len(self._map)
        h = self.header = header_class.unpack(bytes(self._map[:HEADER_SIZE]))
        if h.file_size != size:
            raise ModelFormatError(f"file is {size} bytes but its header says {h.file_size}"
                                   + (" (truncated)" if size < h.file_size else ""))
        return h


class ModelFile(MappedModel):
    """A validated, memory-mapped model file.

    Attributes: header, dims, pieces (list[bytes]), scores (float32 array), types (int
    array), index (sorted normal ids), user (ids of the pieces matched whole: user-defined and
    control, longest first).
    `tensor(name)` returns a read-only view (float16, float32 or uint32) of a tensor; a Q8_0
    matrix comes back as its float32 weights d q (a copy); `raw(name)` is any tensor's bytes.
    """

    def _validate(self) -> None:
        m = self._map
        h = self._header(Header)
        self.dims = h.dims
        if not 0 < h.att_scale <= FLT_MAX:  # Dims would take 0 for its default
            raise ModelFormatError(f"att_scale ({h.att_scale}) must be positive and finite")
        self.dims.check()
        expected = [("pieces_off", HEADER_SIZE), ("index_off", h.pieces_off + PIECE_REC * h.vocab),
                    ("user_off", h.index_off + 4 * h.n_index), ("blob_off", h.user_off + 4 * h.n_user),
                    ("weights_off", align_up(h.blob_off + h.blob_size, WEIGHTS_ALIGN)),
                    ("weights_size", weights_size(self.dims)),
                    ("file_size", h.weights_off + h.weights_size)]
        for name, want in expected:
            if getattr(h, name) != want:
                raise ModelFormatError(f"{name} is {getattr(h, name)}, expected {want}")
        if h.embed_scale != np.float32(math.sqrt(h.dim)):
            raise ModelFormatError(f"embed_scale {h.embed_scale} is not float32(sqrt({h.dim}))")
        read_tables(self, m, h)
        self._layout = {s.name: s for s in tensor_layout(h)}

    def raw(self, name: str) -> np.ndarray:
        s = self._layout[name]
        return np.frombuffer(self._map, np.uint8, s.nbytes, self.header.weights_off + s.offset)

    def tensor(self, name: str) -> np.ndarray:
        s = self._layout[name]
        if s.dtype == "q8_0":
            return dequantize_q8_0(self.raw(name).reshape(s.shape[0], -1), s.shape[-1])
        dt = np.dtype({"f16": "<f2", "f32": "<f4", "u32": "<u4"}[s.dtype])
        return np.frombuffer(self._map, dt, math.prod(s.shape), self.header.weights_off + s.offset).reshape(s.shape)

