"""The engine's tokenizer on model file version 4: merge-rank BPE (header flag MERGES, Gemma 4;
docs/format.md "Tokenizer (version 3)") and score-based BPE (Gemma 1-3), `--tokens` against
independent ids: transformers' (fixtures/tok_a.bpe_encodings.json, tiny_g4 converted from its
tokenizer.json and from its GGUF), sentencepiece's (fixtures/tok_a.encodings.json, tiny_mqa),
and the twin's (builder/twins/tokenizer.py) on random merge-rank vocabularies and texts; and
load_model's checks of the merges against the Python reader's (modelfile4.ModelFile4): the
same files accepted, the same refused."""
from __future__ import annotations

import json
import random
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from builder.models import program
from builder.models.modelfile import (BYTE, CONTROL, NORMAL, POST_NORMS, QK_NORM, USER_DEFINED,
                                      ModelFormatError, Vocab)
from builder.models.modelfile3 import MERGE, MERGE_REC, MERGES, Layer, Model, Rope
from builder.models.modelfile4 import HEADER_FIELDS, ModelFile4
from builder.models.synth import synth_vocab
from builder.twins.tokenizer import SPACE, Tokenizer
from emu_tests.asm_facts import constant
from modelfiles import convert_fixture, fixture_path

TIMEOUT = 30                # seconds per run; each takes milliseconds
MAX_CTX = 4096
OFFSET = {name: off for name, off, _ in HEADER_FIELDS}


def engine(gemma, model: Path, text: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([str(gemma.binary), "-m", str(model), "--tokens", "-p", text],
                          capture_output=True, timeout=TIMEOUT)


def engine_ids(gemma, model: Path, text: bytes) -> list[int]:
    r = engine(gemma, model, text)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


def differences(gemma, model: Path, cases: list[tuple[bytes, list[int]]]) -> list[str]:
    """Each case whose engine ids are not the expected ones, described."""
    out = []
    for text, want in cases:
        got = engine_ids(gemma, model, text)
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            out.append(f"{text[:60]!r}: first difference at id {first}: expected {want[first:first + 4]}, "
                       f"got {got[first:first + 4]}")
    return out


def write_rank_model(path: Path, vocab: Vocab) -> Path:
    """A one-layer Gemma 4 version 4 file (zero weights: only --tokens runs) with `vocab`."""
    model = Model(len(vocab.pieces), 32, 1, MAX_CTX, (Layer(8, 1, 32, 0, flags=POST_NORMS | QK_NORM),))
    prog = program.compile_program(model, [Rope()], 4)
    program.write(path, prog, vocab, lambda s: [np.zeros(s.shape, np.float32)], progress=False)
    return path


# ---- against transformers and sentencepiece ----------------------------------------------

@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_merge_rank_ids_equal_transformers(gemma, tmp_path_factory, source):
    """All 225 strings (21 of them tokenized otherwise by sentencepiece: runs of spaces, which
    the user pieces ▁▁ .. ▁▁▁▁ match only as a literal ▁ run in the raw text and BPE splits by
    merge rank) on tiny_g4's tokenizer."""
    model = convert_fixture("tiny_g4", source, tmp_path_factory.getbasetemp(), version=4)
    assert ModelFile4(model).header.flags & MERGES
    cases = json.loads(fixture_path("tok_a.bpe_encodings.json").read_text())["cases"]
    bad = differences(gemma, model, [(c["text"].encode(), c["ids"]) for c in cases])
    assert not bad, f"{len(bad)} of {len(cases)} differ; first: {bad[0]}"


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4k", "tiny_g4moe"])
def test_gemma4_fixture_prompts(gemma, tmp_path_factory, name):
    """Every Gemma 4 fixture's recorded prompt ids (the three share tiny_g4's tokenizer.json;
    tiny_g4moe's MoE program has no version 4 form yet, so its prompts go through tiny_g4's
    file)."""
    assert fixture_path(name).joinpath("tokenizer.json").read_bytes() == \
        fixture_path("tiny_g4").joinpath("tokenizer.json").read_bytes()
    model = convert_fixture("tiny_g4", "hf", tmp_path_factory.getbasetemp(), version=4)
    prompts = json.loads((fixture_path(name) / "reference.json").read_text())["prompts"]
    bad = differences(gemma, model, [(p["text"].encode(), p["ids"]) for p in prompts])
    assert not bad, f"{len(bad)} of {len(prompts)} differ; first: {bad[0]}"


def test_score_ids_equal_sentencepiece(gemma, tmp_path_factory):
    """The same strings on tiny_mqa (Gemma 1, no MERGES): sentencepiece's BPE by piece score."""
    model = convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp(), version=4)
    assert not ModelFile4(model).header.flags & MERGES
    cases = json.loads(fixture_path("tok_a.encodings.json").read_text())["cases"]
    bad = differences(gemma, model, [(c["text"].encode(), c["ids"]) for c in cases])
    assert not bad, f"{len(bad)} of {len(cases)} differ; first: {bad[0]}"


