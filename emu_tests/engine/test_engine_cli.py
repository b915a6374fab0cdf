"""The real binary's front end: command line, model validation, tokenizer (--tokens against
sentencepiece's recorded ids), sampling, output streaming and every error
with its message and exit status. Models: the fixtures converted by builder.models.convert."""
from __future__ import annotations

import itertools
import json
import math
import os
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from builder.models import modelfile4
from builder.models.modelfile4 import HEADER_FIELDS, ModelFile4 as ModelFile
from builder.twins.tokenizer import Tokenizer
from modelfiles import convert_fixture, fixture_path

REPO = Path(__file__).resolve().parents[2]
CASES = json.loads(fixture_path("tok_a.encodings.json").read_text())["cases"]
OFFSET = {name: (off, code) for name, off, code in HEADER_FIELDS}
TIMEOUT = 30  # seconds per run; every run here takes milliseconds


@pytest.fixture(scope="module")
def engine(request, tmp_path_factory) -> Path:
    """The binary under test: conftest's `gemma` fixture, or fasm's build while it is missing."""
    try:
        return Path(request.getfixturevalue("gemma").binary)
    except pytest.FixtureLookupError:
        out = tmp_path_factory.mktemp("fasm") / "gemma"
        subprocess.run(["fasm", str(REPO / "asm" / "gemma.asm"), str(out)], check=True,
                       capture_output=True)
        out.chmod(0o755)
        return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models")
    for name in ("tiny_mqa", "tiny_wide"):
        convert_fixture(name, "hf", out)
    return out


@pytest.fixture(scope="module")
def mqa(models) -> Path:
    return models / "tiny_mqa-hf.bin"


