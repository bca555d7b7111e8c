"""A prediction: the edited model replayed next to the unmodified one, and what it changes.

The step time of a step is its slowest rank's, as everywhere in tracegraph; the job's is the
median over steps. The gain of a step is its measured time minus its predicted one, and its range
is the best and worst step. A step whose unmodified replay misses any rank's measured step time
by more than MAX_ERROR is refused (the graph contradicts the measurement there), with the reason.
Each measured bubble is followed into the prediction (a wait's predicted length, a gap's), and
the predicted critical path is the chain of binding predecessors back from the end of each
step's slowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.analysis.walk import MIN_PIECE_NS
from tracegraph.whatif.edits import Edit
from tracegraph.whatif.model import TimingModel
from tracegraph.whatif.replay import MAX_ERROR, NS_PER_MS, Replay, replay, replay_error
from tracegraph.whatif.subject import Subject

VANISH_SHARE = 0.10  # a bubble predicted under this share of its length (or the threshold) is gone
CHANGE_SHARE = 0.10  # ... shrank / grew by more than this share
COMPUTE, TRANSFER, WAIT, DELAY = "compute", "transfer", "wait", "delay"


@dataclass
class Segment:
    """A stretch of a predicted critical path: the op holding the step then, and how."""

    op: int
    rank: int
    lane: str
    name: str
    kind: str  # compute, transfer, wait (released by another op), delay (launch gap, idle)
    category: str  # the communication's root-cause category, "" for other ops
    start: int
    end: int


@dataclass
class Prediction:
    """What the edits would change, step by step."""

    subject: Subject
    edits: list[Edit]
    changes: list[str]
    base: Replay
    after: Replay
    errors: pd.DataFrame  # rank, step, measured_ms, replayed_ms, error
    threshold_ns: int
    refused: dict[int, str] = field(default_factory=dict)  # step -> why it is not predicted

    @property
    def analysis(self) -> Analysis:
        return self.subject.analysis

    @property
    def predicted(self) -> list[int]:
        """The steps with a prediction."""
        return [int(s) for s in sorted(self.errors["step"].unique()) if s not in self.refused]

    def ranks(self) -> pd.DataFrame:
        """rank, step, measured_ms, predicted_ms of every predicted step."""
        table = self.subject.steps.table[["rank", "step", "ms"]].rename(
            columns={"ms": "measured_ms"}).assign(predicted_ms=self.after.steps["ms"])
        return table[table["step"].isin(self.predicted)].reset_index(drop=True)

    def steps(self) -> pd.DataFrame:
        """Per predicted step: measured, replayed and predicted step time (slowest rank),
        the predicted slowest rank, the gain (ms and % of the measured step)."""
        measured = self.subject.steps.table.groupby("step")["ms"].max()
        replayed = self.base.steps.groupby("step")["ms"].max()
        after = self.after.steps
        slowest = after.loc[after.groupby("step")["ms"].idxmax(), ["step", "rank", "ms"]]
        table = slowest.set_index("step").rename(columns={"rank": "slowest_rank",
                                                          "ms": "predicted_ms"})
        table = table.assign(measured_ms=measured, replayed_ms=replayed)
        table = table.loc[[s for s in table.index if s in self.predicted]]
        table["gain_ms"] = table["measured_ms"] - table["predicted_ms"]
        table["gain_pct"] = 100 * table["gain_ms"] / table["measured_ms"]
        return table.reset_index()[["step", "measured_ms", "replayed_ms", "predicted_ms",
                                    "slowest_rank", "gain_ms", "gain_pct"]]

    def step_time(self) -> dict[str, float]:
        """The job's step time measured and predicted (medians over the predicted steps), the
        gain, and its best and worst step."""
        steps = self.steps()
        if not len(steps):
            return {}
        measured, predicted = steps["measured_ms"].median(), steps["predicted_ms"].median()
        return {"measured_ms": float(measured), "predicted_ms": float(predicted),
                "gain_ms": float(measured - predicted),
                "gain_pct": float(100 * (measured - predicted) / measured) if measured else 0.0,
                "best_gain_ms": float(steps["gain_ms"].max()),
                "worst_gain_ms": float(steps["gain_ms"].min())}

    def bubbles(self) -> pd.DataFrame:
        """Every measured bubble of a predicted step: rank, lane, step, name, start (measured
        ns), measured and predicted ms, and its state: vanished, shrank, grew or remains."""
        predicted = set(self.predicted)
        rows = [self._bubble(b) for b in self.analysis.bubbles if b.step in predicted]
        columns = ["rank", "lane", "step", "name", "start", "measured_ms", "predicted_ms",
                   "state", "category", "op"]
        return pd.DataFrame(rows, columns=columns)

    def critical_path(self, step: int) -> list[Segment]:
        """The predicted critical path of a step: from the end of its slowest rank back along
        the predecessors that bound each node, to the step's start."""
        steps, after = self.subject.steps, self.after.steps
        rows = np.flatnonzero(after["step"].to_numpy() == step)
        if not len(rows):
            return []
        row = int(rows[np.argmax(after["ms"].to_numpy()[rows])])
        ops = np.flatnonzero(steps.row == row)
        if not len(ops):
            return []
        lo = int(after["start"].iloc[row])
        last = int(ops[np.argmax(self.after.end[ops])])
        return _backtrack(self.after, self.subject, 2 * last + 1, lo)

    def _bubble(self, bubble: Bubble) -> dict[str, object]:
        graph, op = self.subject.graph, bubble.op
        measured = self.subject.model.measured
        times = self.after.timing.times
        if bubble.name == "idle":
            prev = graph.prev[op]
            full = (measured[2 * op] - measured[2 * prev + 1]) if prev >= 0 else 0
            now = (times[2 * op] - times[2 * prev + 1]) if prev >= 0 else 0
        else:
            full = measured[2 * op + 1] - measured[2 * op]
            now = times[2 * op + 1] - times[2 * op]
        predicted = float(np.clip(bubble.dur - (full - now), 0, max(now, 0)))
        state = _state(bubble.dur, predicted, self.threshold_ns)
        return {"rank": bubble.rank, "lane": bubble.lane, "step": bubble.step,
                "name": bubble.name, "start": bubble.start, "measured_ms": bubble.dur / NS_PER_MS,
                "predicted_ms": predicted / NS_PER_MS, "state": state,
                "category": bubble.category, "op": op}


