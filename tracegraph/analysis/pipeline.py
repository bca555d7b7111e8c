"""The pipeline schedule recovered from a trace: stage × time with F/B/W blocks per microbatch.

Sources, best first (a simulation's ground truth, `simulate/truth_pipeline.py`, serves tests
only: the report draws what the trace says):
- user annotations such as `FWD mb=3`, `BWD mb=3`, `W mb=0 chunk=1` (phase, microbatch, chunk);
- the order of P2P ops on each rank: main-lane compute after a receive from the previous stage
  (or before a send to the next) is forward, after a receive from the next stage (or before a send
  to the previous) is backward. Stages are then ordered by rank, one chunk each; a last stage's
  forward and backward that no P2P separates form one `F+B` block, numbered by occurrence.

A pipeline replica is a set of ranks linked by P2P ops (or a `pp` group). The measured bubble ratio
of a step is the stages' mean idle time inside the replica's span (first block start to last block
end) over their mean work (main-lane compute inside blocks); for GPipe and (interleaved) 1F1B the
theory is (p − 1)/(v·m) for p stages, v chunks per stage and m microbatches.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import networkx as nx
import numpy as np
import pandas as pd

from tracegraph import schema

F, B, W, FB = "F", "B", "W", "F+B"
BLOCK_COLUMNS = ["step", "rank", "replica", "stage", "chunk", "microbatch", "phase", "start",
                 "end", "work"]
_PHASES = {"f": F, "fwd": F, "forward": F, "b": B, "bwd": B, "backward": B, "w": W, "wgt": W,
           "weight": W}
_BLOCK = re.compile(
    r"^(?P<phase>fwd|bwd|wgt|forward|backward|weight|f|b|w)(?![a-z])[\s_:-]*"
    r"(?:mb|micro_?batch)?[\s=_:#-]*(?P<mb>\d+)"
    r"(?:.*?(?:chunk|vpp|model_chunk)[\s=_:#-]*(?P<chunk>\d+))?", re.IGNORECASE)
_WORK_KINDS = (schema.COMPUTE, schema.HOST, schema.MEMCPY)
_P2P_COMMS = tuple(schema.P2P_COMMS)
_BOUNDARY_KINDS = (schema.P2P, schema.COLLECTIVE, schema.WAIT, schema.RECORD)


@dataclass
class BubbleRatio:
    """Measured vs theoretical pipeline bubble of one step (mean over replicas)."""

    stages: int  # p
    chunks: int  # v
    microbatches: int  # m
    measured: float
    theory: float  # (p - 1) / (v * m)


@dataclass
class Pipeline:
    """Recovered F/B/W blocks (aligned ns) and where they came from."""

    blocks: pd.DataFrame  # BLOCK_COLUMNS
    source: str  # "ground truth" | "annotations" | "op order"

    @property
    def steps(self) -> list[int]:
        return sorted(int(s) for s in self.blocks["step"].unique())

    def bubble_ratio(self, step: int) -> BubbleRatio | None:
        """The step's measured bubble ratio beside (p − 1)/(v·m); None without blocks."""
        blocks = self.blocks[self.blocks["step"] == step]
        if blocks.empty:
            return None
        p = int(blocks.groupby("replica")["stage"].nunique().max())
        v = int(blocks.groupby("rank")["chunk"].nunique().max())
        forward = blocks[blocks["phase"].isin([F, FB])]
        m = int(forward.groupby(["rank", "chunk"])["microbatch"].nunique().max()) if len(
            forward) else 0
        measured = float(np.mean([_measured(g) for _, g in blocks.groupby("replica")]))
        return BubbleRatio(p, v, m, measured, (p - 1) / (v * m) if m else float("nan"))


def recover(analysis) -> Pipeline | None:
    """The pipeline of `analysis` from its annotations, else from its op order; None when
    neither can be trusted (nothing is drawn rather than a wrong picture)."""
    return from_annotations(analysis) or from_op_order(analysis)


