"""The engine's model file, version 4: the forward pass as a program of tensor ops
(docs/format.md, "Version 4", describes it op by op).

Layout (little-endian, every offset absolute; each section starts where the one before ends):
header (256 bytes, HEADER_FIELDS) | slots: n_slots x SLOT_REC (width, flags: CACHE) |
program: n_ops x OP_REC (OP_FIELDS) | strings: N_STRINGS records (offset from the section's
start, length) then their bytes, strings_size bytes in all | pieces | index | user | merges |
blob (the tokenizer sections of version 3) | zero padding to a multiple of 4096 | weights:
tensors at multiples of 64 from weights_off, in the order the program first reads them.

A slot is an activation buffer: a plain one holds a block's rows (token t: row t), a CACHE one
the K or V cache (token t of a block at position pos: row pos + t); an op's slot operand reads
or writes rows of its own width, at most the slot's. An op record names its opcode (Op), up to
four slots (s0 the destination), the widths n, m, k, j, two float32 scalars a and c, one weight
(offset w from weights_off, type wtype) and flags (ACC: the destination is added to). RULES says
per opcode which fields it uses, the widths of its slot operands and its weight's shape and
types; `check_op` enforces them (every field an op does not use is 0), `check_program` the
program's (LOGITS last and only there; what a SKIP skips inside the program, before LOGITS).

`make_header` packs a file's parts (a program whose weight offsets are already laid out, the
tokenizer, the chat strings) after the same checks the reader makes, `write_model` writes them
and streams the tensors (modelfile.write_tensors); `ModelFile4` maps a file and validates it whole (header,
section chain, every slot and op, strings, version 3's tokenizer checks) before anything reads
a weight, raising ModelFormatError (one line).
"""
from __future__ import annotations

import math
import struct
from dataclasses import astuple, dataclass
from enum import IntEnum
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from builder.models.modelfile import (FLT_MAX, HEADER_SIZE, PIECE_REC, Q8_0_BLOCK, QK8_0, TENSOR_ALIGN,
                                      WEIGHTS_ALIGN, MappedModel, ModelFormatError, TensorSource, TensorSpec, Vocab,
                                      build_tables, dequantize_q8_0, header_class, write_tensors)
from builder.models.modelfile3 import (DIM_LIMITS, MERGE_REC, MERGES, check_merge_count, merges_table,
                                       read_tokenizer)
from linker.layout import align_up

VERSION = 4
SLOT_REC = 8
OP_REC = 48
CACHE = 1                 # slot flag: a K or V cache (rows by position)
ACC = 1                   # op flag: the destination is added to, not written
HEADER_FLAGS = MERGES     # the only header flag of version 4
MAX_SLOTS = 255
MAX_OPS = 1 << 16
MAX_WIDTH = 1 << 16       # a slot's width, and each of an op's n, m, k (unless its rules say)
GENERATIONS = range(1, 5)
BLOCK = 64                # tokens a block holds at most: a plain slot's rows
N_STRINGS = 5
STRING_MAX = 256
STRING_REC = 8
STRINGS = ("SYS_BEGIN", "SYS_END", "USER_BEGIN", "USER_END", "REPLY_END")
# The chat turn template of each generation, in STRINGS' order.
CHAT_1_3 = (b"<start_of_turn>user\n", b"\n\n", b"<start_of_turn>user\n", b"<end_of_turn>\n<start_of_turn>model\n",
            b"<end_of_turn>\n")
CHAT_4 = (b"<|turn>system\n", b"<turn|>\n<|turn>user\n", b"<|turn>user\n", b"<turn|>\n<|turn>model\n", b"<turn|>\n")
CHAT = {1: CHAT_1_3, 2: CHAT_1_3, 3: CHAT_1_3, 4: CHAT_4}


class WType(IntEnum):
    """A weight's type: F32 (4 bytes a value), F16 (2), Q8_0 (34 bytes per 32 values)."""
    F32 = 0
    F16 = 1
    Q8_0 = 2


DTYPES = {WType.F32: "f32", WType.F16: "f16", WType.Q8_0: "q8_0"}  # as TensorSpec names them
WTYPES = {v: k for k, v in DTYPES.items()}


