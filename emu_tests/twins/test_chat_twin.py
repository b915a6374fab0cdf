"""builder.twins.chat, the conversation twin, against the models' own chat templates and the
tokenizer twin.

- Every recorded rendering (chat_templates/recorded.json: transformers' apply_chat_template with
  Gemma 2's, Gemma 3's and Gemma 4's templates, their sources quoted there; record_chat.py made
  it) is "<bos>" and the twin's text with the generation's strings (modelfile4.CHAT); Gemma 2's
  template refuses a system prompt and renders every other conversation as Gemma 3's does.
- The ids the engine feeds (chat.feed) for those conversations, replies ended by end of turn,
  by EOS and by -n, are the tokenizer twin's ids of the whole rendered text, BOS first, on model
  files of Gemma 3 (tiny_g3: the pieces <start_of_turn> and <end_of_turn> user-defined) and
  Gemma 4 (tiny_g4, whose tokenizer has no <|turn> piece; synth's tiny-g4-dense, whose <|turn>
  and <turn|> are control pieces): the conversations were chosen so that the turns' texts,
  tokenized apart, tokenize as the whole does, which the test asserts.
- The endings, trimming and skipped turns on their own, and replies that could not have ended so.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.models import synth
from builder.models.modelfile import CONTROL
from builder.models.modelfile4 import CHAT, ModelFile4
from builder.twins.chat import feed, render, trim, turn_strings
from builder.twins.tokenizer import Tokenizer
from modelfiles import convert_fixture

RECORDED = json.loads((Path(__file__).parent / "chat_templates" / "recorded.json").read_text())
CONVERSATIONS = [(c["system"] if c["system"] is None else c["system"].encode(), [t.encode() for t in c["turns"]],
                  [r.encode() for r in c["replies"]]) for c in RECORDED["conversations"]]
MODELS = {"tiny_g3": 3, "tiny_g4": 4, "synth tiny-g4-dense": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, ModelFile4]:
    d = tmp_path_factory.mktemp("chat")
    synth.synth("tiny-g4-dense", d / "g4.bin", progress=False)
    paths = {"tiny_g3": convert_fixture("tiny_g3", "hf", d, 4), "tiny_g4": convert_fixture("tiny_g4", "hf", d, 4),
             "synth tiny-g4-dense": d / "g4.bin"}
    return {name: ModelFile4(path) for name, path in paths.items()}


@pytest.mark.parametrize("name", sorted(RECORDED["templates"]))
def test_the_twin_renders_what_the_template_renders(name):
    template = RECORDED["templates"][name]
    strings = CHAT[template["generation"]]
    for k, ((system, turns, replies), got) in enumerate(zip(CONVERSATIONS, RECORDED["renderings"][name])):
        if name == "gemma2" and system is not None:
            assert got == {"error": "TemplateError: System role not supported"}, k
            continue
        assert got == RECORDED["bos_token"] + render(strings, system, turns, replies).decode(), f"conversation {k}"
    with_system = sum(system is not None for system, _, _ in CONVERSATIONS)
    assert 0 < with_system < len(CONVERSATIONS) and {len(t) for _, t, _ in CONVERSATIONS} == {1, 2, 3}
    assert "trim" in template["source"] and template["origin"]


def test_gemma2_renders_as_gemma3_without_a_system_prompt():
    pairs = [(a, b) for (system, _, _), a, b in zip(CONVERSATIONS, RECORDED["renderings"]["gemma2"],
                                                    RECORDED["renderings"]["gemma3"]) if system is None]
    assert len(pairs) >= 3 and all(a == b for a, b in pairs)


def canonical_reply(tok: Tokenizer, text: bytes, ending: str, f: ModelFile4) -> tuple[list[int], str]:
    """A reply whose sampled ids are text's own tokens, then the id that ended it (for "n": none)."""
    ids = [t for seg in tok.segments(text) for t in seg]
    return ids + {"eot": [f.header.eot], "eos": [f.header.eos], "n": []}[ending], ending


