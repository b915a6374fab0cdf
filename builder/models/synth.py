"""`python -m builder synth --preset NAME [--seed S] -o OUT [--gguf OUT.gguf]`: a random Gemma
model of exactly a preset's shapes, with a valid tokenizer, no download needed.

Presets (PRESETS): Gemma 1 `tiny`, `2b`, `7b`; Gemma 2 `tiny-g2`, `g2-2b`; Gemma 3 `tiny-g3`,
`g3-270m`, `g3-1b`. A preset is the model's Dims (flags, attention scale and soft-caps
included), each layer's attention (LayerAttn: window, rope theta) and its GGUF architecture;
Gemma 2/3 presets follow llama.cpp's conventions for what GGUF does not store (Gemma 2: even
layers slide, scale head_dim ** -0.5; Gemma 3: layer i full when (i+1) % 6 == 0, rope theta
1e6 on full layers and 10000 on sliding ones), so their GGUF twin means the same model.

Weights are N(0, 0.02) rounded to FP16 (norms: 1 + N(0, 0.1) in FP32), drawn per tensor and
per chunk of rows from a generator seeded by (seed, tensor number), so they are generated
chunk by chunk (a 5 GB model never sits in memory) and the same on every pass: `--gguf` writes
the identical weights again as an F16 GGUF for llama.cpp (arch gemma, gemma2 or gemma3 with
their keys and tensor names, norms 1 + w, tokenizer.ggml.model "llama"); converting that GGUF
back gives the same model file. `--type q8_0`: the matrices quantized to Q8_0 (those whose rows
are not a multiple of 32 weights stay FP16), in the model file and in the GGUF alike, the same
blocks; `convert --type q8_0` of that GGUF copies them back into the same model file.

The vocabulary looks like a SentencePiece BPE one: <pad> </s> <s> <unk>, <start_of_turn>,
<end_of_turn>, user-defined whitespace pieces (tab, newline runs, runs of U+2581), the 256
byte pieces, then normal pieces: merges of earlier pieces (scores 0, -1, -2, ...; U+2581 only
at the start; never digits together) followed by the single characters. Gemma 4's (BPE by
merge rank) has Gemma 4's chat pieces instead of <start_of_turn> and <end_of_turn>: the control
pieces <|turn> (id 105) and <turn|> (id 106, the header's eot, as in the published
checkpoints), after <unused0> .. <unused100>.
"""
from __future__ import annotations

import dataclasses
import math
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from builder.cli import Parser, model_summary, run
from builder.models.convert_gguf import gguf_name
from builder.models.checkpoint import FLAGS, SLIDING_PERIOD
from builder.models import program
from builder.models.convert import DEFAULT_VERSION, VERSIONS
from builder.models.modelfile3 import Model, Rope, from_v2
from builder.models.modelfile3 import make_header as make_header3
from builder.models.modelfile3 import with_q8_0
from builder.models.modelfile3 import write_model as write_model3
from builder.models.synth4 import PRESETS4, write_gguf4
from builder.models.modelfile import (BYTE, CONTROL, LAYER_TENSORS, NORMAL, Q8_0, UNKNOWN, UNUSED, USER_DEFINED,
                               WEIGHT_TYPES, Dims, Header, LayerAttn, ModelFormatError, TensorSpec, Vocab,
                               make_header, quantize_q8_0, tensor_layout, write_model)


@dataclass(frozen=True)
class Preset:
    """A model to synthesize: shapes and header scalars, each layer's attention, GGUF arch."""
    dims: Dims
    attn: tuple[LayerAttn, ...]
    arch: str  # "gemma", "gemma2" or "gemma3"


def gemma1(**shapes) -> Preset:
    dims = Dims(**shapes)
    return Preset(dims, (LayerAttn(),) * dims.layers, "gemma")


