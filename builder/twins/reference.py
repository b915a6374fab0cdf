"""The Gemma (1, 2 and 3) forward pass in numpy float32, read from an engine model file: the
twin the engine is tested against (docs/format.md, "What the file computes"; proven against
the fixtures' recorded transformers logits by emu_tests/twins/test_reference.py). Everything it needs comes from the file:
the header's flags (post norms, q/k norms), attention scale and soft-caps, and each layer's
window and RoPE frequencies.

    ref = Reference(ModelFile(path))
    logits = ref.forward(token, pos)          # positions 0, 1, 2, ... in order (KV cache)
    prompt_logits, steps, tokens = ref.generate(ids, n)   # greedy

Weights are the file's FP16 values widened to float32, or its Q8_0 blocks' values d q
(modelfile.dequantize_q8_0, exact in float32); every activation and sum is float32.
RoPE follows transformers in float32: angle = float32(p) * inv_freq (the layer's `rope`
tensor), then cos / sin (half-split pairing).
"""
from __future__ import annotations

import numpy as np

from builder.models.modelfile import POST_NORMS, QK_NORM, ModelFile, dequantize_q8_0, tensor_layout, tensor_shapes

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


class Q8Rows:
    """A Q8_0 matrix left in the file (its blocks), dequantized a slice of rows at a time:
    what matvec and the embedding lookup index, for a model too big to widen up front."""

    def __init__(self, blocks: np.ndarray, cols: int):
        self.blocks, self.shape = blocks, (blocks.shape[0], cols)

    def __getitem__(self, rows: int | slice) -> np.ndarray:
        if isinstance(rows, slice):
            return dequantize_q8_0(self.blocks[rows], self.shape[1])
        return dequantize_q8_0(self.blocks[rows:rows + 1], self.shape[1])[0]


class Reference:
    def __init__(self, model: ModelFile):
        self.model, d = model, model.dims
        self.dims, self.scale = d, F32(model.header.embed_scale)
        # Small models are widened to float32 once (Q8_0 matrices: d q); big ones (2b: 10 GB
        # as float32) stay views of the file, widened a block of rows at a time by matvec.
        small = model.header.weights_size <= WIDEN_LIMIT
        q8 = {s.name: s.shape for s in tensor_layout(model.header) if s.dtype == "q8_0"}

        def get(name: str) -> np.ndarray | Q8Rows:
            if small:
                return model.tensor(name).astype(F32)
            if name in q8:
                return Q8Rows(model.raw(name).reshape(q8[name][0], -1), q8[name][1])
            return model.tensor(name)
        self.embed = get("embed")
        self.layers = [{} for _ in range(d.layers)]
        for name, _, _ in tensor_shapes(d)[1:-1]:
            _, i, what = name.split(".")
            self.layers[int(i)][what] = model.tensor(name) if what in ("window", "rope") else get(name)
        self.final_norm = get("final_norm")
        self.reset()

    def reset(self) -> None:
        d = self.dims
        self.k_cache = np.zeros((d.layers, d.max_ctx, d.kv_heads, d.head_dim), F32)
        self.v_cache = np.zeros_like(self.k_cache)
        self.pos = 0

    def forward(self, token: int, pos: int, logits: bool = True) -> np.ndarray | None:
        """Logits [vocab] after feeding token at position pos (must be the next position);
        with logits=False only the cache is filled (no product with the vocabulary) and None
        is returned."""
        d = self.dims
        if pos != self.pos or not 0 <= pos < d.max_ctx or not 0 <= token < d.vocab:
            raise ValueError(f"forward(token={token}, pos={pos}): expected pos {self.pos}, token < {d.vocab}")
        group, hd = d.heads // d.kv_heads, d.head_dim
        post = bool(d.flags & POST_NORMS)
        x = self.embed[token].astype(F32) * self.scale
        for i, w in enumerate(self.layers):
            h = rmsnorm(x, w["attn_norm"], d.eps)
            q = matvec(w["wq"], h).reshape(d.heads, hd)
            k = matvec(w["wk"], h).reshape(d.kv_heads, hd)
            if d.flags & QK_NORM:
                q = np.stack([rmsnorm(r, w["q_norm"], d.eps) for r in q])
                k = np.stack([rmsnorm(r, w["k_norm"], d.eps) for r in k])
            self.k_cache[i, pos] = rope(k, pos, w["rope"])
            self.v_cache[i, pos] = matvec(w["wv"], h).reshape(d.kv_heads, hd)
            q = rope(q, pos, w["rope"])
            window = int(w["window"][0])
            start = max(0, pos + 1 - window) if window else 0  # attends start .. pos
            keys, values = self.k_cache[i, start:pos + 1], self.v_cache[i, start:pos + 1]  # [t, K, hd]
            out = np.empty((d.heads, hd), F32)
            for j in range(d.heads):
                kv = j // group
                scores = softcap((keys[:, kv] @ q[j]) * F32(d.att_scale), d.att_softcap)
                p = np.exp(scores - scores.max())
                out[j] = (p / p.sum()) @ values[:, kv]
            o = matvec(w["wo"], out.reshape(-1))
            x = x + (rmsnorm(o, w["post_attn_norm"], d.eps) if post else o)
            h = rmsnorm(x, w["ffn_norm"], d.eps)
            o = matvec(w["down"], gelu_tanh(matvec(w["gate"], h)) * matvec(w["up"], h))
            x = x + (rmsnorm(o, w["post_ffn_norm"], d.eps) if post else o)
        self.pos += 1
        if not logits:
            return None
        return softcap(matvec(self.embed, rmsnorm(x, self.final_norm, d.eps)), d.final_softcap)

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
