"""The engine's tokenizer on long texts: its ids against sentencepiece itself (tok_a.model),
and its cost counted in instructions (the whole program in Unicorn, emu_tests/harness/
program.py, `--tokens` minus an empty prompt's run): merging grows like n log n, the user
pieces are found through a first-byte index, and a prompt too long for the context is refused
as soon as the ids of its segments so far exceed the context.

Models: tok_a's vocabulary (the fixtures' 2,048-piece sentencepiece BPE, the tokenizer of
tiny_mqa) in a tiny model file with a context of 65,536 positions (the most a file may hold;
--tokens counts any prompt, the runs refused in tokenize need a -c), zero weights (only
--tokens runs, or runs refused before any forward pass), and optionally extra user pieces."""
from __future__ import annotations

import dataclasses
import math
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from builder.models import synth
from builder.models.convert_hf import sentencepiece_vocab
from builder.models.modelfile import USER_DEFINED, Vocab
from builder.models.modelfile4 import ModelFile4 as ModelFile
from builder.models.program import write_dims
from builder.twins.tokenizer import Tokenizer
from emu_tests.harness import assemble, load_elf, run_program
from modelfiles import fixture_path

MAX_CTX = 1 << 16           # the most a model file may hold (dim_bits)
TIMEOUT = 60
NORMALISE = 10              # instructions per byte, at most, of tokenize's normalising pass


def write_vocab_model(path: Path, vocab: Vocab) -> Path:
    """A tiny model (synth's tiny shapes, zero weights) with `vocab` and a 65,536 context."""
    dims = dataclasses.replace(synth.PRESETS["tiny"].dims, vocab=len(vocab.pieces),
                               max_ctx=MAX_CTX)
    write_dims(path, dims, vocab, lambda s: [np.zeros(s.shape, np.float32)], progress=False)
    return path


def with_user_pieces(vocab: Vocab, pieces: list[bytes]) -> Vocab:
    """vocab with `pieces` appended as user-defined pieces (the other ids stay)."""
    return Vocab(vocab.pieces + pieces, vocab.scores + [0.0] * len(pieces),
                 vocab.types + [USER_DEFINED] * len(pieces), vocab.bos, vocab.eos)


@pytest.fixture(scope="module")
def tok_a() -> Vocab:
    return sentencepiece_vocab(fixture_path("tok_a.model"))


@pytest.fixture(scope="module")
def model(tok_a, tmp_path_factory) -> Path:
    return write_vocab_model(tmp_path_factory.mktemp("tok") / "tok_a.bin", tok_a)


@pytest.fixture(scope="module")
def image(gemma):
    return load_elf(gemma.elf, gemma.symbols)


def words(seed: int, n_bytes: int, sep: str = " ") -> str:
    """Prose-like text of about n_bytes: words of tok_a's own pieces (so that they merge as
    in real text) and of single letters, joined by `sep`."""
    rng = random.Random(seed)
    sp = spm.SentencePieceProcessor(model_file=str(fixture_path("tok_a.model")))
    vocab = [p.lstrip("\u2581") for p in (sp.id_to_piece(i) for i in range(sp.vocab_size()))
             if p.strip("\u2581").isalpha()]
    out, size = [], 0
    while size < n_bytes:
        w = "".join(rng.choice(vocab) for _ in range(rng.choice((1, 1, 2, 3))))
        out.append(w)
        size += len(w.encode()) + len(sep)
    return sep.join(out)


