"""`f16_twin(src, out)`: a GGUF's F16 twin, for comparing llama.cpp with the engine on the
very weights the engine computes with.

Every key/value of src is copied (but general.file_type, which becomes MOSTLY_F16); every
tensor is dequantized with the gguf package (`gguf.quants.dequantize`, as the converter does)
and written as F16, except F32 tensors (norms), which stay F32. The engine's converter rounds
the same dequantized values to FP16, so both engines then read identical weights. Tensors are
converted one at a time (peak memory: the largest tensor in float32, 0.7 GB for Gemma 3's
embedding), with a progress bar. `wtype="q8_0"` makes a Q8_0 twin the same way (see f16_twin).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from builder.models.modelfile import Q8_0_BLOCK, QK8_0, quantize_q8_0


def f16_twin(src: Path, out: Path, progress: bool = True, wtype: str = "f16") -> None:
    """Write the twin of GGUF src at out. wtype "q8_0": a Q8_0 twin instead, the GGUF of what
    `convert --type q8_0` makes of src: Q8_0 tensors copied, the other tensors that are not
    F32 quantized to Q8_0 from their dequantized values where their rows split into 32-weight
    blocks (FP16 otherwise), as llama.cpp quantizes."""
    import gguf
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer writes these itself
        writer.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if wtype == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    f32, q8 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}

    def kind(t) -> str:
        if t.tensor_type == f32:
            return "f32"
        return "q8_0" if wtype == "q8_0" and shapes[t.name][-1] % QK8_0 == 0 else "f16"
    for t in reader.tensors:
        n = int(np.prod(shapes[t.name]))
        if kind(t) == "q8_0":
            writer.add_tensor_info(t.name, shapes[t.name], np.dtype(np.float32), n // QK8_0 * Q8_0_BLOCK,
                                   raw_dtype=q8)
        else:
            dtype = np.float32 if kind(t) == "f32" else np.float16
            writer.add_tensor_info(t.name, shapes[t.name], np.dtype(dtype), n * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tqdm(reader.tensors, desc=f"writing {Path(out).name}", disable=not progress,
                  leave=False):
        if kind(t) == "q8_0" and t.tensor_type == q8:
            writer.write_tensor_data(np.asarray(t.data))  # the blocks as they are
            continue
        data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shapes[t.name])
        if kind(t) == "q8_0":
            writer.write_tensor_data(quantize_q8_0(data.reshape(-1, shapes[t.name][-1])))
        else:
            writer.write_tensor_data(data.astype(np.float32 if kind(t) == "f32" else np.float16))
    writer.close()
