"""Conversation mode (`gemma -cnv`, asm/chat.asm; issue 45) on the real binary.

Exactness: a conversation's `--logits` rows equal, bit for bit, those of one `-p` run over the
same ids, on each kernel path this host runs natively (AVX-512: the default here, `--avx2`,
`--baseline`). The conversation's ids are derived by chat_twin.Template.converse from the
model file's strings, the twin tokenizer and the replies: greedy, the argmax of each row;
seeded (`--temp 1 -s N`), chat_twin.Sampler on each row, its state running on across turns.
Its stdout must be the replies' pieces, each reply followed by one newline; the transcript
(strings, turns, reply pieces) must tokenize (`--tokens`) to exactly those ids, and its `-p
... -n 0` run must give the same row count and identical rows. The cases were chosen where the
transcript tokenizes back to the conversation's ids: a random fixture's replies are runs of
odd pieces that a second tokenization often merges (tiny_g3 and tiny_g4k answer greedily
with newline byte pieces, which `\\n\\n` swallows), so each case asserts what it covers:
- ALIGNED: a system prompt, the first turn from -p, -n chosen so that the second turn starts
  at position 64 (a prompt block's boundary of the -p run), and a third turn of more than 64
  ids starting inside a block; every reply ended by -n (its last id fed first next turn).
- STOPS: the first turn from stdin; the header's eot and eos ids edited (as test_engine_cli
  does) to ids the greedy replies pick, so that reply 2 ends by EOT and reply 3 by EOS
  (the ids: the first of each reply not picked before, found by running the conversation);
  the random fixtures almost never pick their own ids 1 and 5.
- SEEDED: `--temp 1 -s N`: reproducible (two runs, the same bits), and exact.
Fixtures: tiny_mqa (Gemma 1, MQA), tiny_wide (Gemma 1, heads x head_dim != d), tiny_g2
(window 5), tiny_g3 (window 6), tiny_g4 (window 6, its template's strings as plain text in
tok_a), tiny_g4k (window 7): every conversation here runs past every window.

Input cases (issue 45's table) on tiny_mqa, against the conversation the same turns give
clean: trimming, empty lines, CRLF, `\\` continuation, end of input mid-line, NUL bytes, a turn
of 2^24 bytes, turns that do not fit the context, the context filling during a reply, usage
errors, -sys as given, a closed stdout, and the `> ` marker when stdin is a terminal.
"""
from __future__ import annotations

import os
import pty
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.models.modelfile4 import BLOCK, HEADER_FIELDS
from emu_tests.engine.chat_twin import Conversation, Run, Sampler, Template, run
from modelfiles import convert_fixture

PATHS = {"default": (), "avx2": ("--avx2",), "baseline": ("--baseline",)}
OFFSET = {name: (off, code) for name, off, code in HEADER_FIELDS}
LONG = (b"Tell me a story about a small robot who learns to paint the sea at night, with waves "
        b"of silver light and boats that sleep in the harbour, and say why it matters to the "
        b"robot.")                                # more than 64 ids in every fixture
USAGE = b"gemma: -cnv: no --tokens, -n 0 or -f -\n"
TOO_LONG = b"gemma: prompt too long\n"
NUL = b"gemma: NUL byte in the prompt\n"
FULL = b"gemma: context full (-c)\n"


@dataclass(frozen=True)
class Case:
    """A conversation: the fixture, -sys, the first turn by -p (None: from stdin), the lines
    on stdin, -n (None: BLOCK + 1 - the first turn's ids, so the second turn starts at 64),
    the sampler's --temp, --top-p and -s (None: greedy), the header's eot and eos edits (0: none), and what
    ends each reply."""
    model: str
    sys: bytes | None
    first: bytes | None
    lines: tuple[bytes, ...]
    n: int | None
    sampling: tuple[float, float, int] | None
    stops: tuple[int, int]
    ends: tuple[str, ...]


def aligned(model: str, sys: bytes, first: bytes, second: bytes, seed: int | None = None) -> Case:
    return Case(model, sys, first, (second, LONG), None, seed if seed is None else (1.0, 1.0, seed),
                (0, 0), ("n", "n", "n"))


def stops(model: str, first: bytes, second: bytes, eot: int, eos: int, ends: str) -> Case:
    return Case(model, None, None, (first, second, b"Where is it?", b"Bye."), 8, None,
                (eot, eos), tuple(ends.split()))


def seeded(model: str, seed: int, temp: float = 1.0, top_p: float = 1.0) -> Case:
    return Case(model, None, b"Hello there, how are you?",
                (b"What is the capital of France?", b"And of Italy?"), 6, (temp, top_p, seed),
                (0, 0), ("n", "n", "n"))


