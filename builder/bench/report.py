"""The figures of `python -m builder bench` and how they are shown: the machine, one engine
at one thread count (`Figures`), ./gemma on one model file at one prompt length (`Engine`:
one per weight type and length; with --compare-image its image's figures too, with --compare
another engine's, each round's ratio and their median, and with --compare-format the other
engine's own model file), llama.cpp on
one GGUF at one length (`Peer`, compared with one or more engines), the packed program's
start-up against its image (`Startup`), a whole run (`Result`, with the derived decode
efficiency and fraction of the FMA peak), the text table (one row per figure, one column per
thread count; the rows of each engine one block after another, so FP16 and Q8_0 sit side by
side, then the ratios, llama.cpp's rows, and the start-up block with its own columns) and the
optional plot (matplotlib, imported only when asked for). A decode efficiency above 1 is shown
as FAULT, with a line saying so: the bandwidth measured was then not the ceiling. Beside it,
each engine's decode kernel with its weights in cache (the arithmetic ceiling of decode) and
the decode's fraction of that, and the same for the prompt: the kernel's prompt calls on a
chunk of rows in the cache (GFLOP/s) and the prompt's fraction of that. The table's header
names the engine's kernel level and its kernels ("kernels: AVX-512F (matmul_f16_avx512,
matmul_q8_avx512)"), and the header and the prompt's row name the vectors of the FMA peak: "FMA
peak (AVX-512)" or "FMA peak (AVX2)".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from statistics import median
from pathlib import Path

from builder.bench.level import FMA_VECTORS, KERNELS, TITLE


def _over(rate: float, ceiling: float | None) -> float | None:
    """`rate` (per second) over a ceiling given in 10^9 per second; None without one."""
    return rate / (ceiling * 1e9) if ceiling else None


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
class Engine:
    """./gemma on one model file (one weight type) at one prompt length."""
    label: str  # "gemma", or with several model files "gemma[TYPE]"; with several prompt
    #             lengths followed by "@LENGTH"
    model: str
    bytes_per_token: int  # every tensor of the model file once
    flops_per_prompt_token: float
    huge_pages: float  # fraction of the model file the kernel maps in 2 MB pages
    figures: list[Figures]  # one per thread count: the best of its rounds
    wtype: str = "f16"  # its matrices' weight type
    kernel: dict[int, float] = field(default_factory=dict)  # GB/s of its decode kernel with
    #                         the weights in cache, per thread count (bench_machine.kernel_speeds)
    prompt_kernel: dict[int, float] = field(default_factory=dict)  # GFLOP/s of its prompt calls
    #                         with the weights in cache (kernel_speeds(prompt=True))
    rounds: list[list[Figures]] = field(default_factory=list)  # per thread count, each round's
    image: list[Figures] = field(default_factory=list)  # --compare-image: the image's best per
    #                      thread count (the engine's own figures are the packed program's);
    #                      --compare: the other engine's (Result.image_label says which)
    image_rounds: list[list[Figures]] = field(default_factory=list)  # and each round's
    image_model: str = ""  # --compare-format: B's own model file (the same source), else ""
    prompt_tokens: int = 64  # the prompt length asked for (its figures give the one it got)


@dataclass
class Peer:
    """llama.cpp on one GGUF file: the twin of the engine's weights, or another quantization."""
    name: str  # the GGUF's file name
    bytes_per_token: int  # every tensor of the GGUF once
    figures: list[Figures]  # one per thread count; empty when it failed
    engines: list[int]  # the Result.engines entries it is compared with (at its prompt length)
    prompt_tokens: int  # the prompt length asked for
    error: str = ""  # why it has no figures: a crash is reported, not fatal to the run


@dataclass
class StartupRow:
    """One command line run by the packed program and by its image (builder.bench.startup)."""
    what: str  # "-h" or "one token (tiny)"
    argv: str  # its arguments after the program's name ("" when not run)
    runs: int  # runs of each program (0: not run)
    packed_ms: float | None  # the packed program's median wall time; None: n/a
    image_ms: float | None  # the image's
    cost_ms: float | None  # packed_ms - image_ms: what unpacking costs
    error_ms: float | None  # the standard error of cost_ms


