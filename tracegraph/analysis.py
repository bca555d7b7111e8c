"""The whole analysis of a trace: match, align clocks, find and blame bubbles, critical path."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.blame import Blamer, Bubble
from tracegraph.clock import estimate_offsets
from tracegraph.critical import PathSegment, critical_path
from tracegraph.match import Matches, match
from tracegraph.ops import Ops, build_ops
from tracegraph.steps import step_markers
from tracegraph.trace import Trace

SLOW_RANK_FACTOR = 1.15  # compute busier than this × the median of the other ranks = straggler
SLOW_RANK_SHARE = 0.05  # ... and by at least this share of the profiled time


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


def analyze(trace: Trace, *, threshold_ms: float = 1.0) -> Analysis:
    """Run every stage of the analysis on `trace`."""
    ops = build_ops(trace.events)
    matches = match(ops, trace.group_members())
    offsets = estimate_offsets(ops, matches)
    shift = ops.frame["rank"].map(offsets).fillna(0).astype("int64").to_numpy()
    start, end = ops.start - shift, ops.end - shift
    steps = step_windows(trace.events, offsets)
    blamer = Blamer(ops, matches, start, end, trace.groups, set())
    slow = blamer.slow_ranks = slow_ranks(ops, blamer, _profiled_ns(steps, start, end))
    blamer.slow_op = slow_ops(ops, slow)
    bubbles = find_bubbles(ops, blamer, steps, int(threshold_ms * 1e6))
    paths = {int(step): critical_path(blamer, _ops_in(start, end, lo, hi), (lo, hi))
             for step, lo, hi in _step_spans(steps, start, end)}
    return Analysis(trace=trace, ops=ops, matches=matches, offsets=offsets, start=start, end=end,
                    steps=steps,
                    bubbles=bubbles, critical_paths=paths, slow_ranks=slow,
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
    slow = set()
    for rank, ns in work.items():
        others = work.drop(rank).median() if len(work) > 1 else ns
        if ns > SLOW_RANK_FACTOR * others and ns - others > SLOW_RANK_SHARE * profiled_ns:
            slow.add(int(rank))
    return slow


def slow_ops(ops: Ops, slow: set[int]) -> np.ndarray:
    """Per op: is it straggler compute? An op whose name also runs on other ranks is slow when
    its rank's median duration for that name exceeds SLOW_RANK_FACTOR × the other ranks'
    median (an expert MLP on an overloaded EP rank, every kernel of a slow GPU); an op only
    its own rank runs is slow when the whole rank is."""
    frame = ops.frame
    compute = frame[frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER])]
    medians = (compute["end"] - compute["start"]).groupby(
        [compute["name"], compute["rank"]]).median().rename("median").reset_index()
    flagged = set()
    for name, per_rank in medians.groupby("name"):
        if len(per_rank) < 2:
            continue
        values = per_rank.set_index("rank")["median"]
        for rank, ns in values.items():
            if ns > SLOW_RANK_FACTOR * values.drop(rank).median():
                flagged.add((name, int(rank)))
    shared = set(medians.loc[medians.duplicated("name", keep=False), "name"])
    names, ranks = frame["name"].to_numpy(), frame["rank"].to_numpy()
    return np.fromiter(((n, int(r)) in flagged or (n not in shared and int(r) in slow)
                        for n, r in zip(names, ranks, strict=True)), dtype=bool,
                       count=len(frame))


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
    for rank, lane_id in ops.main_lanes().items():
        idx = np.flatnonzero(lane_ids == lane_id)
        for step, lo, hi in _rank_steps(steps, rank, blamer, idx):
            inside = idx[(blamer.end[idx] > lo) & (blamer.start[idx] < hi)]
            bubbles += _lane_bubbles(blamer, inside, int(step), lo, hi, threshold_ns)
    return sorted(bubbles, key=lambda b: -b.dur)


def _rank_steps(steps: pd.DataFrame, rank: int, blamer: Blamer, idx: np.ndarray):
    mine = steps[steps["rank"] == rank]
    if len(mine):
        return list(mine[["step", "start", "end"]].itertuples(index=False))
    if not len(idx):
        return []
    return [(-1, int(blamer.start[idx].min()), int(blamer.end[idx].max()))]


def _lane_bubbles(blamer: Blamer, inside: np.ndarray, step: int, lo: int, hi: int,
                  threshold_ns: int) -> list[Bubble]:
    found = []
    start, end, kind = blamer.start, blamer.end, blamer.kind
    previous_end = None
    for i in inside:
        a, b = max(start[i], lo), min(end[i], hi)
        if previous_end is not None and a - previous_end > threshold_ns:
            found.append(_bubble(blamer, i, previous_end, a, step, "idle",
                                 blamer.gap(i, previous_end, a)))
        previous_end = b if previous_end is None else max(previous_end, b)
        if b - a <= threshold_ns:
            continue
        if kind[i] in (schema.WAIT, schema.P2P, schema.COLLECTIVE):
            found.append(_bubble(blamer, i, a, b, step, str(blamer.name[i]),
                                 blamer.blocked(i, a, b)))
        elif kind[i] == schema.MARKER and blamer.released_by(i) >= 0:
            found.append(_bubble(blamer, i, a, b, step, str(blamer.name[i]),
                                 blamer.blocked_thread(i, a, b)))
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