# ---- against the twin on random vocabularies ---------------------------------------------

def small_vocab(seed: int, space_piece: bool) -> Vocab:
    """Characters (with or without U+2581) and a few hundred random merges of pieces made so
    far, some listed twice under two splits; user pieces with and without U+2581 and spaces."""
    rng = random.Random(seed)
    pieces = [b"<pad>", b"</s>", b"<s>"] + [b"<0x%02X>" % b for b in range(256)]
    types = [CONTROL] * 3 + [BYTE] * 256
    chars = [c.encode() for c in "abcdeé日<>|\n"] + [SPACE] * space_piece
    pieces += chars
    types += [NORMAL] * len(chars)
    normal = list(range(259, len(pieces)))
    merges: list[tuple[int, int]] = []
    while len(merges) < 300:
        a, b = rng.choice(normal), rng.choice(normal)
        joined = pieces[a] + pieces[b]
        if len(joined) > 12 or (a, b) in merges:
            continue
        if joined not in pieces:
            pieces.append(joined)
            types.append(NORMAL)
            normal.append(len(pieces) - 1)
        merges.append((a, b))
    for user in (b"<|turn>", b"<turn|>", SPACE * 2, b"a b", b"\t"):
        if user not in pieces:
            pieces.append(user)
            types.append(USER_DEFINED)
    return Vocab(pieces, [0.0] * len(pieces), types, bos=2, eos=1, merges=merges)


ALPHABET = ["a", "b", "c", "d", "e", "é", "日", "<", ">", "|", "\n", " ", "  ", "   ", "<|turn>",
            "<turn|>", "\u2581", "\t", "a b", "x", "the", "😀"]
BAD_UTF8 = [b"\xff", b"\xc3", b"\xe2\x96", b"\x80", b"\xe2 ", b"\xf0\x9f\x98"]


def random_texts(seed: int, n: int) -> list[bytes]:
    """n texts of the alphabet and stray bytes, up to 60 draws each, then one of 600 draws."""
    rng = random.Random(seed)
    texts = [b"".join(rng.choice(ALPHABET).encode() if rng.random() < 0.9 else rng.choice(BAD_UTF8)
                      for _ in range(rng.randrange(60))) for _ in range(n)]
    return texts + [" ".join(rng.choice(ALPHABET) for _ in range(600)).encode()]


@pytest.mark.parametrize("seed,space_piece", [(1, True), (2, False)])
def test_random_merges_equal_the_twin(gemma, tmp_path, seed, space_piece):
    """Random merge lists on texts of their characters, spaces, U+2581, user pieces and
    invalid UTF-8: the engine's ids are the twin's. Without a U+2581 piece a space falls back
    to the byte pieces of E2 96 81 (the twin's ids show it)."""
    model = write_rank_model(tmp_path / "rank.bin", small_vocab(seed, space_piece))
    tok = Tokenizer(ModelFile4(model))
    cases = [(t, tok.encode(t)) for t in random_texts(seed, 120)]
    spaces = [tok.byte_base + b for b in SPACE]
    assert any(ids[i:i + 3] == spaces for _, ids in cases for i in range(len(ids))) != space_piece
    bad = differences(gemma, model, cases)
    assert not bad, f"{len(bad)} of {len(cases)} differ; first: {bad[0]}"


def test_synth_merges_equal_the_twin(gemma, tmp_path):
    """synth's Gemma 4 vocabulary (2,048 pieces, merges in the order their pieces were made) on
    prose of its own pieces, a few thousand symbols long."""
    vocab = synth_vocab(2048, 5, by_rank=True)
    model = write_rank_model(tmp_path / "synth.bin", vocab)
    tok = Tokenizer(ModelFile4(model))
    rng = random.Random(5)
    words = [p.decode().replace("\u2581", " ") for p, t in zip(vocab.pieces, vocab.types) if t == NORMAL]
    texts = ["".join(rng.choice(words) for _ in range(k)).encode() for k in (1, 10, 100, 1500)]
    bad = differences(gemma, model, [(t, tok.encode(t)) for t in texts])
    assert not bad, f"{len(bad)} differ; first: {bad[0]}"


def test_merges_are_ranked_pairs(gemma, tmp_path):
    """Pieces x y z xy yz yx and merges [(y, z), (x, y)]: "xyz" becomes x + yz (rank 0 on the
    right beats rank 1 on the left) and "yx" stays y + x (a piece, but no merge makes it)."""
    pieces = [b"<pad>", b"</s>", b"<s>"] + [b"<0x%02X>" % b for b in range(256)]
    pieces += [b"x", b"y", b"z", b"xy", b"yz", b"yx"]
    x, y, z, xy, yz, yx = range(259, 265)
    vocab = Vocab(pieces, [0.0] * len(pieces), [CONTROL] * 3 + [BYTE] * 256 + [NORMAL] * 6, bos=2, eos=1,
                  merges=[(y, z), (x, y)])
    model = write_rank_model(tmp_path / "xyz.bin", vocab)
    assert engine_ids(gemma, model, b"xyz") == [2, x, yz]
    assert engine_ids(gemma, model, b"yx") == [2, y, x]
    assert engine_ids(gemma, model, b"xy xy") == [2, xy] + [3 + b for b in SPACE] + [xy]  # no U+2581 piece