class Op(IntEnum):
    """The opcodes (ROUTE, SKIP and WADD: the experts of a MoE layer)."""
    EMBED = 1
    NORM = 2
    MATMUL = 3
    ROPE = 4
    ATTN = 5
    GEGLU = 6
    SCALE = 7
    ADD = 8
    LOGITS = 9
    ROUTE = 10
    SKIP = 11
    WADD = 12


KNOWN_OPS = frozenset(int(o) for o in Op)

HEADER_FIELDS: list[tuple[str, int, str]] = [
    ("magic", 0, "8s"),
    ("version", 8, "I"),
    ("header_size", 12, "I"),
    ("vocab", 16, "I"),
    ("max_ctx", 20, "I"),
    ("flags", 24, "I"),
    ("bos", 28, "I"),
    ("eos", 32, "I"),
    ("eot", 36, "I"),
    ("byte_base", 40, "I"),
    ("n_index", 44, "I"),
    ("n_user", 48, "I"),
    ("n_merges", 52, "I"),
    ("max_piece_len", 56, "I"),
    ("n_slots", 60, "I"),
    ("n_ops", 64, "I"),
    ("generation", 68, "I"),
    ("slots_off", 72, "Q"),
    ("program_off", 80, "Q"),
    ("strings_off", 88, "Q"),
    ("pieces_off", 96, "Q"),
    ("index_off", 104, "Q"),
    ("user_off", 112, "Q"),
    ("merges_off", 120, "Q"),
    ("blob_off", 128, "Q"),
    ("weights_off", 136, "Q"),
    ("strings_size", 144, "Q"),
    ("blob_size", 152, "Q"),
    ("weights_size", 160, "Q"),
    ("file_size", 168, "Q"),
]
HEADER_END = 176  # the fields' end: the header's bytes from here to HEADER_SIZE are 0
SLOT_FIELDS: list[tuple[str, int, str]] = [("width", 0, "I"), ("flags", 4, "I")]
OP_FIELDS: list[tuple[str, int, str]] = [
    ("op", 0, "I"),
    ("s0", 4, "B"),
    ("s1", 5, "B"),
    ("s2", 6, "B"),
    ("s3", 7, "B"),
    ("n", 8, "I"),
    ("m", 12, "I"),
    ("k", 16, "I"),
    ("j", 20, "I"),
    ("a", 24, "f"),
    ("c", 28, "f"),
    ("w", 32, "Q"),
    ("wtype", 40, "I"),
    ("flags", 44, "I"),
]
_SLOT = struct.Struct("<" + "".join(c for _, _, c in SLOT_FIELDS))
_OP = struct.Struct("<" + "".join(c for _, _, c in OP_FIELDS))
_STRING = struct.Struct("<II")
assert _SLOT.size == SLOT_REC and _OP.size == OP_REC and _STRING.size == STRING_REC
for _table in (HEADER_FIELDS, SLOT_FIELDS, OP_FIELDS):
    assert all(struct.calcsize("<" + "".join(c for _, _, c in _table[:i])) == off
               for i, (_, off, _) in enumerate(_table))
assert struct.calcsize("<" + "".join(c for _, _, c in HEADER_FIELDS)) == HEADER_END

Header = header_class(HEADER_FIELDS, VERSION, "Every version 4 header field but the magic "
                      "(see HEADER_FIELDS), as the file holds it.")
Header.__module__ = __name__


@dataclass(frozen=True)
class Slot:
    """One slot record: the most floats a token's row holds, and CACHE."""
    width: int
    flags: int = 0  # CACHE

    def pack(self) -> bytes:
        return _SLOT.pack(self.width, self.flags)


@dataclass(frozen=True)
class OpRec:
    """One op record, field for field (OP_FIELDS); a and c hold float32 values."""
    op: int
    s0: int = 0
    s1: int = 0
    s2: int = 0
    s3: int = 0
    n: int = 0
    m: int = 0
    k: int = 0
    j: int = 0
    a: float = 0.0
    c: float = 0.0
    w: int = 0
    wtype: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        return _OP.pack(*astuple(self))

    @classmethod
    def unpack(cls, data, offset: int) -> OpRec:
        return cls(*_OP.unpack_from(data, offset))

    @property
    def name(self) -> str:
        return Op(self.op).name if self.op in KNOWN_OPS else f"op{self.op}"


