"""The whole analysis of a trace: match, align clocks, find and blame bubbles, critical path."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.blame import Blamer, Bubble
from tracegraph.analysis.critical_path import PathSegment, critical_path
from tracegraph.graph.clock import estimate_offsets
from tracegraph.graph.match import Matches, match
from tracegraph.graph.ops import Ops, build_ops
from tracegraph.loading.steps import step_markers
from tracegraph.loading.trace import Trace
from tracegraph.progress import Progress

SLOW_RANK_FACTOR = 1.15  # compute busier than this × the median of the other ranks = straggler
SLOW_RANK_SHARE = 0.05  # ... and by at least this share of the profiled time
PROGRESS_EVENTS = 1_000_000  # analyses of more events than this show a progress bar


@dataclass
class Analysis:
    """What held each step back, and why."""

    trace: Trace
    ops: Ops
    matches: Matches
    offsets: dict[int, int]  # rank -> ns subtracted to align clocks
    start: np.ndarray  # every op of ops.frame: start on the aligned clock
    end: np.ndarray  # ... and end
    steps: pd.DataFrame  # rank, step, start, end (aligned ns)
    bubbles: list[Bubble]
    critical_paths: dict[int, list[PathSegment]]  # step -> path
    slow_ranks: set[int]
    warnings: list[str] = field(default_factory=list)

    @property
    def origin(self) -> int:
        """Aligned ns of time zero for the *_ms values: the first step's earliest start."""
        if len(self.steps):
            return int(self.steps["start"].min())
        return int(self.start.min()) if len(self.start) else 0

    def blame(self, step: int | None = None) -> dict[str, float]:
        """ms of bubble charged to each category (all steps, or one)."""
        totals: dict[str, float] = {}
        for bubble in self.bubbles:
            if step is None or bubble.step == step:
                for category, ns in bubble.by_category().items():
                    totals[category] = totals.get(category, 0.0) + ns / 1e6
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def analyze(trace: Trace, *, threshold_ms: float = 1.0, executor: Executor | None = None
            ) -> Analysis:
    """Run every stage of the analysis on `trace` (a progress bar on stderr for big traces);
    the per-rank matching runs on `executor` when one is given (e.g. a Dask cluster's)."""
    with Progress("analysis: ops, match, clocks, blame, bubbles, critical path", total=6,
                  enabled=len(trace.events) > PROGRESS_EVENTS) as bar:
        ops = build_ops(trace.events)
        bar.advance()
        matches = match(ops, trace.group_members(), executor)
        bar.advance()
        offsets = estimate_offsets(ops, matches)
        shift = ops.frame["rank"].map(offsets).fillna(0).astype("int64").to_numpy()
        start, end = ops.start - shift, ops.end - shift
        steps = step_windows(trace.events, offsets)
        bar.advance()
        blamer = Blamer(ops, matches, start, end, trace.groups, set())
        slow = blamer.slow_ranks = slow_ranks(ops, blamer, _profiled_ns(steps, start, end))
        blamer.slow_op = slow_ops(ops, slow)
        bar.advance()
        bubbles = find_bubbles(ops, blamer, steps, int(threshold_ms * 1e6))
        bar.advance()
        paths = {int(step): critical_path(blamer, _ops_in(start, end, lo, hi), (lo, hi))
                 for step, lo, hi in _step_spans(steps, start, end)}
        bar.advance()
    return Analysis(trace=trace, ops=ops, matches=matches, offsets=offsets, start=start, end=end,
                    steps=steps, bubbles=bubbles, critical_paths=paths, slow_ranks=slow,
                    warnings=list(matches.warnings))


def step_windows(events: pd.DataFrame, offsets: dict[int, int]) -> pd.DataFrame:
    """rank, step, start, end of every `ProfilerStep#N` on the aligned clock."""
    markers = step_markers(events)
    start = markers["start_ns"] - markers["rank"].map(offsets).fillna(0).astype("int64")
    steps = pd.DataFrame({"rank": markers["rank"], "step": markers["step"], "start": start,
                          "end": start + markers["dur_ns"]})
    return steps.sort_values(["step", "rank"], ignore_index=True).drop_duplicates(
        ["rank", "step"], keep="last")


def slow_ranks(ops: Ops, blamer: Blamer, profiled_ns: int) -> set[int]:
    """Ranks whose main-lane work exceeds the other ranks' median by SLOW_RANK_FACTOR and by
    SLOW_RANK_SHARE of the profiled time.

    Work is compute on a device stream; on a host thread, ops plus annotation-only stretches
    that no other thread's op released (sleeping or Python work, not waiting)."""
    main = ops.main_lanes()
    lane_ids, kind = ops.frame["lane_id"].to_numpy(), blamer.kind
    working = np.isin(lane_ids, list(main.values())) & np.isin(
        kind, [schema.COMPUTE, schema.HOST, schema.MARKER])
    for i in np.flatnonzero(working & (kind == schema.MARKER)):
        working[i] = blamer.released_by(i) < 0  # a released annotation stretch was a wait
    work = pd.Series(blamer.end - blamer.start)[working].groupby(
        blamer.rank[working]).sum().reindex(list(main), fill_value=0)
    ns = work.to_numpy()
    others = median_of_others(ns, np.zeros(len(ns), dtype=np.int64)) if len(ns) > 1 else ns
    slow = (ns > SLOW_RANK_FACTOR * others) & (ns - others > SLOW_RANK_SHARE * profiled_ns)
    return {int(r) for r in work.index[slow]}


