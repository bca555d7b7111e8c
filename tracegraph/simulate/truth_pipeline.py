"""The pipeline schedule a simulated bundle really ran, from its ground truth: what tests hold
the recovered pipeline to.

Real users never have this: the analysis and the report recover the pipeline from the trace
itself (`tracegraph.analysis.pipeline`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tracegraph.analysis.pipeline import B, F, Pipeline, W, staged
from tracegraph.simulate import Scenario, simulate
from tracegraph.simulate.bundle_writer import clock_shift


def timeline_from_truth(path: Path):
    """The simulated Timeline that a `*.ground_truth.json` describes, regenerated from its
    scenario and parameters; None when the run does not reproduce the recorded steps."""
    truth = json.loads(Path(path).read_text())
    params = dict(truth.get("params", {}))
    fields = {f.name for f in dataclasses.fields(Scenario)} - {"name"}
    timeline = simulate(truth["scenario"], seed=int(params.get("seed", 0)),
                        **{k: _tuples(v) for k, v in params.items() if k in fields})
    steps = sorted((s.rank, s.step, s.start_ns, s.end_ns) for s in timeline.steps)
    recorded = sorted((s["rank"], s["step"], s["start_ns"], s["end_ns"])
                      for s in truth.get("steps", []))
    return timeline if steps == recorded else None


def _tuples(value: object) -> object:
    """JSON lists back to the tuples a Scenario holds."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def from_timeline(analysis, timeline) -> Pipeline | None:
    """Blocks from a simulated Timeline's schedule facts, on the analysis's aligned clock; its
    global virtual stages become each stage's model chunks (0..v-1), as recovery numbers them."""
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
    model_chunk = blocks.groupby("rank")["chunk"].rank(method="dense").astype("int64") - 1
    return staged(analysis, blocks.assign(chunk=model_chunk), "ground truth",
                  {int(r): int(c) for r, c in first_chunk.items()})
