"""The timing model of a `DepGraph`: what each op's start and end waited for, and for how long.

Every op i has two time points, its start (node 2i) and its end (node 2i+1); each collective
instance k one more, the arrival of its last member (node 2n+k). A node's time is a constant
after the latest of its predecessors, or the constant alone when it has none (an external input:
a lane's first op):

- the start of an op waits for the op before it on its lane (stream order), the host op that
  launched it (gloo), the Kineto stream waits gating it, the device op a blocked host waited for
  (host_sync), the op ahead in one hardware queue (shared_queue), or the comm op that released an
  idle host thread; its constant is the launch delay (host launch gaps, unrecorded host work);
- the end of compute, memcpy, a record or host work waits for its own start: its duration;
- the end of a collective member waits for its start and its instance's last arrival (every
  member's start): its constant is the transfer, measured end − latest member start (the
  lateness of members absent from the bundle included: it moves with the profiled ones);
- the end of a P2P half waits for its start and the other half's posting (its start, or on a
  host thread the start of the call that posted it): the transfer after the later posting (a
  buffered send that completed before its receive was posted does not wait);
- the end of an Ascend EVENT_WAIT waits for its start and the start of the record it waited on:
  the wake-up after the record (one that did not block, which no event id names: the record
  launched right before it on another stream, see `_with_launch_pairs`);
- a Kineto stream wait (host-side) passes when what was queued before it and its recorded
  producer are done (constant 0); so does an instance's last arrival;
- the end of an annotation stretch a comm op released waits for that comm op's end: the wake-up.

Each constant is the measured time minus the latest measured predecessor; a negative one (the
measurement contradicts the edge: clocks aligned a little off, ops overlapping on a lane) is
clamped to 0 and kept in `contradiction`: what makes a replay of the unmodified graph miss.
Edges inferred by time (host_release, host_sync, shared_queue) are found as the walk finds them
(`DepGraph.host_release`, `host_sync`, `shared_queue`), for the stretches the static edges leave
unexplained.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.graph.depgraph import DepGraph, exchanges
from tracegraph.graph.match import BLOCKING_WAIT_NS, RECORD_WINDOW_NS
from tracegraph.whatif.inferred import inferred_edges
from tracegraph.whatif.steps import StepOps, step_launches, step_ops

EDGE_KINDS = ("stream", "own", "launch", "gate", "event_wait", "queue", "p2p", "arrival",
              "collective", "host_release", "host_sync", "shared_queue", "drain", "hold", "step")
"""Why a node waited for another: the DepGraph's edge kinds, `own` (an op's end after its
start), `arrival` (a member's start → its instance's last arrival), and the edits' `drain` (a
reduction drained before the optimizer) and `hold` (a send held until a reduction is done), and
`step` (a lane's first op of a step the host launched whole after the step before it ended:
`steps.step_launches`)."""
KIND = {name: code for code, name in enumerate(EDGE_KINDS)}
EAGER_NS = 50_000  # a P2P half ending this long before its peer posted did not wait for it
POSTING_RUN = 8  # calls a P2P run of a host thread may hold (send, recv and their records)


@dataclass
class TimingModel:
    """Max-plus timing model: node time = const + max(predecessors' times), const alone without
    predecessors. Nodes 2i / 2i+1: start / end of op i; 2n+k: last arrival of instance k."""

    ops: int  # n, the DepGraph's op count
    chain: np.ndarray  # per node: its stream-order (start) or own-start (end) predecessor, -1
    src: np.ndarray  # other predecessor edges: src -> dst, of kind EDGE_KINDS[kind]
    dst: np.ndarray
    kind: np.ndarray
    const: np.ndarray  # ns per node
    measured: np.ndarray  # measured time per node (a stream wait's: when it passed)
    contradiction: np.ndarray  # ns per node the measurement ran ahead of its predecessors
    virtual: np.ndarray  # nodes whose time is derived (instances, Kineto stream waits)
    notes: list[str] = field(default_factory=list)  # what the model could not represent

    @property
    def nodes(self) -> int:
        return len(self.const)

    def replace(self, **changes: object) -> TimingModel:
        """A copy with some arrays replaced (edits never touch the original)."""
        return dataclasses.replace(self, notes=list(self.notes), **changes)

    def with_edges(self, src: np.ndarray, dst: np.ndarray, kind: str) -> TimingModel:
        """A copy with more predecessor edges."""
        return self.replace(src=np.concatenate([self.src, src]),
                            dst=np.concatenate([self.dst, dst]),
                            kind=np.concatenate([self.kind, np.full(len(src), KIND[kind],
                                                                    dtype=np.int8)]))

    def without_edges(self, drop: np.ndarray) -> TimingModel:
        """A copy without the predecessor edges masked by `drop`."""
        keep = ~drop
        return self.replace(src=self.src[keep], dst=self.dst[keep], kind=self.kind[keep])

    def edges_between(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Mask of this model's predecessor edges that run from one of `src` to the `dst` at
        the same position (edits name edges of the unmodified model, whose indices other edits
        may have shifted)."""
        key = self.src * self.nodes + self.dst
        return np.isin(key, np.asarray(src, dtype=np.int64) * self.nodes + np.asarray(dst))

    def latest(self, times: np.ndarray) -> np.ndarray:
        """Per node: its latest predecessor's time under `times` (-1 when it has none)."""
        latest = np.full(self.nodes, np.iinfo(np.int64).min, dtype=np.int64)
        has = self.chain >= 0
        latest[has] = times[self.chain[has]]
        np.maximum.at(latest, self.dst, times[self.src])
        return np.where(latest == np.iinfo(np.int64).min, -1, latest)

    def has_predecessor(self) -> np.ndarray:
        has = self.chain >= 0
        has[self.dst] = True
        return has


def start(op: np.ndarray | int) -> np.ndarray | int:
    """The start node of op(s)."""
    return 2 * op


def end(op: np.ndarray | int) -> np.ndarray | int:
    """The end node of op(s)."""
    return 2 * op + 1


def build_model(analysis: Analysis, steps: StepOps | None = None) -> TimingModel:
    """The timing model of the analysis' DepGraph, its constants from the measured times
    (`steps`: the analysis' `step_ops`, found when not given)."""
    graph = analysis.graph
    n = len(graph)
    instances = [np.asarray(ops, dtype=np.int64) for ops in
                 analysis.matches.instances.get("ops", []) if len(ops) > 1]
    nodes = 2 * n + len(instances)
    idx = np.arange(n, dtype=np.int64)
    chain = np.full(nodes, -1, dtype=np.int64)
    stream = (graph.prev >= 0) & ~graph.host_side
    chain[start(idx[stream])] = end(graph.prev[stream])
    chain[end(idx[~graph.host_side])] = start(idx[~graph.host_side])
    edges = _static_edges(analysis, instances)
    virtual = np.zeros(nodes, dtype=bool)
    virtual[2 * n:] = True
    virtual[end(idx[graph.host_side])] = True
    model = TimingModel(ops=n, chain=chain, src=edges[0], dst=edges[1], kind=edges[2],
                        const=np.zeros(nodes, dtype=np.int64),
                        measured=np.zeros(nodes, dtype=np.int64),
                        contradiction=np.zeros(nodes, dtype=np.int64), virtual=virtual)
    model.measured = _measured(model, graph)
    model = _without_eager_sends(model)
    steps = step_ops(analysis) if steps is None else steps
    ended, launched = step_launches(graph, steps)
    model = model.with_edges(end(ended), start(launched), "step")
    model = _with_order_pairs(model, analysis, steps)
    _fit(model)
    model = _with_inferred(model, graph)
    _fit(model)
    model = _with_launch_pairs(model, analysis)
    _fit(model)
    model.notes += _unmatched_waits(model, graph)
    return model


def _unmatched_waits(model: TimingModel, graph: DepGraph) -> list[str]:
    """What the model says of device waits matched to no record: a blocking one keeps its
    measured length; one that did not block (Ascend names no event: only a blocking wait is
    matched, by time) cannot block in a prediction that makes its record later."""
    unmatched = _unmatched_device_waits(graph)
    tied = np.zeros(len(graph), dtype=bool)
    tied[model.dst[model.kind == KIND["event_wait"]] // 2] = True
    unmatched &= ~tied
    blocking = int((unmatched & (graph.end - graph.start > BLOCKING_WAIT_NS)).sum())
    free = int(unmatched.sum()) - blocking
    notes = []
    if blocking:
        notes.append(f"{blocking} blocking waits have no matched record: they keep their "
                     "measured length in every prediction")
    if free:
        notes.append(f"{free} waits did not block and name no record (no event id): they "
                     "cannot block in a prediction that makes their record later")
    return notes


def _static_edges(analysis: Analysis, instances: list[np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """src, dst, kind of the predecessor edges known from matching."""
    graph, matches = analysis.graph, analysis.matches
    n = len(graph)
    idx = np.arange(n, dtype=np.int64)
    parts: list[tuple[np.ndarray, np.ndarray, str]] = []
    launched = graph.launcher >= 0
    parts.append((start(graph.launcher[launched]), start(idx[launched]), "launch"))
    gated = [(w, op) for op, waits in graph.gates.items() for w in waits]
    if gated:
        waits, ops = (np.array(x, dtype=np.int64) for x in zip(*gated, strict=True))
        parts.append((end(waits), start(ops), "gate"))
    timing = graph.how == "timing"  # an Ascend wait: released when its record executes
    parts.append((start(graph.dep[timing]), end(idx[timing]), "event_wait"))
    by_id = graph.how == "event_id"  # a Kineto stream wait: when its producer is done
    parts.append((end(graph.dep[by_id]), end(idx[by_id]), "event_wait"))
    queued = graph.queued >= 0
    parts.append((end(graph.queued[queued]), end(idx[queued]), "queue"))
    pair = matches.how == "p2p"  # both halves: the later posting releases the pair
    posting = _posting(graph)
    parts.append((start(posting[matches.dep[pair]]), end(idx[pair]), "p2p"))
    halves, closing = _exchange_ends(analysis, idx[pair])  # a batch waits for every half
    parts.append((start(posting[matches.dep[halves]]), end(closing), "p2p"))
    if instances:
        sizes = np.array([len(ops) for ops in instances])
        member = np.concatenate(instances)
        arrival = 2 * n + np.repeat(np.arange(len(instances)), sizes)
        parts.append((start(member), arrival, "arrival"))
        parts.append((arrival, end(member), "collective"))
    src = np.concatenate([p[0] for p in parts]).astype(np.int64)
    dst = np.concatenate([p[1] for p in parts]).astype(np.int64)
    kind = np.concatenate([np.full(len(p[0]), KIND[p[2]], dtype=np.int8) for p in parts])
    return src, dst, kind


def _exchange_ends(analysis: Analysis, halves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The matched halves of batched exchanges (`depgraph.exchanges`, several halves), and the
    half that ends each one's exchange: its thread waits there for every half's peer."""
    exchange = exchanges(analysis.ops)[halves]
    halves, exchange = halves[exchange >= 0], exchange[exchange >= 0]
    if not len(halves):
        return halves, halves
    table = pd.DataFrame({"half": halves, "exchange": exchange,
                          "end": analysis.graph.end[halves]})
    several = table.groupby("exchange")["half"].transform("size").to_numpy() > 1
    table = table[several]
    last = table.loc[table.groupby("exchange")["end"].idxmax()].set_index("exchange")["half"]
    return table["half"].to_numpy(), last.reindex(table["exchange"]).to_numpy()


def _posting(graph: DepGraph) -> np.ndarray:
    """Per op: the op whose start posted it: itself, or on a host thread the first call of the
    P2P run it belongs to (`DepGraph.posted`: gloo's `gloo:send` starts when the blocking
    `c10d::send` that posted it returns)."""
    op = np.arange(len(graph), dtype=np.int64)
    early = graph.posted < graph.start
    for _ in range(POSTING_RUN):
        before = graph.prev[op]
        back = early & (before >= 0) & (graph.start[np.maximum(before, 0)] >= graph.posted)
        if not back.any():
            break
        op = np.where(back, before, op)
    return op


def _without_eager_sends(model: TimingModel) -> TimingModel:
    """Drop the P2P edges of halves that completed before the other half was posted: a small
    send a transport buffers (gloo) does not wait for its receive."""
    pair = model.kind == KIND["p2p"]
    eager = pair & (model.measured[model.dst] < model.measured[model.src] - EAGER_NS)
    if not eager.any():
        return model
    model = model.without_edges(eager)
    model.notes.append(f"{int(eager.sum())} P2P halves completed before their peer posted "
                       "(buffered sends): they do not wait for it")
    return model


def _with_launch_pairs(model: TimingModel, analysis: Analysis) -> TimingModel:
    """Add, for each device wait matched to no record (an Ascend EVENT_WAIT that did not block:
    no event id names its record), the record on another lane of its rank launched right before
    it (the next-lower correlation id: `record(); wait_event()`), executed no later than the wait
    ended. Not between streams of one hardware queue: they execute in launch order, so there a
    record launched before a wait ran before it whatever event the wait is on."""
    graph = analysis.graph
    record, wait = _launch_pairs(graph, analysis.ops.frame["correlation"].to_numpy())
    queued = model.kind == KIND["shared_queue"]
    shared = {frozenset(pair) for pair in zip(graph.lane_id[model.src[queued] // 2].tolist(),
                                              graph.lane_id[model.dst[queued] // 2].tolist(),
                                              strict=True)}
    paired = np.array([frozenset((a, b)) not in shared for a, b in zip(
        graph.lane_id[record].tolist(), graph.lane_id[wait].tolist(), strict=True)], dtype=bool)
    return _with_releases(model, start(record[paired]), end(wait[paired]),
                          "waits that did not block are tied to the record launched right "
                          "before them (no event id names it)")


def _with_order_pairs(model: TimingModel, analysis: Analysis, steps: StepOps) -> TimingModel:
    """Add, for each device wait matched to no record whose profile holds no launch order
    either (raw msprof graph mode: no event id, no correlation id; a wait's time is when it was
    released, the stream idle before it), the record of another lane of its rank that started
    last before it in its step: a graph step runs its records and waits in one order, so the
    record just before a wait is the one it was released by (or, had it blocked, would be)."""
    graph = analysis.graph
    waits = np.flatnonzero(_unmatched_device_waits(graph)
                           & (analysis.ops.frame["correlation"].to_numpy() < 0))
    record = _executed_before(graph, steps, waits)
    paired = record >= 0
    return _with_releases(model, start(record[paired]), start(waits[paired]),
                          "waits name no record (no event id, no launch order): each is tied "
                          "to the record executed last before it in its step")


def _with_releases(model: TimingModel, src: np.ndarray, dst: np.ndarray, said: str
                   ) -> TimingModel:
    """The model with event_wait edges src -> dst, and a note of how many ("{count} {said}")."""
    if not len(src):
        return model
    model = model.with_edges(src, dst, "event_wait")
    model.notes.append(f"{len(src)} {said}")
    return model


def _unmatched_device_waits(graph: DepGraph) -> np.ndarray:
    """Per op: a device wait matched to no record."""
    return (graph.kind == schema.WAIT) & (graph.dep < 0) & ~graph.host_side


def _launch_pairs(graph: DepGraph, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(record, wait): each unmatched wait with the record of another lane launched right
    before it (correlation id one lower), executed no later than the wait ended."""
    ops = np.flatnonzero(np.isin(graph.kind, [schema.RECORD, schema.WAIT]) & (corr >= 0)
                         & ~graph.host_side)
    ops = ops[np.lexsort((corr[ops], graph.rank[ops]))]
    wait, record = ops[1:], ops[:-1]
    paired = ((graph.kind[wait] == schema.WAIT) & (graph.dep[wait] < 0)
              & (graph.kind[record] == schema.RECORD) & (graph.rank[record] == graph.rank[wait])
              & (corr[record] == corr[wait] - 1) & (graph.lane_id[record] != graph.lane_id[wait])
              & (graph.start[record] <= graph.end[wait] + RECORD_WINDOW_NS))
    return record[paired], wait[paired]


def _executed_before(graph: DepGraph, steps: StepOps, waits: np.ndarray) -> np.ndarray:
    """Per wait: the record on another lane of its rank, in its step, that started last at or
    before the wait started (-1: none)."""
    out = np.full(len(waits), -1, dtype=np.int64)
    records = np.flatnonzero((graph.kind == schema.RECORD) & ~graph.host_side
                             & (steps.row >= 0))
    for row in np.unique(steps.row[waits]).tolist():
        if row < 0:
            continue
        mine = np.flatnonzero(steps.row[waits] == row)
        candidates = records[steps.row[records] == row]
        candidates = candidates[np.argsort(graph.start[candidates], kind="stable")]
        for k in mine.tolist():
            w = waits[k]
            other = candidates[(graph.lane_id[candidates] != graph.lane_id[w])
                               & (graph.start[candidates] <= graph.start[w])]
            out[k] = other[-1] if len(other) else -1
    return out


def _measured(model: TimingModel, graph: DepGraph) -> np.ndarray:
    """Measured node times: each op's start and end; an instance's last arrival; when a Kineto
    stream wait passed (its queue and producer done: iterated, waits may wait on waits)."""
    n = model.ops
    times = np.zeros(model.nodes, dtype=np.int64)
    times[0:2 * n:2], times[1:2 * n:2] = graph.start, graph.end
    virtual = np.flatnonzero(model.virtual)
    if not len(virtual):
        return times
    times[virtual] = np.iinfo(np.int64).min
    into = model.virtual[model.dst]
    src, dst = model.src[into], model.dst[into]
    for _ in range(model.nodes):
        latest = times.copy()
        latest[virtual] = np.iinfo(np.int64).min
        np.maximum.at(latest, dst, times[src])
        if np.array_equal(latest[virtual], times[virtual]):
            break
        times[virtual] = latest[virtual]
    lost = virtual[times[virtual] == np.iinfo(np.int64).min]  # a stream wait with nothing known
    times[lost] = np.asarray(graph.end)[lost // 2] if len(lost) else times[lost]
    return times


def _fit(model: TimingModel) -> None:
    """Constants from the measured times: each node's time minus its latest predecessor's (its
    own time when it has none; 0 for derived nodes), negative ones clamped to 0 and kept."""
    latest = model.latest(model.measured)
    has = model.has_predecessor()
    const = np.where(has, model.measured - latest, model.measured)
    const[model.virtual & has] = 0
    model.contradiction = np.where(has & ~model.virtual, np.maximum(-const, 0), 0)
    model.const = np.where(has, np.maximum(const, 0), const)


def _with_inferred(model: TimingModel, graph: DepGraph) -> TimingModel:
    """Add the edges inferred by time (inferred.py) where the constants show an unexplained
    stretch."""
    n = model.ops
    latest = model.latest(model.measured)[0:2 * n:2]
    found = inferred_edges(graph, latest, model.const[0:2 * n:2])
    for kind, (releaser, held, at_end) in found.items():
        if len(held):
            model = model.with_edges(end(releaser), np.where(at_end, end(held), start(held)),
                                     kind)
    return model
