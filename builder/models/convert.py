"""`python -m builder convert SRC -o OUT [--format 2|3|4]`: a Gemma 1, 2, 3 or 4 checkpoint -> a
model file: version 4 by default (modelfile4: the forward pass as a program, compiled by
builder.models.program; what the engine reads; every generation, Gemma 4's MoE included), or on
request the Python side's formats (the numpy reference reads them): version 2 (Gemma 1-3) and
version 3 (modelfile3, every generation).

SRC is a Hugging Face directory (builder.models.convert_hf: model_type gemma, gemma2, gemma3_text,
gemma3, gemma4_text or gemma4 (builder.models.gemma4); BF16/F16/F32 safetensors) or a llama.cpp
.gguf file (builder.models.convert_gguf: architecture gemma, gemma2, gemma3 or gemma4; F32/F16/BF16
or quantized tensors). Tensors are read in
chunks of whole rows with plain file reads (builder.models.checkpoint.read_rows; no whole-file map)
and rounded to FP16 (`--type q8_0`: quantized to Q8_0, a GGUF's Q8_0 blocks copied) by
modelfile.write_tensors, so memory does not grow with the model (E2B's 4.70 GB PLE table too): plain
types convert exactly, quantized ones are dequantized one chunk (~4M values) at a time; peak
RSS under 200 MB for Gemma-2B, mostly the 256k-piece vocabulary (measured; docs/gemma.md).
A checkpoint the engine cannot compute exactly as its reference does is refused with one
line; no output file is left behind on failure.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from builder.models.checkpoint import Checkpoint, ConvertError, check_shapes, source_for
from builder.cli import ENGINE_VERSION, Parser, model_summary, run
from builder.models.convert_gguf import open_gguf
from builder.models.convert_hf import open_hf
from builder.models import modelfile3, program
from builder.models.modelfile import MAGIC, Q8_0, WEIGHT_TYPES, Header, ModelFormatError, tensor_layout, write_model
from builder.models.modelfile3 import with_q8_0

VERSIONS = (2, 3, 4)
DEFAULT_VERSION = 4  # written when --format is not given: the version the engine reads

__all__ = ["ConvertError", "convert", "main", "open_checkpoint"]


def open_checkpoint(src: Path) -> Checkpoint:
    """The checkpoint of a Hugging Face directory or a GGUF file (a model file made by convert
    or synth is refused with one line that says what it is)."""
    if src.is_dir():
        return open_hf(src)
    if src.is_file():
        with open(src, "rb") as f:
            magic, version = f.read(len(MAGIC)), f.read(4)
        if magic == MAGIC:
            version = f", version {int.from_bytes(version, 'little')}" if len(version) == 4 else ""
            raise ConvertError(f"{src}: a gemma model file already (magic GEMMAASM{version}; ./gemma -m runs "
                               f"version {ENGINE_VERSION}), not a Hugging Face directory or GGUF file")
        return open_gguf(src)
    raise ConvertError(f"{src}: no such file or directory")


def convert(src: Path, out: Path, progress: bool = True, wtype: str = "f16", version: int | None = None) -> Header:
    """Convert src (HF directory or .gguf) to the model file out with matrices of wtype (one
    of WEIGHT_TYPES: "f16", or "q8_0": GGUF Q8_0 tensors copied as they are, every other
    tensor quantized from its exact values), in format version (one of VERSIONS; default
    DEFAULT_VERSION); on failure out is removed."""
    src, out = Path(src), Path(out)
    ckpt = open_checkpoint(src)
    version = version or DEFAULT_VERSION
    if version == 2 and ckpt.dims is None:
        raise ConvertError(f"{src}: model file version 2 holds Gemma 1-3 only: a Gemma 4 model is version 4 "
                           "(the default) or 3 (--format 3)")
    names = {e: t.name for e, t in ckpt.tensors.items()}
    try:
        if version == 2:
            check_shapes(ckpt, [s for s in tensor_layout(ckpt.dims) if s.name.rsplit(".", 1)[-1] not in ("window", "rope")],
                         {"embed"})
            dims = replace(ckpt.dims, flags=ckpt.dims.flags | Q8_0) if wtype == "q8_0" else ckpt.dims
            return write_model(out, dims, ckpt.vocab, source_for(ckpt), progress, names=names, attn=ckpt.attn)
        model, ropes = ckpt.version3()
        model = with_q8_0(model) if wtype == "q8_0" else model
        if version == 4:
            prog = program.compile_program(model, ropes, program.generation_of(ckpt.dims))
            check_shapes(ckpt, prog.stored, {"embed", "ple_embed"})
            return program.write(out, prog, ckpt.vocab, source_for(ckpt), progress, names)
        check_shapes(ckpt, [s for s in modelfile3.tensor_layout(model) if not s.name.endswith(".rope")],
                     {"embed", "ple_embed"})
        return modelfile3.write_model(out, model, ckpt.vocab, source_for(ckpt), ropes, progress, names)
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder convert",
               description="Convert a Gemma 1, 2, 3 or 4 checkpoint, a Hugging Face directory or a "
                           "GGUF file (F32, F16, BF16 or quantized), to gemma's model file.")
    p.add_argument("src", type=Path, help="Hugging Face model directory or .gguf file")
    p.add_argument("-o", "--output", type=Path, required=True, help="model file to write")
    p.add_argument("--type", choices=WEIGHT_TYPES, default="f16",
                   help="the matrices' type (default f16; q8_0: llama.cpp's Q8_0 blocks, a GGUF's "
                        "Q8_0 tensors copied as they are)")
    p.add_argument("--format", type=int, choices=VERSIONS,
                   help="model file version (default 4: the forward pass as a program, what the engine "
                        "reads; every generation); 2 (Gemma 1-3) and 3 on request: the Python side's "
                        "formats, which the numpy reference reads")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    return run(p.prog, lambda: convert(args.src, args.output, not args.quiet, args.type, args.format),
               (ConvertError, ModelFormatError), model_summary(p.prog, args.output))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
