"""The pipeline schedule recovered from a trace: stage × time with F/B/W blocks per microbatch
and model chunk, and the bubble ratio measured against the theory of the schedule found.

Sources, best first (a simulation's ground truth, `simulate/truth_pipeline.py`, serves tests
only: the report draws what the trace says):
- `annotations`: the framework's ranges around each forward and backward;
- `recovery`: P2P boundaries, op names and op order, for 1F1B and interleaved (VPP) 1F1B.
Where the trace has a pipeline that neither recovers with confidence, the Pipeline has no blocks
and says why: nothing is drawn rather than a wrong picture.
"""

from __future__ import annotations

from tracegraph.analysis.pipeline.annotations import from_annotations
from tracegraph.analysis.pipeline.blocks import (
    BLOCK_COLUMNS,
    FB,
    B,
    BubbleRatio,
    F,
    Pipeline,
    W,
    busy_within,
    staged,
)
from tracegraph.analysis.pipeline.recovery import from_op_order
from tracegraph.analysis.pipeline.replicas import rank_stages

__all__ = ["BLOCK_COLUMNS", "FB", "B", "BubbleRatio", "F", "Pipeline", "W", "busy_within",
           "from_annotations", "from_op_order", "rank_stages", "recover", "staged"]


def recover(analysis) -> Pipeline | None:
    """The pipeline of `analysis` from its annotations, else from its op order; None when the
    trace shows no pipeline at all."""
    return from_annotations(analysis) or from_op_order(analysis)
