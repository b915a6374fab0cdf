"""llama.cpp on the same weights, for `python -m builder bench`.

Two ways in, both run as a separate process (its own address space, its own peak RSS):
- `python -m builder.bench.llama GGUF --threads T --ids 2,651,... -n N --out FILE` uses the
  `llama-cpp-python` package: loads the GGUF (mmap), warms up with one token, then times
  `eval(ids)` (the whole prompt in one batch, logits of the last position only, as llama.cpp
  does) and N single-token `eval`s, each fed the argmax of the previous logits (greedy, like
  the engine at --temp 0). Writes {"prompt_tps", "decode_tps", "n_prompt", "n_decode"} as JSON.
- `llama_bench_argv(...)` / `parse_llama_bench(...)`: a `llama-bench` binary given by path,
  `-p P -n N -r 1 -o json` (its prompt test and its generation test; its prompt tokens are
  random ids of the same count).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def available() -> str | None:
    """None when the llama-cpp-python package imports, else why not (one line)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # ImportError, or the shared library failing to load
        return f"llama-cpp-python is not installed ({type(e).__name__}: {e})".splitlines()[0]
    return None


def measure(gguf: Path, threads: int, ids: list[int], n: int) -> dict:
    """Prompt and decode tokens/s of llama.cpp through llama-cpp-python (see module docstring)."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=len(ids) + n + 8,
                          n_batch=max(512, len(ids)), n_threads=threads,
                          n_threads_batch=threads, use_mmap=True, verbose=False)
    vocab = llm.n_vocab()

    def greedy() -> int:
        row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.ctypeslib.as_array(row, shape=(vocab,)).argmax())

    llm.eval(ids[:1])  # warm-up: first-use allocations, as llama-bench does
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    for _ in range(n):
        llm.eval([greedy()])
    t2 = time.perf_counter()
    return {"prompt_tps": len(ids) / (t1 - t0), "decode_tps": n / (t2 - t1),
            "n_prompt": len(ids), "n_decode": n}


def llama_bench_argv(binary: Path, gguf: Path, threads: int, n_prompt: int, n: int) -> list[str]:
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(n_prompt), "-n", str(n),
            "-r", "1", "-o", "json"]


def parse_llama_bench(text: str) -> dict:
    """llama-bench's JSON output -> the same dict as `measure`."""
    out = {}
    for test in json.loads(text):
        if test.get("n_gen", 0) == 0:
            out.update(prompt_tps=float(test["avg_ts"]), n_prompt=int(test["n_prompt"]))
        else:
            out.update(decode_tps=float(test["avg_ts"]), n_decode=int(test["n_gen"]))
    if len(out) != 4:
        raise ValueError("llama-bench output lacks a prompt or a generation test")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m builder.bench.llama",
                                 description="Time llama.cpp (llama-cpp-python) on a GGUF.")
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--ids", required=True, help="prompt token ids, comma-separated")
    ap.add_argument("-n", type=int, required=True, help="tokens to generate")
    ap.add_argument("--out", type=Path, required=True, help="JSON result file")
    a = ap.parse_args(argv)
    try:
        result = measure(a.gguf, a.threads, [int(i) for i in a.ids.split(",")], a.n)
    except Exception as e:  # llama.cpp reports load failures as ValueError etc.
        print(f"bench_llama: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    a.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
