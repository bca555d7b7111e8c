"""What P2P messages say about the compute around them, on each rank's main lane.

Compute after a receive from the previous stage (or before a send to the next) is forward work;
after a receive from the next stage (or before a send to the previous) it is backward work. A
P2P op speaks for itself; a stream wait for the P2P op it waited for; a record for the P2P op that
the wait on it let go; a compute op that a P2P lane waited for ends the work it sent. A stream
wait whose producer is unknown (a non-blocking Ascend EVENT_WAIT) may be a receive: it can start
work too, though it says nothing of its phase.

`lane_work` lists every rank's main-lane work with these marks (and each op's autograd sequence
number, `autograd`, where the profiler records one): `cut` counts the P2P boundaries before an
op (work between two of them is at most a forward and a backward, one after the other; other
boundaries, a collective or its wait, do not cut it), `evidence` is the phase the P2P boundaries
on either side say (F+B when they disagree), `opened` and `closing` whether the one before
starts work and the one after ends it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.pipeline.blocks import FB, WORK_KINDS, B, F

_P2P_COMMS = tuple(schema.P2P_COMMS)
_BOUNDARY_KINDS = (schema.P2P, schema.COLLECTIVE, schema.WAIT, schema.RECORD)
WORK_COLUMNS = ["rank", "step", "op", "name_id", "autograd", "start", "end", "cut", "evidence",
                "opened", "closing"]


@dataclass(frozen=True)
class _Columns:
    """The ops' columns `_lane` reads, taken out of the frame once (Arrow strings are slow to
    take from): names as codes."""

    kind: np.ndarray
    comm: np.ndarray
    step: np.ndarray
    name_id: np.ndarray
    autograd: np.ndarray
    position: np.ndarray  # where a boundary op takes effect (`_position`)
    unknown_wait: np.ndarray  # a stream wait whose producer is unknown


def lane_work(analysis, upstream: np.ndarray, name_ids: np.ndarray) -> pd.DataFrame:
    """WORK_COLUMNS for the main-lane work of every rank; `upstream`: per op, whether its P2P
    peer is an earlier stage; `name_ids`: its name's code (`names`)."""
    frame = analysis.ops.frame
    kind = frame["kind"].to_numpy()
    cols = _Columns(kind, frame["comm"].to_numpy(), frame["step"].to_numpy(),
                    name_ids, frame["autograd_seq"].to_numpy(),
                    _position(analysis), (kind == schema.WAIT) & (analysis.matches.dep < 0))
    after, before = _evidence(analysis, upstream)
    lane_ids = frame["lane_id"].to_numpy()
    parts = [_lane(analysis, cols, np.flatnonzero(lane_ids == lane), after, before
                   ).assign(rank=rank) for rank, lane in analysis.ops.main_lanes().items()]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True)[WORK_COLUMNS] if parts else pd.DataFrame(
        columns=WORK_COLUMNS)


def names(analysis) -> tuple[np.ndarray, pd.Index]:
    """Each op's name as a code, and the names by code."""
    codes, uniques = pd.factorize(analysis.ops.frame["name"])
    return codes, pd.Index(uniques)


def _lane(analysis, cols: _Columns, idx: np.ndarray, after: np.ndarray, before: np.ndarray
          ) -> pd.DataFrame:
    """One lane's work ops with their boundaries (see the module docstring)."""
    start, end = analysis.start, analysis.end
    kind, comm = cols.kind[idx], cols.comm[idx]
    edge = np.isin(kind, _BOUNDARY_KINDS) | (comm != "")  # a host lane's c10d calls too
    work = np.isin(kind, WORK_KINDS) & (comm == "")  # a blocking c10d::recv_ call is no work
    closer = work & (before[idx] != "")
    times = np.concatenate([cols.position[idx[edge]], end[idx[closer]]])
    if not work.any() or not len(times):
        return pd.DataFrame()
    order = np.argsort(times, kind="stable")
    times, op = times[order], np.concatenate([idx[edge], idx[closer]])[order]
    is_edge = np.concatenate([np.ones(edge.sum(), bool), np.zeros(closer.sum(), bool)])[order]
    says_after = np.where(is_edge, after[op], "")
    opens = (says_after != "") | (is_edge & cols.unknown_wait[op])
    closes = before[op] != ""
    ops, steps = idx[work], cols.step
    seg = np.searchsorted(times, start[ops], side="right")  # boundaries before each op
    marked = np.flatnonzero(opens | closes)
    if not len(marked):
        return pd.DataFrame()
    last = np.searchsorted(marked, seg, "left") - 1  # the P2P boundary before each op ...
    first = np.searchsorted(marked, seg, "left")  # ... and after it
    prev, nxt = marked[np.maximum(last, 0)], marked[np.minimum(first, len(marked) - 1)]
    has_prev = (last >= 0) & (steps[op[prev]] == steps[ops])
    has_next = (first < len(marked)) & (steps[op[nxt]] == steps[ops])
    return pd.DataFrame({
        "step": steps[ops], "op": ops, "name_id": cols.name_id[ops],
        "autograd": cols.autograd[ops], "start": start[ops], "end": end[ops], "cut": last + 1,
        "evidence": _phase(np.where(has_prev, says_after[prev], ""),
                           np.where(has_next, before[op][nxt], "")),
        "opened": has_prev & opens[prev], "closing": has_next & closes[nxt]})


