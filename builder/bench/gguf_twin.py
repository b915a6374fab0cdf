"""`f16_twin(src, out)`: a GGUF's F16 twin, for comparing llama.cpp with the engine on the
very weights the engine computes with.

Every key/value of src is copied (but general.file_type, which becomes MOSTLY_F16); every
tensor is dequantized with the gguf package (`gguf.quants.dequantize`, as the converter does)
and written as F16, except F32 tensors (norms), which stay F32. The engine's converter rounds
the same dequantized values to FP16, so both engines then read identical weights. Tensors are
converted one at a time (peak memory: the largest tensor in float32, 0.7 GB for Gemma 3's
embedding), with a progress bar.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm


def f16_twin(src: Path, out: Path, progress: bool = True) -> None:
    import gguf
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer writes these itself
        writer.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    f32 = gguf.GGMLQuantizationType.F32
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    for t in reader.tensors:
        dtype = np.float32 if t.tensor_type == f32 else np.float16
        writer.add_tensor_info(t.name, shapes[t.name], np.dtype(dtype),
                               int(np.prod(shapes[t.name])) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tqdm(reader.tensors, desc=f"writing {Path(out).name}", disable=not progress,
                  leave=False):
        dtype = np.float32 if t.tensor_type == f32 else np.float16
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(dtype).reshape(shapes[t.name])
        writer.write_tensor_data(data)
    writer.close()
