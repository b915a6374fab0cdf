"""Seeded mutators of version 4 model files: hostile programs as Cases (mutate.Case).

`Base4` parses a valid version 4 file (builder.models.modelfile4 defines the format; this module
only reads a file's header, slots and ops to aim at them). `junk(op, n_slots)` is an op with
junk in every field it does not read (READS), `with_junk` a file whose every op is so (the
interpreter and show are held to ignoring them too). `make_cases4(bases, seed, count)`
returns the systematic families on each base, then seeded random mutations up to `count`:
- opcodes: each op's opcode set to unknown values (0, 13, 255, 2^31, 2^32-1), or to another
  known one;
- operands: each slot operand set to 0 (none), past the slots, to a slot too narrow for it, to
  CACHE and plain slots wide enough, ATTN's K or V to a plain slot and to a cache no earlier op
  writes, the destination of an op that writes a K or V elsewhere, a MATMUL's or ATTN's to a
  slot another of its operands names; MATMUL's gate (s2) turned off, and on; each slot field
  an op does not use set;
- widths: each op's n, m, k, j set to edge values;
- op flags: each op's flags set to 0, ACC, an unknown bit, every bit; every op's fields it
  does not read set to junk at once;
- slot widths and flags: each slot's width at 0, one below what its widest operand needs, that
  width exactly, 65536 and past it; CACHE cleared and set; unknown flag bits;
- op and slot counts: the program rewritten with an op dropped, doubled, moved, LOGITS doubled
  or moved, an ATTN moved before the ops that write its K and V, a slot added or removed, every
  section after it moved to match (the weights stay where they are), and n_ops / n_slots
  changed alone;
- weights and scalars: each weight offset misaligned, past the region, at its last legal
  place; weight types unknown or of the wrong kind; the weight fields of an op without one;
  each of a and c set to NaN, infinities, 0, -0, negatives, denormals;
- header: the generation and the header's padding (neither validated), max_ctx, unknown flags;
- strings: each record pointed into the records, at and past the section's end, at 257 bytes,
  at offsets whose u32 sum with the length wraps; bytes that are not UTF-8; strings sections of
  0 to 41 bytes and one of 340 with strings of 256 and 257 bytes (the sections after it moved);
  decided by the engine's rules (string_refused), exactly the reader's.
A case says what must happen where the page (docs/format.md, "Version 4") decides it by
construction: `reject` when a rule is broken, `accept` when every rule still holds (the same op
with another slot wide enough, a field the op does not use, any scalar bits, a program with an
op doubled ...); neither where the verdict depends on more than the field changed: the Python
reader's verdict (ModelFile4) is then the one the engine is held to. An accepted case must run
(exit 0): the runner's command lines prompt a few tokens. emu_tests/models/test_fuzz4.py
checks every case against the reader.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from builder.models.modelfile import HEADER_SIZE
from builder.models.modelfile4 import (ACC, CACHE, DISTINCT, HEADER_END, HEADER_FIELDS, MAX_WIDTH, N_STRINGS,
                                       OP_FIELDS, OP_REC, RULES, SLOT_OPERANDS, SLOT_REC, STRING_MAX, STRING_REC,
                                       ModelFile4, Op, OpRec, WType, weight_bytes)
from linker.layout import align_up

from .model import write_case
from .mutate import F32_BITS, MODEL, PROMPTS, U32_EDGES, Case

UNKNOWN_OPS = [0, max(Op) + 1, 255, 0x80000000, 0xFFFFFFFF]
# The fields each opcode reads (the page's op table; flags: ACC, bit 0, on NORM and MATMUL).
# Writers write 0 in the others; readers (the reader, the interpreter, show, the engine) ignore them.
READS = {Op.EMBED: "s0 n k j a w wtype", Op.NORM: "s0 s1 n m a w wtype", Op.MATMUL: "s0 s1 s2 n m w wtype",
         Op.ROPE: "s0 s1 n m k w wtype", Op.ATTN: "s0 s1 s2 s3 n m k j a c", Op.GEGLU: "s0 s1 n", Op.SCALE: "s0 n a",
         Op.ADD: "s0 s1 n", Op.LOGITS: "s1 n c w wtype", Op.ROUTE: "s0 s1 n m k w wtype", Op.SKIP: "s0 n k j",
         Op.WADD: "s0 s1 s2 n m j"}
JUNK = dict(s0=250, s1=251, s2=252, s3=253, n=0xFFFFFFFF, m=0xFFFFFFFE, k=0x10001, j=12345, a=float("nan"),
            c=-float("inf"), w=(1 << 64) - 1, wtype=0xFFFFFFFF)
SHIFTED = ("strings_off", "pieces_off", "index_off", "user_off", "merges_off", "blob_off")  # after the program
BIG_STRINGS = 340   # a strings section with room for a 257-byte string after the records


def f32_of(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def junk(o: OpRec, n_slots: int) -> OpRec:
    """o with every field it does not read set to junk (a ROPE of q alone: its s1 at another
    slot), and every flag bit but ACC where ACC is read."""
    fields = {f: v for f, v in JUNK.items() if f not in READS[Op(o.op)].split()}
    if o.op == Op.ROPE and not o.k:
        fields["s1"] = n_slots
    acc = o.flags & ACC if o.op in (Op.NORM, Op.MATMUL) else ACC
    return replace(o, **fields, flags=0xFFFFFFFF ^ ACC | acc)


def with_junk(path: Path, f: ModelFile4, out: Path) -> Path:
    """A copy of the version 4 file at path (read as f) at out, its ops' unread fields junk."""
    data = bytearray(path.read_bytes())
    program = b"".join(junk(o, len(f.slots)).pack() for o in f.ops)
    data[f.header.program_off:f.header.program_off + len(program)] = program
    out.write_bytes(bytes(data))
    return out


