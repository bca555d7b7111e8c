"""The critical path of each step: the binding walk over the whole step of its slowest rank.

From the op of that rank ending last in the step, back to the step's start, the walk (walk.py)
says at every instant which op held the step; its pieces become segments, each with what the op
was doing (`kind`: compute, transfer, wait) and the root cause blame charges it to (`category`,
from the labeller the caller passes: this module does not depend on blame). The segments tile the
step, so the path's length is the step time of its slowest rank on aligned clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph import causes
from tracegraph.analysis.walk import (
    RAN,
    STEP_TAIL,
    WAIT,
    WAITING,
    BindingWalk,
    Piece,
    fold_slivers,
)

NO_OP = "no op of the rank runs in this step"


@dataclass
class PathSegment:
    """A stretch of the critical path: the op holding the step then, what it was doing (`kind`:
    compute, transfer or wait) and the root cause blame charges it to (`category`)."""

    rank: int
    lane: str
    name: str
    kind: str
    category: str
    start: int
    end: int
    note: str = ""
    op: int = -1  # the op (node of the DepGraph) holding the step then


def step_windows_of_slowest(steps: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    """(step, rank, start, end) of each step's slowest rank (longest step on aligned clocks)."""
    if not len(steps):
        return []
    spans = steps.assign(dur=steps["end"] - steps["start"]).sort_values(
        ["step", "dur", "rank"], ascending=[True, False, True]).drop_duplicates("step")
    return [(int(s), int(r), int(a), int(b)) for s, r, a, b in
            spans[["step", "rank", "start", "end"]].itertuples(index=False)]


def critical_path(walk: BindingWalk, rank: int | None, window: tuple[int, int],
                  label: Callable[[Piece], str]) -> list[PathSegment]:
    """The binding chain that ends `rank`'s step `window` (every rank's ops when rank is None):
    from the op of the rank ending last in the window (on its main lane, of ops ending together;
    the latest-ending, of ops running past the window), back to the window's start. The
    segments tile the window: a step-marker tail after the last op is its own segment."""
    ending = last_op(walk, rank, window)
    if ending is None:  # nothing of the rank ran: the step cannot be explained
        return no_op_path(rank, window)
    stop = min(int(walk.end[ending]), window[1])
    pieces = walk.history(ending, window[0], stop)
    return segments(fold_slivers(with_tail(pieces, ending, stop, window[1])),
                    lambda piece: segment_of(walk, piece, label))


def last_op(walk: BindingWalk, rank: int | None, window: tuple[int, int]) -> int | None:
    """The op whose end ends the rank's window (see `critical_path`), None if none ran."""
    found = last_key(walk, rank, window)
    return None if found is None else found[1]


def last_key(walk: BindingWalk, rank: int | None, window: tuple[int, int]
             ) -> tuple[tuple[int, bool, int], int] | None:
    """(its key, op) of `last_op`: the greatest key wins, then the greatest op index."""
    lo, hi = window
    graph = walk.graph
    mine = np.flatnonzero((graph.end > lo) & (graph.start < hi)
                          & ((graph.rank == rank) if rank is not None else True))
    if not len(mine):
        return None
    main = np.isin(graph.lane_id[mine], list(graph.ops.main_lanes().values()))
    op = int(mine[np.lexsort((graph.end[mine], main, np.minimum(graph.end[mine], hi)))[-1]])
    k = int(np.flatnonzero(mine == op)[0])
    return (int(min(graph.end[op], hi)), bool(main[k]), int(graph.end[op])), op


def no_op_path(rank: int | None, window: tuple[int, int]) -> list[PathSegment]:
    """The path of a step in which nothing of its rank ran: one unexplained segment."""
    lo, hi = window
    return [PathSegment(rank=-1 if rank is None else rank, lane="", name="", kind=WAIT,
                        category=causes.UNKNOWN, start=lo, end=hi, note=NO_OP)] if hi > lo \
        else []


def with_tail(pieces: list[Piece], ending: int, stop: int, hi: int) -> list[Piece]:
    """The pieces of the walk back from op `ending` (up to `stop`, where it ends in the step),
    and the step-marker tail after it up to `hi`."""
    if stop < hi:
        pieces.append(Piece(ending, stop, hi, STEP_TAIL))
    return pieces


def segment_of(walk: BindingWalk, piece: Piece, label: Callable[[Piece], str]) -> PathSegment:
    """A piece of the walk as a path segment: its op, what it did, its cause."""
    graph, op = walk.graph, piece.op
    return PathSegment(rank=int(graph.rank[op]), lane=str(graph.lane[op]),
                       name=str(graph.name[op]), kind=walk.kind_of(piece),
                       category=label(piece), start=piece.start, end=piece.end,
                       note="" if piece.why in (RAN, WAITING) else piece.why, op=op)


def segments(pieces: list[Piece], segment: Callable[[Piece], PathSegment]
             ) -> list[PathSegment]:
    """Folded pieces as segments (`segment` describes one), runs of one op kind, category,
    rank and lane joined."""
    joined: list[PathSegment] = []
    for piece in pieces:
        seg = segment(piece)
        last = joined[-1] if joined else None
        if last and (last.rank, last.lane, last.kind, last.category) == (
                seg.rank, seg.lane, seg.kind, seg.category) and seg.start - last.end <= 1_000:
            if seg.end - seg.start > last.end - last.start:
                last.name, last.note, last.op = seg.name, seg.note, seg.op
            last.end = max(last.end, seg.end)
        else:
            joined.append(seg)
    return joined
