"""builder.models.convert: both fixture formats give the same model (weights byte for byte) for Gemma
1, 2 and 3, every source variant (dtypes, shards, older config keys, the multimodal Gemma 3
layout, GGUF metadata conventions, quantized tensors) converts as specified, reading is
bounded in memory, and each user error is one clear line.

Files are version 4 (convert's default: what the engine runs) where the test is about the
model the engine gets: byte equality of variants, each layer's window and rope table (the ATTN
and ROPE ops), the soft-caps and scales, the context, the command line. Tests that look a
tensor up by name read version 2 (asked for explicitly): the checkpoint readers give every
version the same tensors (test_modelfile3: version 3 holds version 2's; test_modelfile4:
version 4 version 3's)."""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from builder.models import checkpoint
from builder.models import convert as conv
from builder.models import convert_gguf, convert_hf
from builder.models.gguf_meta import GGUFError, read_gguf_meta
from builder.models.modelfile import (BYTE, CONTROL, DIM_LIMITS, NORMAL, Q8_0, UNKNOWN, UNUSED, USER_DEFINED, LayerAttn,
                                      ModelFile, ModelFormatError, quantize_q8_0, rope_freqs, tensor_layout)
from builder.models.modelfile3 import f32
from builder.models.modelfile4 import HEADER_FIELDS, ModelFile4, Op, WType
from modelfiles import TWINS, convert_fixture, fixture_path
from variants import (K_SCALES, bf16_to_f32, gguf_variant, hf_variant, kv_set, quantized,
                      read_safetensors, write_safetensors)

# ---- helpers --------------------------------------------------------------------------------


def converted(tmp: Path, src: Path) -> bytes:
    out = tmp / (src.name + ".bin")
    conv.convert(src, out, progress=False)
    return out.read_bytes()


def convert_v2(src: Path, out: Path, **kw) -> ModelFile:
    """src converted to model file version 2, opened."""
    conv.convert(src, out, progress=False, version=2, **kw)
    return ModelFile(out)


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory):
    """Each fixture converted with convert's defaults (version 4)."""
    d = tmp_path_factory.mktemp("conv")
    return {(n, s): convert_fixture(n, s, d) for n in TWINS for s in ("hf", "gguf")} | \
        {("tiny_g2q", "hf"): convert_fixture("tiny_g2q", "hf", d)}


def ops_of(path: Path, op: Op) -> list:
    """The ops of one opcode in a version 4 file's program, in program order."""
    return [o for o in ModelFile4(path).ops if o.op == op]


def scalars(path: Path) -> tuple[float, float, float]:
    """(attention scale, attention soft-cap, final soft-cap) of a version 4 file: every ATTN op's
    a and c (one value each across the layers) and the LOGITS op's c."""
    attn = {(o.a, o.c) for o in ops_of(path, Op.ATTN)}
    assert len(attn) == 1, attn
    (scale, cap), = attn
    return scale, cap, ops_of(path, Op.LOGITS)[0].c


def fail(tmp: Path, src: Path, match: str) -> str:
    out = tmp / "out.bin"
    with pytest.raises((conv.ConvertError, ModelFormatError)) as e:
        conv.convert(src, out, progress=False)
    msg = str(e.value)
    assert match in msg, msg
    assert "\n" not in msg and not out.exists()
    return msg


# ---- HF and GGUF give the same model -------------------------------------------------------

# Established on the fixtures: the weights (every tensor, padding included) and every header
# field describing the model are byte-identical; the tokenizer tables legitimately differ in
# one respect: llama.cpp's convert_hf_to_gguf.py marks a piece USER_DEFINED only from
# tokenizer_config.json, which the fixtures lack, so their GGUFs list the 11 user-defined
# pieces of tokenizer.model (<start_of_turn>, tab, U+2581 runs, <h1> ...) as NORMAL. Pieces,
# scores and every other type are identical; hence n_index/n_user differ, the index holds 11
# more ids and the sections after it start 44 bytes later. The converter keeps what each
# source says.
TABLE_FIELDS = {"n_index", "n_user", "user_off", "merges_off", "blob_off"}


@pytest.mark.parametrize("name", TWINS)
def test_hf_and_gguf_give_the_same_model(reference_files, name):
    hf, gg = (ModelFile4(reference_files[name, s]) for s in ("hf", "gguf"))
    for field, _, _ in HEADER_FIELDS[1:]:
        if field not in TABLE_FIELDS:
            assert getattr(hf.header, field) == getattr(gg.header, field), field
    assert gg.header.user_off - hf.header.user_off == 4 * (gg.header.n_index - hf.header.n_index)
    a, b = reference_files[name, "hf"].read_bytes(), reference_files[name, "gguf"].read_bytes()
    program = slice(hf.header.slots_off, hf.header.pieces_off)  # slots, ops, chat strings
    assert a[program] == b[program]
    w = hf.header.weights_off
    assert a[w:] == b[w:], f"weights differ first at byte {next(i for i in range(len(a) - w) if a[w + i] != b[w + i])}"
    assert hf.pieces == gg.pieces and hf.scores.tobytes() == gg.scores.tobytes()
    # the GGUF lists the user-defined pieces as normal ones; control pieces are control in both
    # (and matched whole in prompts: the user table holds them)
    differ = np.flatnonzero(hf.types != gg.types)
    user_defined = sorted(i for i in hf.user.tolist() if hf.types[i] == USER_DEFINED)
    assert differ.tolist() == user_defined
    assert (gg.types[differ] == NORMAL).all()
    assert hf.header.n_index + len(user_defined) == gg.header.n_index
    assert sorted(gg.user.tolist()) == sorted(i for i in hf.user.tolist() if hf.types[i] == CONTROL)


