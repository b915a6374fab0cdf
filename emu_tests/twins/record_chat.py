"""Record how the Gemma chat templates render a few conversations into
chat_templates/recorded.json, what test_chat_twin.py holds builder.twins.chat to.

    python -m emu_tests.twins.record_chat        (needs transformers and jinja2: not a test dependency)

The templates' sources are the .jinja files beside recorded.json, quoted byte for byte from
public code (ORIGINS says where); the file stores each source again with its origin, so the
test reads nothing else. Each conversation (CONVERSATIONS: a system prompt or None, user turns,
the replies between them) is rendered by transformers' `apply_chat_template(messages,
chat_template=SOURCE, tokenize=False, add_generation_prompt=True)` on a tokenizer whose
bos_token is "<bos>" (the fixtures' Gemma 4 tokenizer.json: only its bos_token is rendered);
a template that raises records {"error": its message}. User texts carry ASCII whitespace at
their ends (every template trims it) but no Unicode space there (Jinja's trim strips those
too, the engine does not); replies and system prompts carry none (the Gemma 4 template trims
them, the engine does not).

When: once; again only when a template or a conversation is added (say so in the commit).
"""
from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent / "chat_templates"
RECORDED = HERE / "recorded.json"
TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_g4" / "tokenizer.json"
BOS = "<bos>"
# name -> (the generation whose strings the engine uses for it, where the source was quoted from)
ORIGINS = {
    "gemma2": (2, "google/gemma-2-2b-it's chat template, as llama.cpp keeps it in "
                  "models/templates/google-gemma-2-2b-it.jinja (quoted from the copy in the GitHub fork "
                  "ye-NX/llama.cpp, commit b354d7c9ecb76c97c07098617cdebbdfffa2583e; 594 bytes, no final "
                  "newline). Gemma 1's (google/gemma-7b-it, in llama.cpp's tests/test-chat-template.cpp) is "
                  "the same without the leading {{ bos_token }}: its tokenizer adds BOS. It has no system "
                  "role: it raises on one."),
    "gemma3": (3, "the value of _CHAT_TEMPLATE in transformers' "
                  "src/transformers/models/gemma3/convert_gemma3_weights.py (huggingface/transformers, "
                  "commit 0d7e95d96b4e187c651e2b2406ed98ed40d74963), the template that script writes into "
                  "Gemma 3 checkpoints (a Python string: its '\\n' are newline characters here)."),
    "gemma4": (4, "the chat template of google/gemma-4-E4B-it (transformers' convert_gemma4_weights.py "
                  "takes it from the Hub repository gg-hf-gg/gemma-4-E4B-it, unreachable here), as llama.cpp's "
                  "convert_hf_to_gguf.py printed it (\"gguf.vocab:Setting chat_template to ...\") in a public "
                  "conversion log of gemma-4-E4B-it found by code search: 11,926 characters, the length "
                  "between the log's markers. The larger Gemma 4 models' template (llama.cpp's "
                  "models/templates/gemma4.jinja, google-gemma-4-31B-it-interleaved.jinja) ends the "
                  "generation prompt with '<|channel>thought\\n<channel|>' (thinking switched off), which "
                  "this one and the engine's strings do not write."),
}
CONVERSATIONS = [
    (None, ["What is the capital of France?"], []),
    ("You are a terse assistant.", ["  Hello!  "], []),
    (None, ["Hi\n", "Tell me a joke."], ["Hello! How can I help?"]),
    ("Answer in French.\nKeep it short.", ["\tWhat is 2 + 2?\r\n", "And 3 + 3?", " Merci. "], ["Quatre.", "Six."]),
    (None, ["\v\f\u00c7a va? \u65e5\u672c\u8a9e \U0001f600\n", "Encore  une fois"], ["Oui, \u00e7a va bien."]),
    ("", ["Hello"], []),
]


def messages(system: str | None, turns: list[str], replies: list[str]) -> list[dict]:
    out = [] if system is None else [{"role": "system", "content": system}]
    for i, turn in enumerate(turns):
        out.append({"role": "user", "content": turn})
        if i < len(replies):
            out.append({"role": "assistant", "content": replies[i]})
    return out


def main() -> int:
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), bos_token=BOS)
    templates, renderings = {}, {}
    for name, (generation, origin) in ORIGINS.items():
        source = (HERE / f"{name}.jinja").read_text()
        templates[name] = {"generation": generation, "origin": origin, "source": source}
        renderings[name] = []
        for system, turns, replies in CONVERSATIONS:
            try:
                text = tok.apply_chat_template(messages(system, turns, replies), chat_template=source, tokenize=False,
                                               add_generation_prompt=True)
                renderings[name].append(text)
            except Exception as e:  # noqa: BLE001 -- the template's own exception, recorded
                renderings[name].append({"error": f"{type(e).__name__}: {e}"})
    RECORDED.write_text(json.dumps({
        "about": "How each template renders each conversation: transformers' apply_chat_template(..., "
                 "tokenize=False, add_generation_prompt=True), bos_token " + json.dumps(BOS) + "; recorded by "
                 "python -m emu_tests.twins.record_chat, checked by emu_tests/twins/test_chat_twin.py.",
        "transformers": version("transformers"), "jinja2": version("jinja2"), "bos_token": BOS,
        "templates": templates,
        "conversations": [{"system": s, "turns": t, "replies": r} for s, t, r in CONVERSATIONS],
        "renderings": renderings}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {RECORDED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
