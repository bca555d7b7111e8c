"""The whole analysis on a Dask cluster, with the client's memory flat in the ops of each rank.

The ranks of a `ClusterTrace` are cut into parts (contiguous ranks) kept on the workers: each part
builds its ops, matches its own waits and launches, and extracts its communication ops. Only
those travel: the client matches P2P pairs and collective instances, estimates the clock
offsets, directs the cross-rank dependencies, and sends each part the ones that reach it. A part
then holds its DepGraph, whose cross-rank dependencies on other parts' ops are stand-ins
(`assemble`), and runs the walks of its bubbles and critical paths itself, with the analysis'
own code: where a walk follows a dependency into another part, it leaves a `reach` (explain
[a, b] before that op, at that depth) that the client hands to the part holding the op, in
rounds until no reach is left. What comes back is the walks' pieces in walk order (with
their links and wake-ups), each piece's op described once (rank, lane, name, cause): the client
folds them into intervals and path segments exactly as the local analysis does, so the result
is the same. The client so holds the comm ops, steps, bubbles and paths, never every kernel;
`ops`, `matches`, `graph`, `start` and `end` are gathered from the parts only when a command
reads them (report, check, diff, graph, whatif).

What the summary adds is computed rank by rank where the ranks lie too (`Analysis.by_part`: each
part's ranks as an Analysis of their own, `_PartAnalysis`): the overlap and the findings' tables,
the pipeline's blocks (the phase scores of op names summed over the parts first); the client
combines their rows as the local analysis does, so `analyze --dask` never gathers an op. The gain
ceilings are refused on a cluster (`ON_CLUSTER`): a replay of the whole graph needs every op of
every rank in one process.

A cycle of dependencies is looked for within each part; one that would run through several
parts is not (the local analysis finds it).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from tracegraph.analysis.analyze import (
    Analysis,
    release_times,
    spans_by_rank,
    step_windows_of_markers,
    with_launched_work,
)
from tracegraph.analysis.blame import (
    Blamer,
    Bubble,
    Interval,
    merged,
    own_or,
    pipelined_job,
    through,
)
from tracegraph.analysis.bubbles import find_bubbles, sureness
from tracegraph.analysis.critical_path import (
    PathSegment,
    last_key,
    no_op_path,
    segment_of,
    segments,
    step_windows_of_slowest,
    with_tail,
)
from tracegraph.analysis.cut_steps import cut_warnings, without_cut_steps
from tracegraph.analysis.peers import Peers, op_mix, peers_of
from tracegraph.analysis.step_stragglers import (
    step_slow_mask,
    step_slow_names,
    step_work,
    stragglers,
)
from tracegraph.analysis.stragglers import (
    all_threads,
    name_medians,
    profiled_ns,
    rank_work,
    slow_among,
    slow_names,
    slow_op_mask,
)
from tracegraph.analysis.walk import STEP_TAIL, BindingWalk, Piece, fold_slivers, wake_up
from tracegraph.graph.clock import estimate_offsets
from tracegraph.graph.depgraph import (
    CommTimes,
    DepGraph,
    assemble,
    build_graph,
    direct,
    exchanges,
    missing_peers,
    posted_times,
)
from tracegraph.graph.match import Matches, match_across_ranks, match_within_ranks
from tracegraph.graph.ops import COMM_KINDS, STRING_COLUMNS, Ops, build_ops
from tracegraph.loading.distributed import ClusterTrace
from tracegraph.loading.loader import with_rank
from tracegraph.loading.steps import step_markers, unstepped
from tracegraph.loading.trace import Trace, events_frame

PARTS_PER_WORKER = 2  # parts (of contiguous ranks) per worker: walks of one part run in turn
_COMM_COLUMNS = ["event", "rank", "kind", "comm", "group", "seq", "peer", "start", "end", "stream",
                 "lane"]


def analyze_on_cluster(trace: ClusterTrace, *, threshold_ms: float = 1.0) -> Analysis:
    """`analyze(trace)`, run where the ranks of `trace` lie (see the module docstring)."""
    client = trace.client
    parts = _Parts(client, trace)
    comm, cross, offsets = parts.connect(trace)
    steps, cut = parts.steps(offsets)
    profiled = profiled_ns(steps, *parts.span())
    host = all_threads(list(itertools.chain(*parts.each(_main_modes))))
    incomplete = trace.incomplete_ranks()
    present = {r for facts in parts.facts for r in facts.ranks}
    pipelined = pipelined_job(comm, trace.groups)
    peers = peers_of(pd.concat(parts.each(_mix)).fillna(0), present, trace.groups, incomplete,
                     trace.stated_steps(), pipelined)
    slow = slow_among(pd.concat(parts.each(_work)), profiled, host, peers)
    medians = pd.concat(parts.each(_medians), ignore_index=True)
    flagged, shared = slow_names(medians, slow, profiled, host, peers)
    work = pd.concat(parts.each(_step_work, steps), ignore_index=True)
    per_step = stragglers(work, steps, peers, host)
    in_step = (step_slow_names(work, per_step, peers, host), steps)
    parts.run(_prepare, trace.groups, incomplete, (slow, flagged, shared, peers, in_step),
              pipelined)
    bubbles = parts.bubbles(steps, int(threshold_ms * 1e6), cross.sampled, incomplete)
    paths = parts.paths(steps)
    warnings = cross.warnings + list(itertools.chain(*parts.each(_cycle_warnings))) + unstepped(
        steps, int(parts.first_op[-1])) + cut
    analysis = ClusterAnalysis(trace=trace, ops=None, matches=None, graph=None,  # gathered
                               offsets=offsets, start=None, end=None, steps=steps,
                               bubbles=bubbles, critical_paths=paths, slow_ranks=slow,
                               peers=peers, slow_op=None, warnings=warnings,
                               threshold_ms=threshold_ms, step_stragglers=per_step)
    for name in _GATHERED:
        delattr(analysis, name)
    analysis._parts, analysis._cross = parts, cross
    analysis.parts, analysis.reaches = len(parts.futures), parts.reaches
    analysis.held_ops = int(parts.first_op[-1])
    return analysis


_GATHERED = ("ops", "matches", "graph", "start", "end", "slow_op")
ON_CLUSTER = ("no replay on a cluster (--dask): a replay needs the whole dependency graph, "
              "every op of every rank, in one process; run `analyze` without --dask, or "
              "`whatif`, for them")
T = TypeVar("T")


@dataclass
class ClusterAnalysis(Analysis):
    """An Analysis whose ops, matches, graph and op times stay on the cluster until read;
    `parts` says in how many parts it ran, `reaches` how many walks went on in another part."""

    parts: int = 0
    reaches: int = 0
    held_ops: int = 0  # ops the parts hold (the client never does, unless `ops` is read)

    def __getattr__(self, name: str) -> object:  # only reached for attributes not set
        if name in _GATHERED and "_parts" in self.__dict__:
            self.__dict__.update(self._parts.gathered(self.trace, self._cross))
            del self.__dict__["_parts"]
            self.__dict__.pop("_views", None)
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def held(self) -> bool:
        """Whether the ops are still on the cluster only (nothing gathered them)."""
        return "_parts" in self.__dict__

    @property
    def sampled(self) -> bool:
        return self._cross.sampled

    @property
    def origin(self) -> int:
        if len(self.steps) or not self.held:
            return Analysis.origin.fget(self)
        first, _ = self._parts.span()
        return int(first.min()) if len(first) else 0

    def no_replay(self) -> str:
        return ON_CLUSTER

    def rank_spans(self) -> pd.DataFrame:
        if not self.held:
            return super().rank_spans()
        spans = [s for s in self._parts.each(_rank_spans) if len(s)]
        return pd.concat(spans, ignore_index=True) if spans else self.steps[
            ["rank", "step", "start", "end"]]

    def by_part(self, function: Callable[..., T], *args: object) -> list[T]:
        """`function` on an Analysis of each part's ranks, on its worker (`_PartAnalysis`)."""
        if not self.held:
            return super().by_part(function, *args)
        client = self.trace.client
        if "_views" not in self.__dict__:
            self._views = self._parts.views(self)
        return client.gather([client.submit(_on_view, view, function, *args, pure=False)
                              for view in self._views])


