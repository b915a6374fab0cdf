"""builder.models.modelfile: the header layout is the one docs/format.md fixes (its table and the
copy below), files round-trip (each layer's window and rope included), the optional tensors
follow the flags, and the reader rejects wrong magic, version, truncation, inconsistent sizes
and out-of-range scalars."""
from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from builder.models.modelfile import (BYTE, CONTROL, HEADER_FIELDS, HEADER_SIZE, MAGIC, NORMAL, POST_NORMS,
                               QK_NORM, TENSOR_ALIGN, USER_DEFINED, VERSION, WEIGHTS_ALIGN, Dims,
                               LayerAttn, ModelFile, ModelFormatError, Vocab, read_header, rope_freqs,
                               tensor_layout, write_model)
from modelfiles import random_source

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "format.md"

# docs/format.md, "Header": (name, offset, struct code), copied by hand.
CONTRACT = """magic 0 8s; version 8 I; header_size 12 I; vocab 16 I; dim 20 I; ffn 24 I;
layers 28 I; heads 32 I; kv_heads 36 I; head_dim 40 I; max_ctx 44 I; eps 48 f;
att_scale 52 f; embed_scale 56 f; bos 60 I; eos 64 I; eot 68 I; byte_base 72 I;
n_index 76 I; n_user 80 I; max_piece_len 84 I; pieces_off 88 Q; index_off 96 Q;
user_off 104 Q; blob_off 112 Q; blob_size 120 Q; weights_off 128 Q; weights_size 136 Q;
file_size 144 Q; flags 152 I; att_softcap 156 f; final_softcap 160 f"""


def test_header_fields_match_contract():
    want = [(n, int(o), c) for n, o, c in (f.split() for f in CONTRACT.replace("\n", " ").split(";"))]
    assert HEADER_FIELDS == want
    assert (MAGIC, VERSION, HEADER_SIZE) == (b"GEMMAASM", 2, 256)
    assert (POST_NORMS, QK_NORM) == (1, 2)


def test_format_md_header_table():
    # docs/format.md's header table: `| offset | field | type | meaning |`
    codes = {"8 bytes": "8s", "u32": "I", "f32": "f", "u64": "Q"}
    text = FORMAT_MD.read_text().split("## Version 3")[0]  # (version 3's tables: test_modelfile3.py)
    rows = re.findall(r"^\| (\d+) \| (\w+) \| ([\w ]+?) \|", text, re.M)
    assert [(n, int(o), codes[t]) for o, n, t in rows] == HEADER_FIELDS


def small_vocab() -> Vocab:
    pieces = [b"<pad>", b"</s>", b"<s>", b"<unk>", b"<end_of_turn>", b"\xe2\x96\x81\xe2\x96\x81"]
    types = [CONTROL, CONTROL, CONTROL, 2, USER_DEFINED, USER_DEFINED]
    pieces += [b"<0x%02X>" % b for b in range(256)]
    types += [BYTE] * 256
    pieces += [b"a", b"b", b"ab", b"\xe2\x96\x81", b"ba"]
    types += [NORMAL] * 5
    scores = [0.0] * 262 + [-3.0, -4.0, -1.0, -5.0, -2.0]
    return Vocab(pieces, scores, types, bos=2, eos=1)


DIMS = Dims(vocab=267, dim=16, ffn=40, layers=2, heads=4, kv_heads=2, head_dim=6, max_ctx=32)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("mf") / "m.bin"
    header = write_model(path, DIMS, small_vocab(), random_source(1), progress=False)
    return path, header


def test_round_trip(written):
    path, header = written
    m = ModelFile(path)
    assert m.header == header == read_header(path)
    assert m.dims == dataclasses.replace(DIMS, eps=float(np.float32(1e-6)))  # stored as f32
    v = small_vocab()
    assert m.pieces == v.pieces and m.types.tolist() == v.types
    assert m.scores.tolist() == v.scores
    h = m.header
    # n_user: the 2 user-defined pieces and the 3 control ones, all matched whole in prompts
    assert (h.eot, h.byte_base, h.n_index, h.n_user, h.max_piece_len) == (4, 6, 5, 5, 13)
    assert h.embed_scale == np.float32(4.0)
    assert [m.pieces[i] for i in m.index] == sorted(v.pieces[i] for i in range(262, 267))
    assert m.user.tolist() == [4, 5, 0, 1, 2]  # longest first
    assert h.weights_off % WEIGHTS_ALIGN == 0 and h.file_size == path.stat().st_size
    for spec in tensor_layout(h):
        assert spec.offset % TENSOR_ALIGN == 0, spec
        if spec.name.endswith((".window", ".rope")):  # from write_model's attn (default: full, 10000)
            want = np.array([0], np.uint32) if spec.name.endswith("window") else rope_freqs(6, LayerAttn())
            assert np.array_equal(m.tensor(spec.name), want) and m.tensor(spec.name).dtype == want.dtype
            continue
        want = next(iter(random_source(1)(spec)))
        got = m.tensor(spec.name)
        expect = want.astype(np.float16) if spec.dtype == "f16" else want
        assert got.dtype == expect.dtype and np.array_equal(got, expect), spec.name


