"""The engine's conversation mode in Python (`-cnv`): the text of a conversation and the ids the
engine feeds, from a model file's five chat strings (modelfile4.STRINGS) and its tokenizer.

A conversation is a system prompt (or None), user turns and replies. Each turn is trimmed of
ASCII whitespace at both ends (space, \\t, \\n, \\v, \\f, \\r: `trim`); a turn that trims to nothing
is skipped (no text, no ids, no reply). The first kept turn is
`SYS_BEGIN system SYS_END turn USER_END` with a system prompt (used as given, not trimmed), else
`USER_BEGIN turn USER_END`; every later one is `REPLY_END USER_BEGIN turn USER_END`, after the
reply to the turn before it.

- `render(strings, system, turns, replies)`: the transcript's text after BOS: the kept turns
  with `replies[i]` (text) after the i-th of them (one reply fewer than kept turns: it ends
  where the model is to answer; or as many: it ends after a reply). This is what a template
  renders (transformers' apply_chat_template with add_generation_prompt) for replies and a
  system prompt free of surrounding whitespace (templates trim those too; the engine keeps a
  reply as sampled and the system prompt as given).
- `feed(tok, strings, system, turns, replies, eot, eos)`: the ids the engine forwards, in order: the
  first kept turn's string tokenized as one text with BOS first (tok: the tokenizer twin),
  then each reply's sampled ids, then the next kept turn's. A reply is its sampled ids and how
  it ended (`Ending`): "eot" (its last id is the header's eot), "eos" (its last id is eos)
  or "n" (-n ids were sampled). The id that ended it was sampled but never forwarded: after
  "eot" and "eos" it is dropped and the next turn's ids are tokenize(REPLY_END USER_BEGIN turn
  USER_END) (REPLY_END begins with the end-of-turn piece); after "n" they are that id, then
  those. The last reply's ending id is never forwarded. Each turn's string is tokenized as
  one text without BOS (the first turn's with it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from builder.models.modelfile4 import N_STRINGS
from builder.twins.tokenizer import Tokenizer

Ending = Literal["eot", "eos", "n"]
Reply = tuple[Sequence[int], Ending]
ASCII_SPACE = b" \t\n\v\f\r"


def trim(text: bytes) -> bytes:
    """text without the ASCII whitespace (space, \\t, \\n, \\v, \\f, \\r) at either end."""
    return text.strip(ASCII_SPACE)


def turn_strings(strings: Sequence[bytes], system: bytes | None, turns: Sequence[bytes]) -> list[bytes]:
    """The string of each kept turn (those that do not trim to nothing), without the REPLY_END
    that precedes every one but the first."""
    if len(strings) != N_STRINGS:
        raise ValueError(f"{len(strings)} chat strings, expected {N_STRINGS}")
    sys_begin, sys_end, user_begin, user_end, _ = strings
    kept = [t for t in map(trim, turns) if t]
    return [(sys_begin + system + sys_end if i == 0 and system is not None else user_begin) + t + user_end
            for i, t in enumerate(kept)]


def _check_count(n_turns: int, n_replies: int) -> None:
    if n_replies not in (n_turns - 1, n_turns):
        raise ValueError(f"{n_replies} replies to {n_turns} kept turns (expected {n_turns - 1} or {n_turns})")


def render(strings: Sequence[bytes], system: bytes | None, turns: Sequence[bytes], replies: Sequence[bytes]) -> bytes:
    """The conversation's text after BOS (see the module docstring)."""
    texts = turn_strings(strings, system, turns)
    _check_count(len(texts), len(replies))
    reply_end = strings[4]
    out = b""
    for i, text in enumerate(texts):
        out += (reply_end if i else b"") + text + (replies[i] if i < len(replies) else b"")
    return out


def _tokenize(tok: Tokenizer, text: bytes) -> list[int]:
    """text's ids without BOS (one text: the engine's tokenizer runs once over it)."""
    return [t for ids in tok.segments(text) for t in ids]


def feed(tok: Tokenizer, strings: Sequence[bytes], system: bytes | None, turns: Sequence[bytes],
         replies: Sequence[Reply], eot: int, eos: int) -> list[int]:
    """The ids the engine forwards for the conversation, in order (see the module docstring);
    eot and eos: the header's ids that end a reply."""
    texts = turn_strings(strings, system, turns)
    _check_count(len(texts), len(replies))
    out = tok.encode(texts[0]) if texts else []
    for i, (ids, ending) in enumerate(replies):
        ids = list(ids)
        ended = {"eot": eot, "eos": eos}.get(ending)
        stops = [k for k, t in enumerate(ids) if t in (eot, eos)]       # where the engine stops
        if not ids or stops != ([len(ids) - 1] if ended is not None else []) or ended not in (None, ids[-1]):
            raise ValueError(f"reply {i} ({ending}) is not a reply that ended so: {ids}")
        out += ids[:-1]
        if i + 1 < len(texts):
            out += ids[-1:] * (ending == "n") + _tokenize(tok, strings[4] + texts[i + 1])
    return out
