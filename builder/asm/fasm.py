"""The FASM-subset front end: source files -> a flat list of statements.

Contract: `parse(root, entry="gemma.asm", defines=None) -> Program` reads `root/asm/<entry>`
and the files it `include`s (paths relative to asm/) and returns every statement in source
order, each with its `Where`. `defines` ({NAME: int}) are constants defined before the first
line, as `fasm -d NAME=VALUE` defines them (the packed program's stub gets the image's
addresses this way).
Nothing is evaluated here (addresses are the assembler's business); everything that can be
judged from the text alone is: the accepted dialect is exactly the subset docs/build.md documents

  format ELF64 executable 3 | entry NAME | segment readable executable | segment readable
  writeable | include 'f.asm' | name: | .local: | NAME = expr | NAME equ tokens |
  [name] db/dw/dd/dq values | [name] rb/rw/rd/rq count | align N | [prefix] mnemonic operands
  (operands: register, [size] [address], expression, short label)

and anything else (macros, `if`, `times`, segment overrides, `ptr`, unknown words, duplicate
or reserved names, ...) raises BuildError "asm/FILE.asm:LINE: message".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import BuildError, Where
from .expr import Node, Parser, Token, tokenize
from .x86 import MNEMONICS, PREFIXES, REGISTERS, SEGMENT_REGISTERS, SIZES

DATA_UNITS = {"db": 1, "dw": 2, "dd": 4, "dq": 8}
RESERVE_UNITS = {"rb": 1, "rw": 2, "rd": 4, "rq": 8}
DIRECTIVES = {"format", "entry", "segment", "include", "align", "equ", "dup"} \
    | set(DATA_UNITS) | set(RESERVE_UNITS)
OPERATOR_WORDS = {"mod", "shl", "shr", "and", "or", "xor", "not", "ptr", "short", "near", "far"}
# fasm features deliberately left out of the subset: named so the error says so.
UNSUPPORTED = {"macro", "struc", "if", "else", "end", "repeat", "while", "times", "virtual",
               "label", "rept", "irp", "irps", "irpv", "match", "local", "common", "forward",
               "reverse", "use16", "use32", "use64", "org", "load", "store", "display", "du",
               "dt", "dp", "df", "rt", "rp", "rf", "file", "section", "public", "extrn",
               "purge", "restore", "restruc", "postpone", "fix", "define", "heap", "stack",
               "data", "assert", "break", "err", "include_once"}


@dataclass
class Reg:
    name: str


@dataclass
class Imm:
    expr: Node
    short: bool = False       # `jmp short label`: must reach with a rel8


@dataclass
class Mem:
    expr: Node
    size: int | None          # from a size operator, None if the source gave none


Operand = Reg | Imm | Mem


@dataclass
class Statement:
    where: Where


@dataclass
class Segment(Statement):
    kind: str                 # "text" or "data"


@dataclass
class Label(Statement):
    name: str                 # qualified: `.x` after `foo:` is "foo.x"
    size: int | None          # unit of a data label (`x dd ...`), else None
    local: bool


@dataclass
class Const(Statement):
    name: str
    expr: Node


@dataclass
class Data(Statement):
    unit: int                 # 1 2 4 8 for db dw dd dq
    values: list              # DataValue: ('expr', Node) | ('bytes', b) | ('float', text)
                              # | ('dup', count Node, list[DataValue])


@dataclass
class Reserve(Statement):
    unit: int
    count: Node


@dataclass
class Align(Statement):
    boundary: Node


@dataclass
class Instr(Statement):
    prefix: str | None        # rep / repne / lock (aliases normalised)
    mnemonic: str             # lower case, as written
    operands: list[Operand]
    text: str                 # the source statement, for messages


@dataclass
class Program:
    """The parsed sources: statements in order, labels and constants by name, the entry
    label."""
    statements: list[Statement] = field(default_factory=list)
    consts: dict[str, Const] = field(default_factory=dict)
    labels: dict[str, Label] = field(default_factory=dict)
    entry: tuple[str, Where] | None = None


def strip_comment(line: str) -> str:
    """The line without its `;` comment (a `;` inside quotes is text)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            return line[:i]
    return line


