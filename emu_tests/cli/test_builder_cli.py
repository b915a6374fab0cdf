"""`python -m builder`'s own command line: --help names every command with its line,
--version prints the installed version, and every command answers --help."""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from builder.__main__ import COMMANDS
from builder.asm.build import REPO_ROOT


def builder(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_lists_every_command(flag):
    r = builder(flag)
    assert r.returncode == 0 and not r.stderr, r.stderr
    for name, (_, line) in COMMANDS.items():
        assert f"  {name}" in r.stdout and line in r.stdout, name
    assert {"convert", "synth", "bench", "demo"} <= set(COMMANDS)


def test_version():
    r = builder("--version")
    assert (r.returncode, r.stdout) == (0, f"gemma-asm {metadata.version('gemma-asm')}\n")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help(name):
    r = builder(name, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: python -m builder {name}"), \
        (name, r.stdout[:80], r.stderr)


def test_unknown_command_names_itself_and_lists_the_commands():
    r = builder("frobnicate")
    assert r.returncode == 2 and not r.stdout
    assert r.stderr.startswith("python -m builder: unknown command 'frobnicate'\n"), r.stderr
    assert all(f"  {name}" in r.stderr for name in COMMANDS)


def test_convert_and_synth_end_with_a_summary_and_unwritable_output_is_a_sentence(tmp_path):
    # version 4 by default: 6 layers of 15 ops (norm; q, k, v; q and k norms; rope; attention;
    # output, post norm; norm; gate, up with GEGLU; down, post norm), embedding, final norm,
    # logits; slots x, xb, q, hb, hb2 and each layer's K and V
    r = builder("synth", "--preset", "tiny-g3", "-q", "-o", str(tmp_path / "t.bin"))
    assert r.returncode == 0 and r.stdout == (
        f"wrote {tmp_path / 't.bin'}: {(tmp_path / 't.bin').stat().st_size:,} bytes; version 4 (Gemma 3), "
        "vocab 1024, 93 ops on 17 slots, context 512\n"), r
    r = builder("synth", "--preset", "tiny-g3", "-q", "--format", "2", "-o", str(tmp_path / "t2.bin"))
    assert r.returncode == 0 and r.stdout == (
        f"wrote {tmp_path / 't2.bin'}: {(tmp_path / 't2.bin').stat().st_size:,} bytes; vocab 1024, "
        "d 64, ffn 192, 6 layers, 4 heads (1 kv) of 32, flags 3, f16 weights, context 512\n"), r
    r = builder("convert", str(tmp_path / "t.bin"), "-q", "-o", str(tmp_path / "none" / "x.bin"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    r = builder("synth", "--preset", "tiny", "-q", "-o", str(tmp_path / "none" / "x.bin"))
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"python -m builder synth: error: {tmp_path / 'none' / 'x.bin'}: No such file or directory\n")
