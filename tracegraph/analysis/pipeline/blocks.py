"""The recovered pipeline: F/B/W blocks per stage, microbatch and chunk, and its bubble ratio.

A pipeline replica is a set of ranks linked by P2P ops (or a `pp` group). The measured bubble
ratio of a step is the stages' mean idle time inside the replica's span (first block start to
last block end) over their mean work (main-lane compute inside blocks); for GPipe and
(interleaved) 1F1B the theory is (p − 1)/(v·m) for p stages, v chunks per stage and m
microbatches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.pipeline.replicas import replicas, stages_of
from tracegraph.graph.ops import comm_calls

F, B, W, FB = "F", "B", "W", "F+B"
BLOCK_COLUMNS = ["step", "rank", "replica", "stage", "chunk", "microbatch", "phase", "start",
                 "end", "work"]
WORK_KINDS = (schema.COMPUTE, schema.HOST, schema.MEMCPY)


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
    """Recovered F/B/W blocks (aligned ns) and where they came from; no blocks and a `reason`
    when the trace has a pipeline that could not be recovered with confidence."""

    blocks: pd.DataFrame  # BLOCK_COLUMNS; `chunk` is the model chunk of the stage (0..v-1)
    source: str  # "ground truth" | "annotations" | "op order"
    reason: str = ""  # why nothing is drawn (empty blocks), or what the labels assume

    @property
    def steps(self) -> list[int]:
        return sorted(int(s) for s in self.blocks["step"].unique())

    def bubble_ratio(self, step: int) -> BubbleRatio | None:
        """The step's measured bubble ratio beside (p − 1)/(v·m); None without blocks."""
        blocks = self.blocks[self.blocks["step"] == step]
        if blocks.empty:
            return None
        p = int(blocks["stage"].max()) + 1  # a stage absent from the bundle counts too
        v = int(blocks.groupby("rank")["chunk"].nunique().max())
        forward = blocks[blocks["phase"].isin([F, FB])]
        m = int(forward.groupby(["rank", "chunk"])["microbatch"].nunique().max()) if len(
            forward) else 0
        measured = float(np.mean([_measured(g) for _, g in blocks.groupby("replica")]))
        return BubbleRatio(p, v, m, measured, (p - 1) / (v * m) if m else float("nan"))


    def as_dict(self, step: int | None = None) -> dict[str, object]:
        """Where it came from, why it is not drawn (if so), and each step's bubble ratio."""
        steps = [s for s in self.steps if step is None or s == step]
        return {"source": self.source, "reason": self.reason, "steps": [
            {"step": s, **{k: round(v, 4) if isinstance(v, float) else v
                           for k, v in asdict(self.bubble_ratio(s)).items()}} for s in steps]}


def unsure(source: str, reason: str) -> Pipeline:
    """A pipeline that is there but not drawn, and why."""
    return Pipeline(pd.DataFrame(columns=BLOCK_COLUMNS), source, reason)


def staged(analysis, blocks: pd.DataFrame, source: str, order: dict[int, float],
           reason: str = "") -> Pipeline:
    """Add replica and stage (the rank's position within its replica by `order`, then rank; the
    replica's ranks absent from the bundle keep their places) and each block's work."""
    ranks = sorted(int(r) for r in blocks["rank"].unique())
    found = replicas(analysis.trace, ranks)
    stage = stages_of(analysis.trace, ranks, order)
    blocks = blocks.assign(replica=blocks["rank"].map(found), stage=blocks["rank"].map(stage))
    if "work" not in blocks:
        blocks = blocks.assign(work=work(analysis, blocks))
    blocks = blocks.astype({"step": "int64", "rank": "int64", "chunk": "int64",
                            "microbatch": "int64", "start": "int64", "end": "int64",
                            "work": "int64"})
    return Pipeline(blocks[BLOCK_COLUMNS].sort_values(["step", "replica", "stage", "start"],
                                                       ignore_index=True), source, reason)


def work(analysis, blocks: pd.DataFrame) -> np.ndarray:
    """Main-lane compute time (aligned ns) inside each block (blocking communication calls on
    a host lane are no work)."""
    ops, start, end = analysis.ops, analysis.start, analysis.end
    lane_ids = ops.frame["lane_id"].to_numpy()
    working = ops.frame["kind"].isin(WORK_KINDS).to_numpy() & ~comm_calls(ops.frame)
    out = np.zeros(len(blocks), dtype=np.int64)
    for rank, lane_id in ops.main_lanes().items():
        rows = np.flatnonzero(blocks["rank"].to_numpy() == rank)
        idx = np.flatnonzero((lane_ids == lane_id) & working)
        if len(rows) and len(idx):
            out[rows] = busy_within(start[idx], end[idx], blocks["start"].to_numpy()[rows],
                                    blocks["end"].to_numpy()[rows])
    return out


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
    done = blocks.groupby("rank")["work"].sum()
    return float((span - done.mean()) / done.mean()) if done.mean() > 0 else float("nan")