@dataclass
class Startup:
    """The start-up cost of the packed program against its image."""
    packed: str  # the packed program
    image: str  # its image, "" when there is none
    missing: str  # why the rows are n/a; "" when they were measured
    rows: list[StartupRow]


@dataclass
class Result:
    machine: Machine
    preset: str
    engine: str  # the binary and any --engine-args
    level: str  # the kernel level the engine runs (builder.bench.level: baseline, avx2, avx512)
    engines: list[Engine]  # one per model file (weight type), side by side
    peers: list[Peer]
    bandwidth: dict[int, float]  # GB/s per thread count (the highest of bandwidth_runs)
    bandwidth_runs: dict[int, list[float]]  # GB/s per thread count, before each round and after
    bandwidth_loop: dict[int, str]  # the read loop that reached bandwidth (bench_machine)
    fma_peak: dict[int, float]  # GFLOP/s of the FMA loop per thread count ({}: not measured)
    fma_level: str  # the level whose vectors the FMA loop used (avx2: ymm, avx512: zmm; "": none)
    llama_source: str  # "llama-cpp-python 0.3.x", "llama-bench PATH", or why it is missing
    load: list[float]  # 1-minute load average before and after: other work on the machine
    repeat: int  # rounds; each figure is the best of them
    startup: Startup  # the packed program's start-up cost against its image
    image: str = ""  # --compare-image: the image timed beside the engine (--compare: the other
    #                  engine), else ""
    image_label: str = "image"  # what the rows call it: "image", or "B" for --compare
    startup_b: Startup | None = None  # --compare: B's start-up against its image, in the same rounds

    def efficiency(self, f: Figures, bytes_per_token: int) -> float:
        """Decode bytes/s over the bandwidth: at most 1 when the bandwidth is a ceiling."""
        return f.decode_tps * bytes_per_token / (self.bandwidth[f.threads] * 1e9)

    @staticmethod
    def kernel_fraction(f: Figures, e: Engine) -> float | None:
        """Decode bytes/s over the decode kernel's speed with the weights in cache."""
        return _over(f.decode_tps * e.bytes_per_token, e.kernel.get(f.threads))

    @staticmethod
    def prompt_kernel_fraction(f: Figures, e: Engine) -> float | None:
        """Prompt FLOPs/s over the speed of the kernel's prompt calls with the weights in cache."""
        return _over(f.prompt_tps * e.flops_per_prompt_token, e.prompt_kernel.get(f.threads))

    def fma_name(self) -> str:
        """"FMA peak (AVX-512)" or "FMA peak (AVX2)": the vectors it was measured with."""
        return f"FMA peak ({FMA_VECTORS[self.fma_level]})" if self.fma_level else "FMA peak"

    def fma_fraction(self, f: Figures, e: Engine) -> float | None:
        return _over(f.prompt_tps * e.flops_per_prompt_token, self.fma_peak.get(f.threads))

    def faults(self) -> list[str]:
        """Every decode efficiency above 1: a measurement fault (the bandwidth measured was
        not the ceiling), never a figure."""
        out = []
        for name, figs, per_token in [(e.label, e.figures, e.bytes_per_token) for e in self.engines] + \
                [(peer_label(self, p), p.figures, p.bytes_per_token) for p in self.peers]:
            out += [f"{name} on {f.threads} thread(s) read {self.efficiency(f, per_token):.3f}x "
                    "the bandwidth" for f in figs if self.efficiency(f, per_token) > 1]
        return out


def best(runs: list[Figures]) -> Figures:
    """The best of repeated measurements: the highest rates and memory peaks, all faults."""
    return replace(runs[0], prompt_tps=max(f.prompt_tps for f in runs),
                   decode_tps=max(f.decode_tps for f in runs),
                   peak_rss=max(f.peak_rss for f in runs), peak_anon=max(f.peak_anon for f in runs),
                   major_faults=sum(f.major_faults for f in runs))


def _num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def _frac(x: float | None) -> str:
    return "n/a" if x is None else _num(x, 3)


def _mb(n: int) -> str:
    return _num(n / 1e6, 1) if n else "n/a"  # 0: the run ended before the first sample


