"""builder.models.convert on Gemma 4: the HF and GGUF twins of each fixture give the same model
file (byte for byte: weights, records and tokenizer tables), the records say what the configs
say (per-layer head_dim and kv heads, k = v, KV sharing by transformers' rule, double-wide FFN,
proportional rope, layer_scalar), the unused k/v of kv-shared layers are dropped, both config
forms and the multimodal layout convert identically, --type q8_0 quantizes every matrix (the
PLE table and the experts included), and what cannot run exactly is refused with one line.

The records are version 3's (asked for explicitly: it names each tensor); convert's default,
version 4 (what the engine runs), is checked for the twins' equality and --type q8_0;
test_modelfile4 holds version 4 to version 3's bytes."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from builder.models import convert as conv
from builder.models.gguf_meta import read_gguf_meta
from builder.models.modelfile import POST_NORMS, QK_NORM, ModelFormatError, quantize_q8_0
from builder.models.modelfile3 import K_EQ_V, MERGES, MOE, V_NORM, Layer, ModelFile3, Rope, rope_table
from builder.models.modelfile4 import ModelFile4, Op, WType
from modelfiles import GEMMA4, convert_fixture, fixture_path
from variants import bf16_to_f32, gguf_variant, hf_variant, kv_set, read_safetensors, write_safetensors

G4 = POST_NORMS | QK_NORM


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Each fixture converted to version 3."""
    d = tmp_path_factory.mktemp("conv4")
    return {(n, s): convert_fixture(n, s, d, 3) for n in GEMMA4 for s in ("hf", "gguf")}


def fail(tmp, src, match: str, **kw) -> None:
    out = tmp / "out.bin"
    with pytest.raises((conv.ConvertError, ModelFormatError)) as e:
        conv.convert(src, out, progress=False, **kw)
    assert match in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and not out.exists()


def same_file(tmp, src, want) -> None:
    out = tmp / "same.bin"
    conv.convert(src, out, progress=False, version=3)
    assert out.read_bytes() == want.read_bytes()


@pytest.mark.parametrize("name", GEMMA4)
def test_hf_and_gguf_give_the_same_model(files, name):
    # The fixtures' GGUFs carry tok_a's piece types, so even the tokenizer tables agree.
    assert files[name, "hf"].read_bytes() == files[name, "gguf"].read_bytes()


@pytest.mark.parametrize("name", GEMMA4)
def test_version_4_by_default_and_the_twins_agree(tmp_path_factory, name):
    d = tmp_path_factory.getbasetemp()
    hf, gg = (convert_fixture(name, s, d) for s in ("hf", "gguf"))
    m = ModelFile4(hf)
    assert (m.header.version, m.header.generation, m.header.flags) == (4, 4, MERGES)
    assert hf.read_bytes() == gg.read_bytes()



def test_records_say_what_the_configs_say(files):
    g4, k, moe = (ModelFile3(files[n, "hf"]) for n in GEMMA4)
    st = read_safetensors(fixture_path("tiny_g4") / "model.safetensors")
    scalar = [float(bf16_to_f32(st[f"model.layers.{i}.layer_scalar"][2])[0]) for i in range(8)]
    own = G4 | V_NORM
    want = [Layer(16, 1, 128, i, 6, own, 1.0, scalar[i]) for i in range(4)] + \
        [Layer(32, 1, 128, 4, 0, own, 1.0, scalar[4])] + \
        [Layer(16, 1, 256, 3, 6, G4, 1.0, scalar[i]) for i in (5, 6)] + [Layer(32, 1, 256, 4, 0, G4, 1.0, scalar[7])]
    assert list(g4.model.layers) == want  # layers 5, 6 read layer 3's cache, 7 layer 4's; FFN doubled
    assert (g4.model.ple_dim, g4.model.final_softcap, g4.header.flags, g4.header.ple_scale) == (16, 3.0, MERGES, 4.0)
    assert [(x.head_dim, x.kv_heads, x.flags, x.window) for x in k.model.layers] == \
        [(24, 2, own, 7), (24, 2, own, 7), (48, 1, own | K_EQ_V, 0)] * 2
    assert (moe.model.experts, moe.model.top_k, moe.model.expert_ffn) == (4, 2, 32)
    assert all(x.flags == own | MOE for x in moe.model.layers)
    # proportional rope on full layers: 4 of 16 pairs (tiny_g4), 6 of 24 (tiny_g4k)
    assert np.array_equal(g4.tensor("layers.4.rope"), rope_table(32, Rope(1e6, 1.0, 4)))
    assert np.array_equal(g4.tensor("layers.0.rope"), rope_table(16, Rope(1e4)))
    assert np.array_equal(k.tensor("layers.2.rope"), rope_table(48, Rope(1e6, 1.0, 6)))
    assert (k.tensor("layers.2.rope")[6:] == 0).all() and (k.tensor("layers.2.rope")[:6] > 0).all()


