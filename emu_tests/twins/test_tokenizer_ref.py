"""builder.twins.tokenizer (the asm tokenizer's Python twin) against sentencepiece's recorded ids
(fixtures/tok_a.encodings.json), reading the tables of the converted tiny_mqa model."""
from __future__ import annotations

import json

import pytest

from builder.models.modelfile import ModelFile
from builder.twins.tokenizer import Tokenizer, char_len
from modelfiles import convert_fixture, fixture_path

CASES = json.loads(fixture_path("tok_a.encodings.json").read_text())["cases"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer(ModelFile(convert_fixture("tiny_mqa", "hf", tmp_path_factory.getbasetemp())))


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