# --- the client's side -------------------------------------------------------------------------
@dataclass
class _Cross:
    """The cross-rank matching the client did: over the comm ops of every part."""

    matches: Matches  # over `comm` rows
    comm: pd.DataFrame  # every part's comm ops; `op` their global op index
    sampled: bool
    warnings: list[str]


class _Parts:
    """The parts of a trace on the cluster, and what the client asks of them."""

    def __init__(self, client: Any, trace: ClusterTrace) -> None:
        self.client = client
        workers = max(len(client.scheduler_info().get("workers", {})), 1)
        count = min(len(trace.held), PARTS_PER_WORKER * workers) or 1
        chunks = [c for c in np.array_split(np.arange(len(trace.held)), count) if len(c)]
        self.futures = [client.submit(_build, [trace.held[i] for i in c], pure=False)
                        for c in chunks]
        self.facts: list[_Facts] = client.gather([client.submit(_facts, f, pure=False)
                                                  for f in self.futures])
        self.first_op, self.first_lane, self.first_event = (
            np.concatenate([[0], np.cumsum([getattr(f, size) for f in self.facts])]
                           ).astype(np.int64) for size in ("ops", "lanes", "events"))
        self.batches: list[Any] = []  # what the walks left on the workers, in walk order
        self.reaches = 0  # walks that went on in another part

    def each(self, function: Any, *args: Any) -> list[Any]:
        """`function(part, *args)` on every part: the results, in part order."""
        return self.client.gather([self.client.submit(function, f, *args, pure=False)
                                   for f in self.futures])

    def run(self, function: Any, *args: Any) -> None:
        """Replace every part by `function(part, *args)`."""
        self.futures = [self.client.submit(function, f, *args, pure=False)
                        for f in self.futures]

    def part_of(self, op: int) -> int:
        return int(np.searchsorted(self.first_op, op, side="right") - 1)

    def span(self) -> tuple[np.ndarray, np.ndarray]:
        """The first start and last end (aligned) over every part, as two op-time arrays."""
        spans = [s for s in self.each(_span) if s is not None]
        return (np.array([s[0] for s in spans], dtype=np.int64),
                np.array([s[1] for s in spans], dtype=np.int64))

    def connect(self, trace: ClusterTrace) -> tuple[pd.DataFrame, _Cross, dict[int, int]]:
        """Match the comm ops across ranks, estimate clocks, direct the dependencies, and give
        each part its graph."""
        comm = pd.concat([f.comm.assign(op=f.comm["local"] + self.first_op[k])
                          for k, f in enumerate(self.facts)], ignore_index=True)
        comm_ops = Ops(frame=comm, lanes=pd.DataFrame())
        matches = Matches(dep=np.full(len(comm), -1, dtype=np.int64),
                          how=np.full(len(comm), "", dtype=object), instances=pd.DataFrame())
        match_across_ranks(comm_ops, trace.group_members(), matches)
        ranks = sorted({r for f in self.facts for r in f.ranks})
        offsets = estimate_offsets(comm_ops, matches, ranks)
        shift = comm["rank"].map(offsets).fillna(0).astype("int64").to_numpy()
        start = comm["start"].to_numpy() - shift
        dep, how = matches.dep.copy(), matches.how.copy()
        exchange = comm["exchange"].to_numpy()
        exchange = np.where(exchange >= 0, exchange + comm["op"].to_numpy() - comm["local"], -1)
        times = CommTimes(start, comm["end"].to_numpy() - shift,
                          comm["posted"].to_numpy() - shift, exchange)
        direct(dep, how, times, matches.instances)
        unprofiled, unmatched = missing_peers(comm, matches, trace.groups, set(ranks))
        sampled = bool(len(matches.instances)) and not matches.instances["safe"].all()
        ops = comm["op"].to_numpy()
        target = np.where(dep >= 0, ops[np.maximum(dep, 0)], -1)
        target_start = np.where(dep >= 0, start[np.maximum(dep, 0)], 0)
        part = np.searchsorted(self.first_op, ops, side="right") - 1
        for k in range(len(self.futures)):
            mine = part == k
            sent = _CrossOf(offsets, comm.loc[mine, "local"].to_numpy(), target[mine],
                            how[mine], target_start[mine], unprofiled[mine], unmatched[mine],
                            int(self.first_op[k]), int(self.first_lane[k]),
                            int(self.first_event[k]), sampled)
            self.futures[k] = self.client.submit(_connect, self.futures[k], sent, pure=False)
        return comm, _Cross(matches, comm, sampled, list(matches.warnings)), offsets

    def steps(self, offsets: dict[int, int]) -> tuple[pd.DataFrame, list[str]]:
        """Each rank's steps on the aligned clock, tiled on the device work they launched, less
        those the profile's end cut short (said in the warnings that come along)."""
        markers = pd.concat([f.markers for f in self.facts], ignore_index=True)
        windows = step_windows_of_markers(markers, offsets)
        parts = self.client.gather(self.submitted(
            _launched, [(windows[windows["rank"].isin(f.held)],) for f in self.facts]))
        steps = pd.concat(parts, ignore_index=True) if parts else windows
        return steps.sort_values(["step", "rank"], ignore_index=True), cut_warnings(windows, steps)

    def bubbles(self, steps: pd.DataFrame, threshold_ns: int, sampled: bool,
                incomplete: dict[int, str]) -> list[Bubble]:
        """Every part's bubbles, their walks resolved across parts and charged (on the
        workers: the client sees the reaches' keys and the charged bubbles only)."""
        batches = self.submitted(_bubbles, [(steps, threshold_ns)] * len(self.futures))
        self.batches += batches
        where = self._walked(batches)
        done = [self.client.submit(_charged, b, self._needed(b, where), sampled, incomplete,
                                   pure=False)
                for b in batches]
        bubbles = [bubble for part in self.client.gather(done) for bubble in part]
        return sorted(bubbles, key=lambda b: -b.dur)

    def paths(self, steps: pd.DataFrame) -> dict[int, list[PathSegment]]:
        """The critical path of every step (the walk back from its slowest rank's last op)."""
        if not len(steps):
            lo, hi = self.span()
            windows = [(-1, None, (int(lo.min()), int(hi.max())))] if len(lo) else []
        else:
            windows = [(s, r, (a, b)) for s, r, a, b in step_windows_of_slowest(steps)]
        ends = self._lasts([(rank, window) for _, rank, window in windows])
        asks: list[list] = [[] for _ in self.futures]
        for k, (op, (_, _, window)) in enumerate(zip(ends, windows, strict=True)):
            if op is not None:
                part = self.part_of(op)
                asks[part].append((k, op, op - int(self.first_op[part]), window))
        batches = self.submitted(_history, [(a,) for a in asks])
        self.batches += batches
        where = self._walked(batches)
        walked = {k: segs for part in self.client.gather(
            [self.client.submit(_segments, b, self._needed(b, where), pure=False)
             for b in batches]) for k, segs in part.items()}
        return {step: [_own(s, rank) for s in walked[k]] if ends[k] is not None
                else no_op_path(rank, window) for k, (step, rank, window) in enumerate(windows)}

    def views(self, analysis: ClusterAnalysis) -> list[Any]:
        """Futures of an Analysis of each part's ranks, with their steps and bubbles."""
        trace, steps, stepped = analysis.trace, analysis.steps, bool(len(analysis.steps))
        views = []
        for future, facts in zip(self.futures, self.facts, strict=True):
            held = set(facts.held)
            mine = _PartAnalysis(
                trace=Trace(trace.source, None, trace.groups,  # type: ignore[arg-type]
                            trace.ranks[trace.ranks["rank"].isin(held)], memory=trace.memory[
                                trace.memory["rank"].isin(held)]),
                ops=None, matches=None, graph=None, offsets=analysis.offsets,  # the part's
                start=None, end=None, steps=steps[steps["rank"].isin(held)],
                bubbles=[b for b in analysis.bubbles if b.rank in held],
                critical_paths={}, slow_ranks=analysis.slow_ranks, peers=analysis.peers,
                step_stragglers=analysis.step_stragglers,
                slow_op=None, threshold_ms=analysis.threshold_ms, stepped=stepped)
            views.append(self.client.submit(_viewed, future, mine, pure=False))
        return views

    def submitted(self, function: Any, args: list[tuple]) -> list[Any]:
        """`function(part, *args[k])` on every part k, its results left on the workers."""
        return [self.client.submit(function, f, *a, pure=False)
                for f, a in zip(self.futures, args, strict=True)]

    def _lasts(self, windows: list[tuple[int | None, tuple[int, int]]]) -> list[int | None]:
        """The op ending each rank's window (`critical_path.last_op`), over the parts."""
        found = self.each(_lasts, windows)
        ends = []
        for w in range(len(windows)):
            keys = [(part[w][0], int(self.first_op[k]) + part[w][1])
                    for k, part in enumerate(found) if part[w] is not None]
            ends.append(max(keys)[1] if keys else None)
        return ends

    def _walked(self, batches: list[Any]) -> dict[tuple, tuple[Any, frozenset]]:
        """Walk on, in rounds, where the walks of `batches` (left on the workers) reached
        into other parts: reach -> (the batch that walked it, the reaches that walk left)."""
        where: dict[tuple, tuple[Any, frozenset]] = {}
        frontier = set().union(*self.client.gather(
            [self.client.submit(_reaches_of, b, pure=False) for b in batches]))
        while frontier:
            by_part: dict[int, list] = defaultdict(list)
            for reach in frontier:
                part = self.part_of(reach[0])
                by_part[part].append((reach, reach[0] - int(self.first_op[part]), *reach[1:]))
            walked = [self.client.submit(_reach, self.futures[p], asks, pure=False)
                      for p, asks in by_part.items()]
            self.batches += walked
            self.reaches += len(frontier)
            for batch, left in zip(walked, self.client.gather(
                    [self.client.submit(_reaches_left, b, pure=False) for b in walked]),
                    strict=True):
                where |= {reach: (batch, frozenset(more)) for reach, more in left.items()}
            frontier = {r for _, more in where.values() for r in more} - set(where)
        return where

    def _needed(self, batch: Any, where: dict[tuple, tuple[Any, frozenset]]) -> list[Any]:
        """The reach batches the walks of `batch` need, directly or through other reaches."""
        pending = set(self.client.submit(_reaches_of, batch, pure=False).result())
        seen: set[tuple] = set()
        while pending:
            reach = pending.pop()
            seen.add(reach)
            pending |= where[reach][1] - seen
        return list({id(where[r][0]): where[r][0] for r in seen}.values())

    def gathered(self, trace: ClusterTrace, cross: _Cross) -> dict[str, object]:
        """The analysis' ops, matches, graph and op times, gathered from the parts."""
        details = self.each(_detail)
        frame = _concat_frames([d["frame"] for d in details])
        lanes = pd.concat([d["lanes"] for d in details], ignore_index=True)
        ops = Ops(frame=frame, lanes=lanes)
        n = len(frame)
        matches = Matches(dep=np.concatenate([d["dep"] for d in details]),
                          how=np.concatenate([d["how"] for d in details]),
                          instances=cross.matches.instances.assign(
                              ops=[[int(cross.comm["op"].iloc[i]) for i in m]
                                   for m in cross.matches.instances.get("ops", [])]),
                          launcher=np.concatenate([d["launcher"] for d in details]),
                          warnings=list(cross.warnings))
        for d in details:
            matches.gates |= d["gates"]
            matches.queued |= d["queued"]
        op = cross.comm["op"].to_numpy()
        dep = cross.matches.dep
        matches.dep[op[dep >= 0]] = op[dep[dep >= 0]]
        matches.how[op] = cross.matches.how
        start = np.concatenate([d["start"] for d in details]) if n else np.zeros(0, np.int64)
        end = np.concatenate([d["end"] for d in details]) if n else np.zeros(0, np.int64)
        graph = build_graph(ops, matches, start, end, trace.groups)
        graph.incomplete = trace.incomplete_ranks()
        for recorded in self.client.gather([self.client.submit(_recorded, b, pure=False)
                                            for b in self.batches]):
            for src, dst, kind in recorded:
                graph.record(src, dst, kind)
        slow_op = np.concatenate([d["slow_op"] for d in details]) if n else np.zeros(0, bool)
        return {"ops": ops, "matches": matches, "graph": graph, "start": start, "end": end,
                "slow_op": slow_op}


