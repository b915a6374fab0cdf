"""`python -m emu_tests.fuzz`: run the fuzz suite (or more of it), or replay single cases.

  python -m emu_tests.fuzz --binary ./gemma                      # what test_fuzz runs
  python -m emu_tests.fuzz --binary ./gemma --seed 5 --cases 100000 --seconds 900
  python -m emu_tests.fuzz --binary ./gemma --case 1234 --write /tmp/case.bin
  python -m emu_tests.fuzz --binary ./gemma --qemu Nehalem --cases 3000
A replayed case prints its recipe (model, edits, argv) and its outcome; --write saves its
model file. Case numbers are those of test_fuzz's report for the same seed and count.
Under --qemu the cases with an address-space limit are left out (the limit binds qemu itself,
which then cannot even load its libraries) and a run may take 120 s (emulated runs are ~30x
slower, a generation on two threads up to ~200x: 0.3 s natively, 58 s under qemu); test_fuzz's
qemu run picks its cases so.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from . import suite
from .model import read_prefix, write_case
from .runner import run


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m emu_tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=Path("gemma"), help="engine to run")
    ap.add_argument("--seed", type=int, default=suite.SEED)
    ap.add_argument("--cases", type=int, default=suite.CASES, help="number of cases")
    ap.add_argument("--seconds", type=float, help="start no case after this long")
    ap.add_argument("--timeout", type=float, help="per-case limit (s; default 10, 120 with "
                    "--qemu)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--qemu", metavar="CPU", help="run under qemu-x86_64 -cpu CPU (Nehalem: "
                    "the baseline instruction set)")
    ap.add_argument("--case", type=int, action="append", help="run only this case (repeatable)")
    ap.add_argument("--write", type=Path, help="with --case: write its model file here "
                    "(sparse where the weights are a hole)")
    args = ap.parse_args(argv)
    if not args.binary.is_file():
        print(f"fuzz: no binary at {args.binary}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gemma-fuzz-") as tmp:
        models = suite.models(Path(tmp))
        cases = suite.cases(models, args.seed, max([args.cases] + [c + 1 for c in args.case or []]))
        index = args.case or [i for i, c in enumerate(cases) if not (args.qemu and c.memory)]
        if len(index) < len(cases) and not args.case:
            print(f"--qemu: {len(cases) - len(index)} cases with an address-space limit left out")
        timeout = args.timeout or (120.0 if args.qemu else 10.0)
        for i in args.case or []:
            print(f"case {i}: {cases[i].recipe()}")
        if args.write and args.case:
            case = cases[args.case[0]]
            write_case(args.write, *read_prefix(models[case.model]), case.edits, case.size)
        report = run(args.binary.resolve(), models, [cases[i] for i in index], Path(tmp),
                     args.workers, timeout, args.seconds, keep=bool(args.case),
                     launcher=("qemu-x86_64", "-cpu", args.qemu) if args.qemu else ())
        for k, o in report.outcomes.items():
            print(f"case {index[k]}: status {o.status}, {o.seconds:.3f} s, stderr {o.stderr!r}, "
                  f"stdout {o.stdout[:100]!r}")
        for f in report.failures:
            f.index = index[f.index]
            print(f)
        print(report.summary())
        return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
