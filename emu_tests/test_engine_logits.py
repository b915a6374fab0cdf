"""The engine's forward pass, on the real binary: `--logits` against the fixtures' recorded
transformers logits (reference.npz) at every prompt position and every greedy step, and the
greedy tokens against reference.json, for both fixture models converted from HF and from GGUF.

`gemma -m MODEL -p TEXT --logits FILE -n 24` writes one float32 row [vocab] per forward call:
the len(ids) prompt positions, then one per generated token fed back (the 24th is not), so the
rows are reference.npz's prompt rows followed by its step rows 1..23 as long as the engine picks
the recorded tokens.

Tolerance TOL = 1e-4, absolute, on logits of magnitude <= 6.6. Measured: this engine is within
1.9e-5 (tiny_wide) and 8.0e-6 (tiny_mqa) of the recorded logits, the numpy twin
(builder/reference.py) within 1.4e-5 — float32 noise from a different summation order. The
smallest modelling mistakes tried move them much more: exact-erf GELU instead of tanh by 2e-3, a
0.1% error in the embedding scale by 8e-3. TOL sits 5x above the noise and 20x below those.
Greedy tokens: where the recorded top-2 gap of a step exceeds 2*TOL, every engine within TOL picks
the recorded token, so a different one fails; where it does not, the engine may pick the other
token and the comparison ends at that step (its text legitimately differs from there on).
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from builder.modelfile import ModelFile
from builder.reference import Reference
from builder.tokenizer import Tokenizer
from modelfiles import MODELS, convert_fixture, fixture_path

TOL = 1e-4
STEPS = 24
N_PROMPTS = 5


def expected(name: str, source: str, prompt: int, model):
    """(text, ids, prompt rows, step rows, greedy tokens, vocab, what they come from)."""
    oracle = json.loads((fixture_path(name) / "reference.json").read_text())
    assert oracle["steps"] == STEPS
    case = oracle["prompts"][prompt]
    text, vocab = case["text"], oracle["config"]["vocab"]
    ids = Tokenizer(ModelFile(model)).encode(text.encode())
    if ids == case["ids"]:
        with np.load(fixture_path(name) / "reference.npz") as z:
            rows = z[f"p{prompt}_prompt_logits"], z[f"p{prompt}_step_logits"]
        return text, ids, *rows, case["greedy"], vocab, "transformers"
    assert source == "gguf", f"{name}-{source}: {text!r} tokenizes to {ids}, not {case['ids']}"
    return text, ids, *Reference(ModelFile(model)).generate(ids, STEPS), vocab, "numpy twin"


def top2_gap(row: np.ndarray) -> float:
    a, b = np.partition(row, -2)[-2:]
    return float(abs(b - a))


def compare_rows(where: str, got: np.ndarray, want: np.ndarray) -> None:
    """Fail naming the row position, vocabulary index, expected and actual of the worst logit."""
    err = np.abs(got.astype(np.float64) - want)
    i = int(np.argmax(err))
    assert err[i] <= TOL, (f"{where}: logit {i} differs by {err[i]:.3g} > {TOL} "
                           f"(expected {want[i]!r}, got {got[i]!r})")


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prompt", range(N_PROMPTS))
def test_logits_and_greedy_tokens(gemma, tmp_path_factory, tmp_path, name, source, prompt):
    model = convert_fixture(name, source, tmp_path_factory.getbasetemp())
    text, ids, prompt_ref, step_ref, greedy, vocab, oracle = expected(name, source, prompt, model)
    out = tmp_path / "logits.f32"
    run = subprocess.run([str(gemma.binary), "-m", str(model), "-p", text,
                          "--logits", str(out), "-n", str(STEPS)],
                         capture_output=True, timeout=60)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr.decode(errors='replace')}"
    raw = np.fromfile(out, np.float32)
    assert raw.size % vocab == 0, f"--logits holds {raw.size} floats, not rows of {vocab}"
    rows = raw.reshape(-1, vocab)
    label = f"{name}-{source} prompt {prompt} ({text!r}, expected rows from {oracle})"
    n = len(ids)
    assert len(rows) >= n, f"{label}: {len(rows)} rows for a prompt of {n} tokens"
    for p in range(n):
        compare_rows(f"{label}, prompt position {p} (token {ids[p]})", rows[p], prompt_ref[p])
    for k in range(STEPS):
        r = n - 1 + k                       # the row whose argmax is generated token k
        assert r < len(rows), f"{label}: no logits for greedy step {k} (rows: {len(rows)})"
        compare_rows(f"{label}, greedy step {k}", rows[r], step_ref[k])
        token = int(np.argmax(rows[r]))
        if token != greedy[k]:
            gap = top2_gap(step_ref[k])
            assert gap <= 2 * TOL, (f"{label}, greedy step {k}: token {token}, expected "
                                    f"{greedy[k]} (recorded top-2 gap {gap:.3g} > {2 * TOL})")
            return                          # a near tie went the other way: texts part here
    assert len(rows) == n + STEPS - 1, (f"{label}: {len(rows)} rows, expected {n} prompt rows "
                                        f"+ {STEPS - 1} fed-back tokens")
