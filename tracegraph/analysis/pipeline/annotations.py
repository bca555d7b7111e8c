"""The pipeline from the framework's own ranges around each forward and backward.

Names read: a phase (`FWD`, `BWD`, `WGT`, `forward`, `backward`, `weight`, with or without
`_step`), then its microbatch and model chunk as keyed numbers in any order (`FWD mb=3`,
`BWD mb=3 chunk=1`, `FWD chunk=1 mb=3`, `forward_step model_chunk_id=1 microbatch_id=3`,
`backward vpp_rank=0 micro_batch=2`; a bare number right after the phase is the microbatch),
and ranges that only name the phase, as real frameworks write them: `forward_step` /
`backward_step` (Megatron's schedule functions, as record_function ranges in Kineto) and
`forward` / `backward` (MindSpeed's mstx ranges, which msprof-analyze's pp_chart reads). Ranges
without numbers are numbered by their order, as op-order recovery numbers its blocks (`labels`).

A range on a device stream (`gpu_user_annotation`) is where the work ran; a host range covers
the work it launched, which runs later on the device: its block spans the main-lane ops launched
inside it. On a host main lane (CPU training) the range is the work.
"""

from __future__ import annotations

import re

import networkx as nx
import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.pipeline.blocks import WORK_KINDS, B, F, Pipeline, W, staged, work
from tracegraph.analysis.pipeline.labels import labelled
from tracegraph.analysis.pipeline.replicas import components, layout

_PHASES = {"fwd": F, "forward": F, "bwd": B, "backward": B, "wgt": W, "weight": W}
_SEP = r"[\s,;_:#=-]*"
_MB_KEY = r"(?:micro_?batch(?:_?id)?|mb_?id|mb)"
_CHUNK_KEY = r"(?:model_?chunk(?:_?id)?|chunk(?:_?id)?|vpp(?:_?rank)?|vpp?_?stage|virtual_?chunk)"
RANGE = re.compile(
    rf"^(?P<phase>fwd|bwd|wgt|forward|backward|weight)(?:_step)?"
    rf"(?P<fields>(?:{_SEP}\d+)?(?:{_SEP}(?:{_MB_KEY}|{_CHUNK_KEY}){_SEP}\d+)*)\s*$",
    re.IGNORECASE)
"""A phase range's name: its phase and its keyed numbers (`fields`, read by `numbers`)."""
_MICROBATCH = rf"^{_SEP}(?P<bare>\d+)|{_MB_KEY}{_SEP}(?P<keyed>\d+)"
_CHUNK = rf"{_CHUNK_KEY}{_SEP}(?P<chunk>\d+)"


def from_annotations(analysis) -> Pipeline | None:
    """Blocks from the phase ranges of the trace; None when it has none (or only ranges
    without numbers in a job without a pipeline). The ranges are read rank by rank where the
    ranks lie (`Analysis.by_part`)."""
    found = analysis.by_part(_annotated)
    kept = [blocks for blocks, _ in found if len(blocks)]
    if not kept:
        return None
    blocks = pd.concat(kept, ignore_index=True)
    depth = _flow_depth(np.concatenate([edges for _, edges in found]))
    ranks = sorted(int(r) for r in blocks["rank"].unique())
    if not any(len(members) > 1 for members in components(analysis.trace, ranks)):
        return None  # microbatches, but no stages: gradient accumulation, not a pipeline
    if blocks["mb"].notna().all():
        blocks = blocks.assign(microbatch=blocks["mb"].astype("int64"),
                               chunk=blocks["chunk"].fillna(0).astype("int64"))
        return staged(analysis, blocks, "annotations", depth)
    return _numbered(analysis, blocks[blocks["phase"].isin([F, B])], depth)


def _annotated(analysis) -> tuple[pd.DataFrame, np.ndarray]:
    """The blocks of the ranges of the analysis' ranks (`_extents`, with their main-lane compute
    in `work`) and the edges of their forward data flow (`_flow_edges`)."""
    ranges = _ranges(analysis)
    edges = _flow_edges(analysis.trace.events)
    if ranges.empty:
        return pd.DataFrame(), edges
    blocks = _extents(analysis, ranges)
    return blocks.assign(work=work(analysis, blocks)), edges


def _ranges(analysis) -> pd.DataFrame:
    """The phase ranges: device ones where a rank has them, else its host ones."""
    events = analysis.trace.events
    markers = events.loc[(events["kind"] == schema.MARKER).to_numpy(),
                         ["rank", "name", "lane_kind", "start_ns", "dur_ns", "step"]]
    parsed = markers["name"].str.extract(RANGE)
    found = parsed["phase"].notna().to_numpy()
    mb, chunk = numbers(parsed.loc[found, "fields"])
    ranges = markers[found].assign(phase=parsed.loc[found, "phase"].str.lower().map(_PHASES),
                                   mb=mb, chunk=chunk)
    device = ranges["lane_kind"] == schema.STREAM
    on_device = set(ranges.loc[device, "rank"])
    return ranges[device | ~ranges["rank"].isin(on_device)]


