"""Stragglers: ranks, and ops, whose compute over the whole profile is slower than their peers'
(peers.py); step by step, step_stragglers.py."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.peers import Peers
from tracegraph.analysis.walk import BindingWalk
from tracegraph.graph.ops import Ops, comm_calls

SLOW_RANK_FACTOR = 1.15  # compute busier than this × the median of the other ranks = straggler
SLOW_RANK_SHARE = 0.05  # ... and by at least this share of the profiled time
OUTLIER_MADS = 3.0  # ... and stands this many robust deviations above the ranks' median
HOST_SPREAD = 0.10  # the least spread of host-thread work: a share of the ranks' median
SLOW_OP_SHARE = 0.01  # an op name is slow on a rank when its excess is this share at least
SPREAD_MIN = 4  # values a group needs to tell its own spread


def slow_ranks(walk: BindingWalk, profiled_ns: int, peers: Peers,
               working: np.ndarray | None = None) -> set[int]:
    """Ranks whose main-lane work exceeds the median of their peers' (the ranks doing the same
    work, peers.py) by SLOW_RANK_FACTOR and by SLOW_RANK_SHARE of the profiled time, and stands
    out of their spread. A rank without peers is never named. `working`: `main_work`, when
    the caller has it."""
    return slow_among(rank_work(walk, working), profiled_ns, on_host(walk.graph.ops), peers)


def rank_work(walk: BindingWalk, working: np.ndarray | None = None) -> pd.Series:
    """rank -> ns of main-lane work, for every rank with a main lane (`main_work`, computed
    unless given)."""
    graph = walk.graph
    working = main_work(walk) if working is None else working
    return pd.Series(graph.end - graph.start)[working].groupby(
        graph.rank[working]).sum().reindex(list(graph.ops.main_lanes()), fill_value=0)


def main_work(walk: BindingWalk) -> np.ndarray:
    """Mask of the ops that are their rank's main-lane work: compute on a device stream; on a
    host thread, ops plus annotation-only stretches that no other thread's op released
    (sleeping or Python work, not waiting)."""
    graph = walk.graph
    working = np.isin(graph.lane_id, list(graph.ops.main_lanes().values())) & own_work(
        graph.ops.frame)
    for i in np.flatnonzero(working & (graph.kind == schema.MARKER)):
        working[i] = walk.released_by(i) < 0  # a released annotation stretch was a wait
    return working


def slow_among(work: pd.Series, profiled_ns: int, host: bool, peers: Peers) -> set[int]:
    """The slow ranks of `rank_work` (every rank's; `host`: see `on_host`), each judged
    against its peers."""
    work = work[work.index.isin(list(peers.classes))]
    ns = work.to_numpy()
    cls = np.array([peers.classes[r] for r in work.index], dtype=np.int64)
    others = median_of_others(ns, cls)
    slow = (ns > SLOW_RANK_FACTOR * others) & (ns - others > SLOW_RANK_SHARE * profiled_ns)
    floor = HOST_SPREAD if host else 0.0
    standout = _outliers_by_group(ns, cls, floor)
    small = small_groups(cls)
    standout[small] = _outliers_among_groups(ns, cls, floor)[small]
    return {int(r) for r in work.index[slow & standout]}


def on_host(ops: Ops) -> bool:
    """Whether every rank is seen through host threads (a CPU-only job): its work is measured
    in wall time that other processes of the host may have held the core for."""
    return all_threads(ops.lanes.loc[ops.lanes["main"], "mode"].tolist())


def all_threads(main_modes: list[str]) -> bool:
    """`on_host` of the modes of every rank's main lane."""
    return bool(main_modes) and all(mode == schema.THREAD for mode in main_modes)


def own_work(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the ops that are a rank's own work: compute, annotation stretches, host ops
    other than communication calls (a blocking `c10d::recv_` is waiting, not work)."""
    return frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER]).to_numpy(
        ) & ~comm_calls(frame)


def slow_ops(ops: Ops, slow: set[int], profiled_ns: int, peers: Peers) -> np.ndarray:
    """Per op: is it straggler compute? An op whose name its peers (the ranks doing the same
    work) also run is slow when its rank's median duration for that name exceeds
    SLOW_RANK_FACTOR × the peers' median and stands out of the peers' medians for that name (as
    slow_ranks' totals do), on a slow rank or with an excess over the rank's ops of that name of
    SLOW_OP_SHARE of the profiled time at least (every kernel of a slow GPU; an expert MLP on an
    overloaded EP rank; not the jitter of a tiny op on a busy host). With fewer than SPREAD_MIN
    peers an op's noise cannot be told: only a slow rank's ops are slow. An op only its own rank
    runs is slow when the whole rank is; ops of ranks without peers never are."""
    flagged, shared = slow_names(name_medians(ops), slow, profiled_ns, on_host(ops), peers)
    return slow_op_mask(ops, flagged, shared, slow, peers)


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


def slow_names(medians: pd.DataFrame, slow: set[int], profiled_ns: int, host: bool,
               peers: Peers) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """From every rank's `name_medians`: the (name, rank) pairs whose median exceeds their
    peers' and stands out of the peers' medians (slow ops; `host`: a job seen through host
    threads, see `on_host`), and the (name, class) pairs that more than one peer runs."""
    cls = medians["rank"].map(peers.classes)
    medians = medians[cls.notna().to_numpy()]
    cls = cls.dropna().to_numpy(dtype=np.int64)
    names = medians["name"].to_numpy(dtype=object)
    codes, uniques = pd.factorize(pd.MultiIndex.from_arrays([names, cls]))
    rank, median = medians["rank"].to_numpy(), medians["median"].to_numpy()
    shared = np.bincount(codes, minlength=len(uniques)) >= 2
    others = median_of_others(median, codes)
    weighty = ((median - others) * medians["count"].to_numpy() >= SLOW_OP_SHARE * profiled_ns
               ) | np.isin(rank, list(slow))
    standout = _outliers_by_group(median, codes, HOST_SPREAD if host else 0.0)
    small = small_groups(codes)  # two or three peers cannot tell an op's noise: only a
    standout[small] = np.isin(rank[small], list(slow))  # slow rank's ops are slow there
    flagged = shared[codes] & (median > SLOW_RANK_FACTOR * others) & weighty & standout
    return ({(str(n), int(r)) for n, r in zip(names[flagged], rank[flagged], strict=True)},
            {(str(n), int(c)) for n, c in uniques[shared]})


def slow_op_mask(ops: Ops, flagged: set[tuple[str, int]], shared: set[tuple[str, int]],
                 slow: set[int], peers: Peers) -> np.ndarray:
    """Per op: a `slow_names` pair, or (a name no peer of its rank runs) on a slow rank."""
    frame = ops.frame
    names = frame["name"].array  # its codes: object strings would be inferred as Arrow text
    ranks = frame["rank"].to_numpy().astype(np.int64)
    cls = pd.Series(ranks).map(peers.classes).fillna(-1).to_numpy(dtype=np.int64)
    pairs = pd.MultiIndex.from_arrays([names, ranks])
    hit = pairs.isin(list(flagged)) if flagged else np.zeros(len(frame), dtype=bool)
    alone = ~pd.MultiIndex.from_arrays([names, cls]).isin(list(shared)) if shared else \
        np.ones(len(frame), dtype=bool)
    return np.asarray(hit) | (np.asarray(alone) & np.isin(ranks, list(slow)))




def _outliers_by_group(values: np.ndarray, groups: np.ndarray, floor: float) -> np.ndarray:
    """Mask of values beyond their group's spread (one value per rank; all groups in one pass):
    more than OUTLIER_MADS robust standard deviations (1.4826 × the median absolute deviation,
    at least `floor` × the median) above the group's median. Busy hosts make healthy ranks'
    work vary by half; a straggler stands out of that. Work measured on host threads (a
    CPU-only job) also counts the time other processes of the host held the core, so a few
    ranks that happen to agree do not make the spread smaller than that floor. Meaningful for
    groups of SPREAD_MIN values at least (`small_groups` says which are not)."""
    frame = pd.DataFrame({"v": values, "g": groups})
    by = frame.groupby("g")["v"]
    median = by.transform("median").to_numpy()
    mad = (frame["v"] - median).abs().groupby(frame["g"]).transform("median").to_numpy()
    spread = np.maximum(1.4826 * mad, floor * median)
    return values - median > OUTLIER_MADS * spread


def small_groups(groups: np.ndarray) -> np.ndarray:
    """Mask of the values whose group has fewer than SPREAD_MIN values: too few to tell its
    own spread (two replicas of a pipeline stage)."""
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    return counts[inverse] < SPREAD_MIN


def _outliers_among_groups(values: np.ndarray, groups: np.ndarray, floor: float) -> np.ndarray:
    """For groups too small to tell their own spread: mask of values whose excess over the
    median of the others of their group, relative to it, stands out of the relative excesses
    of the other groups' values (each group's own left out: it holds the candidate and the
    mirror image of its excess), or of the floor alone when there are none."""
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = values / median_of_others(values, groups) - 1
    out = np.zeros(len(values), dtype=bool)
    for group in np.unique(groups):
        mine = groups == group
        out[mine] = _stands_out(excess[mine], excess[~mine], floor)
    return out


def _stands_out(excess: np.ndarray, reference: np.ndarray, floor: float) -> np.ndarray:
    """Mask of relative excesses more than OUTLIER_MADS robust deviations (at least `floor`)
    above the reference's median (0 and `floor` when it has fewer than two finite values)."""
    reference = reference[np.isfinite(reference)]
    center, spread = 0.0, floor
    if len(reference) >= 2:
        center = float(np.median(reference))
        spread = max(1.4826 * float(np.median(np.abs(reference - center))), floor)
    return excess - center > OUTLIER_MADS * spread


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
