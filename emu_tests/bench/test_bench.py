"""`python -m builder bench`, its machinery only (never a timed assertion): on the tiny preset
it makes and caches the model pair, runs the real engine (and llama.cpp when installed), and
prints a table whose rows, cells and derived figures are checked against the JSON it writes
and against an independent count of the tiny model's bytes; the parts (FIFO row stamping,
the verified bandwidth loop, llama-bench parsing, one-line errors) are checked on their own.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import io
import json
import math
import mmap
import os
import re
import shlex
import struct
import threading
from dataclasses import asdict
from pathlib import Path

import capstone
import numpy as np
import pytest

from builder.bench import (level as bench_level, llama as bench_llama, machine as bench_machine, main as bench,
                           report as bench_report, startup as bench_startup)
from builder.bench.run import run
from builder.models.gguf_meta import read_gguf_meta
from builder.models import modelfile3
from builder.models.modelfile import dequantize_q8_0
from builder.models.modelfile4 import ModelFile4
from builder.models.synth import PRESETS
from emu_tests.asm_facts import constant

# prompts long enough that the tiny model's prompt outlasts the packed program's start-up
# jitter on a busy machine (the prompt's time is the -n 0 run's minus the --tokens run's)
SHORT, PROMPT, N = 96, 192, 6
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
# the level the engine runs here with neither --baseline nor --avx2, and its FMA peak's vectors
LEVEL = bench_level.kernel_level([], bench_machine.cpu_flags())
FMA = bench_level.FMA_VECTORS[bench_level.fma_level(LEVEL)]
ROWS = ["threads", "memory read bandwidth GB/s", "(before each round / after)", "(fastest read loop)",
        "gemma prompt tokens/s", "gemma decode tokens/s", "gemma decode efficiency",
        "gemma decode kernel in cache GB/s", "gemma decode / kernel in cache", "gemma prompt / decode",
        f"gemma prompt / FMA peak ({FMA})", "gemma prompt kernel in cache GFLOP/s",
        "gemma prompt / kernel in cache", "gemma peak RSS MB",
        "gemma peak anonymous MB", "tokens: prompt, decoded", "gemma major page faults"]
STARTUP_ROWS = ["start-up ms", "start-up -h", "start-up one token (tiny)"]
STARTUP_RUNS = {bench_startup.HELP: 6, bench_startup.ONE_TOKEN: 4}  # the tests' counts (speed is not tested)
LLAMA_ROWS = ["llama.cpp prompt tokens/s", "llama.cpp decode tokens/s",
              "llama.cpp decode efficiency", "llama.cpp peak RSS MB", "llama.cpp major page faults",
              "prompt ratio gemma/llama.cpp", "decode ratio gemma/llama.cpp"]


def tiny_bytes() -> int:
    """The tiny preset's weight bytes, counted from its dimensions (not from the file layout):
    the embedding (the logits' matrix too), the final norm, and per layer the FP16 matrices, two
    float32 norms and hd/2 float32 rope frequencies (the window is a field of the ATTN op)."""
    d = PRESETS["tiny"].dims
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    layer = 2 * (q * d.dim + 2 * kv * d.dim + d.dim * q + 3 * d.ffn * d.dim) + 4 * 2 * d.dim + 4 * (d.head_dim // 2)
    return 2 * d.vocab * d.dim + d.layers * layer + 4 * d.dim


@pytest.fixture(scope="module")
def report(gemma, tmp_path_factory):
    """Runs the bench once on the tiny preset: (tmp dir, thread counts, stdout, JSON)."""
    tmp = tmp_path_factory.mktemp("bench")
    threads = [1, 2] if len(os.sched_getaffinity(0)) >= 2 else [1]
    argv = ["--preset", "tiny", "--cache", str(tmp / "cache"), "--engine", str(gemma.binary),
            "--bw-size", "32M", "--repeat", "2", "-t", ",".join(map(str, threads)), "-p", str(PROMPT),
            "-n", str(N), "--json", str(tmp / "out.json"), "--engine-args", "-s 7"]
    if HAVE_MATPLOTLIB:
        argv += ["--plot", str(tmp / "plot.png")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_startup, "RUNS", STARTUP_RUNS)
        rc = bench.main(argv)
    assert rc == 0, f"bench failed (rc {rc}); stdout: {out.getvalue()}"
    return tmp, threads, out.getvalue(), json.loads((tmp / "out.json").read_text())


@pytest.fixture(autouse=True)
def few_startup_runs(monkeypatch):
    """Every bench run times start-up; the tests' runs take few of them."""
    monkeypatch.setattr(bench_startup, "RUNS", STARTUP_RUNS)


def parse_table(text: str) -> dict[str, list[str]]:
    """Table rows: label -> cells (columns are separated by two or more spaces)."""
    rows = {}
    for line in text.splitlines():
        parts = re.split(r" {2,}", line.strip())
        if len(parts) > 1 and not line.startswith(("machine:", "engine:", "model:", "bytes", "prompt FLOPs",
                                                    "load average", "page cache", "llama.cpp on ")):
            rows[parts[0]] = parts[1:]
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_table_has_every_row_and_a_column_per_thread_count(report, gemma):
    _, threads, text, res = report
    rows = parse_table(text)
    llama = bool(res["peers"])
    want = ROWS + (LLAMA_ROWS if llama else []) + STARTUP_ROWS
    assert list(rows) == want, f"rows differ: expected {want}, got {list(rows)}"
    for label, cells in rows.items():
        if not label.startswith("start-up"):
            assert len(cells) == len(threads), f"row {label!r}: {len(cells)} cells for {threads}"
    assert [int(c) for c in rows["threads"]] == threads
    assert f"bytes read per generated token: {tiny_bytes():,}" in text
    engine, = res["engines"]
    assert f"page cache: {engine['huge_pages']:.1%} of the model file in 2 MB pages" in text
    assert 0 <= engine["huge_pages"] <= 1 and engine["label"] == "gemma"
    loops = {f"{8 * w}-bit x{k} buffer" for w in bench_machine.READ_WIDTHS for k in bench_machine.STREAMS}
    assert all(c in loops for c in rows["(fastest read loop)"]), rows["(fastest read loop)"]
    assert text.splitlines()[0].startswith("machine: ")
    assert text.splitlines()[1] == f"engine: {gemma.binary} -s 7"
    names = bench_level.KERNELS[LEVEL]
    assert text.splitlines()[2] == f"kernels: {bench_level.TITLE[LEVEL]} ({names['f16']}, {names['q8_0']})"
    assert (res["level"], res["fma_level"]) == (LEVEL, bench_level.fma_level(LEVEL))
    assert f"; FMA peak ({FMA}), measured, GFLOP/s: " in text
    if not llama:  # llama.cpp missing: omitted with a note, never an error
        assert "llama.cpp: not run" in text


def test_figures_are_positive_and_consistent(report):
    _, threads, text, res = report
    rows = parse_table(text)
    engine, = res["engines"]
    assert engine["bytes_per_token"] == tiny_bytes()
    assert sorted(map(int, res["bandwidth"])) == threads
    llama = res["peers"][0]["figures"] if res["peers"] else []
    if res["peers"]:  # the F16 twin holds the same tensors but each layer's rope
        d = PRESETS["tiny"].dims
        assert res["peers"][0]["bytes_per_token"] == tiny_bytes() - d.layers * 4 * (d.head_dim // 2)
    for name, figures in (("gemma", engine["figures"]), ("llama.cpp", llama)):
        for i, f in enumerate(figures):
            t = f["threads"]
            bw = res["bandwidth"][str(t)]
            assert bw == max(res["bandwidth_runs"][str(t)]) > 0
            assert len(res["bandwidth_runs"][str(t)]) == 3  # before each of 2 rounds, after
            assert f["prompt_tps"] > 0 and f["decode_tps"] > 0, f"{name} t={t}: {f}"
            assert f["n_prompt"] == engine["figures"][0]["n_prompt"], f"{name}: other prompt length"
            per_token = engine["bytes_per_token"] if name == "gemma" else res["peers"][0]["bytes_per_token"]
            eff = f["decode_tps"] * per_token / (bw * 1e9)
            cell = rows[f"{name} decode efficiency"][i]
            # the table rounds to 3 decimals; above 1 the bandwidth was no ceiling: a fault
            if eff > 1:
                assert cell == "FAULT" and f"MEASUREMENT FAULT: {name} on {t} thread(s)" in text
            else:
                assert math.isclose(number(cell), eff, abs_tol=6e-4), f"{name} t={t}"
    for i, f in enumerate(engine["figures"]):
        # a prompt of at most PROMPT tokens; -n N yields N - 1 or N forward passes
        assert 2 <= f["n_prompt"] <= PROMPT and N - 1 <= f["n_decode"] <= N, f
        assert rows["tokens: prompt, decoded"][i] == f"{f['n_prompt']}, {f['n_decode']}"
        assert math.isclose(number(rows["gemma decode tokens/s"][i]), f["decode_tps"],
                            abs_tol=6e-3)
        assert f["peak_anon"] <= f["peak_rss"] or f["peak_rss"] == 0
        # the fraction of the FMA peak measured in the same run on as many threads
        peak = res["fma_peak"][str(f["threads"])] * 1e9
        assert math.isclose(number(rows[f"gemma prompt / FMA peak ({FMA})"][i]),
                            f["prompt_tps"] * engine["flops_per_prompt_token"] / peak, abs_tol=6e-4)
        # the decode kernel's speed with its weights in cache, measured each round (this
        # machine has AVX2, FMA and F16C, so never "n/a" here: CI runs the fast kernels too)
        kernel = engine["kernel"][str(f["threads"])]
        assert engine["wtype"] == "f16" and kernel > 0
        assert math.isclose(number(rows["gemma decode kernel in cache GB/s"][i]), kernel, abs_tol=6e-3)
        assert math.isclose(number(rows["gemma decode / kernel in cache"][i]),
                            f["decode_tps"] * engine["bytes_per_token"] / (kernel * 1e9), abs_tol=6e-4)
        # and its prompt calls', in GFLOP/s, against which the prompt's FLOPs are set
        prompt = engine["prompt_kernel"][str(f["threads"])]
        assert prompt > 0
        assert math.isclose(number(rows["gemma prompt kernel in cache GFLOP/s"][i]), prompt, abs_tol=6e-3)
        assert math.isclose(number(rows["gemma prompt / kernel in cache"][i]),
                            f["prompt_tps"] * engine["flops_per_prompt_token"] / (prompt * 1e9), abs_tol=6e-4)
    for i, (g, ll) in enumerate(zip(engine["figures"], llama)):
        assert math.isclose(number(rows["decode ratio gemma/llama.cpp"][i]),
                            g["decode_tps"] / ll["decode_tps"], abs_tol=6e-4)


def check_startup(text: str, startup: dict, engine, who: str = "") -> None:
    """The start-up block (`who`: " B" for --compare's): the packed program against its image
    beside it, a row per command line whose cells are the JSON's figures (packed, image, their
    difference ± its error, runs), each median one of the runs' wall times."""
    assert (startup["packed"], startup["image"], startup["missing"]) == (str(engine), f"{engine}.elf", "")
    assert f"start-up{who}: {engine} against its image {engine}.elf, run alternately; median wall times" in text
    rows = parse_table(text)
    assert rows[f"start-up{who} ms"] == ["packed", "image", "packed - image", "runs"]
    assert [r["what"] for r in startup["rows"]] == list(STARTUP_RUNS)
    for r in startup["rows"]:
        cells = rows[f"start-up{who} {r['what']}"]
        assert r["runs"] == STARTUP_RUNS[r["what"]] and cells[3] == str(r["runs"])
        assert r["packed_ms"] > 0 and r["image_ms"] > 0 and r["error_ms"] >= 0
        assert math.isclose(r["cost_ms"], r["packed_ms"] - r["image_ms"])
        assert [number(c) for c in cells[:2]] == [round(r["packed_ms"], 2), round(r["image_ms"], 2)]
        cost, error = cells[2].split(" ± ")
        assert (number(cost), number(error)) == (round(r["cost_ms"], 2), round(r["error_ms"], 2))
    help_run, token_run = startup["rows"]
    assert help_run["argv"] == "-h"
    assert token_run["argv"].endswith("tiny-seed0.bin -p Hello -n 1 --temp 0 -s 7") \
        and "-t" not in token_run["argv"].split()  # the engine's default threads, as users run it


def test_startup_block_is_in_every_run(report, gemma):
    _, _, text, res = report
    check_startup(text, res["startup"], gemma.binary)


def test_startup_only(gemma, tmp_path):
    """--startup-only: the machine, engine and load lines and the start-up block, nothing else;
    its JSON holds those."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--startup-only", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--engine-args", "-s 7", "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    assert sorted(res) == ["engine", "load", "machine", "startup"] and res["engine"] == f"{gemma.binary} -s 7"
    lines = text.splitlines()
    assert lines[0].startswith("machine: ")
    assert lines[1] == f"engine: {gemma.binary} -s 7" and lines[2].startswith("load average (1 min)")
    assert list(parse_table(text)) == STARTUP_ROWS and len(lines) == 7
    check_startup(text, res["startup"], gemma.binary)


def test_startup_only_with_compare(gemma, tmp_path):
    """--startup-only --compare B: B (here a copy of the engine and of its image) timed in the
    same rounds: B's line, B's block as the engine's, and per command line the ratio of the two
    costs, engine / B, as in the JSON."""
    other = tmp_path / "b" / "gemma"
    other.parent.mkdir()
    for src, dst in ((gemma.binary, other), (gemma.elf, Path(f"{other}.elf"))):
        dst.write_bytes(src.read_bytes())
        dst.chmod(0o755)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--startup-only", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--engine-args", "-s 7", "--compare", str(other), "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    assert sorted(res) == ["engine", "load", "machine", "startup", "startup_b"]
    assert text.splitlines()[2] == f"B: {other} (--compare)"
    check_startup(text, res["startup"], gemma.binary)
    check_startup(text, res["startup_b"], other, " B")
    rows = parse_table(text)
    for a, b in zip(res["startup"]["rows"], res["startup_b"]["rows"]):
        cell, = rows[f"start-up cost gemma/B {a['what']}"]
        if b["cost_ms"] <= 0:
            assert cell == "n/a"
        else:
            assert number(cell) == pytest.approx(a["cost_ms"] / b["cost_ms"], abs=6e-4)


def test_startup_without_an_image_is_na(gemma, tmp_path):
    """An engine with no image beside it: the start-up rows say n/a, with the reason."""
    alone = tmp_path / "bin" / "gemma"
    alone.parent.mkdir()
    alone.write_bytes(gemma.binary.read_bytes())
    alone.chmod(0o755)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--startup-only", "--cache", str(tmp_path), "--engine", str(alone),
                         "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    why = f"no image {alone}.elf beside the engine (a build writes one)"
    assert f"\nstart-up: n/a: {why}\n" in text
    rows = parse_table(text)
    assert rows["start-up -h"] == rows["start-up one token (tiny)"] == ["n/a"] * 4
    startup = json.loads((tmp_path / "out.json").read_text())["startup"]
    assert (startup["image"], startup["missing"]) == ("", why)
    assert all(r["packed_ms"] is None and r["cost_ms"] is None and r["runs"] == 0 for r in startup["rows"])
    assert not list(tmp_path.glob("*.bin")), "the tiny model was made for nothing"


def test_compare_image(gemma, tmp_path):
    """--compare-image: the image beside the packed engine is timed too, alternately; each one's
    rounds and best figures, and the packed/image ratios, as in the JSON. The engine's own
    figures stay the packed program's."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--compare-image", "--no-llama", "--bw-size", "16M", "-t", "1", "-r", "2",
                         "-p", str(PROMPT), "-n", str(N), "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["image"] == str(gemma.elf) and res["engine"] == str(gemma.binary)
    assert f"image: {gemma.elf} (--compare-image: timed too, alternately with the engine)" in text
    engine, = res["engines"]
    rows = parse_table(text)
    for key, label in (("rounds", "gemma"), ("image_rounds", "gemma image")):
        rounds, = engine[key]  # one thread count
        assert len(rounds) == 2 and all(f["threads"] == 1 and f["n_prompt"] <= PROMPT for f in rounds)
        best = engine["figures" if key == "rounds" else "image"][0]
        for what in ("prompt", "decode"):
            assert best[f"{what}_tps"] == max(f[f"{what}_tps"] for f in rounds)
            assert rows[f"{label} {what} tokens/s, each round"] == \
                [" / ".join(f"{f[f'{what}_tps']:,.1f}" for f in rounds)]
            assert math.isclose(number(rows[f"{label} {what} tokens/s"][0]), best[f"{what}_tps"], abs_tol=6e-3)
    for what in ("prompt", "decode"):
        assert math.isclose(number(rows[f"{what} ratio gemma/gemma image"][0]),
                            engine["figures"][0][f"{what}_tps"] / engine["image"][0][f"{what}_tps"], abs_tol=6e-4)


def test_compare_engine(gemma, tmp_path):
    """--compare ENGINE2 (an A/B run): a second engine binary timed alternately with the engine
    on the same model and prompt, labelled B: each one's rounds and best figures, the ratios of
    the best and of each round, as in the JSON. Here B is a copy of the same engine."""
    other = tmp_path / "gemma-b"
    other.write_bytes(gemma.binary.read_bytes())
    other.chmod(0o755)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--compare", str(other), "--no-llama", "--bw-size", "16M", "-t", "1", "-r", "2",
                         "-p", str(PROMPT), "-n", str(N), "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    assert (res["image"], res["image_label"], res["engine"]) == (str(other), "B", str(gemma.binary))
    assert f"B: {other} (--compare: timed too, alternately with the engine)" in text
    assert "(--compare-image" not in text
    engine, = res["engines"]
    rows = parse_table(text)
    mine, theirs = engine["rounds"][0], engine["image_rounds"][0]  # one thread count
    assert len(mine) == len(theirs) == 2
    for what in ("prompt", "decode"):
        assert rows[f"gemma B {what} tokens/s, each round"] == \
            [" / ".join(f"{f[f'{what}_tps']:,.1f}" for f in theirs)]
        assert math.isclose(number(rows[f"{what} ratio gemma/gemma B"][0]),
                            engine["figures"][0][f"{what}_tps"] / engine["image"][0][f"{what}_tps"], abs_tol=6e-4)
        each = [number(c) for c in rows[f"{what} ratio gemma/gemma B, each round"][0].split(" / ")]
        assert each == pytest.approx([a[f"{what}_tps"] / b[f"{what}_tps"] for a, b in zip(mine, theirs)],
                                     abs=6e-4)


def test_compare_format_gives_b_its_own_file(gemma, tmp_path):
    """--compare-format 2: B (an engine that reads version 2 files, played by a bash script that
    notes the file it is given and runs the engine on the version 4 file beside it) gets its own
    file, the tiny preset written in version 2 from the same seed (synth's bytes) and cached
    beside the pair; the engine keeps the version 4 file; the report names B's file and gives
    the median of each round's ratios, as in the JSON."""
    from builder.models.synth import synth
    seen = tmp_path / "seen"
    other = tmp_path / "gemma-v2"
    other.write_text(f"""#!/bin/bash
args=("$@")
for i in "${{!args[@]}}"; do
  if [ "${{args[i]}}" = -m ]; then m=${{args[i+1]}}; args[i+1]=${{m%-v2.bin}}.bin; fi
done
echo "$m" >> {shlex.quote(str(seen))}
exec {shlex.quote(str(gemma.binary))} "${{args[@]}}"
""")
    other.chmod(0o755)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path / "cache"), "--engine", str(gemma.binary),
                         "--compare", str(other), "--compare-format", "2", "--no-llama", "--bw-size", "16M",
                         "-t", "1", "-r", "3", "-p", str(PROMPT), "-n", str(N), "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    mine = tmp_path / "cache" / "tiny-seed0-v2.bin"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["tiny-seed0-v2.bin", "tiny-seed0.bin",
                                                                      "tiny-seed0.gguf"]
    synth("tiny", tmp_path / "same.bin", seed=0, progress=False, version=2)
    assert mine.read_bytes() == (tmp_path / "same.bin").read_bytes()
    assert set(seen.read_text().split()) == {str(mine)}  # B ran on its own file alone
    engine, = json.loads((tmp_path / "out.json").read_text())["engines"]
    assert (engine["model"], engine["image_model"]) == (str(tmp_path / "cache" / "tiny-seed0.bin"), str(mine))
    assert f"B's model: {mine} (--compare-format: its own, from the same source)" in text
    rows = parse_table(text)
    for what in ("prompt", "decode"):
        each = [a[f"{what}_tps"] / b[f"{what}_tps"] for a, b in zip(engine["rounds"][0], engine["image_rounds"][0])]
        assert len(each) == 3 and number(rows[f"{what} ratio gemma/gemma B, median of the rounds"][0]) == \
            pytest.approx(sorted(each)[1], abs=6e-4)


