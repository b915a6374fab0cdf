"""Valid model files of unusual shapes: the engine must run them or refuse them cleanly.

`SHAPES` are legal by the format (heads % kv_heads == 0, head_dim even, ffn a multiple of 4)
but far from the fixtures: dimensions of 1, 3, 5, 7 (no multiple of a vector width), head_dim
larger than dim, many heads over one kv head, ffn smaller than dim (4: one geglu pass),
contexts of 1..7 positions. They are where
a kernel that assumes a multiple of 4 or 8, or a loop that assumes at least one row, reads
past a tensor. `write_shape` writes one as version 4 (program.write_dims, builder.models.synth's
vocabulary and seeded weights; `writer=modelfile.write_model` writes the version 2 file of the
same weights, which the numpy reference reads); `shape_cases` runs each with short and
context-filling prompts, sampling and --logits.

`write_sparse_2b` writes Gemma-2B's version 4 header, program and tokenizer tables at their
real offsets and leaves the 5 GB of weights as a hole (a sparse file: no disk, no reads), for
the 64-bit offset arithmetic of validation and the tokenizer (`--tokens` never touches the
weights).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from builder.models.modelfile import Q8_0, Dims, LayerAttn
from builder.models.modelfile3 import from_v2
from builder.models.program import compile_program, generation_of, make_header, write_dims
from builder.models.synth import PRESETS, synth_source, synth_vocab
from emu_tests.asm_facts import constant

from .mutate import LOGITS, MODEL, Case

SHAPES: dict[str, Dims] = {   # vocab dim ffn layers heads kv_heads head_dim max_ctx
    "d1": Dims(400, 1, 4, 1, 1, 1, 2, 4),
    "d2_ctx1": Dims(400, 2, 4, 1, 1, 1, 2, 1),
    "d3_gqa": Dims(400, 3, 8, 2, 3, 1, 2, 8),
    "d5_hd6": Dims(401, 5, 8, 1, 2, 2, 6, 16),
    "d7_h6k3": Dims(403, 7, 12, 3, 6, 3, 10, 5),
    "d9_ffn4": Dims(400, 9, 4, 1, 1, 1, 18, 33),
    "d17_hd2": Dims(512, 17, 36, 1, 4, 2, 2, 3),
    "d33_mha5": Dims(513, 33, 68, 2, 5, 5, 4, 64),
    "d12_h16k1": Dims(600, 12, 40, 1, 16, 1, 64, 7),
    # Gemma 2 and 3's features on odd shapes (their windows and rope in SHAPE_ATTN)
    "d6_g3": Dims(400, 6, 12, 3, 2, 1, 4, 12, flags=3, att_scale=0.9, att_softcap=2.0,
                  final_softcap=1.5),
    "d8_g2": Dims(400, 8, 12, 2, 4, 2, 6, 9, flags=1, att_scale=0.5, att_softcap=50.0,
                  final_softcap=30.0),
    "d16_qk": Dims(512, 16, 16, 2, 2, 2, 2, 6, flags=3, att_scale=3.0, final_softcap=1e-3),
    # Q8_0 and FP16 matrices in one file: rows of 32 and 64 weights in blocks, of 48 in FP16
    "d32_q8": Dims(400, 32, 48, 2, 2, 1, 32, 9, flags=Q8_0 | 3),
}
# per-layer attention of those shapes (the others: full attention, theta 10000):
# windows of 1 position, shorter than the prompts, beyond any context (2^32 - 1)
SHAPE_ATTN: dict[str, list[LayerAttn]] = {
    "d6_g3": [LayerAttn(2), LayerAttn(0, 1e6, 8.0), LayerAttn(1, 100.0)],
    "d8_g2": [LayerAttn(3), LayerAttn(2**32 - 1, 1e4, 0.5)],
    "d16_qk": [LayerAttn(1, 3.0), LayerAttn(5, 1e30)],
}
# the synthetic file the mutators work on (besides the Gemma 1 fixtures): a Gemma 3 program
# with post norms, q/k norms, windows, both soft-caps
G3_BASE = "g3_base"
Q8_BASE = "g3_q8_base"          # G3_BASE with every matrix in Q8_0 blocks
G3_DIMS = Dims(512, 32, 64, 2, 4, 2, 8, 64, flags=3, att_scale=0.35, att_softcap=4.0,
               final_softcap=3.0)
G3_ATTN = [LayerAttn(4), LayerAttn(0, 1e6, 8.0)]


def write_shape(name: str, out: Path, writer=write_dims) -> Path:
    """Shape `name` at out, as version 4 (or by `writer`, write_dims' signature)."""
    dims = SHAPES[name]
    writer(out, dims, synth_vocab(dims.vocab, 0), synth_source(0), False, attn=SHAPE_ATTN.get(name))
    return out


def write_g3_base(out: Path, q8_0: bool = False) -> Path:
    dims = dataclasses.replace(G3_DIMS, flags=G3_DIMS.flags | Q8_0) if q8_0 else G3_DIMS
    write_dims(out, dims, synth_vocab(G3_DIMS.vocab, 0), synth_source(0), False, attn=G3_ATTN)
    return out


def write_sparse_2b(out: Path) -> Path:
    dims = PRESETS["2b"].dims
    header, front = make_header(compile_program(*from_v2(dims, [LayerAttn()] * dims.layers), generation_of(dims)),
                                synth_vocab(dims.vocab, 0))
    with open(out, "wb") as f:
        f.write(header.pack() + front)
        f.truncate(header.file_size)
    return out


def shape_cases(names: list[str]) -> list[Case]:
    """Runs of each valid odd-shaped model (case.model = its name): prompts from empty to the
    whole context and one id past it (refused in tokenize, before any forward pass; counted
    by --tokens), -n up to the context's end, greedy, sampled, --logits, -c 1 and 2, 2 to
    256 threads (more than rows: threads with nothing to do). A run
    whose prompt fits the context and whose -n reaches at most its end must succeed."""
    out = []
    for name in names:
        ctx = min(SHAPES[name].max_ctx, constant("DEFAULT_CTX"))
        fill = b"\x01" * (ctx - 1)                  # BOS + ctx-1 byte pieces: the context

        def n(tokens: int) -> bytes:                # -n reaching the context's end
            return str(max(1, ctx - tokens)).encode()
        for label, tokens, argv in (              # tokens: BOS + the prompt's pieces
                ("empty prompt", 1, (b"-p", b"", b"-n", n(1))),
                ("one byte piece", 2, (b"-p", b"\x01", b"-n", n(2))),
                ("context full, tokens", ctx, (b"-p", fill, b"--tokens")),
                ("context full, -n 1", ctx, (b"-p", fill, b"-n", b"1")),
                ("one past the context", ctx + 1, (b"-p", fill + b"\x01", b"-n", b"1")),
                ("one past the context, tokens", ctx + 1, (b"-p", fill + b"\x01", b"--tokens")),
                ("sampled", 1, (b"-p", b"", b"-n", n(1), b"--temp", b"1", b"-s", b"3",
                                b"--top-p", b"0.8")),
                ("logits", 2, (b"-p", b"\x01", b"-n", n(2), b"--logits", LOGITS)),
                ("-c 1", 1, (b"-c", b"1", b"-p", b"", b"-n", b"1")),
                ("-c 2", 1, (b"-c", b"2", b"-p", b"", b"-n", b"1", b"--temp", b"0.7")),
                *((f"{t.decode()} threads", 2, (b"-t", t, b"-p", b"\x01", b"-n", n(2),
                                                 b"--logits", LOGITS))
                  for t in (b"2", b"3", b"7", b"256")),
                ("baseline", 2, (b"--baseline", b"-p", b"\x01", b"-n", n(2), b"--logits", LOGITS))):
            counted = b"--tokens" in argv           # any prompt, the context or not
            out.append(Case(f"{name}: {label}", argv=(b"-m", MODEL) + argv, model=name,
                            reject=tokens > ctx and not counted,
                            accept=(counted or tokens < ctx) and not label.startswith("-c")
                            and label != "context full, -n 1"))
    return out


def sparse_cases() -> list[Case]:
    """Gemma-2B's header and tables, weights a hole: tokenize and refuse, never read weights."""
    name, out = "sparse_2b", []
    for label, argv in (("tokens", (b"-p", b"Hello world, the cat sat", b"--tokens")),
                        ("tokens, user pieces", (b"-p", b"<start_of_turn>user\n\n\tx", b"--tokens")),
                        ("tokens, bytes", (b"-p", "日本 ".encode() + b"\x01\xff", b"--tokens"))):
        out.append(Case(f"{name}: {label}", argv=(b"-m", MODEL) + argv, model=name,
                        accept=True))
    return out


def write_bases(tmp: Path) -> dict[str, Path]:
    """Every odd-shaped model and the sparse 2B model, by name, written into tmp."""
    out = {name: write_shape(name, tmp / f"{name}.bin") for name in SHAPES}
    out["sparse_2b"] = write_sparse_2b(tmp / "sparse_2b.bin")
    assert os.stat(out["sparse_2b"]).st_blocks * 512 < 64 << 20, "sparse file is not sparse"
    return out
