"""Stragglers: ranks, and ops, whose compute is slower than their peers'."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.walk import BindingWalk
from tracegraph.graph.ops import Ops, comm_calls

SLOW_RANK_FACTOR = 1.15  # compute busier than this × the median of the other ranks = straggler
SLOW_RANK_SHARE = 0.05  # ... and by at least this share of the profiled time
OUTLIER_MADS = 3.0  # ... and stands this many robust deviations above the ranks' median
HOST_SPREAD = 0.10  # the least spread of host-thread work: a share of the ranks' median
SLOW_OP_SHARE = 0.01  # an op name is slow on a rank when its excess is this share at least


def slow_ranks(walk: BindingWalk, profiled_ns: int) -> set[int]:
    """Ranks whose main-lane work exceeds the other ranks' median by SLOW_RANK_FACTOR and by
    SLOW_RANK_SHARE of the profiled time, and stands out of the ranks' spread."""
    return slow_among(rank_work(walk), profiled_ns, on_host(walk.graph.ops))


def rank_work(walk: BindingWalk) -> pd.Series:
    """rank -> ns of main-lane work, for every rank with a main lane. Work is compute on a
    device stream; on a host thread, ops plus annotation-only stretches that no other thread's
    op released (sleeping or Python work, not waiting)."""
    graph = walk.graph
    main = graph.ops.main_lanes()
    kind = graph.kind
    working = np.isin(graph.lane_id, list(main.values())) & own_work(graph.ops.frame)
    for i in np.flatnonzero(working & (kind == schema.MARKER)):
        working[i] = walk.released_by(i) < 0  # a released annotation stretch was a wait
    return pd.Series(graph.end - graph.start)[working].groupby(
        graph.rank[working]).sum().reindex(list(main), fill_value=0)


def slow_among(work: pd.Series, profiled_ns: int, host: bool) -> set[int]:
    """The slow ranks of `rank_work` (every rank's, in rank order; `host`: see `on_host`)."""
    ns = work.to_numpy()
    others = median_of_others(ns, np.zeros(len(ns), dtype=np.int64)) if len(ns) > 1 else ns
    slow = (ns > SLOW_RANK_FACTOR * others) & (ns - others > SLOW_RANK_SHARE * profiled_ns)
    return {int(r) for r in work.index[slow & _outliers(ns, HOST_SPREAD if host else 0.0)]}


def on_host(ops: Ops) -> bool:
    """Whether every rank is seen through host threads (a CPU-only job): its work is measured
    in wall time that other processes of the host may have held the core for."""
    return all_threads(ops.lanes.loc[ops.lanes["main"], "mode"].tolist())


def all_threads(main_modes: list[str]) -> bool:
    """`on_host` of the modes of every rank's main lane."""
    return bool(main_modes) and all(mode == schema.THREAD for mode in main_modes)


def _outliers(values: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Mask of values beyond the ranks' own spread: more than OUTLIER_MADS robust standard
    deviations (1.4826 × the median absolute deviation, at least `floor` × the median) above
    the median. Busy hosts make healthy ranks' work vary by half; a straggler stands out of
    that. Work measured on host threads (a CPU-only job) also counts the time other processes
    of the host held the core, so a few ranks that happen to agree do not make the spread
    smaller than that floor. Under four ranks the spread says nothing: every value passes."""
    return _outliers_by_group(values, np.zeros(len(values), dtype=np.int64), floor)


def own_work(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the ops that are a rank's own work: compute, annotation stretches, host ops
    other than communication calls (a blocking `c10d::recv_` is waiting, not work)."""
    return frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER]).to_numpy(
        ) & ~comm_calls(frame)


def slow_ops(ops: Ops, slow: set[int], profiled_ns: int) -> np.ndarray:
    """Per op: is it straggler compute? An op whose name also runs on other ranks is slow when
    its rank's median duration for that name exceeds SLOW_RANK_FACTOR × the other ranks'
    median and stands out of the ranks' medians for that name (as slow_ranks' totals do), on a
    slow rank or with an excess over the rank's ops of that name of SLOW_OP_SHARE of the
    profiled time at least (every kernel of a slow GPU; an expert MLP on an overloaded EP rank;
    not the jitter of a tiny op on a busy host); an op only its own rank runs is slow when the
    whole rank is."""
    return slow_op_mask(ops, *slow_names(name_medians(ops), slow, profiled_ns, on_host(ops)),
                        slow)