def _phase(from_prev: np.ndarray, from_next: np.ndarray) -> np.ndarray:
    """The phase two neighbouring boundaries say, F+B when they disagree."""
    both = (from_prev != "") & (from_next != "") & (from_prev != from_next)
    return np.where(both, FB, np.where(from_prev != "", from_prev, from_next))


def _position(analysis) -> np.ndarray:
    """Where each op takes effect among its lane's work as a boundary: a stream wait stamped
    when it was enqueued (Kineto) right before the op it gates, any other op at _effective."""
    gated = np.full(len(analysis.ops), -1, dtype=np.int64)
    for op, waits in analysis.matches.gates.items():
        gated[waits] = op
    every = np.arange(len(analysis.ops))
    return np.where(gated >= 0, analysis.start[np.maximum(gated, 0)],
                    _effective(analysis, every))


def _effective(analysis, ops: np.ndarray) -> np.ndarray:
    """When each boundary op takes effect: a wait when what it waits for released it, any other
    op at its start."""
    start, end = analysis.start, analysis.end
    dep, how = analysis.matches.dep[ops], analysis.matches.how[ops]
    release = np.where(how == "event_id", end[np.maximum(dep, 0)], start[np.maximum(dep, 0)])
    waits = (analysis.ops.frame["kind"].to_numpy()[ops] == schema.WAIT) & (dep >= 0)
    return np.where(waits, np.maximum(start[ops], release), start[ops])


def _evidence(analysis, upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per op: the phase of main-lane compute right after / right before it ("" if unknown)."""
    frame, start = analysis.ops.frame, analysis.start
    peer = frame["peer"].to_numpy()
    comm, lane = frame["comm"].to_numpy(), frame["lane_id"].to_numpy()
    kind = frame["kind"].to_numpy()
    is_p2p = ((kind == schema.P2P) | (kind == schema.HOST)) & np.isin(comm, _P2P_COMMS) & (
        peer >= 0)  # a P2P op, or the c10d call that issued it on a host lane
    toward = np.where(upstream, B, F)  # compute before a message to that side
    back = np.where(upstream, F, B)  # compute after a message from that side
    after = np.where(is_p2p & (comm != "send"), back, "").astype(object)
    before = np.where(is_p2p & (comm != "recv"), toward, "").astype(object)
    dep = analysis.matches.dep
    waits = np.flatnonzero((kind == schema.WAIT) & (dep >= 0))
    p2p = np.flatnonzero(is_p2p)
    for lane_id in np.unique(lane[p2p]):
        mine = p2p[lane[p2p] == lane_id]  # sorted by start within the lane
        released = waits[lane[dep[waits]] == lane_id]  # waits for this lane
        when = _effective(analysis, released)
        q = mine[np.maximum(np.searchsorted(start[mine], when, "right") - 1, 0)]
        ok = (start[q] <= when) & (comm[q] != "send")
        after[released[ok]] = back[q[ok]]
        holding = waits[lane[waits] == lane_id]  # this lane waits on a record elsewhere
        pos = np.searchsorted(start[mine], start[holding], "left")
        q = mine[np.minimum(pos, len(mine) - 1)]
        ok = (pos < len(mine)) & (comm[q] != "recv")
        before[dep[holding[ok]]] = toward[q[ok]]
    return after, before