def test_prompt_lengths_sweep(gemma, tmp_path):
    """-p 96,192: each engine's rows at each length (labels gemma@96, gemma@192), the ratios of
    the second length to the first, and llama.cpp (when installed) at each length compared
    with the engine at the same length; every figure as in the JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--bw-size", "16M", "-t", "1", "-p", f"{SHORT},{PROMPT}", "-n", str(N),
                         "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    rows = parse_table(text)
    short, long = res["engines"]
    assert [(e["label"], e["prompt_tokens"]) for e in (short, long)] == [(f"gemma@{SHORT}", SHORT), (f"gemma@{PROMPT}", PROMPT)]
    assert short["model"] == long["model"] and text.count("model: ") == 1  # one model file, once
    for e in (short, long):
        f, = e["figures"]
        assert 2 <= f["n_prompt"] <= e["prompt_tokens"] and rows[f"tokens: prompt, decoded ({e['label']})"] == \
            [f"{f['n_prompt']}, {f['n_decode']}"]
        assert math.isclose(number(rows[f"{e['label']} prompt tokens/s"][0]), f["prompt_tps"], abs_tol=6e-3)
    assert short["figures"][0]["n_prompt"] < long["figures"][0]["n_prompt"]
    for what in ("prompt", "decode"):
        assert math.isclose(number(rows[f"{what} ratio gemma@{PROMPT}/gemma@{SHORT}"][0]),
                            long["figures"][0][f"{what}_tps"] / short["figures"][0][f"{what}_tps"], abs_tol=6e-4)
    ratios = [r for r in rows if " ratio " in r]
    if res["peers"]:
        assert [(p["prompt_tokens"], p["engines"]) for p in res["peers"]] == [(SHORT, [0]), (PROMPT, [1])]
        for p, e in zip(res["peers"], (short, long)):
            assert p["figures"][0]["n_prompt"] == e["figures"][0]["n_prompt"]  # the same prompt ids
            label = f"llama.cpp@{p['prompt_tokens']}"
            assert math.isclose(number(rows[f"decode ratio {e['label']}/{label}"][0]),
                                e["figures"][0]["decode_tps"] / p["figures"][0]["decode_tps"], abs_tol=6e-4)
        assert len(ratios) == 6
    else:
        assert len(ratios) == 2


def test_a_gguf_shared_by_two_model_files_is_one_peer(gemma, tmp_path):
    """lineup: a GGUF listed for two model files (as --real lists its Q4_K_M file for FP16 and
    Q8_0) is one peer per prompt length, compared with the engine on each file."""
    cfg = bench.Config(preset="tiny", cache=tmp_path, prompt_tokens=[SHORT, PROMPT])
    m16, (g16,) = bench.model_paths(cfg)
    m8, (g8,) = bench.model_paths(cfg, "q8_0")
    engines, jobs, peers, peer_jobs = bench.lineup(cfg, gemma.binary, [(m16, [g16]), (m8, [g8, g16])], True)
    assert [e.label for e in engines] == [f"gemma[f16]@{SHORT}", f"gemma[f16]@{PROMPT}", f"gemma[q8_0]@{SHORT}",
                                          f"gemma[q8_0]@{PROMPT}"]
    assert [j.path for j in jobs] == [m16, m16, m8, m8] and jobs[0].ids == jobs[2].ids != jobs[1].ids
    assert [(p.name, p.prompt_tokens, p.engines) for p in peers] == [
        (g16.name, SHORT, [0, 2]), (g16.name, PROMPT, [1, 3]), (g8.name, SHORT, [2]), (g8.name, PROMPT, [3])]
    assert [j.ids for j in peer_jobs] == [jobs[0].ids, jobs[1].ids] * 2
    assert bench.lineup(cfg, gemma.binary, [(m16, [g16])], False)[2:] == ([], [])  # no llama.cpp: no peers


def test_real_gives_the_q4_k_m_file_to_every_type(monkeypatch, tmp_path):
    """--real: llama.cpp runs the Q4_K_M file beside the twin for Q8_0 too, not only FP16."""
    from builder import demo
    monkeypatch.setattr(demo, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(demo, "real_model", lambda cache, wtype, version: cache / f"model-{wtype}-v{version}.bin")
    for wtype in ("f16", "q8_0"):
        (tmp_path / f"{demo.REAL_NAME}-{wtype}.gguf").write_bytes(b"")  # the twin, made already
        assert bench.real_model_paths(wtype) == (tmp_path / f"model-{wtype}-v4.bin",
                                                 [tmp_path / f"{demo.REAL_NAME}-{wtype}.gguf",
                                                  tmp_path / demo.GGUF_NAME])
        assert bench.real_model_paths(wtype, 2) == (tmp_path / f"model-{wtype}-v2.bin", [])  # B's: no peers


def test_model_pair_is_cached(report):
    tmp, *_ = report
    cache = tmp / "cache"
    files = sorted(p.name for p in cache.iterdir())
    assert files == ["tiny-seed0.bin", "tiny-seed0.gguf"], f"cache holds {files}"
    stamp = [(cache / f).stat().st_mtime_ns for f in files]
    cfg = bench.Config(preset="tiny", cache=cache)
    assert bench.model_paths(cfg) == (cache / files[0], [cache / files[1]])
    assert [(cache / f).stat().st_mtime_ns for f in files] == stamp, "the model was made again"


@pytest.mark.parametrize("why", ["damaged", "version 2"])
def test_a_cached_model_the_engine_refuses_is_made_again(tmp_path, capsys, why):
    """A cached model file the engine would refuse (another version, by its version field, or
    damaged) is made again as version 4, which one line on stderr says."""
    from builder.models.synth import synth
    model = tmp_path / "tiny-seed3.bin"
    (tmp_path / "tiny-seed3.gguf").write_bytes(b"GGUF" + bytes(300))
    if why == "damaged":
        model.write_bytes(b"GEMMAASM" + struct.pack("<I", 4) + bytes(300))
        reason = f"{model}: header_size is 0, expected 256"  # version 4, the rest of the header zeros
    else:
        synth("tiny", model, seed=3, progress=False, version=2)
        reason = f"{model}: not a version 4 model file (version 2)"
    got, (gguf,) = bench.model_paths(bench.Config(preset="tiny", seed=3, cache=tmp_path))
    assert got == model and ModelFile4(model).header.vocab == PRESETS["tiny"].dims.vocab
    assert gguf.read_bytes()[:4] == b"GGUF" and gguf.stat().st_size > 304
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-seed3.bin", "tiny-seed3.gguf"]
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"bench: {reason}") and \
        err[0].endswith(f": making the tiny f16 model and its GGUF in {tmp_path} (again)"), err


def test_plot_is_drawn_or_refused_in_one_line(report, capsys, tmp_path):
    tmp, *_ = report
    if HAVE_MATPLOTLIB:
        assert (tmp / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert bench.main(["--plot", str(tmp_path / "p.png")]) == 1
        assert capsys.readouterr().err == ("python -m builder bench: error: --plot needs "
                                           "matplotlib: pip install matplotlib\n")


def test_fifo_rows_are_stamped_in_order(tmp_path):
    script = 'exec 3>"$0"; head -c 2500 /dev/zero >&3; sleep 0.05; head -c 1500 /dev/zero >&3'
    r = run(["sh", "-c", script, "{logits}"], row_bytes=1000)
    assert r.returncode == 0 and len(r.rows) == 4, r
    assert r.rows == sorted(r.rows) and r.rows[3] - r.rows[1] >= 0.04, r.rows
    # a child that never opens the FIFO must not leave the reader waiting
    r = run(["sh", "-c", "echo oops >&2; exit 3", "{logits}"], row_bytes=1000)
    assert (r.returncode, r.rows, r.error_line()) == (3, [], "oops")


@pytest.mark.parametrize("width", bench_machine.READ_WIDTHS)
@pytest.mark.parametrize("streams", bench_machine.STREAMS)
def test_bandwidth_loop_is_verified_and_reads_every_byte(width, streams):
    """Each read loop assembles to its source (checked against capstone) and touches exactly
    the bytes it is given: on a buffer with PROT_NONE right after a thread's slice, a loop
    reading past it would crash; its streams start a stride apart and are read to the end
    (the loads' addresses in the disassembly are the streams' bases plus 0.. step)."""
    code = bench_machine.assemble(bench_machine._source(width, streams), "bandwidth loop")
    assert code[-1] == 0xC3  # ret
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    loads = [i.op_str.split("[")[1] for i in md.disasm(code, 0) if "mov" in i.mnemonic and "[" in i.op_str]
    bases = {a.split(" + 0x")[0].rstrip("]") for a in loads}
    assert len(loads) == bench_machine.UNROLL and len(bases) == streams, loads
    loop = next(lp for lp in bench_machine.read_loops() if (lp.width, lp.streams) == (width, streams)) \
        if width == 16 or "avx2" in bench_machine.cpu_flags() else None
    if loop is None:
        pytest.skip("no AVX2")
    guard = mmap.mmap(-1, 3 * 4096)  # one page after 2 pages of data made unreadable
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(guard)) + 8192),
                                      4096, 0) == 0
    addr = ctypes.addressof(ctypes.c_char.from_buffer(guard))
    loop.fn(addr, 8192 // streams, 3)  # would fault past the end
    assert bench_machine.measure(loop, bench_machine.MappedFile(__file__), 1, passes=1, trials=1) >= 0


def test_bandwidth_is_the_best_loop_over_buffer_and_files(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(bytes(range(256)) * (16 << 12))  # 16 MB
    out = bench_machine.bandwidths([1, 2], 8 << 20, [f])
    loops = {f"{lp.name} {where}" for lp in bench_machine.read_loops() for where in ("buffer", "file")}
    assert set(out) == {1, 2} and all(gbs > 0 and loop in loops for gbs, loop in out.values()), out


@pytest.mark.parametrize("level, reg", [("avx2", "ymm"), ("avx512", "zmm")])
def test_fma_loop_is_verified_and_counts(level, reg):
    """Each level's loop assembles to exactly its FMA_CHAINS fused multiply-adds per
    iteration, in that level's registers (ymm: VEX, zmm: EVEX) and on registers only (keystone
    mis-encodes EVEX memory displacements), each instruction checked against capstone (a line
    spelled otherwise than capstone is refused). Where this CPU has the level, one thread's
    peak lies in a sane range (2 to 64 FLOPs per cycle at 0.5 to 6 GHz); where it lacks it,
    the loop is not run: no peak."""
    code = bench_machine.assemble(bench_machine._fma_source(level), "FMA loop")
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    insns = list(md.disasm(code, 0))
    fmas = [i for i in insns if i.mnemonic == "vfmadd231ps"]
    assert len(fmas) == bench_machine.FMA_CHAINS
    assert len({i.op_str.split(",")[0] for i in fmas}) == bench_machine.FMA_CHAINS  # independent chains
    vector = [i for i in insns if i.mnemonic != "vzeroupper" and i.op_str.startswith(("xmm", "ymm", "zmm"))]
    assert len(vector) == 2 * bench_machine.FMA_CHAINS + 2  # the zeroing, then the chains
    for i in vector:
        assert [op.type for op in i.operands] == [capstone.x86.X86_OP_REG] * 3, i.op_str
        assert all(i.reg_name(op.reg).startswith(reg) for op in i.operands), i.op_str
        assert (i.bytes[0] == 0x62) == (level == "avx512")  # EVEX prefix for zmm, VEX for ymm
    with pytest.raises(RuntimeError, match="keystone gave"):
        bench_machine.assemble([f"vfmadd231ps {reg}0,{reg}14,{reg}15"], "FMA loop")
    peaks = bench_machine.fma_peaks([1], level, iterations=5_000_000)
    if bench_level.NEEDS[level] <= bench_machine.cpu_flags():
        assert 1.0 <= peaks[1] <= 384.0, peaks
    else:
        assert peaks == {}


AVX2 = frozenset({"sse2", "sse4_1", "avx", "avx2", "fma", "f16c"})


@pytest.mark.parametrize("args, flags, level", [
    ([], AVX2 | {"avx512f", "avx512bw"}, "avx512"),
    (["-s", "7"], AVX2 | {"avx512f"}, "avx512"),
    (["--avx2"], AVX2 | {"avx512f"}, "avx2"),
    ([], AVX2, "avx2"),
    (["--avx2"], AVX2, "avx2"),
    ([], AVX2 - {"f16c"} | {"avx512f"}, "baseline"),
    ([], AVX2 - {"fma"}, "baseline"),
    ([], frozenset({"sse2", "avx512f"}), "baseline"),
    (["--baseline"], AVX2 | {"avx512f"}, "baseline"),
    (["--avx2", "--baseline"], AVX2 | {"avx512f"}, "baseline"),
])
def test_kernel_level_follows_the_engines_choice(args, flags, level):
    """kernel_level: cpu.asm's choice from the engine's arguments and the CPU's flags; the
    FMA peak uses that level's vectors, AVX2's at the baseline."""
    assert bench_level.kernel_level(args, flags) == level
    assert bench_level.fma_level(level) == ("avx512" if level == "avx512" else "avx2")

def test_the_start_gate_holds_each_thread_until_all_are_in():
    """_together's native gate: a thread that counted itself in does not call its function
    until the last one does; then each calls its own function with its own three arguments
    and stamps the clock before and after (stamps, not timing, are checked here)."""
    mem, store = bench_machine._executable(  # store(p, a, b): p[0] = a + b
        bench_machine.assemble(["add rsi, rdx", "mov qword ptr [rdi], rsi", "ret"], "store"))
    gate = bench_machine._gate()[0]
    out = np.zeros(2, np.uint64)
    counter = np.array([2], np.int32)
    blocks = [np.array([store, out[k:].ctypes.data, 40, k + 1,
                        counter.ctypes.data, 0, 0, 0, 0], np.uint64) for k in range(2)]
    pool = [threading.Thread(target=gate, args=(b.ctypes.data,), daemon=True) for b in blocks]
    pool[0].start()
    pool[0].join(0.2)
    held = pool[0].is_alive(), int(counter[0]), int(out[0])
    pool[1].start()  # (daemon threads: a gate that never opens fails the test, not hangs it)
    for t in pool:
        t.join(10)
    assert held == (True, 1, 0)  # counted in, waiting
    assert not any(t.is_alive() for t in pool) and counter[0] == 0 and list(out) == [41, 42]
    for b in blocks:
        start, end = int(b[5]) * 10**9 + int(b[6]), int(b[7]) * 10**9 + int(b[8])
        assert 0 < start <= end
    span = bench_machine._together(2, lambda k: (store, out[k:].ctypes.data, 7, k))
    assert span > 0 and list(out) == [7, 8]
    mem.close()


def image_bytes(elf, address: int, size: int) -> bytes:
    """`size` bytes of an ELF image's loaded segments at virtual `address`."""
    from elftools.elf.elffile import ELFFile
    with open(elf, "rb") as f:
        seg = next(s for s in ELFFile(f).iter_segments()
                   if s["p_type"] == "PT_LOAD" and s["p_vaddr"] <= address < s["p_vaddr"] + s["p_filesz"])
        return seg.data()[address - seg["p_vaddr"]:][:size]


