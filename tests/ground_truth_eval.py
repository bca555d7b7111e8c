"""Compare an Analysis with a simulated bundle's ground truth: how much bubble time agrees, and
how many pipeline blocks are labelled right."""

from __future__ import annotations

import numpy as np

from tracegraph.analysis.analyze import Analysis


def agreement(analysis: Analysis, truth: dict, *, by_rank: bool = True) -> float:
    """Share of ground-truth bubble time charged to the same category (and root rank)."""
    anchor = min(int(r) for r in analysis.offsets if analysis.offsets[r] == 0)
    shift = int(truth["clock_offset_ns"][str(anchor)]) + int(truth["origin_ns"])
    ours: dict[tuple[int, str], list] = {}
    for bubble in analysis.bubbles:
        for piece in bubble.intervals:
            ours.setdefault((bubble.rank, bubble.lane), []).append(
                ((piece.start - shift) / 1e6, (piece.end - shift) / 1e6, piece.category,
                 piece.rank))
    total = agreed = 0.0
    for bubble in truth["bubbles"]:
        mine = ours.get((bubble["rank"], bubble["lane"]), [])
        for piece in bubble["intervals"]:
            a, b = piece["start_ms"], piece["end_ms"]
            total += b - a
            for lo, hi, category, rank in mine:
                if category == piece["category"] and (not by_rank or rank == piece["rank"]):
                    agreed += max(0.0, min(b, hi) - max(a, lo))
    return agreed / total if total else 1.0


def labelled_right(truth, found) -> float:
    """Share of the true pipeline blocks (`truth.blocks`) whose most-overlapping found block of
    the same rank and step has the same stage, model chunk, microbatch and phase."""
    keys = ["stage", "chunk", "microbatch", "phase"]
    right = 0
    blocks = found.blocks.groupby(["rank", "step"]) if len(found.blocks) else {}
    for (rank, step), mine in truth.blocks.groupby(["rank", "step"]):
        if (rank, step) not in getattr(blocks, "groups", {}):
            continue
        theirs = blocks.get_group((rank, step))
        for block in mine.itertuples():
            overlap = (np.minimum(theirs["end"], block.end)
                       - np.maximum(theirs["start"], block.start))
            if overlap.max() > 0:
                best = theirs.loc[overlap.idxmax()]
                right += all(best[k] == getattr(block, k) for k in keys)
    return right / len(truth.blocks)
