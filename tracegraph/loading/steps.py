"""Training steps as the profilers mark them: `ProfilerStep#N` annotations."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema

NO_STEPS = ("no step markers (ProfilerStep#N) in the bundle: each rank's whole span is analysed "
            "as one stretch (step -1); per-step times, stragglers and pipeline steps need them")
STEP_NAME = r"^ProfilerStep#(\d{1,9})$"  # a longer number is no step (its events' step column
# says NO_INT, and the parser's warning says why)


def is_step_marker(events: pd.DataFrame) -> pd.Series:
    """Mask of the `ProfilerStep#N` markers among `events` (the name is matched on markers
    only: a regex over every event's name costs seconds on millions of events)."""
    marker = (events["kind"] == schema.MARKER).to_numpy(dtype=bool, na_value=False)
    mask = np.zeros(len(events), dtype=bool)
    names = events["name"][marker]  # never every name as a Python object
    mask[marker] = names.str.match(STEP_NAME).to_numpy(dtype=bool, na_value=False)
    return pd.Series(mask, index=events.index)


def step_markers(events: pd.DataFrame) -> pd.DataFrame:
    """rank, step (N), start_ns, dur_ns of the `ProfilerStep#N` marker of each rank and step:
    the host's (where the step's work is issued), else a device-side copy (Kineto also writes
    a GPU-side `ProfilerStep#N` spanning only the kernels of the step that ran in it)."""
    columns = ["rank", "name", "start_ns", "dur_ns", "lane_kind"]
    markers = events.loc[is_step_marker(events).to_numpy(), columns]
    steps = pd.DataFrame({
        "rank": markers["rank"].astype("int64"),
        "step": markers["name"].str.extract(STEP_NAME, expand=False).astype("int64"),
        "start_ns": markers["start_ns"].astype("int64"),
        "dur_ns": markers["dur_ns"].astype("int64"),
        "host": (markers["lane_kind"] == schema.THREAD).to_numpy(dtype=bool, na_value=False),
    })
    steps = steps.sort_values(["rank", "step", "host"], kind="stable")
    return steps.drop_duplicates(["rank", "step"], keep="last").drop(columns="host")


def unstepped(steps: pd.DataFrame, ops: int) -> list[str]:
    """NO_STEPS for a bundle with `ops` ops but no step window (`steps`), else nothing."""
    return [NO_STEPS] if ops and not len(steps) else []
