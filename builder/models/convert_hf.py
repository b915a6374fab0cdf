"""A Hugging Face model directory -> a Checkpoint (builder.models.checkpoint) of Gemma 1, 2 or 3;
Gemma 4 (model_type gemma4_text, gemma4) is handed to builder.models.gemma4 with every tensor
of the safetensors files (norms read as stored: Gemma 4's hold w).

Files: config.json, model.safetensors (or the shards model.safetensors.index.json lists;
BF16, F16 or F32 tensors), tokenizer.model (SentencePiece). Norms are stored as w and written
as 1 + w.

model_type (architectures) and where things are:
- gemma (GemmaForCausalLM), gemma2 (Gemma2ForCausalLM), gemma3_text (Gemma3ForCausalLM): keys
  at the top of config.json, weights `model.*`;
- gemma3 (Gemma3ForConditionalGeneration, the 4B-27B multimodal checkpoints): the text model's
  keys under `text_config`, where a missing key takes Gemma3TextConfig's default (TEXT_DEFAULTS;
  e.g. the 4B config leaves out 8 heads, 4 kv heads, head_dim 256); weights under
  `language_model.model.*` or `model.language_model.*`; vision tower and projector ignored.

What is read beyond the shapes (DEFAULTS: what transformers assumes when a key is absent):
- attention scale: query_pre_attn_scalar ** -0.5 (Gemma 2, 3), head_dim ** -0.5 (Gemma 1);
- soft-caps: attn_logit_softcapping, final_logit_softcapping (null: none);
- sliding layers: layer_types ("sliding_attention" / "full_attention", one per layer), else
  sliding_window_pattern (a period), else the generation's default; window: sliding_window;
- RoPE per layer: rope_parameters (one per layer type; Gemma 1/2: or one dict for every
  layer), else the older rope_theta, rope_local_base_freq (Gemma 3's sliding layers) and
  rope_scaling (Gemma 3: full layers only); rope_type "default", or "linear" (inverse
  frequencies / factor);
- Gemma 3's vocabulary: config.json says 262208 rows, tokenizer.model has 262144 pieces: the
  tokenizer's count is the vocabulary and the embedding is cropped (as llama.cpp does).
Refused with one line: other model types, use_bidirectional_attention (EmbeddingGemma is not
a causal language model), untied embeddings, other rope types, a Gemma 3 rope_parameters that
does not name the layer types, malformed layer_types.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path

from builder.models.checkpoint import (FLAGS, PLAIN, SLIDING_PERIOD, Checkpoint, ConvertError, SourceTensor,
                                check_attn, check_dims, field, is_kind, sliding_by_period, stored_tensors,
                                tensor_name)
from builder.models.gemma4 import open_hf4
from builder.models.modelfile import Dims, LayerAttn, Vocab

# model_type -> (generation, the architectures entry it must have)
MODEL_TYPES = {"gemma": ("gemma", "GemmaForCausalLM"), "gemma2": ("gemma2", "Gemma2ForCausalLM"),
               "gemma3_text": ("gemma3", "Gemma3ForCausalLM"),
               "gemma3": ("gemma3", "Gemma3ForConditionalGeneration"),
               "gemma4_text": ("gemma4", "Gemma4ForCausalLM"),
               "gemma4": ("gemma4", "Gemma4ForConditionalGeneration")}
DEFAULTS = {
    "gemma": {},
    "gemma2": {"query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "sliding_window": 4096},
    "gemma3": {"query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_theta": 1e6,
               "rope_local_base_freq": 10000.0},
    "gemma4": {},  # builder.models.gemma4 applies Gemma4TextConfig's defaults
}
TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6}
TEXT_PREFIXES = ("language_model.model.", "model.language_model.")
LAYER_KINDS = ("sliding_attention", "full_attention")

NAMES = {"embed": "embed_tokens.weight", "final_norm": "norm.weight",
         "layer": "layers.{layer}.{what}.weight",
         "attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
         "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
         "ffn_norm": "post_attention_layernorm", "gate": "mlp.gate_proj",
         "up": "mlp.up_proj", "down": "mlp.down_proj"}
NAMES_2 = {**NAMES, "post_attn_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
           "post_ffn_norm": "post_feedforward_layernorm", "q_norm": "self_attn.q_norm",
           "k_norm": "self_attn.k_norm"}


def hf_name(engine_name: str, generation: str = "gemma", prefix: str = "model.") -> str:
    """The checkpoint's name of an engine tensor."""
    return prefix + tensor_name(engine_name, NAMES if generation == "gemma" else NAMES_2)


