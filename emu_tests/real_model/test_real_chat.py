"""Conversation mode (`gemma -cnv`, docs/chat.md) on the real Gemma 3 270M (the `real_g3`
fixture): each conversation's `--logits` rows equal, bit for bit, those of one `-p` run over
the same ids, its ids derived as test_engine_chat derives them (converse_exactly: the Gemma 3
template from the model file's strings, the twin tokenizer, the greedy argmax or the sampler
twin), its transcript tokenizing (`--tokens`) to exactly those ids.

- The acceptance conversation: `What is the capital of France?` then `And of Italy?`, -n 32
  (each reply is then the greedy continuation of one -p run over the transcript so far: the
  rows are that run's). The pretrained model does not answer; it repeats the question
  (measured: "What is the capital of France? mendatang ..."). With -n 6 on --avx2 and
  --baseline (the default path here is AVX-512's).
- Past the model's 512-token window: two turns of ~290 and ~270 ids (the recorded 775-token
  prompt's sentences), the second's blocks attending across the window's edge.
- Seeded: `--temp 1 -s 3` (it answers "The capital is Paris").
- Replies ended by EOS and by EOT: the pretrained model never picks <end_of_turn> (106) or
  <eos> (1) here, so a copy of the file has its header's eos and eot changed to ids its greedy
  replies pick: eos to `?` (236881), eot to `にある` (40273), so reply 1 ends by EOS, reply 2
  by EOT, reply 3 after -n; with a system prompt.
Every run writes 1 MiB of logits per position (read from a pipe, hashed row by row).
"""
from __future__ import annotations

import json

import pytest

from emu_tests.engine.test_engine_chat import Case, converse_exactly, edited
from modelfiles import fixture_path

pytestmark = pytest.mark.slow  # the real Gemma 3 270M: ~5 s per conversation

WINDOW = 512                              # Gemma 3 270M's sliding window
QUESTIONS = (b"What is the capital of France?", b"And of Italy?")


def sentences(a: int, b: int) -> bytes:
    """Sentences a..b-1 of the recorded 775-token prompt (no newline in them)."""
    text = json.loads((fixture_path("real_g3") / "reference.json").read_text())["prompts"][4]
    return (". ".join(text["text"].split(". ")[a:b]) + ".").encode()


def test_acceptance_conversation(gemma, real_g3):
    case = Case("real_g3", None, None, QUESTIONS, 32, None, (0, 0), ("n", "n"))
    converse_exactly(gemma, real_g3, case, "default", "real_g3 acceptance")


@pytest.mark.parametrize("path", ["avx2", "baseline"])
def test_other_kernel_paths(gemma, real_g3, path):
    case = Case("real_g3", None, None, QUESTIONS, 6, None, (0, 0), ("n", "n"))
    converse_exactly(gemma, real_g3, case, path, f"real_g3 {path}")


def test_past_the_window(gemma, real_g3):
    """Turns of ~290 and ~270 ids, replies of 2 (the second id fed first in turn 2)."""
    case = Case("real_g3", None, None, (sentences(0, 20), sentences(20, 40)), 2, None, (0, 0),
                ("n", "n"))
    c = converse_exactly(gemma, real_g3, case, "default", "real_g3 past the window")
    assert c.starts[1] < WINDOW < len(c.ids), (c.starts, len(c.ids))


def test_seeded(gemma, real_g3):
    case = Case("real_g3", None, QUESTIONS[0], (QUESTIONS[1], b"Thank you!"), 12, (1.0, 1.0, 3),
                (0, 0), ("n", "n", "n"))
    converse_exactly(gemma, real_g3, case, "default", "real_g3 seeded", again=False)


def test_replies_ended_by_eos_and_eot(gemma, real_g3, tmp_path):
    model = edited(real_g3, tmp_path / "stops.bin", eot=40273, eos=236881)
    case = Case("real_g3", b"You are a helpful assistant.", None, (*QUESTIONS, b"Thank you!"),
                24, None, (0, 0), ("eos", "eot", "n"))
    converse_exactly(gemma, model, case, "default", "real_g3 eos and eot")
