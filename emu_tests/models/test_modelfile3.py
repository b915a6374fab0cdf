"""builder.models.modelfile3 (model file version 3): the header and layer record layouts are the
ones docs/format.md fixes, files round-trip (records, rope tables with their non-rotating
pairs, merges, every tensor), the layout follows each layer's flags, Gemma 1-3 in version 3
hold version 2's weights exactly, and the reader refuses what the engine must refuse --
each rule by a hand-made corruption, then random corruptions of the header, the records and
the merges, which must always end in ModelFormatError or a valid file (never another error)."""
from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from builder.models import modelfile3 as mf3
from builder.models.modelfile import (BYTE, CONTROL, NORMAL, POST_NORMS, Q8_0, QK_NORM, TENSOR_ALIGN, USER_DEFINED,
                                      WEIGHTS_ALIGN, ModelFile, ModelFormatError, Vocab)
from builder.models.modelfile3 import (HEADER_FIELDS, K_EQ_V, LAYER_FIELDS, LAYER_REC, MERGES, MOE, V_NORM, Layer,
                                       Model, ModelFile3, Rope, open_model, rope_table, tensor_layout, write_model)
from modelfiles import TWINS, convert_fixture, random_source

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "format.md"
G4 = POST_NORMS | QK_NORM


def vocab_with_merges() -> Vocab:
    pieces = [b"<pad>", b"</s>", b"<s>", b"<unk>", b"<turn|>", b"\xe2\x96\x81\xe2\x96\x81"]
    types = [CONTROL, CONTROL, CONTROL, CONTROL, CONTROL, USER_DEFINED]
    pieces += [b"<0x%02X>" % b for b in range(256)]
    types += [BYTE] * 256
    pieces += [b"a", b"b", b"ab", b"\xe2\x96\x81", b"ba", b"aba"]
    types += [NORMAL] * 6
    a, b, ab, sp, ba = 262, 263, 264, 265, 266
    merges = [(a, b), (sp, sp), (b, a), (ab, a), (a, ba)]
    return Vocab(pieces, [0.0] * len(pieces), types, bos=2, eos=1, merges=merges)


# A small Gemma 4-like model: a sliding and a full layer that compute K/V (the full one with
# k = v, its own head_dim, kv heads and FFN), a sliding layer reading layer 0's cache, a full
# one reading layer 1's; MoE and per-layer inputs everywhere.
LAYERS = (Layer(8, 2, 40, 0, 5, G4 | V_NORM | MOE, 1.0, 0.75),
          Layer(16, 1, 48, 1, 0, G4 | V_NORM | K_EQ_V | MOE, 1.0, 1.25),
          Layer(8, 2, 80, 0, 5, G4 | MOE, 1.0, 0.5),
          Layer(16, 1, 80, 1, 0, G4 | MOE, 1.0, 1.5))
MODEL = Model(268, 32, 4, 64, LAYERS, ple_dim=8, experts=3, top_k=2, expert_ffn=32, flags=MERGES,
              final_softcap=30.0)
ROPES = [Rope(1e4), Rope(1e6, 1.0, 2), Rope(1e4), Rope(1e6, 1.0, 2)]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("mf3") / "m.bin"
    return path, write_model(path, MODEL, vocab_with_merges(), random_source(1), ROPES, progress=False)


def test_header_and_records_match_format_md():
    # docs/format.md, "Version 3": the header table, then the layer record table
    codes = {"8 bytes": "8s", "u32": "I", "f32": "f", "u64": "Q"}
    text = FORMAT_MD.read_text().split("## Version 3", 1)[1]
    header, record = text.split("### Layer record", 1)
    rows = lambda t: [(n, int(o), codes[c]) for o, n, c in re.findall(r"^\| (\d+) \| (\w+) \| ([\w ]+?) \|", t, re.M)]  # noqa: E731
    assert rows(header.split("### Layer record")[0]) == HEADER_FIELDS
    assert rows(record.split("###", 1)[0]) == LAYER_FIELDS
    assert (mf3.VERSION, LAYER_REC, mf3.MERGE_REC) == (3, 32, 16)


