"""asm/format.asm mirrors builder/models/modelfile.py: every header offset, the magic, the version,
the sizes and alignments, the header flags, the piece record fields and the piece types."""
from __future__ import annotations

import re
from pathlib import Path

from builder.models import modelfile

FORMAT_ASM = Path(__file__).resolve().parents[2] / "asm" / "format.asm"


def asm_constants() -> dict[str, int]:
    """NAME = number lines of format.asm (comments stripped)."""
    out = {}
    for line in FORMAT_ASM.read_text().splitlines():
        m = re.fullmatch(r"\s*(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*", line.split(";")[0])
        if m:
            out[m.group(1)] = int(m.group(2), 0)
    return out


def test_header_offsets():
    asm = asm_constants()
    want = {f"HDR_{name.upper()}": off for name, off, _ in modelfile.HEADER_FIELDS}
    got = {k: v for k, v in asm.items() if k.startswith("HDR_")}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"format.asm lacks {missing}"
    assert not extra, f"format.asm has fields modelfile.py does not: {extra}"
    wrong = [(k, want[k], got[k]) for k in want if got[k] != want[k]]
    assert not wrong, f"(name, modelfile.py, format.asm): {wrong}"


def test_scalars():
    asm = asm_constants()
    want = {
        "MODEL_MAGIC": int.from_bytes(modelfile.MAGIC, "little"),
        "MODEL_VERSION": modelfile.VERSION,
        "HEADER_SIZE": modelfile.HEADER_SIZE,
        "PIECE_REC": modelfile.PIECE_REC,
        "TENSOR_ALIGN": modelfile.TENSOR_ALIGN,
        "WEIGHTS_ALIGN": modelfile.WEIGHTS_ALIGN,
        "PIECE_NORMAL": modelfile.NORMAL,
        "PIECE_UNKNOWN": modelfile.UNKNOWN,
        "PIECE_CONTROL": modelfile.CONTROL,
        "PIECE_USER": modelfile.USER_DEFINED,
        "PIECE_UNUSED": modelfile.UNUSED,
        "PIECE_BYTE": modelfile.BYTE,
        "FLAG_POST_NORMS": modelfile.POST_NORMS,
        "FLAG_QK_NORM": modelfile.QK_NORM,
    }
    wrong = [(k, v, asm.get(k)) for k, v in want.items() if asm.get(k) != v]
    assert not wrong, f"(name, modelfile.py, format.asm): {wrong}"


def test_piece_record():
    asm = asm_constants()
    # modelfile.PIECE packs (blob_off, len, score, type), each 4 bytes, in that order
    assert modelfile.PIECE.format in ("<IIfI", b"<IIfI")
    want = {"PIECE_BLOB_OFF": 0, "PIECE_LEN": 4, "PIECE_SCORE": 8, "PIECE_TYPE": 12}
    wrong = [(k, v, asm.get(k)) for k, v in want.items() if asm.get(k) != v]
    assert not wrong, f"(name, modelfile.py, format.asm): {wrong}"
