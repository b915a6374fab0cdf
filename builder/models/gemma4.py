"""Gemma 4 (text) checkpoints -> a Checkpoint holding a model file version 3 description.

`open_hf4(src, cfg, ...)`: a Hugging Face directory whose config.json is `gemma4_text`
(Gemma4ForCausalLM) or the text_config of `gemma4` (Gemma4ForConditionalGeneration: weights
under model.language_model.*, the vision and audio towers ignored), tokenizer.json beside it
(bpe_vocab). `open_gguf4(src, meta)`: a llama.cpp GGUF of architecture `gemma4`.

What both say, as docs/gemma.md ("Gemma 4") computes it:
- layer kinds from layer_types / sliding_window_pattern; sliding layers: head_dim and
  num_key_value_heads; full layers: global_head_dim (default 512) and, only with
  attention_k_eq_v, num_global_key_value_heads; or, as transformers saves its own configs,
  per_layer_config {"i": {"head_dim", "num_key_value_heads"}};
- RoPE: sliding layers rope type default (every pair rotates), full layers proportional: the
  first int(partial_rotary_factor * hd // 2) pairs rotate, exponent over the whole hd (a GGUF
  says so by rope_freqs.weight: 1.0 for a rotated pair, 1e30 for the others);
- KV sharing: the last num_kv_shared_layers layers read the cache of the last earlier layer of
  their kind (transformers' rule; a GGUF whose llama.cpp rule, layer L-S-1 for full and L-S-2
  for sliding layers, differs is refused: llama.cpp would compute another model); their stored
  k/v/k_norm weights are dropped; use_double_wide_mlp doubles those layers' FFN;
- norms hold w (no 1 +), attention scale 1, value norm, layer_scalar, PLE, MoE, final soft-cap.
Refused with one line: use_bidirectional_attention "all" (an encoder), attention_bias,
untied embeddings, an activation other than tanh GELU, rope types other than default, linear
and proportional, a kv-shared layer with no earlier layer of its kind.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builder.models.bpe_vocab import gguf_bpe_vocab, tokenizer_json_vocab
from builder.models.checkpoint import (Checkpoint, ConvertError, SourceTensor, field, read_rows, sliding_by_period)
from builder.models.modelfile import POST_NORMS, QK_NORM, ModelFormatError, Vocab
from builder.models.modelfile3 import DIM_LIMITS, K_EQ_V, MERGES, MOE, V_NORM, Layer, Model, Rope, tensor_shapes

LAYER_KINDS = ("sliding_attention", "full_attention")
SLIDING_PERIOD = 6
TEXT_DEFAULTS = {"vocab_size": 262144, "head_dim": 256, "sliding_window": 512, "rms_norm_eps": 1e-6,
                 "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0}
ROPE_DEFAULTS = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                 "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}}
HF_NAMES = {"embed": "embed_tokens.weight", "final_norm": "norm.weight",
            "ple_embed": "embed_tokens_per_layer.weight", "ple_proj": "per_layer_model_projection.weight",
            "ple_norm": "per_layer_projection_norm.weight", "layer": "layers.{layer}.{what}",
            "attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
            "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight", "q_norm": "self_attn.q_norm.weight",
            "k_norm": "self_attn.k_norm.weight", "wo": "self_attn.o_proj.weight",
            "post_attn_norm": "post_attention_layernorm.weight", "ffn_norm": "pre_feedforward_layernorm.weight",
            "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
            "post_ffn_norm": "post_feedforward_layernorm.weight",
            "post_ffn_norm_1": "post_feedforward_layernorm_1.weight", "router_scale": "router.scale",
            "router": "router.proj.weight", "expert_scale": "router.per_expert_scale",
            "ffn_norm_2": "pre_feedforward_layernorm_2.weight", "experts_gate_up": "experts.gate_up_proj",
            "experts_down": "experts.down_proj", "post_ffn_norm_2": "post_feedforward_layernorm_2.weight",
            "ple_gate": "per_layer_input_gate.weight", "ple_out": "per_layer_projection.weight",
            "ple_post_norm": "post_per_layer_input_norm.weight", "layer_scalar": "layer_scalar"}
GGUF_NAMES = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
              "ple_embed": "per_layer_token_embd.weight", "ple_proj": "per_layer_model_proj.weight",
              "ple_norm": "per_layer_proj_norm.weight", "layer": "blk.{layer}.{what}",
              "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
              "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight", "wo": "attn_output.weight",
              "post_attn_norm": "post_attention_norm.weight", "ffn_norm": "ffn_norm.weight",
              "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
              "post_ffn_norm": "post_ffw_norm.weight", "post_ffn_norm_1": "post_ffw_norm_1.weight",
              "router_scale": "ffn_gate_inp.scale", "router": "ffn_gate_inp.weight",
              "expert_scale": "ffn_down_exps.scale", "ffn_norm_2": "pre_ffw_norm_2.weight",
              "experts_gate_up": "ffn_gate_up_exps.weight", "experts_down": "ffn_down_exps.weight",
              "post_ffn_norm_2": "post_ffw_norm_2.weight", "ple_gate": "inp_gate.weight",
              "ple_out": "proj.weight", "ple_post_norm": "post_norm.weight",
              "layer_scalar": "layer_output_scale.weight"}
UNUSED_SHARED = ("wk", "wv", "k_norm")  # what a kv-shared layer may store but never uses


@dataclass
class Gemma4:
    """A Gemma 4 text model's shape as its config says it, per layer where it varies."""
    vocab: int
    dim: int
    heads: int
    max_ctx: int
    eps: float
    sliding: list[bool]
    window: int
    head_dim: list[int]
    kv_heads: list[int]
    ffn: list[int]
    k_eq_v: list[bool]       # full layers with attention_k_eq_v (from a GGUF: own-kv layers without attn_v)
    shared: int              # S: the last S layers read an earlier layer's K/V
    ple_dim: int
    experts: int
    top_k: int
    expert_ffn: int
    final_softcap: float
    ropes: list[Rope]

    def kv_sources(self, where: object) -> list[int]:
        """transformers' rule: layer l >= L - S reads the last layer before L - S of its kind."""
        n, first = len(self.sliding), len(self.sliding) - self.shared
        if not 0 <= self.shared < n:
            raise ConvertError(f"{where}: {self.shared} kv-shared layers of {n}")
        out = list(range(n))
        for i in range(first, n):
            src = next((j for j in range(first - 1, -1, -1) if self.sliding[j] == self.sliding[i]), None)
            if src is None:
                raise ConvertError(f"{where}: kv-shared layer {i} has no earlier {LAYER_KINDS[not self.sliding[i]]} "
                                   "layer to read")
            out[i] = src
        return out

    def model(self, scalars: list[float], where: object) -> tuple[Model, list[Rope]]:
        sources = self.kv_sources(where)
        layers = []
        for i, src in enumerate(sources):
            own = V_NORM | (K_EQ_V if self.k_eq_v[i] else 0) if src == i else 0
            layers.append(Layer(self.head_dim[i], self.kv_heads[i], self.ffn[i], src, self.window if self.sliding[i]
                                else 0, POST_NORMS | QK_NORM | own | (MOE if self.experts else 0), 1.0, scalars[i]))
        model = Model(self.vocab, self.dim, self.heads, min(self.max_ctx, DIM_LIMITS["max_ctx"]), tuple(layers),
                      self.eps, self.ple_dim, self.experts, self.top_k, self.expert_ffn, MERGES,
                      final_softcap=self.final_softcap)
        try:
            model.check()
        except ModelFormatError as e:
            raise ConvertError(f"{where}: {e}") from None
        return model, self.ropes


