"""The whole analysis of a trace: ops, matches, clocks, DepGraph, blamed bubbles, critical paths."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.blame import Blamer, Bubble, pipelined_job, sureness_level
from tracegraph.analysis.bubbles import SAMPLED, find_bubbles, sureness
from tracegraph.analysis.critical_path import PathSegment, critical_path, step_windows_of_slowest
from tracegraph.analysis.cut_steps import cut_warnings, without_cut_steps
from tracegraph.analysis.peers import Peers, find_peers
from tracegraph.analysis.step_stragglers import COLUMNS as STEP_COLUMNS
from tracegraph.analysis.step_stragglers import by_step
from tracegraph.analysis.stragglers import main_work, profiled_ns, slow_ops, slow_ranks
from tracegraph.analysis.walk import BindingWalk
from tracegraph.graph.clock import estimate_offsets
from tracegraph.graph.depgraph import DepGraph, build_graph
from tracegraph.graph.match import Matches, match
from tracegraph.graph.ops import Ops, build_ops
from tracegraph.heap import hand_back
from tracegraph.loading.steps import step_markers, unstepped
from tracegraph.loading.trace import Trace
from tracegraph.progress import Progress

T = TypeVar("T")
PROGRESS_EVENTS = 1_000_000  # analyses of more events than this show a progress bar
NS_PER_MS = 1e6
OWN_STRAGGLING = (1.0, "its own ops against its peers' median")  # measured, not matched


@dataclass
class Analysis:
    """What held each step back, and why."""

    trace: Trace
    ops: Ops
    matches: Matches
    graph: DepGraph  # the dependency DAG every later stage reads
    offsets: dict[int, int]  # rank -> ns subtracted to align clocks
    start: np.ndarray  # every op of ops.frame: start on the aligned clock
    end: np.ndarray  # ... and end
    steps: pd.DataFrame  # rank, step, start, end (aligned ns)
    bubbles: list[Bubble]
    critical_paths: dict[int, list[PathSegment]]  # step -> path
    slow_ranks: set[int]
    peers: Peers  # who each rank's speed was judged against, and who was not judged
    slow_op: np.ndarray  # per op: straggler compute
    warnings: list[str] = field(default_factory=list)
    threshold_ms: float = 1.0  # the shortest stall counted as a bubble
    step_stragglers: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    """step, rank, work_ms, peers_ms, ratio: a rank's work in one step STEP_FACTOR times its
    peers' median there (step_stragglers.py)"""

    @property
    def sampled(self) -> bool:
        """Whether the trace is sub-sampled or truncated (`DepGraph.sampled`)."""
        return self.graph.sampled

    @property
    def caveat(self) -> str:
        """What makes every timing verdict of this analysis unsure ("" when nothing does): a
        sub-sampled or truncated trace, whose idle gaps may be events it lost."""
        return f"{SAMPLED}: idle gaps may be events the trace lost" if self.sampled else ""

    def no_replay(self) -> str:
        """Why the whole graph cannot be replayed (whatif, gain ceilings); "" when it can."""
        return f"no replay: {self.caveat}" if self.caveat else ""

    def by_part(self, function: Callable[..., T], *args: object) -> list[T]:
        """`function(analysis, *args)` for each part of the ranks, in rank order: here the
        whole analysis, once; on a cluster (`distributed.ClusterAnalysis`) an Analysis of each
        part's ranks, where they lie. For what is computed rank by rank."""
        return [function(self, *args)]

    def table_by_part(self, function: Callable[..., pd.DataFrame], *args: object
                      ) -> pd.DataFrame:
        """`by_part` of a function returning a table: the parts' tables as one."""
        tables = self.by_part(function, *args)
        kept = [t for t in tables if len(t)] or tables[:1]
        return kept[0] if len(kept) == 1 else pd.concat(kept, ignore_index=True)

    @property
    def origin(self) -> int:
        """Aligned ns of time zero for the *_ms values: the first step's earliest start."""
        if len(self.steps):
            return int(self.steps["start"].min())
        return int(self.start.min()) if len(self.start) else 0

    def step_table(self) -> pd.DataFrame:
        """rank, step, start, end (aligned ns), ms: the ProfilerStep windows, else each rank's
        whole span as step -1."""
        steps = self.steps[["rank", "step", "start", "end"]]
        if not len(steps):
            steps = self.rank_spans()
        return steps.assign(ms=(steps["end"] - steps["start"]) / NS_PER_MS).reset_index(drop=True)

    def rank_spans(self) -> pd.DataFrame:
        """rank, step (-1), start, end: each rank's whole span (aligned ns)."""
        if not len(self.ops):
            return self.steps[["rank", "step", "start", "end"]]
        return spans_by_rank(self.ops.frame["rank"], self.start, self.end)

    def stated_steps(self) -> pd.DataFrame:
        """rank, step, ms, computing_ms of the steps a rank's step table states (Ascend's
        step_trace_time.csv) that its timeline holds no window of: a rank whose profile has no
        timeline. They have a duration, never a window."""
        stated = self.trace.stated_steps()
        timed = pd.MultiIndex.from_frame(self.steps[["rank", "step"]].astype("int64"))
        missing = ~pd.MultiIndex.from_frame(stated[["rank", "step"]].astype("int64")).isin(timed)
        return stated[missing].reset_index(drop=True)

    def released(self) -> np.ndarray:
        """Per op: when its binding cross-rank dependency (the P2P half posted last, the
        collective member that arrived last) let it go, as the binding walk times it, else its
        start: what a comm op runs after it is its transfer (walk.RAN)."""
        return release_times(self.graph)

    def straggling_sureness(self, rank: int) -> tuple[str, str]:
        """How sure a rank's own straggling compute on a step's critical path is, and why: its
        ops measured against its peers' median, capped as a bubble's chain is
        (`bubbles.sureness`) where collectives refused order matching (the path ran through
        matches that are not trusted) or where the rank's profile misses events."""
        confidence, why = sureness(OWN_STRAGGLING, self.sampled, self.trace.incomplete_ranks(),
                                   rank, [])
        return sureness_level(confidence), why

    def blame(self, step: int | None = None) -> dict[str, float]:
        """ms of bubble charged to each category (all steps, or one)."""
        totals: dict[str, float] = {}
        for bubble in self.bubbles:
            if step is None or bubble.step == step:
                for category, ns in bubble.by_category().items():
                    totals[category] = totals.get(category, 0.0) + ns / 1e6
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def release_times(graph: DepGraph, remote_start: np.ndarray | None = None) -> np.ndarray:
    """`Analysis.released` of the ops of `graph` (a dependency on an op outside it, on a
    cluster's part, starts at `remote_start`; unknown without: the op's start)."""
    start, dep, n = graph.start, graph.dep, len(graph)
    out = start.copy()
    local = np.flatnonzero((dep >= 0) & (dep < n) & (graph.how != "event_id"))
    out[local] = start[dep[local]]
    if remote_start is not None and len(remote_start):
        remote = np.flatnonzero(dep >= n)
        out[remote] = remote_start[dep[remote] - n]
    return np.clip(out, start, graph.end)