def _eff(x: float) -> str:
    """A decode efficiency; above 1 the bandwidth was no ceiling: a fault, not a figure."""
    return "FAULT" if x > 1 else _num(x, 3)


def _machine(m: Machine) -> str:
    return f"machine: {m.cpu}, {m.cpus} CPUs, {_num(m.mhz, 0)} MHz, {_num(m.mem_gib, 1)} GiB, {m.vector}"


def _load(load: list[float], cpus: int) -> str:
    return (f"load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f} "
            f"(other work on the {cpus} CPUs)")


def _aligned(rows: list[tuple[str, list[str]]]) -> list[str]:
    """Rows as lines: labels left-aligned, each column of cells right-aligned."""
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r[1][i]) for r in rows) for i in range(len(rows[0][1]))]
    return [f"{name:<{width}}  " + "  ".join(c.rjust(w) for c, w in zip(cells, cols)) for name, cells in rows]


def startup_lines(s: Startup, b: Startup | None = None) -> list[str]:
    """The start-up block: a line saying what was timed (or why not), then a row per command
    line: the median wall times of the packed program and its image, the difference with its
    standard error, and the runs of each. With B's (--compare), B's block after it (rows
    "start-up B ..."), then per command line the ratio of the two costs, engine / B (n/a
    where either is missing or B's is not positive)."""
    def block(s: Startup, who: str) -> list[str]:
        head = f"start-up{who}: n/a: {s.missing}" if s.missing else \
            f"start-up{who}: {s.packed} against its image {s.image}, run alternately; median wall times"
        return [head] + _aligned([(f"start-up{who} ms", ["packed", "image", "packed - image", "runs"])] + [
            (f"start-up{who} {r.what}", [ms(r.packed_ms), ms(r.image_ms),
                                         "n/a" if r.cost_ms is None else f"{_num(r.cost_ms)} ± {_num(r.error_ms)}",
                                         str(r.runs) if r.runs else "n/a"]) for r in s.rows])

    def ms(x: float | None) -> str:
        return "n/a" if x is None else _num(x)

    if b is None:
        return block(s, "")
    return block(s, "") + block(b, " B") + _aligned([
        (f"start-up cost gemma/B {r.what}",
         ["n/a" if r.cost_ms is None or q.cost_ms is None or q.cost_ms <= 0 else _num(r.cost_ms / q.cost_ms, 3)])
        for r, q in zip(s.rows, b.rows)])


def startup_report(machine: Machine, engine: str, load: list[float], s: Startup,
                   b: Startup | None = None) -> str:
    """`bench --startup-only`: the machine, the engine, the load, the start-up block (with
    --compare: B's line, its block and the ratios)."""
    return "\n".join([_machine(machine), f"engine: {engine}"] + ([f"B: {b.packed} (--compare)"] if b else []) +
                     [_load(load, machine.cpus), *startup_lines(s, b)])


