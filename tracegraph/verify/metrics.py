"""Per-step numbers of an `Analysis` that `diff` compares and `checks` test.

Every time here is on the aligned clock (`ops.frame` times minus the rank's clock offset), every
duration in ms. "Step time" is the slowest rank's `ProfilerStep` of each step, its median over the
steps; per-step quantities (bubble time, critical-path composition, chains) are means over the
profiled steps, so profiles holding different numbers of steps compare fairly.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np
import pandas as pd

from tracegraph import causes, schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble, Interval

NS_PER_MS = 1e6
REDUCTIONS = frozenset({"allreduce", "reducescatter", "reduce"})
DIMS = causes.DIMS  # dp, pp, ep, tp, cp
SETTLE_NS = 50_000  # pieces this short at a wait's end (a record, a wake-up) do not release it
SETTLE_SHARE = 0.01  # ... nor pieces under this share of the wait
_INSTANCE = re.compile(r"(?:[_@#]\d+)+(?:@[^@\s]+)?$")  # "_982_37_1@<group>", "#3", "_12"
_THREAD_ID = re.compile(r"^thread \d+")


# --- clocks and steps --------------------------------------------------------------------------
def step_table(analysis: Analysis) -> pd.DataFrame:
    """rank, step, start, end (aligned ns), ms: the ProfilerStep windows, else each rank's whole
    span as step -1."""
    steps = analysis.steps[["rank", "step", "start", "end"]]
    if not len(steps) and len(analysis.ops):
        start, end = analysis.start, analysis.end
        spans = pd.DataFrame({"rank": analysis.ops.frame["rank"], "start": start, "end": end})
        steps = spans.groupby("rank", as_index=False).agg(start=("start", "min"),
                                                          end=("end", "max"))
        steps.insert(1, "step", -1)
    return steps.assign(ms=(steps["end"] - steps["start"]) / NS_PER_MS).reset_index(drop=True)


def step_ms(analysis: Analysis) -> dict[int, float]:
    """Step -> the slowest rank's step time."""
    return {int(s): float(ms) for s, ms in step_table(analysis).groupby("step")["ms"].max().items()}


def step_time_ms(analysis: Analysis) -> float:
    """The job's step time: the slowest rank's step, median over the steps (nan if none)."""
    per_step = list(step_ms(analysis).values())
    return float(np.median(per_step)) if per_step else float("nan")


def rank_step_ms(analysis: Analysis) -> dict[int, float]:
    """Rank -> its median step time."""
    return {int(r): float(ms) for r, ms in step_table(analysis).groupby("rank")["ms"].median()
            .items()}


def step_count(analysis: Analysis) -> int:
    """Profiled steps (at least 1, so per-step means of an empty analysis stay 0)."""
    return max(len(step_ms(analysis)), 1)


# --- bubbles and the critical path -------------------------------------------------------------
def bubble_table(analysis: Analysis) -> pd.DataFrame:
    """step, rank, category, ms: bubble time charged to each root-cause category."""
    rows = [(b.step, b.rank, category, ns / NS_PER_MS)
            for b in analysis.bubbles for category, ns in b.by_category().items()]
    table = pd.DataFrame(rows, columns=["step", "rank", "category", "ms"])
    return table.groupby(["step", "rank", "category"], as_index=False)["ms"].sum()


def bubble_ms(analysis: Analysis) -> dict[str, float]:
    """Category -> bubble ms per step, summed over ranks (rank·ms: not one rank's time)."""
    per = bubble_table(analysis).groupby("category")["ms"].sum() / step_count(analysis)
    return {str(k): float(v) for k, v in per.sort_values(ascending=False).items()}


def rank_bubble_ms(analysis: Analysis) -> dict[int, dict[str, float]]:
    """Rank -> category -> bubble ms per step."""
    per = bubble_table(analysis).groupby(["rank", "category"])["ms"].sum() / step_count(analysis)
    out: dict[int, dict[str, float]] = {}
    for (rank, category), ms in per.items():
        out.setdefault(int(rank), {})[str(category)] = float(ms)
    return out


class SlowestRank(NamedTuple):
    """A step's slowest rank and the bubble time it stood exposed itself (not summed over
    ranks): in all, and by category, most first."""

    rank: int
    exposed_ms: float
    by_cause: dict[str, float]


