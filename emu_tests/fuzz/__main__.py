"""`python -m emu_tests.fuzz`: run a fuzz campaign, or replay and explain single cases.

  python -m emu_tests.fuzz --binary ./gemma --seconds 600 --cases 100000 --seed 5
  python -m emu_tests.fuzz --binary ./gemma --seed 1 --case 1234 --write /tmp/case.bin
The base model is the engine file given by --model, or the tiny_mqa fixture converted into
a temporary directory.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .model import Base
from .mutate import make_cases
from .runner import materialize, run


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m emu_tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=Path("gemma"), help="engine to run")
    ap.add_argument("--model", type=Path, help="valid engine model file to mutate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=4000, help="number of cases")
    ap.add_argument("--seconds", type=float, help="stop starting cases after this long")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-case limit (s)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--case", type=int, action="append", help="run only this case (repeatable)")
    ap.add_argument("--write", type=Path, help="with one --case: write its model file here")
    args = ap.parse_args(argv)
    if not args.binary.is_file():
        print(f"fuzz: no binary at {args.binary}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gemma-fuzz-") as tmp:
        model = args.model or base_model(Path(tmp))
        base = Base.load(model)
        count = max([args.cases] + [c + 1 for c in args.case or []])
        cases = make_cases(base, args.seed, count)
        chosen = [cases[i] for i in args.case] if args.case else cases
        if args.case:
            for i in args.case:
                print(f"case {i}: {cases[i].recipe()}")
            if args.write:
                args.write.write_bytes(materialize(base.data, cases[args.case[0]]))
        report = run(args.binary.resolve(), model, chosen, Path(tmp), args.workers,
                     args.timeout, args.seconds)
        index = args.case or range(len(cases))
        for f in report.failures:
            f.index = index[f.index]
            print(f)
        print(report.summary())
        return 1 if report.failures else 0


def base_model(tmp: Path) -> Path:
    """The tiny_mqa fixture converted (from its Hugging Face files) into `tmp`."""
    from builder.convert import convert
    out = tmp / "tiny_mqa-hf.bin"
    convert(Path(__file__).parents[1] / "fixtures" / "tiny_mqa", out, progress=False)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
