"""Findings: what an engineer looks for in the same profiles besides the bubbles, each with its
evidence (ranks, streams, times, numbers), a one-line suggestion, and a check rule that bounds it.

- `exposed`: communication of each group kind (EP all-to-all, DP/HSDP reduction, PP P2P) not
  hidden behind compute, per rank and stage; each stage reduction's overlap with later compute;
- `serialized`: a rank's compute and communication streams that never run concurrently although
  both have work queued (one hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=1);
- `stage_memory`: peak memory per rank and pipeline stage against the 1F1B expectation.
"""

from __future__ import annotations

from tracegraph.analysis.findings import exposed, serialized, stage_memory
from tracegraph.analysis.findings.finding import Finding
from tracegraph.analysis.pipeline import rank_stages


def find_all(analysis, pipeline=None) -> list[Finding]:
    """Every finding the analysis supports (those its data cannot support are left out)."""
    stages = stage_of(analysis, pipeline)
    found = [exposed.finding(analysis, stages), serialized.finding(analysis),
             stage_memory.finding(analysis, stages, pipeline)]
    return [f for f in found if f is not None]


def stage_of(analysis, pipeline=None) -> dict[int, int]:
    """Rank -> pipeline stage: the recovered pipeline's, else by rank order within each set of
    ranks P2P ops or `pp` groups link (every rank stage 0 without a pipeline)."""
    if pipeline is not None and len(pipeline.blocks):
        return {int(r): int(s) for r, s in pipeline.blocks.drop_duplicates("rank")[
            ["rank", "stage"]].itertuples(index=False)}
    return rank_stages(analysis.trace)