def gemma2(window: int, **shapes) -> Preset:
    """Gemma 2: post norms, soft-caps 50 / 30, even layers slide (rope theta 10000)."""
    dims = Dims(**shapes, flags=FLAGS["gemma2"], att_softcap=50.0, final_softcap=30.0)
    p = SLIDING_PERIOD["gemma2"]
    return Preset(dims, tuple(LayerAttn(window if i % p < p - 1 else 0) for i in range(dims.layers)), "gemma2")


def gemma3(window: int, **shapes) -> Preset:
    """Gemma 3: post and q/k norms, layer i full when (i+1) % 6 == 0 (theta 1e6, else 10000)."""
    dims = Dims(**shapes, flags=FLAGS["gemma3"])
    p = SLIDING_PERIOD["gemma3"]
    return Preset(dims, tuple(LayerAttn(window, 10000.0) if i % p < p - 1 else LayerAttn(0, 1e6)
                              for i in range(dims.layers)), "gemma3")


PRESETS = {
    # GQA (2 query heads per kv head) and H*hd != d: what the fixtures (MQA, MHA) do not cover
    "tiny": gemma1(vocab=1024, dim=64, ffn=192, layers=2, heads=4, kv_heads=2, head_dim=24, max_ctx=512),
    "2b": gemma1(vocab=256000, dim=2048, ffn=16384, layers=18, heads=8, kv_heads=1, head_dim=256, max_ctx=8192),
    "7b": gemma1(vocab=256000, dim=3072, ffn=24576, layers=28, heads=16, kv_heads=16, head_dim=256, max_ctx=8192),
    "tiny-g2": gemma2(5, vocab=1024, dim=64, ffn=192, layers=4, heads=4, kv_heads=2, head_dim=24, max_ctx=512),
    "g2-2b": gemma2(4096, vocab=256000, dim=2304, ffn=9216, layers=26, heads=8, kv_heads=4, head_dim=256,
                    max_ctx=8192),
    "tiny-g3": gemma3(6, vocab=1024, dim=64, ffn=192, layers=6, heads=4, kv_heads=1, head_dim=32, max_ctx=512),
    "g3-270m": gemma3(512, vocab=262144, dim=640, ffn=2048, layers=18, heads=4, kv_heads=1, head_dim=256,
                      max_ctx=32768),
    "g3-1b": gemma3(512, vocab=262144, dim=1152, ffn=6912, layers=26, heads=4, kv_heads=1, head_dim=256,
                    max_ctx=32768),
}
WEIGHT_STD, NORM_STD = 0.02, 0.1
CHUNK_ELEMS = 1 << 22
SPACE = "\u2581"
MAX_PIECE_CHARS = 16
TURN_IDS = (105, 106)   # Gemma 4's <|turn> and <turn|>