def test_norms_hold_one_plus_w_and_weights_are_exact(tmp_path):
    m = convert_v2(fixture_path("tiny_mqa"), tmp_path / "v2.bin")
    st = read_safetensors(fixture_path("tiny_mqa") / "model.safetensors")
    w = bf16_to_f32(st["model.layers.1.post_attention_layernorm.weight"][2])
    assert np.array_equal(m.tensor("layers.1.ffn_norm"), np.float32(1) + w)
    q = bf16_to_f32(st["model.layers.0.self_attn.q_proj.weight"][2]).reshape(64, 64)
    assert np.array_equal(m.tensor("layers.0.wq").astype(np.float32), q)  # bf16 -> f16 is exact here


# ---- every source variant converts identically -------------------------------------------


def to_dtype(dtype: str):
    def edit(ts):
        for k, (_, shape, data) in ts.items():
            x = bf16_to_f32(data)
            ts[k] = (dtype, shape, (x if dtype == "F32" else x.astype("<f2")).tobytes())
    return edit


def rope_top_level(cfg):
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]


@pytest.mark.parametrize("variant", [dict(tensors=to_dtype("F32")), dict(tensors=to_dtype("F16")),
                                     dict(config=rope_top_level)], ids=["f32", "f16", "rope_theta_top"])
def test_hf_variants(tmp_path, reference_files, variant):
    src = hf_variant(tmp_path, **variant)
    assert converted(tmp_path, src) == reference_files["tiny_mqa", "hf"].read_bytes()


def test_hf_rope_theta_is_read(tmp_path, reference_files):
    src = hf_variant(tmp_path, config=lambda c: c["rope_parameters"].update(rope_theta=500000.0))
    conv.convert(src, tmp_path / "x.bin", progress=False)
    got = attn_of(tmp_path / "x.bin")
    assert len(got) == 2
    for window, rope in got:
        assert np.array_equal(rope, rope_freqs(16, LayerAttn(0, 500000.0)))
        assert window == 0


def test_context_beyond_the_engine_is_capped(tmp_path):
    """Gemma 3 4B and larger say max_position_embeddings 131072: the file gets the engine's
    limit (DIM_LIMITS max_ctx, 65536), so such a model runs with that much context, and the
    engine accepts the header (the reader checks what the engine checks)."""
    src = hf_variant(tmp_path, config=lambda c: c.update(max_position_embeddings=131072))
    conv.convert(src, tmp_path / "x.bin", progress=False)
    assert ModelFile4(tmp_path / "x.bin").header.max_ctx == DIM_LIMITS["max_ctx"] == 65536