def string_refused(off: int, n: int, size: int) -> bool:
    """The engine's rule for one string record in a section of `size` bytes: refused when it
    is over STRING_MAX bytes or ends past the section (off + n, as u32 values added without
    overflow)."""
    return n > STRING_MAX or off + n > size


def kv_written(ops: list[OpRec]) -> bool:
    """Every ATTN's K and V slots are the destination (s0) of an earlier op."""
    written: set[int] = set()
    for o in ops:
        if o.op == Op.ATTN and not {o.s2, o.s3} <= written:
            return False
        written.add(o.s0)
    return True


@dataclass
class Base4:
    """A valid version 4 file, parsed for the mutators: `data` its bytes up to weights_off,
    `length` the file's length. `slots[s - 1]` is slot s's (width, flags): ops number slots
    from 1."""
    data: bytes
    length: int

    def __post_init__(self) -> None:
        self.header = {name: struct.unpack_from("<" + code, self.data, off)[0] for name, off, code in HEADER_FIELDS}
        h = self.header
        self.slots = [struct.unpack_from("<II", self.data, h["slots_off"] + SLOT_REC * i) for i in range(h["n_slots"])]
        self.ops = [OpRec.unpack(self.data, h["program_off"] + OP_REC * i) for i in range(h["n_ops"])]

    @classmethod
    def load(cls, path: Path) -> Base4:
        with open(path, "rb") as f:
            length = f.seek(0, 2)
            f.seek(0)
            head = f.read(HEADER_SIZE)
            end = dict((n, o) for n, o, _ in HEADER_FIELDS)["weights_off"]
            return cls(head + f.read(struct.unpack_from("<Q", head, end)[0] - HEADER_SIZE), length)

    def needed(self) -> list[int]:
        """The width each slot's widest operand reads (index s - 1 for slot s)."""
        out = [0] * len(self.slots)
        for o in self.ops:
            for f, width, _ in RULES[Op(o.op)].slots(o):
                out[getattr(o, f) - 1] = max(out[getattr(o, f) - 1], width)
        return out

    def representatives(self) -> list[int]:
        """One op of each (opcode, ROPE of K too, MATMUL with a gate, flags) kind, and the last
        op: what the op families aim at."""
        seen: dict[tuple, int] = {}
        for i, o in enumerate(self.ops):
            seen.setdefault((o.op, o.op == Op.ROPE and o.k > 0, o.op == Op.MATMUL and o.s2 > 0, o.flags), i)
        return sorted(set(seen.values()) | {len(self.ops) - 1})


