"""asm/format.asm mirrors builder/models/modelfile4.py (version 4, what the engine reads): every
header offset, the magic, the version, the sizes and alignments, the header flag, the slot and
op records' fields, the opcodes and weight types, the piece record fields and the piece types.
And the other facts asm/ and Python share, or asm/ states twice: the buffers' sizes, the GEGLU
table's offsets."""
from __future__ import annotations

import math

import numpy as np

from builder.models import modelfile, modelfile3, modelfile4
from builder.cli import ENGINE_OPS
from emu_tests.asm_facts import constant, constants_in
from emu_tests.harness import load_elf


def asm_constants() -> dict[str, int]:
    """The constants asm/format.asm defines."""
    return constants_in("asm/format.asm")


def test_header_offsets():
    asm = asm_constants()
    want = {f"HDR_{name.upper()}": off for name, off, _ in modelfile4.HEADER_FIELDS}
    got = {k: v for k, v in asm.items() if k.startswith("HDR_")}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"format.asm lacks {missing}"
    assert not extra, f"format.asm has fields modelfile.py does not: {extra}"
    wrong = [(k, want[k], got[k]) for k in want if got[k] != want[k]]
    assert not wrong, f"(name, modelfile4.py, format.asm): {wrong}"


def test_op_record_and_opcodes():
    """OP_* offsets are modelfile4.OP_FIELDS' (the four slot bytes from OP_S0); OPC_* the
    opcodes the engine runs (builder.cli.ENGINE_OPS: 1 .. N_OPCODES, every other opcode
    refused); SLOT_* the slot record's."""
    asm = asm_constants()
    fields = {name: off for name, off, _ in modelfile4.OP_FIELDS}
    want = {f"OP_{name.upper()}": off for name, off in fields.items() if name not in ("s1", "s2", "s3")}
    assert [fields[f"s{i}"] for i in range(4)] == [fields["s0"] + i for i in range(4)]
    want |= {f"OPC_{op.name}": int(op) for op in ENGINE_OPS} | {"N_OPCODES": len(ENGINE_OPS)}
    want |= {f"WT_{t.name}": int(t) for t in modelfile4.WType}
    want |= {"SLOT_WIDTH": 0, "SLOT_FLAGS": 4, "SLOT_CACHE": modelfile4.CACHE, "OPF_ACC": modelfile4.ACC,
             "MAX_WIDTH": modelfile4.MAX_WIDTH}
    assert [name for name, _, _ in modelfile4.SLOT_FIELDS] == ["width", "flags"]
    wrong = [(k, v, asm.get(k)) for k, v in want.items() if asm.get(k) != v]
    assert not wrong, f"(name, modelfile4.py, format.asm): {wrong}"
    assert sorted(ENGINE_OPS) == list(range(1, len(ENGINE_OPS) + 1))
    assert not {f"OPC_{op.name}" for op in modelfile4.Op if op not in ENGINE_OPS} & set(asm)


def test_scalars():
    asm = asm_constants()
    want = {
        "MODEL_MAGIC": int.from_bytes(modelfile.MAGIC, "little"),
        "MODEL_VERSION": modelfile4.VERSION,
        "HEADER_SIZE": modelfile.HEADER_SIZE,
        "PIECE_REC": modelfile.PIECE_REC,
        "SLOT_REC": modelfile4.SLOT_REC,
        "OP_REC": modelfile4.OP_REC,
        "MERGE_REC": modelfile3.MERGE_REC,
        "FLAG_MERGES": modelfile3.MERGES,
        "TENSOR_ALIGN": modelfile.TENSOR_ALIGN,
        "WEIGHTS_ALIGN": modelfile.WEIGHTS_ALIGN,
        "PIECE_NORMAL": modelfile.NORMAL,
        "PIECE_UNKNOWN": modelfile.UNKNOWN,
        "PIECE_CONTROL": modelfile.CONTROL,
        "PIECE_USER": modelfile.USER_DEFINED,
        "PIECE_UNUSED": modelfile.UNUSED,
        "PIECE_BYTE": modelfile.BYTE,
        "QK8_0": modelfile.QK8_0,
        "Q8_0_BLOCK": modelfile.Q8_0_BLOCK,
    }
    wrong = [(k, v, asm.get(k)) for k, v in want.items() if asm.get(k) != v]
    assert not wrong, f"(name, modelfile4.py, format.asm): {wrong}"


