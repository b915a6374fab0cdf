"""Seeded mutators of version 4 model files: hostile programs as Cases (mutate.Case).

`Base4` parses a valid version 4 file (builder.models.modelfile4 defines the format; this module
only reads a file's header, slots and ops to aim at them). `make_cases4(bases, seed, count)`
returns the systematic families on each base, then seeded random mutations up to `count`:
- opcodes: each op's opcode set to unknown values (0, 10, 11, 255, 2^31, 2^32-1), or to another
  known one;
- operands: each slot operand pointed past the slots, at a slot too narrow for it, at another
  slot as wide and of the same kind (CACHE or plain), a CACHE operand at a plain slot; each slot
  field an op does not use set;
- widths: each op's n, m, k, j set to edge values;
- slot widths and flags: each slot's width at 0, one below what its widest operand needs, that
  width exactly, 65536 and past it; CACHE cleared and set; unknown flag bits;
- op and slot counts: the program rewritten with an op dropped, doubled, moved, LOGITS doubled
  or moved, a slot added or removed, every section after it moved to match (the weights stay
  where they are), and n_ops / n_slots changed alone;
- weights and scalars: each weight offset misaligned, past the region, at its last legal
  place; unknown weight types; each float field set to NaN, infinities, 0, -0, negatives;
- strings: each record pointed into the records, past the section, at 257 bytes.
A case says what must happen where the page decides it by construction: `reject` when a rule
is broken, `accept` when every rule still holds (the same op with a slot as wide and of the
same kind, a wider slot, a program with an op doubled ...); neither where the verdict depends on
more than the field changed: the Python reader's verdict (ModelFile4) is then the one the
engine is held to. emu_tests/models/test_fuzz4.py checks every case against the reader.
"""
from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from builder.models.modelfile import FLT_MAX, HEADER_SIZE
from builder.models.modelfile4 import (CACHE, HEADER_FIELDS, MAX_WIDTH, OP_FIELDS, OP_REC, RULES, SLOT_OPERANDS,
                                       SLOT_REC, STRING_REC, N_STRINGS, Op, OpRec, weight_bytes)
from linker.layout import align_up

from .model import write_case
from .mutate import F32_BITS, MODEL, PROMPTS, U32_EDGES, Case

UNKNOWN_OPS = [0, 10, 11, 255, 0x80000000, 0xFFFFFFFF]
# What each float field an op uses must be (the page's rules): positive and finite, 0 or
# positive and finite (a soft-cap), finite, or anything.
SCALARS = {(Op.NORM, "a"): "positive", (Op.ATTN, "a"): "positive", (Op.ATTN, "c"): "cap", (Op.LOGITS, "c"): "cap",
           (Op.SCALE, "a"): "finite", (Op.EMBED, "a"): "any"}
SHIFTED = ("strings_off", "pieces_off", "index_off", "user_off", "merges_off", "blob_off")  # after the program


