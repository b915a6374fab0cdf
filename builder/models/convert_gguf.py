"""A llama.cpp GGUF file -> a Checkpoint (builder.models.checkpoint) of Gemma 1, 2 or 3;
architecture gemma4 is handed to builder.models.gemma4 with every tensor of the file.

general.architecture `gemma`, `gemma2` or `gemma3`; keys `{arch}.embedding_length`,
`.block_count`, `.feed_forward_length`, `.attention.head_count(_kv)`, `.attention.key_length`,
`.attention.layer_norm_rms_epsilon`, `.context_length`; tokenizer in tokenizer.ggml.*; tensors
`token_embd`, `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`, `output_norm`,
and for Gemma 2/3 `blk.N.post_attention_norm`, `blk.N.post_ffw_norm` (`ffn_norm` is then the
pre-feed-forward norm), Gemma 3 `blk.N.attn_q_norm`, `blk.N.attn_k_norm`. Tensor types: F32,
F16, BF16 and the quantized types of checkpoint.QUANTIZED (dequantized row chunk by row chunk).

What GGUF does not store is fixed by architecture, as llama.cpp does:
- sliding layers: `{arch}.attention.sliding_window_pattern` (an array, true = sliding, or a
  period p: layer i slides when i % p < p - 1), else Gemma 2: even layers, Gemma 3: all but
  every 6th; window `{arch}.attention.sliding_window` (Gemma 2: default 4096; Gemma 3 without
  it: no sliding layers, freq_base everywhere; 0: no sliding layers in either);
- RoPE: `{arch}.rope.freq_base` (default 10000) and linear scaling (`{arch}.rope.scaling.type`
  "linear", the default, or "none"; factor `.scaling.factor`, else the older `.rope.scale_linear`,
  absent or 0 meaning none; other types are refused) on every layer, except
  Gemma 3's sliding layers: `gemma3.rope.freq_base_swa` (default 10000), no scaling;
- attention scale head_dim ** -0.5, except the 27B shapes (Gemma 2 with 46 layers, Gemma 3
  with 62): (d / heads) ** -0.5 (integer division);
- soft-caps: Gemma 2 `gemma2.attn_logit_softcapping` (default 50) and
  `.final_logit_softcapping` (default 30); Gemma 3: `.final_logit_softcapping` (default none;
  an attention soft-cap there is refused: llama.cpp would ignore it, transformers would not).

Also: norms are stored as 1 + w already; the embedding may have more rows than the vocabulary
(cropped); user-defined pieces have their U+2581 written as a space (mapped back), and a GGUF
made without tokenizer_config.json lists them as NORMAL (kept as the file says); eot is looked
up by its piece <end_of_turn> (llama.cpp hard-codes eot_token_id 107).
"""
from __future__ import annotations

from pathlib import Path

from builder.models.checkpoint import (FLAGS, PLAIN, QUANTIZED, SLIDING_PERIOD, Checkpoint, ConvertError,
                                SourceTensor, check_attn, check_dims, field, sliding_by_period,
                                stored_tensors, tensor_name)
from builder.models.gemma4 import open_gguf4
from builder.models.gguf_meta import GGUFError, read_gguf_meta
from builder.models.modelfile import USER_DEFINED, Dims, LayerAttn, Vocab

NAMES = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
         "layer": "blk.{layer}.{what}.weight",
         "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
         "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "wo": "attn_output",
         "post_attn_norm": "post_attention_norm", "ffn_norm": "ffn_norm", "gate": "ffn_gate",
         "up": "ffn_up", "down": "ffn_down", "post_ffn_norm": "post_ffw_norm"}
LAYERS_27B = {"gemma2": 46, "gemma3": 62}
SPACE = "\u2581"


def gguf_name(engine_name: str) -> str:
    """The GGUF name of an engine tensor."""
    return tensor_name(engine_name, NAMES)


