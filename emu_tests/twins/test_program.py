"""builder.twins.program (the numpy interpreter of a version 4 file's program) against the
description-driven reference (builder.twins.reference, on the same checkpoint converted to
version 2 or 3) and against the recorded transformers logits, on every fixture the reference
tests run (test_reference.CASES, tiny_g4moe's experts included), on the synth presets
tiny-g4-dense and tiny-g4 (MoE), on a Gemma 4 shape whose per-layer rows of ple_proj and whose
experts' rows are stored as tensors of their own, and (slow) on the real Gemma 3 270M; prompts
cut into blocks at several boundaries give the same bits (blocks of one token, where a SKIP
passes over each expert no token chose, and longer ones, where the experts any token chose run
for every token), and so does a program whose ops hold junk in every field they do not read."""
from __future__ import annotations

import json

import numpy as np
import pytest

from builder.models import program, synth
from builder.models.modelfile3 import ModelFile3, open_model
from builder.models.modelfile4 import ModelFile4, Op
from builder.models.synth4 import gemma4_preset
from builder.twins.program import Interpreter
from builder.twins.reference import Reference
from fuzz.mutate4 import with_junk
from modelfiles import convert_fixture, fixture_path
from test_reference import CASES, REAL_TOL, TOL, check_rows

# The interpreter runs the reference's own kernels (rmsnorm, gelu_tanh, rope, softcap, matvec,
# the same attention loop), one token at a time, in the order the reference computes a layer, so
# it computes the very same float32 numbers: measured 0.0 difference on every case below. The
# one place the two may part is a product split differently: the per-layer inputs' ple_proj
# product (one [L P, d] product in the reference, L products of [P, d] rows in the program),
# where a BLAS may block rows differently (so may an expert's gate and up rows: one [2I, d]
# product in the reference, two [I, d] products in the program); each row is still one dot
# product of length d, so that is a few float32 ulps of a value, carried through a layer
# (an expert chosen differently would move the logits by far more): SAME_TOL = 1e-6 relative to
# the logits' largest magnitude. A real error (an op in the wrong order, a wrong operand, a
# missing norm) moves the logits by far more than 1e-3 (fixtures/README.md measures the smallest
# effect of a feature at 0.83).
SAME_TOL = 1e-6
V4_CASES = CASES
CUTS = [(), (1,), (3, 7), (2, 4, 5, 6, 11, 13, 17, 19)]


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = np.abs(got - want).max()
    assert err <= SAME_TOL * np.abs(want).max(), f"{what}: max |diff| {err:.3g} (logits up to {np.abs(want).max():.3g})"


@pytest.fixture(scope="module", params=V4_CASES, ids=[f"{n}-{s}{f'-v{v}' if v else ''}" for n, s, v in V4_CASES])
def case(request, tmp_path_factory):
    name, source, version = request.param
    out = tmp_path_factory.getbasetemp()
    ref = Reference(open_model(convert_fixture(name, source, out, version)))
    run = Interpreter(ModelFile4(convert_fixture(name, source, out, 4)))
    oracle = json.loads((fixture_path(name) / "reference.json").read_text())
    with np.load(fixture_path(name) / "reference.npz") as z:
        logits = dict(z)
    return f"{name}-{source}", ref, run, oracle, logits


def test_program_equals_reference_and_oracle(case):
    name, ref, run, oracle, logits = case
    for i, p in enumerate(oracle["prompts"]):
        n = len(p["greedy"])
        prompt, steps, tokens = run.generate(p["ids"], n, feed=p["greedy"], cuts=(3,))
        want_prompt, want_steps, _ = ref.generate(p["ids"], n, feed=p["greedy"])
        close(prompt, want_prompt, f"{name} prompt {i} prompt rows")
        close(steps, want_steps, f"{name} prompt {i} greedy steps")
        # the reference tests' tolerance against the recordings (test_reference.TOL, justified there)
        check_rows(prompt, logits[f"p{i}_prompt_logits"], f"{name} prompt {i} prompt positions", TOL)
        check_rows(steps, logits[f"p{i}_step_logits"], f"{name} prompt {i} greedy steps", TOL)
        _, _, greedy = run.generate(p["ids"], n)
        assert greedy == p["greedy"], f"{name} prompt {i}: greedy tokens differ"