@pytest.mark.parametrize("prompt", [False, True], ids=["decode", "prompt"])
@pytest.mark.parametrize("args", [[], ["--avx2"]], ids=["default", "avx2"])
@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_kernels_run_the_engines_own_kernel(gemma, wtype, args, prompt, monkeypatch):
    """kernel_speeds runs the kernel of the level the engine runs with `args` here (the
    AVX-512 one by default where this CPU has AVX-512F, else the AVX2 one), as decode calls it
    (one token) or as a prompt block does (the level's PROMPT_TOKENS a call, over PROMPT_ROWS
    rows): Kernels copies the executable segment of the built ./gemma's image (gemma.elf,
    beside the packed program), finds that level's kernel through the symbol map (the bytes it
    calls are the symbol's in the image) and calls it through the verified caller loop: on
    kernel_speeds' in-cache matrix it gives W x_t for every token within test_speed_paths'
    float32 bound of the exact product (n/16 + 5 roundings of the sum of |products|), so the
    speed measured is that of the real kernel doing the real work. Every buffer starts on a
    cache line, as the engine's do."""
    level = bench_level.kernel_level(args, bench_machine.cpu_flags())
    assert level == ("avx512" if not args and "avx512f" in bench_machine.cpu_flags() else "avx2")
    name = bench_level.KERNELS[level][wtype]
    tokens = bench_level.PROMPT_TOKENS[level][wtype] if prompt else 1
    kernels = bench_machine.Kernels(gemma.binary, level)
    try:
        size = gemma.symbols[name]["size"]
        assert size > 0 and ctypes.string_at(kernels.address[wtype], size) == \
            image_bytes(gemma.elf, gemma.symbols[name]["address"], size), name
        job = kernels.job(wtype, np.random.default_rng(3), tokens)
        assert all(a.ctypes.data % 64 == 0 for a in (job.w, job.x, job.xout))
        kernels.run(job, 1)
        cols = bench_machine.KERNEL_COLS
        w = job.w.astype(np.float64) if wtype == "f16" else \
            dequantize_q8_0(job.w, cols).astype(np.float64)
        rows = len(w)
        assert w.shape[1] == cols and job.x.shape == (tokens, cols) and job.xout.shape == (tokens, rows)
        if prompt:  # a chunk of mm_share's: every prompt tile fits it (3 rows, AVX2 FP16's pairs)
            assert rows == bench_machine.PROMPT_ROWS and rows % 6 == 0
        else:  # rows in pairs, and the cache it is meant to sit in
            assert rows % 2 == 0 and job.w.nbytes <= bench_machine.KERNEL_BYTES
        x = job.x.astype(np.float64)
        exact = x @ w.T
        bound = (cols / 16 + 5) * 2.0 ** -24 * (np.abs(x) @ np.abs(w.T))
        assert np.all(np.abs(job.xout - exact) <= bound), np.max(np.abs(job.xout - exact) / bound)
    finally:
        kernels.close()
    built = []  # the levels whose kernels kernel_speeds loads

    class Spy(bench_machine.Kernels):
        def __init__(self, binary, level):
            built.append(level)
            super().__init__(binary, level)
    monkeypatch.setattr(bench_machine, "Kernels", Spy)
    speeds = bench_machine.kernel_speeds(gemma.binary, level, [wtype, "q4_0"], [1], calls=20, trials=1,
                                         prompt=prompt)
    assert list(speeds) == [wtype] and speeds[wtype][1] > 0  # a type without a kernel: left out
    assert built == [level]


