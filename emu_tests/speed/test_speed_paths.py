"""The speed paths against the baseline and against themselves: the AVX + FMA + F16C
matrix product (asm/fast.asm), the CPU dispatch (asm/cpu.asm, `--baseline`) and the threads
(asm/threads.asm, `-t N`, default = the CPUs of sched_getaffinity).

Tolerances. The fast kernel rounds once per fused multiply-add where the baseline rounds the
product and the sum, so the two paths differ in the last bits: kernel results are held to the
float32 error bound against float64 (test_fast_kernel_against_float64's docstring), logits of
the fast path to PATH_TOL of the baseline's. Within one path there is no tolerance: a
(row, token) result never depends on which tokens share a kernel call or which rows a thread
gets, so every thread count and every prompt block gives the same bits; a difference names the
run, the row and the logit.

- The fast kernel natively, with k = 1..4 tokens and a row stride, against float64, against
  itself (k and row splits) and the baseline kernel, on FP16 edge values.
- The real binary natively: default (fast path, all CPUs), --baseline, -t 1 2 3 and more
  threads than some products have rows, on both fixtures and an odd synthetic shape (dim 66:
  the fast kernel needs multiples of 16, so the baseline must be chosen).
- Blocks: the prompt is fed in blocks of BLOCK (64) tokens, generated tokens one by one; a
  long prompt's logits rows equal, bit for bit, those of each of its prefixes (other block
  boundaries), and its rows and greedy steps match the numpy twin (builder.twins.reference).
- Threads at rest: with --logits blocked on a full FIFO the process has exactly T threads
  and all of them sleep (state S, no CPU time): the waits are futex waits, not spins.
- Under qemu-user: `-cpu Nehalem` (no AVX: an AVX instruction would end the run with SIGILL)
  and `-cpu Haswell`; the translated-code log (`-d in_asm`) shows which kernel ran: the fast
  one on Haswell for a multiple-of-8 shape, never on Nehalem, with --baseline or for odd
  shapes; each gives its kernel's native bits.
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

from builder.models.modelfile import Dims, write_model
from builder.models.modelfile4 import ModelFile4
from builder.models.program import write_dims
from builder.models.synth import synth_source, synth_vocab
from emu_tests.asm_facts import constant
from emu_tests.harness import I64, In, Out, load_elf
from emu_tests.harness.native import NativeRunner
from modelfiles import convert_fixture

F32 = np.float32
BASE, FAST = "matmul_f16", "matmul_f16_avx2"
# 50 tokens on the fixtures, 87 on ODD: one block (forward.asm BLOCK, 64) or one and a rest
PROMPT = "Hello world, the quick brown fox jumps over the lazy dog; then it runs home and sleeps."
BLOCK = constant("BLOCK")
# ~250 tokens on the fixtures, ~435 on ODD: several blocks and a rest
LONG_PROMPT = " ".join([PROMPT] * 5)
STEPS = 8
# fast path vs baseline logits (both fixtures, 50 prompt rows + 8 steps): measured <= 6.4e-6 on
# logits up to 5.5; 8x margin, still 200x below what a lost column or token moves (> 1e-2)
PATH_TOL = 5e-5
TIMEOUT = 120                                   # qemu-user runs are ~50x slower than native
ODD = Dims(vocab=600, dim=66, ffn=132, layers=2, heads=6, kv_heads=2, head_dim=22, max_ctx=512)


# --- the kernel ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu(gemma):
    return NativeRunner(load_elf(gemma.elf, gemma.symbols))


def same_bits(what: str, got: np.ndarray, want: np.ndarray) -> None:
    g, w = got.view(np.uint32).ravel(), want.view(np.uint32).ravel()
    assert g.size == w.size, f"{what}: {g.size} values, expected {w.size}"
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {w.size} values differ; first at index "
                           f"{bad[0]}: expected {want.ravel()[bad[0]]!r}, got "
                           f"{got.ravel()[bad[0]]!r}")


def call_fast(cpu, w: np.ndarray, x: np.ndarray, old: np.ndarray, accumulate: int,
              gap: int = 3, kernel: str = FAST) -> np.ndarray:
    """matmul_f16_avx2 (or `kernel`) on k = len(x) tokens into rows of d + gap floats (the
    gaps must keep their junk: ostride is honoured); returns the (k, d) results."""
    d, n = w.shape
    k = len(x)
    out = np.full((k, d + gap), np.float32(-7.25))
    out[:, :d] = old[:k]
    got = cpu.call(kernel, Out(out, "xout"), In(x, "x"), In(w, "W"), n, d, accumulate, k,
                   I64((d + gap) * 4)).outputs[0]
    assert np.all(got[:, d:] == np.float32(-7.25)), "the kernel wrote between output rows"
    return got[:, :d]


def kernel_case(d: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((d, n)) * 0.5).astype(np.float16)
    special = np.array([6e-8, -6e-8, 3e-5, -0.0, 0.0, 65504, -65504, 6.104e-5], np.float16)
    flat = w.reshape(-1)
    m = min(flat.size, 2 * special.size)
    flat[rng.choice(flat.size, m, replace=False)] = np.resize(special, m)
    x = rng.standard_normal((k, n)).astype(F32)
    x[:, rng.choice(n, max(1, n // 8), replace=False)] = 0.0    # zero products of both signs
    old = rng.standard_normal((k, d)).astype(F32)
    return w, x, old


@pytest.mark.parametrize("d,n,k,accumulate", [
    (1, 16, 1, 0), (1, 16, 4, 1), (2, 32, 2, 0), (3, 48, 3, 1), (5, 144, 4, 1), (7, 16, 4, 0),
    (33, 144, 1, 1), (6, 2048, 3, 0), (64, 2048, 4, 1), (4, 16384, 2, 0), (4, 64, 3, 1),
    (2, 16384, 3, 1),
])
def test_fast_kernel_against_float64(cpu, d, n, k, accumulate):
    """Each result is within the float32 error bound of its exact value: two chains of n/16
    fused multiply-adds per lane, their sum, 3 levels of lane additions and the + xout, each
    rounding once, give |error| <= (n/16 + 5) u (sum |w x| + |xout|), u = 2^-24 (first-order
    bound; the special halves include the largest, 65504, so the sums are not small)."""
    w, x, old = kernel_case(d, n, k, d * 10007 + n * 13 + k)
    got = call_fast(cpu, w, x, old, accumulate).astype(np.float64)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    exact = x64 @ w64.T + (old if accumulate else 0)
    bound = (n / 16 + 5) * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T + (np.abs(old) if accumulate
                                                                      else 0))
    err = np.abs(got - exact)
    assert np.all(err <= bound), (f"{FAST} d={d} n={n} k={k}: error {err.max():.3g} above "
                                  f"the bound at {np.unravel_index(np.argmax(err - bound), err.shape)}")


@pytest.mark.parametrize("d,n", [(1, 16), (5, 32), (6, 48), (9, 144), (12, 64), (16, 2048)])
def test_fast_kernel_bits_do_not_depend_on_k_or_rows(cpu, d, n):
    """A (row, token) result is the same bits whatever the other tokens of the call (k = 1..4)
    and whatever rows share the call (a split changes where a thread's rows begin):
    what makes prompt blocks and thread counts agree bit for bit. k = 1 covers each decode
    pass: four rows at once (d = 12, 16), one (d = 1, 5, 6, 9); k = 3 the prompt tiles of two
    rows (d even), one row (d odd)."""
    w, x, old = kernel_case(d, n, 4, d + n)
    want = np.stack([call_fast(cpu, w, x[t:t + 1], old[t:t + 1], 1)[0] for t in range(4)])
    for k in (2, 3, 4):
        same_bits(f"{FAST} d={d} n={n}: k={k} vs k=1", call_fast(cpu, w, x[:k], old, 1),
                  want[:k])
    for cut in sorted({1, d // 2, d - 1} - {0, d}):
        parts = np.hstack([call_fast(cpu, w[:cut], x, old[:, :cut], 1),
                           call_fast(cpu, w[cut:], x, old[:, cut:], 1)])
        same_bits(f"{FAST} d={d} n={n}: rows split at {cut}", parts, want)


def test_fast_kernel_near_baseline(cpu):
    """The two kernels differ only in rounding (one rounding per fused multiply-add against
    two): on Gemma-2B's n = 2048 the largest difference stays within the float32 bound above."""
    d, n = 64, 2048
    w, x, old = kernel_case(d, n, 1, 5)
    fast = call_fast(cpu, w, x, old, 0)[0].astype(np.float64)
    base = cpu.call(BASE, Out(old[0].copy(), "xout"), In(x[0], "x"), In(w, "W"), n, d,
                    0).outputs[0].astype(np.float64)
    scale = np.abs(w.astype(np.float64)) @ np.abs(x[0].astype(np.float64))
    assert np.all(np.abs(fast - base) <= 2 * (n / 8 + 4) * 2.0**-24 * scale)
    assert np.any(fast != base), "bit-identical: is the fast kernel still the fused one?"


# --- the engine ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("speed_models")
    found = {name: convert_fixture(name, "hf", out) for name in ("tiny_mqa", "tiny_wide")}
    odd = out / "odd.bin"
    write_dims(odd, ODD, synth_vocab(ODD.vocab, 0), synth_source(0), False)
    write_model(out / "odd.v2.bin", ODD, synth_vocab(ODD.vocab, 0), synth_source(0), False)  # the twin's
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
    return ModelFile4(model).header.vocab


def close_run(what: str, got: tuple[bytes, bytes], want: tuple[bytes, bytes], vocab: int):
    """Same printed text; logits within PATH_TOL, and not all the same bits."""
    assert got[0] == want[0], f"{what}: printed {got[0]!r}, expected {want[0]!r}"
    g = np.frombuffer(got[1], F32).reshape(-1, vocab)
    w = np.frombuffer(want[1], F32).reshape(-1, vocab)
    assert g.shape == w.shape, f"{what}: {g.shape[0]} logits rows, expected {w.shape[0]}"
    err = np.abs(g - w).max()
    assert err <= PATH_TOL, f"{what}: logits differ by {err:.3g} (PATH_TOL {PATH_TOL})"
    assert err > 0, f"{what}: the same bits: did the fast kernel run?"


@pytest.mark.parametrize("name", ["tiny_mqa", "tiny_wide", "odd"])
def test_paths_and_thread_counts_agree_natively(gemma, models, tmp_path, name):
    """Every thread count gives its path's bits, and the AVX2 path (--avx2) the AVX-512 one's
    (where the CPU has AVX-512F: the default path); the fast path is within PATH_TOL of the
    baseline. On odd (dim 66, not a multiple of 16) the fast kernel must not be chosen, so every
    run gives the baseline's bits."""
    model, vocab = models[name], vocab_of(models[name])
    base = run([], gemma.binary, model, ["--baseline", "-t", "1"], tmp_path / "base.f32")
    fast = run([], gemma.binary, model, ["-t", "1"], tmp_path / "fast.f32")
    # 12 threads on the odd model: ceil(66 / 12) = 6 rows each, the 12th thread gets none;
    # 20 threads: the attention's (token, head) tasks go to the first 16 (att_share) only
    # --avx2: the AVX2 kernels where the default is the AVX-512 ones, which promise their bits
    runs = {"--baseline -t 2": base, "--baseline -t 3": base, "-t 2": fast, "-t 3": fast,
            "-t 12": fast, "-t 20": fast, "--baseline -t 20": base, "": fast,
            "--avx2 -t 1": fast, "--avx2 -t 2": fast, "--avx2 --baseline": base}
    for flags, want in runs.items():
        got = run([], gemma.binary, model, flags.split(), tmp_path / "got.f32")
        same_run(f"{name} {flags or '(default)'} vs {'--baseline ' * (want is base)}-t 1",
                 got, want, vocab)
    if name == "odd":
        same_run("odd: fast path vs baseline", fast, base, vocab)
    else:
        close_run(f"{name}: fast path vs baseline", fast, base, vocab)


def engine_ids(binary: Path, model: Path, text: str) -> list[int]:
    r = subprocess.run([str(binary), "-m", str(model), "-p", text, "--tokens"],
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


@pytest.mark.parametrize("name", ["tiny_mqa", "tiny_wide", "odd"])
def test_prompt_blocks_do_not_change_any_logit(gemma, models, tmp_path, name):
    """Position p's logits are the same bits whether p sits in a full block, a partial one or
    at a block's start: every prefix of the long prompt ending at a word (when its ids are a
    prefix of the whole prompt's) gives the first rows of the whole prompt's run."""
    model, vocab = models[name], vocab_of(models[name])
    ids = engine_ids(gemma.binary, model, LONG_PROMPT)
    assert len(ids) > 3 * BLOCK, f"{name}: {len(ids)} prompt ids, want several blocks"
    whole = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "whole.f32",
                              LONG_PROMPT, 0)[1], F32).reshape(-1, vocab)
    lengths = set()
    for cut in (i for i, c in enumerate(LONG_PROMPT) if c == " "):
        part = engine_ids(gemma.binary, model, LONG_PROMPT[:cut])
        if part != ids[:len(part)]:
            continue                      # the cut splits a token: not a prefix in ids
        rows = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "part.f32",
                                 LONG_PROMPT[:cut], 0)[1], F32).reshape(-1, vocab)
        assert len(rows) == len(part)
        for p in range(len(part)):
            same_bits(f"{name}: prompt of {len(part)} ids, position {p}", rows[p], whole[p])
        lengths.add(len(part))
    # prefixes ending inside the first block, on a block boundary +- 1 and in later blocks
    assert len(lengths) >= 8 and max(lengths) > 2 * BLOCK, sorted(lengths)