def spans_by_rank(ranks: pd.Series, start: np.ndarray, end: np.ndarray) -> pd.DataFrame:
    """rank, step (-1), start, end: the first start and last end of each rank's ops."""
    spans = pd.DataFrame({"rank": ranks, "start": start, "end": end})
    steps = spans.groupby("rank", as_index=False).agg(start=("start", "min"), end=("end", "max"))
    steps.insert(1, "step", -1)
    return steps


def analyze(trace: Trace, *, threshold_ms: float = 1.0, executor: Executor | None = None
            ) -> Analysis:
    """Run every stage of the analysis on `trace` (a progress bar on stderr for big traces);
    the per-rank matching runs on `executor` when one is given (e.g. a Dask cluster's)."""
    with Progress("analysis: ops, match, clocks, graph, bubbles, critical path", total=6,
                  enabled=len(trace.events) > PROGRESS_EVENTS) as bar:
        ops = build_ops(trace.events)
        hand_back()  # what building the ops took: later stages' peaks start from here
        bar.advance()
        matches = match(ops, trace.group_members(), executor)
        bar.advance()
        offsets = estimate_offsets(ops, matches)
        shift = ops.frame["rank"].map(offsets).fillna(0).astype("int64").to_numpy()
        graph = build_graph(ops, matches, ops.start - shift, ops.end - shift, trace.groups)
        graph.incomplete = trace.incomplete_ranks()
        hand_back()
        windows = step_windows(trace.events, offsets)
        steps = without_cut_steps(with_launched_work(windows, graph), graph)
        bar.advance()
        walk = BindingWalk(graph)
        profiled = profiled_ns(steps, graph.start, graph.end)
        pipelined = pipelined_job(ops.frame, trace.groups)
        peers = find_peers(ops, trace.groups, graph.incomplete, trace.stated_steps(), pipelined)
        working = main_work(walk)  # both judgements weigh the same work
        slow = slow_ranks(walk, profiled, peers, working)
        per_step, slow_in_step = by_step(walk, steps, peers, working)
        slow_op = slow_ops(ops, slow, profiled, peers) | slow_in_step
        blamer = Blamer(walk, trace.groups, slow_op, pipelined)
        bar.advance()
        bubbles = find_bubbles(blamer, steps, int(threshold_ms * 1e6))
        bar.advance()
        paths = {step: critical_path(walk, rank, window, partial(blamer.category, rank=rank))
                 for step, rank, window in _path_windows(steps, graph)}
        bar.advance()
    return Analysis(trace=trace, ops=ops, matches=matches, graph=graph, offsets=offsets,
                    start=graph.start, end=graph.end, steps=steps, bubbles=bubbles,
                    critical_paths=paths, slow_ranks=slow, peers=peers, slow_op=slow_op,
                    warnings=[*graph.warnings, *graph.cycle_warnings(),
                              *unstepped(steps, len(graph)), *cut_warnings(windows, steps)],
                    threshold_ms=threshold_ms,
                    step_stragglers=per_step)


