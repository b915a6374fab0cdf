"""builder.models.modelfile4 (model file version 4) and builder.models.program (its compiler):
the byte layout is the one docs/format.md ("Version 4") fixes (slots numbered from 1, the
header's offsets before its sizes), files round-trip (slots, ops, strings, the tokenizer and
every weight equal to version 3's of the same checkpoint), weights lie in the order the program
first reads them, each generation's program has the page's shape, and the reader refuses each
rule's violation with one clear line while it accepts the file unchanged and what the rules
allow (any scalar bits, anything in a field an op does not use, any generation and header
padding)."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

from builder.models import modelfile4 as mf4
from builder.models import program
from builder.models.modelfile import ModelFormatError
from builder.models.modelfile3 import ModelFile3, Rope
from builder.models.modelfile4 import ACC, CACHE, HEADER_FIELDS, OP_FIELDS, OP_REC, SLOT_REC, ModelFile4, Op, OpRec
from builder.models.synth4 import PRESETS4, gemma4_preset
from modelfiles import convert_fixture, fixture_path

FIXTURES = ("tiny_mqa", "tiny_wide", "tiny_g2", "tiny_g3", "tiny_g4", "tiny_g4k", "tiny_g4moe")


def test_format_md_tables():
    """docs/format.md, "Version 4": its header table and its op record table are the code's."""
    codes = {"8 bytes": "8s", "u8": "B", "u32": "I", "f32": "f", "u64": "Q"}
    text = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text().split("## Version 4", 1)[1]
    rows = lambda t: [(n, int(o), codes[c]) for o, n, c in re.findall(r"^\| (\d+) \| (\w+) \| ([\w ]+?) \|", t, re.M)]  # noqa: E731
    assert rows(text.split("### Header (version 4)", 1)[1].split("###", 1)[0]) == HEADER_FIELDS
    assert rows(text.split("### Op records", 1)[1].split("###", 1)[0]) == OP_FIELDS