def _walk(items: list, done: dict[tuple, list], vias: dict[int, tuple[str, int]] | None = None
          ) -> tuple[list[Piece], tuple[float, str]]:
    """A walk's items with its reaches resolved: its pieces sorted by start, as the local walk
    returns them, and its weakest link (BindingWalk._link: the first least sure one). Into
    `vias`: the category and rank of each comm op a piece was reached through."""
    pieces, links = _expanded(items, done, [], {} if vias is None else vias)
    weakest = (1.0, "")
    for confidence, reason in links:
        if confidence < weakest[0]:
            weakest = (float(confidence), str(reason))
    return sorted(pieces, key=lambda p: p.start), weakest


def _expanded(items: list, done: dict[tuple, list], hops: list[int],
              vias: dict[int, tuple[str, int]]) -> tuple[list[Piece], list[tuple]]:
    """A part's walk items as the local walk would have left them: pieces in walk order (each
    reach replaced by the walk it stood for, each wake-up applied where it happened, each
    reached through the crossings open then, `hops`) and the links followed, in order."""
    pieces: list[Piece] = []
    links: list[tuple] = []
    at: list[int] = []  # where in `pieces` each item began
    for item in items:
        at.append(len(pieces))
        kind = item[0]
        if kind == "p":
            pieces.append(Piece(*item[1:], hops=tuple(hops)))
        elif kind == "v":
            hops.append(item[1])
            vias[item[1]] = item[2:]
        elif kind == "e":
            hops.pop()
        elif kind == "l":
            links.append(item[1:])
        elif kind == "w":
            first_new, b = item[1:]
            wake_up(pieces, at[first_new] if first_new < len(at) else len(pieces), b)
        else:
            more, more_links = _expanded(done[item[1:]], done, hops, vias)
            pieces += more
            links += more_links
    return pieces, links


