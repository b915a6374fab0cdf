"""The speed paths (issue 6) give the baseline's answers: the AVX + F16C matrix product
(asm/fast.asm), the CPU dispatch (asm/cpu.asm, `--baseline`) and the threads (asm/threads.asm,
`-t N`, default = the CPUs of sched_getaffinity).

Tolerance: none. matmul_f16_avx2 performs the same float32 operations as matmul_f16 in the same
order (its header), and threads split a product by rows without changing any row's arithmetic,
so every path must give the same bits: kernel outputs, --logits files, printed tokens. A
single rounding difference (an FMA, another summation order, a lost tail column) shows as a
byte difference, and the failure names the run, the row and the logit.

- The kernel natively against the baseline kernel on odd shapes (row pairs, an odd last row,
  tail columns, n = 144) and FP16 edge values.
- The real binary natively: default (fast path, all CPUs), --baseline, -t 1 2 3 and more
  threads than some products have rows, on both fixtures and an odd synthetic shape.
- Blocks: the prompt is fed in blocks of 16 tokens, generated tokens one by one; a prompt's
  logits rows equal, bit for bit, those of each of its prefixes (other block boundaries), and
  the long prompt's rows and greedy steps match the numpy twin (builder.reference).
- Threads at rest: with --logits blocked on a full FIFO the process has exactly T threads
  and all of them sleep (state S, no CPU time): the waits are futex waits, not spins.
- Under qemu-user: `-cpu Nehalem` (no AVX: an AVX instruction would end the run with SIGILL)
  and `-cpu Haswell`; the translated-code log (`-d in_asm`) shows which kernel ran: the fast
  one on Haswell, the baseline one on Nehalem or with --baseline, never both.
"""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from builder.modelfile import Dims, read_header, write_model
from builder.synth import synth_source, synth_vocab
from emu_tests.harness import In, Out, load_elf
from emu_tests.harness.native import NativeRunner
from modelfiles import convert_fixture

F32 = np.float32
BASE, FAST = "matmul_f16", "matmul_f16_avx2"
# 50 tokens on the fixtures, 87 on ODD: several blocks of 16 (forward.asm BLOCK) and a rest
PROMPT = "Hello world, the quick brown fox jumps over the lazy dog; then it runs home and sleeps."
BLOCK = 16
STEPS = 8
TIMEOUT = 120                                   # qemu-user runs are ~50x slower than native
ODD = Dims(vocab=600, dim=66, ffn=130, layers=2, heads=6, kv_heads=2, head_dim=22, max_ctx=128)


# --- the kernel ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu(gemma):
    return NativeRunner(load_elf(gemma.binary, gemma.symbols))


def same_bits(what: str, got: np.ndarray, want: np.ndarray) -> None:
    g, w = got.view(np.uint32).ravel(), want.view(np.uint32).ravel()
    assert g.size == w.size, f"{what}: {g.size} values, expected {w.size}"
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {w.size} values differ; first at index "
                           f"{bad[0]}: expected {want.ravel()[bad[0]]!r}, got "
                           f"{got.ravel()[bad[0]]!r}")