def test_layout_is_the_contracts():
    """The numbers of the format's page, written out here: header offsets, record layouts,
    opcodes, weight types, flags (the engine is written against the same numbers)."""
    header = dict(magic=0, version=8, header_size=12, vocab=16, max_ctx=20, flags=24, bos=28, eos=32, eot=36,
                  byte_base=40, n_index=44, n_user=48, n_merges=52, max_piece_len=56, n_slots=60, n_ops=64,
                  generation=68, slots_off=72, program_off=80, strings_off=88, pieces_off=96, index_off=104,
                  user_off=112, merges_off=120, blob_off=128, weights_off=136, strings_size=144, blob_size=152,
                  weights_size=160, file_size=168)
    assert {n: o for n, o, _ in HEADER_FIELDS} == header
    assert {n: (o, c) for n, o, c in OP_FIELDS} == dict(
        op=(0, "I"), s0=(4, "B"), s1=(5, "B"), s2=(6, "B"), s3=(7, "B"), n=(8, "I"), m=(12, "I"), k=(16, "I"),
        j=(20, "I"), a=(24, "f"), c=(28, "f"), w=(32, "Q"), wtype=(40, "I"), flags=(44, "I"))
    assert (OP_REC, SLOT_REC, mf4.STRING_REC, mf4.N_STRINGS, mf4.STRING_MAX) == (48, 8, 8, 5, 256)
    assert {o.name: int(o) for o in Op} == dict(EMBED=1, NORM=2, MATMUL=3, ROPE=4, ATTN=5, GEGLU=6, SCALE=7, ADD=8,
                                                LOGITS=9, ROUTE=10, SKIP=11, WADD=12)
    assert (mf4.WType.F32, mf4.WType.F16, mf4.WType.Q8_0, CACHE, ACC, mf4.HEADER_FLAGS) == (0, 1, 2, 1, 1, 8)
    assert (mf4.MAX_SLOTS, mf4.MAX_OPS, mf4.MAX_WIDTH, mf4.BLOCK) == (255, 65536, 65536, 64)
    assert OpRec(3, 1, 2, 3, 4, 5, 6, 7, 8, 1.5, 2.5, 64, 1, 1).pack() == struct.pack(
        "<I4B4I2fQ2I", 3, 1, 2, 3, 4, 5, 6, 7, 8, 1.5, 2.5, 64, 1, 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (version 4 file, version 3 file) of each fixture, from its Hugging Face directory."""
    out = tmp_path_factory.mktemp("v4")
    return {n: (convert_fixture(n, "hf", out, 4), convert_fixture(n, "hf", out, 3)) for n in FIXTURES}


def rows(v3: ModelFile3, name: str, start: int, count: int) -> np.ndarray:
    """Rows start .. start + count - 1 of a version 3 tensor's bytes (rows over its leading
    dimensions)."""
    raw = v3.raw(name)
    size = raw.size // int(np.prod(v3._layout[name].shape[:-1]))
    return raw[start * size:(start + count) * size]


@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip(files, name):
    """The file holds the compiled program, the generation's strings, version 3's tokenizer, and
    version 3's weights byte for byte (the compiler's own tensors: the rope tables, the ones; a
    MoE layer's route, its router's rows then its expert scales)."""
    v4, v3 = ModelFile4(files[name][0]), ModelFile3(files[name][1])
    gen = {"tiny_g2": 2, "tiny_g3": 3, "tiny_g4": 4, "tiny_g4k": 4, "tiny_g4moe": 4}.get(name, 1)
    prog = program.compile_program(v3.model, [Rope()] * len(v3.model.layers), gen)
    assert v4.ops == [o for o in prog.ops] and v4.slots == prog.slots and v4.header.generation == gen
    assert v4.strings == list(mf4.CHAT[gen])
    for field in ("pieces", "scores", "types", "index", "user", "merges", "merge_scores"):
        assert np.array_equal(np.asarray(getattr(v4, field)), np.asarray(getattr(v3, field))), field
    for spec in prog.specs:
        got = np.frombuffer(v4._map, np.uint8, spec.nbytes, v4.header.weights_off + spec.offset)
        if spec.name == "ones":
            assert np.array_equal(got.view("<f4"), np.ones(spec.shape[0], np.float32))
        elif spec.name in prog.parts:
            assert np.array_equal(got, np.concatenate([rows(v3, *part) for part in prog.parts[spec.name]])), spec.name
        else:
            assert np.array_equal(got, v3.raw(spec.name)), spec.name


@pytest.mark.parametrize("name", FIXTURES)
def test_weights_lie_in_first_read_order(files, name):
    """Each op's weight lies inside one tensor; the tensors, in file order, are those the ops
    first read, in that order, and every one is read."""
    f, v3 = ModelFile4(files[name][0]), ModelFile3(files[name][1])
    specs = program.compile_program(v3.model, [Rope()] * len(v3.model.layers), f.header.generation).specs
    order: list[str] = []
    for o in f.ops:
        if mf4.RULES[Op(o.op)].weight is None:
            continue
        end = o.w + mf4.weight_bytes(f.weight_shape(o), o.wtype)
        spec = next(s for s in specs if s.offset <= o.w < s.offset + s.nbytes)
        assert end <= spec.offset + spec.nbytes, f"{name}: op reads past tensor {spec.name}"
        order += [spec.name] * (spec.name not in order)
    assert order == [s.name for s in specs]


def opcodes(f: ModelFile4, first: int, count: int) -> str:
    return " ".join(f"{Op(o.op).name}{'+' if o.flags & ACC else ''}{'*' if o.op == Op.MATMUL and o.s2 else ''}"
                    for o in f.ops[first:first + count])


def test_each_generation_has_the_pages_program(files):
    """One layer of each generation, by opcode (+: ACC, *: the product with GEGLU)."""
    layer1 = "NORM MATMUL MATMUL MATMUL ROPE ATTN MATMUL+ NORM MATMUL MATMUL* MATMUL+"
    assert opcodes(ModelFile4(files["tiny_mqa"][0]), 1, 11) == layer1
    g2 = ModelFile4(files["tiny_g2"][0])
    assert opcodes(g2, 1, 13) == "NORM MATMUL MATMUL MATMUL ROPE ATTN MATMUL NORM+ NORM MATMUL MATMUL* MATMUL NORM+"
    assert opcodes(g2, 0, 1) == "EMBED" and opcodes(g2, len(g2.ops) - 2, 2) == "NORM LOGITS"
    g3 = ModelFile4(files["tiny_g3"][0])
    assert opcodes(g3, 1, 7) == "NORM MATMUL MATMUL MATMUL NORM NORM ROPE"
    # tiny_g4k: a full layer with k = v (no wv: the values are the key projection, normed first)
    g4k = ModelFile4(files["tiny_g4k"][0])
    full = [i for i, o in enumerate(g4k.ops) if o.op == Op.ATTN][2]
    assert opcodes(g4k, full - 7, 8) == "NORM MATMUL MATMUL NORM NORM NORM ROPE ATTN"
    v = g4k.ops[full - 3]
    assert (v.s0, v.s1) == (g4k.ops[full].s3, g4k.ops[full].s2)  # V <- norm(K), ones


def test_a_moe_layer_has_the_pages_program(files):
    """tiny_g4moe (E 4, top 2, d 64, I 32): the dense FFN's product left in hb2, the router on
    n(x) router_scale d^-0.5, then each expert in order behind a SKIP of its four ops, the block
    of gate rows, of up rows (GEGLU), of down rows, the weighted add; the two FFNs' norms."""
    f = ModelFile4(files["tiny_g4moe"][0])
    first = find(f, Op.ROUTE) - 7
    expert = "SKIP MATMUL MATMUL* MATMUL WADD"
    assert opcodes(f, first, 10 + 4 * 5 + 2) == ("NORM MATMUL MATMUL* MATMUL NORM NORM SCALE ROUTE NORM SCALE "
                                                    + " ".join([expert] * 4) + " NORM+ NORM+")
    down, mm, r, scale, route, h2, zero = f.ops[first + 3:first + 10]
    skips = [i for i, o in enumerate(f.ops) if o.op == Op.SKIP][:4]
    assert (scale.a, scale.s0, scale.n) == (np.float32(64 ** -0.5), r.s0, 64) and (zero.a, zero.n) == (0.0, 64)
    assert (route.s1, route.n, route.m, route.k, route.wtype) == (r.s0, 4, 64, 2, mf4.WType.F32)
    assert (mm.s1, r.s1, h2.s1) == (down.s0, 1, 1) and down.s0 != 1 and not down.flags
    gate_up = f.ops[skips[0] + 1].w
    for e, i in enumerate(skips):
        skip, gate, up, out, wadd = f.ops[i:i + 5]
        assert (skip.s0, skip.n, skip.j, skip.k) == (route.s0, 4, e, 4)
        assert (gate.w, up.w) == (gate_up + 2 * e * 32 * 64 * 2, gate_up + (2 * e + 1) * 32 * 64 * 2)
        assert (gate.s1, up.s1, up.s2, gate.s0, out.s1, out.n, out.m) == (h2.s0, h2.s0, gate.s0, gate.s0, gate.s0, 32, 64)
        assert (wadd.s0, wadd.s1, wadd.s2, wadd.n, wadd.m, wadd.j) == (zero.s0, out.s0, route.s0, 64, 4, e)
    acc2, acc = f.ops[skips[-1] + 5:skips[-1] + 7]
    assert (acc2.s0, acc2.s1, acc.s0, acc.s1) == (mm.s0, zero.s0, 1, mm.s0)


