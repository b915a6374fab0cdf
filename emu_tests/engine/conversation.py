"""What a conversation (`gemma -cnv`, asm/chat.asm) feeds the model, derived in Python, and the
engine run that shows it: the helpers of the conversation tests (test_engine_chat, and the
real model's test_real_chat).

`Template(model)`: the model file's chat strings, the twin tokenizer (builder.twins.tokenizer)
and its eot and eos ids; `template.converse(turns, sys, n, choose)` walks a conversation as the
engine holds it, turn by turn, with the conversation twin (builder.twins.chat: `feed` gives the
ids the engine forwards, `render` the transcript's text): `choose(position)` is the id sampled
from the `--logits` row of that position (greedy: the row's argmax; seeded: `Sampler`); a reply
ends on the EOT or EOS id (neither printed nor fed) or after n ids (the n-th printed, then fed
first in the next turn). The result's `text` is what was fed after BOS as one `-p` text: the
strings, the turns and the reply ids' pieces.

`Sampler(temp, top_p, seed)`: the twin of asm/sample.asm (the nucleus found by bisection on
the float bits of tau, float32 sums in id order, Knuth's MMIX LCG). The weights e^((l - max)/T)
are float64's rounded to float32 where the engine rounds its x87 value: they agree but where
the exact weight lies within ~2^-50 of a float32 rounding boundary; a draw differs only where
one of those weights is in the sum that decides it. The tests hold the ids it gives against
the engine's bits (one `-p` run over them), so a difference could not pass unseen.

`run(binary, model, args, stdin, vocab)`: the engine with `--logits` on a pipe
(/dev/fd/N), read as it comes: each row's SHA-256 and argmax (and the rows themselves with
keep=True), so the real model's 1 MiB rows need no file.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from builder.models.modelfile4 import ModelFile4
from builder.twins.chat import feed, render, trim, turn_strings
from builder.twins.tokenizer import Tokenizer

F32 = np.float32
LCG_A = 6364136223846793005                # Knuth's MMIX, c = 1 (asm/sample.asm)
MASK64 = (1 << 64) - 1


@dataclass
class Run:
    """An engine run: its status, stdout and stderr, and each --logits row's SHA-256 digest
    and argmax (the first largest), the rows themselves when kept (float32 [rows, vocab])."""
    status: int
    stdout: bytes
    stderr: bytes
    digests: list[bytes] = field(default_factory=list)
    tops: list[int] = field(default_factory=list)
    rows: np.ndarray | None = None


def run(binary: Path, model: Path, args: Sequence, stdin: bytes = b"", vocab: int = 0,
        keep: bool = False, timeout: float = 120) -> Run:
    """`binary -m model ARGS` with `stdin` as its standard input; with vocab > 0 also
    `--logits /dev/fd/N`, a pipe read row by row (vocab float32 each)."""
    argv = [str(binary), "-m", str(model)] + [a if isinstance(a, bytes) else str(a) for a in args]
    r_fd, w_fd = os.pipe() if vocab else (-1, -1)
    if vocab:
        argv += ["--logits", f"/dev/fd/{w_fd}"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(w_fd,) if vocab else ())
    out: dict[str, tuple[bytes, bytes]] = {}

    def talk() -> None:                     # (a run over its time is killed: its pipe ends)
        try:
            out["io"] = proc.communicate(stdin, timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    talker = threading.Thread(target=talk)
    talker.start()
    result = Run(0, b"", b"")
    kept = []
    if vocab:
        os.close(w_fd)
        with os.fdopen(r_fd, "rb") as f:
            while chunk := f.read(vocab * 4):
                assert len(chunk) == vocab * 4, f"a partial logits row ({len(chunk)} bytes)"
                row = np.frombuffer(chunk, F32)
                result.digests.append(hashlib.sha256(chunk).digest())
                result.tops.append(int(np.argmax(row)))
                if keep:
                    kept.append(row)
    talker.join()
    assert "io" in out, f"{argv[3:]}: no exit within {timeout} s"
    result.stdout, result.stderr = out["io"]
    result.status = proc.returncode
    if keep:
        result.rows = np.array(kept).reshape(-1, vocab)
    return result


class Sampler:
    """asm/sample.asm in numpy: the id sample() returns for a logits row, its LCG state running
    on from call to call."""

    def __init__(self, temp: float, top_p: float, seed: int):
        self.temp, self.top_p, self.state = temp, F32(top_p), seed & MASK64

    def __call__(self, row: np.ndarray) -> int:
        top = int(np.argmax(row))
        if self.temp == 0:
            return top
        w = np.exp((row.astype(np.float64) - float(row[top])) / self.temp).astype(F32)

        def nucleus(tau: np.float32) -> tuple[np.ndarray, np.ndarray]:
            ids = np.flatnonzero(w >= tau)
            return ids, np.cumsum(w[ids], dtype=F32)      # float32, one addition at a time

        need = F32(nucleus(F32(0))[1][-1] * self.top_p)
        lo, hi = 0, 0x3F800001                            # tau's bits: enough / never enough
        while True:
            mid = (lo + hi) >> 1
            ids, sums = nucleus(np.uint32(mid).view(F32))
            if mid == lo:
                break
            lo, hi = (mid, hi) if sums[-1] >= need else (lo, mid)
        self.state = (self.state * LCG_A + 1) & MASK64
        limit = F32(F32(self.state >> 40) * F32(2.0 ** -24) * sums[-1])
        reached = np.flatnonzero(sums >= limit)
        return int(ids[reached[0]]) if reached.size else top


@dataclass
class Conversation:
    """What a conversation fed: `ids` (every id, in position order), `starts` (each kept turn's
    first position) and `turn_ids` (its ids: the last reply's final id after -n, then the turn's
    own), `replies` (each reply's printed ids), `ends` (what ended each: "eot", "eos" or "n"),
    `text` (the transcript as one -p text; its tokenization should be `ids`)."""
    ids: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    replies: list[list[int]] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    text: bytes = b""


class Template:
    """A model file's chat strings, tokenizer and stop ids, and the conversation twin
    (builder.twins.chat) over them."""

    def __init__(self, model: Path):
        mf = ModelFile4(model)
        self.strings, self.tok = mf.strings, Tokenizer(mf)
        self.eos, self.eot, self.vocab = mf.header.eos, mf.header.eot, mf.header.vocab

    def first_ids(self, turn: bytes, sys: bytes | None) -> int:
        """How many ids the first turn feeds (BOS first)."""
        return len(self.tok.encode(turn_strings(self.strings, sys, [turn])[0]))

    def decode(self, ids: list[int]) -> bytes:
        return self.tok.decode(ids)

    def converse(self, turns: Sequence[bytes], sys: bytes | None, n: int,
                 choose: Callable[[int], int]) -> Conversation:
        """The conversation of `turns` (as typed: trimmed, empty ones skipped) with replies of
        at most n ids, `choose(position)` giving the id sampled after that position."""
        kept = [t for t in map(trim, turns) if t]
        c, replies = Conversation(), []
        for k in range(len(kept)):
            before = len(feed(self.tok, self.strings, sys, kept[:k], replies, self.eot,
                              self.eos)) if k else 0
            pos = len(feed(self.tok, self.strings, sys, kept[:k + 1], replies, self.eot,
                           self.eos)) - 1
            c.starts.append(before)
            c.turn_ids.append(pos + 1 - before)
            sampled = [choose(pos)]
            while sampled[-1] not in (self.eot, self.eos) and len(sampled) < n:
                pos += 1
                sampled.append(choose(pos))
            end = {self.eot: "eot", self.eos: "eos"}.get(sampled[-1], "n")
            replies.append((sampled, end))
            c.replies.append(sampled if end == "n" else sampled[:-1])
            c.ends.append(end)
        c.ids = feed(self.tok, self.strings, sys, kept, replies, self.eot, self.eos)
        fed = c.replies[:-1] + [c.replies[-1][:-1] if c.ends[-1] == "n" else c.replies[-1]]
        c.text = render(self.strings, sys, kept, [self.decode(r) for r in fed])
        return c