def _concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Parts' ops frames as one, their string columns one Categorical each."""
    if not frames:
        return pd.DataFrame()
    strings = {c: union_categoricals([f[c] for f in frames], ignore_order=True)
               for c in STRING_COLUMNS if c in frames[0]}
    return pd.concat(frames, ignore_index=True).assign(**strings)


# --- the workers' side -------------------------------------------------------------------------
@dataclass
class _Part:
    """Contiguous ranks of a trace, kept on a worker."""

    ranks: list[int]
    events: pd.DataFrame
    ops: Ops
    within: Matches
    first_op: int = 0
    first_lane: int = 0
    first_event: int = 0
    graph: DepGraph | None = None
    remote: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # global ids
    remote_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    groups: pd.DataFrame | None = None
    slow_op: np.ndarray | None = None
    pipelined: bool = False


@dataclass
class _Facts:
    """What a part tells the client before any graph: sizes, comm ops, step markers."""

    ops: int
    lanes: int
    events: int
    ranks: list[int]  # those with ops
    held: list[int]  # every rank of the part
    comm: pd.DataFrame  # _COMM_COLUMNS, `local` (op index in the part) and `posted`
    markers: pd.DataFrame  # step markers (rank, step, start_ns, dur_ns)


@dataclass
class _CrossOf:
    """What the client sends a part: offsets, and its comm ops' cross dependencies."""

    offsets: dict[int, int]
    local: np.ndarray  # the part's comm ops
    target: np.ndarray  # global op each depends on (-1: none)
    how: np.ndarray
    target_start: np.ndarray  # aligned start of that op
    unprofiled: np.ndarray
    unmatched: np.ndarray
    first_op: int
    first_lane: int
    first_event: int
    sampled: bool