def engine_ids(gemma, model: Path, text: bytes, *args) -> list[int]:
    r = subprocess.run([str(gemma.binary), "-m", str(model), "-c", str(MAX_CTX), "--tokens",
                        "-p", text, *args], capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


# ---- long texts against sentencepiece ----------------------------------------------------

ALPHABET = ["the", "cat", "sat", "on", "mat", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n",
            "é", "€", "日本", "語", "😀", "1", "23", "456", ".", ",", "<b>", "</h1>", "x"]


@pytest.mark.parametrize("seed,n", [(1, 2000), (2, 5000), (3, 12000)])
def test_long_texts_equal_sentencepiece(gemma, model, seed, n):
    """Texts of thousands of symbols, one long segment and many short ones: the engine's ids
    are sentencepiece's, BOS first."""
    sp = spm.SentencePieceProcessor(model_file=str(fixture_path("tok_a.model")))
    rng = random.Random(seed)
    for text in (words(seed, n), "".join(rng.choice(ALPHABET) for _ in range(n // 3))):
        text = text.strip("\n") or "x"
        want = [sp.bos_id()] + sp.encode(text)
        got = engine_ids(gemma, model, text.encode())
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"{len(text)} characters, first difference at id {first}"


def test_twin_heap_merges_as_a_full_rescan(model):
    """The twin's heap (the asm's algorithm) against the plain statement of BPE: rescan every
    adjacent pair, merge the best (highest score, leftmost on ties), until none is a piece."""
    tok = Tokenizer(ModelFile(model))

    def rescan(s: bytes, start: list[int], length: list[int], ids: list[int]) -> None:
        sym = [[a, a + n] for a, n in zip(start, length)]
        while True:
            best, score = -1, 0.0
            for j in range(len(sym) - 1):
                pid = tok.lookup(s[sym[j][0]:sym[j + 1][1]])
                if pid >= 0 and (best < 0 or tok.scores[pid] > score):
                    best, score = j, tok.scores[pid]
            if best < 0:
                break
            sym[best][1] = sym.pop(best + 1)[1]
        ends = {a: b - a for a, b in sym}
        length[:] = [ends.get(a, 0) for a in start]
        ids[:] = [tok.lookup(s[a:a + n]) for a, n in zip(start, length)]

    heap_ids = [tok.encode(t.encode()) for t in (words(7, 600), words(8, 300, "  "))]
    tok.merge = rescan
    assert [tok.encode(t.encode()) for t in (words(7, 600), words(8, 300, "  "))] == heap_ids


# ---- cost in instructions ----------------------------------------------------------------

def test_instruction_counter_counts_exactly():
    """The counter itself: a loop of a known number of instructions."""
    n = 1000
    prog = assemble({"loop": f"mov ecx, {n}\nagain: dec ecx\njnz again\n"
                             "mov eax, 231\nxor edi, edi\nsyscall"})
    assert run_program(prog, ["loop"], count=True).instructions == 1 + 2 * n + 3


def tokenize_cost(image, model: bytes, text: str, ctx: int = MAX_CTX,
                  count: bool = True) -> tuple[int, bytes]:
    """(instructions of `--tokens -p text` minus those of the empty prompt's run, stderr).
    Without `count`, text's run has no --tokens, so that a prompt too long for -c is refused
    (--tokens counts any prompt): the refusal comes in tokenize, before any forward pass, and
    setup runs the same instructions until then with or without --tokens."""
    def run(prompt: str, flags: list[str]):
        r = run_program(image, ["gemma", "-m", "model.bin", "-c", str(ctx), *flags, "-p",
                                prompt], files={"model.bin": model}, count=True, timeout=600)
        return r.instructions, r.stderr
    empty, err = run("", ["--tokens"])
    assert err == b"", err
    total, err = run(text, ["--tokens"] if count else [])
    return total - empty, err


def test_merging_grows_like_n_log_n(image, model):
    """One segment (single spaces: no user piece) of n, 2n, 4n and 8n bytes (prefixes of one
    text): every step that doubles the text may at most multiply the tokenizer's instructions
    by 2 log2(2m) / log2(m) (m the shorter length in bytes): the ratio of n log n. Every
    bound of the algorithm is of that form: at most 3 heap pushes per symbol (the initial
    pairs and two per merge), each push and pop O(log n), each lookup a binary search in the
    vocabulary (n does not enter), at most the bytes' symbols. Merging by rescanning every
    pair after each merge would multiply by about 4."""
    data = model.read_bytes()
    n = 1024
    text = words(11, 8 * n)
    costs = []
    for m in (n, 2 * n, 4 * n, 8 * n):
        prefix = text.encode()[:m].decode(errors="ignore").rstrip()
        cost, err = tokenize_cost(image, data, prefix)
        assert err == b"", err
        costs.append((len(prefix.encode()), cost))
    print("bytes, instructions:", costs)
    for (m, a), (m2, b) in zip(costs, costs[1:]):
        bound = (m2 * math.log2(m2)) / (m * math.log2(m))
        assert b / a <= bound, f"{m} -> {m2} bytes: instructions {a} -> {b}, x{b / a:.3f} " \
                               f"> x{bound:.3f}"


def test_user_pieces_are_found_by_their_first_byte(image, tok_a, tmp_path):
    """4,000 more user pieces, none starting with a byte of the text: tokenizing costs the
    same instructions, to the instruction (building the index is part of the empty prompt's
    run too). Scanning the whole user table at every position cost ~4,000 comparisons per
    position."""
    small = write_vocab_model(tmp_path / "small.bin", tok_a).read_bytes()
    extra = [b"~%d~" % i for i in range(4000)]
    large = write_vocab_model(tmp_path / "large.bin", with_user_pieces(tok_a, extra)).read_bytes()
    text = words(12, 1500, sep=" ") + "\t<b>x</b>\n\nthe  end"
    a, err_a = tokenize_cost(image, small, text)
    b, err_b = tokenize_cost(image, large, text)
    assert err_a == err_b == b""
    assert a == b, f"{a} instructions with {len(tok_a.pieces)} pieces, {b} with 4,000 more"


CANDIDATE = 40              # instructions, at most, to try a user piece that cannot match


def test_user_pieces_with_another_last_byte_are_not_compared(image, tok_a, tmp_path):
    """200 more user pieces `<`, k `a` and `>` (k = 1..200) at every `<` of a text of `<`
    and 250 `a`: each is longer than the text left or ends in another byte, so trying one
    may cost at most CANDIDATE instructions (the loop, `piece`, the two checks). Comparing
    their bytes (Unicorn counts each step of `repe cmpsb`) would cost ~k + 1 more each:
    ~100 on average. (Gemma 3 has 6,321 user pieces that start with `<`: a text full of `<`
    tried them all at every one.)"""
    small = write_vocab_model(tmp_path / "small.bin", tok_a).read_bytes()
    extra = [b"<" + b"a" * k + b">" for k in range(1, 201)]
    large = write_vocab_model(tmp_path / "large.bin", with_user_pieces(tok_a, extra)).read_bytes()
    text = " ".join(["<" + "a" * 250] * 4)
    a, err_a = tokenize_cost(image, small, text)
    b, err_b = tokenize_cost(image, large, text)
    assert err_a == err_b == b""
    tries = 4 * len(extra)
    print(f"{a} instructions without the pieces, {b} with them: {(b - a) / tries:.1f} a try")
    assert 0 < b - a <= CANDIDATE * tries, f"{(b - a) / tries:.1f} instructions a try"


def test_too_long_prompt_is_refused_as_soon_as_its_ids_exceed_the_context(image, tok_a,
                                                                             tmp_path):
    """Paragraphs (segments end at the user piece "\n\n") whose ids exceed -c 200 within
    the first of eight copies: the seven more copies cost at most NORMALISE instructions per
    byte (the pass that turns spaces into U+2581 reads every byte; tokenizing costs ~100 per
    byte and more). A user piece of 255 bytes makes the instant byte-length guard (ctx x the
    longest piece) weak enough to let these texts through. The refused runs have no --tokens
    (which counts any prompt): the refusal comes in tokenize, before any forward pass."""
    vocab = with_user_pieces(tok_a, [b"~" * 255])
    data = write_vocab_model(tmp_path / "long_piece.bin", vocab).read_bytes()
    paragraph = "\n\n".join(words(seed, 300) for seed in range(20, 26))
    ids = Tokenizer(ModelFile(tmp_path / "long_piece.bin")).encode(paragraph.encode())
    assert len(ids) > 200 and 8 * len(paragraph.encode()) < 200 * 255
    one, err1 = tokenize_cost(image, data, paragraph, ctx=200, count=False)
    eight, err8 = tokenize_cost(image, data, "\n\n".join([paragraph] * 8), ctx=200, count=False)
    assert err1 == err8 == b"gemma: prompt too long\n"
    more = 7 * len(paragraph.encode()) + 2 * 7
    fits, err = tokenize_cost(image, data, paragraph, ctx=len(ids))
    print(f"one copy refused: {one}, eight refused: {eight}, one tokenized: {fits} "
          f"instructions; {more} more bytes")
    assert eight - one <= NORMALISE * more, f"one copy {one} instructions, eight {eight}"
    assert err == b"" and fits > one > NORMALISE * len(paragraph.encode())
