"""Variants of the fixture checkpoints for converter tests: copies of a fixture's Hugging Face
directory or GGUF with edits, and quantized tensor data.

    src = hf_variant(tmp, "tiny_g3", config=lambda c: c.update(sliding_window=0))
    src = gguf_variant(tmp, "tiny_g3", kv=kv_set(gemma3__rope__freq_base_swa=None))

`hf_variant` / `gguf_variant` write into tmp and return the source to convert; their edits
change a dict in place (config.json; safetensors name -> (dtype, shape, bytes); GGUF key ->
(value, types); GGUF tensor name -> (array, raw GGML type or None)). `quantized(qtype, x, rng)`
gives raw rows of a GGML type (the K-quants, which the gguf package cannot quantize, as random
blocks with small float16 scales).
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np

from modelfiles import fixture_path


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


def hf_variant(tmp: Path, name: str = "tiny_mqa", config=None, tensors=None) -> Path:
    """A copy of a fixture's HF directory; config(dict) and tensors(dict) edit in place."""
    src, out = fixture_path(name), tmp / f"{name}-variant"
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    config and config(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    for tokenizer in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        if (src / tokenizer).is_file():
            shutil.copy(src / tokenizer, out / tokenizer)
    ts = read_safetensors(src / "model.safetensors")
    tensors and tensors(ts)
    write_safetensors(out / "model.safetensors", ts)
    return out


def gguf_variant(tmp: Path, name: str = "tiny_mqa", arch: str | None = None, kv=None, tensors=None) -> Path:
    """A copy of a fixture's GGUF rewritten with gguf.GGUFWriter (as architecture arch: by
    default the fixture's); kv / tensors: dict edits. tensors maps name -> (array, raw GGML
    type or None)."""
    reader = gguf.GGUFReader(fixture_path(name) / "model-f16.gguf")
    arch = arch or reader.fields["general.architecture"].contents()
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


def kv_set(**values):
    """A gguf_variant kv edit setting (or, with None, removing) keys."""
    def edit(v):
        for k, x in values.items():
            k = k.replace("__", ".")
            if x is None:
                v.pop(k, None)
            elif isinstance(x, str):
                v[k] = (x, [gguf.GGUFValueType.STRING])
            elif isinstance(x, list):
                v[k] = (x, [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL])
            else:
                v[k] = (x, [gguf.GGUFValueType.FLOAT32 if isinstance(x, float) else gguf.GGUFValueType.UINT32])
    return edit


# Where the float16 scales of each K-quant block lie (GGML's block layouts): random bytes
# elsewhere are valid quants; these are set to a small scale so the values stay finite.
K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def quantized(qtype: str, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """x quantized to qtype (raw uint8 rows); the K-quants, which gguf cannot quantize, as
    random blocks of x's shape with sane scales."""
    t = gguf.GGMLQuantizationType[qtype]
    if qtype in ("F16", "F32"):
        return x.astype(np.float16 if qtype == "F16" else np.float32)
    if qtype not in K_SCALES:
        return gguf.quants.quantize(x.astype(np.float32), t)
    block, nbytes = gguf.GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, (x.shape[0], x.shape[1] // block, nbytes), dtype=np.uint8)
    for off in K_SCALES[qtype]:
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    return raw.reshape(x.shape[0], -1)
