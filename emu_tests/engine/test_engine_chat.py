"""Conversation mode (`gemma -cnv`, asm/chat.asm; docs/chat.md) on the real binary.

Exactness: a conversation's `--logits` rows equal, bit for bit, those of one `-p` run over the
same ids, on each kernel path this host runs natively (AVX-512: the default here, `--avx2`,
`--baseline`). The conversation's ids are derived by conversation.Template.converse from the
model file's strings, the twin tokenizer and the replies: greedy, the argmax of each row;
seeded (`--temp 1 -s N`), conversation.Sampler on each row, its state running on across turns.
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
tok_a), tiny_g4k (window 7): every conversation here runs past every window. And synth's
Gemma 4 model (tiny-g4-dense), whose vocabulary has the template's <|turn> and <turn|> as
control pieces: it converses in its own template.

Input cases (docs/chat.md's) on tiny_mqa, against the conversation the same turns give
clean: trimming, empty lines, CRLF, `\\` continuation, end of input mid-line, NUL bytes, a turn
of 2^24 bytes, turns that do not fit the context, the context filling during a reply, usage
errors (-cnv with --tokens, -n 0 or -f -), -sys as given, a closed stdout, and the `> ` marker when stdin
is a terminal.
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
from builder.models.synth import synth
from builder.models.synth4 import PRESETS4
from emu_tests.engine.conversation import Conversation, Run, Sampler, Template, run
from modelfiles import convert_fixture

PATHS = {"default": (), "avx2": ("--avx2",), "baseline": ("--baseline",)}
OFFSET = {name: (off, code) for name, off, code in HEADER_FIELDS}
LONG = (b"Tell me a story about a small robot who learns to paint the sea at night, with waves "
        b"of silver light and boats that sleep in the harbour, and say why it matters to the "
        b"robot.")                                # more than 64 ids in every fixture
USAGE = b"gemma: -cnv: no --tokens, -n 0 or -f -\n"
TOO_LONG = b"gemma: prompt too long\n"
NUL = b"gemma: NUL in prompt\n"


def context_full(position: int) -> bytes:
    """The notice of a context full at `position` (= -c)."""
    return b"gemma: context full (-c) at %d\n" % position


@dataclass(frozen=True)
class Case:
    """A conversation: the fixture, -sys, the first turn by -p (None: from stdin), the lines
    on stdin, -n (None: BLOCK + 1 - the first turn's ids, so the second turn starts at 64),
    the sampler's --temp, --top-p and -s (None: greedy), the header's eot and eos edits (0:
    none), and what ends each reply."""
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


def edited(model: Path, out: Path, eot: int, eos: int) -> Path:
    """A copy of `model` at `out` with its header's eot and eos ids changed."""
    data = bytearray(model.read_bytes())
    for name, value in (("eot", eot), ("eos", eos)):
        off, code = OFFSET[name]
        struct.pack_into("<" + code, data, off, value)
    out.write_bytes(data)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Factory: the converted fixture `name` (or the synth preset), its header's eot / eos
    edited when nonzero."""
    out = tmp_path_factory.getbasetemp()

    def model(name: str, eot: int = 0, eos: int = 0) -> Path:
        if name in PRESETS4:
            path = out / f"{name}.bin"
            if not path.exists():
                synth(name, path, progress=False)
        else:
            path = convert_fixture(name, "hf", out)
        if not (eot or eos):
            return path
        return edited(path, out / f"{name}-eot{eot}-eos{eos}.bin", eot, eos)
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


def converse_exactly(gemma, model: Path, case: Case, path: str, label: str,
                     again: bool = True) -> Conversation:
    """`case`'s conversation on `model` by kernel path `path`: its ids derived (the argmax of
    each row, or Sampler), held to one -p run (check_exact) and to case.ends; run twice when
    seeded and `again` (the same bits)."""
    t = Template(model)
    turns = ([case.first] if case.first is not None else []) + list(case.lines)
    n = case.n or BLOCK + 1 - t.first_ids(turns[0], case.sys)
    args = ["-n", n, *PATHS[path]]
    args += ["-sys", case.sys] if case.sys is not None else []
    args += ["-p", case.first] if case.first is not None else []
    if case.sampling is not None:
        temp, top_p, seed = case.sampling
        args += ["--temp", temp, "--top-p", top_p, "-s", seed]
    stdin = lines(*case.lines)
    r = chat(gemma, model, args, stdin, t, keep=case.sampling is not None)
    sampler = Sampler(*case.sampling) if case.sampling is not None else None

    def choose(pos: int) -> int:
        assert pos < len(r.digests), (f"{label}: {len(r.digests)} logits rows, the conversation "
                                      f"samples after position {pos} (exit {r.status}, "
                                      f"{r.stderr!r})")
        return r.tops[pos] if sampler is None else sampler(r.rows[pos])
    c = t.converse(turns, case.sys, n, choose)
    if sampler is not None and again:
        second = chat(gemma, model, args, stdin, t)
        assert (second.stdout, second.digests) == (r.stdout, r.digests), (
            f"{label}: a second run differs")
    check_exact(gemma, model, t, r, c, PATHS[path], label)
    assert tuple(c.ends) == case.ends, f"{label}: replies ended by {c.ends}"
    return c


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CASES)
def test_conversation_equals_one_prompt(gemma, models, name, path):
    case = CASES[name]
    model = models(case.model, *case.stops)
    c = converse_exactly(gemma, model, case, path, f"{name} {path}")
    if case.n is None:              # the second turn at a block's start, the third inside one
        assert c.starts[1] == BLOCK and c.starts[2] % BLOCK and c.turn_ids[2] > BLOCK, (
            f"{name} {path}: turns start at {c.starts} with {c.turn_ids} ids")


@pytest.mark.parametrize("path", PATHS)
def test_gemma4_synth_converses_in_its_template(gemma, models, path):
    """synth's Gemma 4 model (tiny-g4-dense: <|turn> 105 and <turn|> 106 are control pieces,
    <turn|> the header's eot) with a system prompt, four turns from stdin, replies of 2 ids;
    its transcript holds both control pieces."""
    model = models("tiny-g4-dense")
    case = Case("tiny-g4-dense", b"You are a helpful assistant.", None,
                (b"Hello there, how are you?", b"And of Italy?", b"Thanks!", b"Bye."), 2, None,
                (0, 0), ("n",) * 4)
    c = converse_exactly(gemma, model, case, path, f"synth tiny-g4-dense {path}")
    assert {105, 106} <= set(c.ids) and Template(model).eot == 106


# ---- input cases (tiny_mqa, greedy) ---------------------------------------------------------

N = 4                                       # ids per reply in the input cases


@pytest.fixture(scope="module")
def mqa(models) -> tuple[Path, Template]:
    model = models("tiny_mqa")
    return model, Template(model)


def same_run(got: Run, want: Run, label: str) -> None:
    """Two conversations that must be one: the same status, stdout, stderr and rows."""
    assert (got.status, got.stderr) == (want.status, want.stderr), (
        f"{label}: exit {got.status}, {got.stderr!r}; expected {want.status}, {want.stderr!r}")
    assert got.stdout == want.stdout, f"{label}: stdout {got.stdout!r}, expected {want.stdout!r}"
    assert got.digests == want.digests, (
        f"{label}: {len(got.digests)} logits rows, expected {len(want.digests)}, or they differ")


@pytest.mark.parametrize("first,raw,clean_first,clean", [
    # surrounding ASCII whitespace trimmed, whitespace-only and empty lines skipped
    (None, b"  Hi there \t\n\n \t\v\f\r\n\x0bAnd you?\x0c\n", None,
     lines(b"Hi there", b"And you?")),
    (None, b"Hi there\r\nAnd you?\r\n", None, lines(b"Hi there", b"And you?")),       # CRLF
    (None, b"Hi there\nAnd you?", None, lines(b"Hi there", b"And you?")),   # no last newline
    (None, b"Hi\\\nthere\nAnd you?\n", b"Hi\nthere", lines(b"And you?")),  # '\' continues
    (None, b"Hi\\\r\n\\\r\nthere\r\nAnd you?\r\n", b"Hi\n\nthere", lines(b"And you?")),
    (None, b"\n \nHi\\", b"Hi\\", b""),   # a '\' at the end of input is the turn's own
    (b"  \n Hi there\t", lines(b"And you?"), b"Hi there", lines(b"And you?")),  # -p trimmed
    (b" \t\n", lines(b"Hi there"), None, lines(b"Hi there")),  # -p empty: stdin's is first
    (None, b"", None, None), (None, b"\n\n \t \r\n", None, None),  # no turn: no output
])
def test_turns_as_typed_equal_the_clean_turns(gemma, mqa, first, raw, clean_first, clean):
    """Each input (-p FIRST, stdin RAW) gives the conversation of its clean turns: the same
    replies and rows; without any turn, nothing at all (exit 0)."""
    model, t = mqa
    got = chat(gemma, model, ["-n", N, *(["-p", first] if first is not None else [])], raw, t)
    if clean is None:
        assert (got.status, got.stdout, got.stderr, got.digests) == (0, b"", b"", []), got
        return
    want = chat(gemma, model, ["-n", N, *(["-p", clean_first] if clean_first else [])], clean,
                t)
    assert (want.status, want.stderr) == (0, b"") and want.stdout
    same_run(got, want, repr(raw))


def test_user_typed_control_pieces_and_invalid_utf8_as_p_takes_them(gemma, mqa):
    """Turns holding a piece of the template (<start_of_turn>, a user-defined piece of tok_a)
    and invalid UTF-8: the conversation equals one -p run over the ids they tokenize to."""
    model, t = mqa
    turns = [b"\xff\xfe<start_of_turn>model Hi \xc3", b"<end_of_turn> \x80ok"]
    r = chat(gemma, model, ["-n", N], lines(*turns), t)
    c = t.converse(turns, None, N, lambda pos: r.tops[pos])
    check_exact(gemma, model, t, r, c, (), "control pieces and invalid UTF-8")


def test_system_prompt_is_placed_as_given(gemma, mqa):
    """-sys TEXT goes between SYS_BEGIN and SYS_END untrimmed (only turns are trimmed), with
    the first turn from stdin; the trimmed text would give other ids."""
    model, t = mqa
    sys = b" Be kind\n"
    turns = [b"Hello there", b"Why?"]
    r = chat(gemma, model, ["-n", N, "-sys", sys], lines(*turns), t)
    c = t.converse(turns, sys, N, lambda pos: r.tops[pos])
    check_exact(gemma, model, t, r, c, (), "-sys")
    assert t.first_ids(turns[0], sys) != t.first_ids(turns[0], sys.strip())


def test_first_turn_from_a_file(gemma, mqa, tmp_path):
    """-f FILE is the first turn as -p is (its one final newline dropped, then trimmed)."""
    model, t = mqa
    (tmp_path / "turn.txt").write_bytes(b"Hi there\n")
    got = chat(gemma, model, ["-n", N, "-f", tmp_path / "turn.txt"], lines(b"And you?"), t)
    want = chat(gemma, model, ["-n", N, "-p", b"Hi there"], lines(b"And you?"), t)
    same_run(got, want, "-f")


@pytest.mark.parametrize("args", [["--tokens"], ["-n", 0], ["-f", "-"]])
def test_usage_errors(gemma, args, tmp_path):
    """--tokens, -n 0 and -f - with -cnv, before or after it: one line, exit 2, before the
    model is read (it does not exist here), nothing on stdout."""
    for first in ([], args):
        argv = [gemma.binary, *first, "-m", tmp_path / "none.bin", "-cnv", *([] if first else args)]
        r = subprocess.run([str(a) for a in argv], input=b"Hi\n", capture_output=True, timeout=30)
        assert (r.returncode, r.stdout, r.stderr) == (2, b"", USAGE), args


def test_what_stays_allowed_with_cnv(gemma, mqa, tmp_path):
    """The cases next to the usage errors still converse: -n 1, -f FILE (not -), and --tokens,
    -n 0 and -f - without -cnv."""
    model, t = mqa
    (tmp_path / "first.txt").write_bytes(b"Hi there\n")
    got = chat(gemma, model, ["-n", N, "-f", tmp_path / "first.txt"], lines(b"And you?"), t)
    want = chat(gemma, model, ["-n", N, "-p", "Hi there"], lines(b"And you?"), t)
    same_run(got, want, "-f FILE")
    one = chat(gemma, model, ["-n", 1, "-p", "Hi there"], lines(b"And you?"), t)
    assert (one.status, one.stderr) == (0, b"") and one.stdout, one
    for args in (["-p", "Hi", "--tokens"], ["-p", "Hi", "-n", 0], ["-f", "-"]):
        r = run(gemma.binary, model, args, b"Hi\n")
        assert r.status == 0 and r.stderr == b"", (args, r)


def test_nul_byte_refuses_the_turn(gemma, mqa):
    """A line holding a NUL byte is refused (one line on stderr each) and the conversation goes
    on as if it had not been typed (docs/chat.md)."""
    model, t = mqa
    want = chat(gemma, model, ["-n", N], lines(b"Hi", b"Bye"), t)
    for raw, refused in [(b"A\0B\nHi\nBye\n", 1), (b"Hi\n\0\nBye\n", 1),
                         (b"Hi\nA\0\nBye\n\0B\n", 2), (b"Hi\n \0 \r\nBye\n", 1)]:
        got = chat(gemma, model, ["-n", N], raw, t)
        assert got.stderr == NUL * refused, (raw, got.stderr)
        got.stderr = b""
        same_run(got, want, repr(raw))


@pytest.mark.parametrize("cnv", [["-cnv"], []])
def test_nul_byte_refuses_the_prompt_file(gemma, mqa, tmp_path, cnv):
    """-f FILE holding a NUL byte is refused (exit 1, one line), with or without -cnv; a file
    whose last byte is a NUL too."""
    model, t = mqa
    for data in (b"Hi\0there\n", b"\0", b"Hi\0"):
        (tmp_path / "nul.txt").write_bytes(data)
        got = run(gemma.binary, model, [*cnv, "-f", tmp_path / "nul.txt", "-n", N], b"Bye\n", t.vocab)
        assert (got.status, got.stdout, got.stderr) == (1, b"", NUL), (data, got)


def test_first_turn_too_long_is_an_error(gemma, mqa):
    """-p with -cnv that does not fit in -c: exit 1, one line (the command line's input)."""
    model, _ = mqa
    r = run(gemma.binary, model, ["-cnv", "-c", 10, "-p", "Hello there, how are you?"],
            b"Hi\n")
    assert (r.status, r.stdout, r.stderr) == (1, b"", TOO_LONG)


def test_turn_that_does_not_fit_is_refused(gemma, mqa):
    """A turn whose ids do not fit in what is left of the context (-c) is refused before any of
    it is fed (one line); one that fits exactly is answered with one id, then the context is
    full (a notice, exit 0); a refused turn leaves the conversation as it was: a shorter next
    turn is answered as if the long one had not been typed."""
    model, t = mqa
    full = chat(gemma, model, ["-n", N], lines(b"Hi", b"Bye"), t)
    c = t.converse([b"Hi", b"Bye"], None, N, lambda pos: full.tops[pos])
    assert c.ends == ["n", "n"]
    start, ids = c.starts[1], c.turn_ids[1]          # turn 2: the -n id and its own ids
    exact = chat(gemma, model, ["-n", N, "-c", start + ids], lines(b"Hi", b"Bye", b"More"), t)
    assert (exact.status, exact.stderr) == (0, context_full(start + ids))
    assert exact.digests == full.digests[:start + ids]
    assert exact.stdout == t.decode(c.replies[0]) + b"\n" + t.decode(c.replies[1][:1]) + b"\n"
    short = chat(gemma, model, ["-n", N, "-c", start + ids - 1], lines(b"Hi", b"Bye"), t)
    assert (short.status, short.stderr) == (0, TOO_LONG)
    assert short.digests == full.digests[:start]
    assert short.stdout == t.decode(c.replies[0]) + b"\n"
    ctx = start + ids + 8
    want = chat(gemma, model, ["-n", N, "-c", ctx], lines(b"Hi", b"Bye"), t)
    for long in (LONG, b"a" * 5000):        # found by its ids; by its bytes alone (> ctx x
        for raw in (lines(b"Hi", long, b"Bye"), lines(long, b"Hi", b"Bye")):  # the longest
            got = chat(gemma, model, ["-n", N, "-c", ctx], raw, t)                # piece's)
            assert got.stderr == TOO_LONG, got.stderr
            got.stderr = b""
            same_run(got, want, f"{raw[:20]!r}...: a turn of {len(long)} bytes refused")


def test_context_filling_during_a_reply(gemma, mqa):
    """The context fills during a reply: the reply stops (its newline), a notice on stderr,
    exit 0; the turns after it are not read. The rows and the reply are the unbounded
    conversation's, up to -c."""
    model, t = mqa
    free = chat(gemma, model, ["-n", 40], lines(b"Hi"), t)
    c = t.converse([b"Hi"], None, 40, lambda pos: free.tops[pos])
    assert c.ends == ["n"]
    ctx = t.first_ids(b"Hi", None) + 6
    got = chat(gemma, model, ["-n", 40, "-c", ctx], lines(b"Hi", b"Bye"), t)
    assert (got.status, got.stderr) == (0, context_full(ctx))
    assert got.digests == free.digests[:ctx]
    assert got.stdout == t.decode(c.replies[0][:7]) + b"\n"
    # The notice's position is listed through stdout made stderr (dup2): it must never reach
    # the transcript. Stderr closed: the model file takes descriptor 2, so the notice's writes
    # fail (status 1); stdin and stderr closed (the model takes 0, the first turn from -p): 2
    # stays closed, dup2 fails, the position is not listed (status 0).
    argv = [str(gemma.binary), "-m", str(model), "-cnv", "-n", "40", "-c", str(ctx)]
    for redirect, status in (("2>&-", 1), ("2>&- <&-", 0)):
        closed = subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", *argv, "-p", "Hi"],
                                stdout=subprocess.PIPE, timeout=120)
        assert (closed.returncode, closed.stdout) == (status, got.stdout), redirect


