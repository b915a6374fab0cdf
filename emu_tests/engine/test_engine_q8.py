"""Q8_0 model files through the real binary: logits against the numpy twin on the dequantized
weights, on every path, and the same bits for every thread count.

A Q8_0 file's weights are d q, exact in float32, and the engine keeps its float32 arithmetic:
its logits must match builder.twins.reference (float32 on those weights) as closely as an FP16
file's do, i.e. within test_engine_logits' tolerances: TOL at every prompt position and greedy
step of the fixtures' prompts (converted with --type q8_0; measured <= 9.8e-6, tiny_wide with
--baseline), TWIN_TOL on the synthetic shapes. Shapes: the synth presets (every matrix Q8_0),
and mixed files where rows that do not split into 32-weight blocks stay FP16 (tiny_wide's
d = 144; "mixed": d = 96, ffn = 144, so gate/up are Q8_0 and down FP16, on the fast path).
Paths: the fast one (the AVX-512 or AVX2 kernel), --baseline (SSE kernel), -t 3; bits: -t 1,
2, 3 (and on the fast path --avx2) agree exactly within a path, as for FP16 (test_speed_paths).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from builder.models.modelfile import Q8_0, Dims, ModelFile, tensor_layout, write_model
from builder.models.program import write_dims
from builder.twins.reference import Reference
from builder.models.synth import PRESETS, synth_source, synth_vocab
from builder.twins.tokenizer import Tokenizer
from builder.models.convert import convert
from emu_tests.engine.test_engine_logits import (SHAPE_STEPS, SHAPE_TEXT, STEPS, TOL, TWIN_TOL,
                                                 check_rows, run_engine)
from modelfiles import TWINS, fixture_path
from emu_tests.speed.test_speed_paths import qemu_runs_kernel, same_bits

Q8_SHAPES = {
    "tiny": PRESETS["tiny"].dims,
    "tiny-g2": PRESETS["tiny-g2"].dims,
    "tiny-g3": PRESETS["tiny-g3"].dims,
    "mixed": Dims(vocab=700, dim=96, ffn=144, layers=2, heads=3, kv_heads=1, head_dim=32, max_ctx=256),
}
ATTN = {name: PRESETS[name].attn for name in ("tiny", "tiny-g2", "tiny-g3")}
PATHS = {"fast": (), "baseline": ("--baseline",), "t3": ("-t", "3")}


class Q8Model:
    """A synthetic Q8_0 model twice: `mf` the version 2 file (the numpy twin's description),
    `path` the version 4 file of the same weights (what the engine runs)."""

    def __init__(self, path, name: str):
        dims = dataclasses.replace(Q8_SHAPES[name], flags=Q8_SHAPES[name].flags | Q8_0)
        self.path, twin = path, path.with_suffix(".v2.bin")
        write_dims(path, dims, synth_vocab(dims.vocab, 0), synth_source(0), False, attn=ATTN.get(name))
        write_model(twin, dims, synth_vocab(dims.vocab, 0), synth_source(0), False, attn=ATTN.get(name))
        self.mf, self.dims = ModelFile(twin), dims


@pytest.fixture(scope="module")
def q8_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8")
    return {name: Q8Model(out / f"{name}.bin", name) for name in Q8_SHAPES}


def test_mixed_file_keeps_partial_rows_fp16(q8_models):
    types = {s.name.rsplit(".", 1)[-1]: s.dtype for s in tensor_layout(q8_models["mixed"].mf.header)}
    assert (types["embed"], types["gate"], types["up"], types["down"], types["wo"]) == \
        ("q8_0", "q8_0", "q8_0", "f16", "q8_0")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", Q8_SHAPES)
def test_q8_against_twin(gemma, q8_models, tmp_path, name, path):
    q8 = q8_models[name]
    ids = Tokenizer(q8.mf).encode(SHAPE_TEXT.encode())
    prompt_ref, step_ref, greedy = Reference(q8.mf).generate(ids, SHAPE_STEPS)
    rows = run_engine(gemma.binary, q8.path, SHAPE_TEXT, SHAPE_STEPS, q8.dims.vocab,
                      tmp_path / "logits.f32", PATHS[path])
    check_rows(f"{name} q8_0 {path}", rows, ids, prompt_ref, step_ref, greedy, TWIN_TOL)


@pytest.fixture(scope="module")
def q8_fixtures(tmp_path_factory):
    """Every fixture (Gemma 1, 2, 3) converted from Hugging Face with --type q8_0 (tiny_wide's
    d = 144 leaves the matrices with rows of d in FP16), and its prompts' twin rows."""
    out, found = tmp_path_factory.mktemp("q8-fixtures"), {}
    for name in TWINS:
        convert(fixture_path(name), out / f"{name}.bin", progress=False, wtype="q8_0")
        convert(fixture_path(name), out / f"{name}.v2.bin", progress=False, wtype="q8_0", version=2)
        mf = ModelFile(out / f"{name}.v2.bin")
        texts = [c["text"] for c in json.loads((fixture_path(name) / "reference.json").read_text())["prompts"]]
        cases = []
        for text in texts:
            ids = Tokenizer(mf).encode(text.encode())
            cases.append((text, ids, *Reference(mf).generate(ids, STEPS)))
        found[name] = out / f"{name}.bin", mf, cases
    return found


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", TWINS)
def test_q8_fixtures_against_twin(gemma, q8_fixtures, tmp_path, name, path):
    """Every prompt position and greedy step of the fixtures' prompts, Q8_0, within TOL (the
    FP16 fixtures' tolerance, test_engine_logits) of the numpy twin on the dequantized weights."""
    model, mf, cases = q8_fixtures[name]
    for k, (text, ids, prompt_ref, step_ref, greedy) in enumerate(cases):
        rows = run_engine(gemma.binary, model, text, STEPS, mf.dims.vocab,
                          tmp_path / f"logits{k}.f32", PATHS[path])
        check_rows(f"{name} q8_0 {path} prompt {k} ({text!r})", rows, ids, prompt_ref, step_ref,
                   greedy, TOL)


@pytest.mark.parametrize("base", [(), ("--baseline",)], ids=["fast", "baseline"])
def test_q8_bits_do_not_depend_on_threads(gemma, q8_models, tmp_path, base):
    """-t 1, 2, 3 give the same bits; on the fast path so does --avx2 (the AVX2 kernels where
    the default runs the AVX-512 ones: the same bits by their promise)."""
    q8 = q8_models["tiny-g3"]
    text = SHAPE_TEXT * 3                   # several prompt blocks
    flags = {t: (*base, "-t", str(t)) for t in (1, 2, 3)}
    if not base:
        flags["--avx2"] = ("--avx2", "-t", "2")
    runs = {t: run_engine(gemma.binary, q8.path, text, SHAPE_STEPS, q8.dims.vocab,
                          tmp_path / f"t{t}.f32", f) for t, f in flags.items()}
    for t in flags:
        same_bits(f"q8_0 {flags[t]} vs -t 1", runs[t], runs[1])
    assert np.isfinite(runs[1]).all()


@pytest.mark.slow  # qemu-user: about 50x slower than native
@pytest.mark.parametrize("cpu_model,flags,kernel", [
    ("Nehalem", [], "matmul_q8"), ("Nehalem", ["-t", "3"], "matmul_q8"),
    ("Haswell", [], "matmul_q8_avx2"), ("Haswell", ["--baseline"], "matmul_q8"),
])
def test_q8_under_qemu(gemma, q8_models, tmp_path, cpu_model, flags, kernel):
    """The mixed file (Q8_0 and FP16 matrices) under qemu-user: the Q8_0 kernel the CPU model
    calls for runs (never the AVX2 one on Nehalem or with --baseline) and gives the native
    bits of that kernel."""
    qemu_runs_kernel(gemma, q8_models["mixed"].path, tmp_path, cpu_model, flags, kernel,
                     "matmul_q8_avx2", "mixed q8_0")