def test_round_trip(written):
    path, header = written
    m = open_model(path)
    assert isinstance(m, ModelFile3) and m.header == header
    assert m.model == dataclasses.replace(MODEL, eps=float(np.float32(1e-6)))  # eps stored as f32
    v = vocab_with_merges()
    assert m.pieces == v.pieces and m.types.tolist() == v.types
    assert (header.eot, header.n_merges, header.flags) == (4, 5, MERGES)
    # merges sorted by (left, right), each with its result and score -rank
    want = sorted((a, b, v.pieces.index(v.pieces[a] + v.pieces[b]), -r) for r, (a, b) in enumerate(v.merges))
    assert [(*row, s) for row, s in zip(m.merges.tolist(), m.merge_scores.tolist())] == want
    assert header.weights_off % WEIGHTS_ALIGN == 0 and header.file_size == path.stat().st_size
    for spec in m.specs:
        assert spec.offset % TENSOR_ALIGN == 0, spec
        if spec.name.endswith(".rope"):
            i = int(spec.name.split(".")[1])
            assert np.array_equal(m.tensor(spec.name), rope_table(LAYERS[i].head_dim, ROPES[i]))
            continue
        want = next(iter(random_source(1)(spec)))
        assert np.array_equal(m.tensor(spec.name), want.astype(np.float16 if spec.dtype == "f16" else np.float32))


def test_rope_tables_leave_the_other_pairs_unrotated(written):
    m = ModelFile3(written[0])
    full = m.tensor("layers.1.rope")
    assert full.shape == (8,) and (full[:2] > 0).all() and (full[2:] == 0).all()
    assert (m.tensor("layers.0.rope") > 0).all()
    # the exponent is over the whole head_dim, not over 2 x the rotated pairs
    assert full[1] == np.float32(1) / np.float32(np.float64(np.float32(1e6)) ** np.float64(np.float32(2 / 16)))


def test_layout_follows_each_layer():
    names = [s.name for s in tensor_layout(MODEL)]
    assert names[:4] == ["embed", "ple_embed", "ple_proj", "ple_norm"] and names[-1] == "final_norm"
    layer = lambda i: [n.split(".", 2)[2] for n in names if n.startswith(f"layers.{i}.")]  # noqa: E731
    moe = ["post_ffn_norm_1", "router_scale", "router", "expert_scale", "ffn_norm_2", "experts_gate_up",
           "experts_down", "post_ffn_norm_2", "post_ffn_norm", "ple_gate", "ple_out", "ple_post_norm"]
    assert layer(0) == ["rope", "attn_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_attn_norm",
                        "ffn_norm", "gate", "up", "down"] + moe
    assert layer(1) == ["rope", "attn_norm", "wq", "wk", "q_norm", "k_norm", "wo", "post_attn_norm",
                        "ffn_norm", "gate", "up", "down"] + moe  # k = v: no wv
    assert layer(3) == ["rope", "attn_norm", "wq", "q_norm", "wo", "post_attn_norm",
                        "ffn_norm", "gate", "up", "down"] + moe  # kv-shared: no wk, wv, k_norm
    s = {x.name: x for x in tensor_layout(mf3.with_q8_0(MODEL))}
    assert s["layers.1.wq"].shape == (64, 32) and s["layers.1.wk"].shape == (16, 32)
    assert s["layers.2.experts_gate_up"].shape == (3, 64, 32) and s["layers.2.experts_down"].shape == (3, 32, 32)
    assert s["ple_embed"].shape == (268, 32) and s["layers.0.ple_out"].shape == (32, 8)
    # Q8_0: every matrix whose rows are whole blocks (ple_out's rows of 8 and down's of 40 are
    # not); the router, the scales and the norms stay FP32
    kinds = {n: x.dtype for n, x in s.items()}
    assert kinds["ple_embed"] == kinds["layers.2.experts_gate_up"] == kinds["layers.2.experts_down"] == "q8_0"
    assert kinds["layers.0.ple_out"] == kinds["layers.0.down"] == "f16"
    assert kinds["layers.0.router"] == kinds["layers.0.expert_scale"] == kinds["layers.0.router_scale"] == "f32"


@pytest.mark.parametrize("name", TWINS)
def test_gemma123_in_version_3_hold_version_2s_weights(tmp_path_factory, name):
    out = tmp_path_factory.getbasetemp()
    v2, v3 = ModelFile(convert_fixture(name, "hf", out, 2)), ModelFile3(convert_fixture(name, "hf", out, 3))
    assert v3.pieces == v2.pieces and v3.header.n_merges == 0 and v3.header.flags == v2.dims.flags & Q8_0
    for i, layer in enumerate(v3.model.layers):
        assert layer == Layer(v2.dims.head_dim, v2.dims.kv_heads, v2.dims.ffn, i,
                              int(v2.tensor(f"layers.{i}.window")[0]), v2.dims.flags, v2.dims.att_scale)
    assert [s.name for s in v3.specs] == [s.name for s in v2._layout.values() if not s.name.endswith(".window")]
    for s in v3.specs:
        assert v3.raw(s.name).tobytes() == v2.raw(s.name).tobytes(), s.name