def test_norms_hold_w_and_shared_layers_drop_their_kv(files):
    m = ModelFile3(files["tiny_g4", "hf"])
    st = read_safetensors(fixture_path("tiny_g4") / "model.safetensors")
    w = bf16_to_f32(st["model.layers.2.post_attention_layernorm.weight"][2])
    assert np.array_equal(m.tensor("layers.2.post_attn_norm"), w)  # w, not 1 + w
    assert "model.layers.6.self_attn.k_proj.weight" in st  # stored, as the published E2B does ...
    names = {s.name for s in m.specs}
    assert not {f"layers.{i}.{t}" for i in (5, 6, 7) for t in ("wk", "wv", "k_norm")} & names  # ... unused


def test_a_checkpoint_without_the_unused_kv_converts_the_same(tmp_path, files):
    def drop(ts):
        for i in (5, 6, 7):
            for t in ("k_proj", "v_proj", "k_norm"):
                ts.pop(f"model.layers.{i}.self_attn.{t}.weight")
    same_file(tmp_path, hf_variant(tmp_path, "tiny_g4", tensors=drop), files["tiny_g4", "hf"])


def per_layer_form(c):
    """The config as transformers 5.25 saves its own: per_layer_config instead of global_head_dim
    and num_global_key_value_heads."""
    hd, kv = c.pop("global_head_dim"), c.pop("num_global_key_value_heads")
    c["per_layer_config"] = {str(i): {"head_dim": hd, **({"num_key_value_heads": kv} if kv else {})}
                             for i, t in enumerate(c["layer_types"]) if t == "full_attention"}


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4k"])
def test_per_layer_config_form(tmp_path, files, name):
    same_file(tmp_path, hf_variant(tmp_path, name, config=per_layer_form), files[name, "hf"])


def test_multimodal_layout(tmp_path, files):
    # Gemma4ForConditionalGeneration: the text config under text_config, the text model's
    # weights under model.language_model.*, towers beside it (ignored)
    def config(c):
        text = dict(c)
        c.clear()
        c.update(model_type="gemma4", architectures=["Gemma4ForConditionalGeneration"], text_config=text,
                 vision_config={"hidden_size": 8})

    def tensors(ts):
        for k in list(ts):
            ts["model.language_model." + k[len("model."):]] = ts.pop(k)
        ts["model.vision_tower.patch.weight"] = ("BF16", [2, 2], bytes(8))
        ts["model.embed_vision.weight"] = ("BF16", [2], bytes(4))
    same_file(tmp_path, hf_variant(tmp_path, "tiny_g4moe", config=config, tensors=tensors), files["tiny_g4moe", "hf"])


