"""The compiler of model file version 4: a model (version 3's description: modelfile3.Model and
each layer's Rope, what the checkpoint readers give) -> its forward pass as a program of ops
(modelfile4), one builder per Gemma generation (GENERATIONS; docs/gemma.md, "The programs").

    prog = compile_program(model, ropes, generation)
    write(path, prog, vocab, source)       # source: a modelfile.TensorSource by version 3's names

Slots, by name (`Program.slot_names`; the file holds only widths): x (the stream, d), xb (a
normed copy of the stream, then the attention's output), q (H hd), hb and hb2 (the FFN's, and
hb2 the output of a product before its post norm), K{i} and V{i} (CACHE: layer i's K/V, only for
a layer that computes its own), with per-layer inputs x0 (the scaled embedding) and pc, pt
(P wide), and with experts wts (E: each token's expert weights), r (the router's input), h2
(the experts' input), y (one expert's output), m2 (the experts' sum) and mm (the two FFNs'
normed sum), d wide. A slot is as wide as its widest operand.

Weights are version 3's tensors (same names, shapes and values: norms hold 1 + w for Gemma 1-3
and w for Gemma 4, as the checkpoint readers give them; a matrix is Q8_0 when the model has
Q8_0 and its rows split into 32-value blocks, FP16 otherwise) plus what the compiler computes:
each layer's `layers.{i}.rope` table (modelfile3.rope_table), `ones` (the value norm's weight,
one tensor for every layer), each MoE layer's `layers.{i}.route` (F32: the router's [E, d] rows,
then expert_scale's E values) and, where a product reads a tensor block by block (`ple_proj`
by layer, `experts_gate_up` and `experts_down` by expert) and a block's bytes are not a
multiple of 64, every block as a tensor of its own, `{name}.{b}` (block b; the tensor itself
is then not written). `ple_embed` is Q8_0 only when P is a multiple of 32 (EMBED reads a
layer's P columns: Q8_0 blocks must not straddle layers). They are laid out in the order the
program first reads them.

Gemma 1-3 compute what version 2 computes, op for op in the version 2 engine's order (Gemma
1's residuals are products with ACC; Gemma 2-3's go through their post norm with ACC). A Gemma 4
MoE layer runs its dense FFN, then its router (ROUTE) and each expert in expert order, skipped
for a block none of whose tokens chose it (SKIP) and added with its weight (WADD).
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from linker.layout import align_up
from builder.models.modelfile import (POST_NORMS, QK8_0, QK_NORM, TENSOR_ALIGN, Dims, LayerAttn, ModelFormatError,
                                      TensorSource, TensorSpec, Vocab)
from builder.models.modelfile3 import K_EQ_V, MOE, V_NORM, Model, Rope, f32, from_v2, rope_table, tensor_shapes
from builder.models import modelfile4 as mf4
from builder.models.modelfile4 import ACC, CACHE, CHAT, RULES, WTYPES, Op, OpRec, Slot

GEN_FLAGS = {1: 0, 2: POST_NORMS, 3: POST_NORMS | QK_NORM}  # Gemma 1-3: every layer's flags
FIXED_SLOTS = ("x", "xb", "q", "hb", "hb2")
PLE_SLOTS = ("x0", "pc", "pt")


def generation_of(dims: Dims | None) -> int:
    """A checkpoint's generation: Gemma 4 when it has no version 2 Dims, else by the norms."""
    if dims is None:
        return 4
    return {v: k for k, v in GEN_FLAGS.items()}[dims.flags & (POST_NORMS | QK_NORM)]


# A computed tensor made of stored ones: (version 3 tensor, first row, rows) in order, rows
# counted over its leading dimensions (an [E, r, c] tensor is E r rows of c).
Parts = list[tuple[str, int, int]]