@dataclass(frozen=True)
class Rule:
    """What an opcode reads: `slots`: its slot operands as (field, width, a CACHE slot an earlier
    op wrote), `weight`: its weight's shape (None: no weight) and `wtypes`: the types it may
    have. Fields an op does not read are ignored (writers write 0)."""
    slots: Callable[[OpRec], list[tuple[str, int, bool]]]
    weight: Callable[[OpRec, int], tuple[int, ...]] | None = None
    wtypes: tuple[WType, ...] = ()


MATRIX = (WType.F16, WType.Q8_0)
RULES: dict[Op, Rule] = {
    Op.EMBED: Rule(lambda o: [("s0", o.n, False)], lambda o, vocab: (vocab, o.k), MATRIX),
    Op.NORM: Rule(lambda o: [("s0", o.n * o.m, False), ("s1", o.n * o.m, False)], lambda o, vocab: (o.n,),
                  (WType.F32,)),
    Op.MATMUL: Rule(lambda o: [("s0", o.m, False), ("s1", o.n, False)] + [("s2", o.m, False)] * (o.s2 != 0),
                    lambda o, vocab: (o.m, o.n), MATRIX),
    Op.ROPE: Rule(lambda o: [("s0", o.n * o.m, False), ("s1", o.n * o.k, False)], lambda o, vocab: (o.n // 2,),
                  (WType.F32,)),
    Op.ATTN: Rule(lambda o: [("s0", o.n * o.m, False), ("s1", o.n * o.m, False), ("s2", o.n * o.k, True),
                             ("s3", o.n * o.k, True)]),
    Op.GEGLU: Rule(lambda o: [("s0", o.n, False), ("s1", o.n, False)]),
    Op.SCALE: Rule(lambda o: [("s0", o.n, False)]),
    Op.ADD: Rule(lambda o: [("s0", o.n, False), ("s1", o.n, False)]),
    Op.LOGITS: Rule(lambda o: [("s1", o.n, False)], lambda o, vocab: (vocab, o.n), MATRIX),
    Op.ROUTE: Rule(lambda o: [("s0", o.n, False), ("s1", o.m, False)], lambda o, vocab: (o.n * o.m + o.n,),
                   (WType.F32,)),
    Op.SKIP: Rule(lambda o: [("s0", o.n, False)]),
    Op.WADD: Rule(lambda o: [("s0", o.n, False), ("s1", o.n, False), ("s2", o.m, False)]),
}
SLOT_OPERANDS = ("s0", "s1", "s2", "s3")
ALIGN4 = {(Op.MATMUL, "s2"), (Op.GEGLU, "s0")}  # rows GEGLU takes four floats a pass
# ops whose slot operands are distinct slots: they read one while they write another, the rows
# split over threads (a product's s1 while its s0 and gate, the attention's K and V while its s0)
DISTINCT = {Op.MATMUL, Op.ATTN}


def weight_bytes(shape: tuple[int, ...], wtype: int) -> int:
    """Bytes of a weight of this shape and type (Q8_0: whole rows of 32-value blocks)."""
    n = math.prod(shape)
    return n // QK8_0 * Q8_0_BLOCK if wtype == WType.Q8_0 else n * (4 if wtype == WType.F32 else 2)


def _width(name: str, v: int, low: int = 1, high: int = MAX_WIDTH) -> None:
    if not low <= v <= high:
        raise ModelFormatError(f"{name} = {v} is out of range ({low} .. {high})")


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ModelFormatError(what)


def _check_shape(o: OpRec, vocab: int) -> None:
    """What each handler assumes beyond its operands' widths."""
    if o.op == Op.EMBED:
        _width("k", o.k)
        _need(o.j + o.n <= o.k, f"columns j .. j + n - 1 ({o.j} .. {o.j + o.n - 1}) are outside the table's k = {o.k}")
        _need(o.wtype != WType.Q8_0 or not (o.j | o.n) % QK8_0,
              f"a Q8_0 table's columns need j and n multiples of {QK8_0} (j {o.j}, n {o.n})")
    elif o.op == Op.ROPE:
        _need(not o.n % 2, f"n = {o.n} is odd")
    elif o.op == Op.ATTN:
        _need(not o.m % o.k, f"m = {o.m} query heads is not a multiple of k = {o.k} kv heads")
    elif o.op == Op.ROUTE:
        _need(not o.n % 4, f"n = {o.n} experts is not a multiple of 4")
        _width("k", o.k, 1, o.n)
    elif o.op == Op.SKIP:
        _need(o.j < o.n, f"column j = {o.j} is outside s0's n = {o.n}")
        _need(o.k >= 1, "k = 0 skips no op")
    elif o.op == Op.WADD:
        _need(o.j < o.m, f"column j = {o.j} is outside s2's m = {o.m}")


def check_op(o: OpRec, slots: Sequence[Slot], vocab: int, weights_size: int, written: set[int] | None = None) -> None:
    """Every rule of the page for one op record (ModelFormatError names what is wrong); written:
    the slots earlier ops wrote (their s0), which ATTN's K and V must be among."""
    if o.op not in KNOWN_OPS:
        raise ModelFormatError(f"unknown opcode {o.op} (known: 1 .. {max(Op)})")
    rule = RULES[Op(o.op)]
    named: list[int] = []
    for f, width, kv in rule.slots(o):
        s = getattr(o, f)
        if not 1 <= s <= len(slots):
            raise ModelFormatError(f"{f} names slot {s}; the file has slots 1 .. {len(slots)}")
        slot = slots[s - 1]
        if width > slot.width:
            raise ModelFormatError(f"{f} is {width} wide, slot {s} holds {slot.width}")
        if not width and not (o.op == Op.ROPE and f == "s1"):
            raise ModelFormatError(f"{f} is 0 wide")
        if (o.op, f) in ALIGN4 and width % 4:
            raise ModelFormatError(f"{f} is {width} wide, not a multiple of 4")
        if o.op in DISTINCT and s in named:
            raise ModelFormatError(f"{f} names slot {s}, as an operand before it does ({o.name}'s are distinct)")
        named.append(s)
        if kv and not slot.flags & CACHE:
            raise ModelFormatError(f"{f} (slot {s}) must be a CACHE slot")
        if kv and written is not None and s not in written:
            raise ModelFormatError(f"{f} (slot {s}) is a cache no earlier op writes")
    if rule.weight is not None:
        if o.wtype not in rule.wtypes:
            raise ModelFormatError(f"weight type {o.wtype} is not one of {[int(t) for t in rule.wtypes]} "
                                   f"({', '.join(t.name for t in rule.wtypes)})")
        shape = rule.weight(o, vocab)
        if o.wtype == WType.Q8_0 and shape[-1] % QK8_0:
            raise ModelFormatError(f"a Q8_0 weight needs rows of a multiple of {QK8_0} values, not {shape[-1]}")
        if o.w % TENSOR_ALIGN:
            raise ModelFormatError(f"weight offset {o.w:#x} is not a multiple of {TENSOR_ALIGN}")
        end = o.w + weight_bytes(shape, o.wtype)
        if end > weights_size:
            raise ModelFormatError(f"weight {list(shape)} at {o.w:#x} ends at {end:#x}, past the weights "
                                   f"({weights_size:#x} bytes)")
    _check_shape(o, vocab)


def check_program(ops: Sequence[OpRec], slots: Sequence[Slot], vocab: int, weights_size: int) -> None:
    """The slots' and every op's rules, LOGITS as the last op and only there, and the ops a
    SKIP may skip inside the program, LOGITS never among them."""
    _width("n_slots", len(slots), 1, MAX_SLOTS)
    _width("n_ops", len(ops), 1, MAX_OPS)
    for i, s in enumerate(slots, 1):
        if not 1 <= s.width <= MAX_WIDTH:
            raise ModelFormatError(f"slot {i}: width {s.width} is out of range (1 .. {MAX_WIDTH})")
        if s.flags & ~CACHE:
            raise ModelFormatError(f"slot {i}: flags {s.flags:#x} has unknown bits (known: {CACHE:#x})")
    written: set[int] = set()
    for i, o in enumerate(ops):
        try:
            check_op(o, slots, vocab, weights_size, written)
            if (o.op == Op.LOGITS) != (i == len(ops) - 1):
                raise ModelFormatError("LOGITS must be the program's last op, and only there" if o.op == Op.LOGITS
                                       else "the program's last op must be LOGITS")
            if o.op == Op.SKIP and i + o.k >= len(ops) - 1:
                raise ModelFormatError(f"k = {o.k} skips ops {i + 1} .. {i + o.k}, past the ops before LOGITS "
                                       f"(op {len(ops) - 1})")
        except ModelFormatError as e:
            raise ModelFormatError(f"op {i} ({o.name}): {e}") from None
        written.add(o.s0)


def pack_strings(strings: Sequence[bytes]) -> bytes:
    """The strings section: N_STRINGS (offset, length) records, then the bytes in order, zero
    padded to a multiple of 8 (so the pieces that follow stay 8-byte aligned)."""
    check_strings(strings)
    recs, blob, off = b"", b"", STRING_REC * N_STRINGS
    for s in strings:
        recs += _STRING.pack(off + len(blob), len(s))
        blob += s
    return (recs + blob).ljust(align_up(len(recs) + len(blob), 8), b"\0")


def check_strings(strings: Sequence[bytes]) -> None:
    """What a writer writes: N_STRINGS strings, each at most STRING_MAX bytes of UTF-8 (a reader
    checks only where they lie and how long they are: read_strings)."""
    if len(strings) != N_STRINGS:
        raise ModelFormatError(f"{len(strings)} chat strings, expected {N_STRINGS} ({', '.join(STRINGS)})")
    for name, s in zip(STRINGS, strings):
        if len(s) > STRING_MAX:
            raise ModelFormatError(f"string {name} is {len(s)} bytes (at most {STRING_MAX})")
        try:
            s.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"string {name} is not UTF-8") from None