@dataclass
class _PartAnalysis(Analysis):
    """The analysis of a part's ranks, on its worker: its ops, graph and op times, with the
    steps and bubbles of its ranks (what `Analysis.by_part` functions read)."""

    stepped: bool = True  # the whole analysis has step windows (else each rank's span is one)
    remote_start: np.ndarray | None = None  # the starts of other parts' ops its deps name

    def released(self) -> np.ndarray:
        return release_times(self.graph, self.remote_start)

    def rank_spans(self) -> pd.DataFrame:
        if self.stepped:  # a rank without steps has none, as in the whole analysis
            return self.steps[["rank", "step", "start", "end"]]
        return super().rank_spans()


def _viewed(part: _Part, view: _PartAnalysis) -> _PartAnalysis:
    view.trace.events, view.ops, view.matches, view.graph = (part.events, part.ops,
                                                             part.within, part.graph)
    view.start, view.end, view.slow_op = part.graph.start, part.graph.end, part.slow_op
    view.remote_start = part.remote_start
    return view


def _on_view(view: _PartAnalysis, function: Callable[..., T], *args: object) -> T:
    return function(view, *args)


def _rank_spans(part: _Part) -> pd.DataFrame:
    return spans_by_rank(part.ops.frame["rank"], part.graph.start, part.graph.end)