def test_prompt_calls_mirror_the_engine():
    """The bench's prompt calls are the engine's: the tokens a call takes at each level (asm/
    cpu.asm's kernel records: AVX2 FP16 TILE_TOKENS, Q8_0 FAST_TOKENS, AVX-512 TILE8_TOKENS)
    and a chunk's rows (asm/threads.asm's MM_CHUNK)."""
    assert bench_level.PROMPT_TOKENS == {
        "avx2": {"f16": constant("TILE_TOKENS"), "q8_0": constant("FAST_TOKENS")},
        "avx512": {"f16": constant("TILE8_TOKENS"), "q8_0": constant("TILE8_TOKENS")}}
    assert bench_machine.PROMPT_ROWS == constant("MM_CHUNK")


def test_kernel_speeds_need_the_image_and_its_map(gemma, tmp_path):
    """A packed program without its image (gemma.elf) and map beside it, with an empty map,
    or with an image that is not an ELF gives no kernel figures, no error."""
    alone = tmp_path / "gemma"
    alone.write_bytes(gemma.binary.read_bytes())

    def speeds() -> dict:
        return bench_machine.kernel_speeds(alone, "avx2", ["f16"], [1], calls=2, trials=1)
    assert speeds() == {}
    (tmp_path / "gemma.elf").write_bytes(gemma.elf.read_bytes())
    assert speeds() == {}
    (tmp_path / "gemma.map.json").write_text("{}")
    assert speeds() == {}
    (tmp_path / "gemma.map.json").write_text(json.dumps(gemma.symbols))
    assert list(speeds()) == ["f16"]
    (tmp_path / "gemma.elf").write_bytes(b"not an ELF")
    assert speeds() == {}