def test_long_prompt_against_twin(gemma, models, tmp_path):
    """ODD's long prompt (several full blocks and a rest) and greedy steps against the numpy
    twin, with test_engine_logits' TWIN_TOL and its near-tie rule for the greedy tokens."""
    from emu_tests.engine.test_engine_logits import TWIN_TOL, check_rows
    from builder.models.modelfile import ModelFile
    from builder.twins.reference import Reference
    model = models["odd"]
    ids = engine_ids(gemma.binary, model, LONG_PROMPT)
    prompt_ref, step_ref, greedy = Reference(ModelFile(model.with_suffix(".v2.bin"))).generate(ids, STEPS)
    rows = np.frombuffer(run([], gemma.binary, model, [], tmp_path / "l.f32", LONG_PROMPT)[1],
                         F32).reshape(-1, ODD.vocab)
    assert len(ids) > 3 * BLOCK, len(ids)
    check_rows(f"odd, {len(ids)}-id prompt", rows, ids, prompt_ref, step_ref, greedy, TWIN_TOL)


def executed(log: Path, symbols: dict, name: str) -> bool:
    """Whether qemu's -d in_asm log translated an instruction inside symbol `name`."""
    lo = symbols[name]["address"]
    hi = lo + symbols[name]["size"]
    return any(lo <= int(a, 16) < hi
               for a in re.findall(r"^0x([0-9a-f]+):", log.read_text(), re.M))