@pytest.mark.parametrize("name", TWINS)
def test_hf_sharded(tmp_path, reference_files, name):
    src = hf_variant(tmp_path, name)
    ts = read_safetensors(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = list(ts)
    shards = [names[i::3] for i in range(3)]  # interleaved, so every shard mixes layers
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        write_safetensors(src / file, {k: ts[k] for k in part})
        weight_map.update({k: file for k in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert converted(tmp_path, src) == reference_files[name, "hf"].read_bytes()


def bf16_tensor(a):
    return gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.BF16), gguf.GGMLQuantizationType.BF16


def gguf_types(ts):
    ts["blk.0.attn_q.weight"] = (ts["blk.0.attn_q.weight"][0].astype(np.float32), None)
    ts["blk.1.ffn_up.weight"] = bf16_tensor(ts["blk.1.ffn_up.weight"][0])


def extra_embedding_rows(ts):
    e = ts["token_embd.weight"][0]
    ts["token_embd.weight"] = (np.concatenate([e, np.full((128, e.shape[1]), 7, np.float16)]), None)


def test_gguf_f32_bf16_and_padded_embedding(tmp_path, reference_files):
    # These matrices came from bf16, so F16 -> BF16 is exact and the result must not change
    # (norms hold 1 + w, which bf16 cannot hold exactly, so they stay F32);
    # an embedding with 128 extra rows (as in Gemma's 256128-row GGUFs) is cropped.
    src = gguf_variant(tmp_path, tensors=lambda ts: (gguf_types(ts), extra_embedding_rows(ts)))
    reader = gguf.GGUFReader(src)
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert (kinds["blk.0.attn_q.weight"], kinds["blk.1.ffn_up.weight"]) == ("F32", "BF16")
    assert converted(tmp_path, src) == reference_files["tiny_mqa", "gguf"].read_bytes()


# ---- errors: one line, no output left behind ----------------------------------------------


def test_missing_files(tmp_path):
    fail(tmp_path, tmp_path / "nowhere", "no such file or directory")
    for missing in ("config.json", "tokenizer.model", "model.safetensors"):
        (tmp_path / missing).mkdir()
        src = hf_variant(tmp_path / missing)
        (src / missing).unlink()
        fail(tmp_path, src, f"no {missing}")


def test_missing_shard(tmp_path):
    src = hf_variant(tmp_path)
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    fail(tmp_path, src, "no model-00001-of-00002.safetensors")


def test_missing_tensor(tmp_path):
    src = hf_variant(tmp_path, tensors=lambda ts: ts.pop("model.layers.1.mlp.up_proj.weight"))
    fail(tmp_path, src, "missing tensor for layers.1.up")


@pytest.mark.parametrize("model_type, arch", [("llama", "LlamaForCausalLM"), ("gemma3n", "Gemma3nForCausalLM"),
                                              ("gemma2", "GemmaForCausalLM"), ("gemma3_text", "Gemma3TextModel")])
def test_hf_other_architecture(tmp_path, model_type, arch):
    src = hf_variant(tmp_path, config=lambda c: c.update(model_type=model_type, architectures=[arch]))
    fail(tmp_path, src, f"unsupported architecture '{model_type}'")


@pytest.mark.parametrize("arch", ["gemma3n", "llama"])
def test_gguf_other_architecture(tmp_path, arch):
    fail(tmp_path, gguf_variant(tmp_path, arch=arch), f"unsupported architecture '{arch}'")


def test_hf_shape_mismatch(tmp_path):
    src = hf_variant(tmp_path, config=lambda c: c.update(intermediate_size=252))
    fail(tmp_path, src, "tensor model.layers.0.mlp.gate_proj.weight has shape [256, 64], expected [252, 64]")


def test_hf_ffn_not_a_multiple_of_4(tmp_path):
    """The engine's GEGLU takes four values a pass: the converter refuses such an FFN width."""
    src = hf_variant(tmp_path, config=lambda c: c.update(intermediate_size=255))
    fail(tmp_path, src, "ffn (255) is not a multiple of 4")


def test_gguf_shape_mismatch(tmp_path):
    kv = lambda v: v.update({"gemma.attention.key_length": (8, v["gemma.attention.key_length"][1])})  # noqa: E731
    fail(tmp_path, gguf_variant(tmp_path, kv=kv), "tensor blk.0.attn_q.weight has shape [64, 64], expected [32, 64]")


def test_fp16_overflow(tmp_path):
    def big(ts):
        dtype, shape, data = ts["model.layers.1.mlp.down_proj.weight"]
        x = bf16_to_f32(data).reshape(shape).copy()
        x[10, 3], x[20, 7], x[30, 1] = 1e5, -7e4, 65504.0  # the last one is FP16's max: fine
        ts["model.layers.1.mlp.down_proj.weight"] = ("F32", shape, x.tobytes())
    fail(tmp_path, hf_variant(tmp_path, tensors=big),
         "2 value(s) overflow FP16 in model.layers.1.mlp.down_proj.weight (first at [10, 3]: 100000)")


def test_unsupported_dtype_and_bad_files(tmp_path):
    src = hf_variant(tmp_path, tensors=lambda ts: ts.update(
        {"model.norm.weight": ("I8", [64], bytes(64))}))
    fail(tmp_path, src, "tensor model.norm.weight has dtype I8")
    (src / "model.safetensors").write_bytes(b"\xff" * 16)
    fail(tmp_path, src, "not a safetensors file")
    (src / "tokenizer.model").write_bytes(b"garbage")
    fail(tmp_path, src, "not a sentencepiece model")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\x03" * 30)
    fail(tmp_path, bad, "not a readable GGUF file")


def test_cli(tmp_path, capsys):
    out = tmp_path / "m.bin"
    assert conv.main([str(fixture_path("tiny_wide")), "-o", str(out), "-q"]) == 0
    m = ModelFile4(out)  # version 4 unless --format says otherwise
    assert (m.header.version, m.header.generation, m.ops[0].op, m.ops[0].n) == (4, 1, Op.EMBED, 144)  # d 144
    assert "version 4 (Gemma 1)" in capsys.readouterr().out
    assert conv.main([str(tmp_path / "none"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m builder convert: error:") and "no such file" in err
    with pytest.raises(SystemExit) as e:
        conv.main(["-o"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


# ---- builder.models.gguf_meta against gguf.GGUFReader ---------------------------------------------


@pytest.mark.parametrize("name", TWINS)
def test_gguf_meta_matches_gguf_reader(name):
    path = fixture_path(name) / "model-f16.gguf"
    meta, reader = read_gguf_meta(path), gguf.GGUFReader(path)
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert meta.kv.keys() == want.keys()
    for k, v in want.items():
        assert meta.kv[k] == v, k
    assert list(meta.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        m = meta.tensors[t.name]
        assert (m.type, m.shape, m.offset, m.nbytes) == \
            (t.tensor_type.name, tuple(reversed(t.shape.tolist())), t.data_offset, t.n_bytes), t.name


@pytest.mark.parametrize("name", TWINS)
def test_safetensors_index_matches_safe_open(name):
    """The hand-read index (convert_hf.safetensors_index) lists what safetensors' safe_open
    lists: every name, dtype and shape."""
    from safetensors import safe_open
    path = fixture_path(name) / "model.safetensors"
    index = convert_hf.safetensors_index(path)
    with safe_open(path, framework="numpy") as f:
        want = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    assert {k: (t.dtype, t.shape) for k, t in index.items()} == want


def test_piece_types_are_sentencepieces():
    """modelfile's piece types are sentencepiece's ModelProto ones (sentencepiece_vocab copies
    them across unchanged)."""
    from sentencepiece import sentencepiece_model_pb2
    types = dict(sentencepiece_model_pb2.ModelProto.SentencePiece.Type.items())
    assert types == {"NORMAL": NORMAL, "UNKNOWN": UNKNOWN, "CONTROL": CONTROL,
                     "USER_DEFINED": USER_DEFINED, "UNUSED": UNUSED, "BYTE": BYTE}


def test_gguf_meta_rejects_truncation(tmp_path):
    data = (fixture_path("tiny_mqa") / "model-f16.gguf").read_bytes()
    for cut in (3, 20, 5000, len(data) - 1):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated|bad magic|past the end"):
            read_gguf_meta(tmp_path / "t.gguf")


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(hidden_size="64"), "hidden_size is not an integer"),
    (lambda c: c.pop("intermediate_size"), "no intermediate_size"),
    (lambda c: c.update(num_hidden_layers=10**6), "layers = 1000000 is out of range (1 .. 1024"),
    (lambda c: c.update(num_key_value_heads=3), "heads (4) is not a multiple of kv_heads (3)"),
    (lambda c: c.update(rms_norm_eps=None, head_dim=None), None),  # null means "default"
])
def test_hf_config_values(tmp_path, reference_files, edit, message):
    src = hf_variant(tmp_path, config=edit)
    if message is None:
        assert converted(tmp_path, src) == reference_files["tiny_mqa", "hf"].read_bytes()
    else:
        fail(tmp_path, src, message)


def test_gguf_metadata_types(tmp_path):
    def edit(v):
        v["tokenizer.ggml.scores"] = (["x"] * 2048, [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING])
    fail(tmp_path, gguf_variant(tmp_path, kv=edit), "tokenizer.ggml.scores is not an array of numbers")


# ---- Gemma 2 and 3: what each source says about attention ---------------------------------


def attn_of(path: Path) -> list[tuple[int, np.ndarray]]:
    """Each layer's window (its ATTN op's j) and rope table (its ROPE op's weight), version 4."""
    m = ModelFile4(path)
    windows = [o.j for o in m.ops if o.op == Op.ATTN]
    ropes = [m.weight(o) for o in m.ops if o.op == Op.ROPE]
    assert len(windows) == len(ropes)
    return list(zip(windows, ropes))


def test_gemma2_and_3_headers_and_layers(reference_files):
    g2, g3, g2q = (reference_files[n, "hf"] for n in ("tiny_g2", "tiny_g3", "tiny_g2q"))
    assert ModelFile4(g2).header.generation == 2 and scalars(g2) == (f32(16 ** -0.5), 4.0, 3.0)
    assert ModelFile4(g3).header.generation == 3 and scalars(g3) == (f32(32 ** -0.5), 0.0, 0.0)
    assert scalars(g2q)[0] == f32(20 ** -0.5)  # query_pre_attn_scalar, not head_dim
    slide, full = rope_freqs(16, LayerAttn(5, 10000.0)), rope_freqs(16, LayerAttn(0, 10000.0))
    got = attn_of(reference_files["tiny_g2", "hf"])
    assert [w for w, _ in got] == [5, 0, 5, 0] and all(np.array_equal(r, slide if w else full) for w, r in got)
    got = attn_of(reference_files["tiny_g3", "hf"])
    assert [w for w, _ in got] == [6] * 5 + [0]
    assert all(np.array_equal(r, rope_freqs(32, LayerAttn(0, 1e6 if i == 5 else 1e4))) for i, (_, r) in enumerate(got))


def old_style_g3(c):
    """tiny_g3's config as transformers 4.x wrote it: no layer_types, no rope_parameters."""
    c.pop("layer_types")
    c.pop("rope_parameters")
    c.update(sliding_window_pattern=6, rope_theta=1e6, rope_local_base_freq=1e4)


def multimodal(prefix: str):
    """tiny_g3 as a Gemma3ForConditionalGeneration checkpoint (text under text_config,
    weights under `prefix`, a vision tower beside them)."""
    def config(c):
        text = {k: v for k, v in c.items() if k not in ("architectures", "model_type")}
        c.clear()
        c.update(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
                 text_config=dict(text, model_type="gemma3_text"), vision_config={"hidden_size": 8})

    def tensors(ts):
        for k in list(ts):
            ts[prefix + k.removeprefix("model.")] = ts.pop(k)
        ts["vision_tower.vision_model.post_layernorm.weight"] = ("F32", [8], bytes(32))
        ts["multi_modal_projector.mm_input_projection_weight"] = ("F32", [8, 96], bytes(8 * 96 * 4))
    return dict(config=config, tensors=tensors)


def extra_vocab_rows(cfg_key: str = "vocab_size"):
    """tiny_g3 with 64 embedding rows more than its tokenizer (as Gemma 3's 262208 vs 262144)."""
    def config(c):
        c[cfg_key] = 2048 + 64

    def tensors(ts):
        dtype, shape, data = ts["model.embed_tokens.weight"]
        ts["model.embed_tokens.weight"] = (dtype, [shape[0] + 64, shape[1]], data + b"\x3f" * (64 * shape[1] * 2))
    return dict(config=config, tensors=tensors)


@pytest.mark.parametrize("variant", [
    dict(config=old_style_g3), multimodal("language_model.model."), multimodal("model.language_model."),
    extra_vocab_rows(), dict(config=lambda c: c.update(layer_types=None, sliding_window_pattern=6)),
], ids=["old_keys", "multimodal_language_model", "multimodal_model_language_model", "vocab_262208",
        "sliding_window_pattern"])
def test_gemma3_hf_variants(tmp_path, reference_files, variant):
    src = hf_variant(tmp_path, "tiny_g3", **variant)
    assert converted(tmp_path, src) == reference_files["tiny_g3", "hf"].read_bytes()


def test_gemma3_text_config_defaults(tmp_path):
    # a 4B-like text_config leaves out heads, kv heads and head_dim: Gemma3TextConfig's 8, 4, 256
    def drop(c):
        multimodal("language_model.model.")["config"](c)
        for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar"):
            c["text_config"].pop(k)
    src = hf_variant(tmp_path, "tiny_g3", config=drop, tensors=multimodal("language_model.model.")["tensors"])
    fail(tmp_path, src, "tensor language_model.model.layers.0.self_attn.q_proj.weight has shape [128, 96], "
                        "expected [2048, 96]")


def test_gemma2_defaults_and_nulls(tmp_path, reference_files):
    def absent(c):
        for k in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
            c.pop(k)
    conv.convert(hf_variant(tmp_path, "tiny_g2", config=absent), tmp_path / "a.bin", progress=False)
    assert scalars(tmp_path / "a.bin") == (np.float32(1 / 16), 50.0, 30.0)  # Gemma2Config's
    (tmp_path / "b").mkdir()
    src = hf_variant(tmp_path / "b", "tiny_g2",
                     config=lambda c: c.update(attn_logit_softcapping=None, final_logit_softcapping=None))
    conv.convert(src, tmp_path / "b.bin", progress=False)
    assert scalars(tmp_path / "b.bin")[1:] == (0, 0)


def test_rope_scaling_linear(tmp_path):
    # transformers 5: per layer type; 4.x: rope_scaling applies to Gemma 3's full layers only
    def new(c):
        c["rope_parameters"]["full_attention"].update(rope_type="linear", factor=8.0)

    def old(c):
        old_style_g3(c)
        c["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    for i, edit in enumerate((new, old)):
        (tmp_path / str(i)).mkdir()
        out = tmp_path / f"{i}.bin"
        conv.convert(hf_variant(tmp_path / str(i), "tiny_g3", config=edit), out, progress=False)
        got = attn_of(out)
        assert np.array_equal(got[5][1], rope_freqs(32, LayerAttn(0, 1e6, 8.0)))
        assert np.array_equal(got[5][1], rope_freqs(32, LayerAttn(0, 1e6)) / np.float32(8))
        assert np.array_equal(got[0][1], rope_freqs(32, LayerAttn(6, 1e4)))


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(use_bidirectional_attention=True), "use_bidirectional_attention is true"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 5), "layer_types is not a list of 6"),
    (lambda c: c.update(layer_types=["local"] * 6), "layer_types is not a list of 6"),
    (lambda c: c["rope_parameters"]["full_attention"].update(rope_type="yarn", factor=2.0),
     "rope type 'yarn': only 'default' and 'linear'"),
    (lambda c: c["rope_parameters"].pop("full_attention"), "rope_parameters has no full_attention"),
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
     "rope_parameters does not name full_attention and sliding_attention"),
    (lambda c: c.update(sliding_window=0), "sliding_window 0 must be positive"),
    (lambda c: c.update(tie_word_embeddings=False), "tie_word_embeddings is not true"),
    (lambda c: c.update(query_pre_attn_scalar=-4), "query_pre_attn_scalar -4 must be positive"),
    (lambda c: c.update(layer_types=None, sliding_window_pattern=0), "sliding_window_pattern 0 is not a positive"),
])
def test_gemma3_hf_refusals(tmp_path, edit, message):
    fail(tmp_path, hf_variant(tmp_path, "tiny_g3", config=edit), message)


def test_gemma3_multimodal_without_text_config_object(tmp_path):
    src = hf_variant(tmp_path, "tiny_g3", config=lambda c: c.update(model_type="gemma3", text_config=[],
                                                                    architectures=["Gemma3ForConditionalGeneration"]))
    fail(tmp_path, src, "text_config is not a JSON object")


def test_gguf_gemma3_conventions(tmp_path):
    def convert_with(name, **values):
        (tmp_path / name).mkdir()
        src = gguf_variant(tmp_path / name, "tiny_g3", kv=kv_set(**values))
        conv.convert(src, tmp_path / f"{name}.bin", progress=False)
        return attn_of(tmp_path / f"{name}.bin")
    full, swa = rope_freqs(32, LayerAttn(0, 1e6)), rope_freqs(32, LayerAttn(0, 1e4))
    # no freq_base_swa (older files): 10000 on sliding layers
    got = convert_with("no_swa_base", gemma3__rope__freq_base_swa=None)
    assert [w for w, _ in got] == [6] * 5 + [0] and np.array_equal(got[0][1], swa) and np.array_equal(got[5][1], full)
    # no sliding_window: no sliding layer, freq_base everywhere
    got = convert_with("no_window", gemma3__attention__sliding_window=None)
    assert [w for w, _ in got] == [0] * 6 and all(np.array_equal(r, full) for _, r in got)
    # a period and an array of layers
    assert [w for w, _ in convert_with("period", gemma3__attention__sliding_window_pattern=3)] == [6, 6, 0, 6, 6, 0]
    pattern = [True, False, True, True, False, False]
    assert [w for w, _ in convert_with("array", gemma3__attention__sliding_window_pattern=pattern)] == \
        [6 if p else 0 for p in pattern]
    # linear scaling: full layers only; as llama.cpp, type linear by default, no factor (or 0) = none
    got = convert_with("linear", gemma3__rope__scaling__type="linear", gemma3__rope__scaling__factor=8.0)
    assert np.array_equal(got[5][1], full / np.float32(8)) and np.array_equal(got[0][1], swa)
    got = convert_with("scale_linear", gemma3__rope__scale_linear=4.0)
    assert np.array_equal(got[5][1], full / np.float32(4)) and np.array_equal(got[0][1], swa)
    for name, values in {"no_factor": dict(gemma3__rope__scaling__type="linear"),
                         "factor_0": dict(gemma3__rope__scaling__factor=0.0),
                         "none": dict(gemma3__rope__scaling__type="none", gemma3__rope__scaling__factor=8.0)}.items():
        assert np.array_equal(convert_with(name, **values)[5][1], full), name


def test_gguf_gemma2_defaults(tmp_path):
    src = gguf_variant(tmp_path, "tiny_g2", kv=kv_set(gemma2__attention__sliding_window=None,
                                                       gemma2__attn_logit_softcapping=None,
                                                       gemma2__final_logit_softcapping=None))
    conv.convert(src, tmp_path / "d.bin", progress=False)
    assert scalars(tmp_path / "d.bin")[1:] == (50.0, 30.0)
    assert [w for w, _ in attn_of(tmp_path / "d.bin")] == [4096, 0, 4096, 0]


@pytest.mark.parametrize("arch, layers, scale", [("gemma2", 46, 4608 // 32), ("gemma3", 62, 5376 // 32),
                                                 ("gemma2", 42, 256), ("gemma3", 34, 256)])
def test_gguf_attention_scale_27b_shapes(arch, layers, scale):
    d = {46: 4608, 62: 5376}.get(layers, 3584)
    kv = {f"{arch}.{k}": v for k, v in {
        "embedding_length": d, "attention.head_count": 32, "block_count": layers, "attention.key_length": 128
        if layers in (46, 62) else 256, "feed_forward_length": 8, "context_length": 8,
        "attention.layer_norm_rms_epsilon": 1e-6}.items()}
    dims = convert_gguf.read_dims(arch, kv, 4, "x")
    assert dims.att_scale == float(scale) ** -0.5


@pytest.mark.parametrize("values, message", [
    (dict(gemma3__rope__scaling__type="yarn"), "rope scaling type 'yarn' is not supported"),
    (dict(gemma3__attention__sliding_window_pattern=[True] * 5), "is not 6 booleans"),
    (dict(gemma3__attention__sliding_window_pattern=0), "sliding_window_pattern 0 is not a positive"),
    (dict(gemma3__attn_logit_softcapping=50.0), "gemma3.attn_logit_softcapping is set"),
])
def test_gguf_gemma3_refusals(tmp_path, values, message):
    fail(tmp_path, gguf_variant(tmp_path, "tiny_g3", kv=kv_set(**values)), message)


# ---- quantized GGUF tensors ---------------------------------------------------------------

QTYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16", "F32"]  # and K_SCALES


def test_gguf_quantized_tensors(tmp_path):
    # Every type on a matrix of tiny_g3 (the K-quants on ffn_down, whose rows are one
    # 256-value block; the others on ffn_up, ffn_gate: rows of 96): each converted tensor is
    # gguf's dequantization rounded to FP16.
    rng = np.random.default_rng(7)
    places = [(f"blk.{i}.ffn_down.weight", q) for i, q in enumerate(K_SCALES)] + \
        [(f"blk.{i % 6}.ffn_{'up' if i < 6 else 'gate'}.weight", q) for i, q in enumerate(QTYPES)]
    want = {}

    def edit(ts):
        for name, qtype in places:
            t = gguf.GGMLQuantizationType[qtype]
            raw = quantized(qtype, ts[name][0], rng)
            ts[name] = (raw, None if qtype in ("F16", "F32") else t)
            want[name] = gguf.quants.dequantize(raw, t).astype(np.float16)
    src = gguf_variant(tmp_path, "tiny_g3", tensors=edit)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(src).tensors}
    assert [kinds[n] for n, _ in places] == [q for _, q in places]
    m = convert_v2(src, tmp_path / "q.bin")
    engine = {convert_gguf.gguf_name(n): n for n in checkpoint.stored_tensors(m.dims)}
    for name, x in want.items():
        assert np.array_equal(m.tensor(engine[name]), x), f"{name} ({kinds[name]})"


@pytest.mark.parametrize("qtype", sorted(K_SCALES))
def test_k_quants_dequantize_in_row_chunks(tmp_path, monkeypatch, qtype):
    # read_rows on a K-quant tensor: chunked reading gives gguf's dequantization of the whole
    rng = np.random.default_rng(3)
    raw = quantized(qtype, np.zeros((40, 512), np.float32), rng)
    path = tmp_path / "t.bin"
    path.write_bytes(b"xyz" + raw.tobytes())
    monkeypatch.setattr(checkpoint, "CHUNK_ELEMS", 512 * 7)
    t = checkpoint.SourceTensor("t", path, 3, qtype, (40, 512))
    chunks = list(checkpoint.read_rows(t, 40))
    assert [len(c) for c in chunks] == [7] * 5 + [5]
    assert np.array_equal(np.concatenate(chunks), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "BF16"])
