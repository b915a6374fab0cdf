"""Gemma 2 and 3 semantics on the real binary: random small version-2 model files with every
combination the format allows (header flags 0, POST_NORMS, POST_NORMS | QK_NORM; sliding
windows shorter than the prompt and different per layer; per-layer RoPE frequencies from
different thetas, with linear scaling 8; att_scale; attention and final soft-caps; GQA and MQA;
head_dim 22 and 16), their `--logits` rows against the numpy twin (builder.twins.reference) at every
prompt position and greedy step: natively on the path this CPU picks, with --baseline, under
qemu-user -cpu Nehalem and Haswell, and with several thread counts (the same bits for every
thread count within a path, as test_speed_paths holds the Gemma 1 fixtures to).

The weights are builder.models.synth's, with the query/key projections and the embedding scaled up
(GAINS) so that the features matter: attention scores reach several units (a soft-cap of 4
bends them) and logits reach several units before a final soft-cap of 3. test_features_matter proves
each feature moves the twin's logits by far more than the tolerance, so a model file whose
feature the engine ignored would fail.

Tolerance: TWIN_TOL of test_engine_logits (1e-5, absolute; logits here are within +-3, the
final soft-cap). Measured engine vs twin: 0.7e-6 (flags0) to 3.2e-6 (gemma3-mqa, --baseline)
over every model and path. That is these models' float32 noise, not an engine error: a
float64 run of the twin's code is as far from the float32 twin (0.7e-6 to 2.7e-6) as from the
engine (0.6e-6 to 3.2e-6). Greedy tokens follow test_engine_logits.check_rows (a near tie may
part the texts).
"""
from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from builder.models.modelfile import Dims, LayerAttn, ModelFile, write_model
from builder.models.program import write_dims
from builder.twins.reference import Reference
from builder.models.synth import synth_source, synth_vocab
from builder.twins.tokenizer import Tokenizer
from emu_tests.engine.test_engine_logits import TWIN_TOL, check_rows
from emu_tests.speed.test_speed_paths import PROMPT, TIMEOUT, run, same_run

F32 = np.float32
STEPS = 8
# query/key projections and the embedding scaled up, so soft-caps and windows matter
GAINS = {"wq": 8.0, "wk": 8.0, "embed": 10.0}
FEATURE_MARGIN = 100 * TWIN_TOL      # each feature moves the twin's logits at least this much

# name: (dims, one LayerAttn per layer). The prompt (PROMPT) is 87 tokens: every window is
# shorter; the 10000 / 1e6-with-scale-8 thetas are Gemma 3's local / global layers.
MODELS = {
    # Gemma 2: post norms, soft-caps, alternating sliding / global layers, GQA
    "gemma2": (Dims(vocab=600, dim=64, ffn=128, layers=3, heads=4, kv_heads=2, head_dim=16,
                    max_ctx=128, flags=1, att_scale=0.125, att_softcap=4.0, final_softcap=3.0),
               [LayerAttn(5), LayerAttn(0), LayerAttn(9)]),
    # Gemma 3: post norms and q/k norms, local layers (theta 10000, windows) and a global one
    # (theta 1e6, scale 8); odd shape (dim 66: the baseline kernel everywhere, hd 22)
    "gemma3-odd": (Dims(vocab=600, dim=66, ffn=132, layers=3, heads=6, kv_heads=2, head_dim=22,
                        max_ctx=128, flags=3, att_scale=0.3, att_softcap=4.0,
                        final_softcap=3.0),
                   [LayerAttn(7), LayerAttn(3, 20000.0), LayerAttn(0, 1e6, 8.0)]),
    # Gemma 3 with MQA and no attention soft-cap (as Gemma 3 has none), windows 1 and 16
    "gemma3-mqa": (Dims(vocab=600, dim=64, ffn=128, layers=3, heads=4, kv_heads=1,
                        head_dim=16, max_ctx=128, flags=3, att_scale=0.35, final_softcap=3.0),
                   [LayerAttn(1), LayerAttn(16, 10000.0, 1.0), LayerAttn(0, 1e6, 8.0)]),
    # flags 0 with a window, its own att_scale and soft-caps: the Gemma 1 layer otherwise
    "flags0": (Dims(vocab=600, dim=64, ffn=128, layers=2, heads=4, kv_heads=4, head_dim=16,
                    max_ctx=128, att_scale=0.2, att_softcap=5.0, final_softcap=3.0),
               [LayerAttn(6, 500.0), LayerAttn(0, 1e5, 8.0)]),
}