def read_strings(m, off: int, size: int) -> list[bytes]:
    """The N_STRINGS strings of a strings section at off (size bytes), with exactly the engine's
    checks: the section holds the records (size >= 40), and each record's string is at most
    STRING_MAX bytes and ends inside the section (offset + length <= size, in exact arithmetic);
    any placement, the records' own bytes included, and any bytes are accepted."""
    if size < STRING_REC * N_STRINGS:
        raise ModelFormatError(f"strings_size {size} is below its {N_STRINGS} records ({STRING_REC * N_STRINGS} bytes)")
    out = []
    for i, name in enumerate(STRINGS):
        o, n = _STRING.unpack_from(m, off + STRING_REC * i)
        if n > STRING_MAX:
            raise ModelFormatError(f"string {name} is {n} bytes (at most {STRING_MAX})")
        if o + n > size:
            raise ModelFormatError(f"string {name} ({n} bytes at {o}) ends past the strings section ({size} bytes)")
        out.append(bytes(m[off + o:off + o + n]))
    return out


def section_chain(h) -> list[tuple[str, int]]:
    """Each offset and size the header's counts imply, in file order (what a reader compares)."""
    return [("slots_off", HEADER_SIZE), ("program_off", h.slots_off + SLOT_REC * h.n_slots),
            ("strings_off", h.program_off + OP_REC * h.n_ops), ("pieces_off", h.strings_off + h.strings_size),
            ("index_off", h.pieces_off + PIECE_REC * h.vocab), ("user_off", h.index_off + 4 * h.n_index),
            ("merges_off", h.user_off + 4 * h.n_user), ("blob_off", h.merges_off + MERGE_REC * h.n_merges),
            ("weights_off", align_up(h.blob_off + h.blob_size, WEIGHTS_ALIGN)),
            ("file_size", h.weights_off + h.weights_size)]