def run(engine: Path, *args, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    argv = [str(engine)] + [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, timeout=TIMEOUT)


def assert_error(r: subprocess.CompletedProcess, message: str, status: int = 1) -> None:
    """One line on stderr, exactly `gemma: message`, nothing on stdout, that exit status."""
    assert r.returncode == status, f"exit {r.returncode} (want {status}), stderr {r.stderr!r}"
    assert r.stderr == f"gemma: {message}\n".encode(), f"stderr {r.stderr!r}, want {message!r}"
    assert not r.stdout, f"stdout {r.stdout[:80]!r}"


# ---- tokenizer ------------------------------------------------------------------------

def test_tokens_equal_sentencepiece(engine, mqa):
    # An argv string cannot hold a NUL byte: such cases cannot be passed to the binary and are
    # skipped by name here (the fixture has none today; the count is asserted to be printed).
    cases = [(i, c) for i, c in enumerate(CASES) if "\0" not in c["text"]]
    skipped = len(CASES) - len(cases)
    print(f"{len(cases)} cases, {skipped} skipped (NUL in the text)")
    bad = []
    for i, case in cases:
        r = run(engine, "-m", mqa, "-p", case["text"].encode(), "--tokens")
        got = [int(t) for t in r.stdout.split()] if r.returncode == 0 else r.stderr
        if got != case["ids"] or not r.stdout.endswith(b"\n"):
            bad.append((i, case["text"], case["ids"], got))
    assert not bad, "case, text, expected, got:\n" + "\n".join(map(repr, bad[:10]))


def test_tokens_format_and_empty_prompt(engine, mqa):
    assert run(engine, "-m", mqa, "--tokens").stdout == b"2\n"        # no -p: BOS alone
    assert run(engine, "-m", mqa, "-p", "", "--tokens").stdout == b"2\n"
    r = run(engine, "-m", mqa, "-p", "a b", "--tokens")
    assert r.returncode == 0 and r.stderr == b""
    assert r.stdout.count(b" ") == len(r.stdout.split()) - 1 and r.stdout.endswith(b"\n")


@pytest.mark.parametrize("text", [b"\xff\xfe", b"\xe2\x96", b"a\xc3", b"\xf0\x9f\x98",
                                  b"\xc0\xaf", b"\x80\x80 x", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
def test_invalid_utf8_prompt_matches_twin(engine, mqa, text):
    """Prompts are arbitrary bytes: the engine's ids equal builder.twins.tokenizer's (the twin)."""
    want = Tokenizer(ModelFile(mqa)).encode(text)
    r = run(engine, "-m", mqa, "-p", text, "--tokens")
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == want


def test_tokens_of_long_random_text_match_twin(engine, mqa):
    """Random printable and multi-byte text, a few hundred bytes: ids equal the twin's."""
    rng = np.random.default_rng(5)
    alphabet = list("abcdefghij klmnop  \t\n<>/b") + ["é", "€", "日本", "😀", "<b>", "</h1>"]
    tok = Tokenizer(ModelFile(mqa))
    for trial in range(5):
        text = "".join(rng.choice(alphabet, 150)).encode()
        r = run(engine, "-m", mqa, "-p", text, "--tokens")
        got = [int(t) for t in r.stdout.split()]
        want = tok.encode(text)
        assert got == want, f"trial {trial}: {text!r}: first difference at " \
            f"{next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-1])) if a != b)}"


# ---- generation and output -------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny_mqa", "tiny_wide"])
def test_greedy_text_is_the_decoded_reference(engine, models, name):
    """Streamed text = the twin's decoding of the recorded greedy ids (prompts whose recorded
    top-2 gap is comfortable, > 1e-3, far above the engine's ~1e-5 logit error)."""
    ref = json.loads(fixture_path(f"{name}/reference.json").read_text())
    model = models / f"{name}-hf.bin"
    tok = Tokenizer(ModelFile(model))
    checked = 0
    for p in ref["prompts"]:
        if p["min_top2_gap"] <= 1e-3:
            continue
        n = len(p["greedy"])
        r = run(engine, "-m", model, "-p", p["text"], "-n", n)
        assert r.returncode == 0 and r.stderr == b"", r.stderr
        ids = p["greedy"]
        h = ModelFile(model).header
        stop = next((i for i, t in enumerate(ids) if t in (h.eos, h.eot)), n)
        assert r.stdout == tok.decode(ids[:stop]) + b"\n", f"{p['text']!r}"
        checked += 1
    assert checked >= 2


def test_text_ends_with_one_newline(engine, mqa, tmp_path):
    """Generated text ends with exactly one newline however generation stops (-n, a full
    context), so that stdout minus its last byte is the text: the twin's decoding of the
    greedy ids, read back as the argmax of each --logits row after the prompt's. --tokens
    ends with its own single newline; -n 0 prints nothing (test_n_zero_and_context_full)."""
    mf = ModelFile(mqa)
    tok, stop = Tokenizer(mf), {mf.header.eos, mf.header.eot}
    n_prompt = len(tok.encode(b"The"))
    for args in (["-n", 1], ["-n", 5], ["-c", 4], ["-n", 40]):
        out = tmp_path / "l.f32"
        r = run(engine, "-m", mqa, "-p", "The", *args, "--logits", out)
        assert r.returncode == 0 and r.stderr == b"", args
        rows = np.fromfile(out, "<f4").reshape(-1, mf.header.vocab)[n_prompt - 1:]
        ids = list(itertools.takewhile(lambda i: i not in stop, map(int, rows.argmax(1))))
        assert r.stdout == tok.decode(ids) + b"\n", args
    for text in ("a", "The cat", "x\n" * 50):
        r = run(engine, "-m", mqa, "-p", text, "--tokens")
        assert r.stdout.count(b"\n") == 1 and r.stdout.endswith(b"\n"), text


def test_n_zero_and_context_full(engine, mqa):
    r = run(engine, "-m", mqa, "-p", "Hello", "-n", 0)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b""      # not even a newline
    # -c 3 with a 2-id prompt: one position left, so exactly 2 tokens are generated
    # (the second is printed but cannot be fed back). Compare with -n 2 at a large context.
    full = run(engine, "-m", mqa, "-p", "a", "-c", 3)
    two = run(engine, "-m", mqa, "-p", "a", "-n", 2)
    assert full.returncode == 0 and full.stdout == two.stdout


def test_stops_at_eos_and_end_of_turn(engine, mqa, tmp_path):
    """Generation stops at the header's eos and eot ids (nothing printed, nothing fed): the
    fixture's greedy ids made the stop ids by editing the header."""
    p = json.loads(fixture_path("tiny_mqa/reference.json").read_text())["prompts"][0]
    g = p["greedy"]
    assert len({g[0], g[1], g[2]}) == 3
    r = run(engine, "-m", mutated(mqa, tmp_path, eos=g[0]), "-p", p["text"], "-n", 10)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"\n", b"")      # no text: its newline
    model = mutated(mqa, tmp_path, eot=g[2])
    out = tmp_path / "l.bin"
    r = run(engine, "-m", model, "-p", p["text"], "-n", 10, "--logits", out)
    assert r.returncode == 0 and r.stdout == Tokenizer(ModelFile(mqa)).decode(g[:2]) + b"\n"
    assert out.stat().st_size == (len(p["ids"]) + 2) * 2048 * 4      # g[0], g[1] fed back


def test_logits_rows(engine, mqa, tmp_path):
    """--logits: one float32 row of vocab per evaluated position (prompt + n - 1), in order,
    equal to the reference's prompt rows (tolerance 1e-4: the engine is within ~2e-5)."""
    ref = json.loads(fixture_path("tiny_mqa/reference.json").read_text())
    npz = np.load(fixture_path("tiny_mqa/reference.npz"))
    p = ref["prompts"][0]
    out = tmp_path / "l.bin"
    out.write_bytes(b"x" * 100000)          # truncated on open
    r = run(engine, "-m", mqa, "-p", p["text"], "-n", 3, "--logits", out)
    assert r.returncode == 0, r.stderr
    rows = np.fromfile(out, "<f4").reshape(-1, 2048)
    assert rows.shape[0] == len(p["ids"]) + 3 - 1
    np.testing.assert_allclose(rows[:len(p["ids"])], npz["p0_prompt_logits"], atol=1e-4, rtol=0)
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o644 & ~mask


def test_pipe_closed_before_the_first_write_is_an_error(engine, mqa):
    """No reader from the start: nothing got through, so it is a failed write (one line)."""
    r, w = os.pipe()
    os.close(r)
    try:
        res = run(engine, "-m", mqa, "-p", "Hello", "-n", 5, stdout=w)
    finally:
        os.close(w)
    assert_error(res, "write failed")


def test_head_c1_ends_promptly_and_quietly(engine, mqa):
    """`gemma ... | head -c1`: the reader goes away after the first byte; the engine ends by
    exit (not SIGPIPE), promptly, with nothing on stderr."""
    start = time.monotonic()
    r = subprocess.run(f"'{engine}' -m '{mqa}' -p Hello -c 1024 | head -c1 >/dev/null; "
                       f"echo ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
                       capture_output=True, timeout=TIMEOUT)
    status = int(r.stdout.split()[-1])
    assert status in (0, 1), f"status {status} (>128: killed by a signal)"
    assert r.stderr == b"" and time.monotonic() - start < 10



def test_a_reader_gone_after_logits_rows_ends_quietly(engine, mqa):
    """`--logits /dev/stdout | head -c 8192`: only logits rows are written (-n 0), each 2,048
    floats (8,192 bytes: a count whose low byte is 0), the reader takes one and goes; the rows
    after it fill the pipe and meet EPIPE. Something got through, so the engine ends quietly
    with status 1 (it once kept only a count's low byte as that proof, and said `write
    failed`)."""
    prompt = " ".join(["word"] * 40)          # 40+ rows: more than a pipe's 64 KiB
    r = subprocess.run(f"'{engine}' -m '{mqa}' -p '{prompt}' -n 0 --logits /dev/stdout | "
                       f"head -c 8192 >/dev/null; echo ${{PIPESTATUS[0]}}", shell=True,
                       executable="/bin/bash", capture_output=True, timeout=TIMEOUT)
    assert (int(r.stdout.split()[-1]), r.stderr) == (1, b"")


# ---- sampling ---------------------------------------------------------------------------

def test_same_seed_same_text_other_seeds_other_text(engine, mqa):
    args = ("-m", mqa, "-p", "The", "--temp", "1", "-n", 30)
    a = run(engine, *args, "-s", 7)
    b = run(engine, *args, "-s", 7)
    assert a.returncode == 0 and a.stdout and a.stdout == b.stdout
    assert run(engine, *args).stdout == run(engine, *args, "-s", 0).stdout   # default seed 0
    others = {run(engine, *args, "-s", s).stdout for s in (1, 2, 3, 18446744073709551615)}
    assert a.stdout not in others and len(others) == 4


def reference_probs(temp: float) -> np.ndarray:
    """Next-token probabilities after prompt 0 of tiny_mqa, from the recorded logits."""
    npz = np.load(fixture_path("tiny_mqa/reference.npz"))
    z = npz["p0_prompt_logits"][-1].astype(np.float64) / temp
    e = np.exp(z - z.max())
    return e / e.sum()


def first_tokens(engine, mqa, temp, top_p, n) -> tuple[Counter, dict]:
    """Counts of the first sampled token's text for seeds 0..n-1, and text -> ids."""
    ref = json.loads(fixture_path("tiny_mqa/reference.json").read_text())
    text = ref["prompts"][0]["text"]
    tok = Tokenizer(ModelFile(mqa))
    by_text = {}
    for i in range(2048):
        by_text.setdefault(tok.decode_piece(i), []).append(i)
    counts = Counter()
    for seed in range(n):
        r = run(engine, "-m", mqa, "-p", text, "-n", 1, "--temp", temp, "--top-p", top_p,
                "-s", seed)
        assert r.returncode == 0 and r.stdout.endswith(b"\n"), r.stderr
        counts[r.stdout[:-1]] += 1                  # the token's text (then the newline)
    return counts, by_text


# At --temp 0.1 the first token after prompt 0 has probabilities .43 .41 .10 .03 .01 ...:
# top-p 0.9 keeps exactly the first three; at --temp 1 the distribution is nearly flat and
# top-p 0.5 keeps about 640 of 2048 tokens.
@pytest.mark.parametrize("temp,top_p", [(0.1, 1.0), (0.1, 0.9), (1.0, 0.5)])
def test_sampled_frequencies_follow_the_nucleus(engine, mqa, temp, top_p):
    """First-token frequencies over 400 seeds against the reference distribution, restricted
    to the nucleus (the smallest set of most probable tokens holding top_p) and renormalised.
    Tokens are identified by their text; texts shared by several ids are pooled."""
    n = 400
    counts, by_text = first_tokens(engine, mqa, temp, top_p, n)
    p = reference_probs(temp)
    order = np.argsort(-p, kind="stable")
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
    q = np.zeros_like(p)
    q[keep] = p[keep] / p[keep].sum()
    expected = {t: q[ids].sum() for t, ids in by_text.items()}
    outside = {t: c for t, c in counts.items() if expected.get(t, 0) == 0}
    assert not outside, f"sampled outside the nucleus: {outside}"
    # each text's count within 4.5 binomial standard deviations (+1 for discreteness): a
    # correct sampler fails this with probability < 1e-4 over all texts; seeds are fixed, so
    # the run is deterministic.
    for t, e in expected.items():
        sd = math.sqrt(n * e * (1 - e))
        assert abs(counts.get(t, 0) - n * e) <= 4.5 * sd + 1, \
            f"text {t!r}: {counts.get(t, 0)} of {n}, expected {n * e:.1f}"
    if (temp, top_p) == (0.1, 0.9):
        assert len(keep) == 3 and len(counts) == 3


# ---- errors ------------------------------------------------------------------------------

def test_usage_and_help_share_their_exit_by_the_descriptor():
    """asm/sys.asm's usage ends `and edi, EXIT_USAGE` on the descriptor it wrote to: stdout
    (help) must give status 0 and stderr (a usage error) EXIT_USAGE. That holds while these
    constants are what they are: the assumption, proven."""
    from emu_tests.asm_facts import constant
    stdout, stderr, usage = constant("STDOUT"), constant("STDERR"), constant("EXIT_USAGE")
    assert (stdout & usage, stderr & usage) == (0, usage) == (0, 2)


def test_no_arguments_prints_usage(engine):
    r = run(engine)
    assert r.returncode == 2 and r.stderr.startswith(b"usage: gemma -m MODEL") and not r.stdout


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_usage_on_stdout(engine, flag):
    """Help wins over everything else on the line (no model needed), exit status 0."""
    usage = run(engine).stderr
    for args in ([flag], ["-m", "/nonexistent", flag, "-p", "x"]):
        r = run(engine, *args)
        assert (r.returncode, r.stdout, r.stderr) == (0, usage, b""), args
    assert b"-f FILE" in usage and b"[-h]" in usage and usage.count(b"\n") == 2


# ---- prompts from files (-f) -------------------------------------------------------------

def tokens(engine, model, *args, stdin: bytes | None = None) -> list[int]:
    argv = [str(engine), "-m", str(model), "--tokens"] + [a if isinstance(a, bytes) else str(a) for a in args]
    r = subprocess.run(argv, input=stdin,
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


@pytest.mark.parametrize("text", [b"Hello world, the quick brown fox", b"", b"two\nlines",
                                  b"a trailing newline\n", b"two trailing newlines\n\n",
                                  "caf\u00e9 \u4e16\u754c\t<b>x</b>".encode()])
def test_prompt_file_is_the_prompt(engine, mqa, tmp_path, text):
    """-f FILE and -f - (standard input) give the ids of -p with the file's text, one trailing
    newline dropped (llama.cpp's rule)."""
    path = tmp_path / "prompt.txt"
    path.write_bytes(text)
    want = tokens(engine, mqa, "-p", text[:-1] if text.endswith(b"\n") else text)
    assert tokens(engine, mqa, "-f", path) == want
    assert tokens(engine, mqa, "-f", "-", stdin=text) == want


def test_prompt_and_file_together_is_a_usage_error(engine, mqa, tmp_path):
    """-p and -f in either order (and -p "" with -f -) are refused before any file is read:
    a missing file gives the usage error, not "cannot read"."""
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"x")
    for args in (["-p", "x", "-f", path], ["-f", path, "-p", "x"], ["-p", "", "-f", "-"],
                 ["-f", tmp_path / "missing", "-p", "x"], ["-p", "a", "-f", path, "-p", "b"]):
        assert_error(run(engine, "-m", mqa, *args), "use -p or -f, not both", 2)


def test_unreadable_prompt_file_is_one_line(engine, mqa, tmp_path):
    assert_error(run(engine, "-m", mqa, "-f", tmp_path / "missing"), f"cannot read {tmp_path / 'missing'}")
    assert_error(run(engine, "-m", mqa, "-f", tmp_path), f"cannot read {tmp_path}")  # a directory
    assert_error(run(engine, "-m", mqa, "-f"), "no value for -f", 2)


@pytest.mark.parametrize("size,flags", [(300_000, []), (1 << 24, []), (1 << 24, ["--tokens"])])
def test_huge_prompt_file_is_refused_early(engine, tmp_path, size, flags):
    """More text than the context can hold (the synth tiny preset's 512 positions times its
    longest piece) is refused before the quadratic merging (in tokenize, before any forward
    pass: a run without --tokens, which counts any prompt), and a file of 2^24 bytes or more
    (the most -f reads) is refused as it is read, --tokens or not; never by a signal. The
    timeout is a hang guard, not a speed figure: the refusal takes milliseconds."""
    from builder.models.synth import synth
    model = tmp_path / "tiny.bin"
    synth("tiny", model, progress=False)
    path = tmp_path / "big.txt"
    path.write_bytes(b"the quick brown fox " * (size // 20) + b"x" * (size % 20))
    assert path.stat().st_size == size
    r = subprocess.run([str(engine), "-m", str(model), "-f", str(path), *flags],
                       capture_output=True, timeout=10)
    assert_error(r, "prompt too long")


# Usage errors (a malformed command line) exit with status 2, bad values with 1.
USAGE_ERRORS = [
    (["-x"], "unknown option -x"),
    (["-"], "unknown option -"),
    (["--help=1"], "unknown option --help=1"),
    (["-m", "m.bin", "-p", "x", "--tokenz"], "unknown option --tokenz"),
    (["--temp"], "no value for --temp"),
    (["-m"], "no value for -m"),
    (["-m", "m.bin", "-p"], "no value for -p"),
    (["-p", "x", "-c"], "no value for -c"),
    (["hello"], "unexpected argument hello"),
    ([""], "unexpected argument "),
    (["-m", "m.bin", "Hello world"], "unexpected argument Hello world"),
    (["-m", "m.bin", "-p", "x", "-n", "4", "more"], "unexpected argument more"),
    (["-n", "4", "4"], "unexpected argument 4"),
    (["-p", "x"], "no model (-m)"),
    (["--tokens"], "no model (-m)"),
]


@pytest.mark.parametrize("args,message", USAGE_ERRORS)
def test_usage_errors_exit_2(engine, args, message):
    assert_error(run(engine, *args), message, 2)


@pytest.mark.parametrize("args,message", [
    (["-n", "abc"], "bad value for -n"),
    (["-n", "-1"], "bad value for -n"),
    (["-n", "2147483648"], "bad value for -n"),
    (["-n", "12x"], "bad value for -n"),
    (["-n", ""], "bad value for -n"),
    (["-t", "0"], "bad value for -t"),
    (["-t", "257"], "bad value for -t"),
    (["-t", "99999999999999999999999"], "bad value for -t"),
    (["-c", "0"], "bad value for -c"),
    (["-c", "2x"], "bad value for -c"),
    (["--temp", "-1"], "bad value for --temp"),
    (["--temp", "1e39"], "bad value for --temp"),
    (["--temp", "1.5e-3"], "bad value for --temp"),     # no exponent (docs: conversation mode
    (["--temp", "25E-1"], "bad value for --temp"),      # took its bytes)
    (["--temp", "inf"], "bad value for --temp"),
    (["--temp", "nan"], "bad value for --temp"),
    (["--temp", "."], "bad value for --temp"),
    (["--temp", "1.2.3"], "bad value for --temp"),
    (["--temp", "1e"], "bad value for --temp"),
    (["--temp", "18446744073709551616"], "bad value for --temp"),   # mantissa digits overflow
    (["--temp", "1e1001"], "bad value for --temp"),
    (["--top-p", "0"], "bad value for --top-p"),
    (["--top-p", "1.0001"], "bad value for --top-p"),
    (["--top-p", "1e-50"], "bad value for --top-p"),
    (["-s", "18446744073709551616"], "bad value for -s"),
    (["-s", "-1"], "bad value for -s"),
    (["-s", "abc"], "bad value for -s"),
    (["-t", "x"], "bad value for -t"),
    (["-c", "1.5"], "bad value for -c"),
    (["--top-p", "abc"], "bad value for --top-p"),
    (["--temp", "abc"], "bad value for --temp"),
    (["-m", "m.bin", "-c", "0", "-x"], "bad value for -c"),     # the first error on the line
])
def test_bad_values_exit_1(engine, args, message):
    assert_error(run(engine, *args), message, 1)


def test_usage_errors_come_before_files(engine, mqa, tmp_path):
    """A malformed command line is refused before any file is opened: the missing model file
    does not matter."""
    missing = tmp_path / "none.bin"
    assert_error(run(engine, "-m", missing, "-p", "x", "stray"), "unexpected argument stray", 2)
    assert_error(run(engine, "-m", missing, "-x"), "unknown option -x", 2)
    assert_error(run(engine, "-f", missing), "no model (-m)", 2)
    assert_error(run(engine, "-m", missing, "-p", "x"), f"cannot read {missing}", 1)


@pytest.mark.parametrize("args", [
    ["--temp", "0"], ["--temp", "0.0015"], ["--temp", "2.5"], ["--temp", ".5"], ["--temp", "3."],
    ["--top-p", "1"], ["--top-p", "0.9"], ["--temp", "0.00000000000000000000000000001"], ["-s", "18446744073709551615"], ["-t", "256"],
    ["-t", "1"], ["-n", "0"], ["-c", "1024"], ["-c", "1"], ["-p", "x", "-p", "y"],
])
def test_accepted_values(engine, mqa, args):
    r = run(engine, "-m", mqa, *args, "--tokens")
    assert r.returncode == 0 and r.stderr == b"", r.stderr


def test_range_errors_against_the_model(engine, mqa):
    assert_error(run(engine, "-m", mqa, "-c", 1025), "bad value for -c")       # max_ctx 1024
    assert run(engine, "-m", mqa, "-c", 8, "-n", 8, "--tokens").returncode == 0


def test_n_beyond_the_context_stops_at_a_full_context(engine, mqa, tmp_path):
    """-n larger than the context is no error (as in llama.cpp): generation stops when the
    context is full, exactly where a run without -n stops: -c 8 and a 2-id prompt evaluate 8
    positions (2 prompt rows, 6 fed-back tokens) and print 7 tokens."""
    vocab = ModelFile(mqa).header.vocab
    full = run(engine, "-m", mqa, "-p", "a", "-c", 8)
    assert full.returncode == 0 and full.stderr == b""
    for n in (9, 1025, 2147483647):
        out = tmp_path / f"{n}.f32"
        r = run(engine, "-m", mqa, "-p", "a", "-c", 8, "-n", n, "--logits", out)
        assert (r.returncode, r.stderr, r.stdout) == (0, b"", full.stdout), n
        assert out.stat().st_size == 8 * vocab * 4, n


def test_prompt_longer_than_context(engine, mqa):
    r = run(engine, "-m", mqa, "-p", "1 2 3", "--tokens")
    n = len(r.stdout.split())
    assert_error(run(engine, "-m", mqa, "-p", "1 2 3", "-c", n - 1), "prompt too long")
    assert run(engine, "-m", mqa, "-p", "1 2 3", "-c", n, "--tokens").returncode == 0
    assert_error(run(engine, "-m", mqa, "-p", "x" * 100000), "prompt too long")


def test_tokens_counts_a_prompt_longer_than_the_context(engine, mqa, tmp_path):
    """--tokens lists every id of a prompt that -c, or the default context (tiny_mqa's 1,024
    positions), would refuse: the twin's ids, BOS first, from -p and from -f alike."""
    rng = np.random.default_rng(9)
    alphabet = list("abcdefghij klmnop  \t\n<>/b") + ["é", "€", "日本", "😀", "<b>", "</h1>"]
    text = "".join(rng.choice(alphabet, 3000)).encode() + b"."   # (-f drops a last newline)
    want = Tokenizer(ModelFile(mqa)).encode(text)
    assert want[0] == ModelFile(mqa).header.bos and len(want) > 1024
    assert_error(run(engine, "-m", mqa, "-p", text), "prompt too long")
    assert tokens(engine, mqa, "-p", text) == want
    assert tokens(engine, mqa, "-p", text, "-c", 8) == want
    assert tokens(engine, mqa, "-p", "1 2 3", "-c", 1) == tokens(engine, mqa, "-p", "1 2 3")
    path = tmp_path / "long.txt"
    path.write_bytes(text)
    assert tokens(engine, mqa, "-f", path, "-c", 1) == want


def test_error_argument_stays_one_line(engine, tmp_path):
    """The echoed argument ends at its first control byte and after 256 bytes."""
    assert_error(run(engine, "-m", "x", "-p", "y", "-q\nsecond line"), "unknown option -q", 2)
    long = "-" + "z" * 1000
    assert_error(run(engine, long), f"unknown option {long[:256]}", 2)
    assert_error(run(engine, "z" * 1000), f"unexpected argument {'z' * 256}", 2)


def test_missing_and_unreadable_model(engine, tmp_path):
    missing = tmp_path / "none.bin"
    assert_error(run(engine, "-m", missing), f"cannot read {missing}")
    assert_error(run(engine, "-m", tmp_path), f"cannot read {tmp_path}")   # a directory
    os.mkfifo(tmp_path / "fifo")                                                  # never blocks
    assert_error(run(engine, "-m", tmp_path / "fifo"), f"cannot read {tmp_path / 'fifo'}")
    assert_error(run(engine, "-m", "/dev/zero"), "cannot read /dev/zero")         # not a file


def mutated(mqa: Path, tmp_path: Path, **fields) -> Path:
    data = bytearray(mqa.read_bytes())
    for name, value in fields.items():
        off, code = OFFSET[name]
        struct.pack_into("<" + code, data, off, value)
    out = tmp_path / "m.bin"
    out.write_bytes(data)
    return out


def test_bad_magic_version_truncated(engine, mqa, tmp_path):
    assert_error(run(engine, "-m", mutated(mqa, tmp_path, magic=b"GEMMAASN")),
                 "bad magic")
    for version in (0, 1, 2, 3, 5, 0xFFFFFFFF):           # 2, 3: what earlier builds wrote
        assert_error(run(engine, "-m", mutated(mqa, tmp_path, version=version)),
                     "not a version 4 model file: convert it again")
    data = mqa.read_bytes()
    for size in (0, 10, 255, 256, 4096, len(data) // 2, len(data) - 1):
        (tmp_path / "t.bin").write_bytes(data[:size])
        assert_error(run(engine, "-m", tmp_path / "t.bin", "--tokens"), "truncated model")
    (tmp_path / "t.bin").write_bytes(data + b"\0")                       # longer than it says
    assert_error(run(engine, "-m", tmp_path / "t.bin"), "bad header")


def inconsistent_headers(h) -> list[dict]:
    """Header edits that must be rejected (h: the valid header)."""
    return [
        dict(header_size=255), dict(vocab=0), dict(vocab=1 << 24), dict(max_ctx=0),
        dict(max_ctx=(1 << 16) + 1), dict(n_slots=0), dict(n_slots=256), dict(n_ops=0),
        dict(n_ops=(1 << 16) + 1), dict(bos=h.vocab), dict(eos=0xFFFFFFFF), dict(eot=h.vocab),
        dict(byte_base=h.vocab - 255), dict(byte_base=0xFFFFFFFF), dict(slots_off=255),
        dict(slots_off=1 << 63), dict(program_off=h.program_off - 8), dict(strings_off=h.strings_off + 48),
        dict(strings_size=h.strings_size + 1), dict(pieces_off=h.pieces_off - 16),
        dict(index_off=h.index_off - 4), dict(user_off=h.user_off - 1), dict(merges_off=h.merges_off + 16),
        dict(blob_off=h.blob_off - 1), dict(blob_size=h.blob_size + h.weights_off),
        dict(blob_size=(1 << 64) - 1), dict(weights_off=h.weights_off + 64),
        dict(weights_size=h.weights_size + 4096), dict(file_size=h.file_size - 1),
        dict(n_index=h.n_index + (h.user_off - h.index_off)), dict(n_user=1 << 30),
        dict(n_merges=1), dict(max_piece_len=h.max_piece_len - 1),
        dict(flags=1), dict(flags=4), dict(flags=1 << 31), dict(flags=0xFFFFFFFF),
    ]


def test_inconsistent_headers(engine, mqa, tmp_path):
    h = ModelFile(mqa).header
    for fields in inconsistent_headers(h):
        r = run(engine, "-m", mutated(mqa, tmp_path, **fields), "--tokens")
        assert (r.returncode, r.stderr, r.stdout) == (1, b"gemma: bad header\n", b""), \
            f"{fields}: {r.returncode} {r.stderr!r}"


def test_program_past_its_weights(engine, mqa, tmp_path):
    """Sections consistent, but the weights region ends before the last tensor the program
    reads: bad program (load_model's sections are fine, check_program is not)."""
    h = ModelFile(mqa).header
    out = mutated(mqa, tmp_path, weights_size=h.weights_size - 64, file_size=h.file_size - 64)
    out.write_bytes(out.read_bytes()[:-64])
    assert_error(run(engine, "-m", out, "--tokens"), "bad program")


def test_geglu_rows_not_a_multiple_of_4(engine, mqa, tmp_path):
    """A gated MATMUL's rows (its s2's width) must be a multiple of 4 (GEGLU takes four values a
    pass): edited to 2 fewer (still inside its slots and its weight) it is refused as a bad
    program; 4 fewer runs."""
    ops = ModelFile(mqa).ops
    gated = next(i for i, o in enumerate(ops) if o.op == modelfile4.Op.MATMUL and o.s2)
    for less, ok in ((2, False), (4, True)):
        d = bytearray(mqa.read_bytes())
        struct.pack_into("<I", d, op_field(mqa, gated, "m"), ops[gated].m - less)
        (tmp_path / "g.bin").write_bytes(d)
        r = run(engine, "-m", tmp_path / "g.bin", "-p", "Hello", "-n", 2)
        if ok:
            assert r.returncode == 0 and r.stderr == b"", f"{less}: {r.returncode} {r.stderr!r}"
        else:
            assert_error(r, "bad program")


def op_field(model: Path, i: int, field: str) -> int:
    """The byte offset of field `field` of op record i."""
    h = ModelFile(model).header
    return h.program_off + modelfile4.OP_REC * i + next(off for name, off, _ in modelfile4.OP_FIELDS if name == field)


def test_any_scalars_run(engine, mqa, tmp_path):
    """Scalars are data, not validated: soft-caps and scales at their float32 extremes (and
    NaN, infinities) still run to the end, without a signal."""
    ops = ModelFile(mqa).ops
    attn = next(i for i, o in enumerate(ops) if o.op == modelfile4.Op.ATTN)
    for a, c in ((3.4028234663852886e38, 1e-45), (1e-45, 3.4028234663852886e38), (float("nan"), float("inf")),
                 (-1.0, -0.0)):
        d = bytearray(mqa.read_bytes())
        struct.pack_into("<ff", d, op_field(mqa, attn, "a"), a, c)
        struct.pack_into("<f", d, op_field(mqa, len(ops) - 1, "c"), c)
        (tmp_path / "s.bin").write_bytes(d)
        r = run(engine, "-m", tmp_path / "s.bin", "-p", "Hello", "-n", 3)
        assert r.returncode == 0 and r.stderr == b"", f"{a} {c}: {r.returncode} {r.stderr!r}"


def test_bad_tables(engine, mqa, tmp_path):
    """Piece records past the blob, ids out of range, empty user pieces."""
    h = ModelFile(mqa).header
    data = mqa.read_bytes()

    def patch(off: int, value: int) -> Path:
        d = bytearray(data)
        struct.pack_into("<I", d, off, value)
        (tmp_path / "p.bin").write_bytes(d)
        return tmp_path / "p.bin"

    last = h.pieces_off + 16 * (h.vocab - 1)
    for off, value in [(last, h.blob_size), (last + 4, h.max_piece_len + 1),
                       (h.pieces_off, 0xFFFFFFFF), (h.index_off, h.vocab),
                       (h.index_off + 4 * (h.n_index - 1), 0xFFFFFFFF), (h.user_off, h.vocab),
                       (h.pieces_off + 16 * ModelFile(mqa).user[0] + 4, 0)]:
        assert_error(run(engine, "-m", patch(off, value), "--tokens"), "bad header")


def test_failed_writes(engine, mqa, tmp_path):
    assert_error(run(engine, "-m", mqa, "-p", "a", "-n", 2, "--logits", "/dev/full"), "write failed")
    assert_error(run(engine, "-m", mqa, "-p", "a", "--logits", tmp_path), f"cannot write {tmp_path}")
    with open("/dev/full", "wb") as full:
        r = run(engine, "-m", mqa, "-p", "a", "--tokens", stdout=full)
    assert r.returncode == 1 and r.stderr == b"gemma: write failed\n"


def test_logits_file_may_not_be_the_model(engine, mqa, tmp_path):
    """--logits naming the model (itself, a symlink, a hard link) is refused before anything
    is truncated: the model stays intact (and its mapping cannot fault)."""
    model = tmp_path / "model.bin"
    model.write_bytes(mqa.read_bytes())
    (tmp_path / "sym").symlink_to(model)
    os.link(model, tmp_path / "hard")
    for dest in (model, tmp_path / "sym", tmp_path / "hard"):
        assert_error(run(engine, "-m", model, "-p", "hi", "-n", 2, "--logits", dest),
                     f"cannot write {dest}")
        assert model.read_bytes() == mqa.read_bytes()
    assert run(engine, "-m", model, "-p", "hi", "-n", 2, "--logits", "/dev/null").returncode == 0


def test_model_file_is_only_read(engine, mqa):
    before = (mqa.read_bytes(), mqa.stat().st_mtime_ns)
    run(engine, "-m", mqa, "-p", "Hello", "-n", 5, "--temp", "1")
    assert (mqa.read_bytes(), mqa.stat().st_mtime_ns) == before
