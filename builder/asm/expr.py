"""FASM tokens and expressions.

Contract:
- `tokenize(text, where) -> list[Token]`: one source line without its comment. Numbers as fasm
  writes them (123, 0x7F, 7Fh, $7F, 101b, 17o), float literals (1.0, -0.5 is unary minus and
  1.0, 1e-6), quoted strings ('a' or "a", a doubled quote escapes itself), identifiers,
  punctuation. Raises BuildError for anything else.
- `Parser(tokens, where)`: `expr()` parses one expression with fasm's operator priorities
  (lowest first: `+ -`, `* /`, `mod`, `and or xor`, `shl shr`, then unary `- + not`).
- `evaluate(node, env) -> Linear`: the value of an expression as `disp + sum(coef * reg)`;
  registers only appear inside memory operands, `Linear.number()` demands a plain number.
  `env` resolves symbol names and `$`. Division truncates toward zero and `mod` takes the sign
  of the dividend, like fasm.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .errors import BuildError, Where
from .x86 import REGISTERS, SEGMENT_REGISTERS


@dataclass(frozen=True)
class Token:
    """kind: 'num' (value int), 'float' (text), 'str' (value bytes), 'id' (text), 'op' (text)."""
    kind: str
    text: str
    value: object = None


_FLOAT = re.compile(r"\d+\.\d*(?:[eE][+-]?\d+)?(?![\w.])|\d+[eE][+-]?\d+(?![\w.])")
_NUMBER = re.compile(r"\$[0-9A-Fa-f]+(?![\w.])|\d[\w.]*")
_IDENT = re.compile(r"[A-Za-z_.?@$][\w.?@$]*")
_SPACE = re.compile(r"\s+")
_OPS = "+-*/()[],:=<>{}&|~#`!"


def parse_number(text: str, where: Where) -> int:
    """The value of a fasm integer literal."""
    low = text.lower()
    try:
        if low.startswith("$"):
            return int(low[1:], 16)
        if low.startswith("0x"):
            return int(low[2:], 16)
        if low.endswith("h"):
            return int(low[:-1], 16)
        if low.endswith("b") and set(low[:-1]) <= set("01"):
            return int(low[:-1], 2)
        if low[-1] in "oq":
            return int(low[:-1], 8)
        if low.endswith("d"):
            return int(low[:-1], 10)
        return int(low, 10)
    except ValueError:
        raise BuildError(f"invalid number '{text}'", where) from None


def tokenize(text: str, where: Where) -> list[Token]:
    """Split one line (comment already removed) into tokens."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if (m := _SPACE.match(text, pos)):
            pos = m.end()
            continue
        if ch in "'\"":
            end, chunks = pos + 1, []
            while True:
                close = text.find(ch, end)
                if close < 0:
                    raise BuildError("missing end quote", where)
                chunks.append(text[end:close])
                if text.startswith(ch, close + 1):      # doubled quote: a literal quote
                    chunks.append(ch)
                    end = close + 2
                    continue
                break
            raw = "".join(chunks)
            tokens.append(Token("str", text[pos:close + 1], raw.encode("utf-8")))
            pos = close + 1
        elif ch.isdigit() or (ch == "$" and (m := _NUMBER.match(text, pos))):
            if (m := _FLOAT.match(text, pos)):
                tokens.append(Token("float", m.group()))
            else:
                m = _NUMBER.match(text, pos)
                tokens.append(Token("num", m.group(), parse_number(m.group(), where)))
            pos = m.end()
        elif (m := _IDENT.match(text, pos)):
            tokens.append(Token("id", m.group()))
            pos = m.end()
        elif ch in _OPS:
            tokens.append(Token("op", ch))
            pos += 1
        else:
            raise BuildError(f"unexpected character '{ch}'", where)
    return tokens


# Expression trees are tuples: ('num', int) ('sym', name) ('reg', name) ('cur',)
# ('neg', node) ('not', node) ('bin', op, left, right).
Node = tuple
_BINARY = [("+", "-"), ("*", "/"), ("mod",), ("and", "or", "xor"), ("shl", "shr")]
_WORD_OPS = {"mod", "and", "or", "xor", "shl", "shr", "not"}


