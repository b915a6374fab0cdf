"""Hostile input on the real binary.

- The fuzz run: fuzz.suite's CASES seeded cases (emu_tests/fuzz: mutated version 4 files of
  tiny_mqa, tiny_wide, tiny_mqa-from-GGUF, a synthetic Gemma 3 file in FP16 and in Q8_0, their
  programs mutated by mutate4, valid odd-shaped and sparse 2B models, hostile command lines),
  two subprocesses of ./gemma at a time, TIMEOUT s each. Budget: no case is started after
  BUDGET s, and at least MIN_CASES must have run (the report line the test prints gives the
  count and the rate). Every run must exit normally; a refusal is exactly one "gemma: ..." line
  on stderr and nothing on stdout; inputs the format's rules make invalid must be refused, and
  the program mutations as the Python reader (ModelFile4) judges them. Replay a failure:
  `python -m emu_tests.fuzz --binary ./gemma --case N`.
- Valid odd shapes give the numpy reference's logits (no silent read past a tensor): the
  engine runs the version 4 file, the reference the version 2 file of the same weights.
- Output into a closed pipe ends promptly and without a signal.
- The model file keeps its bytes and modification time; it is opened read-only and mapped
  PROT_READ + MAP_PRIVATE (seen through qemu-user's -strace).
- The mutators themselves: reproducible, covering every boundary, reading the program as the
  reader does, and never calling a file invalid that builder.models.modelfile4's reader
  accepts.
- test_regression_F*: each crash fuzzing found (F1, F2, ...), kept as a named case.
"""
from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from builder.models.modelfile import (HEADER_SIZE, PIECE, PIECE_REC, TENSOR_ALIGN, UNUSED, WEIGHTS_ALIGN, ModelFile,
                                      ModelFormatError, write_model)
from builder.models.modelfile4 import HEADER_FIELDS, OP_REC, RULES, SLOT_REC, ModelFile4, Op, OpRec, WType, weight_bytes
from builder.twins.program import Interpreter
from builder.twins.reference import Reference
from emu_tests.asm_facts import constant
from fuzz import suite
from fuzz.model import Base, header_problems, parse_header, write_case
from fuzz.mutate import Case, MODEL
from fuzz.runner import judge, run
from fuzz.shapes import SHAPES, write_shape
from linker.layout import align_up

pytestmark = pytest.mark.slow  # the fuzz campaign: ~150 s on 2 cores, and its qemu runs

MIN_CASES = 2000    # at least this many in CI
BUDGET = 150.0      # seconds after which no case is started (the suite takes ~160 s: its random tail is cut)
TIMEOUT = 10.0      # per case; runs take milliseconds


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The suite's model files: fixtures converted, odd shapes, the sparse 2B file."""
    return suite.models(tmp_path_factory.mktemp("fuzz-models"))


@pytest.fixture(scope="module")
def cases(models) -> list[Case]:
    """The suite's cases (seed suite.SEED)."""
    return suite.cases(models)


@pytest.fixture(scope="module")
def engine(gemma) -> Path:
    return gemma.binary