def predict(subject: Subject | Analysis, edits: list[Edit], *, threshold_ms: float = 1.0
            ) -> Prediction:
    """Apply the edits in order and replay; steps whose unmodified replay misses a rank's
    measured step time by more than MAX_ERROR are refused."""
    subject = subject if isinstance(subject, Subject) else Subject(subject)
    model: TimingModel = subject.model
    changes = []
    for edit in edits:
        model, line = edit.apply(subject, model)
        changes.append(line)
    base = subject.baseline
    errors = replay_error(subject.steps.table, base.steps)
    after = replay(model, subject.steps)
    return Prediction(subject=subject, edits=list(edits), changes=changes, base=base,
                      after=after, errors=errors, threshold_ns=int(threshold_ms * NS_PER_MS),
                      refused=refusals(subject.model, errors))


def refusals(model: TimingModel, errors: pd.DataFrame) -> dict[int, str]:
    """step -> why it is not predicted: its replay misses a rank's step by more than
    MAX_ERROR."""
    out = {}
    bad = errors[errors["error"] > MAX_ERROR]
    ahead = model.contradiction.sum() / NS_PER_MS
    for step, rows in bad.groupby("step"):
        worst = rows.loc[rows["error"].idxmax()]
        out[int(step)] = (f"the replay of rank {int(worst['rank'])} misses its measured step by "
                          f"{100 * worst['error']:.1f} % (over {100 * MAX_ERROR:.0f} %): the "
                          f"graph contradicts the measurement ({ahead:.1f} ms of ops start "
                          "ahead of what they wait for)")
    return out


def _state(measured: int, predicted: float, threshold_ns: int) -> str:
    if predicted < max(threshold_ns, VANISH_SHARE * measured):
        return "vanished"
    if predicted < (1 - CHANGE_SHARE) * measured:
        return "shrank"
    return "grew" if predicted > (1 + CHANGE_SHARE) * measured else "remains"


def _backtrack(after: Replay, subject: Subject, node: int, lo: int) -> list[Segment]:
    """Segments from `node` back along binding predecessors until `lo`."""
    times, binding = after.timing.times, after.timing.binding
    n = after.model.ops
    segments: list[Segment] = []
    while node >= 0 and times[node] > lo:
        previous = int(binding[node])
        since = max(int(times[previous]) if previous >= 0 else lo, lo)
        if node < 2 * n and since < times[node]:
            op = node // 2
            segments.append(_segment(subject, op, _kind(subject, op, node, previous), since,
                                     int(times[node])))
        node = previous
    return _joined(segments[::-1])


def _kind(subject: Subject, op: int, node: int, previous: int) -> str:
    """delay (a start's gap), transfer (communication's own time), compute, or wait (an end
    released by another op: a wake-up)."""
    if node % 2 == 0:
        return DELAY
    if subject.category[op]:
        return TRANSFER
    return COMPUTE if previous == node - 1 else WAIT


def _segment(subject: Subject, op: int, kind: str, start: int, end: int) -> Segment:
    graph = subject.graph
    return Segment(op=op, rank=int(graph.rank[op]), lane=str(graph.lane[op]),
                   name=str(graph.name[op]), kind=kind, category=str(subject.category[op] or ""),
                   start=start, end=end)


def _joined(segments: list[Segment]) -> list[Segment]:
    """Segments under MIN_PIECE_NS (launch gaps, wake-ups) folded into the one before;
    consecutive segments of one lane, kind and category then as one (the longest op names it)."""
    out: list[Segment] = []
    for seg in segments:
        last = out[-1] if out else None
        if last and seg.end - seg.start < MIN_PIECE_NS:
            last.end = max(last.end, seg.end)
        elif last and (last.rank, last.lane, last.kind, last.category) == (
                seg.rank, seg.lane, seg.kind, seg.category) and seg.start - last.end <= \
                MIN_PIECE_NS:
            if seg.end - seg.start > last.end - last.start:
                last.op, last.name = seg.op, seg.name
            last.end = max(last.end, seg.end)
        else:
            out.append(seg)
    return out
