"""The instruction model against a real CPU, bit for bit, form by form (forms.FORMS: every
instruction the model has, in register, memory, masked, zeroing and broadcast forms).

Each form's routine (fasm-assembled, forms.build) runs TRIALS trials of inputs full of NaNs,
infinities, denormals, overflows, exact ties and every pair of special values, in Unicorn
with the model (AVX2 CPU for VEX forms, AVX-512 for EVEX ones, every access bounds-checked)
and natively where this CPU has the form's features; elsewhere the CPU's answers come from
the recording made on an AVX-512 host (forms.RECORD, `python -m emu_tests.model.record`),
which must then still describe the same inputs. Where both exist they must agree (a stale
recording fails). No tolerance: a difference names the form, the trial, the word, both
values and the inputs at that place.
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.bench.machine import cpu_flags
from emu_tests.harness import AVX2, AVX512, Emulator, NativeRunner, avx, code
from emu_tests.harness.avx_table import SEMANTICS
from emu_tests.model.forms import FORMS, MEM, Form, build, digest, inputs, load_record, run


@pytest.fixture(scope="module")
def image():
    return build(FORMS)


@pytest.fixture(scope="module")
def record():
    return load_record()


@pytest.fixture(scope="module")
def emulators(image):
    return {False: Emulator(image, cpu=AVX2), True: Emulator(image, cpu=AVX512)}


@pytest.fixture(scope="module")
def native(image):
    return NativeRunner(image)


def label(form: Form) -> str:
    return f"{form.text} ({'zmm' if form.wide else 'ymm'} harness)"


def words(raw: np.ndarray, at: int) -> str:
    return f"{int(raw[at:at + 4].view(np.uint32)[0]):#010x}" if at + 4 <= raw.size else "-"


def same(form: Form, source: str, got: tuple, want: tuple, inp: np.ndarray,
         mem: np.ndarray) -> None:
    """The model's (out, mem) against `source`'s; else name the first differing word."""
    w = form.width
    for part, g, e in (("out", got[0], want[0]), ("memory", got[1], want[1])):
        bad = np.argwhere(g.reshape(g.shape[0], -1) != e.reshape(e.shape[0], -1))
        if not bad.size:
            continue
        t, b = (int(v) for v in bad[0])
        at = b - b % 4
        where = ("memory" if part == "memory" else "register 1" if at < w
                 else "rax" if at < w + 8 else "k1")
        regs = ", ".join(f"register {r} {words(inp[t], (r - 1) * w + at)}" for r in (1, 2, 3))
        raise AssertionError(
            f"{label(form)}: {len(bad)} bytes differ; first in trial {t}, {where} bytes "
            f"{at % w}..{at % w + 4}: {source} {words(e[t], at)}, model {words(g[t], at)}; "
            f"inputs there: {regs}, memory {words(mem[t], at % w if at % w < MEM else MEM)}")


@pytest.mark.parametrize("form", FORMS, ids=label)
def test_model_gives_the_cpu_bits(form, emulators, native, record):
    inp, mem = inputs(form)
    got = run(emulators[form.wide], form, inp, mem)
    recorded = record.get(form.key)
    if form.needs <= cpu_flags():
        want = run(native, form, inp, mem)
        if recorded is not None and recorded.digest == digest(inp, mem):
            same(form, "this CPU (against the recording)",
                 (recorded.out, mem if recorded.mem is None else recorded.mem), want, inp, mem)
        same(form, "this CPU", got, want, inp, mem)
    else:
        assert recorded is not None and recorded.digest == digest(inp, mem), (
            f"{label(form)}: this CPU lacks {', '.join(sorted(form.needs - cpu_flags()))} "
            f"and the recording has no answers for these inputs: run python -m "
            f"emu_tests.model.record on a CPU with AVX-512 and VNNI")
        same(form, "the recorded CPU", got,
             (recorded.out, mem if recorded.mem is None else recorded.mem), inp, mem)


def test_recording_covers_every_form(record):
    """Every form has recorded answers for exactly its current inputs, so a host without
    AVX-512 checks the same inputs against a CPU."""
    stale = [label(f) for f in FORMS
             if f.key not in record or record[f.key].digest != digest(*inputs(f))]
    assert not stale, (f"{len(stale)} forms lack a current recording (python -m "
                       f"emu_tests.model.record on an AVX-512 host): {', '.join(stale[:5])}")


@pytest.mark.parametrize("form", FORMS, ids=label)
def test_features_are_the_sdm_ones(form, image):
    """The features the model requires (and the native runner checks) are the ones each form
    is listed with (capstone's instruction groups miss some EVEX forms)."""
    insns = code.sweep(image, image.symbol(form.key).address, 64)
    insn = insns[6 if form.wide else 4]                     # after the loads
    assert f"{insn.mnemonic} {insn.op_str}".startswith(form.text.split()[0])
    assert avx.plan(insn).features == form.features, label(form)


def test_every_modelled_instruction_has_a_form():
    """Each entry of the model's table is checked against the CPU here (CPUID and XGETBV,
    which answer for the emulated CPU, in test_model_dispatch.py)."""
    covered = {f.text.split()[0] for f in FORMS}
    missing = set(SEMANTICS) - covered - avx.SYSTEM
    assert not missing, f"instructions without a form in forms.FORMS: {sorted(missing)}"


def test_instructions_beyond_the_cpu_are_invalid(image):
    """An EVEX form on the AVX2 CPU faults as a real Haswell would (#UD), naming what it
    lacks; a VEX form runs there."""
    form = next(f for f in FORMS if f.text == "vfmadd231ps zmm1, zmm2, [rdx]")
    with pytest.raises(AssertionError, match=r"invalid instruction \(the emulated CPU, AVX2 "
                       r"\(Haswell\), lacks avx512f\) .*vmovdqu32 zmm1"):
        run(Emulator(image, cpu=AVX2), form, *inputs(form))
