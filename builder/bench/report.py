"""The figures of `python -m builder bench` and how they are shown: the machine, one engine
at one thread count (`Figures`), a whole run (`Result`, with the derived decode efficiency and
fraction of the FMA peak), the text table (one row per figure, one column per thread count)
and the optional plot (matplotlib, imported only when asked for).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path


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
class Peer:
    """llama.cpp on one GGUF file: the twin of the engine's weights, or another quantization."""
    name: str  # the GGUF's file name
    bytes_per_token: int  # every tensor of the GGUF once
    figures: list[Figures]  # one per thread count; empty when it failed
    error: str = ""  # why it has no figures: a crash is reported, not fatal to the run


@dataclass
class Result:
    machine: Machine
    preset: str
    engine: str  # the binary and any --engine-args
    model: str
    peers: list[Peer]
    bytes_per_token: int
    flops_per_prompt_token: float
    bandwidth: dict[int, float]  # GB/s per thread count (the highest of bandwidth_runs)
    bandwidth_runs: dict[int, list[float]]  # GB/s per thread count, before each round and after
    fma_peak: dict[int, float]  # GFLOP/s of the AVX2 FMA loop per thread count ({}: no AVX2/FMA)
    gemma: list[Figures]
    llama_source: str  # "llama-cpp-python 0.3.x", "llama-bench PATH", or why it is missing
    load: list[float]  # 1-minute load average before and after: other work on the machine
    repeat: int  # rounds; each figure is the best of them
    huge_pages: float  # fraction of the model file the kernel maps in 2 MB pages

    def efficiency(self, f: Figures, bytes_per_token: int | None = None) -> float:
        """Decode bytes/s over the bandwidth: the engine's bytes, or a peer's."""
        return (f.decode_tps * (bytes_per_token or self.bytes_per_token)
                / (self.bandwidth[f.threads] * 1e9))

    def fma_fraction(self, f: Figures) -> float | None:
        peak = self.fma_peak.get(f.threads)
        return f.prompt_tps * self.flops_per_prompt_token / (peak * 1e9) if peak else None


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


def table(res: Result) -> str:
    """The report: a few header lines, then one row per figure and one column per thread count."""
    m = res.machine
    lines = [f"machine: {m.cpu}, {m.cpus} CPUs, {_num(m.mhz, 0)} MHz, {_num(m.mem_gib, 1)} GiB, "
             f"{m.vector}",
             f"engine: {res.engine}",
             f"model: {res.model} ({res.preset})",
             f"bytes read per generated token: {res.bytes_per_token:,} (every tensor once)"]
    lines += [f"llama.cpp on {p.name}: {p.bytes_per_token:,} bytes per token"
              + (f"; {p.error}" if p.error else "") for p in res.peers]
    lines += [
             f"page cache: {res.huge_pages:.1%} of the model file in 2 MB pages (./gemma maps the "
             "rest 4 KB at a time, in the prompt's time)",
             f"prompt FLOPs per token: {res.flops_per_prompt_token / 1e9:.4g} G; AVX2 FMA peak "
             "(measured, GFLOP/s): " + (", ".join(f"{_num(p, 1)} on {t} thread(s)"
                                                  for t, p in res.fma_peak.items()) or "n/a"),
             f"load average (1 min) before / after: {res.load[0]:.2f} / {res.load[1]:.2f} "
             f"(other work on the {m.cpus} CPUs); best of {res.repeat} round(s)"
             + ("; BUSY: every figure is a lower bound" if max(res.load) >= m.cpus else ""),
             f"llama.cpp: {res.llama_source}"]
    g = {f.threads: f for f in res.gemma}
    rows: list[tuple[str, list[str]]] = [
        ("threads", [str(t) for t in g]),
        ("memory read bandwidth GB/s", [_num(res.bandwidth[t]) for t in g]),
        ("  (before each round / after)",
         [" / ".join(_num(b, 1) for b in res.bandwidth_runs[t]) for t in g]),
        ("gemma prompt tokens/s", [_num(f.prompt_tps) for f in g.values()]),
        ("gemma decode tokens/s", [_num(f.decode_tps) for f in g.values()]),
        ("gemma decode efficiency", [_num(res.efficiency(f), 3) for f in g.values()]),
        ("gemma prompt / decode", [_num(f.prompt_tps / f.decode_tps, 1) for f in g.values()]),
        ("gemma prompt / AVX2 FMA peak", [_frac(res.fma_fraction(f)) for f in g.values()]),
        ("gemma peak RSS MB", [_mb(f.peak_rss) for f in g.values()]),
        ("gemma peak anonymous MB", [_mb(f.peak_anon) for f in g.values()]),
        ("tokens: prompt, decoded", [f"{f.n_prompt}, {f.n_decode}" for f in g.values()]),
        ("gemma major page faults", [f"{f.major_faults:,}" for f in g.values()]),
    ]
    for p in res.peers:
        if not p.figures:
            continue
        ll, name = {f.threads: f for f in p.figures}, peer_label(res, p)
        rows += [
            (f"{name} prompt tokens/s", [_num(ll[t].prompt_tps) for t in g]),
            (f"{name} decode tokens/s", [_num(ll[t].decode_tps) for t in g]),
            (f"{name} decode efficiency", [_num(res.efficiency(ll[t], p.bytes_per_token), 3) for t in g]),
            (f"{name} peak RSS MB", [_mb(ll[t].peak_rss) for t in g]),
            (f"{name} major page faults", [f"{ll[t].major_faults:,}" for t in g]),
            (f"prompt ratio gemma/{name}", [_num(g[t].prompt_tps / ll[t].prompt_tps, 3) for t in g]),
            (f"decode ratio gemma/{name}", [_num(g[t].decode_tps / ll[t].decode_tps, 3) for t in g]),
        ]
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r[1][i]) for r in rows) for i in range(len(g))]
    for name, cells in rows:
        lines.append(f"{name:<{width}}  " + "  ".join(c.rjust(w) for c, w in zip(cells, cols)))
    return "\n".join(lines)


def peer_label(res: Result, p: Peer) -> str:
    """"llama.cpp", or with several GGUFs "llama.cpp[NAME]"."""
    return "llama.cpp" if len(res.peers) == 1 else f"llama.cpp[{p.name}]"


def plot(res: Result, path: Path) -> None:
    """Tokens/s against threads, decode and prompt, both engines, and the bandwidth bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "decode_tps", "decode"), (axes[1], "prompt_tps", "prompt")):
        for name, figs in [("gemma", res.gemma)] + [(peer_label(res, p), p.figures) for p in res.peers]:
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