# ---- the rules, one mutation each --------------------------------------------------------------

@pytest.fixture(scope="module")
def base(files):
    """tiny_g4's version 4 file (every opcode: PLE, KV sharing, layer scalars) and its ops."""
    path = files["tiny_g4"][0]
    return path, ModelFile4(path)


@pytest.fixture(scope="module")
def moe_base(files):
    """tiny_g4moe's version 4 file (ROUTE, SKIP, WADD) and its ops."""
    path = files["tiny_g4moe"][0]
    return path, ModelFile4(path)


def find(f: ModelFile4, op: Op, pred=lambda o: True) -> int:
    return next(i for i, o in enumerate(f.ops) if o.op == op and pred(o))


def with_op(f: ModelFile4, i: int, **fields) -> dict:
    """An edit: op i's record with fields changed."""
    o = f.ops[i]
    return {f.header.program_off + OP_REC * i: OpRec(**{**o.__dict__, **fields}).pack()}


def with_slot(f: ModelFile4, s: int, width: int | None = None, flags: int | None = None) -> dict:
    """An edit: slot s's record (slots count from 1)."""
    old = f.slots[s - 1]
    return {f.header.slots_off + SLOT_REC * (s - 1): struct.pack("<II", old.width if width is None else width,
                                                                  old.flags if flags is None else flags)}


def with_header(f: ModelFile4, **fields) -> dict:
    out = {}
    for name, off, code in HEADER_FIELDS:
        if name in fields:
            out[off] = struct.pack("<" + code, fields[name])
    return out


def with_string(f: ModelFile4, i: int, off: int, n: int) -> dict:
    return {f.header.strings_off + 8 * i: struct.pack("<II", off, n)}


def edited(path: Path, tmp_path: Path, edits: dict) -> Path:
    data = bytearray(path.read_bytes())
    for off, raw in edits.items():
        data[off:off + len(raw)] = raw
    (tmp_path / "m.bin").write_bytes(bytes(data))
    return tmp_path / "m.bin"


EMBED_PLE = (Op.EMBED, lambda o: o.n == 16)
MATMUL = (Op.MATMUL, lambda o: o.s2 == 0 and not o.flags)
GEGLU_MM = (Op.MATMUL, lambda o: o.s2 != 0)
ROPE_KV = (Op.ROPE, lambda o: o.k > 0)
ROPE_Q = (Op.ROPE, lambda o: o.k == 0)
NAN, INF = float("nan"), float("inf")
LOGITS_LAST_W = (1576896 - 2048 * 64 * 2) // 64 * 64  # the last place [vocab, n] F16 fits in tiny_g4's weights

