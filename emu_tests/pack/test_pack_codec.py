"""builder/asm/pack.py and pack_search.py: the packer's codec in Python, its payload format,
its errors, the committed model, and the search command.

The asm decoder is held to this codec in test_pack_stub.py; here the codec is held to itself
(every payload decodes to its input) and to its contract."""
from __future__ import annotations

import math
import random
import subprocess
import sys

import numpy as np
import pytest

from builder.asm import pack, pack_search
from builder.asm.pack_model import MODEL
from builder.asm.packed import image_bytes


def inputs() -> dict[str, bytes]:
    """Inputs that stress different parts: one byte, runs, text, noise, structured code."""
    rng = random.Random(5)
    return {"one byte": b"\x90", "zeros": bytes(3000), "ones": b"\xff" * 700,
            "text": b"the quick brown fox jumps over the lazy dog. " * 40,
            "random": rng.randbytes(1500),
            "two symbols": bytes(rng.choice(b"\x00\xe8") for _ in range(2000))}


@pytest.mark.parametrize("name", list(inputs()))
def test_round_trip(name):
    data = inputs()[name]
    payload = pack.compress(data)
    assert payload.startswith(MODEL.header())
    assert pack.decompress(payload, len(data)) == data


def calls_to(targets: list[int], places: int, seed: int) -> tuple[bytes, list[tuple[int, int]]]:
    """Code-like bytes: `places` call rel32s, each to one of `targets` (offsets), between runs
    of other bytes that never hold 0xE8; and the (position, target) of every call."""
    rng = random.Random(seed)
    out, calls = bytearray(), []
    for _ in range(places):
        out += bytes(rng.choice(b"\x48\x89\xc7\x90\x0f\x00") for _ in range(rng.randrange(1, 9)))
        target = rng.choice(targets)
        calls.append((len(out), target))
        out += b"\xe8" + (target - len(out) - 5 & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(out + b"\x90"), calls


def test_call_filter_names_the_targets():
    """Every call's field becomes its target's offset (forward and backward calls alike), so
    calls of one routine repeat; decode_calls restores the input; and the filter pays."""
    data, calls = calls_to([0, 7, 300, 2000], 300, seed=1)
    coded = pack.encode_calls(data)
    for pos, target in calls:
        assert coded[pos + 1:pos + 5] == target.to_bytes(4, "little")
    assert pack.decode_calls(coded) == data
    assert len(pack.compress(data)) < len(pack.compress(data.replace(b"\xe8", b"\xe9")))


def test_call_filter_edges():
    # a 0xE8 whose dword runs past the end is left alone; the last one inside is coded
    tail = b"\x90" * 10 + b"\xe8\xf1\xff\xff\xff" + b"\xe8\x01\x00\x00"
    coded = pack.encode_calls(tail)
    assert coded[11:15] == (10 + 5 - 15).to_bytes(4, "little") and coded[15:] == tail[15:]
    assert pack.decode_calls(coded) == tail
    # a dword that is no nearby call's but below 2^16 would decode wrongly: refused
    with pytest.raises(pack.PackError, match="byte 0 is 0xE8 before the dword 0xFFFF"):
        pack.compress(b"\xe8\xff\xff\x00\x00")
    # 0xE8s that are no calls, overlapping, any dwords: coded or refused, never decoded
    # wrongly (the filter is no guess)
    rng, refused, changed = random.Random(6), 0, 0
    for _ in range(40):
        data = bytes(rng.choice(b"\xe8\x00\x01\xff") for _ in range(300))
        try:
            coded = pack.encode_calls(data)
        except pack.PackError:
            refused += 1
            continue
        assert pack.decode_calls(coded) == data
        changed += coded != data
    assert refused >= 5 and changed >= 10, (refused, changed)


def test_round_trip_of_the_image(gemma):
    """The build checks it too; here also that the image codes well: the payload is the one
    the shipped file carries, and the model pays (a random input grows, code shrinks)."""
    data = image_bytes(gemma.result.image)
    payload = pack.compress(data)
    assert payload == gemma.result.packed.payload
    assert pack.decompress(payload, len(data)) == data
    assert len(payload) < 0.8 * len(data)


def test_random_input_costs_little_more_than_itself():
    data = random.Random(9).randbytes(4000)
    size = len(pack.compress(data)) - len(MODEL.header())
    # noise costs a little over a bit per bit: the higher-order contexts, each seen once or
    # twice, predict from counts of 1 or 2 (measured: 5.6% here); a flaw in the mix or the
    # coder (a probability stuck near 0 or 1) would cost many times more
    assert len(data) < size < 1.1 * len(data)


def test_redundant_input_shrinks():
    """Beyond what every payload carries (the model, the field tables: a one-byte input's
    payload), 64 KiB of zeros take under 256 bytes (233 with the model of 2026-12-06) and
    9,000 bytes of `abc` under 16 (7)."""
    fixed = len(pack.compress(b"\x90"))
    assert len(pack.compress(bytes(65536))) - fixed < 256
    assert len(pack.compress(b"abc" * 3000)) - fixed < 16


def test_compress_decodes_its_payload_again(monkeypatch):
    """compress checks its payload with the range decoder before returning it: a decoder that
    reads one bit wrong makes it refuse."""
    calls = []
    real = pack.RangeDecoder.bit

    def flip_the_tenth(self, p):
        calls.append(p)
        return real(self, p) ^ (len(calls) == 10)
    monkeypatch.setattr(pack.RangeDecoder, "bit", flip_the_tenth)
    with pytest.raises(pack.PackError, match="does not decode to its input"):
        pack.compress(b"hello, world")


def test_payload_errors_are_one_line():
    payload = pack.compress(b"hello, world")
    with pytest.raises(pack.PackError, match="ends after"):
        pack.decompress(payload[:-2], 12)
    with pytest.raises(pack.PackError, match="1 payload bytes left"):
        pack.decompress(payload + b"\0", 12)
    with pytest.raises(pack.PackError, match="shorter than its model"):
        pack.decompress(payload[:5], 12)
    with pytest.raises(pack.PackError, match="nothing to unpack"):
        pack.decompress(payload, 0)
    with pytest.raises(pack.PackError, match="nothing to pack"):
        pack.compress(b"")


@pytest.mark.parametrize("masks,shifts,message", [
    ((), (), "1..15 context models"),
    (tuple(range(16)), (0,) * 16, "1..15 context models"),
    ((1, 2), (3,), "2 masks and 1 shifts"),
    ((1, 1), (0, 0), "masks repeat"),
    ((256,), (0,), "out of range"),
    ((1,), (13,), "out of range"),
    ((1,), (-1,), "out of range"),
])
def test_model_is_validated(masks, shifts, message):
    with pytest.raises(pack.PackError, match=message):
        pack.Model(masks, shifts)


def test_model_header_round_trips():
    header = MODEL.header()
    assert header[0] == len(MODEL.masks) and len(header) == 1 + 2 * len(MODEL.masks)
    model, offset = pack.Model.read(header + b"rest")
    assert (model, offset) == (MODEL, len(header))
    with pytest.raises(pack.PackError, match="out of range"):
        pack.Model.read(bytes([1, 64, 13]))


def test_key_masks_select_lanes_and_keys_name_the_model():
    """R_i: mask bit k chooses lane k (0 the field, 1 the opcode, 2..7 history bytes 1..6
    back); a key adds its record's offset (32 bytes a model, the first highest), so that
    two models whose lanes hold the same value have different keys."""
    assert pack.key_mask(0b100) == 0xFF << 16
    assert pack.key_mask(0b10000011) == 0xFF << 56 | 0xFFFF
    word = 0x0102030405060708
    assert pack.key_of(word, 0b100, 0, 3) == 0x060000 + 64
    assert pack.key_of(word, 0b1000, 2, 3) == 0x05000000
    assert pack.key_of(0, 1, 0, 2) != pack.key_of(0, 2, 1, 2)


def test_counts_follow_the_rule():
    """One context seen over and over: its counts go up to 255 and halve the other way."""
    mixer = pack.ContextMixer(pack.Model((0,), (0,)))
    for _ in range(300):            # the first bit of every byte: always 1 (c0 = 1)
        mixer.predict()
        mixer.update(1)
        for _ in range(7):
            mixer.predict()
            mixer.update(0)
    slot = mixer.bases[0][0] ^ 1
    assert (mixer.n0[slot], mixer.n1[slot]) == (0, 255)
    mixer.predict()
    mixer.update(0)
    mixer.predict()                  # learns the 0 at the next prediction
    assert (mixer.n0[slot], mixer.n1[slot]) == (1, 128)


def test_search_estimate_agrees_with_the_coder():
    """The search's estimate (no collisions, no one-bit lag) is within 2% of the exact
    payload (the field tables, then the data): close enough to rank models."""
    data = bytes(np.random.default_rng(2).integers(0, 4, 2000, dtype=np.uint8)) + b"\x90" * 500
    stream = pack.encode_calls(pack.TABLES + data)
    bits = pack_search.bits_of(stream)
    counts = [pack_search.ideal_counts(stream, m) for m in MODEL.masks]
    estimate = pack_search.estimate(bits, counts, list(MODEL.shifts))
    exact = len(pack.compress(data)) - len(MODEL.header())
    assert abs(estimate - exact) < 0.02 * exact, (estimate, exact)


def test_search_finds_the_context_that_matters():
    """Data where each byte is the one two back: the search's first mask is byte 2 back
    (lane 3)."""
    rng = np.random.default_rng(4)
    data = bytearray(rng.integers(0, 256, 2, dtype=np.uint8).tobytes())
    for k in range(1500):
        data.append(data[-2] if k % 50 else int(rng.integers(256)))
    model = pack_search.search(bytes(data), 2, progress=False)
    assert model.masks[0] == 0b1000
    fixed = len(pack.compress(b"\x90", model))      # the model and the field tables
    assert len(pack.compress(bytes(data), model)) - fixed < 150


def test_code_length_is_the_payload_less_its_model():
    """refine's measure, pack's own mixer with an ideal coder: the range coder's payload is
    that rounded up plus at most 5 bytes (its last bytes: 32 bits of low end, and one byte a
    renormalisation may leave short)."""
    data = bytes(np.random.default_rng(5).integers(0, 4, 1500, dtype=np.uint8)) + b"\x90" * 300
    length = pack_search.code_length(pack.encode_calls(pack.TABLES + data), MODEL)
    coded = len(pack.compress(data)) - len(MODEL.header())
    assert math.ceil(length) <= coded <= math.ceil(length) + 5, (length, coded)


def test_refine_swaps_in_the_context_that_matters():
    """Runs of `p q p` (each run its own two random bytes), refined from a model of the byte
    one back (which follows p by q or p): the mask becomes byte 3 back (lane 4), which
    predicts every byte of a run after its first three, and the payload shrinks (masks of
    one lane tried: a pass over all 256 masks takes minutes)."""
    rng = np.random.default_rng(6)
    data = b"".join(bytes([p, q, p]) * 13 for p, q in rng.integers(0, 256, (20, 2)))
    start = pack.Model((0b100,), (3,))
    model = pack_search.refine(data, start, progress=False,
                               candidates=[1 << k for k in range(8)])
    assert model.masks == (0b10000,)
    assert len(pack.compress(data, model)) < len(pack.compress(data, start))


def test_pack_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "builder", "pack"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("committed model: ") and "bytes of payload" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "builder", "pack", "--models", "99"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--models must be 1..15" in proc.stderr


def test_write_model_keeps_the_file_importable(tmp_path):
    path = tmp_path / "pack_model.py"
    path.write_text(pack_search.MODEL_FILE.read_text())
    model = pack.Model((1, 2, 3), (4, 5, 6))
    pack_search.write_model(model, path)
    namespace: dict = {}
    exec(path.read_text().replace("from .pack import Model", "from builder.asm.pack import Model"),
         namespace)
    assert namespace["MODEL"] == model
    assert path.read_text().startswith('"""The packer\'s model')
