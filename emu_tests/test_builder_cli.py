"""`python -m builder`'s own command line: --help names every command with its line,
--version prints the installed version, and every command answers --help."""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from builder.__main__ import COMMANDS
from builder.build import REPO_ROOT


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
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m builder"), (name, r.stderr)