REFUSED = [  # (op to edit (opcode, which), fields, what the message says): one per rule of the page
    # an opcode is known
    ((Op.EMBED,), dict(op=0), "unknown opcode 0"),
    ((Op.EMBED,), dict(op=13), "unknown opcode 13"),
    ((Op.NORM,), dict(op=0xFFFFFFFF), "unknown opcode 4294967295"),
    # every slot operand an op reads is 1 .. n_slots (0 is none: only MATMUL's gate may be)
    (MATMUL, dict(s1=0), "s1 names slot 0; the file has slots 1 .. 18"),
    (MATMUL, dict(s0=19), "s0 names slot 19; the file has slots 1 .. 18"),
    (MATMUL, dict(s0=255), "s0 names slot 255"),
    (GEGLU_MM, dict(s2=19), "s2 names slot 19"),
    (ROPE_Q, dict(s1=0), "s1 names slot 0"),            # ROPE's s1 is a slot even with k = 0
    ((Op.ATTN,), dict(s3=0), "s3 names slot 0"),
    ((Op.ADD,), dict(s1=19), "s1 names slot 19"),
    ((Op.LOGITS,), dict(s1=0), "s1 names slot 0"),
    # ... at a width that fits the slot: EMBED n; NORM n m; MATMUL m, n, m; ROPE n m, n k; ATTN n m, n k; ...
    ((Op.EMBED,), dict(n=128), "s0 is 128 wide, slot 1 holds 64"),
    ((Op.NORM,), dict(m=2), "s1 is 128 wide, slot 1 holds 64"),
    (MATMUL, dict(m=132), "s0 is 132 wide, slot 3 holds 128"),
    (MATMUL, dict(n=129), "s1 is 129 wide, slot 2 holds 128"),
    (GEGLU_MM, dict(s2=8), "s2 is 128 wide, slot 8 holds 16"),
    (ROPE_KV, dict(k=2), "s1 is 32 wide, slot 9 holds 16"),
    ((Op.ATTN,), dict(k=2), "s2 is 32 wide, slot 9 holds 16"),
    ((Op.GEGLU,), dict(n=20), "s0 is 20 wide, slot 8 holds 16"),
    ((Op.LOGITS,), dict(n=256), "s1 is 256 wide, slot 2 holds 128"),
    # ... and not empty (but ROPE's s1)
    ((Op.EMBED,), dict(n=0), "s0 is 0 wide"),
    ((Op.NORM,), dict(m=0), "s0 is 0 wide"),
    (MATMUL, dict(n=0), "s1 is 0 wide"),
    (ROPE_KV, dict(n=0), "s0 is 0 wide"),
    ((Op.ATTN,), dict(k=0), "s2 is 0 wide"),
    ((Op.SCALE,), dict(n=0), "s0 is 0 wide"),
    ((Op.ADD,), dict(n=0), "s0 is 0 wide"),
    # a gated MATMUL's m (its gate's rows) and GEGLU's n are multiples of 4
    (GEGLU_MM, dict(m=126), "s2 is 126 wide, not a multiple of 4"),
    ((Op.GEGLU,), dict(n=14), "s0 is 14 wide, not a multiple of 4"),
    # MATMUL's and ATTN's operands are distinct slots (threads write one while others read another)
    (MATMUL, dict(s0=2), "s1 names slot 2, as an operand before it does"),
    (GEGLU_MM, dict(s2=2), "s2 names slot 2, as an operand before it does"),
    (GEGLU_MM, dict(s2=5), "s2 names slot 5, as an operand before it does"),
    ((Op.ATTN,), dict(s1=2), "s1 names slot 2, as an operand before it does"),
    ((Op.ATTN,), dict(m=1, s0=9), "s2 names slot 9, as an operand before it does"),
    ((Op.ATTN,), dict(m=1, s0=10), "s3 names slot 10, as an operand before it does"),
    ((Op.ATTN,), dict(s3=9), "s3 names slot 9, as an operand before it does"),
    # ATTN's K and V are CACHE slots an earlier op wrote
    ((Op.ATTN,), dict(s2=1), "s2 (slot 1) must be a CACHE slot"),
    ((Op.ATTN,), dict(s3=5), "s3 (slot 5) must be a CACHE slot"),
    ((Op.ATTN,), dict(s2=11), "s2 (slot 11) is a cache no earlier op writes"),
    ((Op.ATTN,), dict(s3=12), "s3 (slot 12) is a cache no earlier op writes"),
    # a weight of a type its op takes (F32 vectors; F16 or Q8_0 matrices), Q8_0 in whole blocks
    ((Op.EMBED,), dict(wtype=0), "weight type 0 is not one of [1, 2]"),
    ((Op.NORM,), dict(wtype=1), "weight type 1 is not one of [0] (F32)"),
    (MATMUL, dict(wtype=0), "weight type 0 is not one of [1, 2]"),
    (ROPE_KV, dict(wtype=2), "weight type 2 is not one of [0] (F32)"),
    ((Op.LOGITS,), dict(wtype=3), "weight type 3 is not one of [1, 2]"),
    ((Op.MATMUL, lambda o: o.n == 16), dict(wtype=2), "a Q8_0 weight needs rows of a multiple of 32 values, not 16"),
    # ... at a multiple of 64, inside the weights (LOGITS': [vocab, n], its m ignored)
    ((Op.NORM,), dict(w=1), "weight offset 0x1 is not a multiple of 64"),
    ((Op.LOGITS,), dict(w=32), "weight offset 0x20 is not a multiple of 64"),
    ((Op.NORM,), dict(w=1 << 40), "past the weights"),
    ((Op.EMBED,), dict(k=65536), "weight [2048, 65536] at 0x0 ends at 0x10000000, past the weights"),
    ((Op.LOGITS,), dict(w=LOGITS_LAST_W + 64, m=0),
     f"weight [2048, 64] at {LOGITS_LAST_W + 64:#x} ends at {LOGITS_LAST_W + 64 + 0x40000:#x}, past the weights"),
    # what the handlers assume: EMBED's k 1 .. 65536 and columns inside it (Q8_0: whole blocks),
    # ROPE's n even, ATTN's k dividing m
    ((Op.EMBED,), dict(k=0), "k = 0 is out of range (1 .. 65536)"),
    ((Op.EMBED,), dict(j=1), "columns j .. j + n - 1 (1 .. 64) are outside the table's k = 64"),
    (EMBED_PLE, dict(wtype=2), "a Q8_0 table's columns need j and n multiples of 32 (j 0, n 16)"),
    (ROPE_KV, dict(n=15), "n = 15 is odd"),
    ((Op.ATTN,), dict(n=8, m=3, k=2), "m = 3 query heads is not a multiple of k = 2 kv heads"),
    # LOGITS is the last op, and only there
    ((Op.LOGITS,), dict(op=int(Op.SCALE), s0=2), "the program's last op must be LOGITS"),
    ((Op.SCALE,), dict(op=int(Op.LOGITS), s1=7, w=0, wtype=1), "LOGITS must be the program's last op, and only there"),
]


