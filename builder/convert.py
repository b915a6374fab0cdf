"""`python -m builder convert SRC -o OUT`: a Gemma (v1) checkpoint -> the engine's model file.

SRC is a Hugging Face directory (config.json, model.safetensors or shards listed in
model.safetensors.index.json, BF16/F16/F32, tokenizer.model) or a llama.cpp .gguf file
(F16/BF16/F32 tensors, norms already 1 + w, tokenizer in tokenizer.ggml.*). Tensors are read
from the files in chunks of rows (no whole-file mapping), converted to FP16 exactly
(bfloat16 -> float32 is a bit shift, float32 -> float16 rounds to nearest even), so memory
does not grow with the model: peak RSS under 200 MB for Gemma-2B, mostly the 256k-piece
vocabulary (measured; see the README).

What a GGUF carries that a Hugging Face directory does not, and how it is mapped:
- norms: stored as 1 + w already (taken as they are);
- embedding: may have more rows than the vocabulary (cropped to the vocabulary);
- user-defined pieces: llama.cpp writes their U+2581 as a plain space (mapped back), and it
  marks them USER_DEFINED only when the source had a tokenizer_config.json; a GGUF converted
  without one (like the fixtures') has them as NORMAL, and the engine file keeps what the GGUF
  says, so its tokenizer tables (not its weights) then differ from the HF conversion;
- eot: llama.cpp's converter hard-codes tokenizer.ggml.eot_token_id = 107, so eot is looked
  up by its piece <end_of_turn> in both formats.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np

from builder.cli import Parser, run
from builder.gguf_meta import GGUFError, read_gguf_meta
from builder.modelfile import (NORMAL, USER_DEFINED, Dims, Header, LayerAttn, ModelFormatError,
                               TensorSpec, Vocab, tensor_layout, tensor_shapes, write_model)

CHUNK_ELEMS = 1 << 22  # rows are read and converted ~4M values at a time
DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}


class ConvertError(Exception):
    """A checkpoint cannot be converted; str() is one line."""


@dataclass(frozen=True)
class SourceTensor:
    """Where one tensor lies in a checkpoint file."""
    name: str          # its name in the checkpoint (for messages)
    path: Path
    offset: int        # absolute byte offset of its data
    dtype: str         # a key of DTYPES
    shape: tuple[int, ...]
    add_one: bool = False  # a Hugging Face norm: stored as w, written as 1 + w


@dataclass
class Checkpoint:
    dims: Dims
    vocab: Vocab
    tensors: dict[str, SourceTensor]  # engine tensor name -> source
    attn: list[LayerAttn]             # each layer's window and rope


def read_rows(t: SourceTensor, rows: int) -> Iterator[np.ndarray]:
    """The first `rows` rows of t as float32 chunks, read with plain file reads."""
    cols = t.shape[-1]
    dt = DTYPES[t.dtype]
    step = max(1, CHUNK_ELEMS // cols)
    with open(t.path, "rb") as f:
        f.seek(t.offset)
        for start in range(0, rows, step):
            n = min(step, rows - start) * cols
            raw = np.fromfile(f, dt, n)
            if raw.size != n:
                raise ConvertError(f"{t.path}: file ends inside tensor {t.name}")
            x = (raw.astype(np.uint32) << 16).view(np.float32) if t.dtype == "BF16" else raw.astype(np.float32)
            yield (x + np.float32(1)) if t.add_one else x


def source_for(ckpt: Checkpoint):
    """A modelfile.TensorSource reading from ckpt (shapes checked by check_shapes)."""
    def source(spec: TensorSpec) -> Iterator[np.ndarray]:
        return read_rows(ckpt.tensors[spec.name], math.prod(spec.shape[:-1]))
    return source


def check_shapes(ckpt: Checkpoint, specs: list[TensorSpec], crop_rows: set[str]) -> None:
    for spec in specs:
        t = ckpt.tensors.get(spec.name)
        if t is None:
            raise ConvertError(f"missing tensor for {spec.name}")
        ok = t.shape == spec.shape or (spec.name in crop_rows and len(t.shape) == 2 and
                                       t.shape[1] == spec.shape[1] and t.shape[0] >= spec.shape[0])
        if not ok:
            raise ConvertError(f"tensor {t.name} has shape {list(t.shape)}, expected {list(spec.shape)}")


def check_dims(dims: Dims, where: object) -> None:
    try:
        dims.check()
    except ModelFormatError as e:
        raise ConvertError(f"{where}: {e}") from None


def check_attn(attn: list[LayerAttn], where: object) -> list[LayerAttn]:
    try:
        for i, a in enumerate(attn):
            a.check(f"layer {i}")
    except ModelFormatError as e:
        raise ConvertError(f"{where}: {e}") from None
    return attn


def _is(kind: type, v) -> bool:
    return not isinstance(v, bool) and (isinstance(v, kind) or (kind is float and isinstance(v, int)))


def field(table: dict, key: str, kind: type, where: object, default=None, array: bool = False):
    """table[key] (or default), which must be a kind (int, float, str) or an array of them."""
    value = table.get(key)
    value = default if value is None else value  # configs write null for "not set"
    if value is None:
        raise ConvertError(f"{where}: no {key}")
    ok = (isinstance(value, list) and all(_is(kind, v) for v in value)) if array else _is(kind, value)
    if not ok:
        what = {int: "an integer", float: "a number", str: "a string"}[kind]
        raise ConvertError(f"{where}: {key} is not {'an array of ' + what.split()[1] + 's' if array else what}")
    return value


# ---- Hugging Face directory ---------------------------------------------------------------

HF_NAMES = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
            "layer": "model.layers.{layer}.{what}.weight",
            "attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
            "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm", "gate": "mlp.gate_proj",
            "up": "mlp.up_proj", "down": "mlp.down_proj"}


def tensor_name(engine_name: str, names: dict[str, str]) -> str:
    """A source format's name for an engine tensor (`embed`, `final_norm`, `layer.N.what`),
    from that format's table: whole names for embed and final_norm, a pattern for the rest."""
    if engine_name in names:
        return names[engine_name]
    _, layer, what = engine_name.split(".")
    return names["layer"].format(layer=layer, what=names[what])


