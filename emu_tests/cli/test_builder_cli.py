"""`python -m builder`'s own command line: --help names every command with its line,
--version prints the installed version, and every command answers --help. And what the model
tools and the demo tell a new user: convert's help names every generation it converts, a model
file given to convert says what it is, a file ./gemma cannot run gets one line of warning, and
the demo builds ./gemma only when a source is newer."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from builder import demo
from builder.__main__ import COMMANDS
from builder.asm.build import REPO_ROOT
from builder.cli import ENGINE_VERSION
from emu_tests.asm_facts import constant
from modelfiles import fixture_path


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
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"python -m builder convert: error: {tmp_path / 't.bin'}: a gemma model file already (magic "
               f"GEMMAASM, version 4; ./gemma -m runs version {ENGINE_VERSION}), not a Hugging Face directory "
               "or GGUF file\n")
    r = builder("synth", "--preset", "tiny", "-q", "-o", str(tmp_path / "none" / "x.bin"))
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"python -m builder synth: error: {tmp_path / 'none' / 'x.bin'}: No such file or directory\n")


def test_convert_help_names_every_generation():
    r = builder("convert", "--help")
    assert r.returncode == 0 and "Convert a Gemma 1, 2, 3 or 4 checkpoint" in " ".join(r.stdout.split())


def test_engine_version_is_the_one_format_asm_reads():
    """The version the warning below compares with is the engine's own."""
    assert ENGINE_VERSION == constant("MODEL_VERSION")


def warning(prog: str, out, version: int) -> str:
    """What convert or synth print on stderr after writing a file of this version."""
    return "" if version == ENGINE_VERSION else (
        f"python -m builder {prog}: warning: ./gemma cannot run {out} yet: it is model file version "
        f"{version}, this build's engine runs version {ENGINE_VERSION}\n")


@pytest.mark.parametrize("prog, args, version", [
    ("synth", ["--preset", "tiny-g3"], 4), ("synth", ["--preset", "tiny-g3", "--format", "2"], 2),
    ("synth", ["--preset", "tiny-g4", "--format", "3"], 3),
    ("convert", [str(fixture_path("tiny_wide"))], 4),
    ("convert", [str(fixture_path("tiny_wide")), "--format", "2"], 2),
    ("convert", [str(fixture_path("tiny_wide")), "--format", "3"], 3)])
def test_a_file_the_engine_cannot_run_is_written_with_one_line_of_warning(tmp_path, prog, args, version):
    """Every file is written and summarised on stdout, status 0; one it is not ENGINE_VERSION's
    (`--format 2` or `3`) also gets one warning line on stderr."""
    out = tmp_path / "m.bin"
    r = builder(prog, *args, "-q", "-o", str(out))
    assert (r.returncode, r.stderr) == (0, warning(prog, out, version)), r.stderr
    assert r.stdout.startswith(f"wrote {out}: ") and out.read_bytes()[8] == version


def test_a_gemma4_file_is_written_without_a_warning(tmp_path):
    """A version 4 Gemma 4 file (its tokenizer merges by rank) is written and summarised with no
    warning: the engine runs it (test_engine_gemma4)."""
    out = tmp_path / "g4.bin"
    r = builder("convert", str(fixture_path("tiny_g4k")), "-q", "-o", str(out))
    assert (r.returncode, r.stderr) == (0, ""), r
    assert r.stdout.startswith(f"wrote {out}: ") and "(Gemma 4)" in r.stdout, r.stdout


@pytest.mark.parametrize("prog, args", [("convert", [str(fixture_path("tiny_g4moe"))]),
                                        ("synth", ["--preset", "tiny-g4"])])
def test_a_moe_file_is_written_with_one_line_of_warning_and_the_engine_refuses_it(tmp_path, gemma, prog, args):
    """A Gemma 4 MoE model is written as version 4 (its experts as ROUTE, SKIP and WADD ops),
    with one warning line: the ops are not in ENGINE_OPS, and ./gemma refuses the file in one
    line, exit 1, no signal."""
    out = tmp_path / "moe.bin"
    r = builder(prog, *args, "-q", "-o", str(out))
    assert (r.returncode, r.stderr) == (0, (
        f"python -m builder {prog}: warning: ./gemma cannot run {out} yet: its program has ROUTE, SKIP, WADD "
        "(MoE), which this build's engine lacks (it refuses the file: bad program); the numpy twins and "
        "`show` run it\n")), r.stderr
    assert r.stdout.startswith(f"wrote {out}: ") and "(Gemma 4)" in r.stdout, r.stdout
    e = subprocess.run([str(gemma.binary), "-m", str(out), "-p", "hi"], capture_output=True, timeout=60)
    assert (e.returncode, e.stdout, e.stderr) == (1, b"", b"gemma: bad program\n")


def test_demo_builds_the_engine_only_when_a_source_is_newer(tmp_path, monkeypatch):
    """./gemma missing: built; then reused while no source is newer; an asm/ source or the
    builder's or linker's Python touched later: built again."""
    for name in ("asm/main.asm", "builder/asm/build.py", "linker/link.py", "builder/demo.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1000, 1000))
    builds = []

    def fake_build(root):
        builds.append(root)
        (root / "gemma").write_bytes(b"")
        os.utime(root / "gemma", (2000, 2000))
        return SimpleNamespace(binary=root / "gemma")
    monkeypatch.setattr(demo, "build", fake_build)
    assert demo.engine_binary(tmp_path) == tmp_path / "gemma" and len(builds) == 1
    assert demo.engine_binary(tmp_path) == tmp_path / "gemma" and len(builds) == 1
    os.utime(tmp_path / "builder/demo.py", (3000, 3000))  # not a source of the build
    assert demo.engine_binary(tmp_path) == tmp_path / "gemma" and len(builds) == 1
    sources = ("asm/main.asm", "builder/asm/build.py", "linker/link.py")
    for n, name in enumerate(sources, 2):  # each alone newer than ./gemma (built at 2000)
        for other in sources:
            os.utime(tmp_path / other, (1000, 1000))
        os.utime(tmp_path / name, (3000, 3000))
        demo.engine_binary(tmp_path)
        assert len(builds) == n, name
    assert {s.relative_to(tmp_path).as_posix() for s in demo.build_sources(tmp_path)} == {
        "asm/main.asm", "builder/asm/build.py", "linker/link.py"}
