"""builder.convert: both fixture formats give the same model (weights byte for byte), every
source variant the issue names converts identically, and each user error is one clear line."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from builder import convert as conv
from builder.gguf_meta import GGUFError, read_gguf_meta
from builder.modelfile import HEADER_FIELDS, NORMAL, USER_DEFINED, ModelFile, ModelFormatError
from modelfiles import MODELS, convert_fixture, fixture_path

# ---- helpers: write variants of the fixtures --------------------------------------------


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8:8 + n])
    meta.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in meta.items()}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    meta, off = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    head = json.dumps(meta).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(t[2] for t in tensors.values()))


def bf16_to_f32(data: bytes) -> np.ndarray:
    return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)


def hf_variant(tmp: Path, name: str = "tiny_mqa", config=None, tensors=None, files=None) -> Path:
    """A copy of a fixture's HF directory; config(dict) and tensors(dict) edit in place."""
    src, out = fixture_path(name), tmp / f"{name}-variant"
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    config and config(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    shutil.copy(src / "tokenizer.model", out / "tokenizer.model")
    ts = read_safetensors(src / "model.safetensors")
    tensors and tensors(ts)
    write_safetensors(out / "model.safetensors", ts)
    return out


def gguf_variant(tmp: Path, name: str = "tiny_mqa", arch: str = "gemma", kv=None, tensors=None) -> Path:
    """A copy of a fixture's GGUF rewritten with gguf.GGUFWriter; kv / tensors: dict edits.
    tensors maps name -> (array, raw GGML type or None)."""
    reader = gguf.GGUFReader(fixture_path(name) / "model-f16.gguf")
    values = {k: (f.contents(), f.types) for k, f in reader.fields.items()
              if not k.startswith("GGUF.") and k != "general.architecture"}
    ts = {t.name: (np.array(t.data), None) for t in reader.tensors}
    kv and kv(values)
    tensors and tensors(ts)
    path = tmp / f"{name}-variant.gguf"
    w = gguf.GGUFWriter(path, arch)
    for k, (v, types) in values.items():
        w.add_key_value(k, v, types[0], sub_type=types[1] if len(types) > 1 else None)
    for k, (a, raw) in ts.items():
        w.add_tensor(k, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def converted(tmp: Path, src: Path) -> bytes:
    out = tmp / (src.name + ".bin")
    conv.convert(src, out, progress=False)
    return out.read_bytes()


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("conv")
    return {(n, s): convert_fixture(n, s, d) for n in MODELS for s in ("hf", "gguf")}


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
# scores and every other type are identical; hence n_index/n_user/user_off differ and the
# index holds 11 more ids. The converter keeps what each source says.
TABLE_FIELDS = {"n_index", "n_user", "user_off"}


@pytest.mark.parametrize("name", MODELS)
def test_hf_and_gguf_give_the_same_model(reference_files, name):
    hf, gg = (ModelFile(reference_files[name, s]) for s in ("hf", "gguf"))
    for field, _, _ in HEADER_FIELDS[1:]:
        if field not in TABLE_FIELDS:
            assert getattr(hf.header, field) == getattr(gg.header, field), field
    a, b = reference_files[name, "hf"].read_bytes(), reference_files[name, "gguf"].read_bytes()
    w = hf.header.weights_off
    assert a[w:] == b[w:], f"weights differ first at byte {next(i for i in range(len(a) - w) if a[w + i] != b[w + i])}"
    assert hf.pieces == gg.pieces and hf.scores.tobytes() == gg.scores.tobytes()
    differ = np.flatnonzero(hf.types != gg.types)
    assert differ.tolist() == sorted(hf.user.tolist())
    assert (hf.types[differ] == USER_DEFINED).all() and (gg.types[differ] == NORMAL).all()
    assert hf.header.n_index + hf.header.n_user == gg.header.n_index and gg.header.n_user == 0


def test_norms_hold_one_plus_w_and_weights_are_exact(reference_files):
    m = ModelFile(reference_files["tiny_mqa", "hf"])
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
    assert ModelFile(tmp_path / "x.bin").header.rope_theta == 500000.0


@pytest.mark.parametrize("name", MODELS)
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


@pytest.mark.parametrize("model_type, arch", [("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM"),
                                              ("llama", "LlamaForCausalLM")])
def test_hf_other_architecture(tmp_path, model_type, arch):
    src = hf_variant(tmp_path, config=lambda c: c.update(model_type=model_type, architectures=[arch]))
    fail(tmp_path, src, f"unsupported architecture '{model_type}'")


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "llama"])
def test_gguf_other_architecture(tmp_path, arch):
    fail(tmp_path, gguf_variant(tmp_path, arch=arch), f"unsupported architecture '{arch}'")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_gguf_quantized(tmp_path, qtype):
    t = gguf.GGMLQuantizationType[qtype]

    def quantize(ts):
        ts["blk.1.ffn_down.weight"] = (gguf.quants.quantize(ts["blk.1.ffn_down.weight"][0].astype(np.float32), t), t)
    msg = fail(tmp_path, gguf_variant(tmp_path, tensors=quantize), f"blk.1.ffn_down.weight is {qtype}")
    assert "quantized GGUF files are not supported" in msg


def test_hf_shape_mismatch(tmp_path):
    src = hf_variant(tmp_path, config=lambda c: c.update(intermediate_size=255))
    fail(tmp_path, src, "tensor model.layers.0.mlp.gate_proj.weight has shape [256, 64], expected [255, 64]")


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
    assert ModelFile(out).dims.dim == 144
    assert conv.main([str(tmp_path / "none"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("convert: error:") and "no such file" in err
    with pytest.raises(SystemExit) as e:
        conv.main(["-o"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


# ---- builder.gguf_meta against gguf.GGUFReader ---------------------------------------------


@pytest.mark.parametrize("name", MODELS)
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


def test_gguf_meta_rejects_truncation(tmp_path):
    data = (fixture_path("tiny_mqa") / "model-f16.gguf").read_bytes()
    for cut in (3, 20, 5000, len(data) - 1):
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated|bad magic|past the end"):
            read_gguf_meta(tmp_path / "t.gguf")


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(hidden_size="64"), "hidden_size is not an integer"),
    (lambda c: c.pop("intermediate_size"), "no intermediate_size"),
    (lambda c: c.update(num_hidden_layers=10**6), "layers = 1000000 is implausible"),
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