hf_name = partial(tensor_name, names=HF_NAMES)


def _protobuf_fields(buf: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of a serialized protobuf message (wire types 0, 1, 2, 5)."""
    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = buf[i]
            value, shift, i = value | (b & 0x7F) << shift, shift + 7, i + 1
            if b < 0x80:
                return value, i
    i = 0
    while i < len(buf):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            n, i = varint(i)
            value, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"protobuf wire type {wire}")
        yield key >> 3, value


def sentencepiece_vocab(path: Path) -> Vocab:
    """The vocabulary of a tokenizer.model: pieces and scores through sentencepiece; the piece
    types (sentencepiece's Python API cannot tell USER_DEFINED from NORMAL) from the
    ModelProto (field 1 = pieces, in each piece field 3 = type, default NORMAL)."""
    import sentencepiece as spm
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        types = [next((v for f, v in _protobuf_fields(p) if f == 3), NORMAL)
                 for f, p in _protobuf_fields(sp.serialized_model_proto()) if f == 1]
    except (RuntimeError, OSError, ValueError, IndexError) as e:
        raise ConvertError(f"{path}: not a sentencepiece model ({str(e).splitlines()[0] if str(e) else e})") from None
    n = sp.vocab_size()
    if len(types) != n or sp.bos_id() < 0 or sp.eos_id() < 0:
        raise ConvertError(f"{path}: sentencepiece model without {n} pieces, bos and eos")
    return Vocab([sp.id_to_piece(i).encode() for i in range(n)], [sp.get_score(i) for i in range(n)],
                 types, sp.bos_id(), sp.eos_id())


def safetensors_index(path: Path) -> dict[str, SourceTensor]:
    """The tensors of one .safetensors file (8-byte header length, JSON header, data)."""
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
            if not isinstance(dtype, str) or not all(_is(int, x) and x >= 0 for x in (*shape, start, end)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path}: malformed header entry for tensor {name}") from None
        if dtype not in DTYPES:
            raise ConvertError(f"{path}: tensor {name} has dtype {dtype}; expected BF16, F16 or F32")
        if end - start != math.prod(shape) * DTYPES[dtype].itemsize:
            raise ConvertError(f"{path}: tensor {name} has {end - start} bytes for shape {list(shape)}")
        out[name] = SourceTensor(name, path, 8 + n + start, dtype, shape, name.endswith("norm.weight"))
    return out


def open_hf(src: Path) -> Checkpoint:
    def need(name: str) -> Path:
        if not (src / name).is_file():
            raise ConvertError(f"{src}: no {name} (expected a Hugging Face model directory or a .gguf file)")
        return src / name
    try:
        config = json.loads(need("config.json").read_text())
    except ValueError as e:
        raise ConvertError(f"{src / 'config.json'}: invalid JSON ({e})") from None
    where = src / "config.json"
    if not isinstance(config, dict):
        raise ConvertError(f"{where}: not a JSON object")
    arch = config.get("model_type")
    archs = config.get("architectures") or ["GemmaForCausalLM"]
    if arch != "gemma" or archs != ["GemmaForCausalLM"]:
        raise ConvertError(f"unsupported architecture {arch!r} ({archs}): "
                           "only Gemma v1 (model_type 'gemma', GemmaForCausalLM) is supported")
    rope_parameters = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}

    def get(key: str, kind: type = int, default=None):
        return field(config, key, kind, where, default)
    heads, d = get("num_attention_heads"), get("hidden_size")
    dims = Dims(get("vocab_size"), d, get("intermediate_size"), get("num_hidden_layers"), heads,
                get("num_key_value_heads", default=heads), get("head_dim", default=d // max(heads, 1)),
                get("max_position_embeddings"), float(get("rms_norm_eps", float, 1e-6)))
    check_dims(dims, where)
    theta = float(get("rope_theta", float, field(rope_parameters, "rope_theta", float, where, 10000.0)))
    attn = check_attn([LayerAttn(0, theta)] * dims.layers, where)
    vocab = sentencepiece_vocab(need("tokenizer.model"))
    if (src / "model.safetensors.index.json").is_file():
        try:
            weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(f, str) and "/" not in f for f in files):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConvertError(f"{src / 'model.safetensors.index.json'}: no valid weight_map") from None
    else:
        need("model.safetensors")
        files = ["model.safetensors"]
    found: dict[str, SourceTensor] = {}
    for name in files:
        if not (src / name).is_file():
            raise ConvertError(f"{src}: no {name} (listed in model.safetensors.index.json)")
        found.update(safetensors_index(src / name))
    wanted = {hf_name(n): n for n, _, _ in tensor_shapes(dims) if not n.endswith(("window", "rope"))}
    extra = sorted(set(found) - set(wanted) - {"lm_head.weight"})
    if extra:
        raise ConvertError(f"unexpected tensor {extra[0]} (is config.json right about the shapes?)")
    return Checkpoint(dims, vocab, {e: found[h] for h, e in wanted.items() if h in found}, attn)


# ---- GGUF ---------------------------------------------------------------------------------

GGUF_NAMES = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
              "layer": "blk.{layer}.{what}.weight",
              "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
              "wo": "attn_output", "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up",
              "down": "ffn_down"}
SPACE = "\u2581"
gguf_name = partial(tensor_name, names=GGUF_NAMES)


def open_gguf(src: Path) -> Checkpoint:
    try:
        meta = read_gguf_meta(src)
    except GGUFError as e:
        raise ConvertError(f"{src}: not a readable GGUF file ({e})") from None

    def get(key: str, kind: type = int, default=None, array: bool = False):
        return field(meta.kv, key, kind, src, default, array)
    arch = get("general.architecture", str)
    if arch != "gemma":
        raise ConvertError(f"unsupported architecture {arch!r}: only Gemma v1 ('gemma') is supported")
    if get("tokenizer.ggml.model", str) != "llama":
        raise ConvertError(f"{src}: tokenizer {get('tokenizer.ggml.model', str)!r} is not SentencePiece ('llama')")
    tokens = get("tokenizer.ggml.tokens", str, array=True)
    types = get("tokenizer.ggml.token_type", int, array=True)
    pieces = [(t.replace(" ", SPACE) if ty == USER_DEFINED else t).encode() for t, ty in zip(tokens, types)]
    vocab = Vocab(pieces, get("tokenizer.ggml.scores", float, array=True), types,
                  get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id"))
    d, heads = get("gemma.embedding_length"), get("gemma.attention.head_count")
    dims = Dims(len(tokens), d, get("gemma.feed_forward_length"), get("gemma.block_count"),
                heads, get("gemma.attention.head_count_kv", default=heads),
                get("gemma.attention.key_length", default=d // max(heads, 1)), get("gemma.context_length"),
                float(get("gemma.attention.layer_norm_rms_epsilon", float)))
    check_dims(dims, src)
    attn = check_attn([LayerAttn(0, float(get("gemma.rope.freq_base", float, 10000.0)))] * dims.layers, src)
    found = {}
    for t in meta.tensors.values():
        if t.type not in DTYPES:
            raise ConvertError(f"tensor {t.name} is {t.type}: quantized GGUF files are not supported "
                               "(convert an F16, BF16 or F32 GGUF)")
        found[t.name] = SourceTensor(t.name, src, t.offset, t.type, t.shape)
    wanted = {gguf_name(n): n for n, _, _ in tensor_shapes(dims) if not n.endswith(("window", "rope"))}
    extra = sorted(set(found) - set(wanted) - {"output.weight"})
    if extra:
        raise ConvertError(f"unexpected tensor {extra[0]} (are the gemma.* keys right about the shapes?)")
    return Checkpoint(dims, vocab, {e: found[g] for g, e in wanted.items() if g in found}, attn)


# ---- driver -------------------------------------------------------------------------------

def open_checkpoint(src: Path) -> Checkpoint:
    if src.is_dir():
        return open_hf(src)
    if src.is_file():
        return open_gguf(src)
    raise ConvertError(f"{src}: no such file or directory")


def convert(src: Path, out: Path, progress: bool = True) -> Header:
    """Convert src (HF directory or .gguf) to the model file out; on failure out is removed."""
    src, out = Path(src), Path(out)
    ckpt = open_checkpoint(src)
    check_shapes(ckpt, [s for s in tensor_layout(ckpt.dims) if s.name.rsplit(".", 1)[-1] not in ("window", "rope")],
                 {"embed"})
    try:
        return write_model(out, ckpt.dims, ckpt.vocab, source_for(ckpt), progress,
                           names={e: t.name for e, t in ckpt.tensors.items()}, attn=ckpt.attn)
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder convert",
               description="Convert a Gemma (v1) checkpoint, a Hugging Face directory or an "
                           "F16/BF16/F32 GGUF file, to gemma's model file.")
    p.add_argument("src", type=Path, help="Hugging Face model directory or .gguf file")
    p.add_argument("-o", "--output", type=Path, required=True, help="model file to write")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    return run("convert", lambda: convert(args.src, args.output, not args.quiet),
               (ConvertError, ModelFormatError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
