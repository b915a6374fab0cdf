"""The packer: a bitwise context-mixing model and a range coder, mirrored by asm/unpack.asm.

Contract: `compress(data, model=MODEL) -> bytes` packs `data` (at least one byte) into a
payload that `asm/unpack.asm`'s `unpack` decodes back into `data` given its length;
`decompress(payload, size) -> bytes` is that decoder in Python, step for step the asm's (the
call filter, `encode_calls` / `decode_calls`, included); every payload compress returns has
been decoded again (see compress). Both raise PackError on what they cannot do (an empty
input, a byte 0xE8 the call filter cannot code, a payload that ends too soon or has bytes left
over, a bad model). Everything is integer arithmetic, so the two decoders agree bit for bit on
any input.

The payload: a count byte N, N pairs (mask, shift) — the model — then the coded bits of the
stream TABLES + `data`: the field machine's tables (pack_fields.py), then the data, each
byte's most significant bit first. The model's parameters (`Model`: which lanes of the state
word each context model hashes, and its weight as a shift) are committed data in
`builder/asm/pack_model.py`; `python -m builder pack --search` searches new ones.

The state word, when a byte starts: lane 0 (its low byte) the byte's x86 field and lane 1
its instruction's opcode, as the field machine (pack_fields.Fields) decides them from the
bytes before it; lanes 2..7 the last six bytes, the last one first. Once per byte, each
context model i hashes its key — the lanes its mask chooses, plus 32 times its distance from
the last model (its record's offset in the asm) — into a slot base and a 16-bit check. A
bit's slot in the table of
2^TABLE_BITS slots is its byte's slot base xor c0 (the bits of the byte seen so far, after a
leading 1); a slot holds two counts, n0 and n1, and the check of its context (a slot whose
check differs is a new context: its counts restart at 0). The probability of a 1 is

    p = (sum_i n1_i << shift_i + PRIOR) * 2^32 // (sum_i (n0_i + n1_i) << shift_i + 2 PRIOR)

and the range coder splits its range at range * p >> 32. A slot learns its bit when the next
bit is predicted, in one loop over the models (the first to the last, as the asm walks
them): first model i's previous slot learns the previous bit — its count goes up by one, at
most 255; the other count n becomes n // 2 + 1, 0 stays 0 — then model i reads its new slot.
The first bit's loop teaches slot 0 a 0 (every model's previous slot starts there). When the
field tables are decoded, the table is zeroed (no counts, no checks): what the contexts
learnt from the tables would mislead them on the image (37 bytes of the image's payload).

Before coding, `encode_calls` rewrites each x86 `call rel32` (0xE8 and a displacement) of
the stream to name its target as an offset from the stream's start: the same target, called from many places,
is then the same four bytes, which the contexts learn (the image: 64 bytes less). Decoding
ends with `decode_calls`, its inverse, as asm/unpack.asm does: from the last position whose
four bytes are inside the data down to the first, a byte 0xE8 followed by a dword below
CALL_SPAN gets that dword minus (its position + 5). The encoder walks the other way and
codes a 0xE8 whose target offset is below CALL_SPAN; a 0xE8 that is no such call but whose
dword is below CALL_SPAN would be decoded wrongly, so compress refuses it (PackError).
"""
from __future__ import annotations

from dataclasses import dataclass

from .pack_fields import TABLES, Fields

TABLE_BITS = 18                   # asm/unpack.asm PACK_TABLE_BITS
SCRATCH = 4 << TABLE_BITS         # PACK_SCRATCH: the table's bytes, a slot per dword
HASH = 0x9E3779B97F4A7C15         # PACK_HASH
PRIOR = 2                         # PACK_PRIOR
MASK_BITS = 8                     # a mask: the field, the opcode, six history bytes
MAX_MODELS = 15                   # so that a model's index fits beside c0 in its key
MAX_SHIFT = 12                    # keeps the sums below 2^25: p >= 2^8, every bit codable
COUNT_MAX = 255
TOP = 1 << 24                     # the range is renormalised below this
M64 = (1 << 64) - 1
CALL = 0xE8                       # call rel32's opcode
CALL_SPAN = 1 << 16               # target offsets the call filter codes (asm: a zero top word)


class PackError(Exception):
    """The input cannot be packed or unpacked (one line)."""


