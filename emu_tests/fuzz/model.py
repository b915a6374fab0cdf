"""The engine model file as the fuzzer sees it: header fields, sections, tensors, validity.

The format is defined once, in builder/models/modelfile.py; this module only parses a valid file
(`Base`) into the numbers the mutators aim at (field offsets, section and tensor boundaries,
piece records, index, user list), states which headers the engine must refuse
(`header_problems`, exact integer arithmetic) and writes a mutated copy (`write_case`).
A Base holds the file's bytes up to weights_off (`data`) and its length: the weights of a
sparse 5 GB file are a hole that is never read.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from builder.models.modelfile import (FLAGS, FLT_MAX, HEADER_FIELDS, HEADER_SIZE, MAGIC, PIECE, PIECE_REC,
                               POST_NORMS, Q8_0, Q8_0_BLOCK, QK8_0, QK_NORM, TENSOR_ALIGN, VERSION,
                               WEIGHTS_ALIGN, Header, tensor_layout)
from linker.layout import align_up

PIECE_FIELDS = [("blob_off", 0), ("len", 4), ("score", 8), ("type", 12)]    # u32 / f32 each


def weights_size(h: dict) -> int:
    """weights_size the dimensions and flags call for, exact for any values (closed form: the
    mutators ask it about 2^31 layers, which modelfile.weights_size would walk one by one).
    A layer: window (u32), rope (head_dim/2 f32), attn_norm, wq wk wv, [q_norm k_norm: QK_NORM],
    wo, [post_attn_norm: POST_NORMS], ffn_norm, gate up down, [post_ffn_norm: POST_NORMS].
    A matrix is FP16, or with Q8_0 and rows of a multiple of QK8_0 weights Q8_0 blocks."""
    d, f, hd, flags = h["dim"], h["ffn"], h["head_dim"], h["flags"]
    q, kv = h["heads"] * hd, h["kv_heads"] * hd

    def mat(rows: int, cols: int) -> int:
        return rows * cols // QK8_0 * Q8_0_BLOCK if flags & Q8_0 and cols % QK8_0 == 0 else 2 * rows * cols
    sizes = [4, 4 * (hd // 2), 4 * d, mat(q, d), mat(kv, d), mat(kv, d), mat(d, q), 4 * d,
             mat(f, d), mat(f, d), mat(d, f)]
    sizes += [4 * hd] * 2 * bool(flags & QK_NORM) + [4 * d] * 2 * bool(flags & POST_NORMS)
    layer = sum(align_up(n, TENSOR_ALIGN) for n in sizes)
    return align_up(mat(h["vocab"], d), TENSOR_ALIGN) + h["layers"] * layer + align_up(4 * d, TENSOR_ALIGN)


def parse_header(data: bytes) -> dict:
    """Every header field by name (floats as floats) from the first 256 bytes."""
    return {name: struct.unpack_from("<" + code, data, off)[0] for name, off, code in HEADER_FIELDS}


def header_problems(h: dict, file_len: int) -> list[str]:
    """Why the contract makes this header invalid ([] when it does not), in exact arithmetic.

    Rules a memory-safe engine cannot skip: identity, sizes against the file length and
    against the dimensions, every table inside the file, and the ids it indexes with; and the
    version-2 fields as builder.models.modelfile refuses them: unknown flags, att_scale not positive
    and finite, a soft-cap negative, infinite or NaN (0 is none; the engine also refuses a
    soft-cap of -0.0, whose sign bit is set, which the contract allows)."""
    out = []
    if h["magic"] != MAGIC or h["version"] != VERSION or h["header_size"] != HEADER_SIZE:
        out.append("identity")
    if h["file_size"] != file_len or h["weights_off"] + h["weights_size"] != file_len:
        out.append("file size")
    if h["weights_off"] % WEIGHTS_ALIGN or h["weights_size"] != weights_size(h):
        out.append("weights")
    if h["kv_heads"] == 0 or h["heads"] % h["kv_heads"] or h["head_dim"] % 2:
        out.append("heads")
    if h["flags"] & ~FLAGS:
        out.append("flags")
    if not 0 < h["att_scale"] <= FLT_MAX:
        out.append("att_scale")
    if not all(0 <= h[c] <= FLT_MAX for c in ("att_softcap", "final_softcap")):
        out.append("soft-caps")
    for off, n in (("pieces_off", PIECE_REC * h["vocab"]), ("index_off", 4 * h["n_index"]),
                   ("user_off", 4 * h["n_user"]), ("blob_off", h["blob_size"])):
        if h[off] + n > file_len:
            out.append(off)
    if h["bos"] >= h["vocab"] or h["byte_base"] + 256 > h["vocab"]:
        out.append("ids")
    return out


def read_prefix(path: Path) -> tuple[bytes, int]:
    """A model file's bytes up to weights_off (all of them if the header is unreadable) and
    its length."""
    with open(path, "rb") as f:
        length = f.seek(0, 2)
        f.seek(0)
        head = f.read(HEADER_SIZE)
        end = struct.unpack_from("<Q", head, 128)[0] if len(head) == HEADER_SIZE else length
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
    """A valid engine file, parsed for the mutators: `data` is its prefix up to weights_off
    (tables included), `length` the file's length."""

    data: bytes
    length: int

    def __post_init__(self) -> None:
        h = self.header = parse_header(self.data)
        self.tensors = tensor_layout(Header.unpack(self.data))
        self.pieces = [PIECE.unpack_from(self.data, h["pieces_off"] + PIECE_REC * i)
                       for i in range(h["vocab"])]
        self.index = list(struct.unpack_from(f"<{h['n_index']}I", self.data, h["index_off"]))
        self.user = list(struct.unpack_from(f"<{h['n_user']}I", self.data, h["user_off"]))

    @classmethod
    def load(cls, path: Path) -> "Base":
        return cls(*read_prefix(path))

    def boundaries(self) -> dict[str, int]:
        """Where every header field, section and tensor starts (and the file ends)."""
        h = self.header
        out = {f"header.{name}": off for name, off, code in HEADER_FIELDS}
        out.update({"header.end": HEADER_SIZE, "pieces": h["pieces_off"],
                    "pieces.second": h["pieces_off"] + PIECE_REC,
                    "pieces.last": h["pieces_off"] + PIECE_REC * (h["vocab"] - 1),
                    "index": h["index_off"], "user": h["user_off"], "blob": h["blob_off"],
                    "blob.end": h["blob_off"] + h["blob_size"], "weights": h["weights_off"],
                    "file.end": h["file_size"]})
        out.update({f"tensor.{t.name}": h["weights_off"] + t.offset for t in self.tensors})
        return out