@dataclass
class Program:
    """A compiled program: its slots (with their names), ops (weight offsets laid out), the
    tensors they read (specs, in first-read order) and the generation."""
    generation: int
    model: Model
    ropes: list[Rope]
    slots: list[Slot]
    slot_names: list[str]
    ops: list[OpRec]
    specs: list[TensorSpec]
    stored: list[TensorSpec]  # the version 3 tensors read from the source (not the rope tables)
    parts: dict[str, Parts]   # the computed tensors made of rows of stored ones

    def source(self, base: TensorSource) -> TensorSource:
        """The tensor source of this program's layout: computed tensors made here, the rest
        (by version 3's names) from base."""
        full = {s.name: s for s in self.stored}

        def chunks(spec: TensorSpec) -> Iterator[np.ndarray] | list[np.ndarray]:
            if spec.name in self.parts:
                return [np.concatenate([c.reshape(-1) for name, start, count in self.parts[spec.name]
                                        for c in rows_of(base(full[name]), start, count)])]
            if spec.name == "ones":
                return [np.ones(spec.shape, np.float32)]
            if spec.name.endswith(".rope"):
                i = int(spec.name.split(".")[1])
                return [rope_table(self.model.layers[i].head_dim, self.ropes[i])]
            return base(spec)
        return chunks


def rows_of(chunks: Iterator[np.ndarray], start: int, count: int) -> Iterator[np.ndarray]:
    """Rows start .. start + count - 1 of a tensor given as chunks of whole rows (a chunk of
    more than two dimensions: rows of its last)."""
    at = 0
    for chunk in chunks:
        chunk = chunk.reshape(-1, chunk.shape[-1])
        lo, hi = max(start - at, 0), min(start + count - at, len(chunk))
        if lo < hi:
            yield chunk[lo:hi]
        at += len(chunk)