LAST_SKIP = (Op.SKIP, lambda o: o.j == 3)
MOE_REFUSED = [  # the experts' ops' rules, on tiny_g4moe (slot 10: wts, 4 wide; slot 9: r, 64 wide)
    # ROUTE: s0 at width n, s1 at m; n a multiple of 4; 1 <= k <= n; an F32 weight of n m + n values
    ((Op.ROUTE,), dict(n=8), "s0 is 8 wide, slot 10 holds 4"),
    ((Op.ROUTE,), dict(m=65), "s1 is 65 wide, slot 9 holds 64"),
    ((Op.ROUTE,), dict(s0=0), "s0 names slot 0"),
    ((Op.ROUTE,), dict(n=2, k=1), "n = 2 experts is not a multiple of 4"),
    ((Op.ROUTE,), dict(k=0), "k = 0 is out of range (1 .. 4)"),
    ((Op.ROUTE,), dict(k=5), "k = 5 is out of range (1 .. 4)"),
    ((Op.ROUTE,), dict(wtype=1), "weight type 1 is not one of [0] (F32)"),
    ((Op.ROUTE,), dict(w=32), "weight offset 0x20 is not a multiple of 64"),
    ((Op.ROUTE,), dict(w=1 << 40), "past the weights"),
    ((Op.ROUTE,), dict(m=0), "s1 is 0 wide"),
    # SKIP: s0 at width n; j < n; k >= 1; the ops it skips inside the program, LOGITS not among them
    ((Op.SKIP,), dict(j=4), "column j = 4 is outside s0's n = 4"),
    ((Op.SKIP,), dict(n=5), "s0 is 5 wide, slot 10 holds 4"),
    ((Op.SKIP,), dict(s0=0), "s0 names slot 0"),
    ((Op.SKIP,), dict(k=0), "k = 0 skips no op"),
    (LAST_SKIP, lambda f, i: dict(k=len(f.ops) - 1 - i), "past the ops before LOGITS"),
    (LAST_SKIP, lambda f, i: dict(k=0xFFFFFFFF), "past the ops before LOGITS"),
    # WADD: s0, s1 at width n, s2 at m; j < m
    ((Op.WADD,), dict(j=4), "column j = 4 is outside s2's m = 4"),
    ((Op.WADD,), dict(m=5), "s2 is 5 wide, slot 10 holds 4"),
    ((Op.WADD,), dict(n=65), "s0 is 65 wide"),
    ((Op.WADD,), dict(s1=0), "s1 names slot 0"),
    ((Op.WADD,), dict(s2=0), "s2 names slot 0"),
    ((Op.WADD,), dict(m=0, j=0), "s2 is 0 wide"),
]


def assert_refused(base, tmp_path, which, fields, message) -> None:
    """Op `which` of base (path, file) with fields changed (a dict, or one made from the file and
    the op's index) is refused with one line naming the op and saying message."""
    path, f = base
    i = find(f, *which)
    fields = fields(f, i) if callable(fields) else fields
    with pytest.raises(ModelFormatError) as e:
        ModelFile4(edited(path, tmp_path, with_op(f, i, **fields)))
    assert message in str(e.value) and f"op {i} (" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("which, fields, message", REFUSED, ids=[f"{w[0].name}-{m[:40]}" for w, _, m in REFUSED])
def test_reader_refuses_each_op_rule(base, tmp_path, which, fields, message):
    assert_refused(base, tmp_path, which, fields, message)


@pytest.mark.parametrize("which, fields, message", MOE_REFUSED, ids=[f"{w[0].name}-{m[:40]}" for w, _, m in MOE_REFUSED])
def test_reader_refuses_each_moe_op_rule(moe_base, tmp_path, which, fields, message):
    assert_refused(moe_base, tmp_path, which, fields, message)


ALLOWED = [  # mutations the rules allow: the reader must accept them
    # an ungated MATMUL's rows need not be a multiple of 4 (d = 66 runs: only GEGLU takes fours)
    (MATMUL, dict(m=62)),
    # the scalars are data, any float32 bits
    ((Op.EMBED,), dict(a=NAN)),
    ((Op.NORM,), dict(a=0.0)),
    ((Op.NORM,), dict(a=-1e-6)),
    ((Op.NORM,), dict(a=INF)),
    ((Op.ATTN,), dict(a=NAN, c=-1.0)),
    ((Op.ATTN,), dict(a=0.0, c=INF)),
    ((Op.SCALE,), dict(a=NAN)),
    ((Op.LOGITS,), dict(c=NAN)),
    # a field an op does not use is ignored
    ((Op.EMBED,), dict(m=1, flags=ACC, s1=255, s2=1, c=1.0)),
    (MATMUL, dict(k=2, j=7, s3=3, a=NAN, c=-0.0)),
    (ROPE_KV, dict(j=1, flags=ACC, a=1.0, s2=200)),
    ((Op.ATTN,), dict(w=64, wtype=1, flags=ACC)),
    ((Op.GEGLU,), dict(m=7, k=9, j=3, a=1.0, w=65, wtype=9, flags=3, s2=200, s3=1)),
    ((Op.SCALE,), dict(s1=1, m=0xFFFFFFFF, c=NAN)),
    ((Op.LOGITS,), dict(s0=1, m=2047, k=5, a=NAN)),
    ((Op.LOGITS,), dict(m=0xFFFFFFFF)),
    ((Op.NORM,), dict(flags=2)),                # ACC is bit 0; the other bits are ignored
    # ACC wherever it is read: norms, products with or without the GEGLU gate
    ((Op.NORM,), dict(flags=ACC)),
    (MATMUL, dict(flags=ACC)),
    (GEGLU_MM, dict(flags=ACC)),
    # MATMUL's GEGLU gate is s2: off, or on at a slot m wide
    (GEGLU_MM, dict(s2=0)),
    (MATMUL, dict(s2=4)),
    (MATMUL, dict(s0=4)),                       # another slot wide enough
    (ROPE_KV, dict(k=0)),                       # q alone: s1 (still K) is not touched
    (ROPE_Q, dict(s1=18)),                      # ... and may name any slot
    ((Op.ATTN,), dict(j=0xFFFFFFFF)),           # any window
    ((Op.ATTN,), dict(s2=10, s3=9)),            # K and V swapped: both caches written before
    ((Op.EMBED,), dict(n=32, j=32)),            # columns 32 .. 63 of 64
    ((Op.NORM,), dict(w=0)),                    # offsets may repeat: the embedding's first bytes as a norm
    ((Op.LOGITS,), dict(w=LOGITS_LAST_W)),      # [vocab, n] at its last place
]


