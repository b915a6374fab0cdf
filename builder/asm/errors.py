"""The builder's one error type.

Contract: `BuildError(message, where=None)`; `str(err)` is the single line the build prints:
"asm/FILE.asm:LINE: message" when `where` (a `Where`) is known, else just the message.
`python -m builder` prints it on stderr and exits 1, never with a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Where:
    """A source position: `file` relative to the project root ("asm/x.asm"), 1-based `line`."""
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class BuildError(Exception):
    """A user-facing build failure; `where` is the offending source line, if any."""

    def __init__(self, message: str, where: Where | None = None):
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.detail = message
