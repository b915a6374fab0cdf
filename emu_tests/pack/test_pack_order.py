"""builder/asm/pack_order.py: the search for the include order of asm/gemma.asm that packs
smallest, on small trees (the real one takes 210 builds a pass), and its command line."""
from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest

from builder.asm import pack_order
from builder.asm.errors import BuildError
from conftest import PROLOGUE

# Four files; the same routine twice (calls to it are the same target offset only where it
# sits), noise that breaks the contexts, text.
FILES = {
    "noise.asm": "noise:\n" + "".join(
        f"        db {', '.join(map(str, random.Random(k).randbytes(16)))}\n" for k in range(12)),
    "twice.asm": "twice:\n" + "        add eax, ecx\n        imul eax, eax, 3\n        ret\n" * 8,
    "calls.asm": "calls:\n" + "        call twice\n        call noise\n" * 20 + "        ret\n",
    "text.asm": "words:\n" + "        db 'the quick brown fox jumps over the lazy dog', 0\n" * 6,
}
START = ["text.asm", "calls.asm", "twice.asm", "noise.asm"]   # not a local minimum
GEMMA = (PROLOGUE + "        ret\n" + "".join(f"include '{name}'\n" for name in START)
         + "segment readable writeable\ninclude 'bss.asm'\n")


@pytest.fixture
def tree(asm_tree):
    return asm_tree({"gemma.asm": GEMMA, "bss.asm": "scratch: rb 64\n", **FILES})


def includes(root) -> list[str]:
    return [line for line in (root / "asm" / "gemma.asm").read_text().splitlines()
            if line.startswith("include '") and "bss.asm" not in line]


def test_search_finds_a_local_minimum_and_writes_it(tree):
    before, size0 = includes(tree), pack_order.packed_size(tree)
    order, size, start = pack_order.search_order(tree, passes=5, progress=False)
    assert start == size0
    assert sorted(order) == sorted(before) and size < size0     # from 1,146 bytes (2026-12-06)
    text = (tree / "asm" / "gemma.asm").read_text()
    pack_order.write_order(tree, order)
    assert includes(tree) == order and pack_order.packed_size(tree) == size
    # only the code segment's include lines moved; the bss one and the rest stayed
    new = (tree / "asm" / "gemma.asm").read_text()
    assert [l for l in new.splitlines() if l not in before] == \
        [l for l in text.splitlines() if l not in before]
    # a local minimum: no single move packs smaller
    for i, j in itertools.permutations(range(len(order)), 2):
        candidate = list(order)
        candidate.insert(j, candidate.pop(i))
        pack_order.write_order(tree, candidate)
        assert pack_order.packed_size(tree) >= size, candidate


def test_write_order_refuses_other_lines(tree):
    with pytest.raises(BuildError, match="include lines changed"):
        pack_order.write_order(tree, includes(tree)[:-1] + ["include 'other.asm'"])


def test_a_tree_that_does_not_build_is_refused(asm_tree):
    root = asm_tree({"gemma.asm": GEMMA, "bss.asm": "", **FILES, "twice.asm": "twice: bogus\n"})
    with pytest.raises(BuildError, match="does not build as it is"):
        pack_order.search_order(root, passes=1, progress=False)


def test_order_command_on_a_small_tree(tree):
    proc = subprocess.run([sys.executable, "-m", "builder", "pack", "--order", "--passes",
                           "1", "--root", str(tree)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "include order found:" in proc.stdout and "bytes" in proc.stdout
    assert includes(tree) == [l for l in GEMMA.splitlines() if l.startswith("include '")
                              and "bss" not in l]            # not written without --write
    proc = subprocess.run([sys.executable, "-m", "builder", "pack", "--order", "--passes",
                           "1", "--write", "--root", str(tree)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "wrote asm/gemma.asm" in proc.stdout, proc.stderr