def check_header(h) -> None:
    """The header's own fields (not yet the sections they place)."""
    _width("vocab", h.vocab, 1, DIM_LIMITS["vocab"])
    _width("max_ctx", h.max_ctx, 1, DIM_LIMITS["max_ctx"])
    if h.flags & ~HEADER_FLAGS:
        raise ModelFormatError(f"flags {h.flags:#x} has unknown bits (known: {HEADER_FLAGS:#x})")
    check_merge_count(h)
    _width("n_slots", h.n_slots, 1, MAX_SLOTS)
    _width("n_ops", h.n_ops, 1, MAX_OPS)


def layout(tensors: Sequence[tuple[str, tuple[int, ...], str]]) -> list[TensorSpec]:
    """(name, shape, dtype) in file order -> TensorSpecs at multiples of TENSOR_ALIGN."""
    specs, off = [], 0
    for name, shape, dtype in tensors:
        specs.append(TensorSpec(name, off, shape, dtype))
        off = align_up(off + specs[-1].nbytes, TENSOR_ALIGN)
    return specs


def make_header(vocab: Vocab, n_vocab: int, max_ctx: int, generation: int, slots: Sequence[Slot],
                ops: Sequence[OpRec], strings: Sequence[bytes], weights_size: int) -> tuple[Header, bytes]:
    """The header and everything between it and the weights, every rule checked as a reader
    checks it."""
    if bool(vocab.merges) != (generation == 4):
        raise ModelFormatError("the tokenizer merges by rank exactly for Gemma 4")
    t = build_tables(vocab, n_vocab)
    merges = merges_table(vocab)
    section = pack_strings(strings)
    slots_off = HEADER_SIZE
    program_off = slots_off + SLOT_REC * len(slots)
    strings_off = program_off + OP_REC * len(ops)
    pieces_off = strings_off + len(section)
    index_off = pieces_off + len(t.pieces)
    user_off = index_off + len(t.index)
    merges_off = user_off + len(t.user)
    blob_off = merges_off + len(merges)
    weights_off = align_up(blob_off + len(t.blob), WEIGHTS_ALIGN)
    header = Header(VERSION, HEADER_SIZE, n_vocab, max_ctx, MERGES if vocab.merges else 0, vocab.bos, vocab.eos,
                    vocab.eot, t.byte_base, t.n_index, t.n_user, len(vocab.merges), t.max_piece_len, len(slots),
                    len(ops), generation, slots_off, program_off, strings_off, pieces_off, index_off, user_off,
                    merges_off, blob_off, weights_off, len(section), len(t.blob), weights_size,
                    weights_off + weights_size)
    check_header(header)
    check_program(ops, slots, n_vocab, weights_size)
    front = (b"".join(s.pack() for s in slots) + b"".join(o.pack() for o in ops) + section + t.pieces + t.index
             + t.user + merges + t.blob)
    return header, front