def sentencepiece_vocab(path: Path) -> Vocab:
    """The vocabulary of a tokenizer.model: pieces and scores through sentencepiece; the piece
    types (sentencepiece's Python API cannot tell USER_DEFINED from NORMAL) from its ModelProto,
    read with sentencepiece's own sentencepiece_model_pb2 (types numbered as modelfile's)."""
    import sentencepiece as spm
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        proto = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto())
        types = [piece.type for piece in proto.pieces]
    except (RuntimeError, OSError, ValueError, DecodeError) as e:
        raise ConvertError(f"{path}: not a sentencepiece model ({str(e).splitlines()[0] if str(e) else e})") from None
    n = sp.vocab_size()
    if len(types) != n or sp.bos_id() < 0 or sp.eos_id() < 0:
        raise ConvertError(f"{path}: sentencepiece model without {n} pieces, bos and eos")
    return Vocab([sp.id_to_piece(i).encode() for i in range(n)], [sp.get_score(i) for i in range(n)],
                 types, sp.bos_id(), sp.eos_id())


def safetensors_index(path: Path) -> dict[str, SourceTensor]:
    """The tensors of one .safetensors file (8-byte header length, JSON header, data), each
    with its file offset, for read_rows' chunked plain reads. Read here, not with the
    safetensors package: its safe_open exposes no offsets, and its numpy side cannot hand out
    BF16 tensors, Gemma's (numpy has no bfloat16). The tests hold this index to safe_open's."""
    with open(path, "rb") as f:
        head = f.read(8)
        try:
            (n,) = struct.unpack("<Q", head)
            meta = json.loads(f.read(n)) if n < 1 << 27 else None
        except (struct.error, ValueError, UnicodeDecodeError):
            meta = None
    if not isinstance(meta, dict):
        raise ConvertError(f"{path}: not a safetensors file")
    out = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not isinstance(dtype, str) or not all(is_kind(int, x) and x >= 0 for x in (*shape, start, end)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path}: malformed header entry for tensor {name}") from None
        if dtype not in PLAIN:
            raise ConvertError(f"{path}: tensor {name} has dtype {dtype}; expected BF16, F16 or F32")
        if end - start != math.prod(shape) * PLAIN[dtype].itemsize:
            raise ConvertError(f"{path}: tensor {name} has {end - start} bytes for shape {list(shape)}")
        out[name] = SourceTensor(name, path, 8 + n + start, dtype, shape, name.endswith("norm.weight"))
    return out


def read_config(where: Path) -> tuple[str, dict, bool]:
    """(generation, the text model's config with DEFAULTS applied, whether it is multimodal)."""
    try:
        config = json.loads(where.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"{where}: invalid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{where}: not a JSON object")
    model_type = config.get("model_type")
    generation, arch = MODEL_TYPES.get(model_type, (None, None)) if isinstance(model_type, str) else (None, None)
    archs = config.get("architectures") or [arch]
    if generation is None or archs != [arch]:
        raise ConvertError(f"unsupported architecture {model_type!r} ({archs}): supported are Gemma 1, 2, "
                           "3 and 4 (model_type gemma, gemma2, gemma3_text, gemma3, gemma4_text, gemma4)")
    if model_type in ("gemma3", "gemma4"):
        text = config.get("text_config", {})
        if not isinstance(text, dict):
            raise ConvertError(f"{where}: text_config is not a JSON object")
        config = {**(TEXT_DEFAULTS if generation == "gemma3" else {}), **{k: v for k, v in text.items() if v is not None}}
    if config.get("use_bidirectional_attention") is True:
        raise ConvertError(f"{where}: use_bidirectional_attention is true (an embedding model, not a "
                           "causal language model)")
    if config.get("tie_word_embeddings") not in (None, True):  # null: the default, tied
        raise ConvertError(f"{where}: tie_word_embeddings is not true (the engine's output is the embedding)")
    return generation, {**DEFAULTS[generation], **config}, model_type in ("gemma3", "gemma4")