MOE_ALLOWED = [
    ((Op.ROUTE,), dict(k=4)),                   # every expert chosen
    ((Op.ROUTE,), dict(k=1, m=32)),             # one, from the first 32 floats of r
    ((Op.ROUTE,), dict(j=7, a=NAN, c=1.0, s2=255, s3=1, flags=ACC)),  # fields it does not use
    ((Op.SKIP,), dict(j=3, k=1)),
    ((Op.SKIP,), dict(n=1, j=0)),
    (LAST_SKIP, lambda f, i: dict(k=len(f.ops) - 2 - i)),             # up to the op before LOGITS
    ((Op.SKIP,), dict(m=9, a=NAN, c=NAN, s1=255, s2=1, s3=2, w=65, wtype=9, flags=3)),
    ((Op.WADD,), dict(j=3, m=4, n=32)),
    ((Op.WADD,), dict(s1=1)),                   # any slot wide enough: x
    ((Op.WADD,), dict(k=3, a=INF, c=NAN, s3=255, w=1, wtype=7, flags=ACC)),
]


def assert_accepted(base, tmp_path, which, fields) -> None:
    path, f = base
    i = find(f, *which)
    fields = fields(f, i) if callable(fields) else fields
    got = ModelFile4(edited(path, tmp_path, with_op(f, i, **fields))).ops[i]
    assert got.pack() == OpRec(**{**f.ops[i].__dict__, **fields}).pack()


@pytest.mark.parametrize("which, fields", ALLOWED, ids=[f"{w[0].name}-{list(x)}" for w, x in ALLOWED])
def test_reader_accepts_what_the_rules_allow(base, tmp_path, which, fields):
    assert_accepted(base, tmp_path, which, fields)


@pytest.mark.parametrize("which, fields", MOE_ALLOWED, ids=[f"{w[0].name}-{i}" for i, (w, _) in enumerate(MOE_ALLOWED)])
def test_reader_accepts_what_the_moe_rules_allow(moe_base, tmp_path, which, fields):
    assert_accepted(moe_base, tmp_path, which, fields)


def test_reader_accepts_the_file_unchanged(base):
    path, f = base
    assert len(f.ops) == f.header.n_ops == 208 and f.ops[-1].op == Op.LOGITS
    assert len(f.slots) == f.header.n_slots == 18


def test_header_bytes_at_the_pages_offsets(base):
    """The header's numbers read at the page's offsets (the section offsets, then the sizes), each
    where the section chain puts it: independent of HEADER_FIELDS."""
    path, _ = base
    data = path.read_bytes()

    def u32(off: int) -> int:
        return struct.unpack_from("<I", data, off)[0]

    def u64(off: int) -> int:
        return struct.unpack_from("<Q", data, off)[0]

    vocab, n_index, n_user, n_merges, n_slots, n_ops = u32(16), u32(44), u32(48), u32(52), u32(60), u32(64)
    assert (data[:8], u32(8), u32(12), vocab, n_slots, n_ops, u32(68)) == (b"GEMMAASM", 4, 256, 2048, 18, 208, 4)
    slots_off, program_off, strings_off, pieces_off, index_off, user_off, merges_off, blob_off, weights_off = (
        u64(72 + 8 * i) for i in range(9))
    strings_size, blob_size, weights_size, file_size = (u64(144 + 8 * i) for i in range(4))
    assert slots_off == 256 and program_off == slots_off + 8 * n_slots and strings_off == program_off + 48 * n_ops
    assert pieces_off == strings_off + strings_size and index_off == pieces_off + 16 * vocab
    assert user_off == index_off + 4 * n_index and merges_off == user_off + 4 * n_user
    assert blob_off == merges_off + 16 * n_merges and n_merges == 440
    assert weights_off == (blob_off + blob_size + 4095) // 4096 * 4096
    assert file_size == weights_off + weights_size == len(data)
    assert data[176:256] == bytes(80)


FILE_ALLOWED = [  # edits of the slots and the header the rules allow
    lambda f: with_header(f, generation=0),     # the generation is informational
    lambda f: with_header(f, generation=0xFFFFFFFF),
    lambda f: {176: b"\xff" * 80},              # the header's padding is not read
    lambda f: with_header(f, max_ctx=65536),
    lambda f: with_slot(f, 1, width=65536),
    lambda f: with_slot(f, 2, flags=CACHE),     # a plain slot may be a cache (rows by position)
]


@pytest.mark.parametrize("edit", FILE_ALLOWED, ids=range(len(FILE_ALLOWED)))
def test_reader_accepts_what_the_file_rules_allow(base, tmp_path, edit):
    path, f = base
    got = ModelFile4(edited(path, tmp_path, edit(f)))
    assert got.ops == f.ops


