"""`python -m builder pack`: the packer's model, measured and searched.

Contract: `main(argv)`. Without options it packs the image of the sources with the committed
model (builder/asm/pack_model.py) and prints the payload's size. `--order` searches the
include order of asm/gemma.asm that packs smallest (builder/asm/pack_order.py; `--passes`,
and `--write` rewrites asm/gemma.asm). `--search` chooses a new
model for today's image: context masks greedily (each round adds the mask that lowers the
estimated size most, up to `--models`), then each model's shift by coordinate descent;
`--refine` goes on from the model found (or the committed one) by coordinate descent on the
exact code length: shifts, and each mask swapped for each of the `--candidates` unused masks
that the estimate ranks best as an addition to the model (all 256: about an hour a pass).
It prints the exact size of the committed model and of the found one, and with `--write`
rewrites builder/asm/pack_model.py (never part of a normal build: the model stays fixed, so
an asm change moves the packed size by about what it should).

Both count on the stream the coder codes: the field tables, then the image, call-coded.
The estimate codes every bit with counts that never collide (a dictionary per mask instead of
the shared table) and without the one-bit lag of learning; `--refine` measures each trial with
pack's own mixer (code_length: collisions and lag included, an ideal coder); the last step is
the exact size (pack.compress) of the result.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import pack, pack_order
from .assemble import assemble
from .build import REPO_ROOT
from .errors import BuildError
from .fasm import parse
from .packed import image_bytes

MODEL_FILE = Path(__file__).with_name("pack_model.py")


def bits_of(data: bytes) -> np.ndarray:
    """Every bit of `data`, each byte's most significant first."""
    return np.unpackbits(np.frombuffer(data, np.uint8)).astype(np.int64)


def state_words(data: bytes) -> list[int]:
    """The state word each byte of `data` is coded in (pack.ContextMixer.hash_byte's: the
    history in lanes 2..7, the field context in lanes 0 and 1)."""
    fields, out, history, words = pack.Fields(), bytearray(), 0, []
    for byte in data:
        words.append(history | fields.context())
        history = (history << 8 | byte << 16) & pack.M64
        out.append(byte)
        fields.step(byte, out)
    return words


