"""Compare an Analysis with a simulated bundle's ground truth: how much bubble time agrees."""

from __future__ import annotations

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
