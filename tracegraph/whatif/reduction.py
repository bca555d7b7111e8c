"""The seed's fix and its reverse: a DP/HSDP reduction wait before, or after, the backward send.

A *reduction wait* is an op released by a data-parallel reduction (an Ascend EVENT_WAIT on the
record after it, a Kineto stream wait whose producer it is, an annotation stretch a gloo
all-reduce ended). It *holds a send* when a send is reached from it without computing in between
(through records, stream waits, annotations and host communication calls).

- `DecoupleReduction` (`--fix decouple-reduction`): a reduction wait that holds a send no longer
  waits there; the reduction drains instead before the first op of the lane's own work after the
  step's last pipeline op and last reduction wait (the optimizer). The reduction itself runs on as
  measured, on its own stream.
- `CoupleReduction` (`--fix couple-reduction`, the seed's bug put back): a reduction drained late
  holds the send nearest to where it was launched (no computing in between) and its lane's next
  op, as a wait before the send would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracegraph import causes, schema
from tracegraph.whatif.model import TimingModel, end, start
from tracegraph.whatif.subject import Subject

NEIGHBOURS = 16  # ops looked at on each side of a reduction's launch for the send it holds


@dataclass(frozen=True)
class ReductionWait:
    """A release edge from a DP reduction to the op that waited for it."""

    edge: int  # of the unmodified model (Subject.model)
    op: int  # the waiting op
    reduction: int  # the (last) reduction collective it waited for
    send: int  # the send it holds back, -1 if none


def reduction_waits(subject: Subject) -> list[ReductionWait]:
    """Every release edge whose source is a data-parallel reduction."""
    return [ReductionWait(edge, op, comm, subject.handoff(op))
            for edge, op, comm in subject.releases
            if subject.category[comm] == causes.DP_REDUCTION
            and subject.graph.kind[comm] == schema.COLLECTIVE]


@dataclass(frozen=True)
class DecoupleReduction:
    """The seed's fix: reduction waits before a send drain before the optimizer instead."""

    @property
    def label(self) -> str:
        return "fix decouple-reduction"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        waits = reduction_waits(subject)
        held = [w for w in waits if w.send >= 0]
        if not held:
            return model, _nothing(waits, "precedes a send")
        base = subject.model
        drains: list[tuple[int, int]] = []
        undrained = 0
        for wait in held:
            point = _drain_point(subject, wait.op, waits)
            if point >= 0:
                drains.append((int(base.src[wait.edge]), start(point)))
            else:
                undrained += 1
        edges = [wait.edge for wait in held]
        edited = model.without_edges(model.edges_between(base.src[edges], base.dst[edges]))
        if drains:
            src, dst = (np.array(x, dtype=np.int64) for x in zip(*drains, strict=True))
            edited = edited.with_edges(src, dst, "drain")
        ranks = sorted({int(subject.graph.rank[w.op]) for w in held})
        line = (f"{len(held)} reduction waits before a send on ranks {ranks} no longer wait "
                f"there; they drain before the optimizer")
        if undrained:
            line += f" ({undrained} with no op after them in the step: at the step's end)"
        return edited, line


@dataclass(frozen=True)
class CoupleReduction:
    """The reverse: a reduction that holds no send holds the send launched next to it."""

    @property
    def label(self) -> str:
        return "fix couple-reduction"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        waits = reduction_waits(subject)
        holding = {w.reduction for w in waits if w.send >= 0}
        holds: list[tuple[int, int]] = []
        coupled = []
        for first, last in reductions(subject):
            if last in holding:
                continue
            launch = _launch_point(subject, first)
            send = _send_near(subject, launch) if launch >= 0 else -1
            if send < 0:
                continue
            holds.append((end(last), start(send)))
            following = subject.next_on_lane[launch]
            if subject.graph.lane_id[send] != subject.graph.lane_id[launch] and following >= 0:
                holds.append((end(last), start(following)))
            coupled.append(last)
        if not holds:
            return model, ("no data-parallel reduction was launched next to a send: nothing to "
                           "change")
        src, dst = (np.array(x, dtype=np.int64) for x in zip(*holds, strict=True))
        ranks = sorted({int(subject.graph.rank[op]) for op in coupled})
        return model.with_edges(src, dst, "hold"), (
            f"{len(coupled)} reductions on ranks {ranks} hold the send launched next to them "
            "(a reduction wait before the send)")


