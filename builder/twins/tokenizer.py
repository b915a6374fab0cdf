"""The engine's tokenizer in Python, from a model file's tables: the twin of asm/tokenizer.asm.

encode(text: bytes) -> ids, BOS first (docs/gemma.md, "Tokenizer"):
1. every space (0x20) becomes U+2581 (E2 96 81);
2. scan left to right: at each position the first piece of table `user` (user-defined and
   control pieces, longest first) that matches is a frozen symbol; otherwise one UTF-8 character is a symbol (its
   length from the lead byte; a byte that does not start a complete, well-formed sequence is
   a one-byte symbol);
3. repeatedly: over every adjacent pair of unfrozen symbols, look the concatenation up in the
   sorted `index` of NORMAL pieces (binary search); merge the pair with the highest score,
   the leftmost on ties; stop when no pair is a piece;
4. each symbol becomes its piece id, or, if it is not a normal piece, one byte piece
   (byte_base + byte) per byte.
decode(ids) -> bytes: normal and user-defined pieces with U+2581 as a space, byte pieces as
their byte, control/unknown/unused pieces as nothing.

Plain loops and O(n^2) merging on purpose: the asm does the same, step for step.
"""
from __future__ import annotations

from builder.models.modelfile import BYTE, NORMAL, USER_DEFINED, ModelFile

SPACE = "\u2581".encode()


def char_len(s: bytes, i: int) -> int:
    """Length of the UTF-8 character at s[i], or 1 if s[i:] does not start a well-formed one."""
    b = s[i]
    n = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 1
    if i + n > len(s) or any(c & 0xC0 != 0x80 for c in s[i + 1:i + n]):
        return 1
    return n


class Tokenizer:
    def __init__(self, model: ModelFile):
        h = model.header
        self.pieces, self.scores, self.types = model.pieces, model.scores, model.types
        self.index, self.user = model.index.tolist(), model.user.tolist()
        self.bos, self.byte_base, self.max_len = h.bos, h.byte_base, h.max_piece_len

    def lookup(self, piece: bytes) -> int:
        """Id of the normal piece equal to `piece` (binary search in the index), or -1."""
        if len(piece) > self.max_len:
            return -1
        lo, hi = 0, len(self.index)
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.pieces[self.index[mid]]
            if p == piece:
                return self.index[mid]
            if p < piece:
                lo = mid + 1
            else:
                hi = mid
        return -1

    def encode(self, text: bytes) -> list[int]:
        s = text.replace(b" ", SPACE)
        # symbols: [start, end, frozen id or -1]
        syms: list[list[int]] = []
        i = 0
        while i < len(s):
            for uid in self.user:
                p = self.pieces[uid]
                if s.startswith(p, i):
                    syms.append([i, i + len(p), uid])
                    break
            else:
                syms.append([i, i + char_len(s, i), -1])
            i = syms[-1][1]
        while True:
            best, best_score = -1, 0.0
            for j in range(len(syms) - 1):
                a, b = syms[j], syms[j + 1]
                if a[2] >= 0 or b[2] >= 0:
                    continue
                pid = self.lookup(s[a[0]:b[1]])
                if pid >= 0 and (best < 0 or self.scores[pid] > best_score):
                    best, best_score = j, self.scores[pid]
            if best < 0:
                break
            syms[best][1] = syms[best + 1][1]
            del syms[best + 1]
        ids = [self.bos]
        for start, end, frozen in syms:
            pid = frozen if frozen >= 0 else self.lookup(s[start:end])
            ids += [pid] if pid >= 0 else [self.byte_base + c for c in s[start:end]]
        return ids

    def decode_piece(self, pid: int) -> bytes:
        t = self.types[pid]
        if t in (NORMAL, USER_DEFINED):
            return self.pieces[pid].replace(SPACE, b" ")
        if t == BYTE:
            return bytes([pid - self.byte_base])
        return b""

    def decode(self, ids: list[int]) -> bytes:
        return b"".join(self.decode_piece(i) for i in ids)
