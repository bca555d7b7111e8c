"""The pipeline schedule recovered from a trace: stage × time with F/B/W blocks per microbatch.

Sources, best first:
- the simulator's ground truth (a `Timeline`, whose ops carry phase, microbatch and chunk);
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
_P2P_COMMS = ("send", "recv", "batch_send_recv")


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


def recover(analysis, truth=None) -> Pipeline | None:
    """The pipeline of `analysis` from `truth` (a simulate Timeline), annotations or op order."""
    if truth is not None:
        return from_timeline(analysis, truth)
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
        "chunk": parsed.loc[found, "chunk"].fillna(0).astype("int64").to_numpy(),
        "microbatch": parsed.loc[found, "mb"].astype("int64").to_numpy(),
        "phase": parsed.loc[found, "phase"].str.lower().map(_PHASES).to_numpy(),
        "start": (rows["start_ns"] - shift).to_numpy(),
        "end": (rows["start_ns"] + rows["dur_ns"] - shift).to_numpy()})
    blocks["work"] = _work(analysis, blocks)
    return _staged(analysis, blocks, "annotations", _flow_depth(events))


def from_op_order(analysis) -> Pipeline | None:
    """Blocks from main-lane compute between P2P ops (see the module docstring)."""
    events = analysis.trace.events
    comm = events[events["kind"].isin([schema.P2P, schema.COLLECTIVE])]
    if not ((comm["kind"] == schema.P2P) & (comm["peer"] >= 0)).any():
        return None
    ops, (start, end) = analysis.ops, _aligned(analysis)
    main = ops.main_lanes()
    parts = []
    for rank, rank_comm in comm.groupby("rank"):
        if int(rank) not in main:
            continue
        idx = np.flatnonzero((ops.frame["lane_id"].to_numpy() == main[int(rank)])
                             & ops.frame["kind"].isin(_WORK_KINDS).to_numpy())
        offset = analysis.offsets.get(int(rank), 0)
        parts.append(_segments(int(rank), rank_comm, offset, start[idx], end[idx],
                               ops.frame["step"].to_numpy()[idx]))
    blocks = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if blocks.empty:
        return None
    return _staged(analysis, blocks, "op order", {})


def from_timeline(analysis, timeline) -> Pipeline | None:
    """Blocks from a simulated Timeline's schedule facts, on the analysis's aligned clock."""
    from tracegraph.simulate.bundle_writer import clock_shift

    ops = timeline.ops[timeline.ops["phase"].isin([F, B, W]) & (timeline.ops["microbatch"] >= 0)]
    if ops.empty:
        return None
    shift = {r: s - analysis.offsets.get(r, 0) for r, s in clock_shift(timeline).items()}
    ops = ops.assign(start=ops["start_ns"] + ops["rank"].map(shift),
                     end=ops["start_ns"] + ops["dur_ns"] + ops["rank"].map(shift),
                     work=ops["dur_ns"])
    blocks = ops.groupby(["step", "rank", "chunk", "microbatch", "phase"], as_index=False).agg(
        start=("start", "min"), end=("end", "max"), work=("work", "sum"))
    first_chunk = blocks.groupby("rank")["chunk"].min()
    return _staged(analysis, blocks, "ground truth",
                   {int(r): int(c) for r, c in first_chunk.items()})


# --- stages ----------------------------------------------------------------------------------
def _staged(analysis, blocks: pd.DataFrame, source: str, order: dict[int, float]) -> Pipeline:
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


def _replicas(trace, ranks: list[int]) -> dict[int, int]:
    """rank -> replica id (its smallest member): components of P2P peers and `pp` groups."""
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
    return {r: find(r) for r in ranks}


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
def _aligned(analysis) -> tuple[np.ndarray, np.ndarray]:
    ops = analysis.ops
    shift = ops.frame["rank"].map(analysis.offsets).fillna(0).astype("int64").to_numpy()
    return ops.start - shift, ops.end - shift


def _work(analysis, blocks: pd.DataFrame) -> np.ndarray:
    """Main-lane compute time (aligned ns) inside each block."""
    ops, (start, end) = analysis.ops, _aligned(analysis)
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
def _segments(rank: int, comm: pd.DataFrame, offset: int, start: np.ndarray, end: np.ndarray,
              step: np.ndarray) -> pd.DataFrame:
    """Main-lane compute of one rank grouped between its comm ops, each group given a phase."""
    comm = comm.sort_values("start_ns")
    c_start = comm["start_ns"].to_numpy() - offset
    c_end = c_start + comm["dur_ns"].to_numpy()
    after, before = _evidence(rank, comm)
    prev = np.searchsorted(np.maximum.accumulate(c_end), start, side="right") - 1
    nxt = np.searchsorted(c_start, end, side="left")
    from_prev = np.where(prev >= 0, after[np.maximum(prev, 0)], "")
    from_next = np.where(nxt < len(c_start), before[np.minimum(nxt, len(c_start) - 1)], "")
    phase = np.where((from_prev != "") & (from_next != "") & (from_prev != from_next), FB,
                     np.where(from_prev != "", from_prev, from_next))
    ops = pd.DataFrame({"segment": prev, "step": step, "phase": phase, "start": start,
                        "end": end, "work": end - start})
    ops = ops[ops["phase"] != ""]
    blocks = ops.groupby(["segment", "step"], as_index=False).agg(
        phase=("phase", "first"), start=("start", "min"), end=("end", "max"),
        work=("work", "sum"))
    blocks = blocks.assign(rank=rank, chunk=0, forward=blocks["phase"].isin([F, FB]))
    blocks["microbatch"] = blocks.groupby(["step", "forward"]).cumcount()
    return blocks.drop(columns=["segment", "forward"])


def _evidence(rank: int, comm: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Phase of compute right after / right before each comm op ("" when it says nothing).

    Stages follow rank order, so a peer below `rank` is upstream."""
    peer, kind = comm["peer"].to_numpy(), comm["comm"].to_numpy()
    p2p = (comm["kind"].to_numpy() == schema.P2P) & (peer >= 0)
    upstream = peer < rank
    toward = np.where(upstream, B, F)  # compute before a message to that side
    back = np.where(upstream, F, B)  # compute after a message from that side
    after = np.where(p2p & (kind != "send"), back, "")
    before = np.where(p2p & (kind != "recv"), toward, "")
    return after.astype(object), before.astype(object)