class Compiler:
    """Emits ops into a program, naming slots and tensors; `finish` sizes the slots and lays out
    the tensors."""

    def __init__(self, m: Model, ropes: Sequence[Rope], generation: int):
        if len(ropes) != len(m.layers):
            raise ModelFormatError(f"{len(ropes)} rope settings for {len(m.layers)} layers")
        m.check()
        self.m, self.ropes, self.generation = m, list(ropes), generation
        self.catalogue = {name: (shape, self._dtype(name, dtype)) for name, shape, dtype in tensor_shapes(m)}
        self.slot_ids: dict[str, int] = {}
        self.cache: list[bool] = []
        self.ops: list[tuple[OpRec, str | None, int]] = []  # op (w unset), tensor name, byte offset in it
        self.tensors: dict[str, tuple[tuple[int, ...], str]] = {}
        self.parts: dict[str, Parts] = {}
        for name in FIXED_SLOTS + (PLE_SLOTS if m.ple_dim else ()):
            self.slot(name)

    def _dtype(self, name: str, dtype: str) -> str:
        if name == "ple_embed" and dtype == "q8_0" and self.m.ple_dim % QK8_0:
            return "f16"
        return dtype

    def slot(self, name: str, cache: bool = False) -> int:
        if name not in self.slot_ids:
            self.cache.append(cache)
            self.slot_ids[name] = len(self.cache)  # slots count from 1 (0: none)
        return self.slot_ids[name]

    def tensor(self, name: str, shape: tuple[int, ...] | None = None, dtype: str = "f32",
               parts: Parts | None = None) -> tuple[tuple[int, ...], str]:
        """A tensor the program reads (a version 3 one by name, or a computed one of shape and
        dtype, made of `parts` when given, or one already known by name); a computed vector read
        again at a greater length grows."""
        if name in self.catalogue:
            self.tensors.setdefault(name, self.catalogue[name])
        elif shape is not None:
            old = self.tensors.get(name)
            self.tensors[name] = (max(old[0], shape), dtype) if old else (shape, dtype)
            if parts is not None:
                self.parts[name] = parts
        return self.tensors[name]

    def block(self, name: str, index: int, rows: int) -> tuple[str, int]:
        """Block `index` of `rows` rows of the version 3 tensor name, as (tensor, byte offset in
        it): read in place when a block's bytes are a multiple of TENSOR_ALIGN (so every block
        starts at one), else the block as a tensor of its own, `{name}.{index}`."""
        shape, dtype = self.catalogue[name]
        size = mf4.weight_bytes((rows, shape[-1]), WTYPES[dtype])
        if size % TENSOR_ALIGN == 0:
            self.tensor(name)
            return name, index * size
        part = f"{name}.{index}"
        self.tensor(part, (rows, shape[-1]), dtype, [(name, index * rows, rows)])
        return part, 0

    def emit(self, op: Op, *slots: str | None, weight: str | None = None, offset: int = 0,
             cache: Sequence[str] = (), **fields) -> None:
        """One op: slot operands s0, s1, ... by name (None: unused; cache: the names that are
        CACHE slots), a weight (a tensor by name, at a byte offset inside it), the other fields."""
        ids = {f"s{i}": self.slot(s, s in cache) for i, s in enumerate(slots) if s is not None}
        wtype = WTYPES[self.tensors[weight][1]] if weight else 0
        self.ops.append((OpRec(int(op), **ids, **fields, wtype=int(wtype)), weight, offset))

    # ---- the ops a program is made of ----

    def embed(self, dst: str, table: str, a: float, j: int = 0, n: int | None = None) -> None:
        shape, _ = self.tensor(table)
        self.emit(Op.EMBED, dst, weight=table, n=n or shape[1], k=shape[1], j=j, a=f32(a))

    def norm(self, dst: str, src: str, weight: str, n: int, m: int = 1, acc: bool = False,
             cache: Sequence[str] = ()) -> None:
        if weight == "ones":
            self.tensor("ones", (n,))
        else:
            self.tensor(weight)
        self.emit(Op.NORM, dst, src, weight=weight, n=n, m=m, a=f32(self.m.eps), flags=ACC if acc else 0, cache=cache)

    def matmul(self, dst: str, src: str, weight: str, acc: bool = False, geglu: str | None = None,
               cache: Sequence[str] = (), block: tuple[int, int] | None = None) -> None:
        """dst (+)= W src; geglu: then geglu = gelu(geglu) * dst; block (index, rows): W is that
        block of the weight's rows (Compiler.block)."""
        name, offset = self.block(weight, *block) if block else (weight, 0)
        shape, _ = self.tensor(name)
        extra = (geglu,) if geglu else ()
        self.emit(Op.MATMUL, dst, src, *extra, weight=name, offset=offset, n=shape[-1], m=block[1] if block else shape[0],
                  flags=ACC if acc else 0, cache=cache)

    def residual(self, weight: str, src: str, post_norm: str | None) -> None:
        """x += W src, through post_norm when given (then via hb2)."""
        if post_norm is None:
            self.matmul("x", src, weight, acc=True)
        else:
            self.matmul("hb2", src, weight)
            self.norm("x", "hb2", post_norm, self.m.dim, acc=True)

    def ffn(self, i: int, post: bool) -> None:
        """The dense FFN, its output added to x (through post_ffn_norm when post); with experts
        (MOE), the experts' block after it (`experts`)."""
        p = f"layers.{i}."
        self.norm("xb", "x", p + "ffn_norm", self.m.dim)
        self.matmul("hb", "xb", p + "gate")
        self.matmul("hb2", "xb", p + "up", geglu="hb")
        if self.m.layers[i].flags & MOE:
            self.matmul("hb2", "hb", p + "down")
            self.experts(i)
        else:
            self.residual(p + "down", "hb", p + "post_ffn_norm" if post else None)

    def experts(self, i: int) -> None:
        """Gemma 4's MoE block, the dense FFN's output in hb2: x += n(n(hb2, post_ffn_norm_1) +
        n(sum of the chosen experts' GEGLU FFNs on n(x, ffn_norm_2), each times its weight,
        post_ffn_norm_2), post_ffn_norm); the weights from the router on n(x) router_scale
        d^-0.5 (ROUTE), the experts summed in expert order, each skipped for a block where no
        token chose it."""
        m, p, d, n = self.m, f"layers.{i}.", self.m.dim, self.m.experts
        self.norm("mm", "hb2", p + "post_ffn_norm_1", d)
        self.norm("r", "x", p + "router_scale", d)
        self.emit(Op.SCALE, "r", n=d, a=f32(d ** -0.5))
        self.tensor(p + "route", (n * d + n,), "f32", [(p + "router", 0, n), (p + "expert_scale", 0, 1)])
        self.emit(Op.ROUTE, "wts", "r", weight=p + "route", n=n, m=d, k=m.top_k)
        self.norm("h2", "x", p + "ffn_norm_2", d)
        self.emit(Op.SCALE, "m2", n=d, a=0.0)
        for e in range(n):
            with self.unless_zero("wts", n, e):
                self.matmul("hb", "h2", p + "experts_gate_up", block=(2 * e, m.expert_ffn))
                self.matmul("hb2", "h2", p + "experts_gate_up", geglu="hb", block=(2 * e + 1, m.expert_ffn))
                self.matmul("y", "hb", p + "experts_down", block=(e, d))
                self.emit(Op.WADD, "m2", "y", "wts", n=d, m=n, j=e)
        self.norm("mm", "m2", p + "post_ffn_norm_2", d, acc=True)
        self.norm("x", "mm", p + "post_ffn_norm", d, acc=True)

    @contextmanager
    def unless_zero(self, slot: str, n: int, j: int) -> Iterator[None]:
        """The ops emitted inside are skipped for a block whose column j of slot (n wide) is 0
        in every token's row: a SKIP over them."""
        at = len(self.ops)
        self.emit(Op.SKIP, slot, n=n, j=j)
        yield
        o, _, _ = self.ops[at]
        self.ops[at] = (dataclasses.replace(o, k=len(self.ops) - at - 1), None, 0)

    def rope(self, i: int, k_slot: str | None) -> None:
        layer = self.m.layers[i]
        hd = layer.head_dim
        self.tensor(f"layers.{i}.rope", (hd // 2,))
        self.emit(Op.ROPE, "q", k_slot or "q", weight=f"layers.{i}.rope", n=hd, m=self.m.heads,
                  k=layer.kv_heads if k_slot else 0, cache=(k_slot,) if k_slot else ())

    def attn(self, i: int) -> None:
        layer = self.m.layers[i]
        src = layer.kv_source
        kv = (f"K{src}", f"V{src}")
        self.emit(Op.ATTN, "xb", "q", *kv, n=layer.head_dim, m=self.m.heads, k=layer.kv_heads, j=layer.window,
                  a=f32(layer.att_scale), c=f32(self.m.att_softcap), cache=kv)

    def final(self) -> None:
        self.norm("xb", "x", "final_norm", self.m.dim)
        shape, _ = self.tensor("embed")
        self.emit(Op.LOGITS, None, "xb", weight="embed", n=shape[1], c=f32(self.m.final_softcap))

    def finish(self) -> Program:
        ops = [o for o, _, _ in self.ops]
        widths = [0] * (len(self.cache) + 1)
        for o in ops:
            for f, width, _ in RULES[Op(o.op)].slots(o):
                widths[getattr(o, f)] = max(widths[getattr(o, f)], width)
        widths = widths[1:]
        unused = [n for n, i in self.slot_ids.items() if not widths[i - 1]]
        if unused:
            raise ModelFormatError(f"slot {unused[0]} is never used")
        if len(widths) > mf4.MAX_SLOTS:
            raise ModelFormatError(f"the program needs {len(widths)} slots, at most {mf4.MAX_SLOTS} fit "
                                   f"(each layer with its own K/V takes two)")
        specs = mf4.layout([(name, shape, dtype) for name, (shape, dtype) in self.tensors.items()])
        at = {s.name: s.offset for s in specs}
        ops = [dataclasses.replace(o, w=at[t] + off) if t else o for o, t, off in self.ops]
        slots = [Slot(w, CACHE if c else 0) for w, c in zip(widths, self.cache)]
        read = [n for n in self.tensors if n in self.catalogue and not n.endswith(".rope")]
        read += [n for parts in self.parts.values() for n, _, _ in parts]
        stored = [TensorSpec(n, 0, *self.catalogue[n]) for n in dict.fromkeys(read)]
        return Program(self.generation, self.m, self.ropes, slots, list(self.slot_ids), ops, specs, stored,
                       self.parts)


# ---- the programs, by generation --------------------------------------------------------------

def _gemma_1_3(c: Compiler) -> None:
    """Gemma 1, 2, 3: every layer alike but its window and rope; post norms (2, 3), q/k norms (3)."""
    m, g = c.m, c.generation
    for i, layer in enumerate(m.layers):
        if layer.flags != GEN_FLAGS[g] or layer.kv_source != i or layer.layer_scalar != 1:
            raise ModelFormatError(f"layer {i} is not a Gemma {g} layer (flags {layer.flags:#x}, "
                                   f"reads layer {layer.kv_source}'s cache, scalar {layer.layer_scalar})")
    if m.ple_dim or m.experts:
        raise ModelFormatError(f"Gemma {g} has neither per-layer inputs nor experts")
    post, qk = bool(GEN_FLAGS[g] & POST_NORMS), bool(GEN_FLAGS[g] & QK_NORM)
    c.embed("x", "embed", math.sqrt(m.dim))
    for i, layer in enumerate(m.layers):
        p, hd, kv = f"layers.{i}.", layer.head_dim, layer.kv_heads
        ks, vs = f"K{i}", f"V{i}"
        c.norm("xb", "x", p + "attn_norm", m.dim)
        c.matmul("q", "xb", p + "wq")
        c.matmul(ks, "xb", p + "wk", cache=[ks])
        c.matmul(vs, "xb", p + "wv", cache=[vs])
        if qk:
            c.norm("q", "q", p + "q_norm", hd, m.heads)
            c.norm(ks, ks, p + "k_norm", hd, kv, cache=[ks])
        c.rope(i, ks)
        c.attn(i)
        c.residual(p + "wo", "xb", p + "post_attn_norm" if post else None)
        c.ffn(i, post)
    c.final()


def gemma1(c: Compiler) -> None:
    """Gemma 1: no post norms, residuals added inside the products (ACC)."""
    _gemma_1_3(c)


def gemma2(c: Compiler) -> None:
    """Gemma 2: each block's output through its post norm, added by the norm (ACC)."""
    _gemma_1_3(c)


def gemma3(c: Compiler) -> None:
    """Gemma 3: Gemma 2 with per-head q/k norms before RoPE."""
    _gemma_1_3(c)


def gemma4(c: Compiler) -> None:
    """Gemma 4: per-layer head_dim, kv heads and FFN; KV sharing; k = v; value norms;
    per-layer inputs; layer scalars; norms holding w; attention scale 1; experts (MoE)."""
    m = c.m
    d, p = m.dim, m.ple_dim
    c.embed("x", "embed", math.sqrt(d))
    if p:
        c.embed("x0", "embed", math.sqrt(d))
    for i, layer in enumerate(m.layers):
        if layer.flags & (POST_NORMS | QK_NORM) != POST_NORMS | QK_NORM:
            raise ModelFormatError(f"layer {i}: a Gemma 4 layer has post norms and q/k norms")
        pre, hd, kv, own = f"layers.{i}.", layer.head_dim, layer.kv_heads, layer.kv_source == i
        ks, vs = f"K{i}", f"V{i}"
        c.norm("xb", "x", pre + "attn_norm", d)
        c.matmul("q", "xb", pre + "wq")
        if own:
            c.matmul(ks, "xb", pre + "wk", cache=[ks])
            if not layer.flags & K_EQ_V:
                c.matmul(vs, "xb", pre + "wv", cache=[vs])
        c.norm("q", "q", pre + "q_norm", hd, m.heads)
        if own:
            if layer.flags & V_NORM:
                c.norm(vs, ks if layer.flags & K_EQ_V else vs, "ones", hd, kv, cache=[ks, vs])
            elif layer.flags & K_EQ_V:
                raise ModelFormatError(f"layer {i}: k = v without the value norm is not a Gemma 4 layer")
            c.norm(ks, ks, pre + "k_norm", hd, kv, cache=[ks])
        c.rope(i, ks if own else None)
        c.attn(i)
        c.residual(pre + "wo", "xb", pre + "post_attn_norm")
        c.ffn(i, post=True)
        if p:
            c.matmul("pc", "x0", "ple_proj", block=(i, p))
            c.emit(Op.SCALE, "pc", n=p, a=f32(d ** -0.5))
            c.norm("pc", "pc", "ple_norm", p)
            c.embed("pt", "ple_embed", math.sqrt(p), j=i * p, n=p)
            c.emit(Op.ADD, "pc", "pt", n=p)
            c.emit(Op.SCALE, "pc", n=p, a=f32(2 ** -0.5))
            c.matmul("pt", "x", pre + "ple_gate")
            c.emit(Op.GEGLU, "pt", "pc", n=p)
            c.residual(pre + "ple_out", "pt", pre + "ple_post_norm")
        if layer.layer_scalar != 1:
            c.emit(Op.SCALE, "x", n=d, a=f32(layer.layer_scalar))
    c.final()


GENERATIONS: dict[int, Callable[[Compiler], None]] = {1: gemma1, 2: gemma2, 3: gemma3, 4: gemma4}


def compile_program(m: Model, ropes: Sequence[Rope], generation: int) -> Program:
    """The program of a model of a generation (1 .. 4); ModelFormatError when the model is not
    one the generation's builder compiles."""
    if generation not in GENERATIONS:
        raise ModelFormatError(f"generation {generation} is not 1 .. 4")
    c = Compiler(m, ropes, generation)
    GENERATIONS[generation](c)
    return c.finish()


def make_header(prog: Program, vocab: Vocab) -> tuple[mf4.Header, bytes]:
    """The header and the sections before the weights of prog's file, with its generation's
    chat strings (modelfile4.make_header: every rule checked)."""
    last = prog.specs[-1]
    return mf4.make_header(vocab, prog.model.vocab, prog.model.max_ctx, prog.generation, prog.slots, prog.ops,
                           CHAT[prog.generation], align_up(last.offset + last.nbytes, TENSOR_ALIGN))


def write(path: Path, prog: Program, vocab: Vocab, source: TensorSource, progress: bool = True,
          names: dict[str, str] | None = None) -> mf4.Header:
    """Write prog as a version 4 file (tensors from source by version 3's names), then check
    that each chat string tokenizes with the file's own tokenizer back to its bytes
    (ModelFormatError, the file removed, if not)."""
    header, front = make_header(prog, vocab)
    mf4.write_model(path, header, front, prog.specs, prog.source(source), progress, names)
    from builder.twins.tokenizer import Tokenizer
    from builder.models.modelfile3 import check_ranks
    written = mf4.ModelFile4(path)
    try:
        check_ranks(written)
    except ModelFormatError:
        Path(path).unlink()
        raise
    tok = Tokenizer(written)
    for name, s in zip(mf4.STRINGS, CHAT[prog.generation]):
        ids = tok.encode(s)[1:]
        if b"".join(tok.decode_piece(i) or tok.pieces[i] for i in ids) != s:
            Path(path).unlink()
            raise ModelFormatError(f"chat string {name} {s!r} does not tokenize back to itself with the file's tokenizer")
    return header


def write_dims(path: Path, dims: Dims, vocab: Vocab, source: TensorSource, progress: bool = True,
               attn: Sequence[LayerAttn] | None = None) -> mf4.Header:
    """A Gemma 1-3 model given in version 2's terms (Dims, one LayerAttn per layer: default full
    attention, theta 10000, no scaling; tensors by version 2's names, which version 3 keeps)
    written as version 4: what tests and tools that make their own models use."""
    attn = list(attn) if attn is not None else [LayerAttn()] * dims.layers
    model, ropes = from_v2(dims, attn)
    return write(path, compile_program(model, ropes, generation_of(dims)), vocab, source, progress)