CASES = {
    "mqa-aligned": aligned("tiny_mqa", b"Be kind", b"Good morning", b"And of Italy?"),
    "wide-aligned": aligned("tiny_wide", b"You are a helpful assistant.",
                            b"Hello there, how are you?", b"And of Italy?"),
    "g2-aligned": aligned("tiny_g2", b"You are a helpful assistant.",
                          b"Hello there, how are you?", b"And of Italy?"),
    "g3-aligned": aligned("tiny_g3", b"Speak French.", b"Hi!", b"Why?"),
    "g4-aligned": aligned("tiny_g4", b"Answer briefly.", b"Hi!", b"And of Italy?"),
    "g4k-aligned-seeded": aligned("tiny_g4k", b"Be kind", b"Hi!", b"Why?", seed=12),
    "mqa-stops": stops("tiny_mqa", b"Hi!", b"And of Italy?", 1004, 617, "n eot eos n"),
    "wide-stops": stops("tiny_wide", b"Hello there, how are you?", b"Thanks!", 1202, 427,
                        "n eot eos n"),
    "g2-stops": stops("tiny_g2", b"Hello there, how are you?", b"Why?", 1900, 1747,
                      "n eot eos n"),
    "g3-stops": stops("tiny_g3", b"Good morning", b"Why?", 236, 25, "n eot eos eos"),
    "g4-stops": stops("tiny_g4", b"Hello there, how are you?", b"And of Italy?", 1225, 39,
                      "n eot eos eot"),
    **{f"{m.removeprefix('tiny_')}-seeded": seeded(m, 5)
       for m in ("tiny_mqa", "tiny_wide", "tiny_g2", "tiny_g3", "tiny_g4", "tiny_g4k")},
    "g2-seeded-top-p": seeded("tiny_g2", 5, 0.7, 0.9),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Factory: the converted fixture `name`, its header's eot / eos edited when nonzero."""
    out = tmp_path_factory.getbasetemp()

    def model(name: str, eot: int = 0, eos: int = 0) -> Path:
        path = convert_fixture(name, "hf", out)
        if not (eot or eos):
            return path
        data = bytearray(path.read_bytes())
        for field, value in (("eot", eot), ("eos", eos)):
            if value:
                off, code = OFFSET[field]
                struct.pack_into("<" + code, data, off, value)
        edited = out / f"{name}-eot{eot}-eos{eos}.bin"
        edited.write_bytes(data)
        return edited
    return model


def lines(*turns: bytes) -> bytes:
    return b"".join(t + b"\n" for t in turns)


def chat(gemma, model: Path, args, stdin: bytes, template: Template, keep: bool = False,
         timeout: float = 120) -> Run:
    return run(gemma.binary, model, ["-cnv", *args], stdin, template.vocab, keep, timeout)


def check_exact(gemma, model: Path, template: Template, r: Run, c: Conversation, path,
                label: str) -> None:
    """The conversation's run `r` against its derived ids `c`: the rows, the replies on stdout,
    the transcript's ids, and one -p run's rows, bit for bit."""
    assert (r.status, r.stderr) == (0, b""), f"{label}: exit {r.status}, {r.stderr!r}"
    assert len(r.digests) == len(c.ids), (
        f"{label}: {len(r.digests)} logits rows, the derived conversation has {len(c.ids)} ids")
    want = b"".join(template.decode(reply) + b"\n" for reply in c.replies)
    assert r.stdout == want, f"{label}: stdout {r.stdout!r}, the replies {want!r}"
    assert b"\0" not in c.text, f"{label}: a NUL byte in the transcript: choose another case"
    tokens = run(gemma.binary, model, ["-p", c.text, "--tokens"])
    assert [int(t) for t in tokens.stdout.split()] == c.ids, (
        f"{label}: the transcript does not tokenize to the conversation's ids: choose another "
        f"case")
    one = run(gemma.binary, model, ["-p", c.text, "-n", 0, *path], b"", template.vocab)
    assert (one.status, one.stderr) == (0, b""), f"{label}: -p run: {one.stderr!r}"
    assert len(one.digests) == len(r.digests), (
        f"{label}: -p gives {len(one.digests)} rows, the conversation {len(r.digests)}")
    bad = [i for i, (a, b) in enumerate(zip(r.digests, one.digests)) if a != b]
    assert not bad, (f"{label}: {len(bad)} of {len(r.digests)} rows differ from the -p run's; "
                     f"first at position {bad[0]} (turns start at {c.starts})")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CASES)
def test_conversation_equals_one_prompt(gemma, models, name, path):
    case = CASES[name]
    model = models(case.model, *case.stops)
    t = Template(model)
    turns = ([case.first] if case.first is not None else []) + list(case.lines)
    n = case.n or BLOCK + 1 - len(t.tok.encode(t.turn(0, turns[0], case.sys)))
    args = ["-n", n, *PATHS[path]]
    args += ["-sys", case.sys] if case.sys is not None else []
    args += ["-p", case.first] if case.first is not None else []
    if case.sampling is not None:
        temp, top_p, seed = case.sampling
        args += ["--temp", temp, "--top-p", top_p, "-s", seed]
    stdin = lines(*case.lines)
    r = chat(gemma, model, args, stdin, t, keep=case.sampling is not None)
    if case.sampling is None:
        c = t.converse(turns, case.sys, n, lambda pos: r.tops[pos])
    else:
        sampler = Sampler(*case.sampling)
        c = t.converse(turns, case.sys, n, lambda pos: sampler(r.rows[pos]))
        again = chat(gemma, model, args, stdin, t)
        assert (again.stdout, again.digests) == (r.stdout, r.digests), f"{name}: not reproducible"
    check_exact(gemma, model, t, r, c, PATHS[path], f"{name} {path}")
    assert tuple(c.ends) == case.ends, f"{name} {path}: replies ended by {c.ends}"
    if case.n is None:              # the second turn at a block's start, the third inside one
        third = len(t.tok.encode(t.turn(2, LONG, None)))     # its ids (BOS: the -n id's place)
        assert c.starts[1] == BLOCK and c.starts[2] % BLOCK and third > BLOCK, (
            f"{name} {path}: turns start at {c.starts}, the third has {third} ids")