def test_q8_0_quantizes_every_matrix(tmp_path):
    """--type q8_0: every matrix whose rows are whole 32-weight blocks is llama.cpp's reference
    quantization of the checkpoint's exact values -- the PLE table and projection and the
    experts included; the router, scales and norms stay FP32; HF and GGUF agree (versions 3
    and 4)."""
    for name, version in (("tiny_g4", 3), ("tiny_g4moe", 3), ("tiny_g4", 4), ("tiny_g4moe", 4)):
        for s in ("hf", "gguf"):
            src = fixture_path(name) / ("model-f16.gguf" if s == "gguf" else "")
            conv.convert(src, tmp_path / f"{name}-{s}-v{version}.bin", progress=False, wtype="q8_0", version=version)
        assert (tmp_path / f"{name}-hf-v{version}.bin").read_bytes() == \
            (tmp_path / f"{name}-gguf-v{version}.bin").read_bytes()
    # version 4: a product's or an embedding's rows in Q8_0 when they are whole blocks (not the
    # PLE's, of P = 16), norms and rope tables FP32
    ops = [o for o in ModelFile4(tmp_path / "tiny_g4-hf-v4.bin").ops if o.op in (Op.EMBED, Op.MATMUL, Op.LOGITS)]
    assert {(o.n, WType(o.wtype)) for o in ops} == {(64, WType.Q8_0), (128, WType.Q8_0), (256, WType.Q8_0),
                                                   (16, WType.F16)}
    assert {WType(o.wtype) for o in ModelFile4(tmp_path / "tiny_g4-hf-v4.bin").ops
            if o.op in (Op.NORM, Op.ROPE)} == {WType.F32}
    # the experts' blocks of rows in Q8_0 (rows of d = 64 and I = 32), the route (router, scales) FP32
    ops = ModelFile4(tmp_path / "tiny_g4moe-hf-v4.bin").ops
    experts = [o for i, skip in enumerate(ops) if skip.op == Op.SKIP for o in ops[i + 1:i + 4]]
    assert {(o.op, o.n, o.m, WType(o.wtype)) for o in experts} == {(Op.MATMUL, 64, 32, WType.Q8_0),
                                                                   (Op.MATMUL, 32, 64, WType.Q8_0)}
    assert {WType(o.wtype) for o in ops if o.op == Op.ROUTE} == {WType.F32}
    g4, moe = ModelFile3(tmp_path / "tiny_g4-hf-v3.bin"), ModelFile3(tmp_path / "tiny_g4moe-hf-v3.bin")
    kinds = {s.name: s.dtype for m in (g4, moe) for s in m.specs}
    assert kinds["ple_embed"] == kinds["ple_proj"] == kinds["layers.0.ple_gate"] == "q8_0"
    assert kinds["layers.0.ple_out"] == "f16"  # rows of P = 16 weights
    assert kinds["layers.1.experts_gate_up"] == kinds["layers.1.experts_down"] == kinds["layers.1.wq"] == "q8_0"
    assert kinds["layers.1.router"] == kinds["layers.1.expert_scale"] == "f32"
    st = read_safetensors(fixture_path("tiny_g4moe") / "model.safetensors")
    for engine, hf in (("layers.3.experts_gate_up", "model.layers.3.experts.gate_up_proj"),
                       ("layers.3.experts_down", "model.layers.3.experts.down_proj")):
        _, shape, data = st[hf]
        exact = bf16_to_f32(data).reshape(-1, shape[-1])
        assert np.array_equal(moe.raw(engine), quantize_q8_0(exact).reshape(-1)), engine
    st = read_safetensors(fixture_path("tiny_g4") / "model.safetensors")
    exact = bf16_to_f32(st["model.embed_tokens_per_layer.weight"][2]).reshape(2048, 128)
    assert np.array_equal(g4.raw("ple_embed"), quantize_q8_0(exact).reshape(-1))


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, edit, message", [
    ("tiny_g4k", lambda c: c.update(use_bidirectional_attention="all"),
     "use_bidirectional_attention is 'all' (only causal text runs"),
    ("tiny_g4", lambda c: c.update(model_type="gemma4_unified"), "unsupported architecture 'gemma4_unified'"),
    ("tiny_g4", lambda c: c.update(attention_bias=True), "attention_bias is True"),
    ("tiny_g4", lambda c: c.update(hidden_activation="gelu"), "hidden_activation is 'gelu'"),
    ("tiny_g4", lambda c: c.update(tie_word_embeddings=False), "tie_word_embeddings is not true"),
    ("tiny_g4", lambda c: c["rope_parameters"]["full_attention"].update(rope_type="yarn"), "rope type 'yarn'"),
    ("tiny_g4", lambda c: c.update(num_kv_shared_layers=7), "kv-shared layer 4 has no earlier full_attention layer to read"),
    ("tiny_g4", lambda c: c.update(layer_types=["full_attention"] * 7), "layer_types is not a list of 8"),
    ("tiny_g4", lambda c: c.update(vocab_size=2000), "vocab_size 2000 is below the tokenizer's 2048"),
    ("tiny_g4moe", lambda c: c.update(top_k_experts=5), "top_k 5 is not 1 .. experts (4)"),
    ("tiny_g4", lambda c: c.update(global_head_dim=40), "q_proj.weight has shape [128, 64], expected [160, 64]"),
])
def test_hf_refusals(tmp_path, name, edit, message):
    fail(tmp_path, hf_variant(tmp_path, name, config=edit), message)