def test_piece_record():
    asm = asm_constants()
    # modelfile.PIECE packs (blob_off, len, score, type), each 4 bytes, in that order
    assert modelfile.PIECE.format in ("<IIfI", b"<IIfI")
    want = {"PIECE_BLOB_OFF": 0, "PIECE_LEN": 4, "PIECE_SCORE": 8, "PIECE_TYPE": 12}
    wrong = [(k, v, asm.get(k)) for k, v in want.items() if asm.get(k) != v]
    assert not wrong, f"(name, modelfile.py, format.asm): {wrong}"


def test_buffers_have_their_constants_size(gemma):
    """vars.asm reserves the buffers with literal sizes; the constants the code uses for them
    must match (and the code's shortcuts must hold: put_byte tests the sign of the length's
    low byte, main.asm sets DEFAULT_CTX with `mov ah`; out_buf also holds two struct stats,
    the --logits file's at LOGITS_STAT)."""
    sizes = {name: gemma.symbols[name]["size"] for name in ("out_buf", "cpu_mask")}
    assert sizes["cpu_mask"] == constant("CPU_MASK_BYTES")
    assert constant("OUT_BUF_SIZE") == 1 << 7
    stat_bytes = 144                    # struct stat on x86-64
    assert sizes["out_buf"] >= max(constant("OUT_BUF_SIZE"), constant("LOGITS_STAT") + stat_bytes)
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


def test_op_table_is_the_readers_rules(gemma):
    """program.asm's op_table (each opcode's slot operands as width codes and flags, its
    weight's kind), read from the shipped image, states what modelfile4.RULES, ALIGN4 and DISTINCT
    say: on an op of distinct n, m, k (3, 5, 7) and slots 1 .. 4, the same operands, widths, CACHE
    requirements, GEGLU alignment and weight shape; only MATMUL's gate may be slot 0, only
    ROPE's s1 may be empty, and exactly the DISTINCT ops' operands after s0 must name a slot no
    operand before them names."""
    image = load_elf(gemma.elf, gemma.symbols)
    table = image.read(gemma.symbols["op_table"]["address"], 8 * len(ENGINE_OPS))
    n, m, k, vocab = 3, 5, 7, 11
    width = {constant("OPW_N"): n, constant("OPW_M"): m, constant("OPW_NM"): n * m, constant("OPW_NK"): n * k}
    kinds = {0: None, constant("WK_VEC"): (n,), constant("WK_HALF"): (n // 2,), constant("WK_MAT"): (m, n),
             constant("WK_TABLE"): (vocab, k), constant("WK_OUT"): (vocab, n)}
    for op in sorted(ENGINE_OPS):
        row = table[8 * (op - 1):8 * op]
        o = modelfile4.OpRec(int(op), 1, 2, 3, 4, n=n, m=m, k=k)
        rule = modelfile4.RULES[op]
        want = {f: (w, kv, (op, f) in modelfile4.ALIGN4) for f, w, kv in rule.slots(o)}
        got = {f"s{i}": (width[c & 7], bool(c & constant("OPW_KV")), bool(c & constant("OPW_ALIGN4")))
               for i, c in enumerate(row[:4]) if c & 7}
        assert got == want, f"{op.name}: op_table {got}, modelfile4 {want}"
        optional = {f"s{i}" for i, c in enumerate(row[:4]) if c & constant("OPW_OPTIONAL")}
        empty = {f"s{i}" for i, c in enumerate(row[:4]) if c & constant("OPW_EMPTY")}
        assert optional == ({"s2"} if op == modelfile4.Op.MATMUL else set()), op.name
        assert empty == ({"s1"} if op == modelfile4.Op.ROPE else set()), op.name
        apart = {f"s{i}" for i, c in enumerate(row[:4]) if c & constant("OPW_APART")}
        assert apart == (set(want) - {"s0"} if op in modelfile4.DISTINCT else set()), op.name
        shape = rule.weight(o, vocab) if rule.weight else None
        assert kinds[row[4]] == shape, f"{op.name}: op_table's weight {kinds[row[4]]}, modelfile4 {shape}"