def table(res: Result) -> str:
    """The report: a few header lines, then one row per figure and one column per thread count,
    then the start-up block."""
    m = res.machine
    several = len(res.engines) > 1
    lines = [_machine(m), f"engine: {res.engine}",
             f"kernels: {TITLE[res.level]} ({', '.join(KERNELS[res.level].values())})"]
    if res.image:
        flag = "--compare-image" if res.image_label == "image" else "--compare"
        lines.append(f"{res.image_label}: {res.image} ({flag}: timed too, alternately with the engine)")
    files = _files(res)
    for e in files:
        by = f" by gemma[{e.wtype}]" if len(files) > 1 else ""
        lines += [f"model: {e.model} ({res.preset})"] + \
            [f"{res.image_label}'s model: {e.image_model} (--compare-format: its own, from the same source)"] * bool(e.image_model)
        lines += [
                  f"bytes read per generated token{by}: {e.bytes_per_token:,} (every tensor once)"]
    lengths = len({e.prompt_tokens for e in res.engines}) > 1
    for name, per_token in dict.fromkeys((p.name, p.bytes_per_token) for p in res.peers):
        lines.append(f"llama.cpp on {name}: {per_token:,} bytes per token" + "".join(
            f"; {p.error}" + (f" (at {p.prompt_tokens} tokens)" if lengths else "")
            for p in res.peers if p.name == name and p.error))
    lines += [
             f"page cache: {e.huge_pages:.1%} of the model file{f' of gemma[{e.wtype}]' if len(files) > 1 else ''}"
             " in 2 MB pages (./gemma maps the rest 4 KB at a time, in the prompt's time)" for e in files]
    lines += [
             "prompt FLOPs per token: " + ", ".join(f"{e.flops_per_prompt_token / 1e9:.4g} G"
                                                   + (f" ({e.label})" if several else "") for e in res.engines)
             + f"; {res.fma_name()}, measured, GFLOP/s: " + (", ".join(f"{_num(p, 1)} on {t} thread(s)"
                                                                   for t, p in res.fma_peak.items()) or "n/a"),
             f"{_load(res.load, m.cpus)}; best of {res.repeat} round(s)"
             + ("; BUSY: every figure is a lower bound" if max(res.load) >= m.cpus else ""),
             f"llama.cpp: {res.llama_source}"]
    lines += [f"MEASUREMENT FAULT: {f} (decode efficiency above 1: the bandwidth measured was not the "
              "ceiling)" for f in res.faults()]
    threads = [f.threads for f in res.engines[0].figures]
    rows: list[tuple[str, list[str]]] = [
        ("threads", [str(t) for t in threads]),
        ("memory read bandwidth GB/s", [_num(res.bandwidth[t]) for t in threads]),
        ("  (before each round / after)",
         [" / ".join(_num(b, 1) for b in res.bandwidth_runs[t]) for t in threads]),
        ("  (fastest read loop)", [res.bandwidth_loop.get(t, "n/a") for t in threads]),
    ]
    for e in res.engines:
        g, name = e.figures, e.label
        rows += [
            (f"{name} prompt tokens/s", [_num(f.prompt_tps) for f in g]),
            (f"{name} decode tokens/s", [_num(f.decode_tps) for f in g]),
        ]
        if e.image:  # --compare-image / --compare: the second program, round by round
            other = f"{name} {res.image_label}"
            rows += [(f"{name} {what} tokens/s, each round", _each(e.rounds, what)) for what in ("prompt", "decode")]
            rows += [(f"{other} {what} tokens/s", [_num(getattr(f, f"{what}_tps")) for f in e.image])
                     for what in ("prompt", "decode")]
            rows += [(f"{other} {what} tokens/s, each round", _each(e.image_rounds, what))
                     for what in ("prompt", "decode")]
            rows += _ratios(name, g, other, e.image)
            for what in ("prompt", "decode"):
                each = [[getattr(x, f"{what}_tps") / getattr(y, f"{what}_tps") for x, y in zip(xs, ys)]
                        for xs, ys in zip(e.rounds, e.image_rounds)]
                rows += [(f"{what} ratio {name}/{other}, each round", [" / ".join(_num(r, 3) for r in rs) for rs in each]),
                         (f"{what} ratio {name}/{other}, median of the rounds", [_num(median(rs), 3) for rs in each])]
        rows += [
            (f"{name} decode efficiency", [_eff(res.efficiency(f, e.bytes_per_token)) for f in g]),
            (f"{name} decode kernel in cache GB/s",
             [_num(e.kernel[f.threads]) if f.threads in e.kernel else "n/a" for f in g]),
            (f"{name} decode / kernel in cache", [_frac(res.kernel_fraction(f, e)) for f in g]),
            (f"{name} prompt / decode", [_num(f.prompt_tps / f.decode_tps, 1) for f in g]),
            (f"{name} prompt / {res.fma_name()}", [_frac(res.fma_fraction(f, e)) for f in g]),
            (f"{name} prompt kernel in cache GFLOP/s",
             [_num(e.prompt_kernel[f.threads]) if f.threads in e.prompt_kernel else "n/a" for f in g]),
            (f"{name} prompt / kernel in cache", [_frac(res.prompt_kernel_fraction(f, e)) for f in g]),
            (f"{name} peak RSS MB", [_mb(f.peak_rss) for f in g]),
            (f"{name} peak anonymous MB", [_mb(f.peak_anon) for f in g]),
            ("tokens: prompt, decoded" + (f" ({name})" if several else ""),
             [f"{f.n_prompt}, {f.n_decode}" for f in g]),
            (f"{name} major page faults", [f"{f.major_faults:,}" for f in g]),
        ]
    for e in res.engines:  # each length against the first on its model; each model against the first
        for base in _bases(res, e):
            rows += _ratios(e.label, e.figures, base.label, base.figures)
    for p in res.peers:
        if not p.figures:
            continue
        ll, name = {f.threads: f for f in p.figures}, peer_label(res, p)
        rows += [
            (f"{name} prompt tokens/s", [_num(ll[t].prompt_tps) for t in threads]),
            (f"{name} decode tokens/s", [_num(ll[t].decode_tps) for t in threads]),
            (f"{name} decode efficiency", [_eff(res.efficiency(ll[t], p.bytes_per_token)) for t in threads]),
            (f"{name} peak RSS MB", [_mb(ll[t].peak_rss) for t in threads]),
            (f"{name} major page faults", [f"{ll[t].major_faults:,}" for t in threads]),
        ]
        for mine in (res.engines[i] for i in p.engines):
            rows += _ratios(mine.label, mine.figures, name, [ll[t] for t in threads])
    return "\n".join(lines + _aligned(rows) + startup_lines(res.startup, res.startup_b))