def test_no_kernel_figures_at_the_baseline_or_without_the_levels_flags(gemma, monkeypatch):
    """kernel_speeds measures no baseline kernel, and neither it nor fma_peaks runs a level's
    code on a CPU without that level's flags (an AVX2-only CPU asked for AVX-512: {}, no
    SIGILL)."""
    assert bench_machine.kernel_speeds(gemma.binary, "baseline", ["f16"], [1], calls=2, trials=1) == {}
    monkeypatch.setattr(bench_machine, "cpu_flags", lambda: AVX2)
    assert bench_machine.kernel_speeds(gemma.binary, "avx512", ["f16"], [1], calls=2, trials=1) == {}
    assert bench_machine.fma_peaks([1], "avx512", iterations=2) == {}


def test_fma_peak_is_the_best_of_every_round(gemma, tmp_path, monkeypatch):
    """The FMA peak is measured with the read ceiling, before each round and after the last, and
    the best of those is the peak (measured once, a busy CPU could halve the 2-thread peak and so
    double the prompt's fraction of it)."""
    values = iter([10.0, 30.0, 20.0])  # the best neither the first nor the last
    calls = []

    def fake_peaks(threads, level):
        calls.append(level)
        return {t: next(values) for t in threads}
    monkeypatch.setattr(bench_machine, "fma_peaks", fake_peaks)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--no-llama", "--bw-size", "16M", "-t", "1", "-r", "2", "-p", str(PROMPT),
                         "-n", str(N), "--json", str(tmp_path / "out.json")])
    assert rc == 0, out.getvalue()
    assert len(calls) == 3  # before each of the 2 rounds, and after the last
    res = json.loads((tmp_path / "out.json").read_text())
    assert {int(t): v for t, v in res["fma_peak"].items()} == {1: 30.0}
    assert f"; FMA peak ({FMA}), measured, GFLOP/s: 30.0 on 1 thread(s)" in out.getvalue()


