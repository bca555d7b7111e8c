"""Replay: the timing model re-timed, and each rank's steps read off the replayed ops.

A step of a rank holds the ops of the rank that started in it (Kineto's host-side stream waits
aside). Replayed, it starts where its first op's shift moves it and ends at its last op's
replayed end plus the measured tail after it (a step marker running past the last op), so a
replay of the unmodified model gives back every measured step time, up to what the measurement
contradicts (`TimingModel.contradiction`). That error, per rank and step, is what a prediction
is judged by: above MAX_ERROR no prediction is made for the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph.whatif import engine
from tracegraph.whatif.model import TimingModel
from tracegraph.whatif.steps import StepOps

MAX_ERROR = 0.02  # replay error of a rank's step above which the step is not predicted
NS_PER_MS = 1e6


@dataclass
class Replay:
    """Replayed op times and step spans."""

    model: TimingModel
    timing: engine.Timing
    steps: pd.DataFrame  # rank, step, start, end (replayed ns), ms

    @property
    def start(self) -> np.ndarray:
        return self.timing.times[0:2 * self.model.ops:2]

    @property
    def end(self) -> np.ndarray:
        return self.timing.times[1:2 * self.model.ops:2]


def replay(model: TimingModel, steps: StepOps) -> Replay:
    """Re-time the model and read each rank's steps off it."""
    timing = engine.run(model)
    return Replay(model=model, timing=timing, steps=replayed_steps(model, timing, steps))


def replayed_steps(model: TimingModel, timing: engine.Timing, steps: StepOps) -> pd.DataFrame:
    """Each step of each rank on the replayed clock: shifted with its first op, ending at its
    ops' latest replayed end plus the measured tail (rank, step, start, end, ms)."""
    table = steps.table
    times = timing.times
    start, end = table["start"].to_numpy().copy(), table["end"].to_numpy().copy()
    has = steps.first >= 0
    first = steps.first[has]
    start[has] += times[2 * first] - model.measured[2 * first]
    member = np.flatnonzero(steps.row >= 0)
    latest = np.full(len(table), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(latest, steps.row[member], times[2 * member + 1])
    end[has] = latest[has] + (end[has] - steps.last_end[has])
    out = table[["rank", "step"]].assign(start=start, end=end)
    return out.assign(ms=(out["end"] - out["start"]) / NS_PER_MS)


def replay_error(measured: pd.DataFrame, replayed: pd.DataFrame) -> pd.DataFrame:
    """rank, step, measured_ms, replayed_ms, error (relative, of the measured step time)."""
    error = (replayed["ms"] - measured["ms"]).abs() / measured["ms"].where(measured["ms"] > 0)
    return pd.DataFrame({"rank": measured["rank"], "step": measured["step"],
                         "measured_ms": measured["ms"], "replayed_ms": replayed["ms"],
                         "error": error.fillna(0.0)})