def read_vocab(get) -> Vocab:
    if get("tokenizer.ggml.model", str) != "llama":
        raise ConvertError(f"tokenizer {get('tokenizer.ggml.model', str)!r} is not SentencePiece ('llama')")
    tokens = get("tokenizer.ggml.tokens", str, array=True)
    types = get("tokenizer.ggml.token_type", int, array=True)
    pieces = [(t.replace(" ", SPACE) if ty == USER_DEFINED else t).encode() for t, ty in zip(tokens, types)]
    return Vocab(pieces, get("tokenizer.ggml.scores", float, array=True), types,
                 get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id"))


def layer_attn(arch: str, kv: dict, layers: int, where: object) -> list[LayerAttn]:
    """Each layer's window and RoPE (see the module docstring)."""
    def get(key: str, kind: type, default=None):
        return field(kv, f"{arch}.{key}", kind, where, default)
    window = get("attention.sliding_window", int, 4096 if arch == "gemma2" else 0)
    pattern = kv.get(f"{arch}.attention.sliding_window_pattern")
    if arch == "gemma" or window == 0:
        sliding = [False] * layers
    elif isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, (bool, int)) for p in pattern):
            raise ConvertError(f"{where}: {arch}.attention.sliding_window_pattern is not {layers} booleans")
        sliding = [bool(p) for p in pattern]
    else:
        sliding = sliding_by_period(SLIDING_PERIOD[arch] if pattern is None else pattern, layers, where,
                                    f"{arch}.attention.sliding_window_pattern")
    kind = get("rope.scaling.type", str, "linear")
    if kind not in ("none", "linear"):
        raise ConvertError(f"{where}: rope scaling type {kind!r} is not supported (only none and linear)")
    factor = float(get("rope.scaling.factor", float, get("rope.scale_linear", float, 0.0)))
    scale = factor if kind == "linear" and factor != 0 else 1.0  # llama.cpp: no factor (or 0) = none
    full = LayerAttn(0, float(get("rope.freq_base", float, 10000.0)), scale)
    swa = (LayerAttn(window, float(get("rope.freq_base_swa", float, 10000.0))) if arch == "gemma3"
           else LayerAttn(window, full.rope_theta, scale))
    return check_attn([swa if s else full for s in sliding], where)


def read_dims(arch: str, kv: dict, n_vocab: int, where: object) -> Dims:
    def get(key: str, kind: type = int, default=None):
        return field(kv, f"{arch}.{key}", kind, where, default)
    d, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", default=d // max(heads, 1))
    extra = {}
    if arch != "gemma":
        base = d // max(heads, 1) if layers == LAYERS_27B[arch] else head_dim
        if base <= 0:
            raise ConvertError(f"{where}: no attention scale for dim {d}, {heads} heads, head_dim {head_dim}")
        caps = (get("attn_logit_softcapping", float, 50.0), get("final_logit_softcapping", float, 30.0)) \
            if arch == "gemma2" else (0.0, get("final_logit_softcapping", float, 0.0))
        if arch == "gemma3" and get("attn_logit_softcapping", float, 0.0):
            raise ConvertError(f"{where}: gemma3.attn_logit_softcapping is set (llama.cpp ignores it, "
                               "transformers applies it): ambiguous")
        extra = dict(flags=FLAGS[arch], att_scale=float(base) ** -0.5, att_softcap=float(caps[0]),
                     final_softcap=float(caps[1]))
    dims = Dims(n_vocab, d, get("feed_forward_length"), layers, heads,
                get("attention.head_count_kv", default=heads), head_dim, get("context_length"),
                float(get("attention.layer_norm_rms_epsilon", float)), **extra)
    return check_dims(dims, where)


def open_gguf(src: Path) -> Checkpoint:
    try:
        meta = read_gguf_meta(src)
    except GGUFError as e:
        raise ConvertError(f"{src}: not a readable GGUF file ({e})") from None

    def get(key: str, kind: type = int, default=None, array: bool = False):
        return field(meta.kv, key, kind, src, default, array)
    arch = get("general.architecture", str)
    if arch not in FLAGS and arch != "gemma4":
        raise ConvertError(f"unsupported architecture {arch!r}: supported are Gemma 1, 2, 3 and 4 "
                           "('gemma', 'gemma2', 'gemma3', 'gemma4')")
    found = {}
    for t in meta.tensors.values():
        if t.type not in PLAIN and t.type not in QUANTIZED:
            raise ConvertError(f"tensor {t.name} is {t.type}: not a supported type "
                               f"(F32, F16, BF16, {', '.join(QUANTIZED)})")
        found[t.name] = SourceTensor(t.name, src, t.offset, t.type, t.shape)
    if arch == "gemma4":
        return open_gguf4(src, meta.kv, found, get)
    try:
        vocab = read_vocab(get)
    except ConvertError as e:
        raise ConvertError(f"{src}: {e}") from None
    dims = read_dims(arch, meta.kv, len(vocab.pieces), src)
    attn = layer_attn(arch, meta.kv, dims.layers, src)
    wanted = {gguf_name(n): n for n in stored_tensors(dims)}
    extra = sorted(set(found) - set(wanted) - {"output.weight"})
    if extra:
        raise ConvertError(f"unexpected tensor {extra[0]} (are the {arch}.* keys right about the shapes?)")
    return Checkpoint(dims, vocab, {e: found[g] for g, e in wanted.items() if g in found}, attn)