def write_model(path: Path, header: Header, front: bytes, specs: list[TensorSpec], source: TensorSource,
                progress: bool = True, names: dict[str, str] | None = None) -> Header:
    """Write a version 4 file at path: header and front (make_header's), then every tensor of
    specs (laid out by `layout`) from source (modelfile.write_tensors: FP16, Q8_0 or FP32 by
    its dtype)."""
    with open(path, "wb") as f:
        f.write(header.pack() + front)
        write_tensors(f, path, header.weights_off, header.file_size, specs, source, names or {}, progress)
    return header


class ModelFile4(MappedModel):
    """A validated, memory-mapped version 4 model file.

    Attributes: header, slots (list[Slot]), ops (list[OpRec]), strings (the N_STRINGS chat
    strings), and the tokenizer as ModelFile3 has it (pieces, scores, types, index, user,
    merges, merge_scores). `weight(op)` is an op's weight as float32 (its shape by RULES).
    """

    def _validate(self) -> None:
        m = self._map
        h = self._header(Header)
        check_header(h)
        for name, want in section_chain(h):
            if getattr(h, name) != want:
                raise ModelFormatError(f"{name} is {getattr(h, name)}, expected {want}")
        self.slots = [Slot(*_SLOT.unpack_from(m, h.slots_off + SLOT_REC * i)) for i in range(h.n_slots)]
        self.ops = [OpRec.unpack(m, h.program_off + OP_REC * i) for i in range(h.n_ops)]
        check_program(self.ops, self.slots, h.vocab, h.weights_size)
        self.strings = read_strings(m, h.strings_off, h.strings_size)
        read_tokenizer(self, m, h, ranks=False)

    def weight_shape(self, o: OpRec) -> tuple[int, ...]:
        return RULES[Op(o.op)].weight(o, self.header.vocab)

    def raw_weight(self, o: OpRec) -> np.ndarray:
        """An op's weight bytes (uint8), read-only."""
        return np.frombuffer(self._map, np.uint8, weight_bytes(self.weight_shape(o), o.wtype),
                             self.header.weights_off + o.w)

    def weight(self, o: OpRec) -> np.ndarray:
        """An op's weight as float32 (FP16 widened, Q8_0 as d q), shaped by its rule."""
        shape, raw = self.weight_shape(o), self.raw_weight(o)
        if o.wtype == WType.Q8_0:
            return dequantize_q8_0(raw.reshape(-1, shape[-1] // QK8_0 * Q8_0_BLOCK), shape[-1]).reshape(shape)
        return raw.view("<f4" if o.wtype == WType.F32 else "<f2").astype(np.float32).reshape(shape)