@pytest.mark.parametrize("ending", ["eot", "eos", "n"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fed_ids_are_the_transcripts_ids(models, name, ending):
    """Each conversation as the engine feeds it (its turns' strings and replies tokenized apart)
    is the whole transcript tokenized at once."""
    f = models[name]
    tok, strings = Tokenizer(f), f.strings
    assert strings == list(CHAT[MODELS[name]])
    for k, (system, turns, replies) in enumerate(CONVERSATIONS):
        ids = feed(tok, strings, system, turns, [canonical_reply(tok, r, ending, f) for r in replies], f.header.eot,
                   f.header.eos)
        whole = tok.encode(render(strings, system, turns, replies))
        assert ids == whole, f"{name} conversation {k}: {ids} != {whole}"


def test_endings(models):
    """After "eot" and "eos" the ending id is dropped, after "n" it is forwarded first in the next
    turn; the conversation's last reply never forwards the id it ended on."""
    f = models["synth tiny-g4-dense"]
    tok, strings, eot, eos = Tokenizer(f), f.strings, f.header.eot, f.header.eos
    assert (eot, eos, f.pieces[105], f.pieces[106], f.types[105], f.types[106]) == (106, 1, b"<|turn>", b"<turn|>",
                                                                                   CONTROL, CONTROL)
    first = tok.encode(b"<|turn>user\nHi<turn|>\n<|turn>model\n")
    assert first[:2] == [2, 105] and first.count(106) == 1
    next_turn = [t for s in tok.segments(b"<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n") for t in s]
    assert next_turn[0] == 106
    r = [t for s in tok.segments(b"Hello there") for t in s]
    two = (None, [b"Hi", b"Bye"])
    assert feed(tok, strings, *two, [(r + [eot], "eot")], eot, eos) == first + r + next_turn
    assert feed(tok, strings, *two, [(r + [eos], "eos")], eot, eos) == first + r + next_turn
    assert feed(tok, strings, *two, [(r, "n")], eot, eos) == first + r[:-1] + [r[-1]] + next_turn
    one = (None, [b"Hi"])
    assert feed(tok, strings, *one, [(r + [eot], "eot")], eot, eos) == first + r
    assert feed(tok, strings, *one, [(r, "n")], eot, eos) == first + r[:-1]
    for bad in [(r, "eot"), (r + [eos], "eot"), (r + [eot], "eos"), (r + [eot], "n"), ([eot] + r + [eot], "eot"),
                ([], "n")]:
        with pytest.raises(ValueError):
            feed(tok, strings, *two, [bad], eot, eos)
    with pytest.raises(ValueError, match="replies to 2 kept turns"):
        feed(tok, strings, *two, [], eot, eos)


def test_trimming_is_ascii_whitespace_only():
    assert trim(b" \t\n\v\f\rHi there \t\n\v\f\r") == b"Hi there"
    for kept in ("\u00a0Hi\u00a0", "\u3000Hi", "Hi\u2028", "\x1cHi\x85"):    # Unicode spaces Jinja's trim strips
        assert trim(kept.encode()) == kept.encode()
    strings = CHAT[3]
    assert render(strings, b" sys \n", [b"\n Hi \r\n"], []) == b"<start_of_turn>user\n sys \n\n\nHi<end_of_turn>\n" \
                                                              b"<start_of_turn>model\n"


def test_empty_turns_are_skipped(models):
    f = models["tiny_g3"]
    tok, strings, eot, eos = Tokenizer(f), f.strings, f.header.eot, f.header.eos
    turns = [b"", b" \t\r\n", b"Hi", b"\v\f", b"Bye", b"   "]
    assert turn_strings(strings, b"Be brief.", turns) == turn_strings(strings, b"Be brief.", [b"Hi", b"Bye"])
    assert turn_strings(strings, b"Be brief.", turns)[0].startswith(b"<start_of_turn>user\nBe brief.\n\nHi")
    reply = ([t for s in tok.segments(b"Hello") for t in s] + [eot], "eot")
    assert (feed(tok, strings, None, turns, [reply], eot, eos)
            == feed(tok, strings, None, [b"Hi", b"Bye"], [reply], eot, eos))
    assert render(strings, b"sys", [b" ", b""], []) == b"" and feed(tok, strings, b"sys", [b"\n"], [], eot, eos) == []