def rope_of(params: object, where: object, key: str) -> tuple[float, float]:
    """(theta, linear scale) of a rope parameter dict (rope_type default or linear)."""
    if not isinstance(params, dict):
        raise ConvertError(f"{where}: {key} is not a JSON object")
    theta = float(field(params, "rope_theta", float, where, 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, 1.0
    if kind == "linear":
        return theta, float(field(params, "factor", float, where))
    raise ConvertError(f"{where}: {key} has rope type {kind!r}: only 'default' and 'linear' are supported")


def layer_attn(generation: str, cfg: dict, layers: int, where: object) -> list[LayerAttn]:
    """Each layer's window and RoPE (see the module docstring)."""
    if generation == "gemma":
        sliding = [False] * layers
    elif cfg.get("layer_types") is not None:
        kinds = cfg["layer_types"]
        if not (isinstance(kinds, list) and len(kinds) == layers and all(k in LAYER_KINDS for k in kinds)):
            raise ConvertError(f"{where}: layer_types is not a list of {layers} of {LAYER_KINDS}")
        sliding = [k == "sliding_attention" for k in kinds]
    else:
        key = next((k for k in ("sliding_window_pattern", "_sliding_window_pattern") if cfg.get(k) is not None),
                   "sliding_window_pattern")
        sliding = sliding_by_period(cfg.get(key, SLIDING_PERIOD[generation]), layers, where, key)
    window = field(cfg, "sliding_window", int, where) if any(sliding) else 0
    if any(sliding) and window < 1:
        raise ConvertError(f"{where}: sliding_window {window} must be positive")
    params = cfg.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise ConvertError(f"{where}: rope_parameters is not a JSON object")
        if set(params) & set(LAYER_KINDS):
            rope = {k: rope_of(params[k], where, f"rope_parameters.{k}") for k in LAYER_KINDS if k in params}
        elif generation == "gemma3":  # one dict would not say which theta the sliding layers take
            raise ConvertError(f"{where}: rope_parameters does not name full_attention and sliding_attention")
        else:
            rope = dict.fromkeys(LAYER_KINDS, rope_of(params, where, "rope_parameters"))
    else:
        scaling = cfg.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise ConvertError(f"{where}: rope_scaling is not a JSON object")
        theta = field(cfg, "rope_theta", float, where, 10000.0)
        rope = {"full_attention": rope_of({**scaling, "rope_theta": theta}, where, "rope_scaling")}
        rope["sliding_attention"] = ((float(field(cfg, "rope_local_base_freq", float, where)), 1.0)
                                     if generation == "gemma3" else rope["full_attention"])
    missing = [k for k in LAYER_KINDS if (k == "sliding_attention") in sliding and k not in rope]
    if missing:
        raise ConvertError(f"{where}: rope_parameters has no {missing[0]}")
    return check_attn([LayerAttn(window if s else 0, *rope[LAYER_KINDS[0 if s else 1]]) for s in sliding], where)


def read_dims(generation: str, cfg: dict, vocab: Vocab, where: object) -> Dims:
    def get(key: str, kind: type = int, default=None):
        return field(cfg, key, kind, where, default)
    heads, d = get("num_attention_heads"), get("hidden_size")
    head_dim = get("head_dim", default=d // max(heads, 1))
    n = get("vocab_size")
    if generation == "gemma3" and n > len(vocab.pieces):
        n = len(vocab.pieces)  # extra embedding rows (262208 for 262144 pieces) are cropped
    extra = {}
    if generation != "gemma":
        softcaps = [field(cfg, k, float, where, 0.0) for k in ("attn_logit_softcapping", "final_logit_softcapping")]
        qpas = get("query_pre_attn_scalar", float)
        if not 0 < qpas < math.inf:
            raise ConvertError(f"{where}: query_pre_attn_scalar {qpas} must be positive")
        extra = dict(flags=FLAGS[generation], att_scale=float(qpas) ** -0.5,
                     att_softcap=float(softcaps[0]), final_softcap=float(softcaps[1]))
    dims = Dims(n, d, get("intermediate_size"), get("num_hidden_layers"), heads,
                get("num_key_value_heads", default=heads), head_dim, get("max_position_embeddings"),
                float(get("rms_norm_eps", float, 1e-6)), **extra)
    return check_dims(dims, where)


def safetensors_files(src: Path) -> dict[str, SourceTensor]:
    """Every tensor of the directory's model.safetensors, or of the shards its index lists."""
    if (src / "model.safetensors.index.json").is_file():
        try:
            weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(f, str) and "/" not in f for f in files):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConvertError(f"{src / 'model.safetensors.index.json'}: no valid weight_map") from None
    else:
        if not (src / "model.safetensors").is_file():
            raise ConvertError(f"{src}: no model.safetensors (expected a Hugging Face model directory or a .gguf file)")
        files = ["model.safetensors"]
    found: dict[str, SourceTensor] = {}
    for name in files:
        if not (src / name).is_file():
            raise ConvertError(f"{src}: no {name} (listed in model.safetensors.index.json)")
        found.update(safetensors_index(src / name))
    return found


def open_hf(src: Path) -> Checkpoint:
    def need(name: str) -> Path:
        if not (src / name).is_file():
            raise ConvertError(f"{src}: no {name} (expected a Hugging Face model directory or a .gguf file)")
        return src / name
    where = need("config.json")
    generation, cfg, multimodal = read_config(where)
    if generation == "gemma4":  # norms hold the multiplier itself: read as stored
        found = {k: replace(t, add_one=False) for k, t in safetensors_files(src).items()}
        prefix = next((p for p in TEXT_PREFIXES if p + NAMES["embed"] in found), TEXT_PREFIXES[1]) \
            if multimodal else "model."
        return open_hf4(src, cfg, found, prefix, where)
    vocab = sentencepiece_vocab(need("tokenizer.model"))
    dims = read_dims(generation, cfg, vocab, where)
    attn = layer_attn(generation, cfg, dims.layers, where)
    found = safetensors_files(src)
    prefix, ignored = "model.", ("lm_head.weight",)
    if multimodal:
        prefix = next((p for p in TEXT_PREFIXES if p + NAMES["embed"] in found), TEXT_PREFIXES[0])
        found = {k: v for k, v in found.items() if k.startswith(prefix)}  # not the vision tower
    wanted = {hf_name(n, generation, prefix): n for n in stored_tensors(dims)}
    extra = sorted(set(found) - set(wanted) - set(ignored))
    if extra:
        raise ConvertError(f"unexpected tensor {extra[0]} (is config.json right about the shapes?)")
    return Checkpoint(dims, vocab, {e: found[h] for h, e in wanted.items() if h in found}, attn)