def from_annotations(analysis) -> Pipeline | None:
    """Blocks from markers named like `FWD mb=3` / `BWD mb=3 chunk=1`; None when there are none."""
    events = analysis.trace.events
    markers = events[events["kind"] == schema.MARKER]
    parsed = markers["name"].str.extract(_BLOCK)
    found = parsed["phase"].notna()
    if not found.any():
        return None
    rows = markers[found.to_numpy()]
    shift = rows["rank"].map(analysis.offsets).fillna(0).astype("int64")
    blocks = pd.DataFrame({
        "step": rows["step"].to_numpy(), "rank": rows["rank"].to_numpy(),
        "chunk": parsed.loc[found, "chunk"].fillna("0").astype("int64").to_numpy(),
        "microbatch": parsed.loc[found, "mb"].astype("int64").to_numpy(),
        "phase": parsed.loc[found, "phase"].str.lower().map(_PHASES).to_numpy(),
        "start": (rows["start_ns"] - shift).to_numpy(),
        "end": (rows["start_ns"] + rows["dur_ns"] - shift).to_numpy()})
    blocks["work"] = _work(analysis, blocks)
    return staged(analysis, blocks, "annotations", _flow_depth(events))


def from_op_order(analysis) -> Pipeline | None:
    """Blocks from main-lane compute between P2P boundaries (see the module docstring)."""
    frame = analysis.ops.frame
    if not ((frame["kind"] == schema.P2P) & (frame["peer"] >= 0)).any():
        return None
    ring = _interleaved(analysis.trace)
    start, end = analysis.start, analysis.end
    after, before = _evidence(analysis, start, end, _upstream(analysis, ring))
    lane_ids = frame["lane_id"].to_numpy()
    parts = [_lane_blocks(analysis, np.flatnonzero(lane_ids == lane_id), start, end, after,
                          before).assign(rank=rank)
             for rank, lane_id in analysis.ops.main_lanes().items()]
    blocks = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if blocks.empty:
        return None
    if ring:  # interleaved: chunks and microbatches from the schedule the phases match
        blocks = interleaved_labels(analysis, blocks)
        if blocks is None:
            return None
    return staged(analysis, blocks, "op order", {})


def _upstream(analysis, ring: bool) -> np.ndarray:
    """Per op: its P2P peer is upstream (an earlier stage) of its rank. Stages follow rank order
    within a replica; on a ring (interleaved stages) the upstream peer is the previous rank,
    wrapping from the first to the last."""
    frame = analysis.ops.frame
    rank, peer = frame["rank"].to_numpy(), frame["peer"].to_numpy()
    if not ring:
        return peer < rank
    previous = {}
    for members in _members(analysis.trace).values():
        for i, r in enumerate(members):
            previous[r] = members[i - 1]
    return np.array([previous.get(int(r), -2) == int(q) for r, q in zip(rank, peer,
                                                                          strict=True)])


def _members(trace) -> dict[int, list[int]]:
    """Replica -> its ranks in order."""
    replicas = _replicas(trace, trace.rank_ids)
    out: dict[int, list[int]] = {}
    for r in sorted(replicas):
        out.setdefault(replicas[r], []).append(r)
    return out


def interleaved_labels(analysis, blocks: pd.DataFrame) -> pd.DataFrame | None:
    """Chunk and microbatch of each block of an interleaved pipeline: the rank's sequence of
    block phases must be exactly that of Megatron's interleaved 1F1B for some chunk count v
    (blocks merge where no P2P separates two actions: F+B on the last stage, B then F on the
    first). None when no v fits every rank and step: unsure, so nothing is drawn."""
    from tracegraph.analysis.schedules import segments

    stage = {r: i for members in _members(analysis.trace).values() for i, r in enumerate(members)}
    size = {r: len(m) for m in _members(analysis.trace).values() for r in m}
    labelled = []
    for (rank, _step), mine in blocks.sort_values("start").groupby(["rank", "step"]):
        p, s = size[int(rank)], stage[int(rank)]
        count, fit = len(mine), None
        shapes = [(v, m) for v in range(2, count + 1) for m in range(p, count + 1, p)
                  if v * m <= count <= 2 * v * m]
        for v, m in shapes:
            if _fits(segments(p, v, m, s), mine["phase"].tolist()):
                fit = segments(p, v, m, s)[:count]
                break
        if fit is None:
            return None
        first = [seg[0] for seg in fit]
        labelled.append(mine.assign(chunk=[a.chunk for a in first],
                                    microbatch=[a.microbatch for a in first]))
    return pd.concat(labelled, ignore_index=True)