def slowest_rank_bubbles(analysis: Analysis) -> dict[int, SlowestRank]:
    """Step -> its slowest rank's own bubbles in that step."""
    steps, table = step_table(analysis), bubble_table(analysis)
    exposed: Counter[tuple[int, int]] = Counter()
    for bubble in analysis.bubbles:
        exposed[bubble.step, bubble.rank] += bubble.dur
    slowest = steps.loc[steps.groupby("step")["ms"].idxmax(), ["step", "rank"]]
    out = {}
    for step, rank in slowest.itertuples(index=False):
        mine = table[(table["step"] == step) & (table["rank"] == rank)]
        out[int(step)] = SlowestRank(int(rank), exposed[step, rank] / NS_PER_MS,
                                     _sorted(dict(zip(mine["category"], mine["ms"], strict=True))))
    return out


def critical_path_ms(analysis: Analysis) -> dict[str, dict[str, float]]:
    """The critical path's composition: ms per step by op kind and by rank."""
    rows = [(seg.category, str(seg.rank), (seg.end - seg.start) / NS_PER_MS)
            for path in analysis.critical_paths.values() for seg in path]
    table = pd.DataFrame(rows, columns=["kind", "rank", "ms"])
    count = max(len(analysis.critical_paths), 1)
    return {by: _sorted((table.groupby(by)["ms"].sum() / count).to_dict())
            for by in ("kind", "rank")}