def name_medians(ops: Ops) -> pd.DataFrame:
    """name, rank, median (ns), count of every op name's own-work ops on each rank."""
    frame = ops.frame
    names, ranks = frame["name"].to_numpy(), frame["rank"].to_numpy().astype(np.int64)
    compute = own_work(frame) & ~pd.isna(names)  # groupby leaves out unnamed ops
    dur = (frame["end"] - frame["start"]).to_numpy()[compute]
    grouped = pd.Series(dur).groupby([names[compute], ranks[compute]])
    medians = grouped.median()
    return pd.DataFrame({"name": medians.index.get_level_values(0).to_numpy(dtype=object),
                         "rank": medians.index.get_level_values(1).to_numpy(),
                         "median": medians.to_numpy(), "count": grouped.size().to_numpy()})


def slow_names(medians: pd.DataFrame, slow: set[int], profiled_ns: int, host: bool
               ) -> tuple[set[tuple[str, int]], set[str]]:
    """From every rank's `name_medians`: the (name, rank) pairs whose median exceeds the other
    ranks' and stands out of the ranks' medians (slow ops; `host`: a job seen through host
    threads, see `on_host`), and the names that run on more than one rank."""
    name_code, uniques = pd.factorize(medians["name"].to_numpy(dtype=object))
    rank, median = medians["rank"].to_numpy(), medians["median"].to_numpy()
    shared = np.bincount(name_code, minlength=len(uniques)) >= 2
    others = median_of_others(median, name_code)
    weighty = ((median - others) * medians["count"].to_numpy() >= SLOW_OP_SHARE * profiled_ns
               ) | np.isin(rank, list(slow))
    standout = _outliers_by_group(median, name_code, HOST_SPREAD if host else 0.0)
    flagged = shared[name_code] & (median > SLOW_RANK_FACTOR * others) & weighty & standout
    return ({(str(uniques[c]), int(r)) for c, r in zip(name_code[flagged], rank[flagged],
                                                        strict=True)},
            {str(u) for u in uniques[shared]})


def slow_op_mask(ops: Ops, flagged: set[tuple[str, int]], shared: set[str], slow: set[int]
                 ) -> np.ndarray:
    """Per op: a `slow_names` pair, or (a name no other rank runs) on a slow rank."""
    frame = ops.frame
    names, ranks = frame["name"].to_numpy(), frame["rank"].to_numpy().astype(np.int64)
    codes, uniques = pd.factorize(names, use_na_sentinel=False)
    known = {name: code for code, name in enumerate(uniques)}
    pairs = np.array([known[n] for n, _ in flagged if n in known], dtype=np.int64)
    pair_ranks = np.array([r for n, r in flagged if n in known], dtype=np.int64)
    span = int(max(ranks.max(initial=0), pair_ranks.max(initial=0))) + 1
    hit = np.isin(codes * span + ranks, pairs * span + pair_ranks)
    alone = ~np.isin(np.asarray(uniques, dtype=object), list(shared))
    return hit | (alone[codes] & np.isin(ranks, list(slow)))


def _outliers_by_group(values: np.ndarray, groups: np.ndarray, floor: float) -> np.ndarray:
    """_outliers within each group of values (one per rank), in one pass over all groups."""
    frame = pd.DataFrame({"v": values, "g": groups})
    by = frame.groupby("g")["v"]
    median = by.transform("median").to_numpy()
    mad = (frame["v"] - median).abs().groupby(frame["g"]).transform("median").to_numpy()
    spread = np.maximum(1.4826 * mad, floor * median)
    return (by.transform("size").to_numpy() < 4) | (values - median > OUTLIER_MADS * spread)


def median_of_others(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per element: the median of the other elements of its group (NaN when it is alone),
    in O(n log n) rather than one median per element."""
    order = np.lexsort((values, groups))
    v, g = np.asarray(values, dtype=float)[order], groups[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    size = np.diff(np.r_[first, len(g)])
    base, others = np.repeat(first, size), np.repeat(size, size) - 1
    k = np.arange(len(g)) - base  # own position in the sorted group

    def nth_other(j: np.ndarray) -> np.ndarray:
        j = np.maximum(j, 0)
        return v[np.minimum(base + j + (j >= k), len(v) - 1)]

    median = (nth_other((others - 1) // 2) + nth_other(others // 2)) / 2
    out = np.empty(len(v))
    out[order] = np.where(others > 0, median, np.nan)
    return out


def profiled_ns(steps: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> int:
    """The time the profile covers: the sum of step lengths, else the whole span."""
    if len(steps):
        return int((steps.groupby("step")["end"].max() - steps.groupby("step")["start"].min()
                    ).sum())
    return int(end.max() - start.min()) if len(start) else 0
