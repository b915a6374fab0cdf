"""The engine's tokenizer in Python, from a model file's tables: the twin of asm/tokenizer.asm.

encode(text: bytes) -> ids, BOS first (docs/gemma.md, "The tokenizer"):
1. every space (0x20) becomes U+2581 (E2 96 81);
2. scan left to right: at each position the first piece of table `user` (user-defined and
   control pieces, longest first) that matches is one id and ends a segment; only the pieces
   whose first byte is the position's are tried (`first_byte_index`);
3. a segment (the text between user pieces) starts as one symbol per UTF-8 character (its
   length from the lead byte; a byte that does not start a complete, well-formed sequence is
   a one-byte symbol), and is merged as sentencepiece's BPE merges it (bpe_model.cc): every
   adjacent pair whose bytes are a NORMAL piece (binary search in the sorted `index`) goes
   onto a binary heap, keyed by the piece's score, the higher first, then by the left
   symbol's position, the leftmost first; the pair on top is popped, skipped when stale
   (either symbol changed since it was pushed: its left symbol was merged away, or the two
   lengths no longer add up to the pair's), otherwise merged, and the merged symbol's pairs
   with its next and then its previous neighbour are pushed; until the heap is empty;
4. each symbol becomes its piece id, or, if it is not a normal piece, one byte piece
   (byte_base + byte) per byte; then the segment's user piece.
The heap is the asm's, entry for entry (push: sift up by swaps; pop: the last entry to the
top, sifted down by swaps with the child that goes first, the first child on a tie), so the
two agree even where scores are NaN (never before anything, nothing before them). The asm
also remembers its lookups in a hash-keyed table: a cache, which changes no answer, so the
twin has none.
`segments(text)` gives the ids segment by segment, as the asm emits them; the asm refuses a
prompt as soon as the ids so far exceed its context.
A version 3 file with the MERGES flag (Gemma 4: BPE by merge rank) runs the same loop on piece
ids (docs/format.md, "Tokenizer (version 3)"): step 2 matches the user pieces on the raw text
(before step 1, as tokenizer.json's added tokens are; each segment's spaces then become
U+2581), each symbol starts as its normal piece's id (or -1), and in step 3 a pair's score is
the score (-rank) of the merge record (left id, right id), found by binary search in the
merges, whose result id the merged symbol takes: "the highest score, the leftmost on ties" is
then "the lowest rank, the leftmost on ties", exactly merge-rank BPE.
decode(ids) -> bytes: normal and user-defined pieces with U+2581 as a space, byte pieces as
their byte, control/unknown/unused pieces as nothing.
"""
from __future__ import annotations

from collections.abc import Iterator

from builder.models.modelfile import BYTE, NORMAL, USER_DEFINED, ModelFile
from builder.models.modelfile3 import MERGES, ModelFile3
from builder.models.modelfile4 import ModelFile4

SPACE = "\u2581".encode()


def char_len(s: bytes, i: int) -> int:
    """Length of the UTF-8 character at s[i], or 1 if s[i:] does not start a well-formed one."""
    b = s[i]
    n = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 1
    if i + n > len(s) or any(c & 0xC0 != 0x80 for c in s[i + 1:i + n]):
        return 1
    return n


Entry = tuple[float, int, int]  # (score, left symbol, the pair's length when pushed)