MATCH_SHARE = 0.95  # blocks that must agree with the schedule, in order, for it to be taken


def _fits(expected: list, observed: list[str]) -> bool:
    """Whether the observed block phases follow the schedule's segments in order: as many (a
    few may be missing at the end, merged with what follows the step's last send) and at least
    MATCH_SHARE of them the same phase (an F+B block may show as its F or its B)."""
    if not observed or len(observed) > len(expected) or (
            len(expected) - len(observed)) > (1 - MATCH_SHARE) * len(expected):
        return False
    same = sum(phase == _phase_of(seg) or (_phase_of(seg) == FB and phase in (F, B))
               for seg, phase in zip(expected, observed, strict=False))
    return same >= MATCH_SHARE * len(expected)


def _phase_of(segment) -> str:
    phases = {a.phase for a in segment}
    return FB if len(phases) > 1 else phases.pop()


# --- stages ----------------------------------------------------------------------------------
def staged(analysis, blocks: pd.DataFrame, source: str, order: dict[int, float]) -> Pipeline:
    """Add replica and stage: stage = position of the rank within its replica by `order`."""
    replicas = _replicas(analysis.trace, sorted(int(r) for r in blocks["rank"].unique()))
    stage: dict[int, int] = {}
    seen: Counter[int] = Counter()
    for r in sorted(replicas, key=lambda r: (replicas[r], order.get(r, 0), r)):
        stage[r] = seen[replicas[r]]
        seen[replicas[r]] += 1
    blocks = blocks.assign(replica=blocks["rank"].map(replicas), stage=blocks["rank"].map(stage))
    blocks = blocks.astype({"step": "int64", "rank": "int64", "chunk": "int64",
                            "microbatch": "int64", "start": "int64", "end": "int64",
                            "work": "int64"})
    return Pipeline(blocks[BLOCK_COLUMNS].sort_values(["step", "replica", "stage", "start"],
                                                       ignore_index=True), source)


def rank_stages(trace) -> dict[int, int]:
    """Rank -> stage: its position, in rank order, among the ranks P2P ops or `pp` groups link
    into one replica (the usual layout numbers stages in rank order)."""
    ranks = trace.rank_ids
    replicas = _replicas(trace, ranks)
    stage: dict[int, int] = {}
    seen: Counter[int] = Counter()
    for r in sorted(ranks, key=lambda r: (replicas[r], r)):
        stage[r] = seen[replicas[r]]
        seen[replicas[r]] += 1
    return stage


def _replicas(trace, ranks: list[int]) -> dict[int, int]:
    """rank -> replica number: components of P2P peers and `pp` groups, by smallest member."""
    parent = {r: r for r in ranks}

    def find(r: int) -> int:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    events = trace.events
    pairs = events.loc[(events["peer"] >= 0) & events["comm"].isin(_P2P_COMMS), ["rank", "peer"]]
    links = list(pairs.drop_duplicates().itertuples(index=False, name=None))
    for members in trace.groups.loc[trace.groups["dim"] == "pp", "ranks"]:
        links += [(int(members[0]), int(m)) for m in members[1:]]
    for a, b in links:
        if int(a) in parent or int(b) in parent:
            ra, rb = find(int(a)), find(int(b))
            parent[max(ra, rb)] = min(ra, rb)
    roots = {r: find(r) for r in ranks}
    number = {root: i for i, root in enumerate(sorted(set(roots.values())))}
    return {r: number[root] for r, root in roots.items()}


def _interleaved(trace) -> bool:
    """Whether some replica of 3+ ranks links its first and last rank (a VPP wrap-around)."""
    events = trace.events
    pairs = events.loc[(events["peer"] >= 0) & events["comm"].isin(_P2P_COMMS), ["rank", "peer"]]
    linked = {(int(a), int(b)) for a, b in pairs.drop_duplicates().itertuples(index=False)}
    replicas = _replicas(trace, sorted({r for pair in linked for r in pair}))
    members: dict[int, list[int]] = {}
    for r, replica in replicas.items():
        members.setdefault(replica, []).append(r)
    return any(len(m) > 2 and ((min(m), max(m)) in linked or (max(m), min(m)) in linked)
               for m in members.values())