@dataclass(frozen=True)
class Model:
    """The context models: `masks[i]` chooses lanes of the state word (bit k: lane k; 0 the
    field, 1 the opcode, 2..7 the bytes 1..6 back), `shifts[i]` is its weight as a power of
    two."""
    masks: tuple[int, ...]
    shifts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.masks) == len(self.shifts) <= MAX_MODELS:
            raise PackError(f"a model has 1..{MAX_MODELS} context models, each a mask and a "
                            f"shift; got {len(self.masks)} masks and {len(self.shifts)} shifts")
        if len(set(self.masks)) != len(self.masks):
            raise PackError(f"masks repeat: {self.masks}")
        for mask, shift in zip(self.masks, self.shifts):
            if not 0 <= mask <= 0xFF or not 0 <= shift <= MAX_SHIFT:
                raise PackError(f"mask {mask} or shift {shift} out of range "
                                f"(0..255, 0..{MAX_SHIFT})")

    def header(self) -> bytes:
        """The payload's first bytes: N, then (mask, shift) per context model."""
        return bytes([len(self.masks)]) + bytes(b for pair in zip(self.masks, self.shifts)
                                                for b in pair)

    @classmethod
    def read(cls, payload: bytes) -> tuple["Model", int]:
        """The model at the start of a payload, and the offset of the coded bits."""
        if not payload or len(payload) < 1 + 2 * payload[0]:
            raise PackError("the payload is shorter than its model")
        n = payload[0]
        pairs = payload[1:1 + 2 * n]
        return cls(tuple(pairs[0::2]), tuple(pairs[1::2])), 1 + 2 * n


def key_mask(mask: int) -> int:
    """R_i of asm/unpack.asm: 0xFF in the lanes (bytes) of the state word that the mask's
    bits choose (bit k: lane k): 0 the byte's field, 1 its instruction's opcode, 2..7 the
    history bytes 1..6 back."""
    return sum(0xFF << 8 * k for k in range(8) if mask >> k & 1)


def key_of(word: int, mask: int, index: int, models: int) -> int:
    """Model `index`'s key: the lanes of the state word its mask chooses, plus its record's
    offset in the asm (32 bytes a model, the first highest) to tell equal lanes apart."""
    return (word & key_mask(mask)) + 32 * (models - 1 - index)


class ContextMixer:
    """The model's state while coding: the table, the history, c0, the field machine, each
    model's slot base, check and previous slot."""

    def __init__(self, model: Model):
        self.model = model
        self.n0 = bytearray(1 << TABLE_BITS)
        self.n1 = bytearray(1 << TABLE_BITS)
        self.check = [0] * (1 << TABLE_BITS)
        self.slots = [0] * len(model.masks)        # each model's previous slot
        self.bit = 0                               # the previous bit
        self.history = 0                           # the last six bytes in lanes 2..7
        self.c0 = 1
        self.fields = Fields()
        self.out = bytearray()                     # the bytes so far (TABLES first)
        self.bases: list[tuple[int, int]] = []
        self.hash_byte()

    def hash_byte(self) -> None:
        """Each model's slot base and check for the byte that starts: the state word is the
        history, the field context in lanes 0 and 1 (pack_fields.Fields.context)."""
        word = self.history | self.fields.context()
        n = len(self.model.masks)
        self.bases = []
        for i, mask in enumerate(self.model.masks):
            h = key_of(word, mask, i, n) * HASH & M64
            self.bases.append((h >> 64 - TABLE_BITS, h >> 48 - TABLE_BITS & 0xFFFF))

    def predict(self) -> int:
        """Teach the previous slots the previous bit; P(the next bit is 1) times 2^32, in
        (0, 2^32)."""
        num = den = 0
        n0, n1, check = self.n0, self.n1, self.check
        same, other = (n1, n0) if self.bit else (n0, n1)
        c0 = self.c0
        for i, (shift, (base, tag)) in enumerate(zip(self.model.shifts, self.bases)):
            slot = self.slots[i]
            same[slot] = min(same[slot] + 1, COUNT_MAX)
            if other[slot]:
                other[slot] = other[slot] // 2 + 1
            slot = self.slots[i] = base ^ c0
            if check[slot] != tag:                 # a new context
                check[slot], n0[slot], n1[slot] = tag, 0, 0
            num += n1[slot] << shift
            den += n0[slot] + n1[slot] << shift
        return (num + PRIOR << 32) // (den + 2 * PRIOR)

    def update(self, bit: int) -> int | None:
        """Take `bit` (learnt at the next predict); return the byte it completes, if any."""
        self.bit = bit
        self.c0 = self.c0 << 1 | bit
        if self.c0 < 0x100:
            return None
        byte, self.c0 = self.c0 & 0xFF, 1          # into lane 2, the oldest byte out
        self.history = (self.history << 8 | byte << 16) & M64
        self.out.append(byte)
        if len(self.out) == len(TABLES):           # the image starts afresh: no counts
            self.n0[:], self.n1[:] = bytes(len(self.n0)), bytes(len(self.n1))
            self.check[:] = [0] * len(self.check)
        self.fields.step(byte, self.out)
        self.hash_byte()
        return byte