def names_of(model: Model, table: dict[str, str], prefix: str = "") -> dict[str, str]:
    """Source name of every stored engine tensor of model (all but the rope tables)."""
    def name(engine: str) -> str:
        if engine in table:
            return prefix + table[engine]
        _, layer, what = engine.split(".")
        return prefix + table["layer"].format(layer=layer, what=table[what])
    return {name(n): n for n, _, _ in tensor_shapes(model) if not n.endswith(".rope")}


def checkpoint(shape: Gemma4, vocab: Vocab, found: dict[str, SourceTensor], table: dict[str, str],
               prefix: str, ignored: set[str], where: object) -> Checkpoint:
    """The Checkpoint of a Gemma 4 source: layer_scalar read from each layer's [1] tensor,
    the unused k/v of kv-shared layers and `ignored` dropped, anything else unexpected refused."""
    layer_name = prefix + table["layer"]
    scalars = []
    for i in range(len(shape.sliding)):
        t = found.get(layer_name.format(layer=i, what=table["layer_scalar"]))
        if t is None or math.prod(t.shape) != 1:
            raise ConvertError(f"{where}: no layer_scalar of one value for layer {i}")
        scalars.append(float(next(read_rows(t, 1))[0, 0]))
    model, ropes = shape.model(scalars, where)
    wanted = names_of(model, table, prefix)
    unused = {layer_name.format(layer=i, what=table[w]) for i, layer in enumerate(model.layers)
              if layer.kv_source != i for w in UNUSED_SHARED}
    scalar_names = {layer_name.format(layer=i, what=table["layer_scalar"]) for i in range(len(model.layers))}
    extra = sorted(set(found) - set(wanted) - unused - scalar_names - ignored)
    if extra:
        raise ConvertError(f"unexpected tensor {extra[0]} (is the config right about the shapes?)")
    return Checkpoint(None, vocab, {e: found[h] for h, e in wanted.items() if h in found}, [], (model, ropes))