def _build(held: list) -> _Part:
    events = events_frame([with_rank(p.events, p.rank) for p in held])
    ops = build_ops(events)
    return _Part([p.rank for p in held], events, ops, match_within_ranks(ops))


def _facts(part: _Part) -> _Facts:
    frame = part.ops.frame
    comm = np.flatnonzero(frame["kind"].isin(COMM_KINDS).to_numpy())
    exchange = exchanges(part.ops)
    posted = posted_times(part.ops, part.ops.start, exchange)[comm]  # the rank's clock
    table = frame.iloc[comm][_COMM_COLUMNS].reset_index(drop=True).assign(
        local=comm, posted=posted, exchange=exchange[comm])  # local op ids: global once placed
    for column in ("kind", "comm", "group", "lane"):
        table[column] = table[column].astype(object)
    return _Facts(len(frame), len(part.ops.lanes), len(part.events),
                  sorted(int(r) for r in np.unique(frame["rank"].to_numpy())), part.ranks,
                  table, step_markers(part.events))


def _connect(part: _Part, cross: _CrossOf) -> _Part:
    frame, n = part.ops.frame, len(part.ops)
    shift = frame["rank"].map(cross.offsets).fillna(0).astype("int64").to_numpy()
    start, end = part.ops.start - shift, part.ops.end - shift
    dep, how = part.within.dep.copy(), part.within.how.copy()
    unprofiled, unmatched = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    local = cross.target - cross.first_op
    inside = (cross.target >= 0) & (local >= 0) & (local < n)
    remote = (cross.target >= 0) & ~inside
    dep[cross.local[inside]] = local[inside]
    dep[cross.local[remote]] = n + np.arange(int(remote.sum()))  # stand-ins: `assemble`
    how[cross.local] = cross.how
    unprofiled[cross.local], unmatched[cross.local] = cross.unprofiled, cross.unmatched
    part.first_op, part.first_lane = cross.first_op, cross.first_lane
    part.first_event = cross.first_event
    part.remote, part.remote_start = cross.target[remote], cross.target_start[remote]
    part.graph = assemble(part.ops, part.within, start, end,
                          (dep, how, unprofiled, unmatched), cross.sampled)
    return part


def _span(part: _Part) -> tuple[int, int] | None:
    graph = part.graph
    return (int(graph.start.min()), int(graph.end.max())) if len(graph) else None


def _launched(part: _Part, steps: pd.DataFrame) -> pd.DataFrame:
    return without_cut_steps(with_launched_work(steps, part.graph), part.graph) if len(
        steps) else steps


def _work(part: _Part) -> pd.Series:
    return rank_work(_PartWalk(part))


def _main_modes(part: _Part) -> list[str]:
    lanes = part.ops.lanes
    return lanes.loc[lanes["main"], "mode"].tolist()


def _step_work(part: _Part, steps: pd.DataFrame) -> pd.DataFrame:
    return step_work(_PartWalk(part), steps[steps["rank"].isin(part.ranks)])


def _medians(part: _Part) -> pd.DataFrame:
    return name_medians(part.ops)


def _mix(part: _Part) -> pd.DataFrame:
    return op_mix(part.ops)


def _prepare(part: _Part, groups: pd.DataFrame, incomplete: dict[int, str],
             stragglers: tuple[set[int], set, set, Peers, tuple[set, pd.DataFrame]],
             pipelined: bool) -> _Part:
    """What the walks of a part need: groups, stragglers' ops (over the profile and in
    each step), ranks missing events."""
    slow, flagged, shared, peers, (in_step, steps) = stragglers
    part.groups, part.pipelined = groups, pipelined
    part.graph.incomplete = incomplete
    part.slow_op = slow_op_mask(part.ops, flagged, shared, slow, peers) | step_slow_mask(
        part.ops, in_step, steps, part.graph.start)
    return part


# A batch: what one task of walks leaves on its worker (answers, labels, inferred edges); the
# client asks it for its reaches' keys only, and finishing tasks read it where it lies.
Batch = tuple[list, dict, list]