def gained_source(seed: int):
    """synth_source's tensors, GAINS applied by tensor name (its last part)."""
    base = synth_source(seed)

    def source(spec):
        gain = F32(GAINS.get(spec.name.rsplit(".", 1)[-1], 1.0))
        for chunk in base(spec):
            yield chunk * gain
    return source


def write(path: Path, dims: Dims, attn: list[LayerAttn]) -> Path:
    """The model as version 4 at path (what the engine runs) and as version 2 beside it
    (twin_of(path): the numpy twin's description of the same weights)."""
    write_dims(path, dims, synth_vocab(dims.vocab, 0), gained_source(0), False, attn=attn)
    write_model(twin_of(path), dims, synth_vocab(dims.vocab, 0), gained_source(0), False, attn=attn)
    return path


def twin_of(path: Path) -> Path:
    return path.with_suffix(".v2.bin")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gemma23")
    return {name: write(out / f"{name}.bin", *MODELS[name]) for name in MODELS}


@pytest.fixture(scope="module")
def twins(models) -> dict[str, tuple]:
    """(ids, prompt rows, step rows, greedy tokens) of the numpy twin, per model."""
    found = {}
    for name, path in models.items():
        mf = ModelFile(twin_of(path))
        ids = Tokenizer(mf).encode(PROMPT.encode())
        found[name] = (ids, *Reference(mf).generate(ids, STEPS))
    return found


def rows_of(logits: bytes, vocab: int) -> np.ndarray:
    return np.frombuffer(logits, F32).reshape(-1, vocab)


def against_twin(label: str, logits: bytes, twin: tuple, vocab: int) -> float:
    """check_rows against the twin; returns the largest |engine - twin| over the rows compared."""
    ids, prompt_ref, step_ref, greedy = twin
    rows = rows_of(logits, vocab)
    check_rows(label, rows, ids, prompt_ref, step_ref, greedy, TWIN_TOL)
    want = np.concatenate([prompt_ref, step_ref[1:]])
    k = min(len(rows), len(want))
    return float(np.abs(rows[:k].astype(np.float64) - want[:k]).max())


def test_features_matter(models, twins, tmp_path):
    """Each feature of each model moves the twin's logits by more than FEATURE_MARGIN (so an
    engine ignoring it fails): the windows, the soft-caps, att_scale (against Gemma 1's
    1/sqrt(head_dim)), the rope frequencies,
    and each header flag (the weights of the other tensors stay the same: synth_source seeds
    each tensor by its name)."""
    for name, (dims, attn) in MODELS.items():
        ids, base = twins[name][0], twins[name][1]
        variants = {"no windows": (dims, [replace(a, window=0) for a in attn]),
                    "att_scale 1/sqrt(hd)": (replace(dims, att_scale=dims.head_dim ** -0.5), attn),
                    "final_softcap 0": (replace(dims, final_softcap=0.0), attn),
                    "theta 10000 everywhere": (dims, [LayerAttn(a.window) for a in attn])}
        if dims.att_softcap:
            variants["att_softcap 0"] = (replace(dims, att_softcap=0.0), attn)
        if dims.flags:
            variants["flags - QK_NORM" if dims.flags & 2 else "flags 0"] = (
                replace(dims, flags=dims.flags & 1 if dims.flags & 2 else 0), attn)
        if name == "gemma3-odd":                  # every layer's rope and window counts
            variants["layer 1 window 4"] = (dims, [attn[0], replace(attn[1], window=4), attn[2]])
        for what, (d, a) in variants.items():
            if d == dims and a == attn:
                continue
            mf = ModelFile(twin_of(write(tmp_path / "variant.bin", d, a)))
            got = np.stack([r for r in Reference(mf).generate(ids, 1)[0]])
            moved = float(np.abs(got - base).max())
            assert moved > FEATURE_MARGIN, f"{name}, {what}: the twin's logits move by {moved:.3g}"


