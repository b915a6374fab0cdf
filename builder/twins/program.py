"""A numpy interpreter of a version 4 model file's program (builder.models.modelfile4): the twin
of the engine's interpreter, op by op as docs/format.md ("Version 4") defines each, in float32.

    run = Interpreter(ModelFile4(path))
    logits = run.block(ids, pos, rows)        # one block of B <= BLOCK tokens at positions pos ..
    prompt_logits, steps, tokens = run.generate(ids, n, cuts=(5, 9))   # greedy, blocks cut there

Slots are flat float32 buffers (a plain slot BLOCK rows, a CACHE slot `ctx` rows of its width),
numbered from 1 as the ops name them (operand 0: none); an operand of width w sees its slot as
rows of w floats (token t: row t, or pos + t in a CACHE slot), as the engine does. An op reads
only its own fields (MATMUL's GEGLU gate is on when s2 names a slot; a ROPE with k = 0 leaves
s1 alone). The arithmetic is builder.twins.reference's (rmsnorm, gelu_tanh, rope, softcap,
matvec, route), one token at a time, so a token's numbers do not depend on how a prompt is cut
into blocks (a SKIP, the one op that looks at a whole block, skips only ops whose every token's
result would be dropped: WADD adds nothing for a weight of 0); it is held against that
description-driven reference and the recorded transformers logits by
emu_tests/twins/test_program.py. Weights: FP16 widened to float32, Q8_0
as d q (exact); a weight over WIDEN_LIMIT bytes stays in the file, widened rows at a time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from builder.models.modelfile import Q8_0_BLOCK, QK8_0
from builder.models.modelfile4 import ACC, BLOCK, CACHE, ModelFile4, Op, OpRec, WType, weight_bytes
from builder.twins.reference import Q8Rows, gelu_tanh, matvec, rmsnorm, rope, route, softcap

F32 = np.float32
WIDEN_LIMIT = 1 << 26  # bytes of a weight up to which it is widened to float32 once


class Interpreter:
    def __init__(self, model: ModelFile4, ctx: int | None = None):
        self.model = model
        self.ctx = ctx or model.header.max_ctx
        if not 1 <= self.ctx <= model.header.max_ctx:
            raise ValueError(f"ctx {self.ctx} is not 1 .. {model.header.max_ctx}")
        self._weights: dict[tuple[int, int, tuple[int, ...]], np.ndarray | Q8Rows] = {}
        self.reset()

    def reset(self) -> None:
        """Empty slots (zeros) and caches: the next block starts at position 0."""
        self.slots = [np.zeros((self.ctx if s.flags & CACHE else BLOCK) * s.width, F32) for s in self.model.slots]
        self.pos = 0

    def weight(self, o: OpRec) -> np.ndarray | Q8Rows:
        """The op's weight as float32 rows (a big FP16 one as its view, a big Q8_0 one as Q8Rows)."""
        key = (o.w, o.wtype, self.model.weight_shape(o))
        if key not in self._weights:
            shape = key[2]
            if weight_bytes(shape, o.wtype) <= WIDEN_LIMIT or o.wtype == WType.F32:
                w = self.model.weight(o)
            elif o.wtype == WType.Q8_0:
                w = Q8Rows(self.model.raw_weight(o).reshape(shape[0], shape[1] // QK8_0 * Q8_0_BLOCK), shape[1])
            else:
                w = self.model.raw_weight(o).view("<f2").reshape(shape)
            self._weights[key] = w
        return self._weights[key]

    def rows(self, s: int, width: int, pos: int, count: int) -> np.ndarray:
        """Slot s as rows of `width` floats: the block's `count` rows (from pos in a CACHE slot),
        a view that writes through."""
        first = pos if self.model.slots[s - 1].flags & CACHE else 0
        return self.slots[s - 1][first * width:(first + count) * width].reshape(count, width)

    def block(self, ids: Sequence[int], pos: int, rows: Sequence[int] = ()) -> np.ndarray:
        """Run the program on tokens ids (1 .. BLOCK of them) at positions pos ..; returns the
        logits of the block's tokens numbered in rows ([len(rows), vocab])."""
        h, b = self.model.header, len(ids)
        if pos != self.pos or not 1 <= b <= BLOCK or pos + b > self.ctx or not all(0 <= t < h.vocab for t in ids):
            raise ValueError(f"block of {b} tokens at {pos}: expected position {self.pos}, 1 .. {BLOCK} tokens "
                             f"< {h.vocab}, within ctx {self.ctx}")
        out = np.zeros((len(rows), h.vocab), F32)
        ops, i = self.model.ops, 0
        while i < len(ops):
            i += 1 + self.op(ops[i], ids, pos, rows, out)
        self.pos += b
        return out

    def op(self, o: OpRec, ids: Sequence[int], pos: int, rows: Sequence[int], out: np.ndarray) -> int:
        """Run op o on the block; returns how many of the ops after it are skipped (SKIP)."""
        b, op = len(ids), Op(o.op)
        if op == Op.EMBED:
            dst, table = self.rows(o.s0, o.n, pos, b), self.weight(o)
            for t, i in enumerate(ids):
                dst[t] = np.asarray(table[i], F32)[o.j:o.j + o.n] * F32(o.a)
        elif op == Op.NORM:
            dst, src, w = self.rows(o.s0, o.n * o.m, pos, b), self.rows(o.s1, o.n * o.m, pos, b), self.weight(o)
            y = np.stack([np.concatenate([rmsnorm(g, w, o.a) for g in x.reshape(o.m, o.n)]) for x in src])
            dst[:] = dst + y if o.flags & ACC else y
        elif op == Op.MATMUL:
            dst, src, w = self.rows(o.s0, o.m, pos, b), self.rows(o.s1, o.n, pos, b), self.weight(o)
            y = np.stack([matvec(w, x) for x in src])
            dst[:] = dst + y if o.flags & ACC else y
            if o.s2:
                gate = self.rows(o.s2, o.m, pos, b)
                gate[:] = gelu_tanh(gate) * dst
        elif op == Op.ROPE:
            w = self.weight(o)
            for s, heads in ((o.s0, o.m), (o.s1, o.k)):
                if heads:
                    x = self.rows(s, o.n * heads, pos, b)
                    for t in range(b):
                        x[t] = rope(x[t].reshape(heads, o.n), pos + t, w).reshape(-1)
        elif op == Op.ATTN:
            self.attn(o, pos, b)
        elif op == Op.GEGLU:
            dst, src = self.rows(o.s0, o.n, pos, b), self.rows(o.s1, o.n, pos, b)
            dst[:] = gelu_tanh(dst) * src
        elif op == Op.SCALE:
            dst = self.rows(o.s0, o.n, pos, b)
            dst[:] = dst * F32(o.a)
        elif op == Op.ADD:
            dst = self.rows(o.s0, o.n, pos, b)
            dst[:] = dst + self.rows(o.s1, o.n, pos, b)
        elif op == Op.LOGITS:
            src, w = self.rows(o.s1, o.n, pos, b), self.weight(o)
            for r, t in enumerate(rows):
                out[r] = softcap(matvec(w, src[t]), o.c)
        elif op == Op.ROUTE:
            dst, src, w = self.rows(o.s0, o.n, pos, b), self.rows(o.s1, o.m, pos, b), self.weight(o)
            router, scale = w[:o.n * o.m].reshape(o.n, o.m), w[o.n * o.m:]
            for t in range(b):
                dst[t] = route(matvec(router, src[t]), o.k, scale)
        elif op == Op.SKIP:
            return 0 if self.rows(o.s0, o.n, pos, b)[:, o.j].any() else o.k
        elif op == Op.WADD:
            dst, src, wts = self.rows(o.s0, o.n, pos, b), self.rows(o.s1, o.n, pos, b), self.rows(o.s2, o.m, pos, b)
            for t in range(b):
                if wts[t, o.j] != 0:
                    dst[t] = dst[t] + wts[t, o.j] * src[t]
        return 0

    def attn(self, o: OpRec, pos: int, b: int) -> None:
        """Each query head h of token t over the cached positions of its kv head h / (m / k):
        scores q . k * a, soft-capped by c, softmax, the weighted sum of the values."""
        n, m, k = o.n, o.m, o.k
        dst, q = self.rows(o.s0, n * m, pos, b), self.rows(o.s1, n * m, pos, b)
        keys = self.slots[o.s2 - 1][:self.ctx * n * k].reshape(self.ctx, k, n)
        values = self.slots[o.s3 - 1][:self.ctx * n * k].reshape(self.ctx, k, n)
        group = m // k
        for t in range(b):
            p = pos + t
            start = max(0, p + 1 - o.j) if o.j else 0
            qt = q[t].reshape(m, n)
            res = np.empty((m, n), F32)
            for h in range(m):
                scores = softcap((keys[start:p + 1, h // group] @ qt[h]) * F32(o.a), o.c)
                e = np.exp(scores - scores.max())
                res[h] = (e / e.sum()) @ values[start:p + 1, h // group]
            dst[t] = res.reshape(-1)

    def prompt(self, ids: Sequence[int], cuts: Sequence[int] = (), all_rows: bool = True) -> np.ndarray:
        """Run a prompt from position 0 in blocks that end at each of `cuts` (and every BLOCK
        tokens); the logits of every position (all_rows) or of the last one only."""
        self.reset()
        ends = sorted({c for c in cuts if 0 < c < len(ids)} | {len(ids)})
        out, start = [], 0
        for end in ends:
            while start < end:
                stop = min(end, start + BLOCK)
                want = range(stop - start) if all_rows else [stop - start - 1] if stop == len(ids) else []
                out.append(self.block(ids[start:stop], start, list(want)))
                start = stop
        return np.concatenate(out)

    def generate(self, ids: Sequence[int], steps: int, feed: Sequence[int] | None = None, cuts: Sequence[int] = (),
                 prompt_rows: bool = True):
        """As reference.Reference.generate: (prompt logits, step logits, greedy tokens), the
        prompt in blocks cut at `cuts`, each step a block of one token."""
        prompt = self.prompt(ids, cuts, prompt_rows)
        logits, rows, tokens = prompt[-1], [], []
        for s in range(steps):
            rows.append(logits)
            tokens.append(int(np.argmax(logits)))
            if s + 1 < steps:
                logits = self.block([feed[s] if feed is not None else tokens[-1]], len(ids) + s, [0])[0]
        return prompt, np.stack(rows), tokens

