"""The version 4 mutators (emu_tests/fuzz/mutate4.py) against the Python reader: on three bases
(tiny_g4 in FP16: every opcode but the experts', PLE, KV sharing, layer scalars; tiny_g3 in
Q8_0: Gemma 3's program with Q8_0 weights; tiny_g4moe: ROUTE, SKIP and WADD), every systematic
case and seeded random ones. A case that must be
refused is refused with one line (ModelFormatError), a case that must be accepted is accepted,
and every other ends in one of the two, never in another exception. The mutators decide most
cases by construction from the page's rules (scalars any bits, unused fields ignored, MATMUL's
gate by s2, K and V written earlier), so the reader's acceptance is held to exactly those rules;
each family decides cases both ways but the scalars and the op flags, which every rule accepts.
The engine is held to the same verdicts by the lead's fuzz runner."""
from __future__ import annotations

import struct
from collections import Counter

import pytest

from builder.models.convert import convert
from builder.models.modelfile import ModelFormatError
from builder.models.modelfile4 import ModelFile4
from fuzz.mutate4 import FAMILIES, Base4, make_cases4, write_case4
from modelfiles import fixture_path

SEED, COUNT = 20261206, 4500
ACCEPTED = ("scalars", "op_flags")  # any float32 bits; ACC where read, every other bit ignored


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz4")
    convert(fixture_path("tiny_g4"), d / "g4.bin", progress=False, version=4)
    convert(fixture_path("tiny_g3"), d / "g3q.bin", progress=False, wtype="q8_0", version=4)
    convert(fixture_path("tiny_g4moe"), d / "moe.bin", progress=False, version=4)
    return {"tiny_g4": Base4.load(d / "g4.bin"), "tiny_g3_q8": Base4.load(d / "g3q.bin"),
            "tiny_g4moe": Base4.load(d / "moe.bin")}


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


def test_strings_cases_hit_every_rule(bases):
    """The strings family reaches each of the engine's rules (docs/format.md, "Strings") on its
    own and both ways: the section's size (39 bytes refused, 40 accepted), a string's length
    (257 refused in a section with room for it, 256 accepted), its end (one byte past the
    section refused, at its end accepted, u32 sums that wrap refused); and what no rule forbids
    is accepted (a string in the records, bytes that are not UTF-8). The engine is held to the
    reader's verdicts on these (fuzz.suite)."""
    cases = [c for c in make_cases4(bases, SEED, COUNT) if c.label.startswith("strings: ")]
    for name, base in bases.items():
        size = base.header["strings_size"]
        _, n = struct.unpack_from("<II", base.data, base.header["strings_off"])
        verdicts = {c.label.removeprefix("strings: "): c.reject for c in cases if c.model == name}
        assert all(c.reject != c.accept for c in cases)
        big = "strings section of 340 bytes, string 0 := "
        want = {"strings section of 39 bytes": True, "strings section of records alone, every string empty": False,
                f"{big}(40, 257)": True, f"{big}(40, 256)": False, f"{big}(84, 256)": False, f"{big}(85, 256)": True,
                f"string 0 := ({size - n + 1}, {n})": True, f"string 0 := ({size - n}, {n})": False,
                "string 0 := (4294967295, 1)": True, "string 0 := (4294967040, 256)": True,
                f"string 0 := (0, {n})": False, "string 0's first byte := 0xff": False}
        assert {k: verdicts.get(k) for k in want} == want, name