def ideal_counts(data: bytes, mask: int, words: list[int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(n0, n1) before each bit for the context of `mask` (the lanes of the state word it
    chooses, and c0), with pack's update rule and no collisions; no counts again after the
    field tables, as in pack's table."""
    if words is None:
        words = state_words(data)
    key_and = pack.key_mask(mask)
    counts: dict[tuple[int, int], tuple[int, int]] = {}
    n0s, n1s = [], []
    for at, (byte, word) in enumerate(zip(data, words)):
        if at == len(pack.TABLES):
            counts.clear()
        chosen = word & key_and
        c0 = 1
        for k in range(7, -1, -1):
            bit = byte >> k & 1
            n0, n1 = counts.get((chosen, c0), (0, 0))
            n0s.append(n0)
            n1s.append(n1)
            if bit:
                n0, n1 = (n0 // 2 + 1 if n0 else 0), min(n1 + 1, pack.COUNT_MAX)
            else:
                n0, n1 = min(n0 + 1, pack.COUNT_MAX), (n1 // 2 + 1 if n1 else 0)
            counts[(chosen, c0)] = (n0, n1)
            c0 = c0 << 1 | bit
    return np.array(n0s, np.int64), np.array(n1s, np.int64)


def estimate(bits: np.ndarray, counts: list[tuple[np.ndarray, np.ndarray]],
             shifts: list[int]) -> float:
    """Bytes to code `bits` with these counts and shifts (the mix of pack's docstring)."""
    num = sum(n1 << s for (_, n1), s in zip(counts, shifts))
    den = sum(n0 + n1 << s for (n0, n1), s in zip(counts, shifts))
    p = ((num + pack.PRIOR) << 32) // (den + 2 * pack.PRIOR) / 2.0 ** 32
    return float(-np.log2(np.where(bits == 1, p, 1 - p)).sum() / 8)


def tune_shifts(bits: np.ndarray, counts: list, shifts: list[int]) -> tuple[float, list[int]]:
    """Coordinate descent on the shifts, one step at a time, from `shifts`."""
    best = estimate(bits, counts, shifts)
    improved = True
    while improved:
        improved = False
        for i in range(len(shifts)):
            for step in (-1, 1):
                trial = list(shifts)
                trial[i] += step
                if not 0 <= trial[i] <= pack.MAX_SHIFT:
                    continue
                size = estimate(bits, counts, trial)
                if size < best - 1e-6:
                    best, shifts, improved = size, trial, True
    return best, shifts


def search(data: bytes, models: int, progress: bool = True) -> pack.Model:
    """A model for `data`: greedy masks, tuned shifts (see the module docstring), counted on
    the bytes the model codes (pack.encode_calls')."""
    data = pack.encode_calls(pack.TABLES + data)
    bits = bits_of(data)
    words = state_words(data)
    masks = range(1 << pack.MASK_BITS)
    table = {m: ideal_counts(data, m, words)
             for m in tqdm(masks, desc="counting contexts", disable=not progress, leave=False)}
    chosen: list[int] = []
    shifts: list[int] = []
    best = math.inf
    while len(chosen) < models:
        trials = []
        for m in masks:
            if m in chosen:
                continue
            for start in (1, 3, 5):
                size = estimate(bits, [table[c] for c in chosen + [m]], shifts + [start])
                trials.append((size, m, start))
        _, m, start = min(trials)
        size, tuned = tune_shifts(bits, [table[c] for c in chosen + [m]], shifts + [start])
        if size >= best - 1:
            break
        chosen, shifts, best = chosen + [m], tuned, size
        if progress:
            print(f"{len(chosen):2} models: ~{best:.0f} bytes, masks {chosen}", file=sys.stderr)
    return pack.Model(tuple(chosen), tuple(shifts))


def code_length(data: bytes, model: pack.Model) -> float:
    """Bytes an ideal coder takes for `data` (call-coded already) with the probabilities of
    pack's own mixer: the shared table and its collisions, the one-bit lag of learning. The
    payload is that, rounded up, plus the model's bytes and the range coder's last ones."""
    mixer = pack.ContextMixer(model)
    bits = 0.0
    for byte in data:
        for k in range(7, -1, -1):
            p = mixer.predict() / 2.0 ** 32
            bit = byte >> k & 1
            bits -= math.log2(p if bit else 1 - p)
            mixer.update(bit)
    return bits / 8


def rank_masks(data: bytes, model: pack.Model, n: int) -> list[int]:
    """The `n` masks outside `model` whose context, added to it with its best shift (0..7),
    lowers the estimate most, best first (refine's candidates)."""
    data = pack.encode_calls(pack.TABLES + data)
    bits, words = bits_of(data), state_words(data)
    counts = [ideal_counts(data, m, words) for m in model.masks]
    scores = []
    for mask in range(1 << pack.MASK_BITS):
        if mask not in model.masks:
            added = counts + [ideal_counts(data, mask, words)]
            scores.append((min(estimate(bits, added, list(model.shifts) + [shift])
                               for shift in range(8)), mask))
    return [mask for _, mask in sorted(scores)[:n]]


def refine(data: bytes, model: pack.Model, progress: bool = True,
           candidates: range | list[int] = range(1 << pack.MASK_BITS)) -> pack.Model:
    """Coordinate descent from `model` on code_length (exact where search's estimate is
    not): each shift one step either way, then each mask replaced by every unused one of
    `candidates`; a step that saves a quarter of a byte is kept; until a pass keeps none."""
    data = pack.encode_calls(pack.TABLES + data)
    masks, shifts = list(model.masks), list(model.shifts)
    best = code_length(data, model)
    improved = True
    while improved:
        improved = False
        trials = [(i, None, shifts[i] + step) for i in range(len(shifts)) for step in (-1, 1)]
        trials += [(i, m, None) for i in range(len(masks)) for m in candidates]
        for i, mask, shift in tqdm(trials, desc=f"refining (~{best:.0f} bytes)",
                                   disable=not progress, leave=False):
            trial_masks, trial_shifts = list(masks), list(shifts)
            if mask is None:
                trial_shifts[i] = shift
            else:
                trial_masks[i] = mask
            if mask in masks or not 0 <= trial_shifts[i] <= pack.MAX_SHIFT:
                continue
            size = code_length(data, pack.Model(tuple(trial_masks), tuple(trial_shifts)))
            if size < best - 0.25:
                best, masks, shifts, improved = size, trial_masks, trial_shifts, True
        if progress:
            print(f"refined: ~{best:.0f} bytes, masks {masks}, shifts {shifts}",
                  file=sys.stderr)
    return pack.Model(tuple(masks), tuple(shifts))


def write_model(model: pack.Model, path: Path = MODEL_FILE) -> None:
    """Rewrite builder/asm/pack_model.py with `model`."""
    head = path.read_text().split("\nMODEL = ")[0]
    path.write_text(f"{head}\nMODEL = Model(masks={model.masks},\n"
                    f"              shifts={model.shifts})\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builder pack",
        description="Pack the image of asm/gemma.asm with the committed model and print the "
                    "payload's size; --search looks for a better model.")
    parser.add_argument("--search", action="store_true",
                        help="search masks and shifts for today's image (about a minute)")
    parser.add_argument("--models", type=int, default=11, metavar="N",
                        help=f"at most N context models (1..{pack.MAX_MODELS}; each costs "
                             "start-up time); default 11")
    parser.add_argument("--refine", action="store_true",
                        help="refine the model found (or the committed one) by coordinate "
                             "descent on its exact code length (~10 minutes a pass with "
                             "40 candidates)")
    parser.add_argument("--candidates", type=int, default=40, metavar="N",
                        help="with --refine: the N masks the estimate ranks best, tried in "
                             "place of each mask (default 40; 256: all)")
    parser.add_argument("--order", action="store_true",
                        help="search the include order of asm/gemma.asm that packs smallest "
                             "(a build per move of one file: ~8 minutes a pass on the "
                             "engine)")
    parser.add_argument("--passes", type=int, default=3, metavar="N",
                        help="with --order: at most N passes (default 3)")
    parser.add_argument("--write", action="store_true",
                        help="with --search or --refine: write the model found to "
                             "builder/asm/pack_model.py; with --order: write the order "
                             "found to asm/gemma.asm")
    parser.add_argument("--root", type=Path, default=REPO_ROOT,
                        help="project directory holding asm/")
    args = parser.parse_args(argv)
    if not 1 <= args.models <= pack.MAX_MODELS:
        parser.error(f"--models must be 1..{pack.MAX_MODELS}")
    if args.passes < 1:
        parser.error("--passes must be at least 1")
    try:
        if args.order:
            return _order(args.root, args.passes, args.write)
        data = image_bytes(assemble(parse(args.root)))
        from .pack_model import MODEL
        print(f"committed model: {len(pack.compress(data, MODEL))} bytes of payload for "
              f"{len(data)} bytes of image ({len(MODEL.masks)} context models)")
        if args.search or args.refine:
            model = search(data, args.models) if args.search else MODEL
            if args.refine:
                model = refine(data, model, candidates=rank_masks(data, model,
                                                                  args.candidates))
            print(f"found: {len(pack.compress(data, model))} bytes of payload "
                  f"({len(model.masks)} context models): masks {model.masks}, shifts "
                  f"{model.shifts}")
            if args.write:
                write_model(model)
                print(f"wrote {MODEL_FILE.relative_to(REPO_ROOT)}")
    except (BuildError, pack.PackError) as exc:
        print(f"python -m builder pack: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _order(root: Path, passes: int, write: bool) -> int:
    """`--order`: search, print the order found and its size, write it with `write`."""
    order, size, before = pack_order.search_order(root, passes)
    print(f"include order found: {size} bytes packed (now {before}):")
    print("\n".join(order))
    if write:
        pack_order.write_order(root, order)
        print(f"wrote asm/{pack_order.ENTRY}")
    return 0
