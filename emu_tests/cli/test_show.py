"""`python -m builder show`: the listing of a version 4 file, held to stored listings of three
fixtures converted from their Hugging Face directories (tiny_g3: Gemma 3; tiny_g4: Gemma 4 with
per-layer inputs, KV sharing, k = v; tiny_g4moe: Gemma 4 with experts). A listing changes when the compiler changes a program or
its layout: then read the new listing, and store it (`python -m builder show FILE >
emu_tests/cli/listings/NAME.txt`) once it is what the compiler should make. Files of another
version are refused with one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from builder.models import show
from builder.models.modelfile4 import ModelFile4
from fuzz.mutate4 import with_junk
from modelfiles import convert_fixture

LISTINGS = Path(__file__).parent / "listings"


@pytest.mark.parametrize("name", ["tiny_g3", "tiny_g4", "tiny_g4moe"])
def test_listing_is_the_stored_one(name, tmp_path, capsys):
    path = convert_fixture(name, "hf", tmp_path, 4)
    assert show.main([str(path)]) == 0
    got = capsys.readouterr().out
    want = (LISTINGS / f"{name}.txt").read_text()
    assert got == want, next(f"line {i + 1}: {a!r} != stored {b!r}" for i, (a, b) in
                             enumerate(zip(got.splitlines() + [""], want.splitlines() + [""])) if a != b)


def test_listing_names_every_operand(tmp_path):
    """Every op's line names its slots at the widths it reads them, and its weight: one line per
    op, the op's name first."""
    path = convert_fixture("tiny_g4", "hf", tmp_path, 4)
    lines = show.show(path).splitlines()
    ops = lines[lines.index("program (208 ops):") + 1:]
    assert len(ops) == 208 and ops[0].split()[1] == "EMBED" and ops[-1].split()[1] == "LOGITS"
    assert ops[10].split()[1:] == ["ATTN", "s2[4x16]", "<-", "s3[4x16]", "K", "k9[16]", "V", "k10[16]", "window", "6",
                                   "scale", "1.0", "softcap", "0.0"]


@pytest.mark.parametrize("name", ["tiny_g4", "tiny_g4moe"])
def test_listing_shows_only_what_ops_read(tmp_path, name):
    """Junk in every field an op does not read (fuzz.mutate4.junk) leaves the listing as it is."""
    path = convert_fixture(name, "hf", tmp_path, 4)
    assert show.show(with_junk(path, ModelFile4(path), tmp_path / "junk.bin")) == show.show(path)


def test_other_versions_are_refused(tmp_path, capsys):
    path = convert_fixture("tiny_g3", "hf", tmp_path, 3)
    assert show.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model file version 3: show reads version 4" in err


def test_a_file_that_breaks_a_rule_is_refused_in_one_line(tmp_path, capsys):
    """show validates first: an op with an unknown opcode is named, nothing is listed."""
    from builder.models.modelfile4 import ModelFile4
    path = convert_fixture("tiny_g3", "hf", tmp_path, 4)
    data = bytearray(path.read_bytes())
    data[ModelFile4(path).header.program_off + 48 * 5] = 13
    (tmp_path / "bad.bin").write_bytes(bytes(data))
    assert show.main([str(tmp_path / "bad.bin")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "op 5 (op13): unknown opcode 13 (known: 1 .. 12)" in err