def before(a: Entry, b: Entry) -> bool:
    """Whether heap entry a goes before b: a higher score, or the same and further left."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


def heap_push(heap: list[Entry], e: Entry) -> None:
    """Append e and swap it with its parent while it goes before it."""
    heap.append(e)
    i = len(heap) - 1
    while i > 0 and before(heap[i], heap[(i - 1) // 2]):
        p = (i - 1) // 2
        heap[i], heap[p] = heap[p], heap[i]
        i = p


def heap_pop(heap: list[Entry]) -> Entry:
    """Remove and return the top; the last entry goes to the top and is swapped down with
    the child that goes first (the first child unless the second goes before it)."""
    top = heap[0]
    last = heap.pop()
    if heap:
        heap[0] = last
        i = 0
        while 2 * i + 1 < len(heap):
            c = 2 * i + 1
            if c + 1 < len(heap) and before(heap[c + 1], heap[c]):
                c += 1
            if not before(heap[c], heap[i]):
                break
            heap[i], heap[c] = heap[c], heap[i]
            i = c
    return top


class Tokenizer:
    def __init__(self, model: ModelFile | ModelFile3 | ModelFile4):
        h = model.header
        self.pieces, self.scores, self.types = model.pieces, model.scores, model.types
        self.index, self.user = model.index.tolist(), model.user.tolist()
        self.bos, self.byte_base, self.max_len = h.bos, h.byte_base, h.max_piece_len
        self.first_byte_index = [[u for u in self.user if self.pieces[u][0] == b]
                                 for b in range(256)]
        self.by_rank = hasattr(model, "merges") and bool(h.flags & MERGES)  # version 3 or 4
        self.merges = model.merges.tolist() if self.by_rank else []
        self.merge_scores = model.merge_scores.tolist() if self.by_rank else []

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

    def merge_record(self, left: int, right: int) -> int:
        """Record number of the merge (left, right) (binary search in the merges), or -1."""
        lo, hi = 0, len(self.merges)
        while lo < hi:
            mid = (lo + hi) // 2
            key = self.merges[mid][:2]
            if key == [left, right]:
                return mid
            if key < [left, right]:
                lo = mid + 1
            else:
                hi = mid
        return -1

    def pair(self, s: bytes, start: int, size: int, left_id: int,
             right_id: int) -> tuple[float, int] | None:
        """(score, id) of merging two adjacent symbols (together s[start:start + size]), or
        None: by score, the normal piece their bytes make; by rank, the merge of their ids
        (score -rank)."""
        if self.by_rank:
            k = self.merge_record(left_id, right_id) if left_id >= 0 and right_id >= 0 else -1
            return (self.merge_scores[k], self.merges[k][2]) if k >= 0 else None
        pid = self.lookup(s[start:start + size])
        return (self.scores[pid], pid) if pid >= 0 else None

    def user_piece(self, s: bytes, i: int) -> int:
        """The first user piece (in table order) of s[i]'s first-byte bucket at s[i:], or -1."""
        return next((u for u in self.first_byte_index[s[i]] if s.startswith(self.pieces[u], i)),
                    -1)

    def merge(self, s: bytes, start: list[int], length: list[int], ids: list[int]) -> None:
        """BPE-merge one segment's symbols (start[k], length[k] in s, their piece ids) in place;
        a symbol merged into its left neighbour gets length 0, the merged one the pair's id."""
        n = len(start)
        nxt, prev = list(range(1, n + 1)), list(range(-1, n - 1))
        heap: list[Entry] = []

        def add_pair(left: int) -> None:
            right = nxt[left] if left >= 0 else n
            if right < n:
                size = length[left] + length[right]
                found = self.pair(s, start[left], size, ids[left], ids[right])
                if found is not None:
                    heap_push(heap, (found[0], left, size))

        for k in range(n - 1):
            add_pair(k)
        while heap:
            _, left, size = heap_pop(heap)
            right = nxt[left]
            if length[left] == 0 or right == n or length[left] + length[right] != size:
                continue                        # stale
            ids[left] = self.pair(s, start[left], size, ids[left], ids[right])[1]
            length[left], length[right] = size, 0
            nxt[left] = nxt[right]
            if nxt[left] < n:
                prev[nxt[left]] = left
            add_pair(left)
            add_pair(prev[left])

    def segments(self, text: bytes) -> Iterator[list[int]]:
        """The ids of each segment (its symbols', then its user piece's), in order."""
        raw = text if self.by_rank else text.replace(b" ", SPACE)
        i = 0
        while True:
            j, uid = i, -1
            while j < len(raw):
                uid = self.user_piece(raw, j)
                if uid >= 0:
                    break
                j += char_len(raw, j)
            s = raw[i:j].replace(b" ", SPACE) if self.by_rank else raw[i:j]
            start, k = [], 0
            while k < len(s):
                start.append(k)
                k += char_len(s, k)
            length = [b - a for a, b in zip(start, start[1:] + [len(s)])]
            sym_ids = [self.lookup(s[a:a + n]) for a, n in zip(start, length)]
            self.merge(s, start, length, sym_ids)
            out = []
            for a, n, pid in zip(start, length, sym_ids):
                if n:
                    out += [pid] if pid >= 0 else [self.byte_base + c for c in s[a:a + n]]
            if uid >= 0:
                out.append(uid)
                j += len(self.pieces[uid])
            yield out
            if uid < 0:
                return
            i = j

    def encode(self, text: bytes) -> list[int]:
        return [self.bos] + [t for ids in self.segments(text) for t in ids]

    def decode_piece(self, pid: int) -> bytes:
        t = self.types[pid]
        if t in (NORMAL, USER_DEFINED):
            return self.pieces[pid].replace(SPACE, b" ")
        if t == BYTE:
            return bytes([pid - self.byte_base])
        return b""

    def decode(self, ids: list[int]) -> bytes:
        return b"".join(self.decode_piece(i) for i in ids)