def step_windows(events: pd.DataFrame, offsets: dict[int, int]) -> pd.DataFrame:
    """rank, step, start, end of every `ProfilerStep#N` on the aligned clock."""
    return step_windows_of_markers(step_markers(events), offsets)


def step_windows_of_markers(markers: pd.DataFrame, offsets: dict[int, int]) -> pd.DataFrame:
    """`step_windows` of the ranks' `step_markers`."""
    start = markers["start_ns"] - markers["rank"].map(offsets).fillna(0).astype("int64")
    steps = pd.DataFrame({"rank": markers["rank"], "step": markers["step"], "start": start,
                          "end": start + markers["dur_ns"]})
    return steps.sort_values(["step", "rank"], ignore_index=True).drop_duplicates(
        ["rank", "step"], keep="last")


def with_launched_work(steps: pd.DataFrame, graph: DepGraph) -> pd.DataFrame:
    """Steps as the device ran them: a host step marker closes when its last kernel is
    enqueued, not when it ran. A step ends when the device work its host launched ends (or the
    marker, if later) and starts when the marker does, unless the device was still running the
    step before: then where that work ended. Before a rank's first step, that is the work on
    its main lane the profile holds no launch of (enqueued before profiling began: the device
    lags the host) that ran before the lane's first op the profile saw launched. The steps of
    a rank so tile its device timeline."""
    launched = np.flatnonzero(graph.launch >= 0)
    if not len(steps) or not len(launched):
        return steps
    steps = steps.sort_values(["rank", "start"], ignore_index=True)
    start, end = steps["start"].to_numpy().copy(), steps["end"].to_numpy().copy()
    for rank, rows in steps.groupby("rank").indices.items():
        ops = launched[graph.rank[launched] == rank]
        if not len(ops):
            continue
        window = np.searchsorted(start[rows], graph.launch[ops], "right") - 1
        inside = (window >= 0) & (graph.launch[ops] < end[rows[np.maximum(window, 0)]])
        np.maximum.at(end, rows[window[inside]], graph.end[ops[inside]])
        start[rows[0]] = max(start[rows[0]], _unseen_work_end(graph, rank))
        previous = np.maximum.accumulate(end[rows])  # where the device was when each began
        start[rows[1:]] = np.maximum(start[rows[1:]], previous[:-1])
    return steps.assign(start=start, end=end).sort_values(["step", "rank"], ignore_index=True)


def _unseen_work_end(graph: DepGraph, rank: int) -> int:
    """When the work on `rank`'s main lane that the profile holds no launch of, and that ran
    before the lane's first launched op, ended (capped at that op's start; -1 if none)."""
    lane = graph.ops.main_lanes().get(rank, -1)
    mine = slice(graph.lane_first[lane], graph.lane_first[lane + 1]) if lane >= 0 else slice(0)
    known = np.flatnonzero(graph.launch[mine] >= 0)
    if not len(known):
        return -1
    first = known[0]  # a lane's ops are in time order
    unseen = (np.isin(graph.kind[mine][:first], schema.DEVICE_WORK)
              & (graph.launch[mine][:first] < 0))
    ends = graph.end[mine][:first][unseen]
    return min(int(ends.max()), int(graph.start[mine][first])) if len(ends) else -1


def _path_windows(steps: pd.DataFrame, graph: DepGraph
                  ) -> list[tuple[int, int | None, tuple[int, int]]]:
    """(step, rank, window) each critical path explains: every step's slowest rank; without
    steps, the whole trace as step -1."""
    if not len(steps):
        return [(-1, None, (int(graph.start.min()), int(graph.end.max())))] if len(graph) else []
    return [(step, rank, (lo, hi)) for step, rank, lo, hi in step_windows_of_slowest(steps)]