def numbers(fields: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Microbatch and model chunk (NaN where not given) of phase ranges' `fields` (RANGE)."""
    mb = fields.str.extract(_MICROBATCH, flags=re.IGNORECASE)
    chunk = fields.str.extract(_CHUNK, flags=re.IGNORECASE)["chunk"]
    return (pd.to_numeric(mb["bare"].fillna(mb["keyed"])), pd.to_numeric(chunk))


def _extents(analysis, ranges: pd.DataFrame) -> pd.DataFrame:
    """step, rank, phase, mb, chunk, start, end (aligned ns) of each range's work."""
    shift = ranges["rank"].map(analysis.offsets).fillna(0).astype("int64")
    start = (ranges["start_ns"] - shift).to_numpy().copy()
    end = (ranges["start_ns"] + ranges["dur_ns"] - shift).to_numpy().copy()
    host = (ranges["lane_kind"] != schema.STREAM).to_numpy()
    for rank, rows in pd.Series(np.arange(len(ranges))[host]).groupby(
            ranges["rank"].to_numpy()[host]):
        start[rows], end[rows] = _launched(analysis, int(rank), start[rows], end[rows])
    return pd.DataFrame({"step": ranges["step"].to_numpy(), "rank": ranges["rank"].to_numpy(),
                         "phase": ranges["phase"].to_numpy(), "mb": ranges["mb"].to_numpy(),
                         "chunk": ranges["chunk"].to_numpy(), "start": start, "end": end})


def _launched(analysis, rank: int, lo: np.ndarray, hi: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """The span of the main-lane work launched within each host range [lo, hi); the range
    itself where the main lane is not a device stream (nothing is launched)."""
    frame = analysis.ops.frame
    lane = analysis.ops.main_lanes().get(rank, -1)
    mine = np.flatnonzero((frame["lane_id"].to_numpy() == lane)
                          & frame["kind"].isin(WORK_KINDS).to_numpy())
    launch = analysis.graph.launch[mine]
    mine, launch = mine[launch >= 0], launch[launch >= 0]
    if not len(mine):
        return lo, hi
    order = np.argsort(launch, kind="stable")
    mine, launch = mine[order], launch[order]
    first, stop = np.searchsorted(launch, lo, "left"), np.searchsorted(launch, hi, "right")
    some = stop > first  # a stream runs its ops in launch order: the first starts first
    start = analysis.start[mine[np.minimum(first, len(mine) - 1)]]
    end = analysis.end[mine[np.maximum(stop - 1, 0)]]
    return np.where(some, start, lo), np.where(some, end, hi)


def _numbered(analysis, blocks: pd.DataFrame, depth: dict[int, int]) -> Pipeline | None:
    """Ranges without numbers, numbered by their order per replica (`labels`); None when no
    ranks form a pipeline (the forward and backward of a data-parallel job)."""
    replicas = layout(analysis.trace, sorted(int(r) for r in blocks["rank"].unique()), depth)
    return labelled(analysis, blocks, replicas, "annotations") if replicas else None


def _flow_edges(events: pd.DataFrame) -> np.ndarray:
    """(upstream rank, downstream rank) of every annotated P2P op: a receive inside a forward
    block (or a send inside a backward one) comes from upstream."""
    p2p = events[(events["kind"] == schema.P2P) & (events["peer"] >= 0)
                 & events["comm"].isin(["send", "recv"])]
    phase = p2p["annotation"].str.extract(RANGE)["phase"].str.lower().map(_PHASES)
    from_peer = (p2p["comm"] == "recv") == (phase == F)
    known = phase.isin([F, B]).to_numpy()
    rank, peer = p2p["rank"].to_numpy(), p2p["peer"].to_numpy()
    return np.column_stack([np.where(from_peer, peer, rank)[known],
                            np.where(from_peer, rank, peer)[known]]).astype(np.int64)


def _flow_depth(edges: np.ndarray) -> dict[int, int]:
    """rank -> depth in the forward data flow of annotated P2P ops (`_flow_edges`); ranks on a
    cycle (interleaved stages wrap around) share a depth and fall back to rank order."""
    flow = nx.DiGraph()
    flow.add_edges_from(map(tuple, edges.tolist()))
    if not flow.number_of_nodes():
        return {}
    dag = nx.condensation(flow)
    return {int(r): depth for depth, nodes in enumerate(nx.topological_generations(dag))
            for node in nodes for r in dag.nodes[node]["members"]}