def test_quantized_reading_memory_is_bounded_by_a_chunk(tmp_path, monkeypatch, qtype):
    # A tensor of 8M values (32 MB as float32) read with 64K-value chunks (256 KB as float32):
    # the peak of traced allocations (numpy's included) stays under the 6 chunks
    # builder.models.checkpoint states (measured: 3.9-4.7), far below the tensor, and no chunk
    # exceeds CHUNK_ELEMS values.
    import tracemalloc
    rows, cols, chunk = 4096, 2048, 1 << 16
    raw = quantized(qtype, np.zeros((rows, cols), np.float32), np.random.default_rng(1))
    path = tmp_path / "big.bin"
    path.write_bytes(raw.tobytes())
    del raw
    monkeypatch.setattr(checkpoint, "CHUNK_ELEMS", chunk)
    t = checkpoint.SourceTensor("big", path, 0, qtype, (rows, cols))
    tracemalloc.start()
    try:
        biggest = max(c.size for c in checkpoint.read_rows(t, rows))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert biggest == chunk
    assert peak < 6 * 4 * chunk, f"peak {peak} bytes for chunks of {4 * chunk} bytes"
    assert 6 * 4 * chunk < rows * cols * 4 / 20


def test_unsupported_and_truncated_quantized_gguf(tmp_path):
    def q8_1(ts):
        x = ts["blk.0.ffn_down.weight"][0]
        ts["blk.0.ffn_down.weight"] = (np.zeros((x.shape[0], x.shape[1] // 32 * 40), np.uint8),
                                       gguf.GGMLQuantizationType.Q8_1)
    fail(tmp_path, gguf_variant(tmp_path, "tiny_g3", tensors=q8_1), "tensor blk.0.ffn_down.weight is Q8_1: not a supported type")

    def q4(ts):
        x = ts["token_embd.weight"][0]
        ts["token_embd.weight"] = (gguf.quants.quantize(x.astype(np.float32), gguf.GGMLQuantizationType.Q4_0),
                                   gguf.GGMLQuantizationType.Q4_0)
    (tmp_path / "t").mkdir()
    src = gguf_variant(tmp_path / "t", "tiny_g3", tensors=q4)
    src.write_bytes(src.read_bytes()[:-1000])
    fail(tmp_path, src, "not a readable GGUF file (tensor")


# ---- --type q8_0 ---------------------------------------------------------------------------


def test_hf_to_q8_0_quantizes_the_exact_values(tmp_path):
    # tiny_wide (d 144: rows of 144 are not whole 32-weight blocks) with F32 down projections:
    # a matrix whose rows split into blocks is llama.cpp's reference quantization of the
    # checkpoint's exact values (BF16 or F32, not first rounded to FP16), the others FP16 as
    # --type f16 writes them; norms unchanged.
    def f32_down(ts):
        for k, (dtype, shape, data) in list(ts.items()):
            if k.endswith("mlp.down_proj.weight"):
                x = bf16_to_f32(data) * np.float32(1 + 2 ** -10)  # not BF16 values any more
                ts[k] = ("F32", shape, x.tobytes())
    src = hf_variant(tmp_path, "tiny_wide", tensors=f32_down)
    q, f = convert_v2(src, tmp_path / "q.bin", wtype="q8_0"), convert_v2(src, tmp_path / "f.bin")
    assert q.dims.flags == f.dims.flags | Q8_0
    st = read_safetensors(src / "model.safetensors")
    kinds = set()
    for spec in tensor_layout(q.header):
        kinds.add((spec.name.rsplit(".", 1)[-1], spec.dtype))
        if spec.dtype != "q8_0":
            assert np.array_equal(q.tensor(spec.name), f.tensor(spec.name)), spec.name
            continue
        dtype, shape, data = st[convert_hf.hf_name(spec.name)]
        exact = (bf16_to_f32(data) if dtype == "BF16" else np.frombuffer(data, np.float32)).reshape(shape)
        assert np.array_equal(q.raw(spec.name), quantize_q8_0(exact).reshape(-1)), spec.name
    assert kinds >= {("wq", "f16"), ("embed", "f16"), ("wo", "q8_0"), ("down", "q8_0"), ("attn_norm", "f32")}


def test_gguf_q8_0_blocks_are_copied_as_they_are(tmp_path):
    # tiny_g3 (every matrix in whole blocks) with Q8_0 tensors (the embedding among them),
    # one Q4_0 and the rest F16: --type q8_0 copies the Q8_0 blocks byte for byte (rows of
    # `cols` weights in both files: no transpose, no second rounding), quantizes the others
    # from their exact (dequantized) values; --type f16 dequantizes all of them.
    rng = np.random.default_rng(11)
    q8 = ["token_embd.weight", "blk.0.attn_q.weight", "blk.2.ffn_down.weight", "blk.5.attn_output.weight"]
    raw = {}

    def edit(ts):
        for name in q8 + ["blk.1.ffn_up.weight"]:
            qtype = "Q4_0" if "ffn_up" in name else "Q8_0"
            x = ts[name][0].astype(np.float32) * rng.uniform(0.5, 2.0, ts[name][0].shape).astype(np.float32)
            raw[name] = quantized(qtype, x, rng)
            ts[name] = (raw[name], gguf.GGMLQuantizationType[qtype])
    src = gguf_variant(tmp_path, "tiny_g3", tensors=edit)
    q, f = convert_v2(src, tmp_path / "q.bin", wtype="q8_0"), convert_v2(src, tmp_path / "f.bin")
    meta = read_gguf_meta(src).tensors
    engine = {convert_gguf.gguf_name(n): n for n in checkpoint.stored_tensors(q.dims)}
    for g, name in engine.items():
        spec = q._layout[name]
        assert spec.dtype in ("q8_0", "f32"), name  # d 96, ffn 256, H hd 128: whole blocks
        if g in q8:
            assert meta[g].shape == spec.shape  # GGUF's numpy-order shape: rows of spec.shape[-1]
            assert np.array_equal(q.raw(name), raw[g].reshape(-1)), g
            assert np.array_equal(f.tensor(name), q.tensor(name).astype(np.float16)), g
        elif spec.dtype == "q8_0":
            exact = checkpoint.decode(np.fromfile(src, np.uint8, meta[g].nbytes, offset=meta[g].offset)
                                      .reshape(spec.shape[0], -1), meta[g].type)
            assert np.array_equal(q.raw(name), quantize_q8_0(exact).reshape(-1)), g
    # a GGUF Q8_0 tensor read as blocks: whole rows of raw bytes, chunk by chunk
    t = checkpoint.SourceTensor("token_embd.weight", src, meta["token_embd.weight"].offset, "Q8_0",
                                meta["token_embd.weight"].shape)
    chunks = list(checkpoint.read_rows(t, 100, blocks=True))
    assert all(c.dtype == np.uint8 and c.shape[1] == 96 // 32 * 34 for c in chunks)
    assert np.array_equal(np.concatenate(chunks), raw["token_embd.weight"][:100])


def test_q8_0_block_reading_memory_is_bounded_by_a_chunk(tmp_path, monkeypatch):
    # copying Q8_0 blocks holds one chunk of raw rows at a time: 34/32 bytes a value
    import tracemalloc
    rows, cols, chunk = 4096, 2048, 1 << 16
    raw = quantized("Q8_0", np.zeros((rows, cols), np.float32), np.random.default_rng(1))
    path = tmp_path / "big.bin"
    path.write_bytes(raw.tobytes())
    del raw
    monkeypatch.setattr(checkpoint, "CHUNK_ELEMS", chunk)
    t = checkpoint.SourceTensor("big", path, 0, "Q8_0", (rows, cols))
    tracemalloc.start()
    try:
        sizes = [c.nbytes for c in checkpoint.read_rows(t, rows, blocks=True)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(sizes) == chunk // 32 * 34 and sum(sizes) == rows * cols // 32 * 34
    assert peak < 3 * chunk // 32 * 34, f"peak {peak} bytes for chunks of {chunk // 32 * 34} bytes"


def test_cli_type(tmp_path, capsys):
    out = tmp_path / "m.bin"
    assert conv.main([str(fixture_path("tiny_g3")), "-o", str(out), "-q", "--type", "q8_0"]) == 0
    m = ModelFile4(out)
    assert m.header.version == 4 and WType.Q8_0 in {o.wtype for o in m.ops}
    assert capsys.readouterr().out.endswith(f"; version 4 (Gemma 3), vocab 2048, {m.header.n_ops} ops on "
                                            f"{m.header.n_slots} slots, context 2048\n")
    assert conv.main([str(fixture_path("tiny_g3")), "-o", str(out), "-q", "--type", "q8_0", "--format", "2"]) == 0
    assert ModelFile(out).dims.flags & Q8_0
    assert capsys.readouterr().out.endswith(", flags 7, q8_0 weights, context 2048\n")
    with pytest.raises(SystemExit) as e:
        conv.main([str(fixture_path("tiny_g3")), "-o", str(out), "--type", "q4_0"])
    assert e.value.code == 2 and "invalid choice: 'q4_0'" in capsys.readouterr().err