@pytest.mark.parametrize("flags", ["", "--baseline"])
@pytest.mark.parametrize("name", MODELS)
def test_against_twin(gemma, models, twins, tmp_path, name, flags):
    """Every prompt row and greedy step within TWIN_TOL of the twin, on the fast and the
    baseline path."""
    dims = MODELS[name][0]
    _, logits = run([], gemma.binary, models[name], flags.split(), tmp_path / "l.f32")
    err = against_twin(f"{name} {flags or '(default)'}", logits, twins[name], dims.vocab)
    print(f"\n{name} {flags or '(default)'}: max |engine - twin| = {err:.3g}")


@pytest.mark.parametrize("name", MODELS)
def test_thread_counts_give_the_same_bits(gemma, models, tmp_path, name):
    """Within a path every thread count gives -t 1's bits (attention tasks on up to 16
    threads, rows of the products split: 20 threads leave some without rows)."""
    model, vocab = models[name], MODELS[name][0].vocab
    for path in ([], ["--baseline"]):
        want = run([], gemma.binary, model, [*path, "-t", "1"], tmp_path / "want.f32")
        for t in ("2", "3", "5", "20"):
            got = run([], gemma.binary, model, [*path, "-t", t], tmp_path / "got.f32")
            same_run(f"{name} {' '.join(path)} -t {t} vs -t 1", got, want, vocab)


@pytest.mark.slow  # qemu-user: about 50x slower than native
@pytest.mark.parametrize("cpu_model,flags", [
    ("Nehalem", []), ("Nehalem", ["-t", "3"]), ("Haswell", []), ("Haswell", ["-t", "2"]),
])
@pytest.mark.parametrize("name", ["gemma2", "gemma3-odd"])
def test_qemu_cpu_models(gemma, models, twins, tmp_path, name, cpu_model, flags):
    """Under qemu-user: Nehalem (baseline kernels only) and Haswell (the AVX2 kernel where the
    shape allows it) give the twin's logits within TWIN_TOL, and the native bits of the
    same path (Haswell's fast path: AVX2's bits)."""
    model, vocab = models[name], MODELS[name][0].vocab
    got = run(["qemu-x86_64", "-cpu", cpu_model], gemma.binary, model, flags,
              tmp_path / "got.f32")
    against_twin(f"{name} qemu -cpu {cpu_model}", got[1], twins[name], vocab)
    native = ["--baseline"] if cpu_model == "Nehalem" else []
    want = run([], gemma.binary, model, [*native, "-t", "1"], tmp_path / "want.f32")
    same_run(f"{name}: qemu -cpu {cpu_model} {' '.join(flags)} vs native", got, want, vocab)


def test_window_longer_than_the_context(gemma, models, tmp_path):
    """A window beyond the context (2^32 - 1) attends everything, as no window does: the
    same bits as window 0 (start = max(0, n_t - w), never outside the KV cache)."""
    dims, attn = MODELS["gemma2"]
    full = write(tmp_path / "full.bin", dims, [replace(a, window=0) for a in attn])
    huge = write(tmp_path / "huge.bin", dims, [replace(a, window=2**32 - 1) for a in attn])
    want = run([], gemma.binary, full, [], tmp_path / "want.f32")
    got = run([], gemma.binary, huge, ["-c", "100"], tmp_path / "got.f32")
    same_run("window 2^32 - 1 vs none", got, want, dims.vocab)
    r = subprocess.run([str(gemma.binary), "-m", str(huge), "-p", PROMPT, "-n", "200"],
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
