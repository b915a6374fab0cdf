"""`python -m builder bench`: how fast ./gemma runs a Gemma-2B-shaped model on this machine,
against this machine's memory bandwidth and against llama.cpp on the same weights, in one run.

Steps: make (once, cached outside the repo: ~/.cache/gemma-bench/, or --cache) the synthetic
model of --preset and its F16 GGUF twin with `python -m builder synth`; read both files once so
they sit in the page cache (neither engine then waits for the disk: the table shows major page
faults, which count the times it did); then --repeat rounds of: memory read bandwidth for each
thread count (builder.bench_bandwidth, a native AVX2 streaming read of --bw-size bytes), then
for each thread count the engine and llama.cpp, one after the other; bandwidth once more at the
end. Each figure is the best over the rounds (the machine is shared: other work only ever
slows a run down), and the table shows the 1-minute load average before and after.

How the engine is timed from outside (it prints no timings). The prompt is fixed text cut to P
tokens (counted with `./gemma --tokens`, BOS included); generation is greedy (--temp 0).
- start-up: the fastest of three `--tokens` runs with the same flags (map the model, set up,
  tokenize, print the ids, exit);
- prompt tokens/s = P / (wall time of a `-n 0` run - start-up): the prompt alone, exactly as
  the engine processes it when nothing asks for its logits;
- decode tokens/s: a `-n N --logits FIFO` run; the engine writes one float32 row of vocab
  logits per evaluated position, and each row's arrival is stamped (builder.bench_run): rows
  0..P-1 are the prompt, each later row is one generated token's forward pass, so decode
  tokens/s = D / (time of the last row - time of row P-1) over the D decode rows. This counts
  the forward passes actually made (an early end-of-sequence shows as a smaller D and never
  inflates the rate) and excludes start-up and prompt. Writing a 1 MB row into a pipe costs
  ~0.1 ms against a >100 ms forward pass on the 2b preset.
- peak RSS and peak anonymous memory of the decode run (builder.bench_run): RSS includes the
  pages of the mapped model file the engine touched; anonymous memory is what it allocated.
Derived figures: bytes per generated token = the bytes of every tensor in the model file (each
is read once per token; the KV cache adds ~P x 37 KB on 2b, not counted); decode efficiency =
decode tokens/s x bytes per token / bandwidth at that thread count; prompt FLOPs per token =
2 x every matrix weight of the layers + the attention over the prompt (average position) + the
logits of the last position shared over P; its fraction of the AVX2 FMA peak (2 FMA units x 8
floats x 2 FLOPs per cycle per core x the clock /proc/cpuinfo reports). llama.cpp is timed by
builder.bench_llama on the same prompt token ids, with the same thread count.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from builder import bench_bandwidth, bench_llama
from builder.bench_run import Run, run
from builder.cli import Parser
from builder.modelfile import ModelFormatError, read_header, tensor_layout

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path.home() / ".cache" / "gemma-bench"
PRESETS = ("tiny", "2b", "7b")
PROMPT_TEXT = ("The history of the city begins with a small market by the river, where farmers "
               "from the valley sold grain, wool and salt to travellers on the northern road. ")
FMA_FLOPS_PER_CYCLE = 2 * 8 * 2  # two 256-bit FMA pipes, 8 floats, multiply + add


class BenchError(Exception):
    """A failure worth one line: missing binary, failed model synthesis, engine error..."""


@dataclass
class Config:
    preset: str = "2b"
    seed: int = 0
    cache: Path = DEFAULT_CACHE
    engine: Path | None = None  # None: ./gemma of the repository, built when missing
    threads: list[int] = field(default_factory=list)  # empty: the CPUs this process may use
    prompt_tokens: int = 64
    n: int = 16
    bw_size: int = 2 << 30
    repeat: int = 1
    llama: bool = True
    llama_bench: Path | None = None
    model: Path | None = None  # given files instead of the cached synthetic pair
    gguf: Path | None = None


@dataclass
class Machine:
    cpu: str
    cpus: int  # CPUs this process may run on
    mhz: float
    mem_gib: float
    vector: str  # the SIMD extensions that matter here

    @staticmethod
    def here() -> "Machine":
        info = Path("/proc/cpuinfo").read_text()
        first = dict(ln.split(":", 1) for ln in info.split("\n\n")[0].splitlines() if ":" in ln)
        first = {k.strip(): v.strip() for k, v in first.items()}
        flags = set(first.get("flags", "").split())
        mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal:"))
        return Machine(first.get("model name", "unknown"), len(os.sched_getaffinity(0)),
                       float(first.get("cpu MHz", 0)), mem / 2**20,
                       " ".join(f for f in ("avx2", "fma", "f16c", "avx512f") if f in flags))

    def fma_peak(self, threads: int) -> float:
        """AVX2 FMA peak FLOP/s of `threads` cores at the reported clock."""
        return threads * FMA_FLOPS_PER_CYCLE * self.mhz * 1e6


@dataclass
class Figures:
    """One engine at one thread count."""
    threads: int
    prompt_tps: float
    decode_tps: float
    n_prompt: int
    n_decode: int
    peak_rss: int = 0  # bytes; 0 = not measured
    peak_anon: int = 0
    major_faults: int = 0  # page faults served from disk (engine: prompt + decode runs)


@dataclass
class Result:
    machine: Machine
    preset: str
    model: str
    gguf: str
    bytes_per_token: int
    flops_per_prompt_token: float
    bandwidth: dict[int, float]  # GB/s per thread count (the highest of bandwidth_runs)
    bandwidth_runs: dict[int, list[float]]  # GB/s per thread count, before each round and after
    gemma: list[Figures]
    llama: list[Figures]
    llama_source: str  # "llama-cpp-python 0.3.x", "llama-bench PATH", or why it is missing
    load: list[float]  # 1-minute load average before and after: other work on the machine
    repeat: int  # rounds; each figure is the best of them

    def efficiency(self, f: Figures) -> float:
        return f.decode_tps * self.bytes_per_token / (self.bandwidth[f.threads] * 1e9)

    def fma_fraction(self, f: Figures) -> float:
        return f.prompt_tps * self.flops_per_prompt_token / self.machine.fma_peak(f.threads)


# ---------------------------------------------------------------- model files


def model_paths(cfg: Config) -> tuple[Path, Path]:
    """The model file and its GGUF twin: given ones, or the cached synthetic pair (made once)."""
    if cfg.model:
        for p in (cfg.model, cfg.gguf):
            if p and not p.is_file():
                raise BenchError(f"no such file: {p}")
        return cfg.model, cfg.gguf
    base = cfg.cache / f"{cfg.preset}-seed{cfg.seed}"
    model, gguf = base.with_suffix(".bin"), base.with_suffix(".gguf")
    if model.is_file() and gguf.is_file():
        try:
            read_header(model)
            return model, gguf
        except (ModelFormatError, OSError):
            pass  # stale or damaged: make it again
    cfg.cache.mkdir(parents=True, exist_ok=True)
    print(f"bench: making the {cfg.preset} model and its GGUF in {cfg.cache} (once)",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tmp-", dir=cfg.cache) as tmp:
        part_model, part_gguf = Path(tmp) / "model.bin", Path(tmp) / "model.gguf"
        argv = [sys.executable, "-m", "builder", "synth", "--preset", cfg.preset,
                "--seed", str(cfg.seed), "-o", str(part_model), "--gguf", str(part_gguf)]
        if subprocess.run(argv, cwd=ROOT).returncode != 0:  # its progress bars and errors show
            raise BenchError(f"synth --preset {cfg.preset} failed (its error is above)")
        part_gguf.rename(gguf)
        part_model.rename(model)
    return model, gguf


def warm(path: Path) -> None:
    """Read a file once so its pages are in the page cache, with a progress bar."""
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as f, tqdm(total=size, unit="B", unit_scale=True,
                                                  desc=f"caching {path.name}", leave=False,
                                                  disable=size < 1 << 28) as bar:
        buf = bytearray(1 << 24)
        while n := f.readinto(buf):
            bar.update(n)


def bytes_per_token(model: Path) -> int:
    """Every tensor's bytes: a generated token reads each once."""
    return sum(spec.nbytes for spec in tensor_layout(read_header(model)))


