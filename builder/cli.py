"""Command-line plumbing shared by the model tools: an argparse parser whose errors are one
line, and `run`, which turns the tools' expected failures into one line on stderr."""
from __future__ import annotations

import argparse
import sys
from typing import Callable


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we print one line
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def run(prog: str, body: Callable[[], None], errors: tuple[type[BaseException], ...]) -> int:
    """Call body(); on one of `errors` (or OSError, KeyboardInterrupt) print one line, return 1."""
    try:
        body()
    except (*errors, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
