"""The engine's forward pass, on the real binary: `--logits` against the fixtures' recorded
transformers logits (reference.npz) at every prompt position and every greedy step, and the
greedy tokens against reference.json, for every fixture model (Gemma 1, 2 and 3) converted
from HF and from GGUF; then shapes the fixtures lack, against the numpy twin.

`gemma -m MODEL -p TEXT --logits FILE -n N` writes one float32 row [vocab] per forward call:
the len(ids) prompt positions, then one per generated token fed back (the N-th is not), so the
rows are reference.npz's prompt rows followed by its step rows 1..N-1 as long as the engine picks
the recorded tokens.

The fixtures' GGUFs mark user-defined pieces as normal ones, so a GGUF-converted model tokenizes
a prompt holding `<start_of_turn>` differently from the recorded ids; for such a prompt the
expected rows and tokens come from the numpy twin (builder/twins/reference.py, proven against the
recorded logits within 1.4e-5 by test_reference.py) on the same weights and the twin tokenizer's
ids (builder/twins/tokenizer.py).

Tolerance TOL = 1e-4, absolute, on logits of magnitude <= 6.6. Measured: this engine is within
1.9e-5 (tiny_wide) and 9.3e-6 (tiny_mqa) of the recorded logits on the fast path (fused
multiply-adds; the tests run the path this CPU picks), 1.4e-5 and 1.0e-5 with --baseline, the
numpy twin within 1.4e-5 — float32 noise from a different summation order. The Gemma 2 and 3
fixtures, from either source (fast / baseline): tiny_g2 4.6e-6 / 5.2e-6, tiny_g3 5.7e-6 /
5.3e-6, tiny_g2q 8.5e-6 / 7.6e-6, under the same TOL; their windows and soft-caps each move
these logits by 1.2 to 4.8, query_pre_attn_scalar taken as head_dim tiny_g2q's by 0.71. The smallest modelling mistakes tried move them
much more: exact-erf GELU instead of tanh by 2e-3, a 0.1% error in the embedding scale by 8e-3.
TOL sits 5x above the noise and 20x below those.
Greedy tokens: where the expected top-2 gap of a step exceeds 2*TOL, every engine within TOL
picks the expected token, so a different one fails; where it does not, the engine may pick the
other token and the comparison ends at that step (its text legitimately differs from there on).

Synthetic shapes (test_shape_against_twin, builder.models.synth's random weights, logits <= ~3): the
synth "tiny" preset (grouped-query attention, 2 query heads per kv head, hd 24); Gemma-2B's
vocabulary and head shape (256000 x d, H=8, K=1, hd=256, H*hd = 16 d) on a narrow model; and
odd sizes that exercise every kernel's tail (d=66, ffn=132, hd=22, 3 query heads per kv head).
Measured engine vs twin: <= 4.8e-7; TWIN_TOL = 1e-5 (20x margin; a wrong kv head or a dropped
tail element moves logits by > 1e-2).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from builder.models.modelfile import Dims, ModelFile, write_model
from builder.models.modelfile4 import ModelFile4
from builder.models.program import write_dims
from builder.twins.reference import Reference
from builder.models.synth import PRESETS, synth_source, synth_vocab
from builder.twins.tokenizer import Tokenizer
from modelfiles import ORACLES, convert_fixture, fixture_path

TOL = 1e-4
TWIN_TOL = 1e-5
STEPS = 24
N_PROMPTS = 5
SHAPES = {
    "synth-tiny": PRESETS["tiny"].dims,
    "2b-heads": Dims(vocab=256000, dim=128, ffn=256, layers=1, heads=8, kv_heads=1,
                     head_dim=256, max_ctx=8192),
    "odd": Dims(vocab=600, dim=66, ffn=132, layers=2, heads=6, kv_heads=2, head_dim=22,
                max_ctx=64),
}
SHAPE_STEPS = 8
SHAPE_TEXT = "Hello world, the quick brown fox"


def expected(name: str, source: str, prompt: int, model, out_dir):
    """(text, ids, prompt rows, step rows, greedy tokens, vocab, what they come from); the
    numpy twin reads the same checkpoint converted to version 2 (its description, not the
    program the engine runs)."""
    oracle = json.loads((fixture_path(name) / "reference.json").read_text())
    assert oracle["steps"] == STEPS
    case = oracle["prompts"][prompt]
    text, vocab = case["text"], ModelFile4(model).header.vocab
    ids = Tokenizer(ModelFile4(model)).encode(text.encode())
    if ids == case["ids"]:
        with np.load(fixture_path(name) / "reference.npz") as z:
            rows = z[f"p{prompt}_prompt_logits"], z[f"p{prompt}_step_logits"]
        return text, ids, *rows, case["greedy"], vocab, "transformers"
    assert source == "gguf", f"{name}-{source}: {text!r} tokenizes to {ids}, not {case['ids']}"
    twin = ModelFile(convert_fixture(name, source, out_dir, version=2))
    return text, ids, *Reference(twin).generate(ids, STEPS), vocab, "numpy twin"


def top2_gap(row: np.ndarray) -> float:
    a, b = np.partition(row, -2)[-2:]
    return float(abs(b - a))


def compare_rows(where: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    """Fail naming the row position, vocabulary index, expected and actual of the worst logit."""
    err = np.abs(got.astype(np.float64) - want)
    i = int(np.argmax(err))
    assert err[i] <= tol, (f"{where}: logit {i} differs by {err[i]:.3g} > {tol} "
                           f"(expected {want[i]!r}, got {got[i]!r})")


def run_engine(binary, model, text: str, steps: int, vocab: int, out,
               flags: tuple[str, ...] = ()) -> np.ndarray:
    """The --logits rows of `gemma -m model -p text -n steps FLAGS`."""
    run = subprocess.run([str(binary), "-m", str(model), "-p", text, "--logits", str(out),
                          "-n", str(steps), *flags], capture_output=True, timeout=60)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr.decode(errors='replace')}"
    raw = np.fromfile(out, np.float32)
    assert raw.size % vocab == 0, f"--logits holds {raw.size} floats, not rows of {vocab}"
    return raw.reshape(-1, vocab)


def check_rows(label: str, rows, ids, prompt_ref, step_ref, greedy, tol: float) -> None:
    """Prompt rows, then greedy steps until the end or a permitted near-tie divergence."""
    n, steps = len(ids), len(greedy)
    assert len(rows) >= n, f"{label}: {len(rows)} rows for a prompt of {n} tokens"
    for p in range(n):
        compare_rows(f"{label}, prompt position {p} (token {ids[p]})", rows[p], prompt_ref[p], tol)
    for k in range(steps):
        r = n - 1 + k                       # the row whose argmax is generated token k
        assert r < len(rows), f"{label}: no logits for greedy step {k} (rows: {len(rows)})"
        compare_rows(f"{label}, greedy step {k}", rows[r], step_ref[k], tol)
        token = int(np.argmax(rows[r]))
        if token != greedy[k]:
            gap = top2_gap(step_ref[k])
            assert gap <= 2 * tol, (f"{label}, greedy step {k}: token {token}, expected "
                                    f"{greedy[k]} (expected top-2 gap {gap:.3g} > {2 * tol})")
            return                          # a near tie went the other way: texts part here
    assert len(rows) == n + steps - 1, (f"{label}: {len(rows)} rows, expected {n} prompt rows "
                                        f"+ {steps - 1} fed-back tokens")


@pytest.mark.parametrize("flags", [(), ("--baseline",), ("-t", "3")], ids=["fast", "baseline", "t3"])
@pytest.mark.parametrize("name,source", ORACLES)
@pytest.mark.parametrize("prompt", range(N_PROMPTS))
def test_logits_and_greedy_tokens(gemma, tmp_path_factory, tmp_path, name, source, prompt, flags):
    """Every fixture (Gemma 1, 2, 3) from each of its sources, on the path this CPU picks, the
    baseline path and 3 threads (rows split unevenly over the threads)."""
    model = convert_fixture(name, source, tmp_path_factory.getbasetemp())
    text, ids, prompt_ref, step_ref, greedy, vocab, oracle = expected(name, source, prompt, model,
                                                                      tmp_path_factory.getbasetemp())
    rows = run_engine(gemma.binary, model, text, STEPS, vocab, tmp_path / "logits.f32", flags)
    check_rows(f"{name}-{source} {' '.join(flags)} prompt {prompt} ({text!r}, expected rows "
               f"from {oracle})", rows, ids, prompt_ref, step_ref, greedy, TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_shape_against_twin(gemma, tmp_path, shape):
    """The engine on the version 4 file, the numpy twin on the version 2 file of the same model."""
    dims = SHAPES[shape]
    model, twin = tmp_path / f"{shape}.bin", tmp_path / f"{shape}-v2.bin"
    write_dims(model, dims, synth_vocab(dims.vocab, 0), synth_source(0), False)
    write_model(twin, dims, synth_vocab(dims.vocab, 0), synth_source(0), False)
    mf = ModelFile(twin)
    ids = Tokenizer(mf).encode(SHAPE_TEXT.encode())
    prompt_ref, step_ref, greedy = Reference(mf).generate(ids, SHAPE_STEPS)
    rows = run_engine(gemma.binary, model, SHAPE_TEXT, SHAPE_STEPS, dims.vocab,
                      tmp_path / "logits.f32")
    check_rows(f"{shape} {dims}", rows, ids, prompt_ref, step_ref, greedy, TWIN_TOL)