class Parser:
    """A cursor over a token list: the building blocks of every statement parser."""

    def __init__(self, tokens: list[Token], where: Where,
                 qualify: Callable[[str], str] = lambda name: name):
        self.tokens = tokens
        self.pos = 0
        self.where = where
        self.qualify = qualify      # turns `.local` into `parent.local`

    def error(self, message: str) -> BuildError:
        return BuildError(message, self.where)

    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def at(self, text: str, offset: int = 0) -> bool:
        """Is the next token the punctuation or (case-insensitive) word `text`?"""
        tok = self.peek(offset)
        return tok is not None and tok.kind in ("op", "id") and tok.text.lower() == text

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end of line")
        self.pos += 1
        return tok

    def expect(self, text: str) -> None:
        if not self.at(text):
            tok = self.peek()
            raise self.error(f"expected '{text}', found "
                             f"{repr(tok.text) if tok else 'end of line'}")
        self.pos += 1

    def done(self) -> bool:
        return self.pos >= len(self.tokens)

    def end(self) -> None:
        if not self.done():
            raise self.error(f"unexpected '{self.peek().text}'")

    def expr(self, level: int = 0) -> Node:
        if level == len(_BINARY):
            return self.unary()
        node = self.expr(level + 1)
        while (tok := self.peek()) is not None and tok.kind in ("op", "id") \
                and tok.text.lower() in _BINARY[level]:
            self.pos += 1
            node = ("bin", tok.text.lower(), node, self.expr(level + 1))
        return node

    def unary(self) -> Node:
        if self.at("-"):
            self.pos += 1
            return ("neg", self.unary())
        if self.at("+"):
            self.pos += 1
            return self.unary()
        if self.at("not"):
            self.pos += 1
            return ("not", self.unary())
        return self.primary()

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            return ("num", tok.value)
        if tok.kind == "str":
            if not 1 <= len(tok.value) <= 8:
                raise self.error(f"character constant {tok.text} must hold 1 to 8 bytes")
            return ("num", int.from_bytes(tok.value, "little"))
        if tok.kind == "op" and tok.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        if tok.kind == "id":
            name = tok.text
            low = name.lower()
            if name == "$":
                return ("cur",)
            if low in REGISTERS:
                if REGISTERS[low].evex and not low.startswith("zmm"):
                    raise self.error(f"'{name}' is an AVX-512 register other than zmm0-zmm31: "
                                     "not in the FASM subset")
                return ("reg", low)
            if low in SEGMENT_REGISTERS:
                raise self.error(f"segment register '{name}' is not in the FASM subset")
            if low in _WORD_OPS or low == "$$":
                raise self.error(f"'{name}' is not allowed here")
            return ("sym", self.qualify(name))
        if tok.kind == "float":
            raise self.error(f"float literal {tok.text} is only allowed in dw/dd/dq data")
        raise self.error(f"unexpected '{tok.text}' in expression")


def symbols_in(node: Node) -> list[str]:
    """Names of the symbols an expression refers to, in order."""
    if node[0] == "sym":
        return [node[1]]
    return [name for child in node[1:] if isinstance(child, tuple) for name in symbols_in(child)]


class Env(Protocol):
    """What evaluation needs: symbol values and the address of the current statement."""
    def value(self, name: str) -> int: ...
    def here(self) -> int: ...


@dataclass
class Linear:
    """disp + sum(coef * register): the value of an address expression."""
    disp: int
    regs: dict[str, int] = field(default_factory=dict)

    def number(self, where: Where) -> int:
        if self.regs:
            raise BuildError("a register is not allowed in this expression", where)
        return self.disp


def evaluate(node: Node, env: Env, where: Where) -> Linear:
    """Value of `node` (see module docstring)."""
    kind = node[0]
    if kind == "num":
        return Linear(node[1])
    if kind == "sym":
        return Linear(env.value(node[1]))
    if kind == "cur":
        return Linear(env.here())
    if kind == "reg":
        return Linear(0, {node[1]: 1})
    if kind == "neg":
        v = evaluate(node[1], env, where)
        return Linear(-v.disp, {r: -c for r, c in v.regs.items()})
    if kind == "not":
        return Linear(~evaluate(node[1], env, where).number(where))
    op, a, b = node[1], evaluate(node[2], env, where), evaluate(node[3], env, where)
    if op in "+-":
        sign = 1 if op == "+" else -1
        regs = dict(a.regs)
        for r, c in b.regs.items():
            regs[r] = regs.get(r, 0) + sign * c
        return Linear(a.disp + sign * b.disp, {r: c for r, c in regs.items() if c})
    if op == "*" and (not a.regs or not b.regs):
        scalar, vec = (a.disp, b) if not a.regs else (b.disp, a)
        return Linear(scalar * vec.disp, {r: scalar * c for r, c in vec.regs.items()})
    x, y = a.number(where), b.number(where)
    if op in ("/", "mod"):
        if y == 0:
            raise BuildError("division by zero", where)
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        return Linear(q if op == "/" else x - q * y)
    if op in ("shl", "shr"):
        if not 0 <= y < 64:
            raise BuildError(f"shift count {y} out of range", where)
        return Linear(x << y if op == "shl" else x >> y)
    return Linear({"and": x & y, "or": x | y, "xor": x ^ y}[op])