# ---- load_model's checks against the Python reader's -------------------------------------

def test_merge_record_fields_are_the_readers():
    """asm/format.asm's MERGE_* offsets are modelfile3.MERGE's fields (left, right, result,
    score; u32, u32, u32, f32)."""
    assert MERGE.format in ("<IIIf", b"<IIIf") and MERGE.size == constant("MERGE_REC")
    assert [constant(f"MERGE_{f}") for f in ("LEFT", "RIGHT", "RESULT", "SCORE")] == [0, 4, 8, 12]


def edited(src: Path, dst: Path, edits: list[tuple[int, bytes]]) -> Path:
    data = bytearray(src.read_bytes())
    for off, b in edits:
        data[off:off + len(b)] = b
    dst.write_bytes(bytes(data))
    return dst


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


@pytest.fixture(scope="module")
def g4(tmp_path_factory) -> Path:
    return convert_fixture("tiny_g4", "hf", tmp_path_factory.getbasetemp(), version=4)


def record_edits(g4: Path) -> dict[str, list[tuple[int, bytes]]]:
    """Edits of tiny_g4's merge records (each breaks one rule), by name."""
    h = ModelFile4(g4).header

    def rec(i: int, field: int = 0) -> int:
        return h.merges_off + MERGE_REC * i + 4 * field
    data = g4.read_bytes()
    first, second = data[rec(0):rec(1)], data[rec(1):rec(2)]
    last = h.n_merges - 1
    return {
        "swapped": [(rec(0), second), (rec(1), first)],     # not sorted by (left, right)
        "twice": [(rec(1), first)],                          # one pair listed twice
        "left": [(rec(last), u32(h.vocab))],                 # still sorted: the last left
        "right": [(rec(last, 1), u32(h.vocab))],
        "right_max": [(rec(last, 1), u32(0xFFFFFFFF))],
        "result": [(rec(3, 2), u32(h.vocab))],
        "other_flag": [(OFFSET["flags"], u32(MERGES | 1))],
        "no_flag": [(OFFSET["flags"], u32(0))],              # merges without MERGES
    }


@pytest.mark.parametrize("name", ["swapped", "twice", "left", "right", "right_max", "result",
                                  "other_flag", "no_flag"])
def test_bad_merges_are_refused_by_both(gemma, g4, tmp_path, name):
    path = edited(g4, tmp_path / f"{name}.bin", record_edits(g4)[name])
    with pytest.raises(ModelFormatError):
        ModelFile4(path)
    r = engine(gemma, path, b"x")
    assert (r.returncode, r.stdout, r.stderr) == (1, b"", b"gemma: bad header\n")


def test_merges_flag_without_merges_is_accepted_by_both(gemma, tmp_path_factory, tmp_path):
    """A Gemma 1 file given the MERGES flag (no merge records): both readers take it, and the
    tokenizer then merges nothing (by rank, no pair has a record): every character its piece or
    its bytes, user pieces on the raw text."""
    src = convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp(), version=4)
    path = edited(src, tmp_path / "flag.bin", [(OFFSET["flags"], u32(MERGES))])
    tok = Tokenizer(ModelFile4(path))
    text = "Hello  world\u2581<start_of_turn>é".encode() + b"\xff"
    ids = tok.encode(text)
    assert all(tok.types[i] == BYTE or i in tok.user or len(tok.pieces[i].decode()) == 1 for i in ids[1:])
    assert engine_ids(gemma, path, text) == ids


@pytest.mark.parametrize("field", ["score", "result"])
def test_merges_only_the_writer_vouches_for_are_accepted_by_both(gemma, g4, tmp_path, field):
    """What only the writer guarantees (modelfile3.check_ranks: scores exactly -rank, each
    result its pieces joined) neither reader refuses: a merge's score or result changed (the
    result still an id of the vocabulary) runs, and the writer's check does refuse it."""
    from builder.models.modelfile3 import check_ranks
    h = ModelFile4(g4).header
    off = h.merges_off + MERGE_REC * 3 + (12 if field == "score" else 8)
    path = edited(g4, tmp_path / f"{field}.bin", [(off, struct.pack("<f", -1e6) if field == "score" else u32(2))])
    f = ModelFile4(path)
    with pytest.raises(ModelFormatError):
        check_ranks(f)
    r = engine(gemma, path, b"Hello world")
    assert r.returncode == 0 and r.stderr == b"", r.stderr
