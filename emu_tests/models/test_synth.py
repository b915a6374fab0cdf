"""builder.models.synth: the tiny presets (Gemma 1, 2, 3, and 4) write valid models (readable, their GGUF
twins convert back to the same bytes, the twins run on them); the synthetic vocabularies
tokenize exactly as sentencepiece does when loaded as a sentencepiece model; the big presets'
headers have the real models' shapes and parameter counts (checked without writing GBs).

synth writes model file version 4 by default (what the engine runs; its program interpreter
runs on it); tests that read a tensor by name or the shapes of a header ask for version 2
(Gemma 1-3) or 3 (Gemma 4)."""
from __future__ import annotations

import dataclasses
import random
import struct

import gguf
import numpy as np
import pytest
import sentencepiece as spm

from builder.models import synth
from builder.models.convert import convert
from builder.models.convert_hf import sentencepiece_vocab
from builder.models.convert_gguf import gguf_name
from builder.models import program
from builder.models.modelfile import Q8_0, UNKNOWN, ModelFile, Vocab, quantize_q8_0, tensor_layout, write_model
from builder.models.modelfile4 import ModelFile4, Op, WType
from builder.twins.program import Interpreter
from builder.twins.reference import Reference
from builder.twins.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny preset, seed 5, as model file version 2 (tensors by name)."""
    d = tmp_path_factory.mktemp("synth")
    synth.synth("tiny", d / "t.bin", seed=5, progress=False, version=2)
    return d


# GGUF architecture, tensors per layer, and tensor names only that generation has
TINY = {"tiny": ("gemma", 9, []),
        "tiny-g2": ("gemma2", 11, ["blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"]),
        "tiny-g3": ("gemma3", 13, ["blk.5.post_ffw_norm.weight", "blk.5.attn_q_norm.weight",
                                   "blk.5.attn_k_norm.weight"])}


@pytest.mark.parametrize("preset", TINY)
def test_tiny_is_valid_and_its_gguf_converts_back(tmp_path, preset):
    synth.synth(preset, tmp_path / "t.bin", seed=5, gguf_out=tmp_path / "t.gguf", progress=False)
    synth.synth(preset, tmp_path / "t2.bin", seed=5, progress=False, version=2)
    m = ModelFile(tmp_path / "t2.bin")
    p = synth.PRESETS[preset]
    assert m.dims == dataclasses.replace(p.dims, eps=float(np.float32(1e-6)))
    assert [(int(m.tensor(f"layers.{i}.window")[0])) for i in range(m.dims.layers)] == [a.window for a in p.attn]
    m4 = ModelFile4(tmp_path / "t.bin")  # the default: version 4
    assert (m4.header.generation, m4.header.vocab, m4.header.max_ctx) == (program.generation_of(p.dims), 1024, 512)
    assert [o.j for o in m4.ops if o.op == Op.ATTN] == [a.window for a in p.attn]
    convert(tmp_path / "t.gguf", tmp_path / "back.bin", progress=False)
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "t.bin").read_bytes()
    convert(tmp_path / "t.gguf", tmp_path / "back2.bin", progress=False, version=2)
    assert (tmp_path / "back2.bin").read_bytes() == (tmp_path / "t2.bin").read_bytes()
    r = gguf.GGUFReader(tmp_path / "t.gguf")
    arch, per_layer, names = TINY[preset]
    assert r.fields["general.architecture"].contents() == arch
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert kinds["token_embd.weight"] == "F16" and kinds["blk.1.attn_norm.weight"] == "F32"
    assert len(kinds) == 2 + per_layer * m.dims.layers and all(kinds[n] == "F32" for n in names)


@pytest.mark.parametrize("preset", ["tiny", "tiny-g3"])
def test_q8_0_twin_holds_the_same_blocks_and_converts_back(tmp_path, preset):
    """--type q8_0: the model file's matrices are llama.cpp's Q8_0 quantization of the same
    random weights the F16 model rounds; the GGUF twin holds the very blocks (Q8_0 tensors,
    file type MOSTLY_Q8_0), and convert --type q8_0 gives the model file back byte for byte
    (version 4, the default, and version 2, whose tensors are looked up by name here)."""
    synth.synth(preset, tmp_path / "q.bin", seed=5, gguf_out=tmp_path / "q.gguf", progress=False, wtype="q8_0",
                version=2)
    synth.synth(preset, tmp_path / "f.bin", seed=5, progress=False, version=2)
    synth.synth(preset, tmp_path / "q4.bin", seed=5, progress=False, wtype="q8_0")
    q, f = ModelFile(tmp_path / "q.bin"), ModelFile(tmp_path / "f.bin")
    assert q.dims.flags == f.dims.flags | Q8_0
    convert(tmp_path / "q.gguf", tmp_path / "back.bin", progress=False, wtype="q8_0", version=2)
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "q.bin").read_bytes()
    convert(tmp_path / "q.gguf", tmp_path / "back4.bin", progress=False, wtype="q8_0")
    assert (tmp_path / "back4.bin").read_bytes() == (tmp_path / "q4.bin").read_bytes()
    r = gguf.GGUFReader(tmp_path / "q.gguf")
    assert r.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    tensors = {t.name: t for t in r.tensors}
    source = synth.synth_source(5)
    for spec in tensor_layout(q.header):
        if spec.dtype == "q8_0":
            t = tensors[gguf_name(spec.name)]
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
            assert np.array_equal(np.asarray(t.data).reshape(-1), q.raw(spec.name)), spec.name
            exact = np.concatenate(list(source(spec)))
            assert np.array_equal(q.raw(spec.name), quantize_q8_0(exact).reshape(-1)), spec.name
            # within half a step s = amax / 127 of the block, plus the FP16 rounding of the
            # step itself (relative 2^-11, times |q| <= 127): 0.5 s + 0.062 s
            err = np.abs(q.tensor(spec.name) - exact).reshape(-1, 32).max(axis=1)
            step = np.abs(exact).reshape(-1, 32).max(axis=1) / 127
            assert (err <= step * (0.5 + 127 * 2 ** -11) * (1 + 1e-6)).all(), spec.name
        else:
            assert spec.dtype in ("f32", "u32") and np.array_equal(q.tensor(spec.name), f.tensor(spec.name))


def test_q8_0_leaves_partial_rows_in_f16(tmp_path):
    """A matrix whose rows are not whole 32-weight blocks (ffn 48: down's rows; H hd 72: wo's)
    stays FP16 in the model file (version 2 here, and version 4's products alike) and in its GGUF
    twin (as llama.cpp quantizes), and the pair still converts back byte for byte."""
    p = synth.PRESETS["tiny"]
    dims = dataclasses.replace(p.dims, ffn=48, head_dim=18, flags=Q8_0, att_scale=0.0)  # 18 ** -0.5
    vocab = synth.synth_vocab(dims.vocab, 1)
    write_model(tmp_path / "m.bin", dims, vocab, synth.synth_source(1), progress=False, attn=p.attn)
    program.write_dims(tmp_path / "m4.bin", dims, vocab, synth.synth_source(1), progress=False, attn=p.attn)
    synth.write_gguf(tmp_path / "m.gguf", dataclasses.replace(p, dims=dims), vocab, synth.synth_source(1),
                     progress=False)
    m = ModelFile(tmp_path / "m.bin")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    want = {"embed": "q8_0", "layers.0.wq": "q8_0", "layers.0.gate": "q8_0", "layers.0.down": "f16",
            "layers.0.wo": "f16"}
    assert {n: m._layout[n].dtype for n in want} == want
    assert {n: kinds[gguf_name(n)] for n in want} == {n: t.upper() for n, t in want.items()}
    products = {(o.m, o.n): WType(o.wtype) for o in ModelFile4(tmp_path / "m4.bin").ops if o.op == Op.MATMUL}
    assert products == {(72, 64): WType.Q8_0, (36, 64): WType.Q8_0, (48, 64): WType.Q8_0,  # wq; wk, wv; gate, up
                        (64, 72): WType.F16, (64, 48): WType.F16}  # wo, down
    convert(tmp_path / "m.gguf", tmp_path / "back.bin", progress=False, wtype="q8_0", version=2)
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "m.bin").read_bytes()
    convert(tmp_path / "m.gguf", tmp_path / "back4.bin", progress=False, wtype="q8_0")
    assert (tmp_path / "back4.bin").read_bytes() == (tmp_path / "m4.bin").read_bytes()


def test_gemma3_preset_layers():
    attn = synth.PRESETS["g3-270m"].attn
    assert [a.window for a in attn] == [0 if (i + 1) % 6 == 0 else 512 for i in range(18)]
    assert {a.rope_theta for a in attn if a.window} == {10000.0} and {a.rope_theta for a in attn if not a.window} == {1e6}
    assert [a.window for a in synth.PRESETS["g2-2b"].attn] == [4096, 0] * 13


def test_tiny_weights(tiny):
    m = ModelFile(tiny / "t.bin")
    wq = m.tensor("layers.1.wq").astype(np.float32)
    norm = m.tensor("final_norm")
    # N(0, 0.02) and 1 + N(0, 0.1), loosely: a broken scale or a missing 1 + is far off
    assert 0.018 < wq.std() < 0.022 and abs(wq.mean()) < 0.002
    assert 0.95 < norm.mean() < 1.05 and 0.05 < norm.std() < 0.15


def test_seed_changes_weights_not_shapes(tiny, tmp_path):
    synth.synth("tiny", tmp_path / "s.bin", seed=6, progress=False, version=2)
    a, b = ModelFile(tiny / "t.bin"), ModelFile(tmp_path / "s.bin")
    assert a.dims == b.dims
    assert not np.array_equal(a.tensor("embed"), b.tensor("embed"))
    synth.synth("tiny", tmp_path / "same.bin", seed=5, progress=False, version=2)
    assert (tmp_path / "same.bin").read_bytes() == (tiny / "t.bin").read_bytes()
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):  # version 4: the program the same, the weights the seed's
        synth.synth("tiny", tmp_path / f"{name}.bin", seed=seed, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    a, b = ModelFile4(tmp_path / "a.bin"), ModelFile4(tmp_path / "c.bin")
    assert (a.ops, a.slots) == (b.ops, b.slots)  # (the vocabulary is the seed's too)
    assert not np.array_equal(a.weight(a.ops[0]), b.weight(b.ops[0]))  # the embedding


@pytest.mark.parametrize("preset", TINY)
def test_twins_run_on_tiny(tmp_path, preset):
    """The program interpreter on the default file (version 4) and the reference on version 2's
    give the same numbers."""
    synth.synth(preset, tmp_path / "t.bin", seed=5, progress=False)
    synth.synth(preset, tmp_path / "t2.bin", seed=5, progress=False, version=2)
    m = ModelFile4(tmp_path / "t.bin")
    tok = Tokenizer(m)
    ids = tok.encode(b"<start_of_turn>user\nHello, world!<end_of_turn>\n")
    assert ids == Tokenizer(ModelFile(tmp_path / "t2.bin")).encode(b"<start_of_turn>user\nHello, world!<end_of_turn>\n")
    prompt, steps, tokens = Interpreter(m).generate(ids, 8)
    assert prompt.shape == (len(ids), m.header.vocab) and np.isfinite(prompt).all()
    assert 0.1 < np.abs(prompt).max() < 50  # small weights keep activations sane
    assert all(0 <= t < m.header.vocab for t in tokens)
    want = Reference(ModelFile(tmp_path / "t2.bin")).generate(ids, 8)
    assert np.array_equal(prompt, want[0]) and np.array_equal(steps, want[1]) and tokens == want[2]


# ---- the synthetic vocabulary against sentencepiece ---------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _message(fields: list[tuple[int, int | float | bytes]]) -> bytes:
    out = bytearray()
    for num, v in fields:
        if isinstance(v, bytes):
            out += _varint(num << 3 | 2) + _varint(len(v)) + v
        elif isinstance(v, float):
            out += _varint(num << 3 | 5) + struct.pack("<f", v)
        else:
            out += _varint(num << 3) + _varint(v)
    return bytes(out)


def sentencepiece_proto(v: Vocab) -> bytes:
    """A serialized sentencepiece ModelProto (BPE, byte fallback, identity normalizer, no
    dummy prefix, whitespace kept) holding vocabulary v."""
    pieces = [(1, _message([(1, p), (2, float(s)), (3, t)])) for p, s, t in zip(v.pieces, v.scores, v.types)]
    trainer = _message([(3, 2), (4, len(v.pieces)), (35, 1), (40, v.types.index(UNKNOWN)),
                        (41, v.bos), (42, v.eos), (43, 0)])
    normalizer = _message([(1, b"identity"), (3, 0), (4, 0)])
    return _message(pieces + [(2, trainer), (3, normalizer)])


def sample_texts(v: Vocab, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    normal = [p.decode() for p, t in zip(v.pieces, v.types) if t == 1]
    extras = [" ", "  ", "     ", "\t", "\n", "\n\n\n", "<start_of_turn>", "<end_of_turn>", "😀", "ü",
              "12345", "Hello", " world", "\u2581", "<b>", "<0x41>"]
    texts = []
    for _ in range(n):
        parts = [rng.choice(normal).replace("\u2581", " ") if rng.random() < 0.6 else rng.choice(extras)
                 for _ in range(rng.randrange(1, 12))]
        texts.append("".join(parts))
    return texts


@pytest.mark.parametrize("preset, n", [("tiny", 300), ("2b", 60)])
def test_synth_vocab_tokenizes_like_sentencepiece(tmp_path, preset, n):
    v = synth.synth_vocab(synth.PRESETS[preset].dims.vocab, seed=3)
    proto = sentencepiece_proto(v)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    (tmp_path / "tokenizer.model").write_bytes(proto)
    assert sentencepiece_vocab(tmp_path / "tokenizer.model") == v  # the converter reads it back
    dims = dataclasses.replace(synth.PRESETS["tiny"].dims, vocab=len(v.pieces))
    path = tmp_path / "v.bin"
    write_model(path, dims, v, lambda s: [np.zeros(s.shape, np.float32)], progress=False)
    tok = Tokenizer(ModelFile(path))
    for text in sample_texts(v, n, seed=len(preset)):
        want = [v.bos] + sp.encode(text)
        got = tok.encode(text.encode())
        assert got == want, f"{text!r}: expected {want}, got {got}"
        assert tok.decode(got) == text.replace("\u2581", " ").encode()


# ---- the big presets: header only ----------------------------------------------------------


def parameters(h) -> int:
    """The model's parameters: every tensor but each layer's window and rope."""
    return sum(int(np.prod(s.shape)) for s in tensor_layout(h) if not s.name.endswith((".window", ".rope")))


def test_2b_and_7b_headers():
    h = synth.synth_header("2b")
    assert (h.vocab, h.dim, h.ffn, h.layers, h.heads, h.kv_heads, h.head_dim, h.max_ctx) == \
        (256000, 2048, 16384, 18, 8, 1, 256, 8192)
    params = parameters(h)
    assert params == 2_506_172_416  # Gemma-2B has 2,506,172,416 parameters
    # FP16 matrices + FP32 norms (37 of 2048) + per layer a window (4 bytes) and rope (128 x 4),
    # each padded to 64 bytes; every other tensor already a multiple of 64 bytes
    assert h.weights_size == 2 * (params - 37 * 2048) + 4 * 37 * 2048 + 18 * (64 + 512) == 5_012_506_752
    assert h.file_size < 5.03e9  # + ~9.5 MB of tokenizer tables: the "5.0 GB" file
    h7 = synth.synth_header("7b")
    assert (h7.vocab, h7.dim, h7.ffn, h7.layers, h7.heads, h7.kv_heads, h7.head_dim, h7.max_ctx) == \
        (256000, 3072, 24576, 28, 16, 16, 256, 8192)
    assert h.eot == h7.eot and h.bos == 2 and h.eos == 1 and h.n_user > 0


@pytest.mark.parametrize("preset, shapes, params, flags", [
    # the published parameter counts of Gemma 2 2B, Gemma 3 270M and Gemma 3 1B
    ("g2-2b", (256000, 2304, 9216, 26, 8, 4, 256), 2_614_341_888, 1),
    ("g3-270m", (262144, 640, 2048, 18, 4, 1, 256), 268_098_176, 3),
    ("g3-1b", (262144, 1152, 6912, 26, 4, 1, 256), 999_885_952, 3),
])
def test_gemma2_and_3_headers(preset, shapes, params, flags):
    h = synth.synth_header(preset)
    assert (h.vocab, h.dim, h.ffn, h.layers, h.heads, h.kv_heads, h.head_dim) == shapes
    assert parameters(h) == params and h.flags == flags
    assert h.att_scale == np.float32(1 / 16)  # query_pre_attn_scalar 256 = head_dim
    assert (h.att_softcap, h.final_softcap) == ((50.0, 30.0) if preset == "g2-2b" else (0.0, 0.0))


def test_cli(tmp_path, capsys):
    assert synth.main(["--preset", "tiny", "-o", str(tmp_path / "c.bin"), "-q", "--seed", "1"]) == 0
    h = ModelFile4(tmp_path / "c.bin").header  # version 4 unless --format says otherwise
    assert capsys.readouterr().out.endswith(f"; version 4 (Gemma 1), vocab 1024, {h.n_ops} ops on {h.n_slots} slots, "
                                            "context 512\n")
    assert synth.main(["--preset", "tiny", "-o", str(tmp_path / "c2.bin"), "-q", "--seed", "1", "--format", "2"]) == 0
    assert ModelFile(tmp_path / "c2.bin").dims.vocab == 1024
    assert capsys.readouterr().out.endswith("flags 0, f16 weights, context 512\n")
    assert synth.main(["--preset", "tiny", "-o", str(tmp_path / "q.bin"), "-q", "--type", "q8_0",
                       "--gguf", str(tmp_path / "q.gguf"), "--format", "2"]) == 0
    assert ModelFile(tmp_path / "q.bin").dims.flags == Q8_0
    assert capsys.readouterr().out.endswith("flags 4, q8_0 weights, context 512\n")
    assert {t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "q.gguf").tensors} == {"Q8_0", "F32"}
    with pytest.raises(SystemExit) as e:
        synth.main(["--preset", "13b", "-o", str(tmp_path / "x.bin")])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert synth.main(["--preset", "tiny", "-o", str(tmp_path / "no" / "dir.bin"), "-q"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


# ---- Gemma 4 presets (model file versions 3 and 4) ------------------------------------------


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_tiny_g4_is_valid_and_its_gguf_converts_back(tmp_path, wtype):
    """tiny-g4 (per-layer inputs, KV sharing with a double-wide FFN, k = v, MoE) and its GGUF
    twin in llama.cpp's gemma4 layout, as version 3: converting the twin gives the model file
    byte for byte; the reference and the merge-rank tokenizer run on it."""
    from builder.models.modelfile3 import MERGES, ModelFile3
    from builder.models.synth4 import PRESETS4
    synth.synth("tiny-g4", tmp_path / "t.bin", seed=5, gguf_out=tmp_path / "t.gguf", progress=False, wtype=wtype,
                version=3)
    m = ModelFile3(tmp_path / "t.bin")
    model, _ = PRESETS4["tiny-g4"]
    assert m.model.layers == model.layers and m.header.flags == MERGES | (Q8_0 if wtype == "q8_0" else 0)
    assert [x.kv_source for x in model.layers] == [0, 1, 2, 3, 4, 3, 3, 3, 3, 4]
    assert {x.flags & 8 for x in model.layers[:5]} == {0, 8}  # K_EQ_V on the full layers
    convert(tmp_path / "t.gguf", tmp_path / "back.bin", progress=False, wtype=wtype, version=3)
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "t.bin").read_bytes()
    r = gguf.GGUFReader(tmp_path / "t.gguf")
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "gemma4" and fields["tokenizer.ggml.model"] == "gemma4"
    assert fields["gemma4.attention.sliding_window_pattern"] == [i % 5 < 4 for i in range(10)]
    assert fields["gemma4.feed_forward_length"] == [64] * 5 + [128] * 5
    assert fields["gemma4.attention.head_count_kv"] == [2, 2, 2, 2, 1] * 2
    assert len(fields["tokenizer.ggml.merges"]) == len(m.merges) > 0
    ids = Tokenizer(m).encode(b"Hello world, 123 \xe4\xb8\xad!")
    assert Tokenizer(m).decode(ids) == b"Hello world, 123 \xe4\xb8\xad!"
    prompt, _, _ = Reference(m).generate(ids, 2)
    assert np.isfinite(prompt).all() and prompt.shape == (len(ids), 1024)


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
@pytest.mark.parametrize("preset", ["tiny-g4-dense", "tiny-g4"])
def test_tiny_g4_in_version_4_and_its_gguf_converts_back(tmp_path, preset, wtype):
    """tiny-g4-dense and tiny-g4 (MoE) as synth writes them by default (version 4): the GGUF
    twin converts back to the same bytes, and the program interpreter runs on it with the
    merge-rank tokenizer."""
    synth.synth(preset, tmp_path / "t.bin", seed=5, gguf_out=tmp_path / "t.gguf", progress=False, wtype=wtype)
    m = ModelFile4(tmp_path / "t.bin")
    assert (m.header.version, m.header.generation) == (4, 4)
    assert (Op.ROUTE in {o.op for o in m.ops}) == (preset == "tiny-g4")
    convert(tmp_path / "t.gguf", tmp_path / "back.bin", progress=False, wtype=wtype)
    assert (tmp_path / "back.bin").read_bytes() == (tmp_path / "t.bin").read_bytes()
    ids = Tokenizer(m).encode(b"Hello world, 123 \xe4\xb8\xad!")
    assert Tokenizer(m).decode(ids) == b"Hello world, 123 \xe4\xb8\xad!"
    prompt, _, _ = Interpreter(m).generate(ids, 2)
    assert np.isfinite(prompt).all() and prompt.shape == (len(ids), 1024)


@pytest.mark.parametrize("preset, params, ple, experts, gigabytes", [
    # the published shapes: 4.63 B (PLE table 2.35 B), 7.46 B (2.82 B), 30.70 B, 25.23 B (experts
    # 22.84 B) parameters in transformers' Gemma4ForCausalLM, and 9.3 / 14.9 / 61.4 / 50.5 GB in FP16
    ("g4-e2b", 4_628_569_344, 2_348_810_240, 0, 9.27),
    ("g4-e4b", 7_463_013_376, 2_818_572_288, 0, 14.94),
    ("g4-31b", 30_697_345_280, 0, 0, 61.41),
    ("g4-26b-a4b", 25_233_141_760, 0, 22_837_985_280, 50.50),
])
def test_gemma4_presets_have_the_published_shapes(preset, params, ple, experts, gigabytes):
    """Counted from the layout, nothing written: every weight tensor (the kv-shared layers' unused
    k/v excluded, as transformers drops them; each layer's one layer_scalar is in its record)."""
    from builder.models.modelfile3 import make_header, tensor_layout as layout3
    from builder.models.synth4 import PRESETS4
    model, _ = PRESETS4[preset]
    specs = [s for s in layout3(model) if not s.name.endswith(".rope")]
    count = {s.name: int(np.prod(s.shape)) for s in specs}
    assert sum(count.values()) == params and count.get("ple_embed", 0) == ple
    assert sum(n for k, n in count.items() if "experts_" in k) == experts
    assert round(make_header(model, synth.synth_vocab(model.vocab, 0, by_rank=True))[0].file_size / 1e9, 2) == gigabytes
    assert model.max_ctx == 65536  # 131072 / 262144 capped at what the engine runs


@pytest.mark.parametrize("preset, gigabytes", [("g4-31b", 61.4), ("g4-26b-a4b", 50.5)])
def test_synth_refuses_what_the_disk_cannot_hold(tmp_path, monkeypatch, capsys, preset, gigabytes):
    """The version 4 file of a published shape (the MoE one compiled, its route tensors included),
    refused before anything is written when the disk cannot hold it."""
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda p: type("U", (), {"free": 20 << 30})())
    assert synth.main(["--preset", preset, "-o", str(tmp_path / "big.bin")]) == 1
    err = capsys.readouterr().err
    assert f"preset {preset} needs {gigabytes} GB on disk; 21.5 GB are free" in err and err.count("\n") == 1
    assert not (tmp_path / "big.bin").exists()