@pytest.mark.parametrize("d,n,accumulate", [
    (1, 1, 0), (1, 3, 1), (2, 4, 0), (3, 5, 1), (4, 7, 0), (5, 144, 1), (7, 9, 0),
    (8, 16, 1), (9, 33, 0), (33, 144, 1), (6, 2051, 0), (64, 2048, 1),
])
def test_fast_kernel_is_bit_identical(cpu, d, n, accumulate):
    rng = np.random.default_rng(d * 10007 + n * 13 + accumulate)
    w = (rng.standard_normal((d, n)) * 0.5).astype(np.float16)
    special = np.array([6e-8, -6e-8, 3e-5, -0.0, 0.0, 65504, -65504, 6.104e-5], np.float16)
    flat = w.reshape(-1)
    k = min(flat.size, 2 * special.size)
    flat[rng.choice(flat.size, k, replace=False)] = np.resize(special, k)
    x = rng.standard_normal(n).astype(F32)
    x[rng.choice(n, max(1, n // 8), replace=False)] = 0.0      # zero products of both signs
    old = rng.standard_normal(d).astype(F32)
    args = lambda: (Out(old.copy(), "xout"), In(x, "x"), In(w, "W"), n, d, accumulate)
    want = cpu.call(BASE, *args()).outputs[0]
    got = cpu.call(FAST, *args()).outputs[0]
    same_bits(f"{FAST} vs {BASE} d={d} n={n} accumulate={accumulate}", got, want)


# --- the engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("speed_models")
    found = {name: convert_fixture(name, "hf", out) for name in ("tiny_mqa", "tiny_wide")}
    odd = out / "odd.bin"
    write_model(odd, ODD, synth_vocab(ODD.vocab, 0), synth_source(0), False)
    found["odd"] = odd
    return found


def run(prefix: list[str], binary: Path, model: Path, flags: list[str], logits: Path,
        prompt: str = PROMPT, steps: int = STEPS) -> tuple[bytes, bytes]:
    """(stdout, --logits bytes) of one greedy run."""
    argv = [*prefix, str(binary), "-m", str(model), "-p", prompt, "-n", str(steps),
            "--logits", str(logits), *flags]
    r = subprocess.run(argv, capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}: {r.stderr[-400:]!r}"
    return r.stdout, logits.read_bytes()


def same_run(what: str, got: tuple[bytes, bytes], want: tuple[bytes, bytes], vocab: int):
    assert got[0] == want[0], f"{what}: printed {got[0]!r}, expected {want[0]!r}"
    g = np.frombuffer(got[1], F32).reshape(-1, vocab)
    w = np.frombuffer(want[1], F32).reshape(-1, vocab)
    assert g.shape == w.shape, f"{what}: {g.shape[0]} logits rows, expected {w.shape[0]}"
    for row in range(w.shape[0]):
        same_bits(f"{what}: logits row {row}", g[row], w[row])


def vocab_of(model: Path) -> int:
    return read_header(model).vocab


@pytest.mark.parametrize("name", ["tiny_mqa", "tiny_wide", "odd"])
def test_paths_and_thread_counts_agree_natively(gemma, models, tmp_path, name):
    model = models[name]
    want = run([], gemma.binary, model, ["--baseline", "-t", "1"], tmp_path / "base.f32")
    # 12 threads on the odd model: ceil(66 / 12) = 6 rows each, the 12th thread gets none
    for flags in ([], ["-t", "1"], ["-t", "2"], ["-t", "3"], ["--baseline", "-t", "2"],
                  ["--baseline", "-t", "3"], ["-t", "12"]):
        got = run([], gemma.binary, model, flags, tmp_path / "got.f32")
        same_run(f"{name} {' '.join(flags) or '(default)'} vs --baseline -t 1", got, want,
                 vocab_of(model))


def engine_ids(binary: Path, model: Path, text: str) -> list[int]:
    r = subprocess.run([str(binary), "-m", str(model), "-p", text, "--tokens"],
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


@pytest.mark.parametrize("name", ["tiny_mqa", "tiny_wide", "odd"])
def test_prompt_blocks_do_not_change_any_logit(gemma, models, tmp_path, name):
    """Position p's logits are the same bits whether p sits in a full block, a partial one or
    at a block's start: every prefix of the prompt ending at a word (when its ids are a prefix
    of the whole prompt's) gives the first rows of the whole prompt's run."""
    model, vocab = models[name], vocab_of(models[name])
    ids = engine_ids(gemma.binary, model, PROMPT)
    assert len(ids) > 3 * BLOCK, f"{name}: {len(ids)} prompt ids, want several blocks"
    whole = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "whole.f32",
                              steps=0)[1], F32).reshape(-1, vocab)
    lengths = set()
    for cut in (i for i, c in enumerate(PROMPT) if c == " "):
        part = engine_ids(gemma.binary, model, PROMPT[:cut])
        if part != ids[:len(part)]:
            continue                      # the cut splits a token: not a prefix in ids
        rows = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "part.f32",
                                 PROMPT[:cut], 0)[1], F32).reshape(-1, vocab)
        assert len(rows) == len(part)
        for p in range(len(part)):
            same_bits(f"{name}: prompt of {len(part)} ids, position {p}", rows[p], whole[p])
        lengths.add(len(part))
    # prefixes ending inside the first block, on a block boundary +- 1 and in later blocks
    assert len(lengths) >= 8 and max(lengths) > 2 * BLOCK, sorted(lengths)