def test_baseline_runs_have_no_kernel_figures(gemma, tmp_path):
    """With --engine-args=--baseline the engine runs its SSE kernels, so the AVX2 kernels'
    speed in cache would be no ceiling of it: n/a."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--engine-args=--baseline", "--no-llama", "--bw-size", "16M", "-t", "1",
                         "-p", str(PROMPT), "-n", str(N), "--json", str(tmp_path / "out.json")])
    assert rc == 0, out.getvalue()
    rows = parse_table(out.getvalue())
    assert rows["gemma decode kernel in cache GB/s"] == rows["gemma decode / kernel in cache"] == ["n/a"]
    assert rows["gemma prompt kernel in cache GFLOP/s"] == rows["gemma prompt / kernel in cache"] == ["n/a"]
    assert "\nllama.cpp: not run (--no-llama)\n" in out.getvalue()  # the prefix once
    assert "\nkernels: SSE baseline (matmul_f16, matmul_q8)\n" in out.getvalue()
    assert "gemma prompt / FMA peak (AVX2)" in rows  # the CPU's AVX2 peak: the baseline has no FMA
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["engines"][0]["kernel"] == res["engines"][0]["prompt_kernel"] == {}
    assert (res["level"], res["fma_level"]) == ("baseline", "avx2")


def test_llama_bench_output_is_parsed():
    text = json.dumps([{"n_prompt": 64, "n_gen": 0, "avg_ts": 37.5},
                       {"n_prompt": 0, "n_gen": 16, "avg_ts": 4.25}])
    assert bench_llama.parse_llama_bench(text) == {"prompt_tps": 37.5, "n_prompt": 64,
                                                   "decode_tps": 4.25, "n_decode": 16}
    with pytest.raises(ValueError):
        bench_llama.parse_llama_bench(json.dumps([{"n_prompt": 64, "n_gen": 0, "avg_ts": 1}]))


@pytest.mark.parametrize("argv, message", [
    (["--engine", "/nonexistent/gemma", "--preset", "tiny"], "no engine binary at /nonexistent/gemma"),
    (["-t", "0"], "--threads wants positive integers"),
    (["-p", "64,1"], "--prompt-tokens wants integers of at least 2 separated by commas, not '64,1'"),
    (["--preset", "tiny", "--engine", "/bin/true", "-p", "16,600"], "prompt + -n is more than the model's context (512 tokens)"),
    (["--bw-size", "12"], "--bw-size wants at least 1M"),
    (["--gguf", "x.gguf"], "--gguf goes with --model"),
    (["--model", "m.bin", "--type", "q8_0"], "--type goes with a preset"),
    (["--type", "f16,q4_0"], "--type wants f16 or q8_0 (comma-separated or repeated), not 'q4_0'"),
    (["--model", "/nonexistent/m.bin", "--engine", "/bin/true"], "no such file: /nonexistent/m.bin"),
    (["--preset", "tiny", "--engine", "/bin/false"], "the engine's --tokens failed: exit status 1"),
    (["--startup-only", "--type", "q8_0"], "--startup-only times the engine (and --compare's B) on the tiny "
                                           "model: no"),
    (["--preset", "tiny", "--engine", "/bin/true", "--compare-image"], "--compare-image: no image "),
    (["--preset", "tiny", "--engine", "/bin/true", "--compare", "/nonexistent/gemma"],
     "--compare: /nonexistent/gemma is not an executable file"),
    (["--compare", "/bin/true", "--compare-image"], "--compare and --compare-image exclude each other"),
    (["--preset", "tiny", "--compare-format", "2"], "--compare-format goes with --compare"),
    (["--model", "m.bin", "--compare", "/bin/true", "--compare-format", "2"],
     "--compare-format goes with a preset or --real"),
    (["--preset", "tiny", "--compare", "/bin/false", "--compare-format", "2", "--no-llama"], "B's --tokens failed"),
    (["--startup-only", "--compare-image"], "--startup-only times the engine (and --compare's B)"),
    (["--startup-only", "--compare", "/nonexistent/gemma"], "--compare: /nonexistent/gemma is not an executable file"),
])
def test_errors_are_one_line(argv, message, capsys, tmp_path):
    assert bench.main(argv + ["--cache", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    # the error is one line, the last (a progress note may come before it), no traceback
    assert err.endswith("\n") and \
        err.splitlines()[-1].startswith(f"python -m builder bench: error: {message}"), err
    assert "Traceback" not in err and err.count("bench: error") == 1, err


def test_a_crashing_peer_is_reported_not_fatal(gemma, tmp_path):
    """llama.cpp runs in a child process: one that dies by a signal (as its AMX build does on
    quantized models) is named as a crash in the report, at each prompt length, and the
    engine's figures still come."""
    crasher = tmp_path / "llama-bench"
    crasher.write_text("#!/bin/sh\necho loading >&2\nkill -SEGV $$\n")
    crasher.chmod(0o755)
    cache = tmp_path / "cache"
    model, (gguf,) = bench.model_paths(bench.Config(preset="tiny", cache=cache))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--model", str(model), "--gguf", str(gguf), "--engine", str(gemma.binary),
                         "--llama-bench", str(crasher), "--bw-size", "16M", "-t", "1",
                         "-p", f"{SHORT},{PROMPT}", "-n", str(N)])
    text = out.getvalue()
    assert rc == 0, text
    crash = "crashed: killed by signal 11 (SIGSEGV); its last words: loading"
    assert f"llama.cpp on {gguf.name}: 353,536 bytes per token; llama-bench failed: {crash} (at {SHORT} tokens); " \
           f"llama-bench failed: {crash} (at {PROMPT} tokens)\n" in text, text
    rows = parse_table(text)
    assert f"gemma@{SHORT} decode tokens/s" in rows and not any("llama.cpp" in r for r in rows), rows


