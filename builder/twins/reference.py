"""The Gemma (1, 2, 3 and 4) forward pass in numpy float32, read from an engine model file of
version 2 or 3: the twin the engine is tested against (docs/format.md, "What the file
computes" and "What a version 3 file computes"; proven against the fixtures' recorded
transformers logits by emu_tests/twins/test_reference.py). Everything it needs comes from the
file, never from a model's name: a version 2 file is read as its version 3 description
(`describe`), so one loop runs every layer from its record -- flags (post norms, q/k norms,
value norm, k = v, MoE), head_dim, kv heads, FFN width, window, the cache it reads, attention
scale, layer_scalar -- and its RoPE table, plus the header's per-layer inputs, experts and
soft-caps.

    ref = Reference(open_model(path))
    logits = ref.forward(token, pos)          # positions 0, 1, 2, ... in order (KV cache)
    prompt_logits, steps, tokens = ref.generate(ids, n)   # greedy

Weights are the file's FP16 values widened to float32, or its Q8_0 blocks' values d q
(modelfile.dequantize_q8_0, exact in float32); every activation and sum is float32.
RoPE follows transformers in float32: angle = float32(p) * inv_freq (the layer's `rope`
tensor), then cos / sin (half-split pairing).
"""
from __future__ import annotations

import math

import numpy as np

from builder.models.modelfile import (POST_NORMS, QK_NORM, LayerAttn, ModelFile, TensorSpec, dequantize_q8_0,
                                      tensor_layout)
from builder.models.modelfile3 import K_EQ_V, MOE, V_NORM, ModelFile3, from_v2
from builder.models.modelfile3 import Model as Model3

