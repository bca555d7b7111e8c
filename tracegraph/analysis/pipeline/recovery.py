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
from tracegraph.analysis.pipeline.blocks import work as busy_work
from tracegraph.analysis.pipeline.boundaries import lane_work, names
from tracegraph.analysis.pipeline.labels import autograd_links, labelled
from tracegraph.analysis.pipeline.replicas import Replica, layout

SOURCE = "op order"


def from_op_order(analysis) -> Pipeline | None:
    """The pipeline from P2P boundaries and op order; None without P2P ops between pipeline
    stages (`replicas.pipeline_links`). The main lanes' work
    is read rank by rank where the ranks lie (`Analysis.by_part`), twice: for the names' phase
    scores, which every rank teaches, then for the blocks they cut."""
    if not any(analysis.by_part(_has_p2p)):
        return None
    replicas = layout(analysis.trace, analysis.trace.rank_ids)
    if not replicas:  # P2P ops, but none between pipeline stages (a context-parallel ring)
        return None
    earlier = _earlier(replicas)
    scores = phases.name_scores(analysis.by_part(_name_counts, earlier))
    found = analysis.by_part(_scored_blocks, earlier, scores)
    if not any(worked for _, _, worked in found):
        return unsure(SOURCE, "no compute on the main lanes between P2P ops")
    blocks, link = _joined([(b, k) for b, k, _ in found])
    return labelled(analysis, blocks, replicas, SOURCE, link)


def _has_p2p(analysis) -> bool:
    frame = analysis.ops.frame
    return bool(((frame["kind"] == schema.P2P) & (frame["peer"] >= 0)).any())


def _main_lane_work(analysis, earlier: list[tuple[int, int]]
                    ) -> tuple[pd.DataFrame, pd.Index]:
    """`lane_work` of the analysis' ranks, and their op names by id."""
    name_ids, names_by_id = names(analysis)
    return lane_work(analysis, _upstream(analysis, earlier), name_ids), names_by_id


def _name_counts(analysis, earlier: list[tuple[int, int]]) -> tuple[pd.DataFrame, pd.Series]:
    return phases.name_counts(*_main_lane_work(analysis, earlier))


def _scored_blocks(analysis, earlier: list[tuple[int, int]], scores: pd.Series
                   ) -> tuple[pd.DataFrame, pd.Series | None, bool]:
    """The forward and backward blocks of the analysis' ranks (their main-lane compute in
    `work`, without their ops), the autograd links between them, and whether the ranks had
    main-lane work between P2P ops at all."""
    work, names_by_id = _main_lane_work(analysis, earlier)
    if work.empty:
        return pd.DataFrame(), None, False
    blocks = _blocks(work, phases.scores_by_id(scores, names_by_id))
    link = autograd_links(blocks, analysis.ops.frame["autograd_seq"].to_numpy())
    busy = busy_work(analysis, blocks)
    return blocks.drop(columns="ops").assign(work=busy), link, True


def _joined(found: list[tuple[pd.DataFrame, pd.Series | None]]
            ) -> tuple[pd.DataFrame, pd.Series | None]:
    """The parts' blocks as one table and their links renumbered to match (None: the trace
    records no autograd sequence numbers)."""
    kept = [(b, k) for b, k in found if len(b)]
    if not kept:
        return pd.DataFrame(columns=["rank", *phases.BLOCKS, "work"]), None
    first = np.cumsum([0] + [len(b) for b, _ in kept])
    links = [pd.Series(k.to_numpy() + at, index=k.index + at, dtype="int64")
             for (_, k), at in zip(kept, first, strict=False) if k is not None]
    return (pd.concat([b for b, _ in kept], ignore_index=True),
            pd.concat(links) if links else None)


def _blocks(work: pd.DataFrame, scores: pd.Series) -> pd.DataFrame:
    """rank, step, phase, start, end, ops of every rank's forward and backward blocks
    (`scores`: of each name id)."""
    work = work.assign(score=work["name_id"].map(scores))
    parts = [phases.blocks(ops).assign(rank=rank)
             for (rank, _), ops in work.groupby(["rank", "step"], sort=False)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["rank", *phases.BLOCKS])


def _earlier(replicas: list[Replica]) -> list[tuple[int, int]]:
    """(rank, peer) of every peer upstream (an earlier stage) of a rank. Stages follow rank
    order within a replica; on a ring (interleaved stages) the upstream peer is the previous
    rank, wrapping from the first to the last."""
    earlier = set()
    for replica in replicas:
        stages = replica.stages
        for i, r in enumerate(stages):
            earlier |= {(r, stages[i - 1])} if replica.ring else {(r, q) for q in stages[:i]}
    return sorted(earlier)


def _upstream(analysis, earlier: list[tuple[int, int]]) -> np.ndarray:
    """Per op: its P2P peer is upstream of its rank (`_earlier`)."""
    frame = analysis.ops.frame
    pairs = pd.MultiIndex.from_arrays([frame["rank"], frame["peer"]])
    return pairs.isin(earlier) if earlier else np.zeros(len(frame), dtype=bool)