def test_layout_order_and_size():
    names = [s.name for s in tensor_layout(DIMS)]
    assert names[0] == "embed" and names[-1] == "final_norm"
    assert names[1:12] == [f"layers.0.{n}" for n in ("window", "rope", "attn_norm", "wq", "wk", "wv", "wo",
                                                      "ffn_norm", "gate", "up", "down")]
    g3 = [s.name for s in tensor_layout(dataclasses.replace(DIMS, flags=POST_NORMS | QK_NORM))]
    assert g3[1:16] == [f"layers.0.{n}" for n in ("window", "rope", "attn_norm", "wq", "wk", "wv", "q_norm", "k_norm",
                                                  "wo", "post_attn_norm", "ffn_norm", "gate", "up", "down",
                                                  "post_ffn_norm")]
    g2 = [s.name for s in tensor_layout(dataclasses.replace(DIMS, flags=POST_NORMS))]
    assert g2 == [n for n in g3 if not n.endswith(("q_norm", "k_norm"))]
    shapes = {s.name: s.shape for s in tensor_layout(DIMS)}
    assert shapes["layers.1.wq"] == (24, 16) and shapes["layers.1.wk"] == (12, 16)
    assert shapes["layers.1.wo"] == (16, 24) and shapes["layers.1.down"] == (16, 40)


def corrupt(path, tmp_path, edit) -> ModelFile:
    data = bytearray(path.read_bytes())
    data = edit(data) or data
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    return ModelFile(bad)


def put(name, value):
    off, code = next((o, c) for n, o, c in HEADER_FIELDS if n == name)
    return lambda d: struct.pack_into("<" + code, d, off, value)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.__setitem__(slice(0, 8), b"GEMMAASX"), "bad magic"),
    (put("version", 1), "unsupported version 1"),
    (put("flags", 8), "unknown bits"),
    (put("att_scale", 0.0), "att_scale (0.0) must be positive"),
    (put("att_softcap", -1.0), "att_softcap (-1.0) must be 0"),
    (put("final_softcap", float("inf")), "final_softcap (inf) must be 0"),
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:100], "truncated"),
    (lambda d: d + b"\0", "header says"),
    (put("dim", 17), "expected"),
    (put("heads", 3), "multiple of kv_heads"),
    (put("blob_size", 10**6), "expected"),
    (put("n_index", 4), "expected"),
    (put("eot", 9999), "outside the vocabulary"),
    (put("max_piece_len", 3), "max_piece_len"),
])
def test_reader_rejects(written, tmp_path, edit, message):
    with pytest.raises(ModelFormatError) as e:
        corrupt(written[0], tmp_path, edit)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_writer_reports_fp16_overflow(tmp_path):
    def source(spec):
        x = np.zeros(spec.shape, np.float32)
        if spec.name == "layers.1.up":
            x[3, 5], x[7, 1], x[8, 2] = 70000.0, -1e6, 65504.0  # 65504 is FP16's max: fine
        yield x
    with pytest.raises(ModelFormatError, match=r"2 value\(s\) overflow FP16 in layers.1.up \(first at \[3, 5\]: 70000\)"):
        write_model(tmp_path / "o.bin", DIMS, small_vocab(), source, progress=False)


@pytest.mark.parametrize("change, message", [
    (lambda v: v.pieces.__setitem__(6 + 65, b"<0xXX>"), "byte pieces are not contiguous"),
    (lambda v: v.pieces.__setitem__(263, b"a"), "are both"),
    (lambda v: v.types.__setitem__(3, 9), "unknown type"),
])
def test_writer_checks_vocab(tmp_path, change, message):
    v = small_vocab()
    change(v)
    with pytest.raises(ModelFormatError, match=message):
        write_model(tmp_path / "o.bin", DIMS, v, random_source(0), progress=False)


def test_per_layer_attention(tmp_path):
    attn = [LayerAttn(512, 10000.0), LayerAttn(0, 1e6, 8.0)]
    dims = dataclasses.replace(DIMS, flags=POST_NORMS | QK_NORM, att_scale=0.125, att_softcap=50.0)
    write_model(tmp_path / "a.bin", dims, small_vocab(), random_source(2), progress=False, attn=attn)
    m = ModelFile(tmp_path / "a.bin")
    assert (m.dims.flags, m.dims.att_scale, m.dims.att_softcap, m.dims.final_softcap) == (3, 0.125, 50.0, 0.0)
    assert m.tensor("layers.0.window").tolist() == [512] and m.tensor("layers.1.window").tolist() == [0]
    assert np.array_equal(m.tensor("layers.1.rope"), rope_freqs(6, LayerAttn(0, 1e6)) / np.float32(8))
    assert m.tensor("layers.1.q_norm").shape == (6,) and m.tensor("layers.0.post_ffn_norm").shape == (16,)


@pytest.mark.parametrize("attn, message", [
    ([LayerAttn()], "1 layers of attention parameters for 2 layers"),
    ([LayerAttn(), LayerAttn(2**32)], "layer 1: sliding window 4294967296 is out of range"),
    ([LayerAttn(0, 0.0), LayerAttn()], "layer 0: rope_theta (0.0) must be positive"),
    ([LayerAttn(), LayerAttn(0, 1e4, float("nan"))], "layer 1: rope_scale (nan) must be positive"),
])
def test_writer_checks_attention(tmp_path, attn, message):
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        write_model(tmp_path / "o.bin", DIMS, small_vocab(), random_source(0), progress=False, attn=attn)


def test_chunked_source_equals_whole(tmp_path, written):
    def chunked(spec):
        whole = next(iter(random_source(1)(spec)))
        rows = whole.reshape(-1, spec.shape[-1])
        for i in range(0, len(rows), 5):
            yield rows[i:i + 5]
    path = tmp_path / "c.bin"
    write_model(path, DIMS, small_vocab(), chunked, progress=False)
    assert path.read_bytes() == written[0].read_bytes()