@pytest.mark.slow  # qemu-user: about 50x slower than native
@pytest.mark.parametrize("name,cpu_model,flags,kernel", [
    ("tiny_wide", "Nehalem", [], BASE), ("odd", "Nehalem", ["-t", "2"], BASE),
    ("odd", "Nehalem", ["-t", "3"], BASE), ("tiny_wide", "Haswell", [], FAST),
    ("tiny_wide", "Haswell", ["-t", "3"], FAST), ("tiny_wide", "Haswell", ["--baseline"], BASE),
    ("odd", "Haswell", [], BASE),
])
def test_qemu_cpu_models_choose_and_agree(gemma, models, tmp_path, name, cpu_model, flags,
                                          kernel):
    """The kernel qemu ran is the one the CPU model and the shape call for (odd's dim 66 keeps
    the baseline even on Haswell), and it gives the same bits as that kernel natively."""
    # BASE runs on every path (the embedding lookup, n = 1, calls it): only FAST is checked
    qemu_runs_kernel(gemma, models[name], tmp_path, cpu_model, flags, kernel, FAST, name)


def qemu_runs_kernel(gemma, model: Path, tmp_path: Path, cpu_model: str, flags: list[str],
                     kernel: str, fast: str, label: str) -> None:
    """Under qemu-x86_64 -cpu CPU_MODEL, `kernel` ran (and `fast` did not, unless it is the
    kernel), and the run's output and logits equal that kernel's native run (-t 1; --baseline
    unless the kernel is `fast`)."""
    native = ["-t", "1"] if kernel == fast else ["--baseline", "-t", "1"]
    want = run([], gemma.binary, model, native, tmp_path / "want.f32")
    log = tmp_path / "in_asm.log"
    got = run(["qemu-x86_64", "-cpu", cpu_model, "-d", "in_asm", "-D", str(log)], gemma.binary,
              model, flags, tmp_path / "got.f32")
    what = f"{label}: qemu -cpu {cpu_model} {' '.join(flags) or '(default)'}"
    assert executed(log, gemma.symbols, kernel), f"{what}: {kernel} never ran"
    assert kernel == fast or not executed(log, gemma.symbols, fast), f"{what}: {fast} ran"
    same_run(f"{what} vs native {' '.join(native)}", got, want, vocab_of(model))


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