def test_turn_of_16_mib_is_refused(gemma, mqa):
    """A line of 2^24 bytes is refused (one line) and the next turn answered as if it had not
    been typed. (The engine reads a byte per read: ~2^24 system calls.)"""
    model, t = mqa
    got = chat(gemma, model, ["-n", N], b"Hi\n" + b"a" * (1 << 24) + b"\nBye\n", t, timeout=600)
    want = chat(gemma, model, ["-n", N], lines(b"Hi", b"Bye"), t)
    assert got.stderr == TOO_LONG, got.stderr
    got.stderr = b""
    same_run(got, want, "a 16 MiB turn")


def test_closed_stdin_ends_after_the_first_turn(gemma, mqa):
    """Standard input closed (`<&-`): the model file takes descriptor 0, and the conversation
    reads no turns from it: -p's turn is answered, then exit 0, as with an empty input."""
    model, _ = mqa
    argv = [str(gemma.binary), "-m", str(model), "-cnv", "-p", "Hi there", "-n", str(N)]
    closed = subprocess.run(argv, stdin=None, capture_output=True, timeout=30,
                            preexec_fn=lambda: os.close(0))
    empty = subprocess.run(argv, input=b"", capture_output=True, timeout=30)
    assert (closed.returncode, closed.stdout, closed.stderr) == (0, empty.stdout, b"")
    assert empty.stdout.count(b"\n") >= 1