def f32_of(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def scalar_ok(rule: str, v: float) -> bool:
    """Whether a float field an op uses may hold v (-0.0 is 0: a soft-cap may be -0.0)."""
    return {"positive": 0 < v <= FLT_MAX, "cap": 0 <= v <= FLT_MAX, "finite": math.isfinite(v), "any": True}[rule]


@dataclass
class Base4:
    """A valid version 4 file, parsed for the mutators: `data` its bytes up to weights_off,
    `length` the file's length."""
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
        """The width each slot's widest operand reads."""
        out = [0] * len(self.slots)
        for o in self.ops:
            for f, width, _ in RULES[Op(o.op)].slots(o):
                out[getattr(o, f)] = max(out[getattr(o, f)], width)
        return out

    def representatives(self) -> list[int]:
        """One op of each (opcode, k > 0, ACC) kind, and the last op: what the op families aim at."""
        seen: dict[tuple, int] = {}
        for i, o in enumerate(self.ops):
            seen.setdefault((o.op, o.k > 0, o.flags), i)
        return sorted(set(seen.values()) | {len(self.ops) - 1})


class _Maker4:
    def __init__(self, base: Base4, rng: random.Random):
        self.base, self.rng, self.h = base, rng, base.header

    def argv(self) -> tuple[bytes, ...]:
        return self.rng.choice([(b"-m", MODEL, b"-p", self.rng.choice(PROMPTS), b"-n", b"2"),
                                (b"-m", MODEL, b"-p", self.rng.choice(PROMPTS), b"--tokens")])

    def op_case(self, label: str, i: int, verdict: bool | None, **fields) -> Case:
        """Op i with fields changed; verdict True: must be refused, False: must be accepted."""
        o = self.base.ops[i]
        raw = OpRec(**{**o.__dict__, **fields}).pack()
        return Case(f"op {i} ({o.name}) {label}", ((self.h["program_off"] + OP_REC * i, raw),), argv=self.argv(),
                    reject=verdict is True, accept=verdict is False)

    # -- families ----------------------------------------------------------------------------
    def opcodes(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            out += [self.op_case(f"opcode := {v:#x}", i, True, op=v) for v in UNKNOWN_OPS]
            out += [self.op_case(f"opcode := {op.name}", i, None, op=int(op)) for op in Op if op != self.base.ops[i].op]
        return out

    def operands(self) -> list[Case]:
        out, slots = [], self.base.slots
        for i in self.base.representatives():
            o = self.base.ops[i]
            rule = RULES[Op(o.op)]
            named = {f: (width, cache) for f, width, cache in rule.slots(o)}
            for f in SLOT_OPERANDS:
                if f not in named:
                    out.append(self.op_case(f"{f} := 1 (unused)", i, True, **{f: 1}))
                    continue
                width, must_cache = named[f]
                is_cache = bool(slots[getattr(o, f)][1] & CACHE)
                out += [self.op_case(f"{f} := {v}", i, True, **{f: v}) for v in (len(slots), 255)]
                same = [s for s, (w, fl) in enumerate(slots) if w >= width and bool(fl & CACHE) == is_cache
                        and s != getattr(o, f)]
                narrow = [s for s, (w, _) in enumerate(slots) if w < width]
                plain = [s for s, (w, fl) in enumerate(slots) if w >= width and not fl & CACHE]
                out += [self.op_case(f"{f} := slot {s}, as wide, same kind", i, False, **{f: s}) for s in same[:2]]
                out += [self.op_case(f"{f} := slot {s}, too narrow", i, True, **{f: s}) for s in narrow[:2]]
                if must_cache:
                    out += [self.op_case(f"{f} := plain slot {s}", i, True, **{f: s}) for s in plain[:2]]
        return out

    def widths(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            used = RULES[Op(o.op)].fields
            for f in ("n", "m", "k", "j"):
                orig = getattr(o, f)
                for v in dict.fromkeys([0, 1, orig - 1, orig + 1, 2 * orig, MAX_WIDTH, MAX_WIDTH + 1, 0xFFFFFFFF]):
                    if v == orig or v < 0:
                        continue
                    verdict = None
                    if f not in used:
                        verdict = True
                    elif f == "n" and (v == 0 or v > MAX_WIDTH):
                        verdict = True      # every op reads an n-wide row (or n-wide groups) of a slot
                    out.append(self.op_case(f"{f} := {v:#x}", i, verdict, **{f: v}))
        return out

    def slot_case(self, label: str, s: int, width: int, flags: int, verdict: bool | None) -> Case:
        raw = struct.pack("<II", width, flags)
        return Case(f"slot {s} {label}", ((self.h["slots_off"] + SLOT_REC * s, raw),), argv=self.argv(),
                    reject=verdict is True, accept=verdict is False)

    def slot_widths(self) -> list[Case]:
        out, needed = [], self.base.needed()
        attn_kv = {getattr(o, f) for o in self.base.ops if o.op == Op.ATTN for f in ("s2", "s3")}
        for s, (width, flags) in enumerate(self.base.slots):
            for v, verdict in ((0, True), (needed[s] - 1, needed[s] > 0), (needed[s], False), (MAX_WIDTH, False),
                               (MAX_WIDTH + 1, True), (0xFFFFFFFF, True)):
                if v != width:
                    out.append(self.slot_case(f"width := {v}", s, v, flags, verdict))
            out.append(self.slot_case("CACHE flipped", s, width, flags ^ CACHE,
                                      True if flags & CACHE and s in attn_kv else False if not flags & CACHE else None))
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
        return Case(label, tuple(edits) + ((HEADER_SIZE, body),), argv=self.argv(), reject=verdict is True,
                    accept=verdict is False)

    def counts(self) -> list[Case]:
        slots, ops = list(self.base.slots), list(self.base.ops)
        last = len(ops) - 1
        made = [
            self.rewrite("last op (LOGITS) dropped", slots, ops[:-1], True),
            self.rewrite("first op dropped", slots, ops[1:], False),
            self.rewrite("op 1 doubled", slots, ops[:2] + ops[1:], False),
            self.rewrite("LOGITS doubled", slots, ops + ops[-1:], True),
            self.rewrite("LOGITS moved first", slots, ops[-1:] + ops[:-1], True),
            self.rewrite("ops 1 and 2 swapped", slots, ops[:1] + [ops[2], ops[1]] + ops[3:], False),
            self.rewrite("the program's first half twice", slots, ops[:last // 2] + ops, False),
            self.rewrite("a slot added, never used", slots + [(16, 0)], ops, False),
            self.rewrite("a CACHE slot added, never used", slots + [(16, CACHE)], ops, False),
            self.rewrite("the last slot removed", slots[:-1], ops, True),
            self.rewrite("LOGITS alone", slots, ops[-1:], False),
        ]
        made += [Case(f"header {name} := {v}", ((off, struct.pack("<I", v)),), argv=self.argv(), reject=True)
                 for name, off, code in HEADER_FIELDS if name in ("n_ops", "n_slots")
                 for v in (0, self.h[name] - 1, self.h[name] + 1, 256, 65537, 0xFFFFFFFF)]
        return [c for c in made if c is not None]

    def weights(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            rule = RULES[Op(o.op)]
            if rule.weight is None:
                out += [self.op_case(f"w := {v:#x} (no weight)", i, True, w=v) for v in (64, 1 << 63)]
                continue
            size = weight_bytes(rule.weight(o, self.h["vocab"]), o.wtype)
            ws = self.h["weights_size"]
            for v, verdict in ((o.w + 1, True), (o.w + 32, True), (ws, True), ((ws - size) // 64 * 64 + 64, True),
                               ((ws - size) // 64 * 64, False), (1 << 63, True), ((1 << 64) - 64, True)):
                if v != o.w:
                    out.append(self.op_case(f"w := {v:#x}", i, verdict, w=v))
            out += [self.op_case(f"wtype := {v:#x}", i, True, wtype=v) for v in (3, 0xFFFFFFFF)]
        return out

    def scalars(self) -> list[Case]:
        out = []
        for i in self.base.representatives():
            o = self.base.ops[i]
            for f in ("a", "c"):
                rule = SCALARS.get((Op(o.op), f)) if f in RULES[Op(o.op)].fields else None
                for bits in F32_BITS:
                    v = f32_of(bits)
                    verdict = (not scalar_ok(rule, v)) if rule else (bits != 0)
                    out.append(self.op_case(f"{f} := f32 bits {bits:#010x}", i, verdict, **{f: v}))
        return out

    def strings(self) -> list[Case]:
        out, size, first = [], self.h["strings_size"], STRING_REC * N_STRINGS
        for s in range(N_STRINGS):
            at = self.h["strings_off"] + STRING_REC * s
            off, n = struct.unpack_from("<II", self.base.data, at)
            for o2, n2, verdict in ((0, n, True), (first - 1, n, True), (size, 0, False), (size - n + 1, n, True),
                                    (off, 257, True), (off, 0xFFFFFFFF, True), (0xFFFFFFFF, 1, True), (first, 0, False)):
                out.append(Case(f"string {s} := ({o2}, {n2})", ((at, struct.pack("<II", o2, n2)),), argv=self.argv(),
                                reject=verdict, accept=not verdict))
        return out

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


def make_cases4(bases: dict[str, Base4], seed: int, count: int) -> list[Case]:
    """Every systematic case of every base (`model`: its base's name), then seeded random ones
    from the bases in turn: `count` in all (cut when count is smaller)."""
    rng = random.Random(seed)
    makers = {name: _Maker4(base, rng) for name, base in bases.items()}
    cases = []
    for name, m in makers.items():
        for family in (m.opcodes, m.operands, m.widths, m.slot_widths, m.counts, m.weights, m.scalars, m.strings):
            cases += [replace(c, model=name) for c in family()]
    k, order = 0, list(makers.items())
    while len(cases) < count:
        name, m = order[k % len(order)]
        cases.append(replace(m.random_case(k), model=name))
        k += 1
    return cases[:count]


def write_case4(path: Path, base: Base4, case: Case) -> None:
    """The mutated file of a case (the weights a hole of zeros: no reader check touches them)."""
    write_case(path, base.data, base.length, case.edits, case.size)
