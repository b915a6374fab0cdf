"""The Gemma (v1) forward pass in numpy float32, read from an engine model file: the twin the
engine is tested against (GEMMA.md, "Forward pass"; proven against the fixtures' recorded
transformers logits by emu_tests/test_reference.py).

    ref = Reference(ModelFile(path))
    logits = ref.forward(token, pos)          # positions 0, 1, 2, ... in order (KV cache)
    prompt_logits, steps, tokens = ref.generate(ids, n)   # greedy

Weights are the file's FP16 values widened to float32; every activation and sum is float32.
RoPE follows transformers in float32: inv_freq = 1 / theta ** (arange(0, hd, 2) / hd),
angle = float32(p) * inv_freq, then cos / sin (half-split pairing).
"""
from __future__ import annotations

import numpy as np

from builder.modelfile import LAYER_TENSORS, ModelFile

F32 = np.float32
WIDEN_LIMIT = 1 << 28  # bytes of FP16 weights up to which they are widened up front


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w, where w already holds 1 + weight."""
    return x / np.sqrt(np.mean(x * x, dtype=F32) + F32(eps)) * w


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    return F32(0.5) * z * (F32(1) + np.tanh(F32(np.sqrt(2 / np.pi)) * (z + F32(0.044715) * z * z * z)))


def matvec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W (d,n) @ x (n,) -> (d,) in float32; an FP16 W is widened a block of rows at a time."""
    step = max(1, (1 << 22) // w.shape[1])
    return np.concatenate([np.asarray(w[i:i + step], F32) @ x for i in range(0, w.shape[0], step)])


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    return F32(1) / (F32(theta) ** (np.arange(0, head_dim, 2, dtype=F32) / F32(head_dim)))


def rope(x: np.ndarray, pos: int, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate every head (rows of x: [heads, hd]) by position pos, half-split pairing."""
    a = F32(pos) * inv_freq
    cos, sin = np.cos(a), np.sin(a)
    half = x.shape[1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)


class Reference:
    def __init__(self, model: ModelFile):
        self.model, d = model, model.dims
        self.dims, self.scale = d, F32(model.header.embed_scale)
        # Small models are widened to float32 once; big ones (2b: 10 GB as float32) stay FP16
        # views of the file, widened a block of rows at a time by matvec.
        small = model.header.weights_size <= WIDEN_LIMIT
        get = (lambda name: model.tensor(name).astype(F32)) if small else model.tensor
        self.embed = get("embed")
        self.layers = [{name: get(f"layers.{i}.{name}") for name in LAYER_TENSORS} for i in range(d.layers)]
        self.final_norm = get("final_norm")
        self.inv_freq = rope_inv_freq(d.head_dim, d.rope_theta)
        self.reset()

    def reset(self) -> None:
        d = self.dims
        self.k_cache = np.zeros((d.layers, d.max_ctx, d.kv_heads, d.head_dim), F32)
        self.v_cache = np.zeros_like(self.k_cache)
        self.pos = 0

    def forward(self, token: int, pos: int) -> np.ndarray:
        """Logits [vocab] after feeding token at position pos (must be the next position)."""
        d = self.dims
        if pos != self.pos or not 0 <= pos < d.max_ctx or not 0 <= token < d.vocab:
            raise ValueError(f"forward(token={token}, pos={pos}): expected pos {self.pos}, token < {d.vocab}")
        group, hd = d.heads // d.kv_heads, d.head_dim
        x = self.embed[token].astype(F32) * self.scale
        for i, w in enumerate(self.layers):
            h = rmsnorm(x, w["attn_norm"], d.eps)
            q = rope(matvec(w["wq"], h).reshape(d.heads, hd), pos, self.inv_freq)
            self.k_cache[i, pos] = rope(matvec(w["wk"], h).reshape(d.kv_heads, hd), pos, self.inv_freq)
            self.v_cache[i, pos] = matvec(w["wv"], h).reshape(d.kv_heads, hd)
            keys, values = self.k_cache[i, :pos + 1], self.v_cache[i, :pos + 1]  # [t, K, hd]
            out = np.empty((d.heads, hd), F32)
            for j in range(d.heads):
                kv = j // group
                scores = (keys[:, kv] @ q[j]) / F32(np.sqrt(hd))
                p = np.exp(scores - scores.max())
                out[j] = (p / p.sum()) @ values[:, kv]
            x = x + matvec(w["wo"], out.reshape(-1))
            h = rmsnorm(x, w["ffn_norm"], d.eps)
            x = x + matvec(w["down"], gelu_tanh(matvec(w["gate"], h)) * matvec(w["up"], h))
        self.pos += 1
        return matvec(self.embed, rmsnorm(x, self.final_norm, d.eps))

    def generate(self, ids: list[int], steps: int, feed: list[int] | None = None):
        """Run the prompt, then `steps` greedy steps from the start of the cache.

        Returns (prompt_logits [len(ids), vocab], step_logits [steps, vocab], tokens): step k's
        logits choose token k (row 0 is the last prompt row); the token fed back after step k
        is feed[k] when given (to follow a recorded sequence), else the argmax.
        """
        self.reset()
        prompt = np.stack([self.forward(t, p) for p, t in enumerate(ids)])
        logits, rows, tokens = prompt[-1], [], []
        for k in range(steps):
            rows.append(logits)
            tokens.append(int(np.argmax(logits)))
            if k + 1 < steps:
                logits = self.forward(feed[k] if feed is not None else tokens[-1], len(ids) + k)
        return prompt, np.stack(rows), tokens
