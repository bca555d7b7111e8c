"""Communication / compute overlap: how much of each rank's communication its main lane hid
behind compute, by group kind (dp, pp, ep, ...), and the stage reductions (back-to-back DP
reductions of one pipeline stage's gradients) with the compute they overlapped.

`diff` compares the ratios, `checks` bound them, and the overlap finding reports the exposed
part (communication time during which the main lane did not compute).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracegraph import causes, schema
from tracegraph.analysis import intervals
from tracegraph.analysis.blame import comm_categories as categories_of

if TYPE_CHECKING:
    from tracegraph.analysis.analyze import Analysis

NS_PER_MS = 1e6
DIMS = causes.DIMS  # dp, pp, ep, tp, cp
REDUCTIONS = frozenset({"allreduce", "reducescatter", "reduce"})
SETTLE_NS = 50_000  # reductions closer than this on one lane are one stage reduction


def comm_categories(analysis: Analysis) -> np.ndarray:
    """Root-cause category every op's communication is charged to, as blame charges it
    (blame.comm_categories); "" for ops that are not communication."""
    return categories_of(analysis.ops.frame, analysis.trace.groups)


def comm_dims(analysis: Analysis) -> np.ndarray:
    """Group kind of every communication op ("" for other ops): the parallel dimension of the
    category blame charges it to (dp, pp, ep, tp, cp), or `collective` when its group's
    dimension is unknown, so the overlap checks and blame name the same dimension."""
    categories = pd.Series(comm_categories(analysis), dtype=object)
    kinds = {c: causes.get(c).dim or c for c in categories.unique() if c}
    dims = categories.map(kinds).astype(object).fillna("").to_numpy(dtype=object)
    is_comm = analysis.ops.frame["kind"].isin([schema.COLLECTIVE, schema.P2P]).to_numpy()
    return np.where(is_comm, dims, "")


def main_compute(analysis: Analysis) -> np.ndarray:
    """Mask of the ops that are computation on their rank's main lane."""
    frame = analysis.ops.frame
    main = frame["rank"].map(analysis.ops.main_lanes()).fillna(-1).to_numpy()
    working = (frame["kind"] == schema.COMPUTE) | ((frame["kind"] == schema.HOST)
                                                  & (frame["comm"] == ""))
    return (frame["lane_id"].to_numpy() == main) & working.to_numpy()


def timed_ranks(analysis: Analysis) -> set[int]:
    """The ranks whose compute the profile times (a main lane, and no known missing events):
    only for them is it known how much communication compute hid. A rank known from its
    communication summaries alone hid nothing as far as the profile tells, not everything."""
    return set(analysis.ops.main_lanes()) - set(analysis.graph.incomplete)


def overlap_table(analysis: Analysis) -> pd.DataFrame:
    """rank, step, dim, comm_ms, overlap_ms, transfer_ms, unexplained_ms: per step, the time the
    communication of each group kind of every timed rank was in flight, how much of it its main
    lane spent computing, how much of the rest was transfer (its ops after their binding
    dependency let them go: the peer's half posted, the last member arrived, as the critical
    path and the replay credit them) and how much the profile cannot explain (blame's UNKNOWN:
    no wait to follow). What is left of the exposed time, the ops waited for their peers.
    Computed rank by rank, where the ranks lie (`Analysis.by_part`)."""
    return analysis.table_by_part(_overlap_rows)


def _overlap_rows(analysis: Analysis) -> pd.DataFrame:
    start, end = analysis.start, analysis.end
    dims, computing = comm_dims(analysis), main_compute(analysis)
    released = analysis.released()
    ranks = analysis.ops.frame["rank"].to_numpy()
    order = np.argsort(ranks, kind="stable")
    by_rank = ranks[order]
    unexplained = blamed_spans(analysis, {causes.UNKNOWN})
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    rows = []
    steps = analysis.step_table()
    for rank, windows in steps[steps["rank"].isin(timed_ranks(analysis))].groupby("rank"):
        mine = order[np.searchsorted(by_rank, rank, "left"):np.searchsorted(by_rank, rank, "right")]
        s, e, d, c, r = start[mine], end[mine], dims[mine], computing[mine], released[mine]
        unknown_spans = unexplained.get(int(rank), none)
        for step, lo, hi in windows[["step", "start", "end"]].itertuples(index=False):
            work = intervals.union(s[c], e[c], lo, hi)
            unknown = intervals.union(*unknown_spans, lo, hi)
            for dim in np.unique(d[d != ""]):
                comm = intervals.union(s[d == dim], e[d == dim], lo, hi)
                if len(comm[0]):
                    moving = intervals.union(r[d == dim], e[d == dim], lo, hi)
                    rows.append((int(rank), int(step), str(dim), intervals.length(comm) / NS_PER_MS,
                                 intervals.overlap(comm, work) / NS_PER_MS,
                                 _exposed(moving, work, unknown) / NS_PER_MS,
                                 intervals.overlap(comm, unknown) / NS_PER_MS))
    return pd.DataFrame(rows, columns=["rank", "step", "dim", "comm_ms", "overlap_ms",
                                       "transfer_ms", "unexplained_ms"])


