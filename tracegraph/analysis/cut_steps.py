"""Steps the profile's end cut short: the profiler stopped inside a rank's last step, whose
marker then spans a sliver of it. Such a step is no step time; it is left out of the steps (its
events stay in the trace) and said in a warning."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.depgraph import DepGraph

SHORT = 0.5  # a last step under this share of the rank's other steps' median is suspect ...
NEAR_END = 0.1  # ... and, on a host-only rank, cut when it ends this close to its last op


def without_cut_steps(steps: pd.DataFrame, graph: DepGraph) -> pd.DataFrame:
    """`steps` (rank, step, start, end on the aligned clock) less each rank's last step where
    the profile cut it: much shorter than the rank's other steps, and no device work of the
    rank starts after it does (a rank without device work: it ends at the rank's last op)."""
    cut = np.zeros(len(steps), dtype=bool)
    length = (steps["end"] - steps["start"]).to_numpy()
    working = np.isin(graph.kind, schema.DEVICE_WORK)
    for rank, rows in steps.groupby("rank").indices.items():
        if len(rows) < 2:
            continue
        order = rows[np.argsort(steps["start"].to_numpy()[rows], kind="stable")]
        last = order[-1]
        usual = float(np.median(length[order[:-1]]))
        if length[last] >= SHORT * usual:
            continue
        mine = graph.rank == rank
        start, end = int(steps["start"].iat[last]), int(steps["end"].iat[last])
        device = mine & working
        if device.any():  # the device ran nothing of it
            cut[last] = not (device & (graph.start >= start)).any()
        else:  # a host-only rank: it ends at the rank's last op
            cut[last] = int(graph.end[mine].max(initial=end)) - end <= NEAR_END * usual
    return steps[~cut].reset_index(drop=True)


def cut_warnings(windows: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """One warning per step of `windows` that `steps` no longer holds (`without_cut_steps`)."""
    kept = pd.MultiIndex.from_frame(steps[["rank", "step"]].astype("int64"))
    gone = windows[~pd.MultiIndex.from_frame(windows[["rank", "step"]].astype("int64")).isin(kept)]
    usual = (steps["end"] - steps["start"]).groupby(steps["rank"]).median()
    return [f"rank {rank}: ProfilerStep#{step} ({(end - start) / 1e6:.3g} ms, against "
            f"{usual[rank] / 1e6:.3g} ms for the rank's other steps) was cut short by the "
            "profile's end: left out of the step times"
            for rank, step, start, end in gone[["rank", "step", "start", "end"]].itertuples(
                index=False)]