def test_closed_stdout_ends_quietly(gemma, mqa):
    """`gemma -cnv ... | head -c1`: the reader goes after one byte; the engine ends by exit
    (status 0 or 1, not a signal), nothing on stderr."""
    model, _ = mqa
    r = subprocess.run(f"printf 'Hi\\nAnd you?\\nBye\\n' | '{gemma.binary}' -m '{model}' -cnv "
                       f"-n 200 | head -c1 >/dev/null; echo ${{PIPESTATUS[1]}}", shell=True,
                       executable="/bin/bash", capture_output=True, timeout=60)
    assert int(r.stdout.split()[-1]) in (0, 1) and r.stderr == b"", r


@pytest.mark.parametrize("first", [None, b"Hi"])
def test_terminal_marker(gemma, mqa, first):
    """Standard input a terminal (a pty): `> ` on stderr before each turn read from it (the
    -p turn is not read: none before it), the last before the read that meets the end of
    input (^D); the replies are those of the same turns piped."""
    model, t = mqa
    args = [str(gemma.binary), "-m", str(model), "-cnv", "-n", str(N)]
    args += ["-p", first.decode()] if first else []
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(args, stdin=slave, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        os.close(slave)
        os.write(master, b"And you?\n\x04")
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    piped = chat(gemma, model, ["-n", N, *(["-p", first] if first else [])], lines(b"And you?"),
                 t)
    assert (proc.returncode, out, err) == (0, piped.stdout, b"> " * 2)
    assert piped.stderr == b""                               # a pipe: no marker