def _bubbles(part: _Part, steps: pd.DataFrame, threshold_ns: int) -> Batch:
    blamer = _blamer(part)
    bubbles = find_bubbles(blamer, steps[steps["rank"].isin(part.ranks)], threshold_ns)
    found = []
    for bubble in bubbles:
        items = bubble.intervals  # the walk's items (`_PartBlamer.intervals`)
        bubble.intervals, bubble.op = [], bubble.op + part.first_op
        found.append((bubble, blamer.items(items)))
    return blamer.answer(found)


def _reaches_of(batch: Batch) -> set[tuple]:
    """The reaches the walks of a batch left."""
    return {item[1:] for answer in batch[0] for item in answer[-1] if item[0] == "r"}


def _reaches_left(batch: Batch) -> dict[tuple, set[tuple]]:
    """Per reach a `_reach` batch walked: the reaches that walk left in turn."""
    return {reach: {i[1:] for i in items if i[0] == "r"} for reach, items in batch[0]}


def _recorded(batch: Batch) -> list[tuple[int, int, str]]:
    return batch[2]


def _resolved(batch: Batch, reached: list[Batch]) -> tuple[dict[tuple, list], dict]:
    """The walks of the reach batches, by reach, and every piece's labels."""
    done = {reach: items for b in reached for reach, items in b[0]}
    labels = dict(batch[1])
    for b in reached:
        labels |= b[1]
    return done, labels


def _own(piece: Interval | PathSegment, rank: int | None) -> Interval | PathSegment:
    """A piece labelled without the stretch it explains, charged as `Blamer.category` does for
    a stretch of `rank`: a peer's compute that is the rank's own is its own."""
    piece.category = own_or(piece.category, piece.rank, rank)
    return piece


def _through(piece: Interval | PathSegment, walked: Piece, vias: dict[int, tuple[str, int]]
             ) -> Interval | PathSegment:
    """A piece labelled on its part, charged as `Blamer.category` does for the crossing it was
    reached through (`blame.through`), an interval with the ranks it was reached through."""
    if walked.via >= 0:
        piece.category = through(piece.category, vias[walked.via][0])
    if isinstance(piece, Interval):
        piece.path = (*(vias[h][1] for h in walked.hops), piece.rank)
    return piece


def _charged(batch: Batch, reached: list[Batch], sampled: bool, incomplete: dict[int, str]
             ) -> list[Bubble]:
    """The bubbles of a batch, their walks resolved, charged as `Blamer.intervals` does."""
    done, labels = _resolved(batch, reached)
    bubbles = []
    for bubble, items in batch[0]:
        vias: dict[int, tuple[str, int]] = {}
        pieces, weakest = _walk(items, done, vias)
        bubble.intervals = merged([
            _own(_through(Interval(p.start, p.end, *labels[(p.op, p.why)][0]), p, vias),
                 bubble.rank) for p in fold_slivers(pieces)])
        bubble.confidence, bubble.evidence = sureness(weakest, sampled, incomplete, bubble.rank,
                                                      bubble.intervals)
        bubbles.append(bubble)
    return bubbles


def _segments(batch: Batch, reached: list[Batch]) -> dict[int, list[PathSegment]]:
    """The critical paths of a batch, their walks resolved, as `critical_path` makes them."""
    done, labels = _resolved(batch, reached)

    vias: dict[int, tuple[str, int]] = {}

    def segment(piece: Piece) -> PathSegment:
        rank, lane, name, kind, category, note, op = labels[(piece.op, piece.why)][1]
        return _through(PathSegment(rank, lane, name, kind, category, piece.start, piece.end,
                                    note, op), piece, vias)

    paths = {}
    for k, ending, stop, hi, items in batch[0]:
        pieces = with_tail(_walk(items, done, vias)[0], ending, stop, hi)
        paths[k] = segments(fold_slivers(pieces), segment)
    return paths


def _lasts(part: _Part, windows: list[tuple[int | None, tuple[int, int]]]) -> list:
    walk = _PartWalk(part)
    return [None if rank is not None and rank not in part.ranks
            else last_key(walk, rank, window) for rank, window in windows]


def _history(part: _Part, asks: list[tuple[int, int, int, tuple[int, int]]]) -> Batch:
    blamer = _blamer(part)
    walk = blamer.walk
    found = []
    for k, ending, local, (lo, hi) in asks:
        stop = min(int(walk.end[local]), hi)
        items = walk.history(local, lo, stop)
        blamer.describe(Piece(local, stop, hi, STEP_TAIL))
        found.append((k, ending, stop, hi, blamer.items(items)))
    return blamer.answer(found)


def _reach(part: _Part, asks: list[tuple]) -> Batch:
    blamer = _blamer(part)
    found = []
    for reach, local, a, b, depth in asks:
        out: list = []
        blamer.walk.start_collecting(out)
        blamer.walk._before(local, a, b, depth, out)
        found.append((reach, blamer.items(out)))
    return blamer.answer(found)