def slow_ops(ops: Ops, slow: set[int]) -> np.ndarray:
    """Per op: is it straggler compute? An op whose name also runs on other ranks is slow when
    its rank's median duration for that name exceeds SLOW_RANK_FACTOR × the other ranks'
    median (an expert MLP on an overloaded EP rank, every kernel of a slow GPU); an op only
    its own rank runs is slow when the whole rank is."""
    frame = ops.frame
    names, ranks = frame["name"].to_numpy(), frame["rank"].to_numpy().astype(np.int64)
    codes, uniques = pd.factorize(names, use_na_sentinel=False)
    compute = frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER]).to_numpy(
        ) & ~pd.isna(names)  # groupby leaves out unnamed ops
    dur = (frame["end"] - frame["start"]).to_numpy()[compute]
    medians = pd.Series(dur).groupby([codes[compute], ranks[compute]]).median()
    name_code = medians.index.get_level_values(0).to_numpy()
    rank = medians.index.get_level_values(1).to_numpy()
    shared = np.bincount(name_code, minlength=len(uniques)) >= 2
    others = median_of_others(medians.to_numpy(), name_code)
    flagged = shared[name_code] & (medians.to_numpy() > SLOW_RANK_FACTOR * others)
    span = int(ranks.max()) + 1 if len(ranks) else 1
    hit = np.isin(codes * span + ranks, name_code[flagged] * span + rank[flagged])
    return hit | (~shared[codes] & np.isin(ranks, list(slow)))


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


def _profiled_ns(steps: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> int:
    """The time the profile covers: the sum of step lengths, else the whole span."""
    if len(steps):
        return int((steps.groupby("step")["end"].max() - steps.groupby("step")["start"].min()
                    ).sum())
    return int(end.max() - start.min()) if len(start) else 0


def find_bubbles(ops: Ops, blamer: Blamer, steps: pd.DataFrame, threshold_ns: int
                 ) -> list[Bubble]:
    """Every wait, idle gap or waiting comm op longer than the threshold on a main lane."""
    bubbles = []
    lane_ids = ops.frame["lane_id"].to_numpy()
    steps_of = dict(iter(steps.groupby("rank"))) if len(steps) else {}
    for rank, lane_id in ops.main_lanes().items():
        first, last = np.searchsorted(lane_ids, [lane_id, lane_id + 1])  # sorted by lane
        idx = np.arange(first, last)
        for step, lo, hi in _rank_steps(steps_of.get(rank), blamer, idx):
            inside = idx[(blamer.end[idx] > lo) & (blamer.start[idx] < hi)]
            bubbles += _lane_bubbles(blamer, inside, int(step), lo, hi, threshold_ns)
    return sorted(bubbles, key=lambda b: -b.dur)


def _rank_steps(mine: pd.DataFrame | None, blamer: Blamer, idx: np.ndarray) -> list[tuple]:
    if mine is not None and len(mine):
        return list(mine[["step", "start", "end"]].itertuples(index=False))
    if not len(idx):
        return []
    return [(-1, int(blamer.start[idx].min()), int(blamer.end[idx].max()))]


def _lane_bubbles(blamer: Blamer, inside: np.ndarray, step: int, lo: int, hi: int,
                  threshold_ns: int) -> list[Bubble]:
    """The bubbles of one lane's ops `inside` [lo, hi]: idle gaps longer than the threshold
    (after everything before ended), and long waits, comm ops and released annotations."""
    if not len(inside):
        return []
    a, b = np.maximum(blamer.start[inside], lo), np.minimum(blamer.end[inside], hi)
    before = np.maximum.accumulate(b)  # the latest end so far
    idle = np.zeros(len(inside), dtype=bool)
    idle[1:] = a[1:] - before[:-1] > threshold_ns
    kind = blamer.kind[inside]
    waiting = (b - a > threshold_ns) & np.isin(kind, [schema.WAIT, schema.P2P, schema.COLLECTIVE,
                                                      schema.MARKER])
    found = []
    for k in np.flatnonzero(idle | waiting):
        i = inside[k]
        if idle[k]:
            found.append(_bubble(blamer, i, before[k - 1], a[k], step, "idle",
                                 blamer.gap(i, before[k - 1], a[k])))
        if not waiting[k]:
            continue
        if kind[k] != schema.MARKER:
            found.append(_bubble(blamer, i, a[k], b[k], step, str(blamer.name[i]),
                                 blamer.blocked(i, a[k], b[k])))
        elif blamer.released_by(i) >= 0:
            found.append(_bubble(blamer, i, a[k], b[k], step, str(blamer.name[i]),
                                 blamer.blocked_thread(i, a[k], b[k])))
    return found


def _bubble(blamer: Blamer, i: int, a: int, b: int, step: int, name: str, intervals) -> Bubble:
    return Bubble(rank=int(blamer.rank[i]), lane=str(blamer.lane[i]), start=int(a), end=int(b),
                  name=name, step=step, intervals=intervals)


def _step_spans(steps: pd.DataFrame, start: np.ndarray, end: np.ndarray
                ) -> list[tuple[int, int, int]]:
    """(step, start, end) over all ranks; the whole trace as step -1 when there are no steps."""
    if not len(steps):
        return [(-1, int(start.min()), int(end.max()))] if len(start) else []
    spans = steps.groupby("step").agg(start=("start", "min"), end=("end", "max"))
    return [(int(s), int(r.start), int(r.end)) for s, r in spans.iterrows()]


def _ops_in(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Ops that end inside the window (the critical path ends at the latest of them)."""
    return np.flatnonzero((end > lo) & (end <= hi) & (start < hi))
