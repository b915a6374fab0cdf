"""Gemma 4 presets for `python -m builder synth` (described in model file version 3's terms; synth
writes them as version 4, or 3 on request), and their GGUF twins in llama.cpp's `gemma4` layout.

PRESETS4: `tiny-g4` (every Gemma 4 feature at once: per-layer inputs, KV sharing with a
double-wide FFN, k = v on full layers, MoE; small), `tiny-g4-dense` (the same without the
experts), and the shapes of the published models
`g4-e2b`, `g4-e4b`, `g4-31b`, `g4-26b-a4b` (docs/gemma.md, "Gemma 4"). Each is a version 3
Model and its layers' Rope, built by `gemma4_preset` from the per-model numbers as
builder.models.gemma4 reads them from a config: full layers every `period`-th, proportional
rope (a quarter of the full head's pairs), the last `shared` layers reading the last earlier
cache of their kind, layer_scalar 1.

`write_gguf4` writes the same weights as a GGUF llama.cpp reads (architecture gemma4: per-layer
arrays for the FFN width and kv heads where they vary, sliding_window_pattern, shared_kv_layers,
rope_freqs.weight for the proportional rope, layer_output_scale per layer, tokenizer `gemma4`
with its merges; norms stored as they are): converting it back gives the same model file.
The gguf package's writer expresses all of it; the presets follow llama.cpp's fixed rule for
KV sharing (layer L-S-1 full, L-S-2 sliding), so the twin means the same model to llama.cpp.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from builder.models.gemma4 import GGUF_NAMES, Gemma4, names_of
from builder.models.modelfile import Q8_0, Vocab, quantize_q8_0
from builder.models.modelfile3 import Model, Rope, tensor_layout

FULL_ROPE, SLIDING_ROPE = 1e6, 1e4
PAIRS = 0.25  # partial_rotary_factor of the full layers


def gemma4_preset(*, vocab: int, dim: int, layers: int, heads: int, period: int, window: int,
                  head_dim: tuple[int, int], kv_heads: tuple[int, int], ffn: int, max_ctx: int,
                  shared: int = 0, double_wide: bool = False, k_eq_v: bool = False, ple_dim: int = 0,
                  experts: int = 0, top_k: int = 0, expert_ffn: int = 0) -> tuple[Model, list[Rope]]:
    """(Model, ropes) of a Gemma 4 shape; head_dim and kv_heads are (sliding, full)."""
    sliding = [i % period < period - 1 for i in range(layers)]
    hd = [head_dim[not s] for s in sliding]
    shape = Gemma4(vocab, dim, heads, max_ctx, 1e-6, sliding, window, hd, [kv_heads[not s] for s in sliding],
                   [ffn * (2 if double_wide and i >= layers - shared else 1) for i in range(layers)],
                   [k_eq_v and not s for s in sliding], shared, ple_dim, experts, top_k, expert_ffn, 30.0,
                   [Rope(SLIDING_ROPE) if s else Rope(FULL_ROPE, 1.0, int(PAIRS * h // 2)) for s, h in zip(sliding, hd)])
    return shape.model([1.0] * layers, "preset")


PRESETS4 = {
    "tiny-g4": gemma4_preset(vocab=1024, dim=64, layers=10, heads=4, period=5, window=6, head_dim=(16, 32),
                             kv_heads=(2, 1), ffn=64, max_ctx=512, shared=5, double_wide=True, k_eq_v=True,
                             ple_dim=32, experts=4, top_k=2, expert_ffn=32),
    "tiny-g4-dense": gemma4_preset(vocab=1024, dim=64, layers=10, heads=4, period=5, window=6, head_dim=(16, 32),
                                   kv_heads=(2, 1), ffn=64, max_ctx=512, shared=5, double_wide=True, k_eq_v=True,
                                   ple_dim=32),
    "g4-e2b": gemma4_preset(vocab=262144, dim=1536, layers=35, heads=8, period=5, window=512, head_dim=(256, 512),
                            kv_heads=(1, 1), ffn=6144, max_ctx=131072, shared=20, double_wide=True, ple_dim=256),
    "g4-e4b": gemma4_preset(vocab=262144, dim=2560, layers=42, heads=8, period=6, window=512, head_dim=(256, 512),
                            kv_heads=(2, 2), ffn=10240, max_ctx=131072, shared=18, ple_dim=256),
    "g4-31b": gemma4_preset(vocab=262144, dim=5376, layers=60, heads=32, period=6, window=1024,
                            head_dim=(256, 512), kv_heads=(16, 4), ffn=21504, max_ctx=262144, k_eq_v=True),
    "g4-26b-a4b": gemma4_preset(vocab=262144, dim=2816, layers=30, heads=16, period=6, window=1024,
                                head_dim=(256, 512), kv_heads=(8, 2), ffn=2112, max_ctx=262144, k_eq_v=True,
                                experts=128, top_k=8, expert_ffn=704),
}


def write_gguf4(path: Path, model: Model, ropes: list[Rope], vocab: Vocab, source, progress: bool = True) -> None:
    """The GGUF twin (see the module docstring) of a version 3 Gemma 4 model: F16 matrices, or
    with Q8_0 in model.flags the model file's Q8_0 blocks; vectors F32."""
    import gguf
    layers = model.layers
    sliding = [x.window > 0 for x in layers]
    full = next(i for i, s in enumerate(sliding) if not s)
    swa = next((i for i, s in enumerate(sliding) if s), full)

    def per_layer(values: list[int]):
        return values[0] if len(set(values)) == 1 else values
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_block_count(len(layers))
    w.add_context_length(model.max_ctx)
    w.add_embedding_length(model.dim)
    w.add_feed_forward_length(per_layer([x.ffn for x in layers]))
    w.add_head_count(model.heads)
    w.add_head_count_kv(per_layer([x.kv_heads for x in layers]))
    w.add_key_length(layers[full].head_dim)
    w.add_value_length(layers[full].head_dim)
    w.add_key_length_swa(layers[swa].head_dim)
    w.add_value_length_swa(layers[swa].head_dim)
    w.add_rope_dimension_count(layers[full].head_dim)
    w.add_rope_dimension_count_swa(layers[swa].head_dim)
    w.add_rope_freq_base(ropes[full].theta)
    w.add_rope_freq_base_swa(ropes[swa].theta)
    w.add_layer_norm_rms_eps(model.eps)
    w.add_sliding_window(max(x.window for x in layers))
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(sum(x.kv_source != i for i, x in enumerate(layers)))
    w.add_embedding_length_per_layer_input(model.ple_dim)
    w.add_final_logit_softcapping(model.final_softcap)
    if model.experts:
        w.add_expert_count(model.experts)
        w.add_expert_used_count(model.top_k)
        w.add_expert_feed_forward_length(model.expert_ffn)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if model.flags & Q8_0 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gemma4")
    w.add_token_list([p.decode() for p in vocab.pieces])
    w.add_token_scores([-1000.0] * len(vocab.pieces))  # llama.cpp's placeholder: BPE ranks by merges
    w.add_token_types([int(t) for t in vocab.types])
    w.add_token_merges([f"{vocab.pieces[a].decode()} {vocab.pieces[b].decode()}" for a, b in vocab.merges])
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    hd = layers[full].head_dim
    rope_freqs = np.full(hd // 2, 1e30, np.float32)
    rope_freqs[:ropes[full].pairs if ropes[full].pairs is not None else hd // 2] = 1.0
    names = {engine: name for name, engine in names_of(model, GGUF_NAMES).items()}
    specs = [s for s in tensor_layout(model) if not s.name.endswith(".rope")]
    extra = [("rope_freqs.weight", rope_freqs)] + [
        (f"blk.{i}.{GGUF_NAMES['layer_scalar']}", np.array([x.layer_scalar], np.float32)) for i, x in enumerate(layers)]
    for name, a in extra:
        w.add_tensor_info(name, a.shape, a.dtype, a.nbytes)
    for s in specs:
        if s.dtype == "q8_0":
            rows = int(np.prod(s.shape[:-1]))
            w.add_tensor_info(names[s.name], (*s.shape[:-1], s.nbytes // rows), np.dtype(np.uint8), s.nbytes,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor_info(names[s.name], s.shape, np.dtype(np.float16 if s.dtype == "f16" else np.float32),
                              s.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    with tqdm(total=sum(s.nbytes for s in specs), unit="B", unit_scale=True, desc=f"writing {Path(path).name}",
              disable=not progress, leave=False) as bar:
        for _, a in extra:
            w.write_padding(fout, fout.tell())
            fout.write(a.tobytes())
            w.write_padding(fout, a.nbytes)
        for s in specs:
            w.write_padding(fout, fout.tell())
            for chunk in source(s):
                data = (quantize_q8_0(chunk.reshape(-1, s.shape[-1])) if s.dtype == "q8_0" else
                        chunk.astype("<f2" if s.dtype == "f16" else "<f4")).tobytes()
                fout.write(data)
                bar.update(len(data))
            w.write_padding(fout, s.nbytes)
    w.close()