def _cycle_warnings(part: _Part) -> list[str]:
    return part.graph.cycle_warnings()


def _detail(part: _Part) -> dict[str, object]:
    """The part's ops, matches and times with global indices (`event` too)."""
    frame, lanes = part.ops.frame, part.ops.lanes
    return {"frame": frame.assign(event=frame["event"] + part.first_event,
                                  lane_id=frame["lane_id"] + part.first_lane),
            "lanes": lanes.assign(lane_id=lanes["lane_id"] + part.first_lane),
            "dep": np.where(part.within.dep >= 0, part.within.dep + part.first_op, -1),
            "how": part.within.how,
            "launcher": np.where(part.within.launcher >= 0,
                                 part.within.launcher + part.first_op, -1),
            "gates": {op + part.first_op: [w + part.first_op for w in waits]
                      for op, waits in part.within.gates.items()},
            "queued": {w + part.first_op: op + part.first_op
                       for w, op in part.within.queued.items()},
            "start": part.graph.start, "end": part.graph.end, "slow_op": part.slow_op}


class _PartWalk(BindingWalk):
    """The binding walk over a part's graph. It leaves its items in walk order rather than
    sorted pieces: a `reach` where a dependency leads to another part's op, each link it
    follows and each wake-up, which the client applies once the reaches are resolved."""

    def __init__(self, part: _Part) -> None:
        super().__init__(part.graph)
        self.part, self.n = part, len(part.graph)
        self._out: list = []

    def start_collecting(self, out: list) -> None:
        self._out = out

    def _collect(self, step: Any, i: int, a: int, b: int) -> list:
        out: list = []
        self._out = out
        step(i, a, b, 0, out)
        return out

    def _release(self, i: int, d: int, depth: int = 0) -> int:
        if d >= self.n:  # another part's op: a P2P half or collective member, by its start
            return int(self.part.remote_start[d - self.n])
        return super()._release(i, d, depth)

    def _before(self, j: int, a: int, b: int, depth: int, out: list) -> None:
        if j >= self.n:
            out.append(("reach", j, a, b, depth))
            return
        super()._before(j, a, b, depth, out)

    def _link(self, confidence: float, reason: str) -> None:
        self._out.append(("link", confidence, reason))

    def _wake(self, out: list, first_new: int, b: int) -> None:
        out.append(("wake", first_new, b))

    def _enter(self, out: list, i: int) -> None:
        out.append(("via", i))

    def _leave(self, out: list, first_new: int, i: int) -> None:
        out.append(("left",))


class _PartBlamer(Blamer):
    """The blamer of a part: walks give their items (`_PartWalk`), each piece described once
    with global op indices, for the client to fold as the local blamer does."""

    def __init__(self, part: _Part) -> None:
        super().__init__(_PartWalk(part), part.groups, part.slow_op, part.pipelined)
        self.part = part
        self.labels: dict[tuple[int, str], tuple[tuple, tuple]] = {}
        self.inferred = len(part.graph._inferred)

    def intervals(self, pieces: list, rank: int | None = None) -> list:  # type: ignore[override]
        return pieces  # the walk's items, resolved and charged by the client (`_own`)

    def describe(self, piece: Piece) -> None:
        """The labels of a piece's op doing what it did: as an interval, as a path segment."""
        key = (piece.op + self.part.first_op, piece.why)
        if key not in self.labels:
            interval = self._interval(piece)
            segment = segment_of(self.walk, piece, self.category)
            self.labels[key] = (
                (interval.category, interval.rank, interval.lane, interval.name, interval.note,
                 interval.unprofiled_group, key[0]),
                (segment.rank, segment.lane, segment.name, segment.kind, segment.category,
                 segment.note, key[0]))

    def items(self, items: list) -> list[tuple]:
        """Walk items with global op indices, every piece described."""
        first, out = self.part.first_op, []
        for item in items:
            if isinstance(item, Piece):
                self.describe(item)
                out.append(("p", item.op + first, item.start, item.end, item.why))
            elif item[0] == "reach":
                out.append(("r", int(self.part.remote[item[1] - self.walk.n]), *item[2:]))
            elif item[0] == "link":
                out.append(("l", *item[1:]))
            elif item[0] == "via":
                out.append(("v", item[1] + first, str(self.comm_category[item[1]]),
                            int(self.graph.rank[item[1]])))
            elif item[0] == "left":
                out.append(("e",))
            else:
                out.append(("w", *item[1:]))
        return out

    def answer(self, found: list) -> Batch:
        """What a task returns: its results, the labels and the edges its walks inferred."""
        graph, first = self.part.graph, self.part.first_op
        recorded = [(s + first, d + first, k) for s, d, k in
                    itertools.islice(graph._inferred, self.inferred, None)]
        return found, self.labels, recorded


def _blamer(part: _Part) -> _PartBlamer:
    return _PartBlamer(part)
