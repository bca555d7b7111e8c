"""The seed's fix and its reverse: a DP/HSDP reduction wait before, or after, the backward send.

A *reduction wait* is an op released by a data-parallel reduction (an Ascend EVENT_WAIT on the
record after it, a Kineto stream wait whose producer it is, an annotation stretch a gloo
all-reduce ended). It *holds a send* when a send is reached from it without computing in between
(through records, stream waits, annotations and host communication calls).

- `DecoupleReduction` (`--fix decouple-reduction`): a reduction wait that holds a send no longer
  waits there; the reduction runs on its own stream and drains before the optimizer (the first
  op the trace names as the optimizer's after the step's last pipeline op), or, where no op names
  it, before the lane's next step. On a host thread (gloo) the reduction's launch is the thread's
  own work: the stretch of the annotation around the launching call (any host work the
  reduction's scheduling spends before it included) moves to a thread of its own, which starts
  where it did and is joined where the reduction drains.
- `CoupleReduction` (`--fix couple-reduction`, the seed's bug put back): a reduction drained late
  holds the send nearest to where it was launched (no computing in between) and its lane's next
  op, as a wait before the send would. One launched from a thread of its own comes back in line,
  before the send nearest to where that thread started.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracegraph import causes, schema
from tracegraph.graph.depgraph import RELEASE_WINDOW_NS
from tracegraph.whatif.model import TimingModel, end, start
from tracegraph.whatif.subject import Subject

NEIGHBOURS = 16  # ops looked at on each side of a reduction's launch for the send it holds
SPAWN_WINDOW_NS = RELEASE_WINDOW_NS  # a thread runs this soon after it was started (busy host)


@dataclass(frozen=True)
class ReductionWait:
    """A release edge from a DP reduction to the op that waited for it."""

    edge: int  # of the unmodified model (Subject.model)
    op: int  # the waiting op
    reduction: int  # the (last) reduction collective it waited for
    send: int  # the send it holds back, -1 if none


@dataclass(frozen=True)
class Drain:
    """Where a decoupled reduction is waited for: before `op` (-1: nowhere in the trace)."""

    op: int
    optimizer: bool  # op is the optimizer's first; else the lane's first of the next step


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
        edges = [wait.edge for wait in held]
        edited = model.without_edges(model.edges_between(base.src[edges], base.dst[edges]))
        chain = edited.chain.copy()
        drains, where, moved_ns = _unheld(subject, held, chain)
        edited = edited.replace(chain=chain)
        if drains:
            src, dst = (np.array(x, dtype=np.int64) for x in zip(*sorted(drains), strict=True))
            edited = edited.with_edges(src, dst, "drain")
        ranks = sorted({int(subject.graph.rank[w.op]) for w in held})
        line = f"{len(held)} reduction waits before a send on ranks {ranks} no longer wait there"
        if moved_ns:
            line += (f"; their launches on the waiting thread ({moved_ns / 1e6:.1f} ms of host "
                     "work) run on a thread of their own")
        return edited, line + "; " + _drained(subject, where)


def _unheld(subject: Subject, held: list[ReductionWait], chain: np.ndarray
            ) -> tuple[set[tuple[int, int]], list[Drain], int]:
    """Decouple the held reductions: fork each launch stretch on the waiting thread (in
    `chain`); the drain edges (reduction end and forked stretch end -> drain point), where each
    drains, and the host time forked."""
    base = subject.model
    first_of = {last: first for first, last in reductions(subject)}
    drains: set[tuple[int, int]] = set()
    where: list[Drain] = []
    forked: set[tuple[int, int]] = set()
    for wait in held:
        drain = _drain(subject, wait.op)
        where.append(drain)
        joined = [int(base.src[wait.edge])]
        stretch = _inline_launch(subject, first_of.get(wait.reduction, wait.reduction), wait.op)
        if stretch and (stretch in forked or _fork(chain, subject, *stretch)):
            forked.add(stretch)
            joined.append(end(stretch[1]))
        if drain.op >= 0:
            drains.update((node, start(drain.op)) for node in joined)
    moved_ns = sum(int(subject.graph.end[b] - subject.graph.start[a]) for a, b in forked)
    return drains, where, moved_ns


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
        chain, const = model.chain.copy(), model.const.copy()
        inline = 0
        for first, last in reductions(subject):
            if last in holding:
                continue
            launch = _launch_point(subject, first)
            send = _send_near(subject, launch) if launch >= 0 else -1
            if send >= 0:
                holds.append((end(last), start(send)))
                following = subject.next_on_lane[launch]
                if subject.graph.lane_id[send] != subject.graph.lane_id[launch] \
                        and following >= 0:
                    holds.append((end(last), start(following)))
            else:
                send = _join_before_send(subject, chain, const, launch) if launch >= 0 else -1
                if send < 0:
                    continue
                holds.append((end(last), send))
                inline += 1
            coupled.append(last)
        if not holds:
            return model, ("no data-parallel reduction was launched next to a send: nothing to "
                           "change")
        src, dst = (np.array(x, dtype=np.int64) for x in zip(*holds, strict=True))
        ranks = sorted({int(subject.graph.rank[op]) for op in coupled})
        line = (f"{len(coupled)} reductions on ranks {ranks} hold the send launched next to them "
                "(a reduction wait before the send)")
        if inline:
            line += (f"; {inline} launched from a thread of their own are launched in line "
                     "again, before that send")
        return model.replace(chain=chain, const=const).with_edges(src, dst, "hold"), line


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


def _drain(subject: Subject, op: int) -> Drain:
    """Where the reduction a wait waited for drains once decoupled: the first op of the wait's
    lane after the step's last pipeline op that the trace names as the optimizer's; where none
    does, the lane's first op after the step (the reduction done within its step)."""
    graph, row = subject.graph, subject.row
    ops = subject.lane_ops(graph.lane_id[op])
    mine = ops[row[ops] == row[op]] if row[op] >= 0 else ops
    bound = -1.0
    for other in mine[::-1].tolist():
        if _pipeline(subject, other):
            bound = subject.position[other]
            break
    named = mine[(subject.position[mine] > bound) & subject.optimizer[mine]]
    if len(named):
        return Drain(int(named[0]), True)
    later = ops[subject.position[ops] > subject.position[mine[-1]]] if len(mine) else ops[:0]
    return Drain(int(later[0]) if len(later) else -1, False)