def test_block_splits_give_the_same_bits(case):
    """A token's numbers do not depend on the block it is in: the longest prompt cut at several
    boundaries (and past BLOCK, where it has more than 64 tokens) gives the same logits, every
    row, bit for bit; so do the last-row-only runs."""
    name, _, run, oracle, _ = case
    ids = max((p["ids"] for p in oracle["prompts"]), key=len)
    want = run.prompt(ids)
    for cuts in CUTS[1:] + [tuple(range(1, len(ids)))]:
        got = run.prompt(ids, cuts)
        assert np.array_equal(got, want), f"{name}: cut at {cuts[:8]}: max |diff| {np.abs(got - want).max()}"
        assert np.array_equal(run.prompt(ids, cuts, all_rows=False), want[-1:]), f"{name}: last row, cut at {cuts[:8]}"


def test_block_refuses_a_wrong_position(case):
    _, _, run, _, _ = case
    run.reset()
    run.block([2], 0)
    with pytest.raises(ValueError):
        run.block([2], 2)
    with pytest.raises(ValueError):
        run.block([2] * 65, 1)


def compare_versions(v3, v4, ids):
    """The reference on a version 3 file and the interpreter on the version 4 file of the same
    model: equal logits at every prompt row and greedy step, whatever the cuts."""
    ref, run = Reference(ModelFile3(v3)), Interpreter(ModelFile4(v4))
    want, want_steps, want_tokens = ref.generate(ids, 6)
    for cuts in CUTS:
        got, steps, tokens = run.generate(ids, 6, cuts=cuts)
        close(got, want, f"prompt rows, cut at {cuts}")
        close(steps, want_steps, f"greedy steps, cut at {cuts}")
        assert tokens == want_tokens


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
@pytest.mark.parametrize("preset", ["tiny-g4-dense", "tiny-g4"])
def test_synth_tiny_g4(tmp_path, preset, wtype):
    """`synth --preset tiny-g4-dense` (per-layer inputs, KV sharing with a double-wide FFN, k = v,
    value norms) and `tiny-g4` (the same with experts) in versions 3 and 4: the same model, the
    same logits."""
    synth.synth(preset, tmp_path / "v3.bin", seed=3, progress=False, wtype=wtype, version=3)
    synth.synth(preset, tmp_path / "v4.bin", seed=3, progress=False, wtype=wtype, version=4)
    compare_versions(tmp_path / "v3.bin", tmp_path / "v4.bin", list(range(2, 30)))


@pytest.mark.parametrize("experts", [0, 4])
def test_blocks_stored_apart(tmp_path, experts):
    """d = 36, P = 4, I = 4 in FP16: a layer's ple_proj rows and an expert's gate, up and down
    rows take 288 bytes, not a multiple of 64: each block becomes a tensor of its own
    (ple_proj.{i}, experts_gate_up.{b}, experts_down.{e}), and the program still computes the
    model."""
    from builder.models.modelfile3 import write_model as write_model3
    model, ropes = gemma4_preset(vocab=512, dim=36, layers=4, heads=2, period=2, window=3, head_dim=(8, 16),
                                 kv_heads=(1, 1), ffn=16, max_ctx=64, shared=2, k_eq_v=True, ple_dim=4,
                                 experts=experts, top_k=2 if experts else 0, expert_ffn=4 if experts else 0)
    vocab = synth.synth_vocab(512, 0, by_rank=True)
    prog = program.compile_program(model, ropes, 4)
    assert [s.name for s in prog.specs if s.name.startswith("ple_proj")] == [f"ple_proj.{i}" for i in range(4)]
    assert len([s for s in prog.specs if ".experts_" in s.name]) == 4 * 3 * experts
    write_model3(tmp_path / "v3.bin", model, vocab, synth.synth_source(1), ropes, progress=False)
    program.write(tmp_path / "v4.bin", prog, vocab, synth.synth_source(1), progress=False)
    compare_versions(tmp_path / "v3.bin", tmp_path / "v4.bin", list(range(2, 20)))