# ---- what a reader refuses ---------------------------------------------------------------


def edit_model(written, tmp_path: Path, **changes) -> Path:
    """The written file with header fields (and layer i's record fields: layer{i}={...})
    changed in place: the reader checks the records before it derives any offset from them."""
    data = bytearray(written[0].read_bytes())
    for key, value in changes.items():
        if key.startswith("layer"):
            for name, v in value.items():
                put(data, LAYER_FIELDS, name, v, 256 + LAYER_REC * int(key[5:]))
        else:
            put(data, HEADER_FIELDS, key, value)
    (tmp_path / "bad.bin").write_bytes(bytes(data))
    return tmp_path / "bad.bin"


def put(data: bytearray, table, name: str, value, base: int = 0) -> None:
    off, code = next((o, c) for n, o, c in table if n == name)
    struct.pack_into("<" + code, data, base + off, value)


@pytest.mark.parametrize("changes, message", [
    (dict(layer3=dict(kv_source=4)), "layer 3: reads the K/V cache of layer 4, not an earlier one"),
    (dict(layer2=dict(kv_source=1)), "layer 2: reads layer 1's K/V cache, a layer of another kind"),
    (dict(layer3=dict(kv_source=2)), "layer 3: reads layer 2's K/V cache, which that layer does not compute"),
    (dict(layer3=dict(flags=G4 | MOE | V_NORM)), "layer 3: computes no K/V (reads layer 1's) but has flags 0x4"),
    (dict(layer0=dict(flags=G4 | 64)), "layer 0: flags 0x43 has unknown bits"),
    (dict(layer0=dict(flags=QK_NORM | MOE)), "layer 0: a MoE block needs the post norms"),
    (dict(layer1=dict(head_dim=15)), "layer 1: head_dim (15) is odd"),
    (dict(layer1=dict(ffn=30)), "layer 1: ffn (30) is not a multiple of 4"),
    (dict(expert_ffn=34), "expert_ffn (34) is not a multiple of 4"),
    (dict(layer1=dict(kv_heads=3)), "layer 1: heads (4) is not a multiple of kv_heads (3)"),
    (dict(layer1=dict(kv_heads=0)), "layer 1: kv_heads = 0 is out of range"),
    (dict(layer2=dict(layer_scalar=float("nan"))), "layer 2: layer_scalar (nan) must be positive and finite"),
    (dict(layer2=dict(att_scale=0.0)), "layer 2: att_scale (0.0) must be positive and finite"),
    (dict(top_k=4), "top_k 4 is not 1 .. experts (3)"),
    (dict(top_k=0), "top_k 0 is not 1 .. experts (3)"),
    (dict(experts=0, top_k=0, expert_ffn=0), "no experts, but top_k 0, expert_ffn 0, 4 MoE layers"),
    (dict(experts=2000), "experts = 2000 is out of range (0 .. 1024"),
    (dict(expert_ffn=0), "3 experts but expert_ffn 0"),
    (dict(flags=MERGES | 1), "flags 0x9 has unknown bits"),
    (dict(final_softcap=-1.0), "final_softcap (-1.0) must be 0 (none) or positive and finite"),
])
def test_reader_refuses(written, tmp_path, changes, message):
    with pytest.raises(ModelFormatError) as e:
        ModelFile3(edit_model(written, tmp_path, **changes))
    assert message in str(e.value) and "\n" not in str(e.value)


def merge_at(data: bytearray, h, k: int, field: int, value) -> None:
    struct.pack_into("<f" if field == 3 else "<I", data, h.merges_off + 16 * k + 4 * field, value)