def _exposed(spans: tuple[np.ndarray, np.ndarray], work: tuple[np.ndarray, np.ndarray],
             unknown: tuple[np.ndarray, np.ndarray]) -> int:
    """The time of `spans` during which the main lane neither computed (`work`) nor stalled for
    a reason the profile does not hold (`unknown`: bubbles, when it computes no work)."""
    return max(intervals.length(spans) - intervals.overlap(spans, work)
               - intervals.overlap(spans, unknown), 0)


def blamed_spans(analysis: Analysis, categories: Collection[str]
                 ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """rank -> (starts, ends) of its bubbles' time that blame charges to `categories`."""
    pieces: dict[int, list[tuple[int, int]]] = {}
    for bubble in analysis.bubbles:
        pieces.setdefault(bubble.rank, []).extend(
            (p.start, p.end) for p in bubble.intervals if p.category in categories)
    return {rank: (np.array([a for a, _ in spans], dtype=np.int64),
                   np.array([b for _, b in spans], dtype=np.int64))
            for rank, spans in pieces.items() if spans}


def overlap_ratios(analysis: Analysis, by_rank: bool = False,
                   table: pd.DataFrame | None = None) -> dict:
    """Group kind -> share of its comm time overlapped by main-lane compute (all ranks and steps,
    time-weighted); with `by_rank`, rank -> group kind -> ratio. `table`: its overlap_table."""
    table = overlap_table(analysis) if table is None else table
    keys = ["rank", "dim"] if by_rank else ["dim"]
    sums = table.groupby(keys)[["comm_ms", "overlap_ms"]].sum()
    ratios = (sums["overlap_ms"] / sums["comm_ms"].where(sums["comm_ms"] > 0)).fillna(0.0)
    if not by_rank:
        return {str(dim): float(r) for dim, r in ratios.items()}
    out: dict[int, dict[str, float]] = {}
    for (rank, dim), ratio in ratios.items():
        out.setdefault(int(rank), {})[str(dim)] = float(ratio)
    return out


def stage_reductions(analysis: Analysis) -> list[tuple[int, int, int, np.ndarray]]:
    """(rank, start, end, ops) of every run of back-to-back DP reductions on one lane: the
    reduction of one pipeline stage's gradients."""
    frame, start, end = analysis.ops.frame, analysis.start, analysis.end
    idx = np.flatnonzero((comm_dims(analysis) == "dp")
                         & frame["comm"].isin(REDUCTIONS).to_numpy()
                         & (frame["kind"] == schema.COLLECTIVE).to_numpy())
    if not len(idx):
        return []
    lane = frame["lane_id"].to_numpy()[idx]  # frame is sorted by (lane_id, start)
    new = np.ones(len(idx), dtype=bool)
    new[1:] = (lane[1:] != lane[:-1]) | (start[idx[1:]] - end[idx[:-1]] > SETTLE_NS)
    runs = np.split(idx, np.flatnonzero(new)[1:])
    ranks = frame["rank"].to_numpy()
    return [(int(ranks[run[0]]), int(start[run].min()), int(end[run].max()), run)
            for run in runs]


def reduction_overlap(analysis: Analysis) -> pd.DataFrame:
    """rank, start, end, ms, overlap_ms, ratio of every stage reduction of a timed rank: how
    much of it the rank's main lane spent computing (the later chunks' compute it overlapped),
    rank by rank where the ranks lie."""
    return analysis.table_by_part(_reduction_rows)


def _reduction_rows(analysis: Analysis) -> pd.DataFrame:
    start, end, computing = analysis.start, analysis.end, main_compute(analysis)
    ranks = analysis.ops.frame["rank"].to_numpy()
    timed = timed_ranks(analysis)
    rows = []
    for rank, lo, hi, _ in (r for r in stage_reductions(analysis) if r[0] in timed):
        mine = computing & (ranks == rank)
        work = intervals.union(start[mine], end[mine], lo, hi)
        rows.append((rank, lo, hi, (hi - lo) / NS_PER_MS, intervals.length(work) / NS_PER_MS))
    table = pd.DataFrame(rows, columns=["rank", "start", "end", "ms", "overlap_ms"])
    return table.assign(ratio=table["overlap_ms"] / table["ms"].where(table["ms"] > 0))
