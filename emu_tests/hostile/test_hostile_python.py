"""Hostile input on the Python side: `python -m builder` as a subprocess.

- Malformed assembly: each case puts one bad line into a small valid program; the build must
  exit non-zero with one line on stderr naming `asm/FILE.asm:LINE:` of that line.
- `python -m builder convert` on malformed safetensors headers, malformed GGUF files and
  inconsistent config.json (mutations of the tiny_mqa fixture): exit status 1 or 2, exactly one
  line on stderr, no traceback, no output file left behind, well within the timeout.
- ASM_CASES seeded random one-line mutations of the real asm/ tree (a character deleted,
  inserted or replaced, a token swapped, a line cut, doubled or dropped), each built with
  builder.asm.build.build in a memory-limited child: it builds, or fails with one BuildError
  line naming asm/FILE.asm:LINE (or a whole-program reason: link, check, budget), never
  another exception.
- The Gemma 2/3 paths: hand-written hostile configs (layer_types, bidirectional attention,
  rope types, windows, scalars, multimodal layouts) and GGUFs of tiny_g3 (unsupported quant
  types, files truncated inside a quantized tensor, bad sliding patterns, rope keys,
  soft-caps): each a refusal of one line, as above.
- RANDOM_CASES seeded random mutations of the same three inputs (bytes flipped in the GGUF
  metadata and tensor table, in the safetensors JSON, values of config.json replaced by other
  types), through `builder.models.convert.main` in one memory-limited child process (a subprocess
  each would take minutes): each ends in 0, or 1/2 with one line on stderr, never an
  exception; and every Gemma 2/3 config key of tiny_g3 set to every odd JSON value, the same way;
  and Gemma 4's sources (tiny_g4's config keys, GGUF bytes, tokenizer.json values), the same way.
Each family runs its cases two at a time; a failure lists every case that misbehaved.
"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from modelfiles import fixture_path
from conftest import write_tree
from variants import gguf_variant, hf_variant, kv_set, quantized

pytestmark = pytest.mark.slow  # hundreds of builds and conversions

TIMEOUT = 30        # a conversion of tiny_mqa takes 1-2 s; a hang is what this catches
MEMORY = 3 << 30    # address-space limit of each run (prlimit): a runaway allocation fails


def builder(*args: str | Path) -> subprocess.CompletedProcess:
    """`python -m builder ARGS` under the memory limit; a timeout is reported, not raised."""
    cmd = ["prlimit", f"--as={MEMORY}", sys.executable, "-m", "builder", *map(str, args)]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -9, b"", f"TIMEOUT after {TIMEOUT} s\n".encode())


def one_line_error(p: subprocess.CompletedProcess, where: str | None = None) -> str | None:
    """What is wrong with a refusal ("" -> None when it is a proper one-line error)."""
    err = p.stderr.decode(errors="replace")
    if "Traceback" in err:
        return f"traceback: {err.strip().splitlines()[-1]!r}"
    if p.returncode == -9:
        return f"hang: no exit within {TIMEOUT} s"
    if p.returncode not in (1, 2):
        return f"exit status {p.returncode} (stderr {err[:200]!r})"
    if err.count("\n") != 1 or not err.endswith("\n"):
        return f"stderr is not one line: {err[:300]!r}"
    if where and not re.match(where, err):
        return f"expected {where!r}, got {err.strip()!r}"
    return None


def run_all(cases: dict[str, Callable[[], str | None]]) -> None:
    """Run every case (two at a time); fail listing each one that returned a problem."""
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(cases, pool.map(lambda f: f(), cases.values())))
    bad = [f"{name}: {problem}" for name, problem in results.items() if problem]
    assert not bad, f"{len(bad)} of {len(cases)} cases failed:\n" + "\n".join(bad)


# -- malformed assembly ------------------------------------------------------------------------
GOOD_MAIN = """format ELF64 executable 3
entry start

segment readable executable

include 'part.asm'

segment readable writeable

value:
        rq      1
"""
GOOD_PART = """; part.asm: the code of the test program
start:
        xor     edi, edi
        mov     eax, 231
        syscall
msg:
        db      'hi', 10, 0
"""
BAD_LINES = {     # inserted as line 3 of asm/part.asm
    "unknown mnemonic": "        movx    eax, 1",
    "missing operand": "        mov     eax",
    "operand sizes differ": "        mov     eax, rbx",
    "scale 3": "        mov     eax, [rax+rbx*3]",
    "undefined label": "        jmp     nowhere",
    "duplicate label": "start:",
    "unterminated string": "        db      'unterminated",
    "bad hex number": "        dd      0xZZ",
    "unbalanced parenthesis": "        mov     eax, (1 + 2",
    "unbalanced bracket": "        mov     eax, [rax",
    "division by zero": "        mov     eax, 1/0",
    "number too big": "        mov     eax, 99999999999999999999999",
    "byte out of range": "        db      256",
    "missing include": "        include 'missing.asm'",
    "include of itself": "include 'part.asm'",
    "macro": "macro foo {}",
    "times": "        times 4 nop",
    "if": "if 1",
    "align 3": "        align 3",
    "char constant too long": "        mov     eax, 'abcdefghi'",
    "label named like a register": "rax:",
    "bad dup": "        db      1 dup",
    "segment override": "        mov     eax, [fs:rax]",
    "invalid utf-8": "        nop \udcff\udcfe",
    "constant defined twice": "k = 1\nk = 2",
}


def _project(root: Path) -> None:
    """root/asm with GOOD_MAIN, the repository's stub, and a pyproject.toml."""
    write_tree(root, {"gemma.asm": GOOD_MAIN})