# ---- Hugging Face -------------------------------------------------------------------------

def rope_of(params: object, hd: int, where: object, key: str) -> Rope:
    if not isinstance(params, dict):
        raise ConvertError(f"{where}: {key} is not a JSON object")
    kind = params.get("rope_type", "default")
    theta = float(field(params, "rope_theta", float, where))
    if kind == "default":
        return Rope(theta)
    if kind == "linear":
        return Rope(theta, float(field(params, "factor", float, where)))
    if kind == "proportional":
        factor = float(field(params, "factor", float, where, 1.0))
        return Rope(theta, factor, int(field(params, "partial_rotary_factor", float, where) * hd // 2))
    raise ConvertError(f"{where}: {key} has rope type {kind!r}: only default, linear and proportional are supported")


def from_hf_config(cfg: dict, n_vocab: int, where: object) -> Gemma4:
    """The shape of a gemma4_text config (or a gemma4 text_config), defaults applied."""
    cfg = {**TEXT_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}

    def get(key: str, kind: type = int, default=None):
        return field(cfg, key, kind, where, default)

    def flag(key: str) -> bool:
        if not isinstance(cfg.get(key, False), bool):
            raise ConvertError(f"{where}: {key} is not true or false")
        return cfg.get(key, False)
    if cfg.get("use_bidirectional_attention") not in (None, "vision"):
        raise ConvertError(f"{where}: use_bidirectional_attention is {cfg['use_bidirectional_attention']!r} "
                           "(only causal text runs: null or 'vision')")
    for key, ok in (("attention_bias", (False,)), ("tie_word_embeddings", (True,)),
                    ("hidden_activation", ("gelu_pytorch_tanh",))):
        if cfg.get(key, ok[0]) not in ok:
            raise ConvertError(f"{where}: {key} is {cfg[key]!r}, the engine computes {ok[0]!r}")
    n = get("num_hidden_layers")
    kinds = cfg.get("layer_types")
    if kinds is None:
        sliding = sliding_by_period(SLIDING_PERIOD, n, where, "layer_types")
    elif isinstance(kinds, list) and len(kinds) == n and all(k in LAYER_KINDS for k in kinds):
        sliding = [k == "sliding_attention" for k in kinds]
    else:
        raise ConvertError(f"{where}: layer_types is not a list of {n} of {LAYER_KINDS}")
    k_eq_v = flag("attention_k_eq_v")
    hd, kv = get("head_dim"), get("num_key_value_heads")
    plc = cfg.get("per_layer_config")
    if plc is not None:
        if not isinstance(plc, dict) or not all(isinstance(v, dict) for v in plc.values()):
            raise ConvertError(f"{where}: per_layer_config is not an object of objects")
        head_dim = [field(plc.get(str(i), {}), "head_dim", int, where, hd) for i in range(n)]
        kv_heads = [field(plc.get(str(i), {}), "num_key_value_heads", int, where, kv) for i in range(n)]
    else:
        global_kv = get("num_global_key_value_heads", int, kv) if k_eq_v else kv
        head_dim = [hd if s else get("global_head_dim", int, 512) for s in sliding]
        kv_heads = [kv if s else global_kv for s in sliding]
    params = cfg.get("rope_parameters") or ROPE_DEFAULTS
    if not isinstance(params, dict):
        raise ConvertError(f"{where}: rope_parameters is not a JSON object")
    ropes = [rope_of(params.get(LAYER_KINDS[not s], ROPE_DEFAULTS[LAYER_KINDS[not s]]), h, where,
                     f"rope_parameters.{LAYER_KINDS[not s]}") for s, h in zip(sliding, head_dim)]
    shared, ffn = get("num_kv_shared_layers"), get("intermediate_size")
    double, moe = flag("use_double_wide_mlp"), flag("enable_moe_block")
    vocab = get("vocab_size")
    if vocab < n_vocab:
        raise ConvertError(f"{where}: vocab_size {vocab} is below the tokenizer's {n_vocab} pieces")
    ple = get("hidden_size_per_layer_input")
    if ple and get("vocab_size_per_layer_input", int, vocab) < n_vocab:
        raise ConvertError(f"{where}: vocab_size_per_layer_input is below the tokenizer's {n_vocab} pieces")
    return Gemma4(n_vocab, get("hidden_size"), get("num_attention_heads"), get("max_position_embeddings"),
                  float(get("rms_norm_eps", float)), sliding, get("sliding_window") if any(sliding) else 0,
                  head_dim, kv_heads, [ffn * (2 if double and i >= n - shared else 1) for i in range(n)],
                  [k_eq_v and not s for s in sliding], shared, ple, get("num_experts") if moe else 0,
                  get("top_k_experts") if moe else 0, get("moe_intermediate_size") if moe else 0,
                  float(get("final_logit_softcapping", float, 0.0)), ropes)


def open_hf4(src: Path, cfg: dict, found: dict[str, SourceTensor], prefix: str, where: object) -> Checkpoint:
    """found: every tensor of the checkpoint's safetensors files (norms read as stored: w)."""
    vocab = tokenizer_json_vocab(src)
    shape = from_hf_config(cfg, len(vocab.pieces), where)
    towers = {k for k in found if not k.startswith(prefix)}
    return checkpoint(shape, vocab, found, HF_NAMES, prefix, towers | {"lm_head.weight"}, where)


# ---- GGUF -----------------------------------------------------------------------------------

def per_layer(kv: dict, key: str, n: int, where: object) -> list[int]:
    """A GGUF number that may be one per layer (an array) or one for all."""
    value = kv.get(key)
    if isinstance(value, list):
        if len(value) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConvertError(f"{where}: {key} is not {n} integers")
        return value
    return [field(kv, key, int, where)] * n


def rope_pairs(freqs: np.ndarray, where: object) -> int:
    """How many pairs rotate, from rope_freqs.weight (1.0 for those, then >= 1e30: llama.cpp
    divides each frequency by it, so those are ~0, as transformers' proportional rope has 0)."""
    r = int(np.argmin(freqs == 1.0)) if not (freqs == 1.0).all() else len(freqs)
    if not (freqs[:r] == 1.0).all() or not (freqs[r:] >= 1e30).all():
        raise ConvertError(f"{where}: rope_freqs.weight is not proportional rope (1.0 for the rotated pairs, "
                           "then 1e30)")
    return r


def from_gguf(kv: dict, tensors: dict[str, SourceTensor], n_vocab: int, where: object) -> Gemma4:
    def get(key: str, kind: type = int, default=None):
        return field(kv, f"gemma4.{key}", kind, where, default)
    n = get("block_count")
    pattern = kv.get("gemma4.attention.sliding_window_pattern")
    if not (isinstance(pattern, list) and len(pattern) == n and all(isinstance(p, bool) for p in pattern)):
        raise ConvertError(f"{where}: gemma4.attention.sliding_window_pattern is not {n} booleans")
    sliding = list(pattern)
    shared = get("attention.shared_kv_layers", int, 0)
    first = n - shared
    for i in range(first, n):  # llama.cpp's rule must be transformers' (Gemma4.kv_sources)
        llama = first - 1 if not sliding[i] else first - 2
        ours = next((j for j in range(first - 1, -1, -1) if sliding[j] == sliding[i]), None)
        if ours is not None and llama != ours:  # (None: kv_sources refuses it)
            raise ConvertError(f"{where}: kv-shared layer {i} reads layer {ours} by the layer kinds but llama.cpp "
                               f"would read layer {llama}: refused (llama.cpp computes another model)")
    hd = {False: get("attention.key_length"), True: get("attention.key_length_swa")}
    for s, key in ((False, "attention.value_length"), (True, "attention.value_length_swa")):
        if get(key, int, hd[s]) != hd[s]:
            raise ConvertError(f"{where}: gemma4.{key} differs from the key length")
    head_dim = [hd[s] for s in sliding]
    freqs = tensors.get("rope_freqs.weight")
    pairs = (rope_pairs(np.concatenate(list(read_rows(freqs, 1))).reshape(-1), where) if freqs is not None
             else None)
    full, swa = float(get("rope.freq_base", float, 1e6)), float(get("rope.freq_base_swa", float, 10000.0))
    ropes = [Rope(swa) if s else Rope(full, 1.0, pairs) for s in sliding]
    own_v = [f"blk.{i}.attn_v.weight" in tensors for i in range(n)]
    experts = get("expert_count", int, 0)
    return Gemma4(n_vocab, get("embedding_length"), get("attention.head_count"), get("context_length"),
                  float(get("attention.layer_norm_rms_epsilon", float)), sliding,
                  get("attention.sliding_window") if any(sliding) else 0, head_dim,
                  per_layer(kv, "gemma4.attention.head_count_kv", n, where),
                  per_layer(kv, "gemma4.feed_forward_length", n, where), [not v for v in own_v], shared,
                  get("embedding_length_per_layer_input", int, 0), experts,
                  get("expert_used_count", int, 0) if experts else 0,
                  get("expert_feed_forward_length", int, 0) if experts else 0,
                  float(get("final_logit_softcapping", float, 0.0)), ropes)


def open_gguf4(src: Path, kv: dict, found: dict[str, SourceTensor], get) -> Checkpoint:
    if get("tokenizer.ggml.model", str) != "gemma4":
        raise ConvertError(f"{src}: tokenizer {get('tokenizer.ggml.model', str)!r} is not Gemma 4's ('gemma4')")
    vocab = gguf_bpe_vocab(get, src)
    shape = from_gguf(kv, found, len(vocab.pieces), src)
    return checkpoint(shape, vocab, found, GGUF_NAMES, "", {"rope_freqs.weight", "output.weight"}, src)
