"""The tokenizer on the real Gemma 3 270M vocabulary (262,144 pieces, 6,414 user and control
pieces; the `real_g3` fixture) with long English prose: ids equal to the twin's on 100 KB, and
a 300 KB file, more than a 32,768-position context holds, refused in well under a second
(--tokens lists its ids all the same)."""
from __future__ import annotations

import subprocess
import time

import pytest

from builder.models.modelfile4 import ModelFile4
from builder.twins.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the real_g3 fixture converts Gemma 3 270M

# Public-domain prose: the openings of Dickens's A Tale of Two Cities (1859) and of the
# United States Declaration of Independence (1776).
PROSE = [
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the "
    "winter of despair, we had everything before us, we had nothing before us, we were all "
    "going direct to Heaven, we were all going direct the other way.",
    "There were a king with a large jaw and a queen with a plain face, on the throne of England; "
    "there were a king with a large jaw and a queen with a fair face, on the throne of France. "
    "In both countries it was clearer than crystal to the lords of the State preserves of loaves "
    "and fishes, that things in general were settled for ever.",
    "When in the Course of human events, it becomes necessary for one people to dissolve the "
    "political bands which have connected them with another, and to assume among the powers of "
    "the earth, the separate and equal station to which the Laws of Nature and of Nature's God "
    "entitle them, a decent respect to the opinions of mankind requires that they should "
    "declare the causes which impel them to the separation.",
    "We hold these truths to be self-evident, that all men are created equal, that they are "
    "endowed by their Creator with certain unalienable Rights, that among these are Life, "
    "Liberty and the pursuit of Happiness.",
]
CTX = 32768


def prose(n_bytes: int) -> bytes:
    """The paragraphs, one per line, over and over, cut to n_bytes."""
    text = "\n".join(PROSE * (n_bytes // sum(map(len, PROSE)) + 1)).encode()
    return text[:n_bytes].rstrip()


@pytest.fixture(scope="module")
def tok(real_g3) -> Tokenizer:
    return Tokenizer(ModelFile4(real_g3))


def test_100_kb_of_prose_gives_the_twins_ids(gemma, real_g3, tok, tmp_path):
    text = prose(100_000)
    path = tmp_path / "prose.txt"
    path.write_bytes(text)
    r = subprocess.run([str(gemma.binary), "-m", str(real_g3), "-c", str(CTX), "-f", str(path),
                        "--tokens"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got, want = [int(t) for t in r.stdout.split()], tok.encode(text)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, f"{len(got)} ids, {len(want)} expected; first difference at {first}"


def test_300_kb_too_long_for_the_context_is_refused_at_once(gemma, real_g3, tok, tmp_path):
    """300 KB of prose is 66,292 ids (the twin counts them), twice what -c 32768 holds,
    but fewer bytes than ctx x the longest piece (93 bytes): refused once the paragraphs read
    so far give more ids than the context, in under a second (measured: 0.03 s, after 148 KB, on a busy
    2-core machine; merging the whole text first took 152 s before the heap). The refused run
    has no --tokens: the refusal comes in tokenize, before any forward pass; --tokens counts
    them all, the twin's ids."""
    text = prose(300_000)
    want = tok.encode(text)
    assert len(want) > CTX
    assert len(text) < CTX * ModelFile4(real_g3).header.max_piece_len
    path = tmp_path / "prose.txt"
    path.write_bytes(text)
    argv = [str(gemma.binary), "-m", str(real_g3), "-c", str(CTX), "-f", str(path)]
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, timeout=60)
    seconds = time.monotonic() - start
    assert (r.returncode, r.stdout, r.stderr) == (1, b"", b"gemma: prompt too long\n")
    assert seconds < 1.0, f"refused after {seconds:.2f} s"
    r = subprocess.run(argv + ["--tokens"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == want