def test_long_prompt_against_twin(gemma, models, tmp_path):
    """ODD's 87-id prompt (5 full blocks and 7) and greedy steps against the numpy twin, with
    test_engine_logits' TWIN_TOL and its near-tie rule for the greedy tokens."""
    from test_engine_logits import TWIN_TOL, check_rows
    from builder.modelfile import ModelFile
    from builder.reference import Reference
    model = models["odd"]
    ids = engine_ids(gemma.binary, model, PROMPT)
    prompt_ref, step_ref, greedy = Reference(ModelFile(model)).generate(ids, STEPS)
    rows = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "l.f32")[1],
                         F32).reshape(-1, ODD.vocab)
    check_rows(f"odd, {len(ids)}-id prompt", rows, ids, prompt_ref, step_ref, greedy, TWIN_TOL)


def executed(log: Path, symbols: dict, name: str) -> bool:
    """Whether qemu's -d in_asm log translated an instruction inside symbol `name`."""
    lo = symbols[name]["address"]
    hi = lo + symbols[name]["size"]
    return any(lo <= int(a, 16) < hi
               for a in re.findall(r"^0x([0-9a-f]+):", log.read_text(), re.M))


@pytest.mark.parametrize("cpu_model,flags,kernel", [
    ("Nehalem", [], BASE), ("Nehalem", ["-t", "2"], BASE), ("Nehalem", ["-t", "3"], BASE),
    ("Haswell", [], FAST), ("Haswell", ["-t", "3"], FAST), ("Haswell", ["--baseline"], BASE),
])
def test_qemu_cpu_models_choose_and_agree(gemma, models, tmp_path, cpu_model, flags, kernel):
    model = models["odd"]
    want = run([], gemma.binary, model, ["--baseline", "-t", "1"], tmp_path / "base.f32")
    log = tmp_path / "in_asm.log"
    got = run(["qemu-x86_64", "-cpu", cpu_model, "-d", "in_asm", "-D", str(log)], gemma.binary,
              model, flags, tmp_path / "got.f32")
    what = f"qemu -cpu {cpu_model} {' '.join(flags) or '(default)'}"
    other = FAST if kernel == BASE else BASE
    assert executed(log, gemma.symbols, kernel), f"{what}: {kernel} never ran"
    assert not executed(log, gemma.symbols, other), f"{what}: {other} ran"
    same_run(f"{what} vs native --baseline -t 1", got, want, ODD.vocab)


# --- threads at rest -------------------------------------------------------------------------

def task_states(pid: int) -> dict[int, tuple[str, int]]:
    """{tid: (state, utime + stime in ticks)} of every thread of process `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = (fields[0], int(fields[11]) + int(fields[12]))
    return out


@pytest.mark.parametrize("threads,cpus", [(1, None), (3, None), (None, "one"), (None, "all")])
def test_threads_sleep_while_output_blocks(gemma, models, tmp_path, threads, cpus):
    """With --logits on a FIFO nobody reads, the first row's write blocks (the pipe's buffer is
    set to one page, smaller than a row of tiny_wide's logits): then the process has exactly T
    threads (no clone for T = 1; without -t, T = the CPUs of its affinity mask, here all of
    this process's or just the first) and every one of them sleeps — none spins (state S, no
    CPU time used)."""
    mask = os.sched_getaffinity(0)
    if cpus == "one":
        mask = {min(mask)}
    flags = [] if threads is None else ["-t", str(threads)]
    threads = threads or len(mask)
    fifo = tmp_path / "logits.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)      # the engine's open then succeeds
    assert fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096) < vocab_of(models["tiny_wide"]) * 4
    proc = subprocess.Popen([str(gemma.binary), "-m", str(models["tiny_wide"]), "-p", PROMPT,
                             "-n", "4", *flags, "--logits", str(fifo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: os.sched_setaffinity(0, mask))
    try:
        deadline = time.monotonic() + 30
        syscall = Path(f"/proc/{proc.pid}/syscall")
        while syscall.read_text().split()[0] != "1":         # until it sits in write(2)
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the engine never blocked writing --logits"
            time.sleep(0.02)
        states = task_states(proc.pid)
        before = sum(t for _, t in states.values())
        time.sleep(0.5)
        after = task_states(proc.pid)
        assert len(after) == threads, f"{len(after)} threads, expected {threads}"
        assert all(s == "S" for s, _ in after.values()), f"a thread is not asleep: {after}"
        used = sum(t for _, t in after.values()) - before
        assert used <= 1, f"{used} ticks of CPU time used in 0.5 s while blocked"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
        os.close(reader)