def test_tokenizer_refusals(tmp_path):
    src = hf_variant(tmp_path, "tiny_g4")
    (src / "tokenizer.json").unlink()
    fail(tmp_path, src, "no tokenizer.json")
    src = hf_variant(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path, "tiny_g4")
    tok = json.loads((src / "tokenizer.json").read_text())
    tok["model"]["merges"].append(["q", "zzz"])
    (src / "tokenizer.json").write_text(json.dumps(tok))
    fail(tmp_path, src, "merge 440 (['q', 'zzz']) is not two pieces of the vocabulary")
    tok["model"]["merges"].pop()
    tok["normalizer"] = None
    (src / "tokenizer.json").write_text(json.dumps(tok))
    fail(tmp_path, src, "normalizer or pre_tokenizer is not Gemma's")


def test_version_2_cannot_hold_gemma4(tmp_path):
    fail(tmp_path, fixture_path("tiny_g4"), "model file version 2 holds Gemma 1-3 only: a Gemma 4 model is version 4", version=2)


@pytest.mark.parametrize("values, message", [
    # layers 3 and 4 swap kinds: llama.cpp's fixed rule (L-S-2 = 3 for sliding layers) no longer
    # names the last sliding layer before the shared ones (4)
    (dict(gemma4__attention__sliding_window_pattern=[True, True, True, False, True, True, True, False]),
     "kv-shared layer 5 reads layer 4 by the layer kinds but llama.cpp would read layer 3"),
    (dict(gemma4__attention__value_length=16), "gemma4.attention.value_length differs from the key length"),
    (dict(gemma4__attention__sliding_window_pattern=[True] * 7), "sliding_window_pattern is not 8 booleans"),
])
def test_gguf_refusals(tmp_path, values, message):
    fail(tmp_path, gguf_variant(tmp_path, "tiny_g4", kv=kv_set(**values)), message)


def test_gguf_rope_freqs_must_be_proportional(tmp_path):
    def edit(ts):
        f = ts["rope_freqs.weight"][0].copy()
        f[2] = 2.0
        ts["rope_freqs.weight"] = (f, None)
    fail(tmp_path, gguf_variant(tmp_path, "tiny_g4", tensors=edit), "rope_freqs.weight is not proportional rope")


@pytest.mark.parametrize("name", GEMMA4)
def test_gguf_meta_matches_gguf_reader(name):
    path = fixture_path(name) / "model-f16.gguf"
    meta, reader = read_gguf_meta(path), gguf.GGUFReader(path)
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert meta.kv == want
    assert {t.name: (t.tensor_type.name, tuple(reversed(t.shape.tolist())), t.data_offset) for t in reader.tensors} == \
        {t.name: (t.type, t.shape, t.offset) for t in meta.tensors.values()}


def test_safetensors_round_trip_helper_keeps_gemma4(tmp_path):
    # (variants.write_safetensors is what the HF variants above are written with)
    st = read_safetensors(fixture_path("tiny_g4moe") / "model.safetensors")
    write_safetensors(tmp_path / "m.safetensors", st)
    assert read_safetensors(tmp_path / "m.safetensors") == st
