"""The pipeline recovered from a trace without annotations, from its P2P structure and op order.

Per rank, the main lane's work is cut at its P2P boundaries (`boundaries`), told forward from
backward by op names the trace itself teaches (`phases`), and the blocks of each replica are
numbered by their order and checked across stages (`labels`). A replica whose blocks do not
fit is not drawn, and the pipeline says why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.pipeline import phases
from tracegraph.analysis.pipeline.blocks import Pipeline, unsure
from tracegraph.analysis.pipeline.boundaries import lane_work, names
from tracegraph.analysis.pipeline.labels import autograd_links, labelled
from tracegraph.analysis.pipeline.replicas import Replica, layout

SOURCE = "op order"


def from_op_order(analysis) -> Pipeline | None:
    """The pipeline from P2P boundaries and op order; None without P2P ops."""
    frame = analysis.ops.frame
    if not ((frame["kind"] == schema.P2P) & (frame["peer"] >= 0)).any():
        return None
    replicas = layout(analysis.trace, analysis.trace.rank_ids)
    name_ids, labels = names(analysis)
    work = lane_work(analysis, _upstream(analysis, replicas), name_ids)
    if work.empty:
        return unsure(SOURCE, "no compute on the main lanes between P2P ops")
    blocks = _blocks(work, labels)
    link = autograd_links(blocks, analysis.ops.frame["autograd_seq"].to_numpy())
    return labelled(analysis, blocks, replicas, SOURCE, link)


def _blocks(work: pd.DataFrame, names: pd.Index) -> pd.DataFrame:
    """rank, step, phase, start, end, ops of every rank's forward and backward blocks."""
    work = work.assign(score=work["name_id"].map(phases.name_scores(work, names)))
    parts = [phases.blocks(ops).assign(rank=rank)
             for (rank, _), ops in work.groupby(["rank", "step"], sort=False)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["rank", *phases.BLOCKS])


def _upstream(analysis, replicas: list[Replica]) -> np.ndarray:
    """Per op: its P2P peer is upstream (an earlier stage) of its rank. Stages follow rank
    order within a replica; on a ring (interleaved stages) the upstream peer is the previous
    rank, wrapping from the first to the last."""
    frame = analysis.ops.frame
    earlier = set()
    for replica in replicas:
        stages = replica.stages
        for i, r in enumerate(stages):
            earlier |= {(r, stages[i - 1])} if replica.ring else {(r, q) for q in stages[:i]}
    pairs = pd.MultiIndex.from_arrays([frame["rank"], frame["peer"]])
    return pairs.isin(list(earlier)) if earlier else np.zeros(len(frame), dtype=bool)