class Counting(Interpreter):
    """The interpreter, counting the SKIPs that pass over their ops and those that do not."""

    def reset(self) -> None:
        super().reset()
        self.skips = {True: 0, False: 0}

    def op(self, o, ids, pos, rows, out) -> int:
        skipped = super().op(o, ids, pos, rows, out)
        if o.op == Op.SKIP:
            self.skips[skipped > 0] += 1
        return skipped


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_skip_passes_over_the_experts_no_token_chose(tmp_path, source):
    """tiny_g4moe (E 4, top 2, 6 layers): in a block of one token (decode, or a prompt cut at
    every token) each layer's SKIPs pass over exactly the 2 experts the token did not choose;
    in a block of every prompt token none does here (each expert is some token's choice), and
    the two give the same bits."""
    path = convert_fixture("tiny_g4moe", source, tmp_path, 4)
    run = Counting(ModelFile4(path))
    ids = max((p["ids"] for p in json.loads((fixture_path("tiny_g4moe") / "reference.json").read_text())["prompts"]),
              key=len)
    whole = run.prompt(ids)
    assert run.skips == {True: 0, False: 6 * 4}
    _, steps, _ = run.generate(ids, 5, cuts=tuple(range(1, len(ids))))
    assert run.skips == {True: 6 * 2 * (len(ids) + 4), False: 6 * 2 * (len(ids) + 4)}
    assert np.array_equal(run.prompt(ids, tuple(range(1, len(ids)))), whole)
    assert np.array_equal(steps[0], whole[-1])


@pytest.mark.slow  # ~90 s: the real Gemma 3 270M converted to version 4, one prompt through numpy
def test_real_g3_program_matches_oracle(real_g3, tmp_path):
    """The real model's first prompt, its last prompt row and 24 greedy steps (fed the recorded
    tokens), at the recorded vocabulary ids: within test_reference.REAL_TOL (justified there;
    measured 2.3e-5, as the reference's 2.6e-5), and every step's argmax the recorded token."""
    from builder.demo import GGUF_NAME
    from builder.models.convert import convert
    convert(real_g3.parent / GGUF_NAME, tmp_path / "g3.bin", progress=False, version=4)
    run = Interpreter(ModelFile4(tmp_path / "g3.bin"))
    p = json.loads((fixture_path("real_g3") / "reference.json").read_text())["prompts"][0]
    with np.load(fixture_path("real_g3") / "reference.npz") as z:
        ids, want = z["p0_ids"], z["p0_logits"]
    _, steps, _ = run.generate(p["ids"], len(p["greedy"]), feed=p["greedy"], prompt_rows=False)
    check_rows(steps[:, ids], want, "real_g3 prompt 0 (columns: recorded ids)", REAL_TOL)
    assert np.argmax(steps, axis=1).tolist() == p["greedy"]


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4moe"])
def test_unused_fields_change_nothing(tmp_path, name):
    """tiny_g4 (every opcode but the experts') and tiny_g4moe (those) with every field an op
    does not read set to junk: the reader accepts it and the interpreter computes the same
    bits."""
    path = convert_fixture(name, "hf", tmp_path, 4)
    f = ModelFile4(path)
    g = ModelFile4(with_junk(path, f, tmp_path / "junk.bin"))
    assert sum(a != b for a, b in zip(f.ops, g.ops)) == len(f.ops)
    ids = list(range(2, 40))
    want, got = Interpreter(f).prompt(ids, (5,)), Interpreter(g).prompt(ids, (5,))
    assert np.array_equal(got, want) and np.isfinite(want).all()
