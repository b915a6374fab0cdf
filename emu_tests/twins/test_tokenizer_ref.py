"""builder.twins.tokenizer (the asm tokenizer's Python twin) against sentencepiece's recorded ids
(fixtures/tok_a.encodings.json), reading the tables of the converted tiny_mqa model; and, for
Gemma 4 (model file version 3 with merges), against transformers' merge-rank BPE ids
(fixtures/tok_a.bpe_encodings.json) from the tables of tiny_g4 converted from its tokenizer.json
and from its GGUF."""
from __future__ import annotations

import json

import pytest

import numpy as np

from builder.models.modelfile import ModelFile
from builder.models.modelfile3 import open_model
from builder.twins.tokenizer import Tokenizer, char_len
from modelfiles import convert_fixture, fixture_path

CASES = json.loads(fixture_path("tok_a.encodings.json").read_text())["cases"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer(open_model(convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp())))


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_encode_matches_sentencepiece(tok, case):
    got = tok.encode(case["text"].encode())
    want = case["ids"]
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert got == want, (f"{case['text']!r}: first difference at index {first}: "
                         f"expected {want[first:first + 4]}, got {got[first:first + 4]}")


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_decode_round_trips(tok, case):
    # Decoding turns U+2581 into a space (as sentencepiece does), so a text that contains a
    # literal U+2581 comes back with spaces there; BOS decodes to nothing.
    assert tok.decode(case["ids"]) == case["text"].replace("\u2581", " ").encode()


def test_invalid_utf8_falls_back_to_bytes(tok):
    # Not in the fixture (sentencepiece only sees str): a stray continuation byte, a
    # truncated 3-byte sequence, a bad lead byte each become one byte piece; the rest merges.
    text = b"a\x80b\xe4\xb8c\xff"
    ids = tok.encode(text)
    bb = tok.byte_base
    assert ids[0] == tok.bos
    assert [i - bb for i in ids if bb <= i < bb + 256] == [0x80, 0xE4, 0xB8, 0xFF]
    assert tok.decode(ids) == text


@pytest.mark.parametrize("data, i, n", [(b"a", 0, 1), ("é".encode(), 0, 2), ("中".encode(), 0, 3),
                                        ("😀".encode(), 0, 4), (b"\xe4\xb8", 0, 1), (b"\x80", 0, 1),
                                        (b"\xf8\x80\x80\x80", 0, 1), (b"\xc3(", 0, 1)])
def test_char_len(data, i, n):
    assert char_len(data, i) == n


# ---- Gemma 4: BPE by merge rank (model file version 3, MERGES) --------------------------------

BPE_CASES = json.loads(fixture_path("tok_a.bpe_encodings.json").read_text())["cases"]


@pytest.fixture(scope="module", params=["hf", "gguf"])
def bpe(request, tmp_path_factory):
    """tok_a as Gemma 4 ships it (tokenizer.json's merges; the GGUF's tokenizer.ggml.merges)."""
    return Tokenizer(open_model(convert_fixture("tiny_g4", request.param, tmp_path_factory.getbasetemp())))


def test_bpe_encodes_as_transformers(bpe):
    # all 225 strings, 21 of which sentencepiece tokenizes otherwise (runs of spaces: the
    # added tokens ▁▁ .. ▁▁▁▁ match only a literal ▁ run in the raw text, and BPE splits a
    # space run by merge rank)
    bad = [(c["text"], bpe.encode(c["text"].encode()), c["ids"]) for c in BPE_CASES
           if bpe.encode(c["text"].encode()) != c["ids"]]
    assert not bad, f"{len(bad)} of {len(BPE_CASES)} differ; first: {bad[0]}"
    assert sum(a["ids"] != b["ids"] for a, b in zip(CASES, BPE_CASES)) == 21  # the cases tell the two apart


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4k", "tiny_g4moe"])
def test_bpe_encodes_the_fixture_prompts(bpe, name):
    for p in json.loads((fixture_path(name) / "reference.json").read_text())["prompts"]:
        assert bpe.encode(p["text"].encode()) == p["ids"], p["text"]


def test_bpe_decode_round_trips(bpe):
    for c in BPE_CASES:
        assert bpe.decode(c["ids"]) == c["text"].replace("\u2581", " ").encode()


def test_merges_are_ranked_pairs(tmp_path):
    """BPE by rank merges listed pairs only, lowest rank first wherever it stands: with pieces
    x y z xy yz yx and merges [(y, z), (x, y)], "xyz" becomes x + yz (rank 0 on the right beats
    rank 1 on the left) and "yx" stays y + x (a piece, but no merge makes it)."""
    from builder.models.modelfile import BYTE, CONTROL, NORMAL, Vocab
    from builder.models.modelfile3 import MERGES, Layer, Model, Rope, write_model
    pieces = [b"<pad>", b"</s>", b"<s>"] + [b"<0x%02X>" % b for b in range(256)] + [b"x", b"y", b"z", b"xy", b"yz", b"yx"]
    types = [CONTROL] * 3 + [BYTE] * 256 + [NORMAL] * 6
    x, y, z, xy, yz, yx = range(259, 265)
    vocab = Vocab(pieces, [0.0] * len(pieces), types, bos=2, eos=1, merges=[(y, z), (x, y)])
    model = Model(len(pieces), 32, 1, 8, (Layer(2, 1, 32, 0),), flags=MERGES)
    write_model(tmp_path / "t.bin", model, vocab, lambda s: [np.zeros(s.shape, np.float32)], [Rope()], progress=False)
    tok = Tokenizer(open_model(tmp_path / "t.bin"))
    assert tok.encode(b"xyz") == [2, x, yz] and tok.encode(b"yx") == [2, y, x] and tok.encode(b"xy") == [2, xy]