def _flow_depth(events: pd.DataFrame) -> dict[int, int]:
    """rank -> depth in the forward data flow of annotated P2P ops.

    A receive inside a forward block (or a send inside a backward one) comes from upstream;
    ranks on a cycle (interleaved stages wrap around) share a depth and fall back to rank order.
    """
    p2p = events[(events["kind"] == schema.P2P) & (events["peer"] >= 0)
                 & events["comm"].isin(["send", "recv"])]
    phase = p2p["annotation"].str.extract(_BLOCK)["phase"].str.lower().map(_PHASES)
    from_peer = (p2p["comm"] == "recv") == (phase == F)
    known = phase.isin([F, B])
    rank, peer = p2p["rank"].to_numpy(), p2p["peer"].to_numpy()
    flow = nx.DiGraph()
    flow.add_edges_from(zip(np.where(from_peer, peer, rank)[known.to_numpy()],
                            np.where(from_peer, rank, peer)[known.to_numpy()], strict=True))
    if not flow.number_of_nodes():
        return {}
    dag = nx.condensation(flow)
    return {int(r): depth for depth, nodes in enumerate(nx.topological_generations(dag))
            for node in nodes for r in dag.nodes[node]["members"]}


# --- work and bubble -------------------------------------------------------------------------
def _work(analysis, blocks: pd.DataFrame) -> np.ndarray:
    """Main-lane compute time (aligned ns) inside each block."""
    ops, start, end = analysis.ops, analysis.start, analysis.end
    lane_ids = ops.frame["lane_id"].to_numpy()
    working = ops.frame["kind"].isin(_WORK_KINDS).to_numpy()
    work = np.zeros(len(blocks), dtype=np.int64)
    for rank, lane_id in ops.main_lanes().items():
        rows = np.flatnonzero(blocks["rank"].to_numpy() == rank)
        idx = np.flatnonzero((lane_ids == lane_id) & working)
        if len(rows) and len(idx):
            work[rows] = busy_within(start[idx], end[idx], blocks["start"].to_numpy()[rows],
                                     blocks["end"].to_numpy()[rows])
    return work


def busy_within(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray
                ) -> np.ndarray:
    """Time covered by ops [start, end) (sorted, not overlapping) inside each window [lo, hi)."""
    cum = np.concatenate([[0], np.cumsum(end - start)])
    first = np.searchsorted(end, lo, side="right")  # first op ending after lo
    stop = np.searchsorted(start, hi, side="left")  # ops starting before hi
    total = cum[np.maximum(stop, first)] - cum[first]
    has = stop > first
    head = np.where(has, np.clip(lo - start[np.minimum(first, len(start) - 1)], 0, None), 0)
    tail = np.where(has, np.clip(end[np.maximum(stop - 1, 0)] - hi, 0, None), 0)
    return np.maximum(total - head - tail, 0)


def _measured(blocks: pd.DataFrame) -> float:
    """Mean idle time of the replica's stages within its span, over their mean work."""
    span = blocks["end"].max() - blocks["start"].min()
    work = blocks.groupby("rank")["work"].sum()
    return float((span - work.mean()) / work.mean()) if work.mean() > 0 else float("nan")


