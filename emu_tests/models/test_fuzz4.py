"""The version 4 mutators (emu_tests/fuzz/mutate4.py) against the Python reader: on two bases
(tiny_g4 in FP16: every opcode, PLE, KV sharing, layer scalars; tiny_g3 in Q8_0: Gemma 3's
program with Q8_0 weights), every systematic case and seeded random ones. A case that must be
refused is refused with one line (ModelFormatError), a case that must be accepted is accepted,
and every other ends in one of the two, never in another exception. The mutators decide most
cases by construction from the page's rules (scalars any bits, unused fields ignored, MATMUL's
gate by s2, K and V written earlier), so the reader's acceptance is held to exactly those rules;
each family decides cases both ways but the scalars and the op flags, which every rule accepts.
The engine is held to the same verdicts by the lead's fuzz runner."""
from __future__ import annotations

from collections import Counter

import pytest

from builder.models.convert import convert
from builder.models.modelfile import ModelFormatError
from builder.models.modelfile4 import ModelFile4
from fuzz.mutate4 import FAMILIES, Base4, make_cases4, write_case4
from modelfiles import fixture_path

SEED, COUNT = 20261206, 3000
ACCEPTED = ("scalars", "op_flags")  # any float32 bits; ACC where read, every other bit ignored


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz4")
    convert(fixture_path("tiny_g4"), d / "g4.bin", progress=False, version=4)
    convert(fixture_path("tiny_g3"), d / "g3q.bin", progress=False, wtype="q8_0", version=4)
    return {"tiny_g4": Base4.load(d / "g4.bin"), "tiny_g3_q8": Base4.load(d / "g3q.bin")}


def test_cases_are_seeded(bases):
    a, b = make_cases4(bases, SEED, 400), make_cases4(bases, SEED, 400)
    assert a == b and len(a) == 400
    assert make_cases4(bases, SEED, COUNT)[-50:] != make_cases4(bases, SEED + 1, COUNT)[-50:]


def test_every_case_as_the_reader_judges_it(bases, tmp_path):
    cases = make_cases4(bases, SEED, COUNT)
    wrong, verdicts = [], Counter()
    for k, case in enumerate(cases):
        path = tmp_path / "case.bin"
        write_case4(path, bases[case.model], case)
        try:
            ModelFile4(path)
            refused = False
        except ModelFormatError as e:
            refused = True
            if "\n" in str(e):
                wrong.append(f"case {k}: message of more than one line: {case.recipe()}")
        except Exception as e:  # noqa: BLE001 -- any other exception is the failure looked for
            wrong.append(f"case {k}: {type(e).__name__}: {e}: {case.recipe()}")
            continue
        if (case.reject and not refused) or (case.accept and refused):
            wrong.append(f"case {k}: {'accepted' if not refused else 'refused'}: {case.recipe()}")
        family = case.label.split(":")[0].split(" #")[0]
        verdicts[family, "reject" if case.reject else "accept" if case.accept else "either", refused] += 1
    assert not wrong, f"{len(wrong)} of {len(cases)} cases misjudged:\n" + "\n".join(wrong[:20])
    decided = Counter({(f, v): n for (f, v, _), n in verdicts.items() if v != "either"})
    for family in FAMILIES:
        assert decided[family, "accept"], f"{family}: no case decided to be accepted {verdicts}"
        assert decided[family, "reject"] or family in ACCEPTED, f"{family}: no case decided to be refused {verdicts}"
    assert sum(n for (_, v), n in decided.items() if v == "reject") > 1000, verdicts
    assert sum(n for (_, v), n in decided.items() if v == "accept") > 1000, verdicts
    assert verdicts["random", "either", True] and verdicts["random", "either", False], verdicts  # both outcomes
