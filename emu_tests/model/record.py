"""Record the CPU's outputs for every instruction form (forms.FORMS) into forms.RECORD, so
that hosts without AVX-512 still check the model against a real CPU.

    python -m emu_tests.model.record

Needs every feature the forms need (an AVX-512 host with VNNI); run it after adding a form or
changing how inputs are drawn, and commit the file.
"""
from __future__ import annotations

import sys

import numpy as np

from builder.bench.machine import cpu_flags
from emu_tests.harness import NativeRunner
from emu_tests.model.forms import FORMS, RECORD, build, inputs, record_arrays, run


def main() -> int:
    missing = set().union(*(f.features for f in FORMS)) - cpu_flags()
    if missing:
        print(f"record: this CPU lacks {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    native = NativeRunner(build(FORMS))
    arrays: dict[str, np.ndarray] = {}
    for form in FORMS:
        inp, mem = inputs(form)
        arrays |= record_arrays(form, inp, mem, *run(native, form, inp, mem))
    np.savez_compressed(RECORD, **arrays)
    print(f"wrote {RECORD} ({len(FORMS)} forms, {RECORD.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
