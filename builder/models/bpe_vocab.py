"""Gemma 4's tokenizer -> a modelfile.Vocab with merges (BPE by merge rank), from either source.

- Hugging Face `tokenizer.json` (transformers' GemmaTokenizer): model BPE with byte_fallback,
  `vocab` (piece -> id) and `merges` (rank order; ["a", "b"] pairs or "a b" strings), the
  normalizer " " -> U+2581 and no pre-split (a Split on " " after that normalizer splits
  nothing). Piece types: special added tokens CONTROL, other added tokens USER_DEFINED (both
  are matched whole on the raw text), <0xHH> BYTE, the rest NORMAL. bos / eos: the names
  tokenizer_config.json gives (bos_token, eos_token).
- GGUF (llama.cpp's `gemma4` tokenizer): tokenizer.ggml.tokens / token_type (kept as the file
  says) / merges ("a b": split at the first space after the first character, as llama.cpp).

Scores are 0 for every piece: a merge-rank vocabulary has none (GGUF's are a -1000
placeholder), so both sources give the same tables.
Anything else is refused with one line (ConvertError).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from builder.models.checkpoint import ConvertError
from builder.models.modelfile import BYTE, CONTROL, NORMAL, USER_DEFINED, Vocab

SPACE = "\u2581"
NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
NO_SPLIT = (None, {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                   "invert": False})
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def merge_ids(merges: list, index: dict[str, int], where: object) -> list[tuple[int, int]]:
    """Merges (["a", "b"] or "a b") -> (left id, right id) in rank order."""
    out = []
    for rank, m in enumerate(merges):
        if isinstance(m, str):
            cut = m.find(" ", 1)
            m = [m[:cut], m[cut + 1:]] if cut > 0 else [m]
        if not (isinstance(m, list) and len(m) == 2 and all(p in index for p in m)):
            raise ConvertError(f"{where}: merge {rank} ({m!r}) is not two pieces of the vocabulary")
        out.append((index[m[0]], index[m[1]]))
    return out


def token_name(value: object) -> object:
    """A tokenizer_config.json special token: a string, or {"content": string}."""
    return value.get("content") if isinstance(value, dict) else value


def tokenizer_json_vocab(src: Path) -> Vocab:
    where = src / "tokenizer.json"
    if not where.is_file():
        raise ConvertError(f"{src}: no tokenizer.json (Gemma 4's tokenizer)")
    try:
        tok = json.loads(where.read_text())
        config = json.loads((src / "tokenizer_config.json").read_text())
    except FileNotFoundError:
        raise ConvertError(f"{src}: no tokenizer_config.json (it names bos and eos)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"{src}: invalid tokenizer JSON ({e})") from None
    if not (isinstance(tok, dict) and isinstance(config, dict)):
        raise ConvertError(f"{src}: tokenizer.json or tokenizer_config.json is not a JSON object")
    model = tok.get("model")
    if not (isinstance(model, dict) and model.get("type") == "BPE" and model.get("byte_fallback")
            and isinstance(model.get("vocab"), dict) and isinstance(model.get("merges"), list)):
        raise ConvertError(f"{where}: not a BPE model with byte fallback, vocab and merges")
    if tok.get("normalizer") != NORMALIZER or tok.get("pre_tokenizer") not in NO_SPLIT:
        raise ConvertError(f"{where}: normalizer or pre_tokenizer is not Gemma's (spaces -> U+2581, no split)")
    vocab = model["vocab"]
    n = len(vocab)
    pieces: list[str | None] = [None] * n
    for piece, i in vocab.items():
        if not (isinstance(i, int) and 0 <= i < n and pieces[i] is None):
            raise ConvertError(f"{where}: the vocabulary's ids are not 0 .. {n - 1}, each once")
        pieces[i] = piece
    types = [BYTE if BYTE_PIECE.fullmatch(p) else NORMAL for p in pieces]
    added = tok.get("added_tokens") or []
    if not (isinstance(added, list) and all(isinstance(t, dict) for t in added)):
        raise ConvertError(f"{where}: added_tokens is not a list of objects")
    for t in added:
        i = t.get("id")
        if not (isinstance(i, int) and 0 <= i < n and pieces[i] == t.get("content")):
            raise ConvertError(f"{where}: added token {t.get('content')!r} is not piece {i} of the vocabulary")
        if t.get("normalized") and (" " in pieces[i] or SPACE in pieces[i]):
            raise ConvertError(f"{where}: added token {pieces[i]!r} is matched after normalization")
        types[i] = CONTROL if t.get("special") else USER_DEFINED
    index = {p: i for i, p in enumerate(pieces)}
    special = []
    for key in ("bos_token", "eos_token"):
        name = token_name(config.get(key))
        if name not in index:
            raise ConvertError(f"{src / 'tokenizer_config.json'}: {key} {name!r} is not a piece")
        special.append(index[name])
    return Vocab([p.encode() for p in pieces], [0.0] * n, types, *special,
                 merges=merge_ids(model["merges"], index, where))


def gguf_bpe_vocab(get, where: object) -> Vocab:
    """The vocabulary of a GGUF whose tokenizer.ggml.model is gemma4 (get: checkpoint.field on its keys)."""
    tokens = get("tokenizer.ggml.tokens", str, array=True)
    types = get("tokenizer.ggml.token_type", int, array=True)
    if len(types) != len(tokens):
        raise ConvertError(f"{where}: {len(tokens)} tokens but {len(types)} token types")
    index = {p: i for i, p in enumerate(tokens)}
    merges = merge_ids(get("tokenizer.ggml.merges", str, array=True), index, where)
    return Vocab([t.encode() for t in tokens], [0.0] * len(tokens), types,
                 get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id"), merges=merges)