@pytest.mark.parametrize("edit, message", [
    (lambda f: with_slot(f, 1, width=0), "slot 1: width 0 is out of range (1 .. 65536)"),
    (lambda f: with_slot(f, 4, width=65537), "slot 4: width 65537 is out of range"),
    (lambda f: with_slot(f, 1, flags=2), "slot 1: flags 0x2 has unknown bits (known: 0x1)"),
    (lambda f: with_slot(f, 1, width=63), "s0 is 64 wide, slot 1 holds 63"),
    (lambda f: with_slot(f, 9, flags=0), "s2 (slot 9) must be a CACHE slot"),
    (lambda f: {0: b"GEMMAASN"}, "bad magic"),
    (lambda f: with_header(f, version=3), "unsupported version 3"),
    (lambda f: with_header(f, header_size=255), "header_size is 255"),
    (lambda f: with_header(f, n_slots=0), "n_slots = 0 is out of range (1 .. 255)"),
    (lambda f: with_header(f, n_slots=256), "n_slots = 256 is out of range (1 .. 255)"),
    (lambda f: with_header(f, n_ops=0), "n_ops = 0 is out of range (1 .. 65536)"),
    (lambda f: with_header(f, n_ops=65537), "n_ops = 65537 is out of range"),
    (lambda f: with_header(f, n_ops=207), "strings_off is"),
    (lambda f: with_header(f, n_slots=17), "program_off is"),
    (lambda f: with_header(f, flags=9), "flags 0x9 has unknown bits (known: 0x8)"),
    (lambda f: with_header(f, flags=0), "merges without the MERGES flag"),
    (lambda f: with_header(f, vocab=0), "vocab = 0 is out of range"),
    (lambda f: with_header(f, max_ctx=65537), "max_ctx = 65537 is out of range"),
    (lambda f: with_header(f, max_ctx=0), "max_ctx = 0 is out of range"),
    (lambda f: with_header(f, strings_size=f.header.strings_size + 8), "pieces_off is"),
    (lambda f: with_header(f, blob_size=f.header.blob_size + 4096), "weights_off is"),
    (lambda f: with_header(f, weights_size=f.header.weights_size - 64), "file_size is"),
    (lambda f: with_header(f, weights_size=f.header.weights_size - 64, file_size=f.header.file_size - 64),
     "but its header says"),
    (lambda f: with_header(f, bos=2048), "bos id 2048 is outside the vocabulary"),
    (lambda f: with_string(f, 0, f.header.strings_size - 3, 4), "string SYS_BEGIN (4 bytes at 117) ends past the "
     "strings section (120 bytes)"),
    (lambda f: with_string(f, 4, 100, 100), "string REPLY_END (100 bytes at 100) ends past"),
    (lambda f: with_string(f, 4, 0xFFFFFFFF, 1), "string REPLY_END (1 bytes at 4294967295) ends past"),
    (lambda f: with_string(f, 1, 0, 257), "string SYS_END is 257 bytes (at most 256)"),
    (lambda f: {f.header.merges_off: struct.pack("<I", 9999)}, "a merge holds an id outside the vocabulary"),
    (lambda f: {f.header.pieces_off + 12: struct.pack("<I", 9)}, "a piece has an unknown type"),
])
def test_reader_refuses_each_file_rule(base, tmp_path, edit, message):
    path, f = base
    with pytest.raises(ModelFormatError) as e:
        ModelFile4(edited(path, tmp_path, edit(f)))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", [n for n, _, _ in HEADER_FIELDS if n.endswith("_off")])
def test_reader_refuses_each_section_moved(base, tmp_path, name):
    """Each section offset is the end of the one before (8 bytes further is refused by name)."""
    path, f = base
    v = getattr(f.header, name)
    with pytest.raises(ModelFormatError) as e:
        ModelFile4(edited(path, tmp_path, with_header(f, **{name: v + 8})))
    assert f"{name} is {v + 8}, expected {v}" in str(e.value)


def test_the_writer_refuses_what_it_must_not_write(tmp_path):
    """pack_strings (what convert and synth write) refuses a string over 256 bytes, one not
    UTF-8, and a count other than 5; the reader checks only where they lie (below)."""
    with pytest.raises(ModelFormatError, match="string USER_END is 257 bytes"):
        mf4.pack_strings([b"", b"", b"", b"x" * 257, b""])
    with pytest.raises(ModelFormatError, match="string SYS_END is not UTF-8"):
        mf4.pack_strings([b"", b"\xff", b"", b"", b""])
    with pytest.raises(ModelFormatError, match="4 chat strings"):
        mf4.pack_strings([b""] * 4)


@pytest.mark.parametrize("edit, want", [
    (lambda f: {f.header.strings_off + 40: b"\xff"}, lambda f: b"\xff" + mf4.CHAT[4][0][1:]),   # not UTF-8
    (lambda f: with_string(f, 0, 0, 8), lambda f: struct.pack("<II", 0, 8)),                     # the records
    (lambda f: with_string(f, 0, f.header.strings_size, 0), lambda f: b""),                      # at the end
    (lambda f: with_string(f, 0, f.header.strings_size - 4, 4), lambda f: b"\0" * 4),            # the padding
])
def test_reader_takes_any_string_inside_the_section(base, tmp_path, edit, want):
    """The engine's rules and no more (docs/format.md, "Strings"): anywhere inside the section,
    the records' own bytes included, any bytes."""
    path, f = base
    assert f.header.strings_size == 120         # 40 + 75 string bytes + 5 of padding
    assert ModelFile4(edited(path, tmp_path, edit(f))).strings[0] == want(f)


