"""asm/format.asm mirrors builder/models/modelfile.py: every header offset, the magic, the version,
the sizes and alignments, the header flags, the piece record fields and the piece types. And the
other facts asm/ and Python share, or asm/ states twice: the dimension limits (model.asm's
dim_bits, modelfile.DIM_LIMITS), the buffers' sizes, the GEGLU table's offsets."""
from __future__ import annotations

import math

import numpy as np

from builder.models import modelfile
from emu_tests.asm_facts import bytes_after, constant, constants_in
from emu_tests.harness import load_elf


def asm_constants() -> dict[str, int]:
    """The constants asm/format.asm defines."""
    return constants_in("asm/format.asm")


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
        "FLAG_Q8_0": modelfile.Q8_0,
        "QK8_0": modelfile.QK8_0,
        "Q8_0_BLOCK": modelfile.Q8_0_BLOCK,
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


def test_dimension_limits_are_the_engines():
    """modelfile.DIM_LIMITS (what Dims.check accepts) is what load_model accepts: dim_bits,
    one entry per u32 field from vocab on, in header order (then 31 for the three floats)."""
    bits = bytes_after("dim_bits")
    start = [name for name, _, _ in modelfile.HEADER_FIELDS].index("vocab")
    fields = [(name, off, code) for name, off, code in modelfile.HEADER_FIELDS[start:start + len(bits)]]
    assert [off for _, off, _ in fields] == [constant("HDR_VOCAB") + 4 * i for i in range(len(bits))]
    got = {name: 1 << b for (name, _, code), b in zip(fields, bits) if code == "I"}
    assert got == modelfile.DIM_LIMITS, f"dim_bits gives {got}, modelfile.DIM_LIMITS {modelfile.DIM_LIMITS}"
    assert [b for (_, _, code), b in zip(fields, bits) if code == "f"] == [31, 31, 31]


def test_buffers_have_their_constants_size(gemma):
    """vars.asm reserves the buffers with literal sizes; the constants the code uses for them
    must match (and the code's shortcuts must hold: put_byte tests bit 8 of the length,
    main.asm sets DEFAULT_CTX with `mov ah`)."""
    sizes = {name: gemma.symbols[name]["size"] for name in ("out_buf", "cpu_mask")}
    assert sizes == {"out_buf": constant("OUT_BUF_SIZE"), "cpu_mask": constant("CPU_MASK_BYTES")}
    assert constant("OUT_BUF_SIZE") == 1 << 8
    assert constant("DEFAULT_CTX") % 256 == 0 and constant("DEFAULT_CTX") < 1 << 16
    assert constant("BLOCK") == 1 << constant("BLOCK_SHIFT")


def test_geglu_table_offsets(gemma):
    """kernels.asm's GC_* offsets (from gelu_c) name the right entries of geglu's table in the
    shipped bytes: softmax's log2(e) (float32, rounded to nearest), c = -2 sqrt(2/pi) log2(e),
    kappa and the clamp bounds +-126 in four lanes each, 16-byte aligned (SSE memory operands), then 1.0 in four lanes, its last lane c0 of
    p's coefficients c0 = 1 .. c6 as single floats."""
    image = load_elf(gemma.elf, gemma.symbols)
    base = gemma.symbols["gelu_c"]["address"]
    lanes = {name: np.frombuffer(image.read(base + constant(name), 16), "<f4")
             for name in ("GC_LOG2E", "GC_C", "GC_KAPPA", "GC_MAX", "GC_MIN", "GC_ONE")}
    assert all((v == v[0]).all() for v in lanes.values()), lanes
    assert {k: float(v[0]) for k, v in lanes.items() if k != "GC_C"} == {
        "GC_LOG2E": float(np.float32(math.log2(math.e))),
        "GC_KAPPA": float(np.float32(0.044715)), "GC_MAX": 126.0, "GC_MIN": -126.0, "GC_ONE": 1.0}
    assert abs(lanes["GC_C"][0] - -2 * math.sqrt(2 / math.pi) / math.log(2)) < 1e-6
    assert all((base + constant(name)) % 16 == 0 for name in lanes)
    c = np.frombuffer(image.read(base + constant("GC_C0"), 7 * 4), "<f4")
    assert c[0] == 1.0 and abs(c[1] - math.log(2)) < 1e-4 and (np.diff(c) < 0).all()  # 2^f's fit