# --- op order --------------------------------------------------------------------------------
def _lane_blocks(analysis, idx: np.ndarray, start: np.ndarray, end: np.ndarray,
                 after: np.ndarray, before: np.ndarray) -> pd.DataFrame:
    """One lane's compute grouped between boundaries, each group given a phase.

    Boundaries are the lane's waits, records, comm ops and collective launches (before the op),
    and compute ops that a P2P lane waited for (after the op: their output is what gets sent)."""
    frame = analysis.ops.frame
    kind, comm = frame["kind"].to_numpy()[idx], frame["comm"].to_numpy()[idx]
    steps = frame["step"].to_numpy()
    edge = np.isin(kind, _BOUNDARY_KINDS) | ((comm != "") & ~np.isin(comm, _P2P_COMMS))
    work = np.isin(kind, _WORK_KINDS) & ~edge
    closer = work & (before[idx] != "")
    times = np.concatenate([_effective(analysis, idx[edge], start, end), end[idx[closer]]])
    if not len(times):
        return pd.DataFrame()
    order = np.argsort(times, kind="stable")
    times, op = times[order], np.concatenate([idx[edge], idx[closer]])[order]
    is_edge = np.concatenate([np.ones(edge.sum(), bool), np.zeros(closer.sum(), bool)])[order]
    mark_after = np.where(is_edge, after[op], "")
    seg = np.searchsorted(times, start[idx[work]], side="right")  # boundaries before each op
    prev, nxt = np.maximum(seg - 1, 0), np.minimum(seg, len(times) - 1)
    step = steps[idx[work]]
    from_prev = np.where((seg > 0) & (steps[op[prev]] == step), mark_after[prev], "")
    from_next = np.where((seg < len(times)) & (steps[op[nxt]] == step), before[op[nxt]], "")
    phase = np.where((from_prev != "") & (from_next != "") & (from_prev != from_next), FB,
                     np.where(from_prev != "", from_prev, from_next))
    ops = pd.DataFrame({"segment": seg, "step": step, "phase": phase, "start": start[idx][work],
                        "end": end[idx][work]})
    ops = ops[ops["phase"] != ""].assign(work=lambda o: o["end"] - o["start"])
    blocks = ops.groupby(["segment", "step"], as_index=False).agg(
        phase=("phase", "first"), start=("start", "min"), end=("end", "max"),
        work=("work", "sum"))
    blocks = blocks.assign(chunk=0, forward=blocks["phase"].isin([F, FB]))
    blocks["microbatch"] = blocks.groupby(["step", "forward"]).cumcount()
    return blocks.drop(columns=["segment", "forward"])


def _effective(analysis, ops: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """When each boundary op takes effect on its lane: a wait when what it waits for released
    it (a Kineto stream wait is stamped when enqueued), any other op at its start."""
    dep, how = analysis.matches.dep[ops], analysis.matches.how[ops]
    release = np.where(how == "event_id", end[np.maximum(dep, 0)], start[np.maximum(dep, 0)])
    waits = (analysis.ops.frame["kind"].to_numpy()[ops] == schema.WAIT) & (dep >= 0)
    return np.where(waits, np.maximum(start[ops], release), start[ops])


def _evidence(analysis, start: np.ndarray, end: np.ndarray, upstream: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per op: the phase of main-lane compute right after / right before it ("" if unknown).

    A P2P op speaks for itself. A wait speaks for the P2P op on the lane it waited for, a record
    for the P2P op that the wait on it let go. `upstream`: per op, whether its peer is upstream.
    """
    frame = analysis.ops.frame
    peer = frame["peer"].to_numpy()
    comm, lane = frame["comm"].to_numpy(), frame["lane_id"].to_numpy()
    is_p2p = (frame["kind"].to_numpy() == schema.P2P) & (peer >= 0)
    toward = np.where(upstream, B, F)  # compute before a message to that side
    back = np.where(upstream, F, B)  # compute after a message from that side
    after = np.where(is_p2p & (comm != "send"), back, "").astype(object)
    before = np.where(is_p2p & (comm != "recv"), toward, "").astype(object)
    dep = analysis.matches.dep
    waits = np.flatnonzero((frame["kind"].to_numpy() == schema.WAIT) & (dep >= 0))
    p2p = np.flatnonzero(is_p2p)
    for lane_id in np.unique(lane[p2p]):
        mine = p2p[lane[p2p] == lane_id]  # sorted by start within the lane
        released = waits[lane[dep[waits]] == lane_id]  # waits for this lane
        when = _effective(analysis, released, start, end)
        q = mine[np.maximum(np.searchsorted(start[mine], when, "right") - 1, 0)]
        ok = (start[q] <= when) & (comm[q] != "send")
        after[released[ok]] = back[q[ok]]
        holding = waits[lane[waits] == lane_id]  # this lane waits on a record elsewhere
        pos = np.searchsorted(start[mine], start[holding], "left")
        ok = (pos < len(mine))
        q = mine[np.minimum(pos, len(mine) - 1)]
        ok &= comm[q] != "recv"
        before[dep[holding[ok]]] = toward[q[ok]]
    return after, before