def test_truncated_file_is_refused(base, tmp_path):
    path, _ = base
    (tmp_path / "t.bin").write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ModelFormatError, match="truncated"):
        ModelFile4(tmp_path / "t.bin")


# ---- the compiler's refusals ----------------------------------------------------------------------

def test_blocks_stored_apart():
    """A product that reads a tensor block by block (a layer's ple_proj rows, an expert's gate,
    up and down rows) reads it in place when a block's bytes are a multiple of 64, else each
    block as a tensor of its own (the tensor itself then not written): d = 36, P = 4, I = 4 in
    FP16 make blocks of 288 bytes. (test_program runs such a model.)"""
    model, ropes = gemma4_preset(vocab=512, dim=36, layers=2, heads=2, period=2, window=3, head_dim=(8, 16),
                                 kv_heads=(1, 1), ffn=16, max_ctx=64, ple_dim=4, experts=4, top_k=2, expert_ffn=4)
    prog = program.compile_program(model, ropes, 4)
    names = [s.name for s in prog.specs]
    assert [n for n in names if n.startswith("ple_proj")] == ["ple_proj.0", "ple_proj.1"]
    assert [n for n in names if ".experts_" in n and n.startswith("layers.1.")] == (
        [x for e in range(4) for x in (f"layers.1.experts_gate_up.{2 * e}", f"layers.1.experts_gate_up.{2 * e + 1}",
                                       f"layers.1.experts_down.{e}")])
    assert prog.parts["layers.1.experts_gate_up.5"] == [("layers.1.experts_gate_up", 20, 4)]
    assert prog.parts["layers.1.experts_down.3"] == [("layers.1.experts_down", 108, 36)]
    assert prog.parts["layers.0.route"] == [("layers.0.router", 0, 4), ("layers.0.expert_scale", 0, 1)]
    assert {s.name for s in prog.stored} >= {"ple_proj", "layers.0.router", "layers.0.experts_down"}
    assert all(o.w % 64 == 0 for o in prog.ops)
    # the published MoE shape's blocks are read in place: no block is a tensor of its own
    model, ropes = PRESETS4["g4-26b-a4b"]
    assert not program.compile_program(model, ropes, 4).parts.keys() - {f"layers.{i}.route" for i in range(30)}


def test_a_model_of_another_generation_is_refused():
    model, ropes = PRESETS4["tiny-g4-dense"]
    with pytest.raises(ModelFormatError, match="layer 0 is not a Gemma 3 layer"):
        program.compile_program(model, ropes, 3)
    with pytest.raises(ModelFormatError, match="generation 5 is not 1 .. 4"):
        program.compile_program(model, ropes, 5)


def test_too_many_layers_for_the_slots():
    model, ropes = gemma4_preset(vocab=512, dim=32, layers=130, heads=2, period=2, window=3, head_dim=(8, 16),
                                 kv_heads=(1, 1), ffn=16, max_ctx=64)
    with pytest.raises(ModelFormatError, match="the program needs 265 slots, at most 255 fit"):
        program.compile_program(model, ropes, 4)


# ---- the command lines --------------------------------------------------------------------------

def test_command_lines_write_version_4(tmp_path, capsys):
    from builder.models import convert, synth
    from builder.models.modelfile3 import file_version
    assert synth.main(["--preset", "tiny-g4-dense", "-o", str(tmp_path / "s.bin"), "--format", "4", "-q"]) == 0
    assert "version 4 (Gemma 4), vocab 1024, 243 ops on 18 slots" in capsys.readouterr().out
    assert ModelFile4(tmp_path / "s.bin").header.generation == 4
    for name, gen in (("tiny_g2", 2), ("tiny_mqa", 1)):
        assert convert.main([str(fixture_path(name)), "-o", str(tmp_path / "c.bin"), "--format", "4", "-q"]) == 0
        assert ModelFile4(tmp_path / "c.bin").header.generation == gen
    # the default is what the engine reads: version 4, for every generation
    assert convert.main([str(fixture_path("tiny_g2")), "-o", str(tmp_path / "d.bin"), "-q"]) == 0
    assert file_version(tmp_path / "d.bin") == 4
    assert synth.main(["--preset", "tiny-g4-dense", "-o", str(tmp_path / "d.bin"), "-q"]) == 0
    assert file_version(tmp_path / "d.bin") == 4


def test_command_lines_write_moe_as_version_4(tmp_path, capsys):
    from builder.models import convert, synth
    assert convert.main([str(fixture_path("tiny_g4moe")), "-o", str(tmp_path / "m.bin"), "-q"]) == 0
    assert synth.main(["--preset", "tiny-g4", "-o", str(tmp_path / "s.bin"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "version 4 (Gemma 4), vocab 2048" in out and "version 4 (Gemma 4), vocab 1024" in out
    for name in ("m.bin", "s.bin"):
        f = ModelFile4(tmp_path / name)
        assert {Op.ROUTE, Op.SKIP, Op.WADD} <= {o.op for o in f.ops} and f.header.generation == 4


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4moe"])
def test_gguf_and_hf_sources_compile_alike(files, tmp_path, name):
    """A Gemma 4 fixture from its GGUF twin: the same program and the same weights, byte for byte."""
    hf = ModelFile4(files[name][0])
    gguf = ModelFile4(convert_fixture(name, "gguf", tmp_path, 4))
    assert gguf.ops == hf.ops and gguf.slots == hf.slots
    assert np.array_equal(gguf._map[gguf.header.weights_off:], hf._map[hf.header.weights_off:])
