"""Model file version 3: one format for Gemma 1, 2, 3 and 4 (docs/format.md, "Version 3",
describes it field by field); the Python side's (the numpy reference reads it, convert/synth
write it with --format 3; the engine reads version 4 only), and the description version 4's
compiler starts from.

What version 2 (modelfile.py) keeps uniform, version 3 gives each layer in a fixed 32-byte
record (LAYER_FIELDS): its flags (which norms, the value norm, k = v, a MoE block), head_dim,
kv heads, FFN width, sliding window, the layer whose K/V cache it reads (itself, or an
earlier layer of the same kind: KV sharing), attention scale and layer_scalar. Layout:

header (256 bytes, HEADER_FIELDS) | layer records: layers x LAYER_REC | pieces | index | user |
merges: n_merges x MERGE_REC (left id, right id, result id, score = -rank), sorted by (left,
right) | blob | zero padding to a multiple of 4096 | weights: the tensors of `tensor_layout`,
in the order the forward pass reads them, each at a multiple of 64 from weights_off.

Every offset and size is derived from the header and the records (nothing is stored twice
but what a reader checks): a reader validates the header, then every record, then the
tables, and only then touches weights. Norm weights hold the multiplier itself (1 + w for
Gemma 1-3, w for Gemma 4); each layer's first tensor is its RoPE table (inverse frequencies,
0 for a pair that does not rotate: Gemma 4's proportional rope). The tokenizer tables are
version 2's (modelfile.build_tables, modelfile.read_tables) plus the merges of a merge-rank
BPE vocabulary (header flag MERGES; builder/twins/tokenizer.py says how they are used).

`write_model` streams tensors from a source as modelfile.write_model does (modelfile.
write_tensors); `ModelFile3` maps and validates a file, raising ModelFormatError (one line).
`from_v2` expresses a version 2 model (Dims and LayerAttn) in version 3 terms.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from builder.models.modelfile import (FLT_MAX, HEADER_SIZE, PIECE_REC, POST_NORMS, Q8_0, Q8_0_BLOCK, QK_NORM, QK8_0,
                                      TENSOR_ALIGN, WEIGHTS_ALIGN, Dims, LayerAttn, MappedModel, ModelFormatError, TensorSource,
                                      TensorSpec, Vocab, build_tables, ModelFile, dequantize_q8_0, header_class, read_tables, rope_freqs,
                                      write_tensors)
from linker.layout import align_up

VERSION = 3
LAYER_REC = 32
MERGE_REC = 16
MERGES = 8                # header flag: the tokenizer merges by rank (the merges table), not by score
HEADER_FLAGS = Q8_0 | MERGES
V_NORM = 4                # layer flags, beside POST_NORMS (1) and QK_NORM (2): v = rmsnorm(v), no weight
K_EQ_V = 8                # no wv: v is the raw key projection (before k_norm and rope)
MOE = 16                  # a routed expert FFN beside the dense one
LAYER_FLAGS = POST_NORMS | QK_NORM | V_NORM | K_EQ_V | MOE
OWN_KV_FLAGS = V_NORM | K_EQ_V  # describe how a layer computes its K/V: only on layers that do
# The largest value of each field: what the engine accepts (every size it forms stays far
# below 2^64; vocab below 2^24: a block's 64 rows of logits, whose bytes forward.asm counts
# in 32 bits, stay below 2^32).
DIM_LIMITS = {"vocab": (1 << 24) - 1, "dim": 1 << 16, "layers": 1 << 10, "heads": 1 << 10, "max_ctx": 1 << 16,
              "ple_dim": 1 << 16, "experts": 1 << 10, "expert_ffn": 1 << 16,
              "head_dim": 1 << 16, "kv_heads": 1 << 10, "ffn": 1 << 16, "n_merges": 1 << 24}

HEADER_FIELDS: list[tuple[str, int, str]] = [
    ("magic", 0, "8s"),
    ("version", 8, "I"),
    ("header_size", 12, "I"),
    ("vocab", 16, "I"),
    ("dim", 20, "I"),
    ("layers", 24, "I"),
    ("heads", 28, "I"),
    ("max_ctx", 32, "I"),
    ("ple_dim", 36, "I"),
    ("experts", 40, "I"),
    ("top_k", 44, "I"),
    ("expert_ffn", 48, "I"),
    ("flags", 52, "I"),
    ("eps", 56, "f"),
    ("embed_scale", 60, "f"),
    ("ple_scale", 64, "f"),
    ("dim_rsqrt", 68, "f"),
    ("att_softcap", 72, "f"),
    ("final_softcap", 76, "f"),
    ("bos", 80, "I"),
    ("eos", 84, "I"),
    ("eot", 88, "I"),
    ("byte_base", 92, "I"),
    ("n_index", 96, "I"),
    ("n_user", 100, "I"),
    ("n_merges", 104, "I"),
    ("max_piece_len", 108, "I"),
    ("layers_off", 112, "Q"),
    ("pieces_off", 120, "Q"),
    ("index_off", 128, "Q"),
    ("user_off", 136, "Q"),
    ("merges_off", 144, "Q"),
    ("blob_off", 152, "Q"),
    ("blob_size", 160, "Q"),
    ("weights_off", 168, "Q"),
    ("weights_size", 176, "Q"),
    ("file_size", 184, "Q"),
]
LAYER_FIELDS: list[tuple[str, int, str]] = [
    ("flags", 0, "I"),
    ("head_dim", 4, "I"),
    ("kv_heads", 8, "I"),
    ("ffn", 12, "I"),
    ("window", 16, "I"),
    ("kv_source", 20, "I"),
    ("att_scale", 24, "f"),
    ("layer_scalar", 28, "f"),
]
_LAYER = struct.Struct("<" + "".join(code for _, _, code in LAYER_FIELDS))
MERGE = struct.Struct("<IIIf")  # left, right, result, score
assert _LAYER.size == LAYER_REC and MERGE.size == MERGE_REC
for _table in (HEADER_FIELDS, LAYER_FIELDS):
    assert all(struct.calcsize("<" + "".join(c for _, _, c in _table[:i])) == off
               for i, (_, off, _) in enumerate(_table))


def f32(v: float) -> float:
    return float(np.float32(v))


@dataclass(frozen=True)
class Layer:
    """One layer's record (LAYER_FIELDS): what it computes, beyond the header's globals."""
    head_dim: int
    kv_heads: int
    ffn: int
    kv_source: int            # the layer whose K/V cache it attends to: itself, or an earlier one
    window: int = 0           # 0: full causal attention; w: the last w positions only
    flags: int = 0            # POST_NORMS, QK_NORM, V_NORM, K_EQ_V, MOE
    att_scale: float = 1.0    # multiplies q . k
    layer_scalar: float = 1.0  # multiplies the stream after the layer

    def pack(self) -> bytes:
        return _LAYER.pack(*(getattr(self, name) for name, _, _ in LAYER_FIELDS))

    @classmethod
    def unpack(cls, data: bytes, offset: int) -> Layer:
        return cls(**dict(zip((n for n, _, _ in LAYER_FIELDS), _LAYER.unpack_from(data, offset))))


@dataclass(frozen=True)
class Rope:
    """How a layer's RoPE table is made (not stored: the table is): theta, linear scale, and
    how many of the head_dim/2 frequency pairs rotate (None: all; the rest get 0)."""
    theta: float = 10000.0
    scale: float = 1.0
    pairs: int | None = None


def rope_table(head_dim: int, rope: Rope) -> np.ndarray:
    """The inverse frequencies (head_dim/2,) float32: modelfile.rope_freqs (transformers'
    float32 computation, the exponent over the whole head_dim), 0 from pair `pairs` on."""
    table = rope_freqs(head_dim, LayerAttn(0, rope.theta, rope.scale))
    if rope.pairs is not None:
        if not 0 <= rope.pairs <= head_dim // 2:
            raise ModelFormatError(f"{rope.pairs} rotated pairs for head_dim {head_dim}")
        table[rope.pairs:] = 0
    return table


@dataclass(frozen=True)
class Model:
    """Everything version 3's header and layer records say about a model (not the tokenizer)."""
    vocab: int
    dim: int
    heads: int
    max_ctx: int
    layers: tuple[Layer, ...]
    eps: float = 1e-6
    ple_dim: int = 0          # P: per-layer inputs of P values (0: none)
    experts: int = 0          # MoE: E experts of expert_ffn, top_k chosen per token (0: none)
    top_k: int = 0
    expert_ffn: int = 0
    flags: int = 0            # Q8_0, MERGES
    att_softcap: float = 0.0
    final_softcap: float = 0.0

    def check(self) -> None:
        """The rules a reader (and the engine) enforces, each refused with one line."""
        n = len(self.layers)
        for f in ("vocab", "dim", "heads", "max_ctx"):
            _limit(f, getattr(self, f), 1)
        _limit("layers", n, 1)
        for f in ("ple_dim", "experts", "expert_ffn"):
            _limit(f, getattr(self, f), 0)
        if self.flags & ~HEADER_FLAGS:
            raise ModelFormatError(f"flags {self.flags:#x} has unknown bits (known: {HEADER_FLAGS:#x})")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelFormatError(f"eps ({self.eps}) must be positive and finite")
        for f in ("att_softcap", "final_softcap"):
            if not 0 <= getattr(self, f) <= FLT_MAX:
                raise ModelFormatError(f"{f} ({getattr(self, f)}) must be 0 (none) or positive and finite")
        moe = [i for i, layer in enumerate(self.layers) if layer.flags & MOE]
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ModelFormatError(f"top_k {self.top_k} is not 1 .. experts ({self.experts})")
            if self.expert_ffn % 4:
                raise ModelFormatError(f"expert_ffn ({self.expert_ffn}) is not a multiple of 4")
            if not self.expert_ffn or not moe:
                raise ModelFormatError(f"{self.experts} experts but expert_ffn {self.expert_ffn} and "
                                       f"{len(moe)} MoE layers")
        elif self.top_k or self.expert_ffn or moe:
            raise ModelFormatError(f"no experts, but top_k {self.top_k}, expert_ffn {self.expert_ffn}, "
                                   f"{len(moe)} MoE layers")
        for i, layer in enumerate(self.layers):
            self._check_layer(i, layer)

    def _check_layer(self, i: int, layer: Layer) -> None:
        where = f"layer {i}"
        if layer.flags & ~LAYER_FLAGS:
            raise ModelFormatError(f"{where}: flags {layer.flags:#x} has unknown bits (known: {LAYER_FLAGS:#x})")
        for f in ("head_dim", "kv_heads", "ffn"):
            _limit(f, getattr(layer, f), 1, where)
        if layer.head_dim % 2:
            raise ModelFormatError(f"{where}: head_dim ({layer.head_dim}) is odd")
        if layer.ffn % 4:
            raise ModelFormatError(f"{where}: ffn ({layer.ffn}) is not a multiple of 4")
        if self.heads % layer.kv_heads:
            raise ModelFormatError(f"{where}: heads ({self.heads}) is not a multiple of kv_heads ({layer.kv_heads})")
        if not 0 <= layer.window < 1 << 32:
            raise ModelFormatError(f"{where}: sliding window {layer.window} is out of range")
        for f in ("att_scale", "layer_scalar"):
            if not 0 < getattr(layer, f) <= FLT_MAX:
                raise ModelFormatError(f"{where}: {f} ({getattr(layer, f)}) must be positive and finite")
        if layer.flags & MOE and not layer.flags & POST_NORMS:
            raise ModelFormatError(f"{where}: a MoE block needs the post norms (POST_NORMS)")
        src = layer.kv_source
        if src > i:
            raise ModelFormatError(f"{where}: reads the K/V cache of layer {src}, not an earlier one")
        if src == i:
            return
        s = self.layers[src]
        if s.kv_source != src:
            raise ModelFormatError(f"{where}: reads layer {src}'s K/V cache, which that layer does not compute")
        if (s.window, s.head_dim, s.kv_heads) != (layer.window, layer.head_dim, layer.kv_heads):
            raise ModelFormatError(f"{where}: reads layer {src}'s K/V cache, a layer of another kind "
                                   "(window, head_dim or kv_heads differ)")
        if layer.flags & OWN_KV_FLAGS:
            raise ModelFormatError(f"{where}: computes no K/V (reads layer {src}'s) but has flags "
                                   f"{layer.flags & OWN_KV_FLAGS:#x} about it")


