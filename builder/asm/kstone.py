"""keystone, kept at arm's length.

keystone 0.9.2's LLVM can abort the whole process on some inputs ("LLVM ERROR: ..."), so the
builder never loads it in its own process: `Keystone` runs `python -m builder.asm.kstone` as a
child and sends it batches of (Intel-syntax text, address) over a pipe.

Contract: `Keystone().assemble(batch) -> list[bytes | str]` gives, for each (text, address)
in `batch`, the machine code or keystone's error message. When the child dies on item k it
raises `KeystoneCrash(k, message)`; a new child is started for the next call. Results are
cached, so identical requests cost nothing. The caller hands over every number with an
explicit 0x prefix (keystone's number-base trap) and no comments.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


class KeystoneCrash(Exception):
    """The keystone child died while assembling batch item `index`."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


class Keystone:
    """A keystone child process with a result cache. Use as a context manager."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.cache: dict[tuple[str, int], bytes | str] = {}
        self.stderr = None

    def __enter__(self) -> "Keystone":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
            self.proc.stdout.close()
            self.stderr.close()
            self.proc = None

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "builder.asm.kstone"],
                                     cwd=Path(__file__).resolve().parents[2],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)

    def assemble(self, batch: list[tuple[str, int]]) -> list[bytes | str]:
        todo = [key for key in dict.fromkeys(batch) if key not in self.cache]
        if todo:
            if self.proc is None:
                self._start()
            self.proc.stdin.write(json.dumps(todo) + "\n")
            self.proc.stdin.flush()
            for i, key in enumerate(todo):
                line = self.proc.stdout.readline()
                if not line:
                    self.proc.wait()
                    self.stderr.seek(0)
                    lines = self.stderr.read().decode(errors="replace").strip().splitlines()
                    self.proc.stdout.close()
                    self.stderr.close()
                    self.proc = None
                    why = lines[-1] if lines else "no message"
                    raise KeystoneCrash(batch.index(key), f"keystone crashed: {why}")
                kind, value = json.loads(line)
                self.cache[key] = bytes.fromhex(value) if kind == "ok" else value
        return [self.cache[key] for key in batch]


def serve() -> None:
    """The child's loop: one JSON batch per input line, one JSON result line per item."""
    from keystone import KS_ARCH_X86, KS_MODE_64, Ks, KsError

    ks = Ks(KS_ARCH_X86, KS_MODE_64)
    for line in sys.stdin:
        for text, address in json.loads(line):
            try:
                encoding, _ = ks.asm(text, address)
                result = ["ok", bytes(encoding or b"").hex()]
            except KsError as exc:
                result = ["error", str(exc)]
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    serve()