F32 = np.float32
WIDEN_LIMIT = 1 << 28  # bytes of FP16 weights up to which they are widened up front


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w, where w already holds 1 + weight."""
    return x / np.sqrt(np.mean(x * x, dtype=F32) + F32(eps)) * w


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    return F32(0.5) * z * (F32(1) + np.tanh(F32(np.sqrt(2 / np.pi)) * (z + F32(0.044715) * z * z * z)))


def matvec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W (d,n) @ x (n,) -> (d,) in float32; an FP16 (or Q8Rows) W is widened a block of rows
    at a time."""
    step = max(1, (1 << 22) // w.shape[1])
    return np.concatenate([np.asarray(w[i:i + step], F32) @ x for i in range(0, w.shape[0], step)])


def softcap(x: np.ndarray, c: float) -> np.ndarray:
    """c tanh(x / c) in float32 (transformers' order); c = 0: x unchanged."""
    return np.tanh(x / F32(c)) * F32(c) if c else x


def rope(x: np.ndarray, pos: int, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate every head (rows of x: [heads, hd]) by position pos, half-split pairing."""
    a = F32(pos) * inv_freq
    cos, sin = np.cos(a), np.sin(a)
    half = x.shape[1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)


def route(s: np.ndarray, k: int, scale: np.ndarray) -> np.ndarray:
    """Each expert's weight from the router's logits s: softmax over every expert, the k
    largest (ties: the lower index) renormalised to sum 1 and multiplied by scale; 0 for every
    other expert."""
    p = np.exp(s - s.max())
    p = p / p.sum()
    top = np.argsort(-p, kind="stable")[:k]
    w = np.zeros_like(p)
    w[top] = p[top] / p[top].sum() * scale[top]
    return w


class Q8Rows:
    """A Q8_0 matrix left in the file (its blocks), dequantized a slice of rows at a time:
    what matvec and the embedding lookup index, for a model too big to widen up front."""

    def __init__(self, blocks: np.ndarray, cols: int):
        self.blocks, self.shape = blocks, (blocks.shape[0], cols)

    def __getitem__(self, rows: int | slice) -> np.ndarray:
        if isinstance(rows, slice):
            return dequantize_q8_0(self.blocks[rows], self.shape[1])
        return dequantize_q8_0(self.blocks[rows:rows + 1], self.shape[1])[0]


Model = ModelFile | ModelFile3


def describe(model: Model) -> tuple[Model3, list[TensorSpec], tuple[float, float, float]]:
    """A file of either version in version 3's terms: the Model (globals and layer records),
    the tensors, and the header's embed_scale, ple_scale and dim_rsqrt (a version 2 file is
    Gemma 1-3: no per-layer inputs, no router: its dim_rsqrt is unused)."""
    if isinstance(model, ModelFile3):
        h = model.header
        return model.model, model.specs, (h.embed_scale, h.ple_scale, h.dim_rsqrt)
    windows = [int(model.tensor(f"layers.{i}.window")[0]) for i in range(model.dims.layers)]
    m3, _ = from_v2(model.dims, [LayerAttn(w) for w in windows])
    return m3, tensor_layout(model.header), (model.header.embed_scale, 0.0, 0.0)


class Reference:
    def __init__(self, model: Model):
        self.model = model
        self.m3, specs, scales = describe(model)
        self.scale, self.ple_scale, self.dim_rsqrt = (F32(s) for s in scales)
        # Small models are widened to float32 once (Q8_0 matrices: d q); big ones (2b: 10 GB
        # as float32) stay views of the file, widened a block of rows at a time by matvec.
        # Matrices are 2-D (an expert tensor [E, r, c] as E r rows of c).
        small = sum(s.nbytes for s in specs) <= WIDEN_LIMIT
        shapes = {s.name: s for s in specs}

        def get(name: str) -> np.ndarray | Q8Rows:
            s = shapes[name]
            if s.dtype == "q8_0" and not small:
                return Q8Rows(model.raw(name).reshape(math.prod(s.shape[:-1]), -1), s.shape[-1])
            t = model.tensor(name)
            t = t.reshape(-1, s.shape[-1]) if len(s.shape) > 2 else t
            return t.astype(F32) if small or s.dtype == "f32" else t
        self.embed = get("embed")
        self.globals = {n: get(n) for n in ("ple_embed", "ple_proj", "ple_norm") if n in shapes}
        self.layers = [{} for _ in self.m3.layers]
        for s in specs:
            if s.name.startswith("layers."):
                _, i, what = s.name.split(".")
                self.layers[int(i)][what] = get(s.name)
        self.final_norm = get("final_norm")
        self.reset()

    def reset(self) -> None:
        m = self.m3
        self.k_cache = [np.zeros((m.max_ctx, l.kv_heads, l.head_dim), F32) if l.kv_source == i else None
                        for i, l in enumerate(m.layers)]
        self.v_cache = [None if k is None else np.zeros_like(k) for k in self.k_cache]
        self.pos = 0

    def per_layer_inputs(self, token: int, x: np.ndarray) -> np.ndarray:
        """Gemma 4's per-layer inputs [layers, P]: (n(W_plm x0 dim_rsqrt, ple_norm) + E_ple[token]
        ple_scale) 2^-0.5, x0 the scaled embedding."""
        m, g = self.m3, self.globals
        tok = np.asarray(g["ple_embed"][token], F32).reshape(len(m.layers), m.ple_dim) * self.ple_scale
        ctx = (matvec(g["ple_proj"], x) * self.dim_rsqrt).reshape(len(m.layers), m.ple_dim)
        ctx = np.stack([rmsnorm(r, g["ple_norm"], m.eps) for r in ctx])
        return (ctx + tok) * F32(2 ** -0.5)

    def experts(self, w: dict, x: np.ndarray) -> np.ndarray:
        """The MoE block's output from the stream x (before its post norm): the router on
        n(x) router_scale dim_rsqrt, softmax over every expert, the top_k renormalised and
        scaled by expert_scale (`route`), each chosen expert's GELU FFN on n(x, ffn_norm_2),
        times its weight, summed in expert order (as transformers' loop over experts; a weight
        of 0, an expert_scale of 0, adds nothing)."""
        m = self.m3
        r = rmsnorm(x, F32(1), m.eps) * w["router_scale"] * self.dim_rsqrt
        weight = route(matvec(w["router"], r), m.top_k, w["expert_scale"])
        h = rmsnorm(x, w["ffn_norm_2"], m.eps)
        out = np.zeros_like(x)
        n, d = m.expert_ffn, m.dim
        for e in np.flatnonzero(weight):
            gu = matvec(w["experts_gate_up"][e * 2 * n:(e + 1) * 2 * n], h)
            out = out + matvec(w["experts_down"][e * d:(e + 1) * d], gelu_tanh(gu[:n]) * gu[n:]) * weight[e]
        return out

    def forward(self, token: int, pos: int, logits: bool = True) -> np.ndarray | None:
        """Logits [vocab] after feeding token at position pos (must be the next position);
        with logits=False only the cache is filled (no product with the vocabulary) and None
        is returned."""
        m = self.m3
        if pos != self.pos or not 0 <= pos < m.max_ctx or not 0 <= token < m.vocab:
            raise ValueError(f"forward(token={token}, pos={pos}): expected pos {self.pos}, token < {m.vocab}")
        x = self.embed[token].astype(F32) * self.scale
        ple = self.per_layer_inputs(token, x) if m.ple_dim else None
        for i, (layer, w) in enumerate(zip(m.layers, self.layers)):
            hd, kv = layer.head_dim, layer.kv_heads
            flag = layer.flags.__and__
            h = rmsnorm(x, w["attn_norm"], m.eps)
            q = matvec(w["wq"], h).reshape(m.heads, hd)
            if flag(QK_NORM):
                q = np.stack([rmsnorm(r, w["q_norm"], m.eps) for r in q])
            if layer.kv_source == i:
                raw = matvec(w["wk"], h).reshape(kv, hd)
                v = raw if flag(K_EQ_V) else matvec(w["wv"], h).reshape(kv, hd)
                k = np.stack([rmsnorm(r, w["k_norm"], m.eps) for r in raw]) if flag(QK_NORM) else raw
                self.k_cache[i][pos] = rope(k, pos, w["rope"])
                self.v_cache[i][pos] = np.stack([rmsnorm(r, F32(1), m.eps) for r in v]) if flag(V_NORM) else v
            q = rope(q, pos, w["rope"])
            start = max(0, pos + 1 - layer.window) if layer.window else 0  # attends start .. pos
            keys = self.k_cache[layer.kv_source][start:pos + 1]  # [t, K, hd]
            values = self.v_cache[layer.kv_source][start:pos + 1]
            out = np.empty((m.heads, hd), F32)
            group = m.heads // kv
            for j in range(m.heads):
                scores = softcap((keys[:, j // group] @ q[j]) * F32(layer.att_scale), m.att_softcap)
                p = np.exp(scores - scores.max())
                out[j] = (p / p.sum()) @ values[:, j // group]
            o = matvec(w["wo"], out.reshape(-1))
            x = x + (rmsnorm(o, w["post_attn_norm"], m.eps) if flag(POST_NORMS) else o)
            h = rmsnorm(x, w["ffn_norm"], m.eps)
            o = matvec(w["down"], gelu_tanh(matvec(w["gate"], h)) * matvec(w["up"], h))
            if flag(MOE):
                o = rmsnorm(o, w["post_ffn_norm_1"], m.eps) + rmsnorm(self.experts(w, x), w["post_ffn_norm_2"], m.eps)
            x = x + (rmsnorm(o, w["post_ffn_norm"], m.eps) if flag(POST_NORMS) else o)
            if ple is not None:
                g = gelu_tanh(matvec(w["ple_gate"], x)) * ple[i]
                x = x + rmsnorm(matvec(w["ple_out"], g), w["ple_post_norm"], m.eps)
            if layer.layer_scalar != 1:
                x = x * F32(layer.layer_scalar)
        self.pos += 1
        if not logits:
            return None
        return softcap(matvec(self.embed, rmsnorm(x, self.final_norm, m.eps)), m.final_softcap)

    def generate(self, ids: list[int], steps: int, feed: list[int] | None = None,
                 prompt_rows: bool = True):
        """Run the prompt, then `steps` greedy steps from the start of the cache.

        Returns (prompt_logits [len(ids), vocab], step_logits [steps, vocab], tokens): step k's
        logits choose token k (row 0 is the last prompt row); the token fed back after step k
        is feed[k] when given (to follow a recorded sequence), else the argmax. With
        prompt_rows=False, prompt_logits is the last prompt row only ([1, vocab]): a long
        prompt of a big vocabulary then costs its layers only.
        """
        self.reset()
        last = len(ids) - 1
        prompt = np.stack([r for p, t in enumerate(ids)
                           if (r := self.forward(t, p, prompt_rows or p == last)) is not None])
        logits, rows, tokens = prompt[-1], [], []
        for k in range(steps):
            rows.append(logits)
            tokens.append(int(np.argmax(logits)))
            if k + 1 < steps:
                logits = self.forward(feed[k] if feed is not None else tokens[-1], len(ids) + k)
        return prompt, np.stack(rows), tokens