@pytest.fixture(scope="module")
def base_model(models) -> Path:
    return models["tiny_mqa"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- point 1: the fuzz run ---------------------------------------------------------------------
def test_fuzz_model_files_and_command_lines(engine, models, cases, tmp_path):
    before = {name: sha256(path) for name, path in models.items() if name != "sparse_2b"}
    report = run(engine, models, cases, tmp_path, timeout=TIMEOUT, budget=BUDGET)
    print(f"\nfuzz (seed {suite.SEED}, budget {BUDGET:g} s, {TIMEOUT:g} s per case): "
          f"{report.summary()}")
    shown = "\n".join(str(f) for f in report.failures[:25])
    assert not report.failures, (f"{len(report.failures)} of {report.ran} runs failed "
                                 f"(seed {suite.SEED}); first ones:\n{shown}")
    assert report.ran >= MIN_CASES, f"only {report.ran} cases within {BUDGET:g} s"
    after = {name: sha256(models[name]) for name in before}
    assert after == before, "a model file changed during the fuzz run"


def test_fuzz_baseline_under_qemu(engine, models, cases, tmp_path):
    """The runs that reach the forward pass and the tokenizer (odd shapes, the sparse 2B
    file, corrupted and random tokenizer tables, NaN and infinite weights) again under
    qemu-x86_64 -cpu Nehalem: the baseline (SSE4.1) code, whatever the host has."""
    def chosen(c: Case) -> bool:
        return (c.model in SHAPES or c.label.startswith("sparse_2b:")
                or c.model in ("tiny_mqa", suite.G3_BASE)
                and any(k in c.label for k in (" all ", "every piece", "index[", "index ")))
    tables = [c for c in cases if c.model == "tiny_mqa" and "valid tokenizer" in c.label]
    picked = [c for c in cases if chosen(c)] + tables[:30]
    report = run(engine, models, picked, tmp_path, timeout=30,
                 launcher=("qemu-x86_64", "-cpu", "Nehalem"))
    print(f"\nfuzz under qemu Nehalem: {report.summary()}")
    shown = "\n".join(str(f) for f in report.failures[:25])
    assert not report.failures, f"{len(report.failures)} of {report.ran} runs failed:\n{shown}"
    assert report.ran == len(picked) > 200


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    """The odd shapes as version 2 files of the same weights (what the reference reads)."""
    tmp = tmp_path_factory.mktemp("fuzz-twins")
    return {name: write_shape(name, tmp / f"{name}.v2.bin", writer=write_model) for name in SHAPES}


@pytest.mark.parametrize("how", ["-t 1", "-t 3", "-t 256", "-t 3 --baseline"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_odd_shapes_compute_the_reference_logits(engine, models, twins, shape, how, tmp_path):
    """Valid odd shapes (dims 1..33, head_dim > dim, ffn 4), on 1, 3 and 256 threads (more
    threads than rows), on the host's fast path and the baseline one: --logits of a prompt
    filling most of the context equal builder.twins.reference's on the version 2 file of the
    same weights. A read past a tensor's end that does not crash, or rows no thread computes,
    show here as wrong numbers."""
    model = ModelFile(twins[shape])
    ctx = min(model.dims.max_ctx, constant("DEFAULT_CTX"))
    k = max(0, min(ctx - 2, 6))                # prompt: BOS + k byte pieces <0x01>
    ids = [model.header.bos] + [model.header.byte_base + 1] * k
    out = tmp_path / "logits.bin"
    p = subprocess.run([engine, "-m", models[shape], "-p", "\x01" * k, "-n", "1", *how.split(),
                        "--logits", out], capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 0, f"status {p.returncode}: {p.stderr!r}"
    got = np.fromfile(out, "<f4").reshape(-1, model.dims.vocab)[:len(ids)]
    ref = Reference(model)
    want = np.stack([ref.forward(t, i) for i, t in enumerate(ids)])
    assert got.shape == want.shape, f"{got.shape[0]} logits rows, expected {len(ids)}"
    # float32 sums of at most 65 terms in another order differ by ~1e-6 relative; 1e-4 of the
    # largest logit is far below what a misread weight or a skipped remainder does (O(1)).
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    err = np.abs(got - want)
    pos, tok = np.unravel_index(int(err.argmax()), err.shape)
    assert err.max() <= tol, (f"position {pos} token {tok}: engine {got[pos, tok]}, reference "
                              f"{want[pos, tok]} (max error {err.max():.3g} > {tol:.3g})")


# -- point 2: a closed pipe --------------------------------------------------------------------
def test_closed_pipe_ends_promptly_and_quietly(engine, base_model):
    """`gemma ... | head -c1` in a real shell, and a pipe closed before the first write."""
    script = '"$@" | head -c1 >/dev/null; echo "status ${PIPESTATUS[0]}" >&2'
    for argv in ([b"-p", b"Once upon a time", b"-n", b"1000", b"--temp", b"1", b"-s", b"5"],
                 [b"-p", b"Once", b"-n", b"1000", b"--temp", b"1", b"-s", b"6", b"-t", b"4"],
                 [b"-p", b"\xff" * 1000, b"--tokens"]):
        cmd = ["bash", "-c", script, "gemma", str(engine), "-m", str(base_model), *argv]
        t = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, timeout=30)
        took = time.monotonic() - t
        *lines, last = p.stderr.decode(errors="replace").splitlines() or ["status ?"]
        status = int(last.split()[-1])
        assert status < 128, f"{argv[:2]}: killed by signal {status - 128} ({last})"
        assert len(lines) <= 1 and all(x.startswith("gemma: ") for x in lines), lines
        assert took < 10, f"{took:.1f} s after the reader went away"
    r, w = os.pipe()
    os.close(r)         # the reader is gone before the first byte is written
    p = subprocess.Popen([engine, "-m", base_model, "-p", "hello", "--tokens"], stdout=w,
                         stderr=subprocess.PIPE)
    os.close(w)
    _, err = p.communicate(timeout=10)
    assert p.returncode >= 0, f"killed by {signal.Signals(-p.returncode).name}"
    assert p.returncode != 0 and err.count(b"\n") == 1 and err.startswith(b"gemma: "), \
        f"a write into a closed pipe must fail with one line: status {p.returncode}, {err!r}"


# -- out of memory at every allocation ---------------------------------------------------------
def test_out_of_memory_anywhere_is_one_line(engine, base_model):
    """Address-space limits from 64 MB down to 2 MB in 250 KB steps, with 256 threads (each
    worker's stack is an allocation of its own, the last ones made): every run ends with
    status 0, or 1 and `gemma: out of memory`, never by a signal. (An allocation failing in
    threads_start once ended in SIGSEGV: the error path read front_base's variables through
    rbp, which holds a thread index there.)"""
    statuses = set()
    for kb in range(64_000, 2_000, -250):
        def limit(kb=kb):
            resource.setrlimit(resource.RLIMIT_AS, (kb << 10, kb << 10))
        p = subprocess.run([engine, "-m", base_model, "-p", "hi", "-n", "2", "-t", "256"],
                           capture_output=True, timeout=TIMEOUT, preexec_fn=limit)
        assert p.returncode >= 0, f"{kb} KB: killed by {signal.Signals(-p.returncode).name}, {p.stderr!r}"
        assert (p.returncode, p.stderr) in ((0, b""), (1, b"gemma: out of memory\n")), (kb, p.returncode, p.stderr)
        statuses.add(p.returncode)
    assert statuses == {0, 1}, f"the sweep must cross the limit: statuses {statuses}"


# -- point 3: the model file is only read ------------------------------------------------------
def test_model_file_unchanged_after_runs(engine, base_model, tmp_path):
    model = tmp_path / "model.bin"
    shutil.copyfile(base_model, model)
    os.utime(model, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    model.chmod(0o444)                         # (for a non-root user, a write-open fails)
    before = (sha256(model), model.stat().st_mtime_ns, model.stat().st_size)
    runs = [["-p", "hello world", "-n", "4"], ["-p", "hi", "--tokens"],
            ["-p", "a b c", "-n", "3", "--temp", "1", "-s", "9", "--top-p", "0.9"],
            ["-p", "x", "-n", "2", "--logits", str(tmp_path / "logits.bin")]]
    for argv in runs:
        p = subprocess.run([engine, "-m", model, *argv], capture_output=True, timeout=TIMEOUT)
        assert p.returncode == 0, f"{argv}: status {p.returncode}, {p.stderr!r}"
    after = (sha256(model), model.stat().st_mtime_ns, model.stat().st_size)
    assert after == before, f"model file changed: (sha256, mtime_ns, size) {before} -> {after}"


def test_model_mapped_read_only_and_private(engine, base_model):
    """qemu-user -strace shows how the model is opened and every mapping of its descriptor."""
    p = subprocess.run(["qemu-x86_64", "-cpu", "Nehalem", "-strace", engine, "-m", base_model,
                        "-p", "hi", "-n", "2"], capture_output=True, timeout=60)
    trace = p.stderr.decode(errors="replace")
    assert p.returncode == 0, f"status {p.returncode}: {trace[-800:]}"
    opens = re.findall(r'open(?:at)?\((?:-?\d+,)?"' + re.escape(str(base_model))
                       + r'",([^,)]*)[^)]*\) = (\d+)', trace)
    assert len(opens) == 1, f"expected one open of the model, got {opens}"
    flags, fd = opens[0]
    assert "O_RDONLY" in flags or flags.strip() in ("0", "0x0"), f"opened with {flags}"
    maps = re.findall(r"mmap\([^,]*,\d+,([^,]*),([^,]*)," + fd + r",", trace)
    assert maps, f"the model (fd {fd}) is never mapped:\n{trace[-800:]}"
    for prot, mflags in maps:
        assert prot == "PROT_READ" and "MAP_PRIVATE" in mflags and "MAP_SHARED" not in mflags, \
            f"model mapped {prot} {mflags}"
    assert not re.search(rf"\b(write|pwrite64|ftruncate|msync)\({fd},", trace), \
        "the model's descriptor is written to"


# -- the mutators --------------------------------------------------------------------------------
def test_cases_are_reproducible_and_seeded(models, cases):
    a, b, c = cases, suite.cases(models), suite.cases(models, suite.SEED + 1)
    assert a == b
    assert sum(x != y for x, y in zip(a, c)) > 500, "another seed changes the random cases"
    assert len({(x.model, x.label) for x in a}) > 0.9 * len(a)


def test_truncations_cover_every_boundary(models, cases):
    for model in suite.MUTATED:
        base = Base.load(models[model])
        sizes = {c.size for c in cases if c.size is not None and c.model == model}
        for name, off in base.boundaries().items():
            missing = {off - 1, off, off + 1} - sizes - {base.length} - {-1}
            assert not missing, f"{model}: no truncation to {sorted(missing)} around {name} ({off})"


def test_base_reads_the_program_as_the_reader_does(models):
    """fuzz.model.Base's weights (what the weight mutators and truncations aim at) are the
    reader's: each op's weight once, its bytes by the op's shape and type; weights_size is the
    last one's end rounded up to TENSOR_ALIGN, and no base breaks a rule."""
    for name in [*suite.MUTATED, *SHAPES]:
        base, f = Base.load(models[name]), ModelFile4(models[name])
        want = {(o.w, weight_bytes(f.weight_shape(o), o.wtype)) for o in f.ops if RULES[Op(o.op)].weight}
        assert {(t.offset, t.nbytes) for t in base.weights} == want, name
        assert len(base.weights) == len(want) and base.ops == f.ops, name
        assert align_up(base.weights_end, TENSOR_ALIGN) == f.header.weights_size, name
        assert header_problems(base.header, base.length, base.weights_end) == [], name


def test_mutators_make_q8_0_cases(tmp_path):
    """On a Q8_0 base the weight mutators edit whole blocks: the systematic cases set every
    block's FP16 scale (NaN, inf, FP16's max ...) with q = 127, the random ones one block's
    scale or one of its q, never past the tensor; no case of the base is refused. (The suite
    runs such cases through the engine on shapes.Q8_BASE.)"""
    from builder.models import synth
    from fuzz import mutate
    synth.synth("tiny-g3", tmp_path / "q.bin", progress=False, wtype="q8_0", version=4)
    base = Base.load(tmp_path / "q.bin")
    assert header_problems(base.header, base.length, base.weights_end) == []
    tensors = {t.name: t for t in base.weights}
    wo = base.header["weights_off"]
    cases = mutate.make_cases({"q8": base}, seed=3, count=3000)
    embed = [c for c in cases if c.label.startswith("op0.EMBED all q8_0 bits")]
    assert embed and all(len(c.edits) == 1 and c.edits[0][0] == wo + tensors["op0.EMBED"].offset
                         and len(c.edits[0][1]) == tensors["op0.EMBED"].nbytes
                         and c.edits[0][1][34:36] == c.edits[0][1][:2] and c.edits[0][1][2:34] == b"\x7f" * 32
                         for c in embed)
    blocks = [c for c in cases if " blocks := " in c.label]
    assert blocks, "no random Q8_0 block edits"
    for c in blocks:
        t = tensors[c.label.split(": ")[1].split(" ")[0]]
        for off, raw in c.edits:
            at = (off - wo - t.offset) % 34
            assert 0 <= off - wo - t.offset < t.nbytes and (at == 0 if len(raw) == 2 else at >= 2), c.label


def _python_refusals(models: dict[str, Path], cases: list[Case], tmp: str) -> tuple[int, list[str]]:
    """In a child process (address space 2 GB, 3 s per file): every mutated file that
    fuzz.model.header_problems calls invalid, opened with
    builder.models.modelfile4.ModelFile4; what it did not refuse."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    def too_slow(*_):
        raise TimeoutError("more than 3 s")
    signal.signal(signal.SIGALRM, too_slow)
    bases, path = {n: Base.load(models[n]) for n in suite.MUTATED}, Path(tmp) / "m.bin"
    checked, wrong = 0, []
    for i, case in enumerate(cases):
        if not (case.edits or case.size is not None) or case.model not in bases:
            continue
        base = bases[case.model]
        write_case(path, base.data, base.length, case.edits, case.size)
        data = path.read_bytes()
        if len(data) >= HEADER_SIZE and not header_problems(parse_header(data), len(data), base.weights_end):
            continue
        checked += 1
        signal.alarm(3)
        try:
            ModelFile4(path)
            wrong.append(f"case {i}: accepted: {case.label}")
        except ModelFormatError:
            pass
        except BaseException as e:  # noqa: BLE001 - anything else is the finding
            wrong.append(f"case {i}: {type(e).__name__} {str(e)[:80]}: {case.label}")
        finally:
            signal.alarm(0)
    return checked, wrong


def test_files_to_refuse_are_refused_by_the_python_reader(models, cases, tmp_path):
    """Twin check of fuzz.model.header_problems: whatever file it calls invalid,
    builder.models.modelfile4.ModelFile4 refuses too, promptly and cleanly."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        checked, wrong = pool.apply(_python_refusals, (models, cases, str(tmp_path)))
    assert checked > 2000
    assert not wrong, f"{len(wrong)} mutated files not refused cleanly:\n" + "\n".join(wrong[:20])


def test_judge_names_each_kind_of_failure():
    from fuzz.runner import Outcome
    case, bad = Case("c", argv=(MODEL,)), Case("c", reject=True)
    assert judge(case, Outcome(None, b"", b"", 10), 10) == ["hang: no exit within 10 s"]
    assert judge(case, Outcome(-11, b"", b"", 0), 10) == ["killed by SIGSEGV"]
    assert judge(case, Outcome(1, b"", b"gemma: bad\n", 0), 10) == []
    assert judge(case, Outcome(1, b"x", b"gemma: a\nb\n", 0), 10) == [
        "refusal is not exactly one 'gemma: ...' line on stderr", "refusal wrote to stdout"]
    assert judge(bad, Outcome(0, b"x", b"", 0), 10) == [
        "accepted an input the contract says is invalid"]
    good = Case("c", accept=True)
    assert judge(good, Outcome(1, b"", b"gemma: no\n", 0), 10) == ["refused a valid input"]
    usage = Case("c", reject=True, status=2)
    assert judge(usage, Outcome(2, b"", b"gemma: unknown option -x\n", 0), 10) == []
    assert judge(usage, Outcome(1, b"", b"gemma: unknown option -x\n", 0), 10) == [
        "exit status 1, not 2"]
    assert judge(case, Outcome(0, b"", b"", 0, model_changed=True), 10) == [
        "the model file changed"]
    assert judge(case, Outcome(0, b"", b"", 0, differs=True), 10) == [
        "a second run gave other output (stdout or --logits)"]
    assert judge(case, Outcome(0, b"", b"", 0, second_hang=True), 10) == [
        "hang: the second run did not exit within 10 s"]


# -- regressions: each finding of the fuzzer, by number ----------------------------
def test_regression_F1_python_reader_huge_counts(engine, base_model, tmp_path):
    """F1: ModelFile walked every layer of a hostile header (2^31: minutes and gigabytes). In
    version 4 the program's ops and slots are the records a header counts: a huge n_ops or
    n_slots is refused at once, by the reader and the engine."""
    for name in ("n_ops", "n_slots"):
        data = bytearray(base_model.read_bytes())
        at = next(off for field, off, _ in HEADER_FIELDS if field == name)
        data[at:at + 4] = (0x058C1775).to_bytes(4, "little")
        (tmp_path / "m.bin").write_bytes(bytes(data))
        t = time.monotonic()
        with pytest.raises(ModelFormatError, match=name):
            ModelFile4(tmp_path / "m.bin")
        assert time.monotonic() - t < 2
        p = subprocess.run([engine, "-m", tmp_path / "m.bin", "-p", "hi", "--tokens"], capture_output=True,
                           timeout=TIMEOUT)
        assert (p.returncode, p.stderr, p.stdout) == (1, b"gemma: bad header\n", b""), name


@pytest.mark.parametrize("delta", [-1, 1, None])
def test_regression_F4_max_piece_len_must_be_the_longest_piece(engine, base_model, tmp_path,
                                                                 delta):
    """F4: the engine took any max_piece_len >= the longest piece, and a huge one switched off
    the early "prompt too long" guard: a 128 KB prompt was then merged in O(n^2), 5-7 s. Now
    max_piece_len must equal the longest piece (as builder.models.modelfile already required): a
    one-line refusal at load, before the prompt is looked at."""
    data = bytearray(base_model.read_bytes())
    longest = ModelFile4(base_model).header.max_piece_len
    value = 0xFFFFFFFF if delta is None else longest + delta
    at = next(off for name, off, _ in HEADER_FIELDS if name == "max_piece_len")
    data[at:at + 4] = value.to_bytes(4, "little")
    model = tmp_path / "m.bin"
    model.write_bytes(bytes(data))
    prompt = " ".join(["the cat sat on the mat"] * 5000)   # ~110 KB
    t0 = time.monotonic()
    p = subprocess.run([engine, "-m", model, "-p", prompt, "--tokens"], capture_output=True,
                       timeout=TIMEOUT)
    assert p.returncode == 1 and p.stderr.startswith(b"gemma: ") and p.stderr.count(b"\n") == 1, \
        f"status {p.returncode}, stderr {p.stderr!r}"
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(ModelFormatError, match="max_piece_len"):
        ModelFile4(model)


@pytest.mark.parametrize("how", ["path", "symlink", "hard link", "/proc/self/fd/3"])
def test_regression_F3_logits_is_the_model(engine, base_model, tmp_path, how):
    """F3: --logits naming the model file truncated the mapped model: SIGBUS, model destroyed.
    Now a one-line refusal, and the model keeps its bytes."""
    model = tmp_path / "m.bin"
    shutil.copyfile(base_model, model)
    dest = {"path": model, "symlink": tmp_path / "s.bin", "hard link": tmp_path / "h.bin",
            "/proc/self/fd/3": Path("/proc/self/fd/3")}[how]
    if how == "symlink":
        dest.symlink_to(model)
    elif how == "hard link":
        os.link(model, dest)
    before = sha256(model)
    p = subprocess.run([engine, "-m", model, "-p", "hello", "-n", "3", "--logits", dest],
                       capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 1 and p.stderr.startswith(b"gemma: ") and p.stderr.count(b"\n") == 1, \
        f"status {p.returncode}, stderr {p.stderr!r}"
    assert p.stdout == b"" and sha256(model) == before


@pytest.mark.parametrize("gap", ["n_index - 1", "strings_size - 8", "blob_off + 1", "weights_off + 4096"])
def test_regression_F6_sections_meet_exactly(engine, base_model, tmp_path, gap):
    """F6 (the version 4 fuzz): the engine took a section that starts past the end of the one
    before (a gap: a shorter index, a shorter strings section, the blob moved into the
    padding, the weights a page later with weights_size one less), which format.md's
    validation and the reader refuse. Now a one-line refusal, as the reader's."""
    base = Base.load(base_model)
    h, at = base.header, {name: (off, code) for name, off, code in HEADER_FIELDS}
    field, delta = gap.split(" ")[0], int(gap.split(" ")[-1]) * (-1 if "-" in gap else 1)
    values = {field: h[field] + delta}
    if field == "weights_off":
        values["weights_size"] = h["weights_size"] - delta
    assert header_problems(dict(h, **values), base.length, base.weights_end), gap
    data = bytearray(base_model.read_bytes())
    for name, v in values.items():
        off, code = at[name]
        data[off:off + struct.calcsize(code)] = struct.pack("<" + code, v)
    model = tmp_path / "m.bin"
    model.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError):
        ModelFile4(model)
    p = subprocess.run([engine, "-m", model, "-p", "hi", "--tokens"], capture_output=True, timeout=TIMEOUT)
    assert (p.returncode, p.stderr, p.stdout) == (1, b"gemma: bad header\n", b""), gap


@pytest.mark.parametrize("how", ["", "--avx2", "--baseline"])
@pytest.mark.parametrize("n", [143, 136])
def test_regression_F7_logits_columns_choose_the_kernels(engine, models, tmp_path, n, how):
    """F7 (the version 4 fuzz, CI): a LOGITS op whose n is not a multiple of 16 (tiny_wide's
    144 edited to 143 or 136, inside its slot) while every MATMUL's is: check_program or-ed
    only the MATMULs' n into fv_cols, so the AVX2 and AVX-512 kernels, whose precondition is
    16 columns at a time, ran on it: other logits from run to run, and with --logits a SIGBUS
    or SIGSEGV. Now LOGITS' n chooses the kernels too: on every path the engine gives the
    program interpreter's logits."""
    base = Base.load(models["tiny_wide"])
    last = base.header["program_off"] + OP_REC * (len(base.ops) - 1)
    assert Op(base.ops[-1].op) == Op.LOGITS and base.ops[-1].n == 144
    data = bytearray(models["tiny_wide"].read_bytes())
    data[last:last + OP_REC] = dataclasses.replace(base.ops[-1], n=n).pack()
    model = tmp_path / "m.bin"
    model.write_bytes(bytes(data))
    mf = ModelFile4(model)
    assert mf.ops[-1].n == n
    ids = [mf.header.bos] + [mf.header.byte_base + 1] * 5           # "\x01" * 5: byte pieces
    out = tmp_path / "logits.bin"
    p = subprocess.run([engine, "-m", model, "-p", "\x01" * 5, "-n", "1", "--logits", out, *how.split()],
                       capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 0, f"status {p.returncode}: {p.stderr!r}"
    got = np.fromfile(out, "<f4").reshape(-1, mf.header.vocab)
    want = Interpreter(mf).prompt(ids)
    assert got.shape == want.shape
    # as in test_odd_shapes: another summation order is ~1e-6 relative; a skipped or misread
    # column is O(1)
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= tol


def write_wide_vocab(base: Base, path: Path, vocab: int, n: int = 16) -> None:
    """base's tokenizer with its pieces padded by empty UNUSED ones up to vocab, and the program
    EMBED s1 <- E[id][0 .. n-1], LOGITS <- E s1 over one FP16 table E [vocab, n] of zeros (a
    hole): a valid file but for vocab's range."""
    h = base.header
    ops = [OpRec(Op.EMBED, 1, n=n, k=n, a=1.0, wtype=WType.F16), OpRec(Op.LOGITS, 0, 1, n=n, wtype=WType.F16)]
    g = dict(h, vocab=vocab, n_slots=1, n_ops=len(ops), program_off=HEADER_SIZE + SLOT_REC)
    g["strings_off"] = g["program_off"] + OP_REC * len(ops)
    g["pieces_off"] = g["strings_off"] + h["strings_size"]
    shift = g["pieces_off"] + PIECE_REC * vocab - h["index_off"]
    for name in ("index_off", "user_off", "merges_off", "blob_off"):
        g[name] = h[name] + shift
    g["weights_off"] = align_up(g["blob_off"] + h["blob_size"], WEIGHTS_ALIGN)
    g["weights_size"] = align_up(weight_bytes((vocab, n), WType.F16), TENSOR_ALIGN)
    g["file_size"] = g["weights_off"] + g["weights_size"]
    head = b"".join(struct.pack("<" + code, g[name]) for name, _, code in HEADER_FIELDS).ljust(HEADER_SIZE, b"\0")
    pad = PIECE.pack(0, 0, 0.0, UNUSED) * (vocab - h["vocab"])
    strings_pieces = base.data[h["strings_off"]:h["index_off"]]
    tables = base.data[h["index_off"]:h["blob_off"] + h["blob_size"]]          # index, user, merges, blob
    with open(path, "wb") as f:
        f.write(head + struct.pack("<II", n, 0) + b"".join(o.pack() for o in ops) + strings_pieces + pad + tables)
        f.truncate(g["file_size"])


@pytest.mark.parametrize("vocab", [(1 << 24) - 1, 1 << 24])
def test_regression_F8_vocab_below_2_to_24(engine, base_model, tmp_path, vocab):
    """F8 (an audit of the checks against what the handlers assume): vocab could be 2^24. With
    --logits, a block of BLOCK = 64 tokens' logits are 64 * 2^24 * 4 = 2^32 bytes, which
    h_logits counts in 32 bits: 0, so none were written and the sampler read 64 MB before the
    logits: SIGSEGV after the 64-token prompt (on every path; 4 GB of logits computed). Now
    vocab is below 2^24 (forward's byte counts fit in 32 bits): 2^24 is refused at load, by
    the reader and the engine, in one line; 2^24 - 1, the largest, runs (its --logits bytes,
    2^32 - 256 a block, are not written here: 4 GB)."""
    model = tmp_path / "m.bin"
    write_wide_vocab(Base.load(base_model), model, vocab)
    args = [engine, "-m", model, "-p", "\x01" * 63, "-n", "1", "--temp", "0"]    # <bos> and 63 byte pieces
    if vocab < 1 << 24:
        assert ModelFile4(model).header.vocab == vocab
        p = subprocess.run(args, capture_output=True, timeout=60)
        assert (p.returncode, p.stderr) == (0, b""), f"status {p.returncode}: {p.stderr!r}"
        return
    p = subprocess.run([*args, "--logits", "/dev/null"], capture_output=True, timeout=60)
    assert (p.returncode, p.stderr, p.stdout) == (1, b"gemma: bad header\n", b""), f"status {p.returncode}"
    with pytest.raises(ModelFormatError, match="vocab = 16777216 is out of range"):
        ModelFile4(model)


@pytest.mark.parametrize("case, edits", [
    ("product into its input", {2: dict(s0=2), 5: dict(s0=2), 6: dict(s1=2)}),   # q = W q: RoPE, ATTN read it
    ("gate is the input", {10: dict(s1=4)}),
    ("attention into its K", {6: dict(s0=6), 7: dict(s1=6)}),                      # o in the K cache, read on
    ("attention into its V", {6: dict(s0=7), 7: dict(s1=7)}),
])
def test_regression_F9_products_and_attention_name_distinct_slots(engine, models, tmp_path, case, edits):
    """F9 (an audit of the checks against what the handlers assume): a MATMUL whose s0 or gate
    is its input s1, an ATTN whose s0 is its K or V cache, were valid (tiny_wide's ops edited,
    every width inside its slot): the threads write rows of one while others still read them
    (and one thread's later rows read its own results), so the logits were not the program
    interpreter's (off by 5-8 on a 40-token prompt, every path) and changed from run to run.
    Now those ops' operands must be distinct slots: a one-line refusal, as the reader's."""
    base = Base.load(models["tiny_wide"])
    data = bytearray(models["tiny_wide"].read_bytes())
    for i, fields in edits.items():
        at = base.header["program_off"] + OP_REC * i
        data[at:at + OP_REC] = dataclasses.replace(base.ops[i], **fields).pack()
    model = tmp_path / "m.bin"
    model.write_bytes(bytes(data))
    p = subprocess.run([engine, "-m", model, "-p", "\x01\x02\x03" * 13, "-n", "1"], capture_output=True,
                       timeout=TIMEOUT)
    assert (p.returncode, p.stderr, p.stdout) == (1, b"gemma: bad program\n", b""), case
    with pytest.raises(ModelFormatError, match="as an operand before it does"):
        ModelFile4(model)