def _asm_case(tmp: Path, name: str, bad: str) -> Callable[[], str | None]:
    def case() -> str | None:
        root = tmp / re.sub(r"\W+", "_", name)
        _project(root)
        lines = GOOD_PART.splitlines()
        lines[2:2] = [bad]
        (root / "asm" / "part.asm").write_bytes(
            ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        p = builder("--root", root, "-o", root / "out")
        # an undecodable byte is reported at the include that reads the file
        line = {"constant defined twice": r"asm/part\.asm:(3|4): ",
                "invalid utf-8": r"asm/(part\.asm:3|gemma\.asm:6): "}.get(name, r"asm/part\.asm:3: ")
        return "built without an error" if p.returncode == 0 else one_line_error(p, line)
    return case


def test_good_program_builds(tmp_path):
    """The base of the malformed cases builds (so each error is the bad line's)."""
    _project(tmp_path)
    (tmp_path / "asm" / "part.asm").write_text(GOOD_PART)
    p = builder("--root", tmp_path, "-o", tmp_path / "out")
    assert p.returncode == 0, p.stderr.decode()
    assert subprocess.run([tmp_path / "out"]).returncode == 0


def test_malformed_asm_gives_file_line_errors(tmp_path):
    run_all({name: _asm_case(tmp_path, name, bad) for name, bad in BAD_LINES.items()})


def test_regression_F2_avx512_is_refused(tmp_path):
    """F2 (a fuzz finding): an AVX-512 instruction built (EVEX: keystone's weak spot).
    The dialect now takes zmm registers without displacements only (test_frontend); every
    other way of asking for EVEX is asm/part.asm:3: one line."""
    run_all({name: _asm_case(tmp_path, name, bad) for name, bad in {
        "zmm displacement": "        vaddps  zmm0, zmm1, [rax+64]",
        "ymm16": "        vaddps  ymm16, ymm1, ymm2",
        "xmm16": "        vaddps  xmm16, xmm1, xmm2",
        "ymm31": "        vmovups ymm31, [rax]",
        "mask register": "        kmovw   k1, eax",
    }.items()})


def test_asm_without_line_numbers_still_one_line(tmp_path):
    """Whole-program errors (no entry, empty file, symbols nested too deeply): one line."""
    programs = {
        "empty gemma.asm": ("", GOOD_PART),
        "entry undefined": (GOOD_MAIN.replace("entry start", "entry nowhere"), GOOD_PART),
        "deep constant chain": (GOOD_MAIN, GOOD_PART + "".join(
            f"c{i} = c{i + 1} + 1\n" for i in range(20000)) + "c20000 = 1\n        dd c0\n"),
        "nul bytes": (GOOD_MAIN, GOOD_PART + "\0\0\0\n"),
        "writable code segment": (GOOD_MAIN.replace("segment readable executable",
                                                    "segment readable writeable executable"),
                                  GOOD_PART),
    }

    def case(name: str, main: str, part: str) -> Callable[[], str | None]:
        def run() -> str | None:
            root = tmp_path / re.sub(r"\W+", "_", name)
            write_tree(root, {"gemma.asm": main, "part.asm": part})
            p = builder("--root", root, "-o", root / "out")
            return "built without an error" if p.returncode == 0 else one_line_error(p)
        return run
    run_all({name: case(name, *prog) for name, prog in programs.items()})


# -- the converter -------------------------------------------------------------------------------
def _convert_case(tmp: Path, name: str, make: Callable[[Path], Path]) -> Callable[[], str | None]:
    """make(dir) builds the hostile source inside dir and returns what to convert."""
    def case() -> str | None:
        work = tmp / re.sub(r"\W+", "_", name)
        work.mkdir()
        src, out = make(work), work / "out.bin"
        p = builder("convert", src, "-o", out, "-q")
        if p.returncode == 0:
            return "converted without an error"
        if out.exists():
            return f"left {out.name} behind"
        return one_line_error(p, r"python -m builder convert: ")
    return case


def _hf_copy(work: Path) -> Path:
    src = work / "hf"
    src.mkdir()
    for f in ("config.json", "tokenizer.model", "model.safetensors"):
        shutil.copyfile(fixture_path("tiny_mqa") / f, src / f)
    return src


def _safetensors(edit: Callable[[bytes, dict, bytes], bytes]) -> Callable[[Path], Path]:
    """A source whose model.safetensors is edit(raw file, header dict, data bytes)."""
    def make(work: Path) -> Path:
        src = _hf_copy(work)
        raw = (src / "model.safetensors").read_bytes()
        n = struct.unpack_from("<Q", raw)[0]
        (src / "model.safetensors").write_bytes(edit(raw, json.loads(raw[8:8 + n]), raw[8 + n:]))
        return src
    return make


def _st(header: dict | bytes, data: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _with_tensor(key: str, **change) -> Callable[[bytes, dict, bytes], bytes]:
    def edit(raw: bytes, h: dict, data: bytes) -> bytes:
        h[key] = dict(h[key], **change) if change else 5
        return _st(h, data)
    return edit


EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"
SAFETENSORS = {
    "header length 2^63": lambda raw, h, d: struct.pack("<Q", 1 << 63) + raw[8:],
    "header length 0": lambda raw, h, d: struct.pack("<Q", 0) + raw[8:],
    "header length past the end": lambda raw, h, d: struct.pack("<Q", len(raw)) + raw[8:],
    "header length 2^64-1": lambda raw, h, d: b"\xff" * 8 + raw[8:],
    "file of 4 bytes": lambda raw, h, d: raw[:4],
    "file of 0 bytes": lambda raw, h, d: b"",
    "header cut in half": lambda raw, h, d: raw[:8 + len(json.dumps(h)) // 2],
    "data cut short": lambda raw, h, d: raw[:-1000],
    "header not JSON": lambda raw, h, d: _st(b"{not json" + b" " * 100, d),
    "header a JSON list": lambda raw, h, d: _st(b"[1, 2, 3]", d),
    "header invalid UTF-8": lambda raw, h, d: _st(b'{"\xff\xfe": 1}', d),
    "header NUL bytes": lambda raw, h, d: _st(b"\0" * 64, d),
    "tensor entry not an object": _with_tensor(NORM),
    "dtype Q4": _with_tensor(NORM, dtype="Q4"),
    "dtype a number": _with_tensor(NORM, dtype=7),
    "shape negative": _with_tensor(NORM, shape=[-64]),
    "shape strings": _with_tensor(NORM, shape=["64"]),
    "shape 2^62": _with_tensor(EMBED, shape=[1 << 62, 64]),
    "offsets reversed": _with_tensor(NORM, data_offsets=[10, 0]),
    "offsets past the end": _with_tensor(NORM, data_offsets=[0, 1 << 40]),
    "offsets negative": _with_tensor(NORM, data_offsets=[-128, 0]),
    "offsets missing": _with_tensor(NORM, data_offsets=None),
    "offsets too short for shape": _with_tensor(EMBED, data_offsets=[0, 64]),
    "tensor missing": lambda raw, h, d: _st({k: v for k, v in h.items() if k != NORM}, d),
}

CONFIGS = {
    "not JSON": b"{hidden_size: 64",
    "a JSON list": b"[1, 2]",
    "empty": b"",
    "invalid UTF-8": b'{"hidden_size": "\xff"}',
    "hidden_size missing": {"hidden_size": None},
    "hidden_size a string": {"hidden_size": "64"},
    "hidden_size 0": {"hidden_size": 0},
    "hidden_size -64": {"hidden_size": -64},
    "hidden_size 1e30": {"hidden_size": 1e30},
    "hidden_size 65": {"hidden_size": 65},
    "kv heads not a divisor": {"num_key_value_heads": 3},
    "kv heads 0": {"num_key_value_heads": 0},
    "head_dim odd": {"head_dim": 15},
    "vocab_size differs from the tokenizer": {"vocab_size": 3000},
    "intermediate_size differs from the weights": {"intermediate_size": 257},
    "layers 3 (tensors missing)": {"num_hidden_layers": 3},
    "layers 1 (tensors left over)": {"num_hidden_layers": 1},
    "model_type llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "rms_norm_eps a string": {"rms_norm_eps": "x"},
    "rms_norm_eps negative": {"rms_norm_eps": -1.0},
    "rope_theta NaN": {"rope_parameters": {"rope_theta": float("nan"), "rope_type": "default"}},
    "rope_theta a string": {"rope_parameters": {"rope_theta": "x", "rope_type": "default"}},
    "max_position_embeddings 0": {"max_position_embeddings": 0},
    "vocab_size a list": {"vocab_size": [2048]},
}


def _config(change: bytes | dict) -> Callable[[Path], Path]:
    def make(work: Path) -> Path:
        src = _hf_copy(work)
        if isinstance(change, bytes):
            (src / "config.json").write_bytes(change)
        else:
            cfg = json.loads((src / "config.json").read_text())
            cfg.update(change)
            cfg = {k: v for k, v in cfg.items() if v is not None}
            (src / "config.json").write_text(json.dumps(cfg))
        return src
    return make


def _gguf_edits() -> dict[str, Callable[[bytes], bytes]]:
    """Mutations of the fixture GGUF, located through gguf.GGUFReader's parsed fields."""
    path = fixture_path("tiny_mqa") / "model-f16.gguf"
    r = GGUFReader(path)

    def at(field, k: int) -> int:          # byte offset of part k of a field
        return field.offset + sum(p.nbytes for p in field.parts[:k])

    def put(off: int, fmt: str, v) -> Callable[[bytes], bytes]:
        return lambda raw: raw[:off] + struct.pack("<" + fmt, v) + raw[off + struct.calcsize(fmt):]

    f = r.fields
    emb, blocks, heads = (f[k] for k in ("gemma.embedding_length", "gemma.block_count",
                                         "gemma.attention.head_count"))
    toks, t0 = f["tokenizer.ggml.tokens"], r.tensors[0].field
    kv0 = next(v for k, v in f.items() if not k.startswith("GGUF."))
    size = path.stat().st_size
    out = {
        "bad magic": put(0, "4s", b"GGUX"),
        "version 0": put(4, "I", 0), "version 99": put(4, "I", 99),
        "tensor count 2^63": put(8, "Q", 1 << 63), "tensor count 0": put(8, "Q", 0),
        "kv count 2^63": put(16, "Q", 1 << 63), "kv count 0": put(16, "Q", 0),
        "first key length 2^40": put(at(kv0, 0), "Q", 1 << 40),
        "first key length 0": put(at(kv0, 0), "Q", 0),
        "first value type 99": put(at(kv0, 2), "I", 99),
        "embedding_length typed as string": put(at(emb, 2), "I", 8),
        "embedding_length 0": put(at(emb, 3), "I", 0),
        "embedding_length 2^31": put(at(emb, 3), "I", 1 << 31),
        "block_count 0": put(at(blocks, 3), "I", 0),
        "head_count 0": put(at(heads, 3), "I", 0),
        "head_count 3": put(at(heads, 3), "I", 3),
        "embedding_length key renamed": put(at(emb, 1) + 20, "1s", b"X"),
        "tokens array length 2^60": put(at(toks, 4), "Q", 1 << 60),
        "tokens array element type 99": put(at(toks, 3), "I", 99),
        "first token length 2^40": put(at(toks, 5), "Q", 1 << 40),
        "tensor n_dims 100": put(at(t0, 2), "I", 100),
        "tensor dim 2^62": put(at(t0, 3), "Q", 1 << 62),
        "tensor type 99": put(at(t0, 4), "I", 99),          # parts: len name n_dims dims
        "tensor offset 2^60": put(at(t0, 5), "Q", 1 << 60),  # type offset
        "empty file": lambda raw: b"",
    }
    for cut in (3, 12, 23, at(kv0, 1) + 3, at(toks, 5) + 4, at(t0, 1) + 2, (size + at(t0, 0)) // 2,
                size - 1):
        out[f"truncated to {cut}"] = lambda raw, cut=cut: raw[:cut]
    return out


def _gguf(edit: Callable[[bytes], bytes]) -> Callable[[Path], Path]:
    def make(work: Path) -> Path:
        out = work / "model.gguf"
        out.write_bytes(edit((fixture_path("tiny_mqa") / "model-f16.gguf").read_bytes()))
        return out
    return make


def test_converter_refuses_malformed_safetensors(tmp_path):
    run_all({n: _convert_case(tmp_path, n, _safetensors(e)) for n, e in SAFETENSORS.items()})


def test_converter_refuses_inconsistent_config(tmp_path):
    run_all({n: _convert_case(tmp_path, n, _config(c)) for n, c in CONFIGS.items()})


def test_converter_refuses_malformed_gguf(tmp_path):
    run_all({n: _convert_case(tmp_path, n, _gguf(e)) for n, e in _gguf_edits().items()})


def test_converter_refuses_a_garbage_tokenizer(tmp_path):
    def tok(data: Callable[[bytes], bytes]) -> Callable[[Path], Path]:
        def make(work: Path) -> Path:
            src = _hf_copy(work)
            (src / "tokenizer.model").write_bytes(data((src / "tokenizer.model").read_bytes()))
            return src
        return make
    run_all({n: _convert_case(tmp_path, n, tok(d)) for n, d in {
        "tokenizer truncated": lambda raw: raw[:len(raw) // 2],
        "tokenizer empty": lambda raw: b"",
        "tokenizer random": lambda raw: bytes(range(256)) * 10,
    }.items()})


def _g3_hf(edit) -> Callable[[Path], Path]:
    """tiny_g3's HF directory with config.json edited by edit(dict)."""
    return lambda work: hf_variant(work, "tiny_g3", config=edit)


def _rope(kind: str, **params):
    return lambda c: c["rope_parameters"][kind].update(params)


def _multimodal(text):
    return lambda c: c.update(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
                              text_config=text)


G3_CONFIGS = {
    "layer_types too short": {"layer_types": ["sliding_attention"] * 5},
    "layer_types unknown kind": {"layer_types": ["chunked_attention"] * 6},
    "layer_types a string": {"layer_types": "sliding_attention"},
    "layer_types numbers": {"layer_types": [0, 1, 0, 1, 0, 1]},
    "bidirectional attention": {"use_bidirectional_attention": True},
    "untied embeddings": {"tie_word_embeddings": False},
    "architecture of another model": {"architectures": ["Gemma2ForCausalLM"]},
    "rope type yarn": _rope("full_attention", rope_type="yarn", factor=4.0),
    "rope type dynamic (old keys)": {"rope_parameters": None, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    "rope_scaling a list (old keys)": {"rope_parameters": None, "rope_scaling": [8]},
    "rope_parameters a list": {"rope_parameters": [1e6]},
    "rope_parameters.full_attention a string": {"rope_parameters": {"full_attention": "x", "sliding_attention": {}}},
    "rope factor a string": _rope("full_attention", rope_type="linear", factor="8"),
    "rope factor 0": _rope("full_attention", rope_type="linear", factor=0),
    "rope factor missing": _rope("full_attention", rope_type="linear"),
    "rope theta negative": _rope("sliding_attention", rope_theta=-1.0),
    "rope theta NaN": _rope("sliding_attention", rope_theta=float("nan")),
    "sliding_window -1": {"sliding_window": -1},
    "sliding_window a string": {"sliding_window": "512"},
    "sliding_window 2^40": {"sliding_window": 1 << 40},
    "query_pre_attn_scalar 0": {"query_pre_attn_scalar": 0},
    "query_pre_attn_scalar NaN": {"query_pre_attn_scalar": float("nan")},
    "query_pre_attn_scalar a string": {"query_pre_attn_scalar": "256"},
    "attn_logit_softcapping -1": {"attn_logit_softcapping": -1.0},
    "final_logit_softcapping Infinity": {"final_logit_softcapping": float("inf")},
    "sliding_window_pattern 0 (no layer_types)": {"layer_types": None, "sliding_window_pattern": 0},
    "sliding_window_pattern a list (no layer_types)": {"layer_types": None, "sliding_window_pattern": [6]},
    "multimodal: text_config a list": _multimodal([1]),
    "multimodal: text_config empty (4B defaults)": _multimodal({}),
    "multimodal: weights not under language_model": _multimodal(None),
}


def _config_edit(change) -> Callable[[dict], None]:
    if callable(change):
        return change

    def edit(c: dict) -> None:
        c.update(change)
        for k in [k for k, v in change.items() if v is None]:
            c.pop(k)
    return edit


def _g3_gguf(kv=None, tensors=None, cut: float | None = None) -> Callable[[Path], Path]:
    """tiny_g3's GGUF rewritten with edits (see variants.gguf_variant), then cut to a fraction."""
    def make(work: Path) -> Path:
        src = gguf_variant(work, "tiny_g3", kv=kv, tensors=tensors)
        if cut is not None:
            data = src.read_bytes()
            src.write_bytes(data[:int(len(data) * cut)])
        return src
    return make


def _as_type(name: str, qtype: str):
    """Tensor edit: `name` as raw bytes of qtype (zeros; right size for its rows)."""
    def edit(ts):
        x = ts[name][0]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
        ts[name] = (np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8), GGMLQuantizationType[qtype])
    return edit


def _quantize(name: str, qtype: str):
    def edit(ts):
        ts[name] = (quantized(qtype, ts[name][0], np.random.default_rng(0)), GGMLQuantizationType[qtype])
    return edit


G3_GGUFS = {
    "quant type Q8_1": _g3_gguf(tensors=_as_type("blk.0.ffn_down.weight", "Q8_1")),
    "quant type IQ2_XXS": _g3_gguf(tensors=_as_type("blk.0.ffn_down.weight", "IQ2_XXS")),
    "quant type Q8_K": _g3_gguf(tensors=_as_type("blk.0.ffn_down.weight", "Q8_K")),
    "truncated inside a Q4_0 embedding": _g3_gguf(tensors=_quantize("token_embd.weight", "Q4_0"), cut=0.3),
    "truncated inside a Q6_K tensor": _g3_gguf(tensors=_quantize("blk.5.ffn_down.weight", "Q6_K"), cut=0.97),
    "truncated by one byte (Q4_K)": _g3_gguf(tensors=_quantize("blk.5.ffn_down.weight", "Q4_K"), cut=0.99999),
    "sliding_window_pattern of 5 layers": _g3_gguf(kv=kv_set(gemma3__attention__sliding_window_pattern=[True] * 5)),
    "sliding_window_pattern 0": _g3_gguf(kv=kv_set(gemma3__attention__sliding_window_pattern=0)),
    "sliding_window_pattern a string": _g3_gguf(kv=kv_set(gemma3__attention__sliding_window_pattern="6")),
    "rope scaling type yarn": _g3_gguf(kv=kv_set(gemma3__rope__scaling__type="yarn")),
    "rope scaling factor -8": _g3_gguf(kv=kv_set(gemma3__rope__scaling__type="linear",
                                                 gemma3__rope__scaling__factor=-8.0)),
    "rope scaling factor a string": _g3_gguf(kv=kv_set(gemma3__rope__scaling__factor="8")),
    "freq_base NaN": _g3_gguf(kv=kv_set(gemma3__rope__freq_base=float("nan"))),
    "freq_base_swa -1": _g3_gguf(kv=kv_set(gemma3__rope__freq_base_swa=-1.0)),
    "freq_base a string": _g3_gguf(kv=kv_set(gemma3__rope__freq_base="1e6")),
    "attention soft-cap on gemma3": _g3_gguf(kv=kv_set(gemma3__attn_logit_softcapping=50.0)),
    "final soft-cap -1": _g3_gguf(kv=kv_set(gemma3__final_logit_softcapping=-1.0)),
    "block_count 62 (27B scale, tensors missing)": _g3_gguf(kv=kv_set(gemma3__block_count=62)),
    "head_count 0": _g3_gguf(kv=kv_set(gemma3__attention__head_count=0)),
}


def test_converter_refuses_hostile_gemma3_configs(tmp_path):
    run_all({n: _convert_case(tmp_path, n, _g3_hf(_config_edit(c))) for n, c in G3_CONFIGS.items()})


def test_converter_refuses_hostile_gemma3_ggufs(tmp_path):
    run_all({n: _convert_case(tmp_path, n, make) for n, make in G3_GGUFS.items()})


@pytest.mark.parametrize("what", ["missing", "a directory"])
def test_converter_source_paths(tmp_path, what):
    src = tmp_path / "src"
    if what == "a directory":
        src.mkdir()
    assert one_line_error(builder("convert", src, "-o", tmp_path / "o.bin")) is None


def test_regression_F1_convert_huge_layers(tmp_path):
    """F1 (a fuzz finding): 2^31-1 layers made the converter build a layout of every
    layer (minutes, gigabytes); now one line, promptly, from config.json and from GGUF."""
    blocks = GGUFReader(fixture_path("tiny_mqa") / "model-f16.gguf").fields["gemma.block_count"]
    value_at = blocks.offset + sum(p.nbytes for p in blocks.parts[:3])

    def gguf_edit(raw: bytes) -> bytes:
        return raw[:value_at] + struct.pack("<I", 2**31 - 1) + raw[value_at + 4:]
    run_all({"config.json": _convert_case(tmp_path, "config", _config({"num_hidden_layers": 2**31 - 1})),
             "gguf": _convert_case(tmp_path, "gguf", _gguf(gguf_edit))})


RANDOM_CASES = 300
RANDOM_SEED = 20261130
ODD_VALUES = [None, 0, -1, 1, 2**31, 2**63, 2**64, 1e300, -0.5, float("nan"), "", "x", "64",
              [], [1, 2], {}, {"a": 1}, True]


def _mutated_source(r: random.Random, work: Path) -> tuple[str, Path]:
    """One random hostile source in `work`: its label and what to convert."""
    kind = r.choice(["gguf", "safetensors bytes", "safetensors value", "config"])
    if kind == "gguf":
        raw = bytearray((fixture_path("tiny_mqa") / "model-f16.gguf").read_bytes())
        end = GGUFReader(fixture_path("tiny_mqa") / "model-f16.gguf").tensors[0].data_offset
        flips = [(r.randrange(end), r.randrange(256)) for _ in range(r.randint(1, 4))]
        for at, v in flips:
            raw[at] = v
        (work / "m.gguf").write_bytes(bytes(raw))
        return f"gguf bytes {flips}", work / "m.gguf"
    src = _hf_copy(work)
    if kind == "config":
        cfg = json.loads((src / "config.json").read_text())
        key = r.choice(sorted(cfg))
        cfg[key] = r.choice(ODD_VALUES)
        (src / "config.json").write_text(json.dumps(cfg))
        return f"config {key} = {cfg[key]!r}", src
    raw = bytearray((src / "model.safetensors").read_bytes())
    n = struct.unpack_from("<Q", raw)[0]
    if kind == "safetensors bytes":
        flips = [(r.randrange(8 + n), r.randrange(256)) for _ in range(r.randint(1, 4))]
        for at, v in flips:
            raw[at] = v
        label = f"safetensors bytes {flips}"
    else:
        head = json.loads(raw[8:8 + n])
        name = r.choice(sorted(head))
        field = r.choice(["dtype", "shape", "data_offsets"])
        if isinstance(head[name], dict) and field in head[name]:
            head[name][field] = r.choice(ODD_VALUES + [[r.randint(-5, 1 << 40)] * r.randint(1, 3)])
        label = f"safetensors {name}.{field} = {head[name].get(field)!r}"[:200]
        raw = bytearray(_st(head, bytes(raw[8 + n:])))
    (src / "model.safetensors").write_bytes(bytes(raw))
    return label, src


def _random_sources(tmp: Path) -> Iterator[tuple[str, Path, Path]]:
    """RANDOM_CASES seeded random hostile sources: (label, source, work dir)."""
    r = random.Random(RANDOM_SEED)
    for i in range(RANDOM_CASES):
        work = tmp / f"c{i}"
        work.mkdir()
        yield (*_mutated_source(r, work), work)


G3_KEYS = ["layer_types", "sliding_window", "sliding_window_pattern", "rope_parameters", "rope_scaling",
           "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar", "attn_logit_softcapping",
           "final_logit_softcapping", "use_bidirectional_attention", "tie_word_embeddings", "text_config"]


def _g3_config_sources(tmp: Path) -> Iterator[tuple[str, Path, Path]]:
    """tiny_g3 with each Gemma 2/3 key set to each of ODD_VALUES (text_config: as a multimodal
    gemma3 config): (label, source, work dir)."""
    for i, (key, value) in enumerate((k, v) for k in G3_KEYS for v in ODD_VALUES):
        work = tmp / f"g{i}"
        work.mkdir()

        def edit(c, key=key, value=value):
            if key == "text_config":
                c.update(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"])
            c[key] = value
        yield f"tiny_g3 config {key} = {value!r}", hf_variant(work, "tiny_g3", config=edit), work


G4_RANDOM = 150


def _g4_sources(tmp: Path) -> Iterator[tuple[str, Path, Path]]:
    """Gemma 4: tiny_g4 with each config.json key (and per_layer_config, text_config as a
    multimodal gemma4 config) set to each of ODD_VALUES; G4_RANDOM seeded byte flips in its
    GGUF's metadata and tensor table; G4_RANDOM seeded odd values in its tokenizer.json (the
    model's fields, an added token's, a merge, a vocabulary id, a top-level entry)."""
    keys = sorted(json.loads((fixture_path("tiny_g4") / "config.json").read_text())) + ["per_layer_config",
                                                                                         "text_config"]
    for i, (key, value) in enumerate((k, v) for k in keys for v in ODD_VALUES):
        work = tmp / f"c{i}"
        work.mkdir()

        def edit(c, key=key, value=value):
            if key == "text_config":
                c.update(model_type="gemma4", architectures=["Gemma4ForConditionalGeneration"])
            c[key] = value
        yield f"tiny_g4 config {key} = {value!r}", hf_variant(work, "tiny_g4", config=edit), work
    r = random.Random(RANDOM_SEED)
    gguf = fixture_path("tiny_g4") / "model-f16.gguf"
    end = GGUFReader(gguf).tensors[0].data_offset
    for i in range(G4_RANDOM):
        work = tmp / f"g{i}"
        work.mkdir()
        raw = bytearray(gguf.read_bytes())
        flips = [(r.randrange(end), r.randrange(256)) for _ in range(r.randint(1, 4))]
        for at, v in flips:
            raw[at] = v
        (work / "m.gguf").write_bytes(bytes(raw))
        yield f"tiny_g4 gguf bytes {flips}", work / "m.gguf", work
    for i in range(G4_RANDOM):
        work = tmp / f"t{i}"
        work.mkdir()
        src = hf_variant(work, "tiny_g4")
        tok = json.loads((src / "tokenizer.json").read_text())
        where = r.choice([tok, tok["model"], r.choice(tok["added_tokens"]), tok["model"]["vocab"]])
        key = r.choice(sorted(where))
        if key == "merges" and r.random() < 0.5:
            where, key = where["merges"], r.randrange(len(where["merges"]))
        where[key] = r.choice(ODD_VALUES)
        (src / "tokenizer.json").write_text(json.dumps(tok))
        yield f"tiny_g4 tokenizer.json [{key!r}] = {where[key]!r}"[:200], src, work


FAMILIES = {"random": _random_sources, "gemma3 config": _g3_config_sources, "gemma4": _g4_sources}


def _conversions(tmp: str, family: str) -> list[str]:
    """In a child (3 GB address space, 20 s per case): every case of FAMILIES[family] through
    builder.models.convert.main; what went wrong."""
    from builder.models.convert import main as convert_main
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    def too_slow(*_):
        raise TimeoutError("more than 20 s")
    signal.signal(signal.SIGALRM, too_slow)
    wrong = []
    for i, (label, src, work) in enumerate(FAMILIES[family](Path(tmp))):
        err = io.StringIO()
        signal.alarm(20)
        try:
            with contextlib.redirect_stderr(err):
                status = convert_main([str(src), "-o", str(work / "out.bin"), "-q"])
        except SystemExit as e:
            status = e.code
        except BaseException as e:  # noqa: BLE001 - the finding
            wrong.append(f"case {i} ({label}): {type(e).__name__}: {str(e)[:120]}")
            continue
        finally:
            signal.alarm(0)
        text = err.getvalue()
        if status not in (0, 1, 2) or (status and (text.count("\n") != 1 or "Traceback" in text)):
            wrong.append(f"case {i} ({label}): status {status}, stderr {text[:200]!r}")
        shutil.rmtree(work)
    return wrong


def test_converter_random_mutations(tmp_path):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        wrong = pool.apply(_conversions, (str(tmp_path), "random"))
    assert not wrong, f"{len(wrong)} of {RANDOM_CASES} (seed {RANDOM_SEED}):\n" + "\n".join(wrong[:20])


def test_converter_gemma3_config_values(tmp_path):
    """Every Gemma 2/3 key of config.json set to every odd JSON value: each conversion ends in
    0, or 1/2 with one line on stderr, never an exception."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        wrong = pool.apply(_conversions, (str(tmp_path), "gemma3 config"))
    assert not wrong, f"{len(wrong)} of {len(G3_KEYS) * len(ODD_VALUES)}:\n" + "\n".join(wrong[:20])


def test_converter_gemma4_hostile_sources(tmp_path):
    """Gemma 4 sources (_g4_sources: every config key at every odd JSON value, GGUF byte flips,
    tokenizer.json mutations): each conversion ends in 0, or 1/2 with one line on stderr."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        wrong = pool.apply(_conversions, (str(tmp_path), "gemma4"))
    assert not wrong, f"{len(wrong)} wrong:\n" + "\n".join(wrong[:20])


def test_regression_F5_safetensors_dtype_of_another_type(tmp_path):
    """F5: a safetensors dtype that is not a string (a list, an object) was a TypeError
    traceback; every odd JSON type in dtype, shape and data_offsets must give one line."""
    cases = {}
    for field, values in (("dtype", [[1, 2], {}, 7, None, True]),
                          ("shape", [[True], [1.5], ["64"], [None], {}]),
                          ("data_offsets", [[0.5, 128], ["0", "128"], [None, None], 5])):
        for v in values:
            name = f"{field} = {v!r}"
            cases[name] = _convert_case(tmp_path, name, _safetensors(_with_tensor(NORM, **{field: v})))
    run_all(cases)


ASM_CASES = 80
REPO = Path(__file__).resolve().parents[2]
# errors about the whole program (no line to blame): the image's link and checks, the
# packed program's (packing, its layout and link), the budget, a missing format or entry
WHOLE_PROGRAM = re.compile(r"(link|check|pack|layout|link \(packed\)): |gemma would be \d+ "
                           r"bytes|asm/(gemma|stub)\.asm: ")


def _mutate_line(r: random.Random, line: str, tokens: list[str]) -> list[str]:
    """One random change of a source line: the lines that replace it."""
    kind = r.randrange(7)
    at = r.randrange(len(line) + 1)
    if kind == 0 and line:
        return [line[:at] + line[at + 1:]]
    if kind == 1:
        return [line[:at] + r.choice(",[]()+-*/:;'\".$0x9aZ_ \t") + line[at:]]
    if kind == 2:
        words = line.split()
        if words:
            words[r.randrange(len(words))] = r.choice(tokens)
        return ["        " + " ".join(words)]
    if kind == 3:
        return [line[:at]]
    if kind == 4:
        return [line, line]
    if kind == 5:
        return []
    return [line.replace(",", " ,", 1).replace("[", "(", 1)]


def _build_mutated(root: str, seed: int, i: int) -> str | None:
    """Mutate one line of the tree at root (a copy of asm/), build it; what went wrong."""
    from builder.asm.build import build
    from builder.asm.errors import BuildError
    r = random.Random(seed * 100003 + i)
    files = sorted((Path(root) / "asm").glob("*.asm"))
    tokens = sorted({t for f in files for t in f.read_text().split()})
    path = r.choice(files)
    original = path.read_text()
    lines = original.splitlines()
    n = r.randrange(len(lines))
    new = _mutate_line(r, lines[n], tokens)
    path.write_text("\n".join(lines[:n] + new + lines[n + 1:]) + "\n")
    label = f"asm/{path.name}:{n + 1} {lines[n].strip()!r} -> {[x.strip() for x in new]!r}"
    try:
        build(Path(root), Path(root) / "out" / "gemma")
    except BuildError as e:
        msg = str(e)
        if "\n" in msg:
            return f"{label}: a message of {msg.count(chr(10)) + 1} lines: {msg[:200]!r}"
        if not (re.match(r"asm/[\w.]+\.asm:\d+: ", msg) or WHOLE_PROGRAM.match(msg)):
            return f"{label}: no file:line in {msg[:200]!r}"
    except BaseException as e:  # noqa: BLE001 - a traceback is the finding
        return f"{label}: {type(e).__name__}: {str(e)[:200]}"
    finally:
        path.write_text(original)
    return None


def _asm_worker_init() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _asm_builds(root: Path, seed: int, cases: range) -> list[tuple[int, str]]:
    """The mutated builds `cases` of the asm/ tree at root, one at a time in a child (a fresh
    one after a crash or a 60 s hang); what went wrong, by case."""
    wrong, ctx = [], multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_asm_worker_init)
    try:
        for i in cases:
            try:
                problem = pool.submit(_build_mutated, str(root), seed, i).result(timeout=60)
            except (BrokenProcessPool, TimeoutError) as e:
                problem = f"the builder process {type(e).__name__}"
                pool.shutdown(cancel_futures=True)
                pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_asm_worker_init)
            if problem:
                wrong.append((i, problem))
    finally:
        pool.shutdown(cancel_futures=True)
    return wrong


def asm_campaign(tmp: Path, seed: int, count: int) -> list[str]:
    """`count` mutated builds, two at a time, each on its own copy of asm/ in tmp (a build
    mutates its tree); what went wrong, by case."""
    roots = [tmp / "a", tmp / "b"]
    for root in roots:
        shutil.copytree(REPO / "asm", root / "asm")
        shutil.copyfile(REPO / "pyproject.toml", root / "pyproject.toml")
    with ThreadPoolExecutor(2) as threads:
        halves = threads.map(_asm_builds, roots, [seed] * 2, [range(0, count, 2), range(1, count, 2)])
        return [f"case {i}: {problem}" for i, problem in sorted(sum(halves, []))]


def test_builder_random_asm_mutations(tmp_path):
    wrong = asm_campaign(tmp_path, RANDOM_SEED, ASM_CASES)
    assert not wrong, f"{len(wrong)} of {ASM_CASES} (seed {RANDOM_SEED}):\n" + "\n".join(wrong[:20])