class RangeDecoder:
    """The range decoder over a payload's coded bits (asm/unpack.asm: r9d range, r10d code),
    from byte `pos` on; `bit(p)` decodes one bit of probability p / 2^32 of being 1."""

    def __init__(self, payload: bytes, pos: int):
        self.payload, self.pos, self.rng, self.code = payload, pos, 1, 0

    def bit(self, p: int) -> int:
        while self.rng < TOP:
            if self.pos == len(self.payload):
                raise PackError("the payload ends too soon")
            self.rng <<= 8
            self.code = (self.code << 8 | self.payload[self.pos]) & 0xFFFFFFFF
            self.pos += 1
        bound = self.rng * p >> 32
        if self.code < bound:
            self.rng = bound
            return 1
        self.code, self.rng = self.code - bound, self.rng - bound
        return 0

    def left(self) -> int:
        """Payload bytes not read."""
        return len(self.payload) - self.pos


def _dword(data: bytearray, pos: int) -> int:
    return int.from_bytes(data[pos:pos + 4], "little")


def encode_calls(data: bytes, image_at: int = 0) -> bytes:
    """`data` with each call rel32 whose target offset is below CALL_SPAN naming that
    offset (see the module docstring); decode_calls undoes it. A refusal names the byte's
    offset from `image_at` (where the image starts in `data`)."""
    out = bytearray(data)
    for pos in range(len(out) - 4):
        if out[pos] != CALL:
            continue
        rel = _dword(out, pos + 1)
        target = rel + pos + 5 & 0xFFFFFFFF
        if target < CALL_SPAN:
            out[pos + 1:pos + 5] = target.to_bytes(4, "little")
        elif rel < CALL_SPAN:
            raise PackError(f"byte {pos - image_at} is 0x{CALL:X} before the dword "
                            f"0x{rel:X}: the call filter cannot code it (move the bytes there)")
    return bytes(out)


def decode_calls(data: bytes) -> bytes:
    """The calls of encode_calls' output back, as asm/unpack.asm restores them."""
    out = bytearray(data)
    for pos in range(len(out) - 5, -1, -1):
        if out[pos] == CALL and _dword(out, pos + 1) < CALL_SPAN:
            rel = _dword(out, pos + 1) - (pos + 5) & 0xFFFFFFFF
            out[pos + 1:pos + 5] = rel.to_bytes(4, "little")
    return bytes(out)


def compress(data: bytes, model: Model | None = None) -> bytes:
    """The payload for `data` (see the module docstring), checked: it is decoded again by the
    RangeDecoder, fed the model's probability for each bit, and must give every bit of `data`
    and use every byte. (decompress feeds the same decoder from its own ContextMixer, which on
    the same bits gives the same probabilities: so decompress returns `data`.)"""
    return encode(data, model)[0]


def encode(data: bytes, model: Model | None = None) -> tuple[bytes, int]:
    """compress's payload, and the coded bytes the field tables took (the range coder's
    output when their last bit was coded: within a byte of their share)."""
    if not data:
        raise PackError("nothing to pack")
    if model is None:
        from .pack_model import MODEL as model
    stream = TABLES + data
    coded_data = encode_calls(stream, len(TABLES))
    if decode_calls(coded_data) != stream:
        raise PackError("the call filter does not undo itself")
    mixer = ContextMixer(model)
    coded: list[tuple[int, int]] = []   # (probability, bit)
    low, rng, size = 0, 1, 0           # low: every byte so far, an integer of `size` bytes
    tables = 0
    for at, byte in enumerate(coded_data):
        if at == len(TABLES):
            tables = size
        for k in range(7, -1, -1):
            while rng < TOP:
                rng, low, size = rng << 8, low << 8, size + 1
            p, bit = mixer.predict(), byte >> k & 1
            bound = rng * p >> 32
            if bit:
                rng = bound
            else:
                low, rng = low + bound, rng - bound
            mixer.update(bit)
            coded.append((p, bit))
    payload = model.header() + low.to_bytes(size, "big")
    decoder = RangeDecoder(payload, len(model.header()))
    if any(decoder.bit(p) != bit for p, bit in coded) or decoder.left():
        raise PackError("the payload does not decode to its input")
    return payload, tables


def decompress(payload: bytes, size: int) -> bytes:
    """`size` bytes decoded from `payload` exactly as asm/unpack.asm decodes them (after
    the field tables, which it decodes first)."""
    if size < 1:
        raise PackError("nothing to unpack")
    model, pos = Model.read(payload)
    mixer = ContextMixer(model)
    decoder = RangeDecoder(payload, pos)
    while len(mixer.out) < len(TABLES) + size:
        try:
            mixer.update(decoder.bit(mixer.predict()))
        except PackError:
            raise PackError(f"the payload ends after {max(len(mixer.out) - len(TABLES), 0)} "
                            f"of {size} bytes") from None
    if decoder.left():
        raise PackError(f"{decoder.left()} payload bytes left after {size} bytes")
    return decode_calls(bytes(mixer.out))[len(TABLES):]