def _drained(subject: Subject, drains: list[Drain]) -> str:
    """Where the decoupled reductions drain, said for the output."""
    named = sorted({str(subject.graph.name[d.op]) for d in drains if d.optimizer})
    before = f"before the optimizer ({', '.join(named[:3])})"
    at_end = "at the step's end (no op names the optimizer)"
    unnamed = sum(not d.optimizer for d in drains)
    if not unnamed:
        return f"they drain {before}"
    if unnamed == len(drains):
        return f"they drain {at_end}"
    return f"{len(drains) - unnamed} drain {before}, {unnamed} {at_end}"


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


def _inline_launch(subject: Subject, reduction: int, waiting: int) -> tuple[int, int] | None:
    """The first and last op of a reduction's launch on the waiting op's host thread (gloo),
    before the wait; None when the reduction was launched elsewhere."""
    graph = subject.graph
    call = int(graph.launcher[reduction])
    if call < 0 or graph.lane_id[call] != graph.lane_id[waiting] \
            or graph.mode[call] != schema.THREAD:
        return None
    first, last = _launch_stretch(subject, call)
    return (first, last) if last < waiting else (call, call)


def _launch_stretch(subject: Subject, call: int) -> tuple[int, int]:
    """The first and last op of the stretch of the annotation around a host call that launched
    a reduction, where it holds nothing but annotation time (a nested range with no op under
    it: the scheduler's own time) and communication calls that wait for no one; else the call
    alone."""
    first, last = subject.enclosing(call)
    inside = np.arange(first, last + 1)
    own = subject.passable[inside] & ~subject.waiting[inside] & ~subject.sends[inside]
    return (first, last) if own.all() else (call, call)


def _send_start(subject: Subject, send: int) -> int:
    """The first op of a send's own stretch of its thread: the host calls and annotation time
    right before it, inside the annotation around it."""
    graph = subject.graph
    first = subject.enclosing(send)[0]
    op = send
    while op > first and graph.prev[op] >= 0 and (subject.passable[graph.prev[op]]
                                                   or graph.kind[graph.prev[op]] == schema.P2P):
        op = int(graph.prev[op])
    return op


def _fork(chain: np.ndarray, subject: Subject, first: int, last: int) -> bool:
    """Move ops first..last of a thread to a thread of their own, started where they were: the
    op after them follows the op before them. False when nothing can follow (a lane's ends)."""
    after = int(subject.next_on_lane[last])
    if after < 0 or chain[start(first)] < 0:
        return False
    chain[start(after)] = chain[start(first)]
    return True


def _join_before_send(subject: Subject, chain: np.ndarray, const: np.ndarray,
                      launch: int) -> int:
    """Put a reduction launched from a thread of its own back in line: the stretch of the
    annotation around its launching call runs on the rank's thread that started it, right
    before the send nearest to where it started, which it then holds. The node the reduction
    holds (the start of that send's own stretch), -1 if no send is near."""
    if subject.graph.mode[launch] != schema.THREAD:
        return -1
    first, last = _launch_stretch(subject, launch)
    send = _send_at_spawn(subject, first)
    if send < 0:
        return -1
    before = _send_start(subject, send)
    if chain[start(before)] < 0:
        return -1
    chain[start(first)] = chain[start(before)]
    const[start(first)] = 0
    chain[start(before)] = end(last)
    return start(before)


def _send_at_spawn(subject: Subject, op: int) -> int:
    """The send nearest to where the thread running `op` was started: the rank's sending
    threads are searched from their annotation time (a host call with no op under it) in the
    SPAWN_WINDOW_NS before `op` started, latest first; -1 if no send is near."""
    graph = subject.graph
    begun = graph.start[op]
    lanes = (graph.rank == graph.rank[op]) & subject.sends & (graph.lane_id != graph.lane_id[op])
    found = []
    for lane in np.unique(graph.lane_id[lanes]).tolist():
        ops = subject.lane_ops(lane)
        found.append(ops[(graph.start[ops] <= begun) & subject.passable[ops]
                         & (graph.end[ops] >= begun - SPAWN_WINDOW_NS)])
    near = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    for candidate in near[np.argsort(-graph.start[near], kind="stable")].tolist():
        send = _send_near(subject, candidate)
        if send >= 0:
            return send
    return -1


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
            if subject.sends[op]:
                return op
            if not subject.passable[op]:
                break
            found = subject.handoff(op)
            if found >= 0:
                return found
    return -1