class _Maker4:
    def __init__(self, base: Base4, rng: random.Random):
        self.base, self.rng, self.h = base, rng, base.header

    def argv(self) -> tuple[bytes, ...]:
        return self.rng.choice([(b"-m", MODEL, b"-p", self.rng.choice(PROMPTS), b"-n", b"2"),
                                (b"-m", MODEL, b"-p", self.rng.choice(PROMPTS), b"--tokens")])

    def case(self, label: str, edits: tuple[tuple[int, bytes], ...], verdict: bool | None) -> Case:
        """verdict True: must be refused, False: must be accepted, None: either."""
        return Case(label, edits, argv=self.argv(), reject=verdict is True, accept=verdict is False)

    def op_case(self, label: str, i: int, verdict: bool | None, **fields) -> Case:
        """Op i with fields changed."""
        o = self.base.ops[i]
        raw = OpRec(**{**o.__dict__, **fields}).pack()
        return self.case(f"op {i} ({o.name}) {label}", ((self.h["program_off"] + OP_REC * i, raw),), verdict)

    # -- families ----------------------------------------------------------------------------
    def opcodes(self) -> list[Case]:
        """Unknown opcodes; every other known one (ADD and GEGLU read the same operands, and
        GEGLU's rows are multiples of 4 floats: decided; the others depend on the fields)."""
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            out += [self.op_case(f"opcode := {v:#x}", i, True, op=v) for v in UNKNOWN_OPS]
            out += [self.op_case(f"opcode := {op.name}", i,
                                 op == Op.GEGLU and o.n % 4 != 0 if {o.op, op} == {Op.ADD, Op.GEGLU} else None,
                                 op=int(op)) for op in Op if op != o.op]
        return out

    def operand_verdict(self, i: int, f: str, s: int, width: int, kv: bool) -> tuple[str, bool]:
        """What pointing op i's operand f (`width` floats, a K/V if kv) at slot s is, and
        whether it breaks a rule."""
        slots, ops = self.base.slots, self.base.ops
        if s == 0:
            return ("no gate", False) if (ops[i].op, f) == (Op.MATMUL, "s2") else ("0 (none)", True)
        if s > len(slots):
            return "past the slots", True
        w, flags = slots[s - 1]
        if w < width:
            return "too narrow", True
        if kv and not flags & CACHE:
            return "a plain slot", True
        if not kv_written(ops[:i] + [replace(ops[i], **{f: s})] + ops[i + 1:]):
            return "a cache no earlier op writes" if kv else "a K or V it wrote then unwritten", True
        o = ops[i]
        if o.op in DISTINCT and s in {getattr(o, g) for g, _, _ in RULES[Op(o.op)].slots(o) if g != f}:
            return "another of its operands' slot", True
        return f"{'a CACHE' if flags & CACHE else 'a plain'} slot wide enough", False

    def operands(self) -> list[Case]:
        """On the representatives and on the ops that write the first ATTN's K and V."""
        out, ops, n_slots = [], self.base.ops, len(self.base.slots)
        a = next(i for i, o in enumerate(ops) if o.op == Op.ATTN)
        writers = [i for i in range(a) if ops[i].s0 in (ops[a].s2, ops[a].s3)]
        for i in sorted(set(self.base.representatives()) | set(writers)):
            o = self.base.ops[i]
            named = {f: (width, kv) for f, width, kv in RULES[Op(o.op)].slots(o)}
            if o.op == Op.MATMUL:
                named["s2"] = (o.m, False)      # the gate: off (0) or on at a slot m wide
            for f in SLOT_OPERANDS:
                if f not in named:
                    out += [self.op_case(f"{f} := {v} (unused)", i, False, **{f: v}) for v in (1, 255)]
                    continue
                width, kv = named[f]
                kinds: dict[str, list[tuple[int, bool]]] = {}
                for s in dict.fromkeys([0, *range(1, n_slots + 1), n_slots + 1, 255]):
                    if s != getattr(o, f):
                        what, verdict = self.operand_verdict(i, f, s, width, kv)
                        kinds.setdefault(what, []).append((s, verdict))
                out += [self.op_case(f"{f} := {s}, {what}", i, verdict, **{f: s})
                        for what, found in kinds.items() for s, verdict in found[:2]]
        return out

    def widths(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            for f in ("n", "m", "k", "j"):
                orig = getattr(o, f)
                for v in dict.fromkeys([0, 1, orig - 1, orig + 1, 2 * orig, MAX_WIDTH, MAX_WIDTH + 1, 0xFFFFFFFF]):
                    if v != orig and v >= 0:
                        out.append(self.op_case(f"{f} := {v:#x}", i, self.width_verdict(o, f, v), **{f: v}))
        return out

    def width_verdict(self, o: OpRec, f: str, v: int) -> bool | None:
        """What the page decides for op o with field f (n, m, k or j) := v, alone."""
        op, slots = Op(o.op), self.base.slots
        if f not in READS[op].split():
            return False                # ignored
        if f in ("n", "m") and not 1 <= v <= MAX_WIDTH:
            return True                 # an operand's row of v (or v groups) is empty or wider than any slot
        if ((op, f) == (Op.MATMUL, "m") and o.s2 or (op, f) == (Op.GEGLU, "n")) and v % 4:
            return True                 # rows GEGLU runs on (a gated MATMUL's s2) are multiples of 4 floats
        if f == "k" and (v > MAX_WIDTH or v == 0 and op != Op.ROPE):
            return True                 # EMBED's table is 1 .. 65536 wide; K's rows are not empty
        if (op, f) == (Op.ROPE, "k") and v == 0:
            return False                # q alone: s1 is not touched
        if (op, f) == (Op.ATTN, "j"):
            return False                # any window
        if (op, f) == (Op.EMBED, "j"):
            return v + o.n > o.k or o.wtype == WType.Q8_0 and v % 32 != 0
        changed = replace(o, **{f: v})
        if any(width > slots[getattr(o, g) - 1][0] for g, width, _ in RULES[op].slots(changed)):
            return True                 # an operand wider than its slot
        return None

    def op_flags(self) -> list[Case]:
        """ACC is allowed wherever it is read (NORM, MATMUL with or without its gate) and
        ignored elsewhere; the other bits are ignored; so is every field an op does not read
        (all of them at once, in every op)."""
        out = [self.op_case(f"flags := {v:#x}", i, False, flags=v) for i in self.base.representatives()
               for v in (0, ACC, 2, 0xFFFFFFFF) if v != self.base.ops[i].flags]
        program = b"".join(junk(o, len(self.base.slots)).pack() for o in self.base.ops)
        return out + [self.case("every field no op reads := junk", ((self.h["program_off"], program),), False)]

    def slot_case(self, label: str, s: int, width: int, flags: int, verdict: bool | None) -> Case:
        raw = struct.pack("<II", width, flags)
        return self.case(f"slot {s} {label}", ((self.h["slots_off"] + SLOT_REC * (s - 1), raw),), verdict)

    def slot_widths(self) -> list[Case]:
        out, needed = [], self.base.needed()
        attn_kv = {getattr(o, f) for o in self.base.ops if o.op == Op.ATTN for f in ("s2", "s3")}
        for s, (width, flags) in enumerate(self.base.slots, 1):
            need = needed[s - 1]
            for v, verdict in ((0, True), (need - 1, True), (need, need == 0), (MAX_WIDTH, False),
                               (MAX_WIDTH + 1, True), (0xFFFFFFFF, True)):
                if v != width and v >= 0:
                    out.append(self.slot_case(f"width := {v}", s, v, flags, verdict))
            out.append(self.slot_case("CACHE flipped", s, width, flags ^ CACHE, bool(flags & CACHE and s in attn_kv)))
            out += [self.slot_case(f"flags := {v:#x}", s, width, v, True) for v in (2, flags | 0x80000000)]
        return out

    def rewrite(self, label: str, slots: list[tuple[int, int]], ops: list[OpRec], verdict: bool | None) -> Case | None:
        """The file with these slots and ops (sections after them moved to match), when its
        weights stay at weights_off; None otherwise."""
        h, data = self.h, self.base.data
        delta = SLOT_REC * (len(slots) - len(self.base.slots)) + OP_REC * (len(ops) - len(self.base.ops))
        end = h["blob_off"] + h["blob_size"]
        if align_up(end + delta, 4096) != h["weights_off"]:
            return None
        body = (b"".join(struct.pack("<II", *s) for s in slots) + b"".join(o.pack() for o in ops)
                + data[h["strings_off"]:end])
        body += bytes(max(0, end - HEADER_SIZE - len(body)))
        fields = dict(n_slots=len(slots), n_ops=len(ops), program_off=HEADER_SIZE + SLOT_REC * len(slots),
                      **{f: h[f] + delta for f in SHIFTED})
        edits = [(off, struct.pack("<" + code, fields[name])) for name, off, code in HEADER_FIELDS if name in fields]
        return self.case(label, tuple(edits) + ((HEADER_SIZE, body),), verdict)

    def counts(self) -> list[Case]:
        slots, ops = list(self.base.slots), list(self.base.ops)
        last = len(ops) - 1
        a = next(i for i, o in enumerate(ops) if o.op == Op.ATTN)
        made = [
            self.rewrite("last op (LOGITS) dropped", slots, ops[:-1], True),
            self.rewrite("first op dropped", slots, ops[1:], False),
            self.rewrite("op 1 doubled", slots, ops[:2] + ops[1:], False),
            self.rewrite("LOGITS doubled", slots, ops + ops[-1:], True),
            self.rewrite("LOGITS moved first", slots, ops[-1:] + ops[:-1], True),
            self.rewrite("ops 1 and 2 swapped", slots, ops[:1] + [ops[2], ops[1]] + ops[3:], False),
            self.rewrite("the program's first half twice", slots, ops[:last // 2] + ops, False),
            self.rewrite("the first ATTN moved first", slots, [ops[a]] + ops[:a] + ops[a + 1:], True),
            self.rewrite("the first ATTN before the op before it", slots,
                         ops[:a - 1] + [ops[a], ops[a - 1]] + ops[a + 1:], not kv_written(ops[:a - 1])),
            self.rewrite("a slot added, never used", slots + [(16, 0)], ops, False),
            self.rewrite("a CACHE slot added, never used", slots + [(16, CACHE)], ops, False),
            self.rewrite("the last slot removed", slots[:-1], ops, True),
            self.rewrite("LOGITS alone", slots, ops[-1:], False),
        ]
        made += [self.case(f"header {name} := {v}", ((off, struct.pack("<I", v)),), True)
                 for name, off, code in HEADER_FIELDS if name in ("n_ops", "n_slots")
                 for v in (0, self.h[name] - 1, self.h[name] + 1, 256, 65537, 0xFFFFFFFF)]
        return [c for c in made if c is not None]

    def weights(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            rule = RULES[Op(o.op)]
            if rule.weight is None:
                out += [self.op_case(f"w := {v:#x} (no weight)", i, False, w=v) for v in (64, 1 << 63)]
                out += [self.op_case(f"wtype := {v:#x} (no weight)", i, False, wtype=v) for v in (2, 0xFFFFFFFF)]
                continue
            size = weight_bytes(rule.weight(o, self.h["vocab"]), o.wtype)
            ws = self.h["weights_size"]
            for v, verdict in ((o.w + 1, True), (o.w + 32, True), (ws, True), ((ws - size) // 64 * 64 + 64, True),
                               ((ws - size) // 64 * 64, False), (1 << 63, True), ((1 << 64) - 64, True)):
                if v != o.w:
                    out.append(self.op_case(f"w := {v:#x}", i, verdict, w=v))
            wrong = [t for t in WType if t not in rule.wtypes]
            out += [self.op_case(f"wtype := {v:#x}", i, True, wtype=v) for v in (*wrong, 3, 0xFFFFFFFF)]
        return out

    def scalars(self) -> list[Case]:
        """a and c are data, any float32 bits, used or not."""
        return [self.op_case(f"{f} := f32 bits {bits:#010x}", i, False, **{f: f32_of(bits)})
                for i in self.base.representatives() for f in ("a", "c") for bits in F32_BITS]

    def header(self) -> list[Case]:
        """The header's fields no other family sets: the generation and the padding after the
        fields (neither validated), max_ctx, the flags."""
        at = {name: off for name, off, _ in HEADER_FIELDS}
        values = [("generation", v, False) for v in (0, 5, 0xFFFFFFFF)]
        values += [("max_ctx", v, not 1 <= v <= 65536) for v in (0, 65536, 65537)]
        values += [("flags", v, True) for v in (self.h["flags"] ^ 1, self.h["flags"] | 0x80000000)]
        out = [self.case(f"header {name} := {v:#x}", ((at[name], struct.pack("<I", v)),), verdict)
               for name, v, verdict in values]
        return out + [self.case(f"header byte {off} := 0xff", ((off, b"\xff"),), False)
                      for off in (HEADER_END, 200, HEADER_SIZE - 1)]

    def strings(self) -> list[Case]:
        """Each record pointed into the records, at the section's end, one byte past it, at the
        whole section and one byte more, at 257 bytes, at offsets whose u32 sum with the length
        wraps; each string's first byte made invalid UTF-8 (accepted: any bytes are); then
        sections of 0, 32, 39, 40 and 41 bytes and one of 340 holding strings of 256 and 257
        bytes (restring). Decided by the engine's rules (string_refused)."""
        out, size, first = [], self.h["strings_size"], STRING_REC * N_STRINGS
        for s in range(N_STRINGS):
            at = self.h["strings_off"] + STRING_REC * s
            off, n = struct.unpack_from("<II", self.base.data, at)
            values = [(0, n), (first - 1, n), (first, 0), (size, 0), (size - n, n), (size - n + 1, n), (0, size),
                      (0, size + 1), (off, STRING_MAX + 1), (0xFFFFFFFF, 1), (0xFFFFFF00, 0x100), (1, 0xFFFFFFFF),
                      (0x80000000, 0)]
            out += [self.case(f"string {s} := ({o2}, {n2})", ((at, struct.pack("<II", o2, n2)),),
                              string_refused(o2, n2, size)) for o2, n2 in dict.fromkeys(values) if (o2, n2) != (off, n)]
            if n:
                out.append(self.case(f"string {s}'s first byte := 0xff", ((self.h["strings_off"] + off, b"\xff"),), False))
        records = b"".join(struct.pack("<II", first, 0) for _ in range(N_STRINGS))
        out += [self.restring("records alone, every string empty", records, False),
                self.restring("39 bytes", records[:39], True), self.restring("32 bytes", records[:32], True),
                self.restring("0 bytes", b"", True),
                self.restring("41 bytes, every string its one byte",
                              struct.pack("<II", first, 1) * N_STRINGS + b"x", False)]
        big = bytearray(self.base.data[self.h["strings_off"]:self.h["strings_off"] + size].ljust(BIG_STRINGS, b"\0"))
        for o2, n2 in ((first, STRING_MAX), (first, STRING_MAX + 1), (BIG_STRINGS - STRING_MAX, STRING_MAX),
                       (BIG_STRINGS - STRING_MAX + 1, STRING_MAX)):
            big[:STRING_REC] = struct.pack("<II", o2, n2)
            out.append(self.restring(f"{BIG_STRINGS} bytes, string 0 := ({o2}, {n2})", bytes(big),
                                     string_refused(o2, n2, BIG_STRINGS)))
        return out

    def restring(self, label: str, section: bytes, verdict: bool) -> Case:
        """The file with this strings section (strings_size its length), the sections after it
        moved to match and the weights to the next multiple of 4096 after them (a case file's
        weights are zeros: only their place matters)."""
        h = self.h
        delta = len(section) - h["strings_size"]
        end = h["blob_off"] + h["blob_size"]
        weights_off = align_up(end + delta, 4096)
        body = section + self.base.data[h["pieces_off"]:end]
        body += bytes(max(weights_off, h["weights_off"]) - h["strings_off"] - len(body))
        fields = dict(strings_size=len(section), weights_off=weights_off,
                      file_size=h["file_size"] + weights_off - h["weights_off"],
                      **{f: h[f] + delta for f in SHIFTED if f != "strings_off"})
        edits = [(off, struct.pack("<" + code, fields[name])) for name, off, code in HEADER_FIELDS if name in fields]
        return Case(f"strings section of {label}", tuple(edits) + ((h["strings_off"], body),),
                    size=self.base.length + weights_off - h["weights_off"], argv=self.argv(), reject=verdict,
                    accept=not verdict)

    def random_case(self, k: int) -> Case:
        r, h = self.rng, self.h
        if r.random() < 0.5:
            i = r.randrange(len(self.base.ops))
            name, off, code = r.choice(OP_FIELDS)
            width = struct.calcsize(code) * 8
            v = r.choice([r.getrandbits(width), r.choice(U32_EDGES) & ((1 << width) - 1)])
            raw = struct.pack("<" + ("I" if code == "f" else code), v)
            return Case(f"random #{k}: op {i} {name} := {v:#x}", ((h["program_off"] + OP_REC * i + off, raw),),
                        argv=self.argv())
        lo, hi = h["slots_off"], h["pieces_off"]
        edits = tuple((r.randrange(lo, hi), r.randbytes(r.randint(1, 4))) for _ in range(r.randint(1, 4)))
        return Case(f"random #{k}: bytes of the slots, program and strings", edits, argv=self.argv())


FAMILIES = ("opcodes", "operands", "widths", "op_flags", "slot_widths", "counts", "weights", "scalars", "header",
            "strings")


def make_cases4(bases: dict[str, Base4], seed: int, count: int) -> list[Case]:
    """Every systematic case of every base (`model`: its base's name; the label begins with
    its family's name), then seeded random ones from the bases in turn: `count` in all (cut
    when count is smaller)."""
    rng = random.Random(seed)
    makers = {name: _Maker4(base, rng) for name, base in bases.items()}
    cases = []
    for name, m in makers.items():
        for family in FAMILIES:
            cases += [replace(c, model=name, label=f"{family}: {c.label}") for c in getattr(m, family)()]
    k, order = 0, list(makers.items())
    while len(cases) < count:
        name, m = order[k % len(order)]
        cases.append(replace(m.random_case(k), model=name))
        k += 1
    return cases[:count]


def write_case4(path: Path, base: Base4, case: Case) -> None:
    """The mutated file of a case (the weights a hole of zeros: no reader check touches them)."""
    write_case(path, base.data, base.length, case.edits, case.size)
