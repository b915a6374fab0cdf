"""FASM parity: the same asm/ sources through fasm 1.73 (`fasm asm/gemma.asm OUT`), the
independent assembler, give a program that behaves like ours and is the same code.

- Behaviour: fasm's executable, our image (gemma.elf) and our packed program run on the same
  inputs (no arguments, bad flags, missing and truncated model files, real prompts on a
  converted fixture model, --tokens, --logits) and must give the same stdout, stderr, exit
  status (and --logits file). (fasm cannot pack: its program is the image's twin.)
- Code: walking our statement list over fasm's file (fasm lays its code right after the
  program headers), every instruction fasm encoded must have the same mnemonic and register
  operands (capstone) as ours, every data statement the same bytes when evaluated at fasm's
  addresses, and the walk must land on fasm's entry point and end where its code segment
  ends.

Both builds are made from one copy of asm/ (other work may edit the sources meanwhile).
fasm is required: CI installs it (.ci/run); a missing fasm fails, it never skips.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from capstone import CS_ARCH_X86, CS_MODE_64, Cs
from capstone import x86 as csx86

from builder.asm.assemble import SymbolEnv, data_bytes
from builder.asm.build import REPO_ROOT, BuildResult, build
from builder.asm.errors import BuildError
from builder.asm.expr import evaluate
from builder.asm.fasm import Align, Const, Data, Instr, Label
from modelfiles import convert_fixture

PT_LOAD = 1


@dataclass
class Pair:
    """Both builds of one snapshot of asm/: ours (a BuildResult) and fasm's executable."""
    ours: BuildResult
    fasm: Path


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Pair:
    """A copy of asm/ (the sources may change while tests run) built by both assemblers."""
    fasm = shutil.which("fasm")
    if fasm is None:
        pytest.fail("fasm is not installed: the FASM parity test needs it (Debian package "
                    "`fasm`: apt-get install fasm; .ci/run installs it)", pytrace=False)
    root = tmp_path_factory.mktemp("parity")
    shutil.copytree(REPO_ROOT / "asm", root / "asm")
    shutil.copy(REPO_ROOT / "pyproject.toml", root)
    try:
        ours = build(root, root / "ours" / "gemma")
    except BuildError as exc:
        failure = str(exc)
    else:
        out = root / "fasm" / "gemma"
        out.parent.mkdir()
        proc = subprocess.run([fasm, "asm/gemma.asm", str(out)], cwd=root,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"fasm rejected the sources:\n{proc.stdout}{proc.stderr}"
        out.chmod(0o755)
        return Pair(ours, out)
    pytest.fail(f"python -m builder failed: {failure}", pytrace=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return convert_fixture("tiny_mqa", "hf", tmp_path_factory.mktemp("parity-model"))


@pytest.fixture(scope="module")
def truncated_model(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("parity-bad") / "truncated.bin"
    path.write_bytes(model.read_bytes()[:1000])
    return path


CASES = {
    "no arguments": [],
    "unknown flag": ["--bogus"],
    "missing value": ["-m"],
    "missing model": ["-m", "/nonexistent/model.bin"],
    "bad number": ["-m", "{model}", "-n", "12x"],
    "truncated model": ["-m", "{truncated}"],
    "tokens": ["-m", "{model}", "--tokens", "-p", "The quick brown fox"],
    "greedy": ["-m", "{model}", "-p", "Hello world", "-n", "8"],
    "sampled": ["-m", "{model}", "-p", "Once upon", "-n", "6", "--temp", "0.8", "-s", "7",
                "--top-p", "0.9"],
    "logits": ["-m", "{model}", "-p", "hi", "-n", "2", "--logits", "{logits}"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_behaviour_as_fasm_build(builds, model, truncated_model, tmp_path, case):
    results = []
    for name, binary in (("ours", builds.ours.binary), ("fasm", builds.fasm),
                         ("image", builds.ours.elf)):
        logits = tmp_path / f"{name}.logits"
        argv = [a.format(model=model, truncated=truncated_model, logits=logits)
                for a in CASES[case]]
        proc = subprocess.run([str(binary), *argv], capture_output=True, timeout=120)
        results.append((proc.returncode, proc.stdout, proc.stderr,
                        logits.read_bytes() if logits.exists() else None))
    ours, *others = results
    for name, theirs in zip(("fasm's", "the image's"), others):
        for what, a, b in zip(("exit status", "stdout", "stderr", "logits file"), ours, theirs):
            assert a == b, f"{case}: {what} differs: ours {a!r:.300}, {name} {b!r:.300}"
    assert ours[0] >= 0, f"{case}: killed by signal {-ours[0]}"


def _program_headers(elf: bytes) -> tuple[int, int, list[tuple]]:
    """(entry, end of the program headers, PT_LOAD (flags, offset, vaddr, filesz))."""
    entry, phoff = struct.unpack_from("<QQ", elf, 24)
    phentsize, phnum = struct.unpack_from("<HH", elf, 54)
    loads = []
    for i in range(phnum):
        p_type, flags, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", elf,
                                                                     phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((flags, offset, vaddr, filesz))
    return entry, phoff + phnum * phentsize, loads


def _shape(insn) -> tuple:
    """Mnemonic and register operands (registers inside memory operands as a set)."""
    regs = []
    for op in insn.operands:
        if op.type == csx86.X86_OP_REG:
            regs.append(insn.reg_name(op.reg))
        elif op.type == csx86.X86_OP_MEM:
            regs.append(sorted({insn.reg_name(r) for r in (op.mem.base, op.mem.index) if r}))
    return insn.mnemonic, regs


def _text(insns) -> str:
    return "; ".join(f"{i.mnemonic} {i.op_str}".strip() for i in insns)


def test_same_code_and_data_as_fasm_build(builds):
    image = builds.ours.image
    elf = builds.fasm.read_bytes()
    entry, code_start, loads = _program_headers(elf)
    (_, text_off, text_vaddr, text_filesz), *rest = loads
    segments = {"text": (text_vaddr + code_start - text_off, code_start)}
    if rest:
        segments["data"] = (rest[0][2], rest[0][1])
    md = Cs(CS_ARCH_X86, CS_MODE_64)
    md.detail = True
    ours_env = SymbolEnv(image.program, image.symbols)

    # 1. fasm's address of every statement: its instruction lengths, our data sizes.
    where_fasm, fasm_insn, cursor = {}, {}, {}
    for n, p in enumerate(image.placed):
        vaddr, offset = segments[p.segment]
        addr = cursor.setdefault(p.segment, vaddr)
        where_fasm[n] = addr
        s = p.stmt
        if isinstance(s, Instr):
            # as many instructions as ours (fstsw and the like are `wait` + fnstsw)
            count = len(list(md.disasm(p.data[:len(p.data) - p.pad], p.address)))
            file_at = offset + addr - vaddr
            insns = list(md.disasm(elf[file_at:file_at + 15 * count], addr, count))
            assert len(insns) == count, f"{s.where}: fasm's bytes at {addr:#x} do not decode"
            fasm_insn[n] = insns
            size = sum(i.size for i in insns)
        elif isinstance(s, Align):
            boundary = evaluate(s.boundary, ours_env.at(s.where, p.address), s.where)
            size = -addr % boundary.number(s.where)
        else:
            size = p.size
        cursor[p.segment] = addr + size
    assert cursor["text"] == text_vaddr + text_filesz, "walk does not end at fasm's code end"
    fasm_env = SymbolEnv(image.program, {p.stmt.name: where_fasm[n]
                                         for n, p in enumerate(image.placed)
                                         if isinstance(p.stmt, (Label, Const))})
    entry_name = image.program.entry[0]
    assert fasm_env.value(entry_name) == entry, "walk does not reach fasm's entry point"

    # 2. the same instructions and data.
    differences = []
    for n, p in enumerate(image.placed):
        s = p.stmt
        if isinstance(s, Instr):
            ours = list(md.disasm(p.data[:len(p.data) - p.pad], p.address))
            theirs = fasm_insn[n]
            if [_shape(i) for i in ours] != [_shape(i) for i in theirs]:
                differences.append(f"{s.where} '{s.text}': ours '{_text(ours)}', "
                                   f"fasm '{_text(theirs)}'")
        elif isinstance(s, Data):
            vaddr, offset = segments[p.segment]
            want = data_bytes(s, fasm_env, where_fasm[n])
            got = elf[offset + where_fasm[n] - vaddr:][:len(want)]
            if want != got:
                differences.append(f"{s.where}: data {want.hex()[:64]} vs fasm {got.hex()[:64]}")
    count = sum(isinstance(p.stmt, Instr) for p in image.placed)
    assert not differences, (f"{len(differences)} of {count} instructions/data differ from "
                             "fasm's build:\n" + "\n".join(differences[:20]))