@pytest.mark.parametrize("edit, message", [
    (lambda d, h: put(d, HEADER_FIELDS, "version", 2), "unsupported version 2"),
    (lambda d, h: put(d, HEADER_FIELDS, "embed_scale", 5.0), "embed_scale 5.0 is not float32"),
    (lambda d, h: put(d, HEADER_FIELDS, "ple_scale", 0.0), "ple_scale 0.0 is not float32"),
    (lambda d, h: put(d, HEADER_FIELDS, "dim_rsqrt", 1.0), "dim_rsqrt 1.0 is not float32"),
    (lambda d, h: put(d, HEADER_FIELDS, "layers", 5), "layer 4: kv_heads = 0"),  # a piece record read as one
    (lambda d, h: put(d, HEADER_FIELDS, "layers", 0), "layers = 0 is out of range"),
    (lambda d, h: put(d, HEADER_FIELDS, "ple_dim", 4), "weights_size is"),
    (lambda d, h: put(d, HEADER_FIELDS, "n_merges", 4), "blob_off is"),
    (lambda d, h: put(d, HEADER_FIELDS, "flags", 0), "merges without the MERGES flag"),
    (lambda d, h: put(d, LAYER_FIELDS, "ffn", 44, 256), "weights_size is"),
    (lambda d, h: merge_at(d, h, 2, 0, 9999), "a merge holds an id outside the vocabulary"),
    (lambda d, h: merge_at(d, h, 4, 2, 9999), "a merge holds an id outside the vocabulary"),
    (lambda d, h: merge_at(d, h, 0, 0, 265), "not sorted by (left, right)"),
    (lambda d, h: merge_at(d, h, 0, 3, -7.0), "merge scores are not -rank"),
    (lambda d, h: merge_at(d, h, 0, 2, 263), "its result is not its pieces joined"),
    (lambda d, h: d.__delitem__(slice(-1, None)), "truncated"),
])
def test_reader_refuses_corrupt_bytes(written, tmp_path, edit, message):
    data = bytearray(written[0].read_bytes())
    edit(data, written[1])
    (tmp_path / "bad.bin").write_bytes(bytes(data))
    with pytest.raises(ModelFormatError) as e:
        ModelFile3(tmp_path / "bad.bin")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_random_corruptions_are_refused_cleanly(written, tmp_path):
    """5,000 random corruptions of the bytes before the tables' blob (header, layer records,
    piece records, index, user table, merges): 1-4 bytes each set to random values. A reader
    must answer each with a ModelFormatError (one line) or a model that passes every check --
    never another exception."""
    data = written[0].read_bytes()
    h = written[1]
    rng = np.random.default_rng(3)
    refused = 0
    for k in range(5000):
        bad = bytearray(data)
        for at in rng.integers(0, h.blob_off, rng.integers(1, 5)):
            bad[at] = int(rng.integers(0, 256))
        path = tmp_path / f"f{k % 2}.bin"
        path.write_bytes(bytes(bad))
        try:
            ModelFile3(path).model.check()
        except ModelFormatError as e:
            assert "\n" not in str(e)
            refused += 1
    assert refused > 4000, refused  # most corruptions are caught (the rest hit scores or ids)


@pytest.mark.parametrize("model, ropes, message", [
    (MODEL, ROPES[:3], "3 rope settings for 4 layers"),
    (MODEL, [Rope(0.0)] + ROPES[1:], "layer 0: rope theta (0.0)"),
    (MODEL, [Rope(1e4, 1.0, 5)] + ROPES[1:], "5 rotated pairs for head_dim 8"),
    (dataclasses.replace(MODEL, flags=0), ROPES, "MERGES flag must be set exactly when"),
])
def test_writer_refuses(tmp_path, model, ropes, message):
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        write_model(tmp_path / "o.bin", model, vocab_with_merges(), random_source(0), ropes, progress=False)


@pytest.mark.parametrize("merges, message", [
    ([(262, 263), (262, 263)], "merge 1 (262, 263) is listed twice"),
    ([(262, 262)], "merge 0: b'aa' is not a piece"),
    ([(262, 999)], "merge 0 (262, 999) is outside the vocabulary"),
])
def test_writer_refuses_bad_merges(tmp_path, merges, message):
    v = vocab_with_merges()
    v.merges = merges
    with pytest.raises(ModelFormatError, match=re.escape(message)):
        write_model(tmp_path / "o.bin", MODEL, v, random_source(0), ROPES, progress=False)


def test_version_2_refuses_merges(tmp_path):
    from builder.models.modelfile import Dims, write_model as write_v2
    with pytest.raises(ModelFormatError, match="needs model file version 3"):
        write_v2(tmp_path / "o.bin", Dims(268, 16, 32, 1, 2, 1, 8, 16), vocab_with_merges(), random_source(0),
                 progress=False)