def flops_per_prompt_token(model: Path, n_prompt: int) -> float:
    """Useful FLOPs per prompt token (see the module docstring)."""
    h = read_header(model)
    matrices = sum(s.nbytes // 2 for s in tensor_layout(h) if s.dtype == "f16" and s.name != "embed")
    attention = 4 * h.layers * h.heads * h.head_dim * (n_prompt + 1) / 2  # q.k and p.v
    return 2 * matrices + attention + 2 * h.vocab * h.dim / n_prompt


# ---------------------------------------------------------------- the engine


def engine_path(cfg: Config) -> Path:
    if cfg.engine:
        if not cfg.engine.is_file():
            raise BenchError(f"no engine binary at {cfg.engine}")
        return cfg.engine.resolve()  # exec would search PATH for a bare name
    binary = ROOT / "gemma"
    if not binary.is_file():
        from builder.build import build
        from builder.errors import BuildError
        try:
            build(ROOT)
        except BuildError as e:
            raise BenchError(f"building ./gemma failed: {e}") from None
    return binary


def _checked(r: Run, what: str) -> Run:
    if r.returncode != 0:
        raise BenchError(f"{what} failed: {r.error_line()}")
    return r


def make_prompt(engine: Path, model: Path, n_tokens: int) -> tuple[str, list[int]]:
    """The longest prefix of PROMPT_TEXT repeated with at most n_tokens tokens (BOS
    included) and its token ids."""
    base = [str(engine), "-m", str(model), "-c", str(read_header(model).max_ctx), "--tokens",
            "-p"]

    def ids(text: str) -> list[int]:
        r = _checked(run(base + [text], capture=True), "the engine's --tokens")
        return [int(t) for t in r.stdout.split()]

    text = PROMPT_TEXT
    while len(ids(text)) < n_tokens:
        text += PROMPT_TEXT
    lo, hi = 1, len(text)  # a 1-character prompt fits; find the longest prefix that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(ids(text[:mid])) <= n_tokens else (lo, mid - 1)
    return text[:lo], ids(text[:lo])


def time_engine(engine: Path, model: Path, text: str, n_prompt: int, n: int,
                threads: int) -> Figures:
    """Prompt and decode tokens/s of ./gemma (see the module docstring)."""
    h = read_header(model)
    ctx = min(h.max_ctx, n_prompt + n + 8)
    base = [str(engine), "-m", str(model), "-p", text, "--temp", "0", "-t", str(threads),
            "-c", str(ctx)]
    start = min(_checked(run(base + ["--tokens"]), "the engine's --tokens").seconds
                for _ in range(3))
    prompt = _checked(run(base + ["-n", "0"]), "the engine's -n 0 run")
    decode = _checked(run(base + ["-n", str(n), "--logits", "{logits}"], row_bytes=h.vocab * 4),
                      f"the engine's -n {n} run")
    rows = decode.rows
    if len(rows) < n_prompt:
        raise BenchError(f"the engine wrote {len(rows)} logits rows for a {n_prompt}-token prompt")
    n_decode = len(rows) - n_prompt
    if n_decode < 1:
        raise BenchError("the engine generated nothing after the prompt (end of sequence?)")
    prompt_s = prompt.seconds - start
    if prompt_s <= 0:
        raise BenchError("the prompt run was not slower than start-up: nothing to measure")
    decode_s = rows[-1] - rows[n_prompt - 1]
    if decode_s <= 0:
        raise BenchError("the decode rows arrived all at once: nothing to time")
    return Figures(threads, n_prompt / prompt_s, n_decode / decode_s,
                   n_prompt, n_decode, decode.peak_rss, decode.peak_anon,
                   prompt.major_faults + decode.major_faults)


# ---------------------------------------------------------------- llama.cpp


def llama_source(cfg: Config, gguf: Path | None) -> str | None:
    """How llama.cpp will be run, or None when it cannot be (llama_missing says why)."""
    if gguf is None:
        return None
    if cfg.llama_bench:
        return f"llama-bench {cfg.llama_bench}"
    if cfg.llama and bench_llama.available() is None:
        import llama_cpp
        return f"llama-cpp-python {llama_cpp.__version__}"
    return None


def llama_missing(cfg: Config, gguf: Path | None) -> str:
    if gguf is None:
        return "llama.cpp: not run (no GGUF given)"
    if not cfg.llama:
        return "llama.cpp: not run (--no-llama)"
    return f"llama.cpp: not run: {bench_llama.available()}; pip install llama-cpp-python, " \
           "or give --llama-bench PATH"


def time_llama(cfg: Config, gguf: Path, ids: list[int], threads: int) -> Figures:
    if cfg.llama_bench:
        if not cfg.llama_bench.is_file():
            raise BenchError(f"no llama-bench binary at {cfg.llama_bench}")
        argv = bench_llama.llama_bench_argv(cfg.llama_bench.resolve(), gguf, threads, len(ids),
                                            cfg.n)
        r = _checked(run(argv, capture=True), "llama-bench")
        try:
            out = bench_llama.parse_llama_bench(r.stdout.decode())
        except (ValueError, KeyError) as e:
            raise BenchError(f"llama-bench: unexpected output ({e})") from None
    else:
        with tempfile.TemporaryDirectory(prefix="gemma-bench-") as tmp:
            path = Path(tmp) / "llama.json"
            r = _checked(run([sys.executable, "-m", "builder.bench_llama", str(gguf),
                              "--threads", str(threads), "--ids", ",".join(map(str, ids)),
                              "-n", str(cfg.n), "--out", str(path)]),
                         "llama.cpp (llama-cpp-python)")
            out = json.loads(path.read_text())
    return Figures(threads, out["prompt_tps"], out["decode_tps"], out["n_prompt"],
                   out["n_decode"], r.peak_rss, r.peak_anon, r.major_faults)


# ---------------------------------------------------------------- the whole run


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def bench(cfg: Config) -> Result:
    machine = Machine.here()
    load = load_average()
    threads = cfg.threads or [machine.cpus]
    engine = engine_path(cfg)
    model, gguf = model_paths(cfg)
    if cfg.prompt_tokens + cfg.n > read_header(model).max_ctx:
        raise BenchError(f"prompt + -n is more than the model's context "
                         f"({read_header(model).max_ctx} tokens)")
    source = llama_source(cfg, gguf)
    for path in (model, gguf) if source else (model,):
        warm(path)
    text, ids = make_prompt(engine, model, cfg.prompt_tokens)
    bw_runs: dict[int, list[float]] = {t: [] for t in threads}
    gemma: dict[int, list[Figures]] = {t: [] for t in threads}
    llama: dict[int, list[Figures]] = {t: [] for t in threads}

    def bandwidth() -> None:
        for t, gbs in bench_bandwidth.bandwidths(threads, cfg.bw_size).items():
            bw_runs[t].append(gbs)

    # rounds interleave the engines, so a burst of other work on the machine hits both
    for _ in tqdm(range(cfg.repeat), desc="rounds", leave=False, disable=cfg.repeat < 2):
        bandwidth()
        for t in threads:
            gemma[t].append(time_engine(engine, model, text, len(ids), cfg.n, t))
            if source:
                llama[t].append(time_llama(cfg, gguf, ids, t))
    bandwidth()
    return Result(machine, cfg.preset if not cfg.model else "given", str(model), str(gguf or ""),
                  bytes_per_token(model), flops_per_prompt_token(model, len(ids)),
                  {t: max(bw_runs[t]) for t in threads}, bw_runs,
                  [best(gemma[t]) for t in threads], [best(llama[t]) for t in threads if llama[t]],
                  source or llama_missing(cfg, gguf), [load, load_average()], cfg.repeat)


def best(runs: list[Figures]) -> Figures:
    """The best of repeated measurements: the highest rates and memory peaks, all faults."""
    return replace(runs[0], prompt_tps=max(f.prompt_tps for f in runs),
                   decode_tps=max(f.decode_tps for f in runs),
                   peak_rss=max(f.peak_rss for f in runs), peak_anon=max(f.peak_anon for f in runs),
                   major_faults=sum(f.major_faults for f in runs))


def _num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def _mb(n: int) -> str:
    return _num(n / 1e6, 1) if n else "n/a"  # 0: the run ended before the first sample


def table(res: Result) -> str:
    """The report: a few header lines, then one row per figure and one column per thread count."""
    m = res.machine
    lines = [f"machine: {m.cpu}, {m.cpus} CPUs, {_num(m.mhz, 0)} MHz, {_num(m.mem_gib, 1)} GiB, "
             f"{m.vector}",
             f"model: {res.model} ({res.preset}); GGUF twin: {res.gguf or 'none'}",
             f"bytes read per generated token: {res.bytes_per_token:,} (every tensor once)",
             f"prompt FLOPs per token: {res.flops_per_prompt_token / 1e9:.4g} G; AVX2 FMA peak "
             f"{m.fma_peak(1) / 1e9:,.1f} GFLOP/s per core",
             f"load average (1 min) before / after: {res.load[0]:.2f} / {res.load[1]:.2f} "
             f"(other work on the {m.cpus} CPUs); best of {res.repeat} round(s)"
             + ("; BUSY: every figure is a lower bound" if max(res.load) >= m.cpus else ""),
             f"llama.cpp: {res.llama_source}" if res.llama else res.llama_source]
    g = {f.threads: f for f in res.gemma}
    ll = {f.threads: f for f in res.llama}
    rows: list[tuple[str, list[str]]] = [
        ("threads", [str(t) for t in g]),
        ("memory read bandwidth GB/s", [_num(res.bandwidth[t]) for t in g]),
        ("  (before each round / after)",
         [" / ".join(_num(b, 1) for b in res.bandwidth_runs[t]) for t in g]),
        ("gemma prompt tokens/s", [_num(f.prompt_tps) for f in g.values()]),
        ("gemma decode tokens/s", [_num(f.decode_tps) for f in g.values()]),
        ("gemma decode efficiency", [_num(res.efficiency(f), 3) for f in g.values()]),
        ("gemma prompt / decode", [_num(f.prompt_tps / f.decode_tps, 1) for f in g.values()]),
        ("gemma prompt / AVX2 FMA peak", [_num(res.fma_fraction(f), 3) for f in g.values()]),
        ("gemma peak RSS MB", [_mb(f.peak_rss) for f in g.values()]),
        ("gemma peak anonymous MB", [_mb(f.peak_anon) for f in g.values()]),
        ("tokens: prompt, decoded", [f"{f.n_prompt}, {f.n_decode}" for f in g.values()]),
        ("gemma major page faults", [f"{f.major_faults:,}" for f in g.values()]),
    ]
    if ll:
        rows += [
            ("llama.cpp prompt tokens/s", [_num(ll[t].prompt_tps) for t in g]),
            ("llama.cpp decode tokens/s", [_num(ll[t].decode_tps) for t in g]),
            ("llama.cpp decode efficiency", [_num(res.efficiency(ll[t]), 3) for t in g]),
            ("llama.cpp peak RSS MB", [_mb(ll[t].peak_rss) for t in g]),
            ("llama.cpp major page faults", [f"{ll[t].major_faults:,}" for t in g]),
            ("prompt ratio gemma/llama.cpp", [_num(g[t].prompt_tps / ll[t].prompt_tps, 3) for t in g]),
            ("decode ratio gemma/llama.cpp", [_num(g[t].decode_tps / ll[t].decode_tps, 3) for t in g]),
        ]
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r[1][i]) for r in rows) for i in range(len(g))]
    for name, cells in rows:
        lines.append(f"{name:<{width}}  " + "  ".join(c.rjust(w) for c, w in zip(cells, cols)))
    return "\n".join(lines)