def _sorted(values: dict[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}


# --- communication / compute overlap -----------------------------------------------------------
def comm_dims(analysis: Analysis) -> np.ndarray:
    """Parallel dimension of every op's group ("" for non-communication): the group's inferred
    dim, else by comm type (all-to-all → ep, P2P → pp, other collectives → dp)."""
    frame, groups = analysis.ops.frame, analysis.trace.groups
    known = dict(zip(groups["group"], groups["dim"], strict=True)) if len(groups) else {}
    dims = frame["group"].map(known).astype(object).fillna("")  # all unknown: floats
    dims = dims.where(dims.isin(DIMS), "").to_numpy()
    fallback = np.where(frame["comm"] == "alltoall", "ep",
                        np.where(frame["comm"].isin(schema.P2P_COMMS), "pp", "dp"))
    dims = np.where(dims == "", fallback, dims)
    is_comm = frame["kind"].isin([schema.COLLECTIVE, schema.P2P]).to_numpy()
    return np.where(is_comm, dims, "")


def comm_categories(analysis: Analysis) -> np.ndarray:
    """Root-cause category every op's communication is charged to, as blame charges it
    (causes.for_collective: its group's dimension, else its comm type, else COLLECTIVE); "" for
    ops that are not communication."""
    frame, groups = analysis.ops.frame, analysis.trace.groups
    dims = dict(zip(groups["group"], groups["dim"], strict=True)) if len(groups) else {}
    codes, pairs = pd.factorize(pd.MultiIndex.from_arrays([frame["group"], frame["comm"]]))
    table = np.array([causes.for_collective(str(dims.get(group, "")), str(comm)) if comm else ""
                      for group, comm in pairs], dtype=object)
    return table[codes] if len(table) else np.zeros(0, dtype=object)


def main_compute(analysis: Analysis) -> np.ndarray:
    """Mask of the ops that are computation on their rank's main lane."""
    frame = analysis.ops.frame
    main = frame["rank"].map(analysis.ops.main_lanes()).fillna(-1).to_numpy()
    working = (frame["kind"] == schema.COMPUTE) | ((frame["kind"] == schema.HOST)
                                                  & (frame["comm"] == ""))
    return (frame["lane_id"].to_numpy() == main) & working.to_numpy()


def overlap_table(analysis: Analysis) -> pd.DataFrame:
    """rank, step, dim, comm_ms, overlap_ms: per step, the time the rank's communication of each
    group kind was in flight, and how much of it its main lane spent computing."""
    start, end = analysis.start, analysis.end
    dims, computing = comm_dims(analysis), main_compute(analysis)
    ranks = analysis.ops.frame["rank"].to_numpy()
    order = np.argsort(ranks, kind="stable")
    by_rank = ranks[order]
    rows = []
    for rank, windows in step_table(analysis).groupby("rank"):
        mine = order[np.searchsorted(by_rank, rank, "left"):np.searchsorted(by_rank, rank, "right")]
        s, e, d, c = start[mine], end[mine], dims[mine], computing[mine]
        for step, lo, hi in windows[["step", "start", "end"]].itertuples(index=False):
            work = _union(s[c], e[c], lo, hi)
            for dim in np.unique(d[d != ""]):
                comm = _union(s[d == dim], e[d == dim], lo, hi)
                if len(comm[0]):
                    rows.append((int(rank), int(step), str(dim), _length(comm) / NS_PER_MS,
                                 _overlap(comm, work) / NS_PER_MS))
    return pd.DataFrame(rows, columns=["rank", "step", "dim", "comm_ms", "overlap_ms"])


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


def _union(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to [lo, hi] and merged into sorted disjoint ones."""
    start, end = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = end > start
    start, end = start[keep], end[keep]
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, reach = start[order], np.maximum.accumulate(end[order])
    first = np.ones(len(start), dtype=bool)
    first[1:] = start[1:] > reach[:-1]
    last = np.append(np.flatnonzero(first)[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def _length(intervals: tuple[np.ndarray, np.ndarray]) -> int:
    return int((intervals[1] - intervals[0]).sum())


def _overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two sets of disjoint sorted intervals."""
    points = np.unique(np.concatenate([*a, *b]))
    if len(points) < 2:
        return 0
    left = points[:-1]
    both = _inside(a, left) & _inside(b, left)
    return int(np.diff(points)[both].sum())


def _inside(intervals: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
    starts, ends = intervals
    return np.searchsorted(starts, points, "right") > np.searchsorted(ends, points, "right")


# --- what released a wait, and chains ----------------------------------------------------------
def releaser(bubble: Bubble) -> Interval | None:
    """The piece of a bubble that released it: the last one, passing over the short records and
    wake-ups (under SETTLE_NS or SETTLE_SHARE of the bubble) that follow the op waited for."""
    pieces = sorted(bubble.intervals, key=lambda p: p.end)
    settle = max(SETTLE_NS, SETTLE_SHARE * bubble.dur)
    for piece in reversed(pieces):
        if piece.dur >= settle:
            return piece
    return pieces[-1] if pieces else None


def reduction_names(analysis: Analysis) -> frozenset[str]:
    """Names of the ops whose comm type is a reduction (AllReduce, ReduceScatter, Reduce)."""
    frame = analysis.ops.frame
    return frozenset(frame.loc[frame["comm"].isin(REDUCTIONS), "name"].unique())


def is_reduction(piece: Interval, reductions: frozenset[str]) -> bool:
    """Whether a blamed piece is a DP-dimension reduction; `reductions`: reduction_names."""
    return piece.category == causes.DP_REDUCTION and piece.name in reductions


def op_family(name: str) -> str:
    """An op name without its instance numbers (and the group after them, as in HCCL names):
    `hcom_allReduce__982_37_1@123` → hcom_allReduce, `ProfilerStep#3` → ProfilerStep."""
    return _INSTANCE.sub("", name).rstrip("_") or name


def lane_family(lane: str) -> str:
    """A lane name that stays the same across runs (host thread ids differ from run to run)."""
    return _THREAD_ID.sub("thread", lane)


def chain_table(analysis: Analysis) -> pd.DataFrame:
    """Bubbles grouped into chains by (rank, category, root rank, root lane, root op family):
    ms per step, bubble count, and the longest bubble as the example."""
    rows = []
    for bubble in analysis.bubbles:
        root = bubble.root
        rows.append({"rank": bubble.rank, "category": bubble.category,
                     "root_rank": root.rank if root else bubble.rank,
                     "root_lane": lane_family(root.lane) if root else "",
                     "root_op": op_family(root.name) if root else "",
                     "ns": bubble.dur, "bubble": bubble})
    keys = ["rank", "category", "root_rank", "root_lane", "root_op"]
    if not rows:
        return pd.DataFrame(columns=[*keys, "ms", "count", "example"])
    table = pd.DataFrame(rows)
    grouped = table.groupby(keys, sort=False)
    chains = grouped.agg(ns=("ns", "sum"), count=("ns", "size")).reset_index()
    chains["ms"] = chains.pop("ns") / NS_PER_MS / step_count(analysis)
    chains["example"] = grouped["bubble"].agg(lambda b: max(b, key=lambda x: x.dur)).to_numpy()
    return chains.sort_values("ms", ascending=False, ignore_index=True)
