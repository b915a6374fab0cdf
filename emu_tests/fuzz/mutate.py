"""Seeded mutators: hostile model files and command lines for the real binary.

`make_cases(base, seed, count)` returns `count` Cases: first the systematic list (every header
field of the version 4 header set to edge values; counts whose 32-bit products wrap back to
the real sizes; offsets and sizes past the end and wrapping 64 bits; truncation at and around
every section, field, record and weight boundary; corrupted piece records, index, user list
and blob; NaN and infinity in the weights; hostile command lines), then seeded random
mutations up to `count`. The program's own fields (opcodes, operands, widths, scalars ...)
are mutate4's. The
same (base, seed, count) always gives the same cases, so a failure is reproduced by its number.

A Case is data only: which model file it starts from (`model`, a name the runner maps to a
path), (offset, bytes) edits on it, an optional new length, an argv whose placeholders (MODEL,
LOGITS, ...) the runner fills in, where stdout goes, and what must happen: `reject` when the
input breaks the contract (the engine must refuse it), `accept` when it is valid (the engine
must run it), neither when either is fine; and `status`, the exit status a refusal must have
when the contract fixes it (2 for a malformed command line, 1 for a bad value or file).
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass, replace

from builder.models.modelfile import BYTE, DIM_LIMITS, HEADER_SIZE, PIECE, PIECE_REC, Q8_0_BLOCK, QK8_0
from builder.models.modelfile4 import HEADER_END, HEADER_FIELDS, MAX_SLOTS, Op
from emu_tests.asm_facts import constant

from .model import PIECE_FIELDS, Base, header_problems, parse_header

MODEL = b"@MODEL@"      # the case's model file (the base file when the case has no edits)
LOGITS = b"@LOGITS@"    # a writable path in the runner's directory
NOFILE = b"@NOFILE@"    # a path that does not exist
EMPTY = b"@EMPTY@"      # an empty file
DIR = b"@DIR@"          # a directory
LINK = b"@LINK@"        # a symbolic link to the case's model file
HARDLINK = b"@HARDLINK@"    # a hard link to it (the runner makes both per case)
FIFO = b"@FIFO@"        # a named pipe nobody writes to
LOOP = b"@LOOP@"        # a symbolic link to itself

DEFAULT_CTX = constant("DEFAULT_CTX")  # -c when not given: min(this, max_ctx) (asm/main.asm)

PROMPTS = [b"Hello world", b"<start_of_turn>user\n\tHi  there</h1><b>x</b>\n\n<end_of_turn>",
           "日本語 🙂 ünïcödé".encode(), b"\x01\x02 \x7f", b"a", b"1234 5678 the cat"]
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3", b"a\xc3", b"\xe2\x96", b"\xe2\x96 x", b"\xc0\xaf",
            b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80\x80\x80",
            b"ok\xe6\x97\xa5\xe6\x9c", b"\xf0\x9f\x99", b"\x80" * 300]
NUMERIC_FLAGS = [b"-n", b"--temp", b"--top-p", b"-s", b"-t", b"-c"]
VALUE_FLAGS = [b"-m", b"-p", b"--logits"] + NUMERIC_FLAGS
NOT_NUMBERS = [b"", b"abc", b"1x", b"x1", b".", b"-", b"--", b"\xd9\xa1", b"\xef\xbc\x91",
               b"1 2", b"0x", b"e5", b"--tokens"]
NUMBERS = [b"0", b"1", b"-1", b"-0", b"+1", b" 1", b"1 ", b"0x10", b"1e3", b"1.5", b"nan",
           b"inf", b"-inf", b"1e999", b"-1e999", b"1e-50", b"0.000000000000000000001",
           b"4294967295", b"4294967296", b"2147483648", b"-2147483649", b"18446744073709551615",
           b"9223372036854775808", b"65536", b"100000000", b"3.4e38", b"1e-45"]
TOO_BIG = [b"18446744073709551616", b"99999999999999999999", b"9" * 100]
U32_EDGES = [0, 1, 2, 3, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]
F32_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F800000, 0xFF800000, 0, 0x80000000,
            0xBF800000, 0x00000001, 0x7F7FFFFF, 0x00800000]
F16_BITS = [0x7E00, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001]
# counts and the multiple that wraps their table's size (count x record bytes) by 2^32
COUNT_WRAPS = {"vocab": 1 << 28, "n_slots": 1 << 29, "n_ops": 1 << 28, "n_index": 1 << 30, "n_user": 1 << 30,
               "n_merges": 1 << 28}
# the sized sections: offset, size, and the field the end must meet
SIZED = [("strings_off", "strings_size", "pieces_off"), ("blob_off", "blob_size", None),
         ("weights_off", "weights_size", "file_size")]
# weights set whole to NaN, infinity, FP16's and FP32's extremes, 0: (opcode, which of its
# ops (-1: the last), bits); the ROPE frequencies to what fsincos cannot reduce (inf, NaN,
# huge), 0 and negative
WEIGHT_PICKS = [(Op.NORM, 0, 0x7FC00000), (Op.NORM, 0, 0), (Op.NORM, -1, 0x7F800000), (Op.NORM, -1, 0xFF800000),
                (Op.NORM, 1, 0x7F7FFFFF), (Op.EMBED, 0, 0x7E00), (Op.EMBED, 0, 0x7BFF), (Op.EMBED, 0, 0xFC00),
                (Op.MATMUL, 0, 0x7C00), (Op.MATMUL, 1, 0x7BFF), (Op.MATMUL, 2, 0x7E00), (Op.MATMUL, 4, 0x7BFF),
                (Op.MATMUL, -1, 0x7C00), (Op.ROPE, 0, 0x7FC00000), (Op.ROPE, 0, 0x7F800000),
                (Op.ROPE, 0, 0x7F7FFFFF), (Op.ROPE, 0, 0x5F000000), (Op.ROPE, 0, 0), (Op.ROPE, -1, 0xC0000000),
                (Op.LOGITS, 0, 0x7C00)]


@dataclass(frozen=True)
class Case:
    label: str
    edits: tuple[tuple[int, bytes], ...] = ()
    size: int | None = None
    argv: tuple[bytes, ...] = ()
    stdout: str = "pipe"        # "pipe" or "full" (/dev/full)
    closed: tuple[int, ...] = ()    # descriptors closed when the engine starts (0, 1, 2)
    reject: bool = False
    model: str = "main"
    private: bool = False       # run on a private copy of the model even without edits
    accept: bool = False        # the input is valid: the engine must run it (exit status 0)
    memory: int | None = None   # address-space limit (bytes) instead of the runner's default
    status: int | None = None   # the exit status it must end with (None: any of 0, 1, 2)

    def recipe(self) -> str:
        """The case in words: what was done to the file and the command line."""
        parts = [f"model {self.model}: {self.label}"]
        parts += [f"bytes at {off} (0x{off:x}) := {data[:16].hex()}{'...' if len(data) > 16 else ''}"
                  f" ({len(data)} bytes)" for off, data in self.edits[:6]]
        if len(self.edits) > 6:
            parts.append(f"... {len(self.edits) - 6} more edits")
        if self.size is not None:
            parts.append(f"file length := {self.size}")
        parts.append("argv: gemma " + " ".join(repr(a)[1:] if len(a) < 60 else
                                               f"<{len(a)} bytes {a[:20]!r}...>" for a in self.argv))
        if self.stdout != "pipe":
            parts.append(f"stdout: {self.stdout}")
        if self.closed:
            parts.append(f"descriptors {self.closed} closed")
        if self.memory:
            parts.append(f"address space limited to {self.memory} bytes")
        return "; ".join(parts)


class _Maker:
    """Builds cases on one base file; `rng` picks the command line of each file mutation;
    `tokens_only`: every run is --tokens (the weights are a hole never to be read)."""

    def __init__(self, base: Base, rng: random.Random, tokens_only: bool = False):
        self.base, self.rng, self.tokens_only = base, rng, tokens_only
        self.h = base.header
        self.len = base.length

    # -- helpers ---------------------------------------------------------------------------
    def argv(self, prompt: bytes | None = None) -> tuple[bytes, ...]:
        p = prompt if prompt is not None else self.rng.choice(PROMPTS)
        if self.tokens_only:
            return (b"-m", MODEL, b"-p", p, b"--tokens")
        return self.rng.choice([
            (b"-m", MODEL, b"-p", p, b"-n", b"2"),
            (b"-m", MODEL, b"-p", p, b"--tokens"),
            (b"-m", MODEL, b"-p", p, b"-n", b"2", b"--temp", b"1", b"-s", b"7", b"--top-p", b"0.9"),
            (b"-m", MODEL, b"-p", p, b"-n", b"2", b"--logits", LOGITS)])

    def header_case(self, label: str, values: dict, size: int | None = None,
                    prompt: bytes | None = None) -> Case:
        """Set header fields (name -> value); `reject` from version 4's rules
        (model.header_problems)."""
        h = dict(self.h, **values)
        length = self.len if size is None else size
        edits = []
        for name, off, code in HEADER_FIELDS:
            if name in values and off + struct.calcsize(code) <= length:
                edits.append((off, struct.pack("<" + code, values[name])))
        reject = length < HEADER_SIZE or bool(header_problems(h, length, self.base.weights_end))
        return Case(label, tuple(edits), size, self.argv(prompt), reject=reject)

    def u32_at(self, off: int, v: int) -> tuple[int, bytes]:
        return off, struct.pack("<I", v & 0xFFFFFFFF)

    def piece_text(self, i: int) -> bytes:
        """A prompt that makes the tokenizer reach piece i."""
        blob_off, n, score, kind = self.base.pieces[i]
        raw = self.base.data[self.h["blob_off"] + blob_off:self.h["blob_off"] + blob_off + n]
        if kind == BYTE:
            raw = bytes([i - self.h["byte_base"]])
        return raw.replace("\u2581".encode(), b" ").replace(b"\0", b"\1") + b" and more text"

    # -- systematic families ---------------------------------------------------------------
    def header_fields(self) -> list[Case]:
        out = []
        for name, off, code in HEADER_FIELDS:
            orig = self.h[name]
            if code == "8s":
                for i in range(8):
                    bad = bytearray(orig)
                    bad[i] ^= 0x20
                    out.append(self.header_case(f"magic byte {i} flipped", {name: bytes(bad)}))
                out.append(self.header_case("magic zeroed", {name: bytes(8)}))
                continue
            if code == "I":
                values = U32_EDGES + [orig - 1, orig + 1, 2 * orig, orig | 0x80000000]
                mask = 0xFFFFFFFF
            else:
                fs = self.h["file_size"]
                values = [0, 1, orig - 1, orig + 1, orig + 64, orig + 4096, fs - 1, fs, fs + 1,
                          1 << 32, (1 << 32) + orig, 1 << 63, (1 << 64) - 1, (1 << 64) - orig,
                          (1 << 64) - 4096]
                mask = (1 << 64) - 1
            for v in dict.fromkeys(v & mask for v in values):
                if v != orig:
                    out.append(self.header_case(f"{name} := {v:#x}", {name: v}))
        pad = HEADER_SIZE - HEADER_END         # readers ignore these bytes
        out.append(Case(f"header padding {HEADER_END}..{HEADER_SIZE - 1} := 0xff", ((HEADER_END, b"\xff" * pad),),
                        argv=self.argv(), accept=True))
        return out

    def wraps(self) -> list[Case]:
        """Counts whose table sizes wrap 32 bits back to the real ones, offsets near 2^64 and
        2^32 past the real ones, and sized sections whose offset + size wraps 64 bits back onto
        the next section."""
        h, M, out = self.h, 1 << 64, []
        for name, k in COUNT_WRAPS.items():
            out.append(self.header_case(f"{name} += {k:#x}: its table's size wraps 32 bits", {name: h[name] + k}))
        out.append(self.header_case("n_slots := 256 (a byte's slot numbers past it)", {"n_slots": MAX_SLOTS + 1}))
        for name in ("slots_off", "program_off", "strings_off", "pieces_off", "index_off", "user_off", "merges_off",
                     "blob_off"):
            o = h[name]
            out.append(self.header_case(f"{name} near 2^64: offset + size wraps 64 bits", {name: M - 1024}))
            out.append(self.header_case(f"{name} += 2^32", {name: o + (1 << 32)}))
            out.append(self.header_case(f"{name} := 2^64-1", {name: M - 1}))
        for off, size, nxt in SIZED:
            end = h[off] + h[size] if nxt is None else h[nxt]
            for k in (1, 2, 16):
                o = M - 4096 * k
                out.append(self.header_case(f"{off}=2^64-{4096 * k}: {off} + {size} wraps to the real end",
                                            {off: o, size: (end - o) % M}))
            out.append(self.header_case(f"{off} += 2^32, {size} -= 2^32 (mod 2^64)",
                                        {off: h[off] + (1 << 32), size: (h[size] - (1 << 32)) % M}))
        return out

    def truncations(self, above: int = -1, around=(-1, 0, 1)) -> list[Case]:
        """Lengths at and `around` every boundary past `above`: header left alone, file_size
        patched, and file_size and weights_size both patched (only tensors are missing)."""
        out = []
        points = sorted({b + d for b in self.base.boundaries().values() if b > above
                         for d in around} | {self.len + 1, self.len + 4096, 1, 7, 64})
        for n in points:
            if n < 0 or n == self.len:
                continue
            out.append(Case(f"file truncated to {n} bytes", size=n, argv=self.argv(), reject=True))
            out.append(self.header_case(f"file truncated to {n}, file_size := {n}",
                                        {"file_size": n}, size=n))
            ws = (n - self.h["weights_off"]) % (1 << 64)
            out.append(self.header_case(f"file truncated to {n}, file_size and weights_size agree",
                                        {"file_size": n, "weights_size": ws}, size=n))
        return out

    def tokenizer_tables(self) -> list[Case]:
        h, b, out = self.h, self.base, []
        ids = dict.fromkeys([h["bos"], h["eos"], 0, 3, h["byte_base"], h["byte_base"] + 255,
                             b.index[0], b.index[len(b.index) // 2], b.index[-1], h["vocab"] - 1]
                            + b.user[:1] + b.user[-1:])
        values = {"blob_off": [h["blob_size"], h["blob_size"] - 1, 0x7FFFFFFF, 0xFFFFFFFF],
                  "len": [0, h["max_piece_len"] + 1, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF],
                  "score": [0x7FC00000, 0x7F800000, 0xFF800000, 0x7F7FFFFF],
                  "type": [0, 1, 2, 3, 4, 5, 6, 7, 0xFFFFFFFF]}
        for i in ids:
            for field, foff in PIECE_FIELDS:
                for v in values[field]:
                    at = h["pieces_off"] + PIECE_REC * i + foff
                    out.append(Case(f"piece {i} {field} := {v:#x}", (self.u32_at(at, v),),
                                    argv=self.argv(self.piece_text(i))))
        for field, foff in PIECE_FIELDS:       # every record: hits whatever is sampled
            for v in values[field]:
                edits = tuple(self.u32_at(h["pieces_off"] + PIECE_REC * i + foff, v)
                              for i in range(h["vocab"]))
                out.append(Case(f"every piece {field} := {v:#x}", edits, argv=self.argv()))
        n = len(b.index)
        for pos in (0, n // 2, n - 1):
            text = self.piece_text(b.index[pos])
            for v in (h["vocab"], h["vocab"] + 1, 0x7FFFFFFF, 0xFFFFFFFF, 0, h["bos"],
                      h["byte_base"], *(b.user[:1])):
                out.append(Case(f"index[{pos}] := {v:#x}",
                                (self.u32_at(h["index_off"] + 4 * pos, v),), argv=self.argv(text)))

        def index_case(label: str, entries: list[int]) -> Case:
            return Case(label, ((h["index_off"], struct.pack(f"<{len(entries)}I", *entries)),),
                        argv=self.argv())
        for pos in (0, n // 2, n - 2):
            e = list(b.index)
            e[pos], e[pos + 1] = e[pos + 1], e[pos]
            out.append(index_case(f"index entries {pos} and {pos + 1} swapped", e))
        shuffled = list(b.index)
        random.Random(1).shuffle(shuffled)
        out += [index_case("index reversed", b.index[::-1]),
                index_case("index shuffled", shuffled),
                index_case("index all zero", [0] * n),
                index_case("index all vocab-1", [h["vocab"] - 1] * n),
                index_case("index first half twice", (b.index[:n // 2] * 2 + b.index)[:n])]
        user_prompt = PROMPTS[1]
        for pos in dict.fromkeys((0, len(b.user) - 1)) if b.user else ():
            for v in (h["vocab"], 0xFFFFFFFF, b.index[0], h["byte_base"]):
                out.append(Case(f"user[{pos}] := {v:#x}",
                                (self.u32_at(h["user_off"] + 4 * pos, v),),
                                argv=self.argv(user_prompt)))
        if b.user:
            out.append(Case("user list reversed (shortest first)", ((h["user_off"], struct.pack(
                f"<{len(b.user)}I", *b.user[::-1])),), argv=self.argv(user_prompt)))
        bo, bs = h["blob_off"], h["blob_size"]
        rnd = random.Random(2).randbytes(bs)
        for label, data in (("blob all 0xff", b"\xff" * bs), ("blob all zero", bytes(bs)),
                            ("blob random", rnd), ("blob reversed", b.data[bo:bo + bs][::-1])):
            for prompt in (PROMPTS[0], PROMPTS[2]):
                out.append(Case(label, ((bo, data),), argv=self.argv(prompt)))
        return out

    def float_weights(self) -> list[Case]:
        """NaN, infinity and f16 extremes in the weights the program reads (WEIGHT_PICKS),
        sampled greedily and with temperature."""
        out, wo = [], self.h["weights_off"]
        at = {t.offset: t for t in self.base.weights}
        for op, which, bits in WEIGHT_PICKS:
            ops = [o for o in self.base.ops if o.op == op]
            if not -len(ops) <= which < len(ops):
                continue
            t = at[ops[which].w]
            if t.dtype == "q8_0":  # every block's FP16 scale := bits, its weights q := 127
                edit = ((wo + t.offset, (bits.to_bytes(2, "little") + b"\x7f" * QK8_0) * (t.nbytes // Q8_0_BLOCK)),)
            else:
                width = 2 if t.dtype == "f16" else 4
                edit = ((wo + t.offset, (bits & (1 << 8 * width) - 1).to_bytes(width, "little") * (t.nbytes // width)),)
            for tail in ((), (b"--temp", b"1", b"--top-p", b"0.9", b"-s", b"3", b"-t", b"3"),
                         (b"--baseline",)):
                out.append(Case(f"{t.name} all {t.dtype} bits {bits:#x}", edit,
                                argv=(b"-m", MODEL, b"-p", PROMPTS[0], b"-n", b"3") + tail))
        return out

    def command_lines(self) -> list[Case]:
        ok = (b"-m", MODEL, b"-p", b"hi", b"-n", b"2")
        out = []
        for f in VALUE_FLAGS:
            out.append(Case(f"{f!r} without a value", argv=ok + (f,), reject=True, status=2))
        for bad in (b"-x", b"--foo", b"-", b"--", b"-mm", b"--temp=1", b"-n5", b"---", b"-M",
                    b"--TOKENS", b"\xff", b"", b"-p\xff", b"--top", b"--logit", b"-tokens",
                    b"-x\ny", b"\n", b"\r\n", b"x" * 300 + b"\n" + b"y", b"\x1b[2J",
                    b"hello", b"m", b"2", b"model.bin"):
            out.append(Case(f"unknown flag or stray argument {bad!r} last", argv=ok + (bad,),
                            reject=True, status=2))
            out.append(Case(f"unknown flag or stray argument {bad!r} first", argv=(bad,) + ok,
                            reject=True, status=2))
        for argv in ((b"-p", b"x", b"-f", MODEL), (b"-f", MODEL, b"-p", b"x"),
                     (b"-f", NOFILE, b"-p", b""), (b"-p", b"", b"-f", b"-"),
                     (b"-f", DIR, b"-p", b"x", b"-f", NOFILE)):
            out.append(Case(f"-p and -f {argv!r}", argv=(b"-m", MODEL) + argv, reject=True,
                            status=2))
        for f in NUMERIC_FLAGS:
            for v in NOT_NUMBERS + TOO_BIG:
                out.append(Case(f"{f!r} {v!r}", argv=ok + (f, v), reject=True))
            for v in NUMBERS:
                out.append(Case(f"{f!r} {v!r}", argv=ok + (f, v),
                                reject=v.startswith(b"-") and f in (b"-n", b"-t", b"-c")
                                and v.strip(b"-0") != b""))
        for path in (NOFILE, EMPTY, DIR, b"/dev/null", b"/dev/zero", b"", b"/", b"/proc/self/maps",
                     b"/etc/passwd", b"/" + b"a" * 5000, FIFO, LOOP, b"/dev/stdin",
                     b"/proc/self/fd/0", b"/proc/self/exe", (b"x/" * 3000) + b"m.bin"):
            out.append(Case(f"model path {path!r}", argv=(b"-m", path, b"-p", b"hi"), reject=True))
        for argv in ((b"-n", b"1\n2"), (b"-m", b"/no\nfile"), (b"--logits", b"/no/x\ny"),
                     (b"--temp", b"\n")):
            out.append(Case(f"newline in a refused value {argv!r}", argv=ok + argv, reject=True))
        out.append(Case("no -m", argv=(b"-p", b"hi", b"-n", b"2"), reject=True, status=2))
        out.append(Case("only --tokens", argv=(b"--tokens",), reject=True, status=2))
        for p in [b""] + BAD_UTF8:
            for tail in ((b"-n", b"2"), (b"--tokens",)):
                out.append(Case(f"prompt {p[:12]!r}", argv=(b"-m", MODEL, b"-p", p) + tail))
        ctx = min(self.h["max_ctx"], DEFAULT_CTX)
        for k in (6, 7, 8, 9):       # k control bytes -> k byte pieces + BOS = k+1 tokens
            out.append(Case(f"-c 8, prompt of {k + 1} tokens", argv=(
                b"-m", MODEL, b"-c", b"8", b"-p", b"\x01" * k, b"-n", b"4"), reject=k + 1 > 8))
        for n in (ctx - 1, ctx, ctx + 1, 2 * ctx):   # --tokens counts any prompt; without it,
            out.append(Case(f"prompt of {n} byte tokens + BOS (default context {ctx})",
                            argv=(b"-m", MODEL, b"-p", b"\x01" * n, b"--tokens"), accept=True))
            if n + 1 > ctx:                         # refused in tokenize, before any forward pass
                out.append(Case(f"prompt of {n} byte tokens + BOS (default context {ctx}), run",
                                argv=(b"-m", MODEL, b"-p", b"\x01" * n, b"-n", b"1"),
                                reject=True))
        for label, p in (("100000 x 'a'", b"a" * 100000), ("131000 bytes \\x01", b"\x01" * 131000),
                         ("40000 x '日'", "日".encode() * 40000),
                         ("120000 random printable", bytes(random.Random(3).choices(
                             range(32, 127), k=120000))),
                         ("65000 x 'ab '", b"ab " * 21666)):
            out.append(Case(f"long prompt {label}", argv=(b"-m", MODEL, b"-p", p, b"-n", b"2"),
                            reject=True))
        out.append(Case("-c 4 -n 1000", argv=(b"-m", MODEL, b"-c", b"4", b"-p", b"a", b"-n", b"1000")))
        out.append(Case("-c 1 -p ''", argv=(b"-m", MODEL, b"-c", b"1", b"-p", b"", b"-n", b"5")))
        for dest, reject in ((DIR, True), (NOFILE + b"/x", True), (b"/dev/full", True),
                             (b"/dev/null", False), (b"", True), (MODEL + b".missing/x", True)):
            out.append(Case(f"--logits {dest!r}", argv=ok + (b"--logits", dest), reject=reject))
        for dest in (MODEL, LINK, HARDLINK, b"/proc/self/fd/3"):
            for tail in ((b"-n", b"2"), (b"--tokens",)):
                out.append(Case(f"--logits is the model ({dest!r}) {tail!r}", argv=(
                    b"-m", MODEL, b"-p", b"hi", b"--logits", dest) + tail, private=True))
        out.append(Case("stdout /dev/full, --tokens", argv=(b"-m", MODEL, b"-p", b"hi", b"--tokens"),
                        stdout="full", reject=True))
        out.append(Case("stdout /dev/full, -n 2", argv=ok, stdout="full"))
        out.append(Case("stdout /dev/full, -n 2, 4 threads", argv=ok + (b"-t", b"4"), stdout="full"))
        for closed in ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)):
            for label, argv, reject in (
                    ("--tokens", (b"-m", MODEL, b"-p", b"hi", b"--tokens"), 1 in closed),
                    ("-n 2 --logits", ok + (b"--logits", LOGITS), None),
                    ("-n 2, 4 threads", ok + (b"-t", b"4"), None),
                    ("bad flag", ok + (b"-x",), True), ("missing model", (b"-m", NOFILE), True),
                    ("truncated model", (b"-m", EMPTY, b"-p", b"x"), True)):
                out.append(Case(f"fds {closed} closed, {label}", argv=argv, closed=closed,
                                reject=bool(reject), private=True,
                                status=2 if label == "bad flag" else None))
        for argv in ((b"-n", b"2", b"-n", b"3"), (b"-m", NOFILE), (b"-m", EMPTY), (b"-p", b"x"),
                     (b"--tokens", b"--tokens"), (b"-p", b"-n"), (b"-t", b"64"), (b"-t", b"1000"),
                     (b"-s", b"0"), (b"-c", b"100000"), (b"-c", b"4294967295")):
            out.append(Case(f"extra {argv!r}", argv=ok + argv))
        out.append(Case("-m -p", argv=(b"-m", b"-p", b"hi")))
        out.append(Case("2000 x --tokens", argv=(b"-m", MODEL, b"-p", b"hi") + (b"--tokens",) * 2000))
        tiny = b"0." + b"0" * 29 + b"1"         # 1e-30 (values take no exponent)
        for t in (tiny, b"0.0000001", b"0.5", b"1", b"100", b"9223372036854775807",
                  b"0." + b"0" * 44 + b"1"):
            for p in (b"0", tiny, b"0.5", b"1"):
                out.append(Case(f"--temp {t!r} --top-p {p!r}", argv=(
                    b"-m", MODEL, b"-p", PROMPTS[0], b"-n", b"6", b"--temp", t, b"--top-p", p,
                    b"-s", b"11")))
        return out

    def memory_limits(self) -> list[Case]:
        """Address space from 256 KB (enough for the kernel to start a static program) to
        3 MB: every allocation (the model's mapping, KV cache, scratch, prompt buffers, thread
        stacks) fails in turn and must end in one line ("out of memory", "cannot read")."""
        out = []
        for kb in (256, 400, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 3072):
            for label, argv in (("-n 4, 8 threads, --logits", (b"-n", b"4", b"-t", b"8",
                                                               b"--logits", LOGITS)),
                                ("--tokens, 3000-byte prompt", (b"-p", b"ab " * 1000,
                                                                b"--tokens")),
                                ("-c 1024 -n 8", (b"-c", b"1024", b"-n", b"8"))):
                out.append(Case(f"address space {kb} KB, {label}", argv=(
                    b"-m", MODEL, b"-p", b"Hello") + argv, memory=kb << 10))
        return out

    def big_contexts(self) -> list[Case]:
        """max_ctx := 65536 (the largest the engine allows): the context filled by -c and by
        the default (DEFAULT_CTX), one token past each (refused in tokenize, before any
        forward pass; --tokens counts them), and a prompt longer than the fixture's 1024
        positions run through the model."""
        big, dflt = DIM_LIMITS["max_ctx"], DEFAULT_CTX
        base, out = self.header_case(f"max_ctx := {big}", {"max_ctx": big}), []
        for label, argv, ids, limit in (
                (f"-c {big}, {big} ids", (b"-c", b"%d" % big, b"-p", b"\x01" * (big - 1), b"--tokens"), big, big),
                (f"-c {big}, {big + 1} ids", (b"-c", b"%d" % big, b"-p", b"\x01" * big, b"-n", b"1"), big + 1, big),
                (f"-c {big}, {big + 1} ids, tokens", (b"-c", b"%d" % big, b"-p", b"\x01" * big, b"--tokens"), big + 1, None),
                (f"default context, {dflt} ids", (b"-p", b"\x01" * (dflt - 1), b"--tokens"), dflt, dflt),
                (f"default context, {dflt + 1} ids", (b"-p", b"\x01" * dflt, b"-n", b"1"), dflt + 1, dflt),
                (f"default context, {dflt + 1} ids, tokens", (b"-p", b"\x01" * dflt, b"--tokens"), dflt + 1, None),
                ("-c 1100, 1050 ids run", (b"-c", b"1100", b"-p", b"\x01" * 1049, b"-n", b"20"), 1050, 1100)):
            fits = limit is None or ids <= limit    # (None: --tokens, which counts any prompt)
            out.append(replace(base, label=f"max_ctx := {big}, {label}",
                               argv=(b"-m", MODEL) + argv, reject=not fits, accept=fits))
        return out

    # -- random fill -----------------------------------------------------------------------
    def random_tables(self, k: int) -> Case:
        """New tokenizer tables of the same sizes that pass every check the contract makes
        the engine do (ids < vocab, pieces inside the blob, the longest exactly max_piece_len,
        user pieces not empty) but are otherwise random: random bytes (U+2581 and UTF-8 fragments
        likely), empty pieces, NaN and infinite scores, any type, duplicate and unsorted
        index entries, user pieces in any order. The prompt is made of their pieces."""
        r, h = self.rng, self.h
        vocab, bs, mpl = h["vocab"], h["blob_size"], h["max_piece_len"]
        alphabet = [b"a", b"b", b"c", b" ", "\u2581".encode(), b"\xe2", b"\x96", b"\x81",
                    "\u65e5".encode(), b"\xff", b"<", b">", b"0", b"\n", b"\t"]
        blob = b"".join(r.choice(alphabet) for _ in range(bs))[:bs].ljust(bs, b"a")
        recs = []
        for i in range(vocab):
            n = min(mpl, bs, r.choice([0, 1, 1, 2, 2, 3, 4, r.randint(0, mpl)]))
            score = r.choice([-float(r.randint(0, 5000)), 0.0, float("nan"), float("inf"),
                              -float("inf"), r.uniform(-1e30, 1e30)])
            kind = r.choice([1] * 8 + [2, 3, 4, 5, 6, 0, 7, 0xFFFFFFFF])
            recs.append((r.randint(0, bs - n), n, score, kind))
        longest = r.randrange(vocab)                    # max_piece_len is the longest length
        recs[longest] = (r.randint(0, bs - min(mpl, bs)), min(mpl, bs)) + recs[longest][2:]
        pieces = [blob[o:o + n] for o, n, _, _ in recs]
        index = [r.randrange(vocab) for _ in range(h["n_index"])]
        if r.random() < 0.9:
            index.sort(key=lambda i: pieces[i])
        user = [r.choice([i for i in range(vocab) if recs[i][1]] or [0])
                for _ in range(h["n_user"])]
        if user and not recs[user[0]][1]:
            recs[user[0]] = (0, 1, 0.0, 4)
        if r.random() < 0.5:
            user.sort(key=lambda i: (-recs[i][1], i))
        edits = ((h["pieces_off"], b"".join(PIECE.pack(*rec) for rec in recs)),
                 (h["index_off"], struct.pack(f"<{len(index)}I", *index)),
                 (h["user_off"], struct.pack(f"<{len(user)}I", *user)), (h["blob_off"], blob))
        text = b"".join(r.choice(pieces) for _ in range(r.randint(0, 12))) + r.choice(PROMPTS)
        return Case(f"random #{k}: random valid tokenizer tables",
                    edits, argv=self.argv(text.replace(b"\0", b"\1")))


    def random_case(self, k: int) -> Case:
        r, h = self.rng, self.h
        kind = r.randrange(9)
        if kind == 8:
            return self.random_tables(k)
        if kind == 0:
            fields = r.sample(HEADER_FIELDS[1:], r.randint(1, 3))
            values = {}
            for name, off, code in fields:
                width = {"I": 32, "Q": 64}[code]
                v = r.choice([r.getrandbits(width), r.choice(U32_EDGES), h[name] + r.randint(-3, 3)])
                values[name] = v & ((1 << width) - 1)
            return self.header_case(f"random #{k}: header " + ", ".join(
                f"{n}={v:#x}" for n, v in values.items()), values)
        if kind == 1:
            edits = tuple((r.randrange(HEADER_SIZE), bytes([r.randrange(256)]))
                          for _ in range(r.randint(1, 4)))
            data = bytearray(self.base.data[:HEADER_SIZE])
            for off, raw in edits:
                data[off:off + 1] = raw
            bad = bool(header_problems(parse_header(bytes(data)), self.len, self.base.weights_end))
            return Case(f"random #{k}: header bytes", edits, argv=self.argv(), reject=bad)
        if kind == 2:
            lo, hi = h["pieces_off"], h["blob_off"] + h["blob_size"]
            edits = tuple((r.randrange(lo, hi), r.randbytes(r.randint(1, 8)))
                          for _ in range(r.randint(1, 8)))
            return Case(f"random #{k}: tokenizer bytes", edits, argv=self.argv())
        if kind == 3:
            n = r.randrange(self.len)
            return Case(f"random #{k}: truncated to {n}", size=n, argv=self.argv(), reject=True)
        if kind == 4:
            i = r.randrange(h["vocab"])
            field, foff = r.choice(PIECE_FIELDS)
            v = r.choice([r.getrandbits(32), r.choice(U32_EDGES), r.choice(F32_BITS)])
            return Case(f"random #{k}: piece {i} {field} := {v:#x}",
                        (self.u32_at(h["pieces_off"] + PIECE_REC * i + foff, v),),
                        argv=self.argv(self.piece_text(i)))
        if kind == 5:
            table, n = r.choice([("index_off", h["n_index"]), ("user_off", h["n_user"])])
            if n == 0:
                table, n = "index_off", h["n_index"]
            pos, v = r.randrange(n), r.choice([r.getrandbits(32), r.randrange(h["vocab"])])
            return Case(f"random #{k}: {table}[{pos}] := {v:#x}",
                        (self.u32_at(h[table] + 4 * pos, v),), argv=self.argv())
        if kind == 6:
            t = r.choice(self.base.weights)
            if t.dtype == "q8_0":  # a block's FP16 scale (or, bits < 256, one of its int8 q)
                bits = r.choice(F16_BITS + [0x80, 0x7F])
                edits = tuple((h["weights_off"] + t.offset + Q8_0_BLOCK * r.randrange(t.nbytes // Q8_0_BLOCK)
                               + (2 + r.randrange(QK8_0) if bits < 256 else 0),
                               bits.to_bytes(1 if bits < 256 else 2, "little")) for _ in range(r.randint(1, 16)))
                return Case(f"random #{k}: {t.name} blocks := {bits:#x}", edits,
                            argv=self.argv() + (b"--temp", b"1"))
            width = 2 if t.dtype == "f16" else 4
            bits = r.choice(F16_BITS if t.dtype == "f16" else F32_BITS + U32_EDGES)
            edits = tuple((h["weights_off"] + t.offset + width * r.randrange(t.nbytes // width),
                           bits.to_bytes(width, "little")) for _ in range(r.randint(1, 16)))
            return Case(f"random #{k}: {t.name} elements := {bits:#x}", edits,
                        argv=self.argv() + (b"--temp", b"1"))
        pool = (VALUE_FLAGS + [b"--tokens", b"--baseline", b"-x"] + NOT_NUMBERS + NUMBERS
                + TOO_BIG + BAD_UTF8 + PROMPTS + [MODEL, NOFILE, EMPTY, LOGITS])
        argv = [b"-m", MODEL] if r.random() < 0.7 else []
        argv += [r.choice(pool) for _ in range(r.randint(1, 6))]
        return Case(f"random #{k}: command line", argv=tuple(argv), private=True)


def make_cases(bases: dict[str, Base], seed: int, count: int, extra: list[Case] = (),
               tokens_only: frozenset[str] = frozenset()) -> list[Case]:
    """The systematic cases of every base (each case's `model` is its base's name), then
    `extra`, then seeded random ones drawn from the bases in turn: `count` in all (the list is
    cut when `count` is smaller). Bases named in `tokens_only` are only tokenized (no forward
    pass), with header fields, wraps and truncations past 4 GiB (64-bit offsets) only, and
    they take no random case."""
    rng = random.Random(seed)
    makers = {name: _Maker(base, rng, name in tokens_only) for name, base in bases.items()}
    cases = []
    for name, m in makers.items():
        families = [m.header_fields, m.wraps, m.truncations, m.tokenizer_tables,
                    m.float_weights, m.command_lines, m.big_contexts, m.memory_limits]
        if m.tokens_only:
            families = [m.header_fields, m.wraps, lambda m=m: m.truncations(1 << 32, (-1,))]
        cases += [replace(c, model=name) for family in families for c in family()]
    cases += extra
    k, order = 0, [(name, m) for name, m in makers.items() if not m.tokens_only]
    while len(cases) < count:
        name, m = order[k % len(order)]
        cases.append(replace(m.random_case(k), model=name))
        k += 1
    return cases[:count]
