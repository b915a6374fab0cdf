"""The engine model file (version 4) as the fuzzer sees it: header fields, sections, the
program's weights, validity.

The format is defined once, in builder/models/modelfile4.py; this module only parses a valid
file (`Base`) into the numbers the mutators aim at (field offsets, section boundaries, the
weights the program's ops read, piece records, index, user list), states which headers the
engine must refuse (`header_problems`, exact integer arithmetic) and writes a mutated copy
(`write_case`). A Base holds the file's bytes up to weights_off (`data`) and its length: the
weights of a sparse 5 GB file are a hole that is never read.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from builder.models.modelfile import HEADER_SIZE, MAGIC, PIECE, PIECE_REC
from builder.models.modelfile3 import DIM_LIMITS, MERGES
from builder.models.modelfile4 import (DTYPES, HEADER_FIELDS, MAX_OPS, MAX_SLOTS, OP_REC, RULES, SLOT_REC, VERSION,
                                       Op, OpRec, section_chain, weight_bytes)

PIECE_FIELDS = [("blob_off", 0), ("len", 4), ("score", 8), ("type", 12)]    # u32 / f32 each
FIELD_AT = {name: off for name, off, _ in HEADER_FIELDS}


@dataclass(frozen=True)
class Weight:
    """A weight the program reads: where (from weights_off), how many bytes, of which dtype
    (as TensorSpec names it), and a name: the first op that reads it (`op12.MATMUL`)."""
    name: str
    offset: int
    nbytes: int
    dtype: str


def parse_header(data: bytes) -> dict:
    """Every header field by name from the first 256 bytes."""
    return {name: struct.unpack_from("<" + code, data, off)[0] for name, off, code in HEADER_FIELDS}


def header_problems(h: dict, file_len: int, weights_end: int = 0) -> list[str]:
    """Why version 4's rules make this header invalid ([] when they do not), in exact
    arithmetic: identity, the file's length, the counts' ranges, the flags and merges, the ids
    the tokenizer starts from, every section's offset the one the counts before it imply
    (modelfile4.section_chain, weights_off included) and the weights region holding the
    `weights_end` bytes the program's weights reach."""
    out = []
    if h["magic"] != MAGIC or h["version"] != VERSION or h["header_size"] != HEADER_SIZE:
        out.append("identity")
    if h["file_size"] != file_len:
        out.append("file size")
    for name, low, high in (("vocab", 1, DIM_LIMITS["vocab"]), ("max_ctx", 1, DIM_LIMITS["max_ctx"]),
                            ("n_slots", 1, MAX_SLOTS), ("n_ops", 1, MAX_OPS), ("n_merges", 0, DIM_LIMITS["n_merges"])):
        if not low <= h[name] <= high:
            out.append(name)
    if h["flags"] & ~MERGES or h["n_merges"] and not h["flags"] & MERGES:
        out.append("flags")
    if max(h["bos"], h["eos"], h["eot"]) >= h["vocab"] or h["byte_base"] + 256 > h["vocab"]:
        out.append("ids")
    out += [name for name, want in section_chain(SimpleNamespace(**h)) if h[name] != want]
    if h["weights_size"] < weights_end:
        out.append("weights")
    return out


def read_prefix(path: Path) -> tuple[bytes, int]:
    """A model file's bytes up to weights_off (all of them if the header is unreadable) and
    its length."""
    with open(path, "rb") as f:
        length = f.seek(0, 2)
        f.seek(0)
        head = f.read(HEADER_SIZE)
        end = struct.unpack_from("<Q", head, FIELD_AT["weights_off"])[0] if len(head) == HEADER_SIZE else length
        return head + f.read(min(end, length) - len(head)), length


def write_case(path: Path, prefix: bytes, length: int, edits, size: int | None) -> None:
    """The model file a case runs on: `prefix`, zeros (a hole) up to `length`, the (offset,
    bytes) `edits`, then cut or zero-extended to `size` if it is given."""
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(length)
        for off, raw in edits:
            f.seek(off)
            f.write(raw)
        if size is not None:
            f.truncate(size)


@dataclass
class Base:
    """A valid version 4 file, parsed for the mutators: `data` is its prefix up to weights_off
    (tables included), `length` the file's length; `ops` its program, `weights` the weights
    it reads (each once, in file order), `weights_end` where the last one ends."""

    data: bytes
    length: int

    def __post_init__(self) -> None:
        h = self.header = parse_header(self.data)
        self.ops = [OpRec.unpack(self.data, h["program_off"] + OP_REC * i) for i in range(h["n_ops"])]
        found: dict[int, Weight] = {}
        for i, o in enumerate(self.ops):
            rule = RULES[Op(o.op)]
            if rule.weight is not None and o.w not in found:
                found[o.w] = Weight(f"op{i}.{o.name}", o.w, weight_bytes(rule.weight(o, h["vocab"]), o.wtype),
                                    DTYPES[o.wtype])
        self.weights = sorted(found.values(), key=lambda t: t.offset)
        self.weights_end = max(t.offset + t.nbytes for t in self.weights)
        self.pieces = [PIECE.unpack_from(self.data, h["pieces_off"] + PIECE_REC * i)
                       for i in range(h["vocab"])]
        self.index = list(struct.unpack_from(f"<{h['n_index']}I", self.data, h["index_off"]))
        self.user = list(struct.unpack_from(f"<{h['n_user']}I", self.data, h["user_off"]))

    @classmethod
    def load(cls, path: Path) -> "Base":
        return cls(*read_prefix(path))

    def boundaries(self) -> dict[str, int]:
        """Where every header field, section, slot and op record and weight starts (and the
        file ends)."""
        h = self.header
        out = {f"header.{name}": off for name, off in FIELD_AT.items()}
        out.update({"header.end": HEADER_SIZE, "slots.last": h["program_off"] - SLOT_REC,
                    "ops.second": h["program_off"] + OP_REC, "ops.last": h["strings_off"] - OP_REC,
                    "pieces.second": h["pieces_off"] + PIECE_REC,
                    "pieces.last": h["pieces_off"] + PIECE_REC * (h["vocab"] - 1),
                    "blob.end": h["blob_off"] + h["blob_size"], "file.end": h["file_size"]})
        out.update({name.removesuffix("_off"): h[name] for name, _ in section_chain(SimpleNamespace(**h))
                    if name != "file_size"})
        out.update({f"weight.{t.name}": h["weights_off"] + t.offset for t in self.weights})
        out.update({f"weight.{t.name}.end": h["weights_off"] + t.offset + t.nbytes for t in self.weights})
        return out