def _files(res: Result) -> list[Engine]:
    """The first engine on each model file (the others run it at other prompt lengths)."""
    return [e for e in res.engines if e is next(b for b in res.engines if b.model == e.model)]


def _bases(res: Result, e: Engine) -> list[Engine]:
    """The engines e is compared with: the first on its model file (so at the first prompt
    length) and the first at its prompt length (on the first model file), each unless e."""
    same_model = next(b for b in res.engines if b.model == e.model)
    same_length = next(b for b in res.engines if b.prompt_tokens == e.prompt_tokens)
    return [b for b in (same_model, same_length) if b is not e]


def _each(rounds: list[list[Figures]], what: str) -> list[str]:
    """Per thread count, each round's prompt or decode tokens/s: "a / b / c"."""
    return [" / ".join(_num(getattr(f, f"{what}_tps"), 1) for f in runs) for runs in rounds]


def _ratios(a: str, a_figs: list[Figures], b: str, b_figs: list[Figures]) -> list[tuple[str, list[str]]]:
    """The rows "prompt ratio A/B" and "decode ratio A/B", per thread count."""
    return [(f"{what} ratio {a}/{b}", [_num(getattr(x, f"{what}_tps") / getattr(y, f"{what}_tps"), 3)
                                       for x, y in zip(a_figs, b_figs)]) for what in ("prompt", "decode")]


def peer_label(res: Result, p: Peer) -> str:
    """"llama.cpp", with several GGUFs "llama.cpp[NAME]", with several prompt lengths followed
    by "@LENGTH" (as the engines' labels)."""
    files = len({q.name for q in res.peers}) > 1
    lengths = len({e.prompt_tokens for e in res.engines}) > 1
    return "llama.cpp" + (f"[{p.name}]" if files else "") + (f"@{p.prompt_tokens}" if lengths else "")


def plot(res: Result, path: Path) -> None:
    """Tokens/s against threads, decode and prompt, both engines, and the bandwidth bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "decode_tps", "decode"), (axes[1], "prompt_tps", "prompt")):
        for name, figs in [(e.label, e.figures) for e in res.engines] + \
                [(peer_label(res, p), p.figures) for p in res.peers]:
            if figs:
                ax.plot([f.threads for f in figs], [getattr(f, key) for f in figs], "o-",
                        label=name)
        if key == "decode_tps":
            ts = sorted(res.bandwidth)
            for e in _files(res):
                ax.plot(ts, [res.bandwidth[t] * 1e9 / e.bytes_per_token for t in ts], "--",
                        label=f"bandwidth / {e.label} bytes per token (limit)")
        ax.set(title=f"{title} ({res.preset})", xlabel="threads", ylabel="tokens/s")
        ax.set_xticks(sorted(res.bandwidth))
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