def plot(res: Result, path: Path) -> None:
    """Tokens/s against threads, decode and prompt, both engines, and the bandwidth bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "decode_tps", "decode"), (axes[1], "prompt_tps", "prompt")):
        for name, figs in (("gemma", res.gemma), ("llama.cpp", res.llama)):
            if figs:
                ax.plot([f.threads for f in figs], [getattr(f, key) for f in figs], "o-",
                        label=name)
        if key == "decode_tps":
            ts = sorted(res.bandwidth)
            ax.plot(ts, [res.bandwidth[t] * 1e9 / res.bytes_per_token for t in ts], "k--",
                    label="bandwidth / bytes per token (limit)")
        ax.set(title=f"{title} ({res.preset})", xlabel="threads", ylabel="tokens/s")
        ax.set_xticks(sorted(res.bandwidth))
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def _threads(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"--threads wants positive integers separated by commas, not {text!r}")
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


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m builder bench",
               description="Benchmark ./gemma on a synthetic Gemma model against this machine's "
                           "memory bandwidth and llama.cpp on the same weights.")
    p.add_argument("--preset", choices=PRESETS, default="2b",
                   help="synthetic model shapes (default 2b, 5.0 GB; tiny for a quick check)")
    p.add_argument("--seed", type=int, default=0, help="synthetic model seed (default 0)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"where the synthetic models are kept (default {DEFAULT_CACHE})")
    p.add_argument("--model", type=Path, help="benchmark this model file instead of a preset")
    p.add_argument("--gguf", type=Path, help="with --model: its GGUF twin for llama.cpp")
    p.add_argument("--engine", type=Path, help="engine binary (default ./gemma, built if missing)")
    p.add_argument("-t", "--threads", type=str, default="",
                   help="thread counts, comma-separated (default: the CPUs available)")
    p.add_argument("-p", "--prompt-tokens", type=int, default=64,
                   help="prompt length in tokens, BOS included (default 64)")
    p.add_argument("-n", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--bw-size", default="2G", help="bandwidth test buffer (default 2G)")
    p.add_argument("-r", "--repeat", type=int, default=1,
                   help="rounds of every measurement; the best of them is shown (default 1)")
    p.add_argument("--llama-bench", type=Path, help="a llama-bench binary to compare with")
    p.add_argument("--no-llama", action="store_true", help="do not run llama.cpp")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--plot", type=Path, help="draw tokens/s against threads (needs matplotlib)")
    a = p.parse_args(argv)
    try:
        if a.gguf and not a.model:
            raise BenchError("--gguf goes with --model")
        if a.prompt_tokens < 2 or a.n < 2 or a.repeat < 1:
            raise BenchError("--prompt-tokens and -n must be at least 2, --repeat at least 1")
        if a.plot:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise BenchError("--plot needs matplotlib: pip install matplotlib") from None
        cfg = Config(a.preset, a.seed, a.cache, a.engine, _threads(a.threads) if a.threads else [],
                     a.prompt_tokens, a.n, _size(a.bw_size), a.repeat, not a.no_llama, a.llama_bench,
                     a.model, a.gguf)
        res = bench(cfg)
        print(table(res))
        if a.json:
            a.json.write_text(json.dumps(asdict(res), indent=1) + "\n")
        if a.plot:
            plot(res, a.plot)
    except (BenchError, ValueError, OSError) as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    return 0