def test_f16_twin_holds_the_engines_weights(tmp_path):
    """bench --real gives llama.cpp an F16 twin of a quantized GGUF: converted, it is the very
    model file the quantized one converts to (same dequantized values, same FP16 rounding),
    and it holds only F16 and F32 tensors."""
    import gguf
    from builder.models.convert import convert
    from builder.models.gguf_meta import read_gguf_meta
    from builder.bench.gguf_twin import f16_twin
    from variants import gguf_variant, quantized
    rng = np.random.default_rng(0)

    def quantize(ts):
        for name, qtype in (("token_embd.weight", "Q5_0"), ("blk.0.attn_q.weight", "Q8_0"),
                            ("blk.1.ffn_down.weight", "Q4_K")):
            ts[name] = (quantized(qtype, ts[name][0].astype(np.float32), rng),
                        gguf.GGMLQuantizationType[qtype])
    src = gguf_variant(tmp_path, "tiny_g3", tensors=quantize)
    assert {t.type for t in read_gguf_meta(src).tensors.values()} >= {"Q5_0", "Q8_0", "Q4_K"}
    f16_twin(src, tmp_path / "twin.gguf", progress=False)
    assert {t.type for t in read_gguf_meta(tmp_path / "twin.gguf").tensors.values()} == {"F16", "F32"}
    convert(src, tmp_path / "a.bin", progress=False)
    convert(tmp_path / "twin.gguf", tmp_path / "b.bin", progress=False)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    # its Q8_0 twin: the GGUF of what convert --type q8_0 makes of the source (Q8_0 blocks
    # copied, the rest quantized from the dequantized values), converting back to those bytes
    f16_twin(src, tmp_path / "q8.gguf", progress=False, wtype="q8_0")
    assert {t.type for t in read_gguf_meta(tmp_path / "q8.gguf").tensors.values()} == {"Q8_0", "F32"}
    convert(src, tmp_path / "qa.bin", progress=False, wtype="q8_0")
    convert(tmp_path / "q8.gguf", tmp_path / "qb.bin", progress=False, wtype="q8_0")
    assert (tmp_path / "qa.bin").read_bytes() == (tmp_path / "qb.bin").read_bytes()


def fake_result(decode: dict[str, float], level: str = "avx2", fma_level: str = "avx2") -> bench_report.Result:
    """A two-type Result (no engine run): FP16 and Q8_0 at 1 and 2 threads, with each one's
    llama.cpp twin, the engine at kernel `level`, the FMA peak in fma_level's vectors;
    `decode` gives each engine's decode tokens/s."""
    def figs(tps: float) -> list[bench_report.Figures]:
        return [bench_report.Figures(t, 100.0 * t, tps * t, 64, 15, 2 << 20, 1 << 20) for t in (1, 2)]
    engines = [bench_report.Engine(f"gemma[{w}]", f"/m-{w}.bin", n, 1e9, 0.5, figs(decode[w]), w,
                                   {1: 8.0, 2: 16.0} if w == "q8_0" else {},
                                   {1: 400.0, 2: 800.0} if w == "q8_0" else {})
               for w, n in (("f16", 1_000_000_000), ("q8_0", 531_250_000))]
    peers = [bench_report.Peer(f"m-{w}.gguf", n, figs(decode["llama"]), [i], 64)
             for i, (w, n) in enumerate((("f16", 999_000_000), ("q8_0", 530_000_000)))]
    machine = bench_report.Machine("cpu", 2, 1000.0, 1.0, "avx2")
    return bench_report.Result(machine, "2b", "gemma", level, engines, peers, {1: 10.0, 2: 20.0},
                               {1: [9.0, 10.0], 2: [20.0, 19.0]}, {1: "256-bit x2 file", 2: "128-bit x4 buffer"},
                               {1: 100.0, 2: 200.0} if fma_level else {}, fma_level, "llama-cpp-python",
                               [0.1, 0.2], 1,
                               bench_report.Startup("gemma", "", "no image", []))


def test_two_weight_types_side_by_side():
    """--type f16,q8_0: each engine's block of rows under its own label, the Q8_0/FP16 ratios,
    and each llama.cpp twin compared with the engine on the same weights."""
    res = fake_result({"f16": 5.0, "q8_0": 8.0, "llama": 4.0})
    text = bench_report.table(res)
    rows = parse_table(text)
    for w in ("f16", "q8_0"):
        assert f"gemma[{w}] decode tokens/s" in rows and f"tokens: prompt, decoded (gemma[{w}])" in rows
        assert f"decode ratio gemma[{w}]/llama.cpp[m-{w}.gguf]" in rows
    assert rows["gemma[f16] decode efficiency"] == ["0.500", "0.500"]  # 5 x 1e9 / 10e9
    assert rows["gemma[q8_0] decode efficiency"] == ["0.425", "0.425"]  # 8 x 0.53125e9 / 10e9
    assert rows["decode ratio gemma[q8_0]/gemma[f16]"] == ["1.600", "1.600"]
    assert rows["gemma[q8_0] decode kernel in cache GB/s"] == ["8.00", "16.00"]
    assert rows["gemma[q8_0] decode / kernel in cache"] == ["0.531", "0.531"]  # 8 x 0.53125e9 / 8e9
    assert rows["gemma[f16] decode kernel in cache GB/s"] == rows["gemma[f16] decode / kernel in cache"] \
        == ["n/a", "n/a"]  # not measured (no AVX2, or no symbol map)
    assert rows["gemma[q8_0] prompt kernel in cache GFLOP/s"] == ["400.00", "800.00"]
    assert rows["gemma[q8_0] prompt / kernel in cache"] == ["0.250", "0.250"]  # 100 t x 1e9 / (400 t e9)
    assert rows["gemma[f16] prompt kernel in cache GFLOP/s"] == rows["gemma[f16] prompt / kernel in cache"] \
        == ["n/a", "n/a"]
    assert rows["decode ratio gemma[q8_0]/llama.cpp[m-q8_0.gguf]"] == ["2.000", "2.000"]
    assert rows["(fastest read loop)"] == ["256-bit x2 file", "128-bit x4 buffer"]
    assert "bytes read per generated token by gemma[q8_0]: 531,250,000" in text
    assert "MEASUREMENT FAULT" not in text and res.faults() == []