def render(tokens: list[Token]) -> str:
    """Tokens back as one readable statement ("mov eax, [rsi+4]"), for messages."""
    out = ""
    for tok in tokens:
        if out and tok.text not in ",])" and not out.endswith(("[", "(")) \
                and not (tok.text in "+-*" or out.endswith(("+", "-", "*"))):
            out += " "
        out += tok.text
        if tok.text == ",":
            out += " "
    return out.replace(",  ", ", ")


def reserved(name: str) -> str | None:
    """What a reserved word is ('an instruction', ...), or None if `name` is free."""
    low = name.lower()
    if low in REGISTERS or low in SEGMENT_REGISTERS:
        return "a register name"
    if low in MNEMONICS or low in PREFIXES:
        return "an instruction"
    if low in SIZES or low in DIRECTIVES or low in OPERATOR_WORDS:
        return "a reserved word"
    return None


class _Reader:
    """Parses the files of one program; holds the scope and `equ` state between lines."""

    def __init__(self, root: Path):
        self.root = root
        self.asm = root / "asm"
        self.program = Program()
        self.scope: str | None = None         # last global label
        self.equs: dict[str, list[Token]] = {}
        self.segment: str | None = None
        self.including: list[Path] = []
        self.format_seen = False

    # -- files ---------------------------------------------------------------------------
    def read_file(self, path: Path, where: Where | None) -> None:
        try:
            rel = path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            raise BuildError(f"include '{path}' is outside the project", where) from None
        if path.resolve() in self.including:
            raise BuildError(f"'{rel}' includes itself", where)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise BuildError(f"file not found: {rel}", where) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise BuildError(f"cannot read {rel}: {exc}", where) from None
        self.including.append(path.resolve())
        for number, line in enumerate(text.splitlines(), 1):
            try:
                self.line(line, Where(rel, number))
            except RecursionError:
                raise BuildError("expression nested too deeply", Where(rel, number)) from None
        self.including.pop()

    # -- names ---------------------------------------------------------------------------
    def qualify(self, name: str, where: Where) -> str:
        """A name as referenced on a line: `.x` means `<last global label>.x`."""
        if name.startswith(".") and not name.startswith(".."):
            if self.scope is None:
                raise BuildError(f"local name '{name}' has no preceding global label", where)
            return self.scope + name
        return name

    def define(self, name: str, where: Where) -> str:
        """Check a new label/constant name and return its qualified form."""
        if (what := reserved(name)):
            raise BuildError(f"'{name}' is {what} and cannot be a label or constant name", where)
        if name.startswith(".."):
            raise BuildError(f"'{name}': '..' names are not in the FASM subset", where)
        if name.startswith("."):
            if self.scope is None:
                raise BuildError(f"local label '{name}' has no preceding global label", where)
            full = self.scope + name
        else:
            full = name
        if full in self.program.labels or full in self.program.consts:
            first = (self.program.labels.get(full) or self.program.consts[full]).where
            raise BuildError(f"symbol '{full}' is already defined at {first}", where)
        return full

    def add_label(self, name: str, size: int | None, where: Where) -> None:
        full = self.define(name, where)
        self.need_segment(where)
        label = Label(where, full, size, local=name.startswith("."))
        if not label.local:
            self.scope = name
        self.program.labels[full] = label
        self.program.statements.append(label)

    def need_segment(self, where: Where) -> None:
        if self.segment is None:
            raise BuildError("code or data before the first `segment` directive", where)

    # -- lines ---------------------------------------------------------------------------
    def substitute(self, tokens: list[Token]) -> list[Token]:
        """Replace `equ` names by their tokens (like fasm's preprocessor)."""
        out: list[Token] = []
        for tok in tokens:
            if tok.kind == "id" and tok.text in self.equs:
                out.extend(self.equs[tok.text])
            else:
                out.append(tok)
        return out

    def line(self, line: str, where: Where) -> None:
        tokens = tokenize(strip_comment(line), where)
        if len(tokens) >= 2 and tokens[0].kind == "id" and tokens[1].kind == "id" \
                and tokens[1].text.lower() == "equ":
            name = tokens[0].text
            if (what := reserved(name)):
                raise BuildError(f"'{name}' is {what} and cannot be a constant name", where)
            if name in self.equs:
                raise BuildError(f"symbol '{name}' is already defined", where)
            self.equs[name] = self.substitute(tokens[2:])
            return
        p = Parser(self.substitute(tokens), where, lambda name: self.qualify(name, where))
        while p.peek() is not None and p.peek().kind == "id" and p.at(":", 1):
            self.add_label(p.take().text, None, where)
            p.take()
        if p.done():
            return
        first = p.take()
        if first.kind != "id":
            raise p.error(f"unexpected '{first.text}'")
        word = first.text.lower()
        second = p.peek()
        if second is not None and second.kind == "op" and second.text == "=":
            p.take()
            self.constant(first.text, p, where)
        elif second is not None and second.kind == "id" and not reserved(first.text) and (
                second.text.lower() in DATA_UNITS or second.text.lower() in RESERVE_UNITS):
            unit = second.text.lower()
            self.add_label(first.text, {**DATA_UNITS, **RESERVE_UNITS}[unit], where)
            p.take()
            self.directive(unit, p, where)
        elif word in DIRECTIVES:
            self.directive(word, p, where)
        elif word in UNSUPPORTED:
            raise p.error(f"'{first.text}' is not in the FASM subset")
        elif word in PREFIXES or word in MNEMONICS:
            self.instruction(word, p, where)
        else:
            raise p.error(f"unknown instruction or directive '{first.text}'")

    def constant(self, name: str, p: Parser, where: Where) -> None:
        full = self.define(name, where)
        const = Const(where, full, p.expr())
        p.end()
        self.program.consts[full] = const
        self.program.statements.append(const)

    def directive(self, word: str, p: Parser, where: Where) -> None:
        prog = self.program
        if word == "format":
            words = [t.text.lower() for t in p.tokens[p.pos:]]
            if words != ["elf64", "executable", "3"] or self.format_seen:
                raise p.error("only one `format ELF64 executable 3` is supported")
            self.format_seen = True
        elif word == "entry":
            tok = p.take()
            p.end()
            if tok.kind != "id" or prog.entry is not None:
                raise p.error("`entry` takes one label name, once")
            prog.entry = (tok.text, where)
        elif word == "segment":
            attrs = {t.text.lower() for t in p.tokens[p.pos:]}
            kind = {frozenset({"readable", "executable"}): "text",
                    frozenset({"readable", "writeable"}): "data",
                    frozenset({"readable", "writable"}): "data"}.get(frozenset(attrs))
            if kind is None or len(attrs) != len(p.tokens) - p.pos:
                raise p.error("segment must be `readable executable` or `readable writeable`")
            if not self.format_seen:
                raise p.error("`segment` before `format ELF64 executable 3`")
            seen = [s.kind for s in prog.statements if isinstance(s, Segment)]
            if kind in seen or (kind == "text" and seen):
                raise p.error("one executable segment, then one writeable segment")
            self.segment = kind
            prog.statements.append(Segment(where, kind))
        elif word == "include":
            tok = p.take()
            p.end()
            if tok.kind != "str":
                raise p.error("include takes a quoted file name")
            self.read_file(self.asm / tok.value.decode(), where)
        elif word == "align":
            self.need_segment(where)
            prog.statements.append(Align(where, p.expr()))
            p.end()
        elif word in RESERVE_UNITS:
            self.need_segment(where)
            prog.statements.append(Reserve(where, RESERVE_UNITS[word], p.expr()))
            p.end()
        elif word in DATA_UNITS:
            self.need_segment(where)
            unit = DATA_UNITS[word]
            values = self.data_list(p, unit, closing=None)
            prog.statements.append(Data(where, unit, values))
        else:                                      # equ / dup out of place
            raise p.error(f"misplaced '{word}'")

    def data_list(self, p: Parser, unit: int, closing: str | None) -> list:
        values = [self.data_value(p, unit)]
        while p.at(","):
            p.take()
            values.append(self.data_value(p, unit))
        if closing:
            p.expect(closing)
        else:
            p.end()
        return values

    def data_value(self, p: Parser, unit: int):
        tok = p.peek()
        nxt = p.peek(1)
        ends = nxt is None or (nxt.kind == "op" and nxt.text in ",)")
        if tok is not None and tok.kind == "str" and unit == 1 and ends:
            p.take()
            return ("bytes", tok.value)
        sign = ""
        if (p.at("-") or p.at("+")) and p.peek(1) is not None and p.peek(1).kind == "float":
            sign = p.take().text
            tok = p.peek()
        if tok is not None and tok.kind == "float":
            p.take()
            if unit == 1:
                raise p.error(f"float literal {tok.text} needs dw, dd or dq")
            return ("float", sign + tok.text)
        if tok is not None and tok.kind == "id" and tok.text == "?":
            raise p.error("'?' (uninitialised data) is not in the FASM subset; use rb/rw/rd/rq")
        node = p.expr()
        if p.at("dup"):
            p.take()
            if p.at("("):
                p.take()
                return ("dup", node, self.data_list(p, unit, closing=")"))
            return ("dup", node, [self.data_value(p, unit)])
        return ("expr", node)

    def instruction(self, word: str, p: Parser, where: Where) -> None:
        self.need_segment(where)
        prefix = None
        text = render(p.tokens[p.pos - 1:])
        if word in PREFIXES:
            prefix = PREFIXES[word]
            tok = p.take()
            word = tok.text.lower()
            if tok.kind != "id" or word not in MNEMONICS:
                raise p.error(f"'{tok.text}' after '{prefix}' is not an instruction")
        operands: list = []
        if not p.done():
            operands.append(self.operand(p))
            while p.at(","):
                p.take()
                operands.append(self.operand(p))
            p.end()
        self.program.statements.append(Instr(where, prefix, word, operands, text))

    def operand(self, p: Parser):
        size = None
        if p.peek() is not None and p.peek().kind == "id" and p.peek().text.lower() in SIZES:
            size = SIZES[p.take().text.lower()]
            if p.at("ptr"):
                raise p.error("fasm writes size operators without 'ptr'")
        short = p.at("short")
        if short:
            p.take()
        if p.at("near") or p.at("far"):
            raise p.error(f"'{p.peek().text}' is not in the FASM subset")
        if p.at("["):
            p.take()
            node = p.expr()
            if p.at(":"):
                raise p.error("segment overrides are not in the FASM subset")
            p.expect("]")
            return Mem(node, size)
        node = p.expr()
        if size is not None:
            raise p.error("a size operator applies to a memory operand only")
        if node[0] == "reg" and not short:
            return Reg(node[1])
        return Imm(node, short)


def parse(root: Path, entry: str = "gemma.asm",
          defines: dict[str, int] | None = None) -> Program:
    """Parse `root/asm/<entry>` and its includes (see module docstring)."""
    reader = _Reader(Path(root))
    for name, value in (defines or {}).items():
        reader.line(f"{name} = {value}", Where(f"-d {name}", 1))
    reader.read_file(reader.asm / entry, None)
    prog = reader.program
    if not reader.format_seen:
        raise BuildError(f"asm/{entry}: missing `format ELF64 executable 3`")
    if prog.entry is None:
        raise BuildError(f"asm/{entry}: missing `entry`")
    return prog