def reductions(subject: Subject) -> list[tuple[int, int]]:
    """(first, last) collective of each data-parallel reduction: DP collectives issued back to
    back on one lane (no stream wait between them) count as one."""
    graph = subject.graph
    dp = (subject.category == causes.DP_REDUCTION) & (graph.kind == schema.COLLECTIVE)

    def joined(op: int, after: int) -> bool:
        return after >= 0 and dp[after] and not graph.gates.get(after) and dp[op]

    found = []
    for op in np.flatnonzero(dp).tolist():
        if joined(op, int(subject.next_on_lane[op])):
            continue
        first = op
        while graph.prev[first] >= 0 and joined(int(graph.prev[first]), first):
            first = int(graph.prev[first])
        found.append((first, op))
    return found


def _nothing(waits: list[ReductionWait], what: str) -> str:
    if not waits:
        return "no op waits for a data-parallel reduction: nothing to change"
    return f"none of the {len(waits)} data-parallel reduction waits {what}: nothing to change"


def _drain_point(subject: Subject, op: int, waits: list[ReductionWait]) -> int:
    """The op before which a decoupled reduction drains: the first op of the lane's own work
    after the step's last pipeline op and last reduction wait on the lane (-1: none)."""
    graph, row = subject.graph, subject.row
    step = row[op]
    lane = graph.lane_id[op]
    ops = subject.lane_ops(lane)
    ops = ops[row[ops] == step] if step >= 0 else ops
    reductions = {w.op for w in waits}
    bound = -1.0
    for other in ops[::-1].tolist():
        if other in reductions or _pipeline(subject, other):
            bound = subject.position[other]
            break
    after = ops[(subject.position[ops] > bound) & subject.work[ops] & ~graph.host_side[ops]]
    return int(after[0]) if len(after) else -1


def _pipeline(subject: Subject, op: int) -> bool:
    """Whether an op of a lane belongs to the pipeline's traffic: a P2P op, a wait released
    by one (a receive), or an op a send is reached from without computing (a send's trigger)."""
    graph = subject.graph
    if graph.kind[op] == schema.P2P:
        return True
    if not subject.passable[op]:
        return False
    source = subject.source(op) if graph.kind[op] == schema.WAIT else -1
    return (source >= 0 and graph.kind[source] == schema.P2P) or subject.handoff(op) >= 0


def _launch_point(subject: Subject, reduction: int) -> int:
    """The op of the launching lane a reduction's first collective started after: the host call
    that launched it (gloo), the producer of the stream wait gating it (Kineto), the record its
    stream waited on (Ascend); -1 if none."""
    graph = subject.graph
    first = reduction
    if graph.launcher[first] >= 0:
        return int(graph.launcher[first])
    gating = [w for w in graph.gates.get(first, []) if graph.dep[w] >= 0]
    if gating:
        return int(graph.dep[gating[-1]])
    before = graph.prev[first]
    if before >= 0 and graph.kind[before] == schema.WAIT and graph.dep[before] >= 0:
        return int(graph.dep[before])
    return -1


def _send_near(subject: Subject, launch: int) -> int:
    """The send a reduction launched at `launch` would hold: reached from the launch or from the
    ops beside it on its lane with no computing between them and the launch (after it first)."""
    found = subject.handoff(launch)
    if found >= 0:
        return found
    ops = subject.lane_ops(subject.graph.lane_id[launch])
    at = int(np.searchsorted(subject.position[ops], subject.position[launch]))
    for side in (ops[at + 1:at + 1 + NEIGHBOURS], ops[max(at - NEIGHBOURS, 0):at][::-1]):
        for op in side.tolist():
            if not subject.passable[op]:
                break
            found = subject.handoff(op)
            if found >= 0:
                return found
    return -1