def _limit(name: str, value: object, low: int, where: str = "") -> None:
    limit = DIM_LIMITS[name]
    if not (isinstance(value, int) and low <= value <= limit):
        raise ModelFormatError(f"{where + ': ' if where else ''}{name} = {value} is out of range "
                               f"({low} .. {limit}, what the engine runs)")


Header = header_class(HEADER_FIELDS, VERSION, "Every version 3 header field but the magic "
                      "(see HEADER_FIELDS), as the file holds it.")
Header.__module__ = __name__

# The float32 vectors of a layer (and of the model): every other tensor is a matrix (FP16 or,
# with Q8_0 and rows of whole blocks, Q8_0). The router stays FP32, as llama.cpp keeps it:
# the choice of experts is discrete, a rounded router would change it.
F32_TENSORS = {"rope", "router", "router_scale", "expert_scale"}


def is_f32(name: str) -> bool:
    what = name.rsplit(".", 1)[-1]
    return what in F32_TENSORS or "norm" in what


def layer_tensors(m: Model, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of layer i's tensors, in file order (the order the forward pass reads them)."""
    layer, d, p = m.layers[i], m.dim, m.ple_dim
    hd, kv, f, own = layer.head_dim, layer.kv_heads * layer.head_dim, layer.ffn, layer.kv_source == i
    flag = layer.flags.__and__
    out = [("rope", (hd // 2,)), ("attn_norm", (d,)), ("wq", (m.heads * hd, d))]
    out += [("wk", (kv, d))] * own + [("wv", (kv, d))] * (own and not flag(K_EQ_V))
    out += [("q_norm", (hd,))] * bool(flag(QK_NORM)) + [("k_norm", (hd,))] * bool(own and flag(QK_NORM))
    out += [("wo", (d, m.heads * hd))] + [("post_attn_norm", (d,))] * bool(flag(POST_NORMS))
    out += [("ffn_norm", (d,)), ("gate", (f, d)), ("up", (f, d)), ("down", (d, f))]
    if flag(MOE):
        e, x = m.experts, m.expert_ffn
        out += [("post_ffn_norm_1", (d,)), ("router_scale", (d,)), ("router", (e, d)), ("expert_scale", (e,)),
                ("ffn_norm_2", (d,)), ("experts_gate_up", (e, 2 * x, d)), ("experts_down", (e, d, x)),
                ("post_ffn_norm_2", (d,))]
    out += [("post_ffn_norm", (d,))] * bool(flag(POST_NORMS))
    if p:
        out += [("ple_gate", (p, d)), ("ple_out", (d, p)), ("ple_post_norm", (d,))]
    return out


def tensor_shapes(m: Model) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every tensor in file order; names: embed, ple_embed, ple_proj,
    ple_norm, layers.L.X, final_norm."""
    def dtype(name: str, shape: tuple[int, ...]) -> str:
        return "f32" if is_f32(name) else "q8_0" if m.flags & Q8_0 and shape[-1] % QK8_0 == 0 else "f16"
    n, p = len(m.layers), m.ple_dim
    out = [("embed", (m.vocab, m.dim))]
    if p:
        out += [("ple_embed", (m.vocab, n * p)), ("ple_proj", (n * p, m.dim)), ("ple_norm", (p,))]
    for i in range(n):
        out += [(f"layers.{i}.{what}", shape) for what, shape in layer_tensors(m, i)]
    out += [("final_norm", (m.dim,))]
    return [(name, shape, dtype(name, shape)) for name, shape in out]


def tensor_layout(m: Model) -> list[TensorSpec]:
    """Every tensor with its offset relative to weights_off (a multiple of TENSOR_ALIGN)."""
    specs, off = [], 0
    for name, shape, dtype in tensor_shapes(m):
        specs.append(TensorSpec(name, off, shape, dtype))
        off = align_up(off + specs[-1].nbytes, TENSOR_ALIGN)
    return specs


def weights_size(m: Model) -> int:
    last = tensor_layout(m)[-1]
    return align_up(last.offset + last.nbytes, TENSOR_ALIGN)


def merges_table(vocab: Vocab) -> bytes:
    """The merges section: one MERGE record per merge, score -rank, sorted by (left, right);
    refuses a merge whose result is not a piece, or a pair listed twice."""
    n, out = len(vocab.pieces), {}
    index = {p: i for i, p in enumerate(vocab.pieces)}
    _limit("n_merges", len(vocab.merges), 0)
    for rank, (a, b) in enumerate(vocab.merges):
        if not (0 <= a < n and 0 <= b < n):
            raise ModelFormatError(f"merge {rank} ({a}, {b}) is outside the vocabulary ({n})")
        result = index.get(vocab.pieces[a] + vocab.pieces[b])
        if result is None:
            raise ModelFormatError(f"merge {rank}: {vocab.pieces[a] + vocab.pieces[b]!r} is not a piece")
        if (a, b) in out:
            raise ModelFormatError(f"merge {rank} ({a}, {b}) is listed twice")
        out[a, b] = MERGE.pack(a, b, result, -float(rank))
    return b"".join(out[k] for k in sorted(out))


def make_header(m: Model, vocab: Vocab) -> tuple[Header, bytes]:
    """The header and everything between it and the weights (records, tables, padding)."""
    m.check()
    if bool(vocab.merges) != bool(m.flags & MERGES):
        raise ModelFormatError("the MERGES flag must be set exactly when the vocabulary has merges")
    t = build_tables(vocab, m.vocab)
    merges = merges_table(vocab)
    layers_off = HEADER_SIZE
    pieces_off = layers_off + LAYER_REC * len(m.layers)
    index_off = pieces_off + len(t.pieces)
    user_off = index_off + len(t.index)
    merges_off = user_off + len(t.user)
    blob_off = merges_off + len(merges)
    weights_off = align_up(blob_off + len(t.blob), WEIGHTS_ALIGN)
    wsize = weights_size(m)
    header = Header(
        VERSION, HEADER_SIZE, m.vocab, m.dim, len(m.layers), m.heads, m.max_ctx, m.ple_dim, m.experts,
        m.top_k, m.expert_ffn, m.flags, f32(m.eps), f32(math.sqrt(m.dim)), f32(math.sqrt(m.ple_dim)),
        f32(m.dim ** -0.5), f32(m.att_softcap), f32(m.final_softcap), vocab.bos, vocab.eos, vocab.eot,
        t.byte_base, t.n_index, t.n_user, len(vocab.merges), t.max_piece_len, layers_off, pieces_off,
        index_off, user_off, merges_off, blob_off, len(t.blob), weights_off, wsize, weights_off + wsize)
    front = b"".join(layer.pack() for layer in m.layers) + t.pieces + t.index + t.user + merges + t.blob
    return header, front


def write_model(path: Path, m: Model, vocab: Vocab, source: TensorSource, ropes: Sequence[Rope],
                progress: bool = True, names: dict[str, str] | None = None) -> Header:
    """Write a version 3 model file at path: each layer's `rope` table from ropes (one Rope per
    layer), every other tensor streamed from source (modelfile.TensorSource), rounded to FP16,
    quantized to Q8_0 or written as FP32 by modelfile.write_tensors (an FP16 overflow raises
    ModelFormatError naming the tensor by names[spec.name] when given)."""
    if len(ropes) != len(m.layers):
        raise ModelFormatError(f"{len(ropes)} rope settings for {len(m.layers)} layers")
    header, front = make_header(m, vocab)
    for i, r in enumerate(ropes):
        if not (0 < r.theta <= FLT_MAX and 0 < r.scale <= FLT_MAX):
            raise ModelFormatError(f"layer {i}: rope theta ({r.theta}) and scale ({r.scale}) must be positive and finite")

    def chunks(spec: TensorSpec):
        if spec.name.endswith(".rope"):
            i = int(spec.name.split(".")[1])
            return [rope_table(m.layers[i].head_dim, ropes[i])]
        return source(spec)
    with open(path, "wb") as f:
        f.write(header.pack() + front)
        write_tensors(f, path, header.weights_off, header.file_size, tensor_layout(m), chunks, names or {}, progress)
    return header


def from_v2(dims: Dims, attn: Sequence[LayerAttn]) -> tuple[Model, list[Rope]]:
    """A version 2 model (Gemma 1-3: every layer alike but its window and rope) in version 3
    terms: the header flags become every layer's, each layer reads its own K/V."""
    layers = tuple(Layer(dims.head_dim, dims.kv_heads, dims.ffn, i, a.window, dims.flags & (POST_NORMS | QK_NORM),
                         f32(dims.att_scale)) for i, a in enumerate(attn))
    model = Model(dims.vocab, dims.dim, dims.heads, dims.max_ctx, layers, dims.eps, flags=dims.flags & Q8_0,
                  att_softcap=dims.att_softcap, final_softcap=dims.final_softcap)
    return model, [Rope(a.rope_theta, a.rope_scale) for a in attn]


def with_q8_0(m: Model) -> Model:
    return replace(m, flags=m.flags | Q8_0)


def check_merge_count(h) -> None:
    """A header's n_merges (of version 3 or 4): at most 2^24, and 0 without the MERGES flag."""
    _limit("n_merges", h.n_merges, 0)
    if h.n_merges and not h.flags & MERGES:
        raise ModelFormatError(f"{h.n_merges} merges without the MERGES flag")


def read_tokenizer(target, m: np.ndarray, h, ranks: bool = True) -> None:
    """Version 2's tokenizer checks (modelfile.read_tables), then the merges a header (of
    version 3 or 4) places in the mapped file m, set on target as merges (int array
    [n_merges, 3]: left, right, result) and merge_scores (float32: -rank), each checked: ids
    inside the vocabulary, sorted by (left, right); with `ranks`, also what only the writer
    guarantees (check_ranks). Version 4's reader leaves that to its writer: the engine reads
    a file whose merges are otherwise in order (any score orders the merges; a result that is
    not its pieces joined is still a piece), so both refuse the same files."""
    read_tables(target, m, h)
    rec = np.frombuffer(m, np.dtype([("left", "<u4"), ("right", "<u4"), ("result", "<u4"), ("score", "<f4")]),
                        h.n_merges, h.merges_off)
    target.merges = np.stack([rec[f].astype(np.int64) for f in ("left", "right", "result")], axis=1).reshape(-1, 3)
    target.merge_scores = rec["score"].copy()
    if h.n_merges:
        if target.merges.max() >= h.vocab:
            raise ModelFormatError("a merge holds an id outside the vocabulary")
        keys = target.merges[:, 0] * h.vocab + target.merges[:, 1]
        if (np.diff(keys) <= 0).any():
            raise ModelFormatError("the merges are not sorted by (left, right), or one is listed twice")
        if ranks:
            check_ranks(target)


def check_ranks(target) -> None:
    """The merges' scores are exactly -rank for ranks 0 .. n - 1, and each result is its pieces
    joined (what a writer of merges from a tokenizer.json or GGUF guarantees)."""
    if sorted((-target.merge_scores).tolist()) != list(range(len(target.merge_scores))):
        raise ModelFormatError("the merge scores are not -rank for ranks 0 .. n_merges - 1")
    bad = next((k for k, (a, b, r) in enumerate(target.merges.tolist())
                if target.pieces[a] + target.pieces[b] != target.pieces[r]), None)
    if bad is not None:
        raise ModelFormatError(f"merge record {bad}: its result is not its pieces joined")


class ModelFile3(MappedModel):
    """A validated, memory-mapped version 3 model file.

    Attributes: header, model (Model: the header's globals and every layer record), pieces,
    scores, types, index, user (as modelfile.ModelFile), merges (int array [n_merges, 3]:
    left, right, result, sorted by (left, right)) and merge_scores (float32: -rank).
    `tensor(name)` returns a read-only view (float16 or float32) or, for a Q8_0 matrix, its
    float32 weights d q (a copy); `raw(name)` is any tensor's bytes; `specs` the layout.
    """

    def _validate(self) -> None:
        m, size = self._map, len(self._map)
        h = self._header(Header)
        _limit("layers", h.layers, 1)
        if h.layers_off != HEADER_SIZE:
            raise ModelFormatError(f"layers_off is {h.layers_off}, expected {HEADER_SIZE}")
        if h.layers_off + LAYER_REC * h.layers > size:
            raise ModelFormatError(f"file is truncated inside the {h.layers} layer records")
        layers = tuple(Layer.unpack(m, h.layers_off + LAYER_REC * i) for i in range(h.layers))
        self.model = Model(h.vocab, h.dim, h.heads, h.max_ctx, layers, h.eps, h.ple_dim, h.experts, h.top_k,
                           h.expert_ffn, h.flags, h.att_softcap, h.final_softcap)
        self.model.check()
        check_merge_count(h)
        expected = [("pieces_off", h.layers_off + LAYER_REC * h.layers),
                    ("index_off", h.pieces_off + PIECE_REC * h.vocab), ("user_off", h.index_off + 4 * h.n_index),
                    ("merges_off", h.user_off + 4 * h.n_user), ("blob_off", h.merges_off + MERGE_REC * h.n_merges),
                    ("weights_off", align_up(h.blob_off + h.blob_size, WEIGHTS_ALIGN)),
                    ("weights_size", weights_size(self.model)), ("file_size", h.weights_off + h.weights_size)]
        for name, want in expected:
            if getattr(h, name) != want:
                raise ModelFormatError(f"{name} is {getattr(h, name)}, expected {want}")
        for name, want in (("embed_scale", math.sqrt(h.dim)), ("ple_scale", math.sqrt(h.ple_dim)),
                           ("dim_rsqrt", h.dim ** -0.5)):
            if getattr(h, name) != f32(want):
                raise ModelFormatError(f"{name} {getattr(h, name)} is not float32({want})")
        read_tokenizer(self, m, h)
        self.specs = tensor_layout(self.model)
        self._layout = {s.name: s for s in self.specs}

    def raw(self, name: str) -> np.ndarray:
        s = self._layout[name]
        return np.frombuffer(self._map, np.uint8, s.nbytes, self.header.weights_off + s.offset)

    def tensor(self, name: str) -> np.ndarray:
        s = self._layout[name]
        if s.dtype == "q8_0":
            return dequantize_q8_0(self.raw(name).reshape(-1, s.shape[-1] // QK8_0 * Q8_0_BLOCK), s.shape[-1]).reshape(s.shape)
        dt = np.dtype({"f16": "<f2", "f32": "<f4"}[s.dtype])
        return np.frombuffer(self._map, dt, math.prod(s.shape), self.header.weights_off + s.offset).reshape(s.shape)


def file_version(path: Path) -> int | None:
    """The version field of a model file (None: too short to have one); nothing is validated."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot read: {e.strerror}") from None
    return struct.unpack_from("<I", head, 8)[0] if len(head) == 12 else None


def open_model(path: Path):
    """A validated model file of any version the Python side reads (2, 3 or 4: ModelFile,
    ModelFile3 or modelfile4.ModelFile4), by its version field."""
    version = file_version(path)
    if version == 4:
        from builder.models.modelfile4 import ModelFile4  # (modelfile4 builds on this module)
        return ModelFile4(path)
    return ModelFile3(path) if version == VERSION else ModelFile(path)


def bytes_per_token(m: Model) -> int:
    """The weight bytes one generated token reads: every tensor once (the embedding whole: it is
    also the output projection), except the PLE table, of which it reads one row (each layer's
    P inputs of that token), and each MoE layer's experts, of which it reads the top_k chosen."""
    total = 0
    for s in tensor_layout(m):
        if s.name == "ple_embed":
            total += s.nbytes // m.vocab
        elif s.name.endswith((".experts_gate_up", ".experts_down")):
            total += s.nbytes // m.experts * m.top_k
        else:
            total += s.nbytes
    return total