@pytest.mark.parametrize("level, fma_level, kernels, peak", [
    ("avx512", "avx512", "AVX-512F (matmul_f16_avx512, matmul_q8_avx512)", "FMA peak (AVX-512)"),
    ("avx2", "avx2", "AVX2+FMA+F16C (matmul_f16_avx2, matmul_q8_avx2)", "FMA peak (AVX2)"),
    ("baseline", "avx2", "SSE baseline (matmul_f16, matmul_q8)", "FMA peak (AVX2)"),
    ("baseline", "", "SSE baseline (matmul_f16, matmul_q8)", "FMA peak"),
])
def test_the_report_names_the_kernel_level_and_the_fma_vectors(level, fma_level, kernels, peak):
    """The header names the engine's kernel level and its decode kernels, and the FMA peak's
    vectors, as the prompt's rows do; no peak (a CPU without FMA): n/a. The JSON keeps both
    levels."""
    res = fake_result({"f16": 5.0, "q8_0": 8.0, "llama": 4.0}, level, fma_level)
    text = bench_report.table(res)
    assert text.splitlines()[2] == f"kernels: {kernels}"
    figures = "100.0 on 1 thread(s), 200.0 on 2 thread(s)" if fma_level else "n/a"
    assert f"; {peak}, measured, GFLOP/s: {figures}\n" in text
    rows = parse_table(text)
    assert rows[f"gemma[f16] prompt / {peak}"] == (["1.000", "1.000"] if fma_level else ["n/a", "n/a"])
    assert not [r for r in rows if "FMA" in r and not r.endswith(f"/ {peak}")]
    assert (asdict(res)["level"], asdict(res)["fma_level"]) == (level, fma_level)


def test_a_peer_is_compared_with_each_of_its_engines():
    """A peer shared by two engines (--real's Q4_K_M file with --type f16,q8_0): its rows once,
    and the ratios of each engine to it."""
    res = fake_result({"f16": 5.0, "q8_0": 8.0, "llama": 4.0})
    res.peers.append(bench_report.Peer("m-q4_k_m.gguf", 300_000_000,
                                       res.peers[0].figures, [0, 1], 64))
    rows = parse_table(bench_report.table(res))
    assert rows["decode ratio gemma[f16]/llama.cpp[m-q4_k_m.gguf]"] == ["1.250", "1.250"]
    assert rows["decode ratio gemma[q8_0]/llama.cpp[m-q4_k_m.gguf]"] == ["2.000", "2.000"]
    assert rows["llama.cpp[m-q4_k_m.gguf] decode efficiency"] == ["0.120", "0.120"]  # 4 x 0.3e9 / 10e9


def test_efficiency_above_one_is_a_fault_not_a_figure():
    res = fake_result({"f16": 5.0, "q8_0": 8.0, "llama": 25.0})  # 25 x 0.999e9 > 10e9 and 20e9
    text = bench_report.table(res)
    rows = parse_table(text)
    assert rows["llama.cpp[m-f16.gguf] decode efficiency"] == ["FAULT", "FAULT"]
    assert rows["llama.cpp[m-q8_0.gguf] decode efficiency"] == ["FAULT", "FAULT"]  # 25 x 0.53e9 = 13.25e9
    assert rows["gemma[f16] decode efficiency"] == ["0.500", "0.500"]
    assert res.faults() == [f"llama.cpp[m-f16.gguf] on {t} thread(s) read {25 * 0.999 * t / (10 * t):.3f}x "
                            "the bandwidth" for t in (1, 2)] + \
        [f"llama.cpp[m-q8_0.gguf] on {t} thread(s) read {25 * 0.53 * t / (10 * t):.3f}x the bandwidth"
         for t in (1, 2)]
    assert text.count("MEASUREMENT FAULT: ") == 4


def test_bw_size_default_is_proportionate():
    """--bw-size: 2G, 256M with a tiny preset (not with a given or the real model), or as given."""
    def size(argv: list[str]) -> int:
        a = argparse.Namespace(bw_size=None, preset="2b", model=None, real=False)
        for k, v in zip(argv[::2], argv[1::2]):
            setattr(a, k, v)
        return bench.bw_size(a)
    assert size([]) == 2 << 30 and size(["preset", "g3-270m"]) == 2 << 30
    assert size(["preset", "tiny"]) == size(["preset", "tiny-g3"]) == 256 << 20
    assert size(["preset", "tiny", "model", "m.bin"]) == size(["preset", "tiny", "real", True]) == 2 << 30
    assert size(["preset", "tiny", "bw_size", "16M"]) == 16 << 20


def test_type_option():
    assert bench._types(["f16,q8_0"]) == ["f16", "q8_0"] == bench._types(["f16", "q8_0", "f16"])
    with pytest.raises(ValueError, match="--type wants f16 or q8_0"):
        bench._types(["q4_0"])


def test_q8_0_pair_is_made_and_cached_beside_the_f16_one(tmp_path):
    model, (gguf,) = bench.model_paths(bench.Config(preset="tiny", cache=tmp_path), "q8_0")
    assert (model.name, gguf.name) == ("tiny-seed0-q8_0.bin", "tiny-seed0-q8_0.gguf")
    assert bench.weight_type(ModelFile4(model)) == "q8_0"
    assert {t.type for t in read_gguf_meta(gguf).tensors.values()} == {"Q8_0", "F32"}


def test_both_types_in_one_run(gemma, tmp_path):
    """The tiny preset in FP16 and Q8_0 in one run, each with its llama.cpp twin when
    installed, and each with its own decode kernel's speed in cache."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = bench.main(["--preset", "tiny", "--cache", str(tmp_path), "--engine", str(gemma.binary),
                         "--type", "f16,q8_0", "--bw-size", "16M", "-t", "1", "-p", str(PROMPT), "-n", str(N),
                         "--json", str(tmp_path / "out.json")])
    text = out.getvalue()
    assert rc == 0, text
    res = json.loads((tmp_path / "out.json").read_text())
    assert [e["label"] for e in res["engines"]] == ["gemma[f16]", "gemma[q8_0]"]
    assert res["engines"][1]["bytes_per_token"] < 0.6 * res["engines"][0]["bytes_per_token"]
    assert [e["wtype"] for e in res["engines"]] == ["f16", "q8_0"]
    assert all(e["kernel"]["1"] > 0 for e in res["engines"])
    rows = parse_table(text)
    assert "decode ratio gemma[q8_0]/gemma[f16]" in rows
    if res["peers"]:
        assert [p["engines"] for p in res["peers"]] == [[0], [1]]
        assert "decode ratio gemma[q8_0]/llama.cpp[tiny-seed0-q8_0.gguf]" in rows


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_bytes_per_token_counts_one_ple_row_and_each_weight_once(tmp_path, wtype):
    """A Gemma 4 file (synth tiny-g4-dense: per-layer inputs of 32 for 10 layers): a token reads
    every tensor of the model once but the PLE table, of which one row (10 x 32 values), plus
    the ones vector every value norm shares (of the widest head, 32) -- counted here from the
    shapes of the model's version 3 description."""
    from builder.models.synth import synth
    from builder.models.synth4 import PRESETS4
    from builder.models.modelfile3 import with_q8_0
    synth("tiny-g4-dense", tmp_path / "g4.bin", progress=False, wtype=wtype)
    m = PRESETS4["tiny-g4-dense"][0]
    layout = {s.name: s.nbytes for s in modelfile3.tensor_layout(with_q8_0(m) if wtype == "q8_0" else m)}
    assert not any("experts_" in k for k in layout)
    ple_row = 10 * 32 * 2 if wtype == "f16" else 10 * 34
    want = sum(layout.values()) - layout["ple_embed"] + ple_row + 4 * 32
    assert bench.bytes_per_token(ModelFile4(tmp_path / "g4.bin")) == want


def test_llama_missing_says_how_to_install_it(monkeypatch, tmp_path):
    """Without llama-cpp-python the report's line names the project's extra that installs it
    and where the AMX build note is, or llama-bench; without a GGUF or with --no-llama, why."""
    monkeypatch.setattr(bench_llama, "available", lambda: "llama-cpp-python is not installed (ImportError: x)")
    gguf = [tmp_path / "m.gguf"]
    assert bench.llama_missing(bench.Config(), gguf) == (
        "not run: llama-cpp-python is not installed (ImportError: x); pip install -e '.[bench]' (on a CPU "
        "with AMX, build it without AMX: pyproject.toml, docs/speed.md), or give --llama-bench PATH")
    assert bench.llama_missing(bench.Config(llama=False), gguf) == "not run (--no-llama)"
    assert bench.llama_missing(bench.Config(), []) == "not run (no GGUF given)"