def synth_vocab(n: int, seed: int, by_rank: bool = False) -> Vocab:
    """A plausible SentencePiece BPE vocabulary of exactly n pieces; by_rank: Gemma 4's, BPE by
    merge rank (each merged piece's pair, in the order they were made; scores 0), whose chat
    pieces are Gemma 4's control pieces <|turn> and <turn|> at Gemma 4's ids (TURN_IDS; the
    ids between <unk> and them are <unusedK> pieces), so that <turn|> is the header's eot."""
    specials = [("<pad>", CONTROL), ("</s>", CONTROL), ("<s>", CONTROL), ("<unk>", UNKNOWN)]
    if by_rank:
        specials += [(f"<unused{k}>", UNUSED) for k in range(TURN_IDS[0] - len(specials))]
        specials += [("<|turn>", CONTROL), ("<turn|>", CONTROL)]
    else:
        specials += [("<start_of_turn>", USER_DEFINED), ("<end_of_turn>", USER_DEFINED)]
    specials += [("\t", USER_DEFINED)]
    specials += [("\n" * k, USER_DEFINED) for k in range(2, 5)]
    specials += [(SPACE * k, USER_DEFINED) for k in range(2, 9)]
    specials += [("<0x%02X>" % b, BYTE) for b in range(256)]
    n_normal = n - len(specials)
    chars = [SPACE] + [chr(c) for c in range(0x21, 0x7F)]
    extra = [chr(c) for c in list(range(0xC0, 0x100)) + list(range(0x3B1, 0x3CA)) + list(range(0x4E00, 0x5200))]
    chars += extra[:max(0, n_normal // 8 - len(chars))]
    if n_normal < len(chars):
        raise ValueError(f"vocabulary of {n} is too small (at least {len(specials) + len(chars)})")
    rng = random.Random(seed)
    taken = {p for p, _ in specials} | set(chars)
    merges: list[str] = []
    pairs: list[tuple[str, str]] = []
    pool = chars[:]
    while len(merges) < n_normal - len(chars):
        a = pool[int(len(pool) * rng.random() ** 3)]  # favour short, early pieces
        b = pool[int(len(pool) * rng.random() ** 3)]
        new = a + b
        if (SPACE in b or len(new) > MAX_PIECE_CHARS or new in taken
                or any(x.isdigit() for x in new)):
            continue
        taken.add(new)
        merges.append(new)
        pairs.append((a, b))
        pool.append(new)
    normal = merges + chars
    pieces = [p for p, _ in specials] + normal
    types = [t for _, t in specials] + [NORMAL] * len(normal)
    if by_rank:
        index = {p: i for i, p in enumerate(pieces)}
        return Vocab([p.encode() for p in pieces], [0.0] * len(pieces), types, bos=2, eos=1,
                     merges=[(index[a], index[b]) for a, b in pairs])
    scores = [0.0] * len(specials) + [-float(i) for i in range(len(normal))]
    return Vocab([p.encode() for p in pieces], scores, types, bos=2, eos=1)


def synth_source(seed: int):
    """The modelfile.TensorSource of the random weights (same values on every call)."""
    def source(spec: TensorSpec) -> Iterator[np.ndarray]:
        rng = np.random.default_rng([seed, _tensor_number(spec.name)])
        cols = spec.shape[-1]
        rows = math.prod(spec.shape[:-1])
        step = max(1, CHUNK_ELEMS // cols)
        for start in range(0, rows, step):
            x = rng.standard_normal((min(step, rows - start), cols), dtype=np.float32)
            if spec.dtype == "f32":
                yield np.float32(1) + np.float32(NORM_STD) * x
            else:
                yield np.float32(WEIGHT_STD) * x
    return source


def _tensor_number(name: str) -> int:
    """A stable number per tensor name, independent of the preset (version 3's own tensors
    numbered apart from version 2's, whose numbers stay as they were)."""
    if name in GLOBALS:
        return GLOBALS.index(name) if name in GLOBALS[:2] else (1 << 30) + GLOBALS.index(name)
    _, layer, what = name.split(".")
    if what in LAYER_TENSORS:
        return 2 + len(LAYER_TENSORS) * int(layer) + LAYER_TENSORS.index(what)
    return (1 << 20) + len(LAYER_TENSORS3) * int(layer) + LAYER_TENSORS3.index(what)


GLOBALS = ("embed", "final_norm", "ple_embed", "ple_proj", "ple_norm")
LAYER_TENSORS3 = ("post_ffn_norm_1", "router_scale", "router", "expert_scale", "ffn_norm_2", "experts_gate_up",
                  "experts_down", "post_ffn_norm_2", "ple_gate", "ple_out", "ple_post_norm")


def synth_header(preset: str, seed: int = 0) -> Header:
    """The version 2 header of a Gemma 1-3 preset (what `synth --format 2` writes; no weights
    are generated): the model's shapes as version 2 records them."""
    dims = PRESETS[preset].dims
    return make_header(dims, synth_vocab(dims.vocab, seed))[0]


def write_gguf(path: Path, preset: Preset, vocab: Vocab, source, progress: bool = True) -> None:
    """Write an F16 GGUF (llama.cpp's layout of preset.arch) with the tensors of source, streamed;
    with the Q8_0 flag in preset.dims, a Q8_0 GGUF: the model file's matrix types (Q8_0 where
    the rows split into 32-weight blocks, F16 otherwise, as llama.cpp quantizes), the same
    blocks (modelfile.quantize_q8_0)."""
    import gguf
    dims, attn = preset.dims, preset.attn
    w = gguf.GGUFWriter(path, preset.arch)
    w.add_context_length(dims.max_ctx)
    w.add_embedding_length(dims.dim)
    w.add_block_count(dims.layers)
    w.add_feed_forward_length(dims.ffn)
    w.add_head_count(dims.heads)
    w.add_head_count_kv(dims.kv_heads)
    w.add_key_length(dims.head_dim)
    w.add_value_length(dims.head_dim)
    w.add_layer_norm_rms_eps(dims.eps)
    full = next((a for a in attn if not a.window), attn[0])
    w.add_rope_freq_base(full.rope_theta)
    if preset.arch != "gemma":
        w.add_sliding_window(max(a.window for a in attn))
    if preset.arch == "gemma3":
        w.add_rope_freq_base_swa(next((a for a in attn if a.window), full).rope_theta)
    if preset.arch == "gemma2":
        w.add_attn_logit_softcapping(dims.att_softcap)
        w.add_final_logit_softcapping(dims.final_softcap)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if dims.flags & Q8_0 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    # llama.cpp matches user-defined pieces against the raw text, so it spells their U+2581
    # as a space (as its convert_hf_to_gguf.py does); builder.models.convert maps it back.
    w.add_token_list([p.decode().replace(SPACE, " ") if t == USER_DEFINED else p.decode()
                      for p, t in zip(vocab.pieces, vocab.types)])
    w.add_token_scores([float(s) for s in vocab.scores])
    w.add_token_types([int(t) for t in vocab.types])
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    if UNKNOWN in vocab.types:
        w.add_unk_token_id(vocab.types.index(UNKNOWN))
    w.add_pad_token_id(0)
    w.add_eot_token_id(vocab.eot)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    specs = [s for s in tensor_layout(dims) if s.dtype != "u32" and not s.name.endswith(".rope")]
    for s in specs:
        if s.dtype == "q8_0":
            w.add_tensor_info(gguf_name(s.name), (s.shape[0], s.nbytes // s.shape[0]), np.dtype(np.uint8),
                              s.nbytes, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor_info(gguf_name(s.name), s.shape,
                              np.dtype(np.float16 if s.dtype == "f16" else np.float32), s.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    with tqdm(total=sum(s.nbytes for s in specs), unit="B", unit_scale=True,
              desc=f"writing {Path(path).name}", disable=not progress, leave=False) as bar:
        for s in specs:
            w.write_padding(fout, fout.tell())
            for chunk in source(s):
                data = (quantize_q8_0(chunk) if s.dtype == "q8_0" else
                        chunk.astype("<f2" if s.dtype == "f16" else "<f4")).tobytes()
                fout.write(data)
                bar.update(len(data))
            w.write_padding(fout, s.nbytes)
    w.close()


def synth(preset: str, out: Path, seed: int = 0, gguf_out: Path | None = None,
          progress: bool = True, wtype: str = "f16", version: int | None = None) -> Header:
    """Write the preset's random model (matrices of wtype, one of WEIGHT_TYPES) at out, and
    with gguf_out its GGUF twin, as model file `version` (one of convert.VERSIONS; default
    convert.DEFAULT_VERSION, 4). Refuses (ValueError) when the disk under out has not room for
    what it would write, or a version that cannot hold the preset (2 for a Gemma 4 preset)."""
    version = version or DEFAULT_VERSION
    if version not in VERSIONS or (version == 2 and preset in PRESETS4):
        raise ValueError(f"preset {preset} cannot be written as model file version {version}")
    if preset in PRESETS4:
        model, ropes = PRESETS4[preset]
        model = with_q8_0(model) if wtype == "q8_0" else model
        vocab = synth_vocab(model.vocab, seed, by_rank=True)
        header = write_v3_v4(preset, out, model, ropes, 4, vocab, seed, version, 1 + (gguf_out is not None), progress)
        if gguf_out is not None:
            write_gguf4(gguf_out, model, ropes, vocab, synth_source(seed), progress)
        return header
    p = PRESETS[preset]
    if wtype == "q8_0":
        p = dataclasses.replace(p, dims=dataclasses.replace(p.dims, flags=p.dims.flags | Q8_0))
    vocab = synth_vocab(p.dims.vocab, seed)
    if version == 2:
        check_room(preset, out, make_header(p.dims, vocab)[0].file_size * (1 + (gguf_out is not None)))
        header = write_model(out, p.dims, vocab, synth_source(seed), progress, attn=p.attn)
    else:
        model, ropes = from_v2(p.dims, p.attn)
        header = write_v3_v4(preset, out, model, ropes, program.generation_of(p.dims), vocab, seed, version,
                             1 + (gguf_out is not None), progress)
    if gguf_out is not None:
        write_gguf(gguf_out, p, vocab, synth_source(seed), progress)
    return header


def write_v3_v4(preset: str, out: Path, model: Model, ropes: list[Rope], generation: int, vocab: Vocab, seed: int,
                version: int, copies: int, progress: bool):
    """A preset's model file of version 3 or 4 (4: compiled for its generation), once there is
    room for `copies` times its size."""
    if version == 3:
        check_room(preset, out, make_header3(model, vocab)[0].file_size * copies)
        return write_model3(out, model, vocab, synth_source(seed), ropes, progress)
    prog = program.compile_program(model, ropes, generation)
    check_room(preset, out, program.make_header(prog, vocab)[0].file_size * copies)
    return program.write(out, prog, vocab, synth_source(seed), progress)


DISK_RESERVE = 8 << 30  # what synth leaves free on the disk it writes to, for everything else


def check_room(preset: str, out: Path, need: int) -> None:
    """Refuse (ValueError) to write `need` bytes where that would leave less than DISK_RESERVE free
    (a missing directory is left to the write's own error)."""
    if not Path(out).resolve().parent.is_dir():
        return
    free = shutil.disk_usage(Path(out).resolve().parent).free
    if need + DISK_RESERVE > free:
        raise ValueError(f"preset {preset} needs {need / 1e9:.1f} GB on disk; {free / 1e9:.1f} GB are free under "
                         f"{Path(out).resolve().parent} and synth leaves {DISK_RESERVE / 1e9:.1f} GB of them")


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder synth",
               description="Write a random Gemma 1, 2, 3 or 4 model of a preset's shapes (tiny, tiny-g2, "
                           "tiny-g3, tiny-g4, tiny-g4-dense; 2b: 5.0 GB; 7b: 17 GB; g2-2b: 5.2 GB; g3-270m: 0.5 GB; g3-1b: "
                           "2.0 GB; Gemma 4, sizes in model file version 3: g4-e2b 9.3 GB, g4-e4b 15 GB, g4-31b "
                           "61 GB, g4-26b-a4b 51 GB) with a valid tokenizer, optionally also "
                           "as a GGUF.")
    p.add_argument("--preset", choices=sorted(PRESETS) + sorted(PRESETS4), required=True)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("-o", "--output", type=Path, required=True, help="model file to write")
    p.add_argument("--type", choices=WEIGHT_TYPES, default="f16",
                   help="the matrices' type (default f16; q8_0: llama.cpp's Q8_0 blocks)")
    p.add_argument("--format", type=int, choices=VERSIONS,
                   help="model file version (default 4: the forward pass as a program, what the engine reads; "
                        "every preset); 2 (Gemma 1-3) and 3 on request: the Python side's formats, which the "
                        "numpy reference reads")
    p.add_argument("--gguf", type=Path,
                   help="also write the same weights as a GGUF here (F16, or with --type q8_0 Q8_0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    return run(p.prog, lambda: synth(args.preset, args.output, args.seed, args.gguf, not args.quiet,
                                      args.type, args.format),
               (ModelFormatError, ValueError), model_summary(p.prog, args.output))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
