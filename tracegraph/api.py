"""The notebook API: `tracegraph.analyze(path)` returns a `Result` whose tables are pandas
DataFrames, every time in ms on the clock aligned across ranks, 0 at the first step's start (as
`tracegraph analyze` prints them). See docs/api.md."""

from __future__ import annotations

import warnings
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.loading.groups import group_labels
from tracegraph.verdict import bubble_causes, verdict

NS_PER_MS = 1e6


def analyze(path: str | Path, *, threshold_ms: float = 1.0, cache_dir: str | Path | None = None,
            use_cache: bool = True, jobs: int | None = None,
            rank_map: dict[str, int] | None = None, progress: bool = True) -> Result:
    """Load the bundle at `path` (folder, archive or file) and analyse it: the `Result`. Its
    warnings (partial data, absent ranks) are issued as Python warnings and kept in
    `Result.warnings`. The parsed ranks and the analysis are cached as by the command line
    (`use_cache=False`: neither read nor written)."""
    from tracegraph.analysis.analyze import analyze as analyse
    from tracegraph.analysis.cache import remembered
    from tracegraph.analysis.findings import find_all
    from tracegraph.analysis.pipeline import recover
    from tracegraph.loading.cachedir import CacheDir, default_cache_dir
    from tracegraph.loading.loader import load

    store = CacheDir(Path(cache_dir) if cache_dir is not None else default_cache_dir(),
                     warn=_warn) if use_cache else None  # a str as well
    trace = load(path, use_cache=use_cache, jobs=jobs, rank_map=rank_map, progress=progress,
                 cache_folder=store)
    options = {"threshold_ms": threshold_ms}

    def kept(what: str, compute):  # noqa: ANN001, ANN202 - as the command line keeps them
        return remembered(trace, store, what, options, compute, _warn)

    analysis = kept("analysis", lambda: analyse(trace, threshold_ms=threshold_ms))
    pipeline = kept("pipeline", lambda: recover(analysis))
    findings = kept("findings", lambda: find_all(analysis, pipeline))
    result = Result(analysis, [f.as_dict() for f in findings], pipeline)
    for warning in result.warnings:
        _warn(warning)
    return result


def _warn(message: str) -> None:
    warnings.warn(message, ProfileWarning, stacklevel=4)  # the caller of tracegraph.analyze


class ProfileWarning(UserWarning):
    """Partial or damaged data, analysed as far as it goes."""


class Result:
    """One bundle's analysis: DataFrames of its bubbles and their causes, critical paths,
    stragglers, steps and findings, the verdict, `whatif(...)`, `figure()`."""

    def __init__(self, analysis: Analysis, findings: list[dict[str, object]], pipeline) -> None:
        self.analysis = analysis
        """The full analysis (`tracegraph.analysis.analyze.Analysis`): the DepGraph and more."""
        self.pipeline = pipeline
        """The pipeline schedule recovered from the trace (`Pipeline`: blocks, bubble ratio)."""
        self._findings = findings
        self._origin = analysis.origin
        self._labels = group_labels(analysis.trace.groups)

    def __repr__(self) -> str:
        from reports.verdict import plural

        trace = self.analysis.trace
        return (f"<tracegraph.Result {trace.source}: {plural(len(trace.rank_ids), 'rank')}, "
                f"{plural(self.steps['step'].nunique(), 'step')}, "
                f"{plural(len(self.analysis.bubbles), 'bubble')}>")

    @property
    def warnings(self) -> list[str]:
        """What the trace and the analysis warned about."""
        return list(self.analysis.trace.warnings) + list(self.analysis.warnings)

    @cached_property
    def verdict(self) -> dict[str, object]:
        """The verdict as `analyze --json` gives it (tracegraph.verdict)."""
        return verdict(self.analysis, findings=self._findings,
                       pipeline=self.pipeline.as_dict() if self.pipeline is not None else None)

    # --- tables --------------------------------------------------------------------------------
    @cached_property
    def bubbles(self) -> pd.DataFrame:
        """One row per bubble, longest first (`bubble` numbers them): rank, step, lane, op (the
        waiting op, "idle" for a gap), start_ms, dur_ms, category (the cause charged the most),
        root_rank / root_lane / root_op / root_group (the origin of its chain; the group whose
        absent members it waited on, "" if none), confidence (high, medium, low), weakest_link,
        chain (the ranks from this one back to the root)."""
        rows = [self._bubble(i, b) for i, b in enumerate(self.analysis.bubbles)]
        return pd.DataFrame(rows, columns=BUBBLE_COLUMNS)

    def _bubble(self, number: int, bubble: Bubble) -> tuple:
        root = bubble.root
        return (number, bubble.rank, bubble.step, bubble.lane, bubble.name,
                self._ms(bubble.start), bubble.dur / NS_PER_MS, bubble.category,
                root.rank if root else -1, root.lane if root else "", root.name if root else "",
                self._group(root.unprofiled_group) if root else "", bubble.sureness,
                bubble.evidence, bubble.chain())

    @cached_property
    def causes(self) -> pd.DataFrame:
        """Each bubble's causes, largest first: bubble (its row in `bubbles`), category, rank,
        lane, op (of its longest piece), group (the group whose absent members it waited on,
        "" if none), ms, share (of the bubble)."""
        rows = [(i, c.category, c.rank, c.lane, c.name, self._group(c.group), c.ns / NS_PER_MS,
                 c.share)
                for i, bubble in enumerate(self.analysis.bubbles) for c in bubble_causes(bubble)]
        return pd.DataFrame(rows, columns=["bubble", "category", "rank", "lane", "op", "group",
                                           "ms", "share"])

    @cached_property
    def critical_path(self) -> pd.DataFrame:
        """Each step's critical path (the slowest rank's step tiled), in order: step, rank, lane,
        op, kind (compute, transfer, wait), category, start_ms, end_ms, dur_ms."""
        rows = [(step, s.rank, s.lane, s.name, s.kind, s.category, self._ms(s.start),
                 self._ms(s.end), (s.end - s.start) / NS_PER_MS)
                for step, path in sorted(self.analysis.critical_paths.items()) for s in path]
        return pd.DataFrame(rows, columns=["step", "rank", "lane", "op", "kind", "category",
                                           "start_ms", "end_ms", "dur_ms"])

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Each rank's step: step, rank, start_ms, end_ms (nan for a step from the rank's step
        table: no timeline), ms, slowest (the step's slowest rank), stated (from the step
        table)."""
        from tracegraph.verify.metrics import step_times

        table = self.analysis.step_table()
        timed = table.assign(start_ms=self._ms(table["start"]), end_ms=self._ms(table["end"]))
        rows = step_times(self.analysis).merge(timed[["rank", "step", "start_ms", "end_ms"]],
                                               on=["rank", "step"], how="left")
        rows["slowest"] = rows["ms"] == rows.groupby("step")["ms"].transform("max")
        return rows[["step", "rank", "start_ms", "end_ms", "ms", "slowest", "stated"]].sort_values(
            ["step", "rank"], ignore_index=True)

    @cached_property
    def stragglers(self) -> pd.DataFrame:
        """Per rank: straggler (its compute judged slow against its peers), peers (the ranks
        doing the same work it was judged against), not_judged (why not, "" if it was),
        slow_ms (ms per step of its ops judged slow)."""
        analysis = self.analysis
        peers = {r: ranks for ranks in analysis.peers.groups() for r in ranks}
        graph = analysis.graph
        slow = pd.Series((graph.end - graph.start)[analysis.slow_op]).groupby(
            graph.rank[analysis.slow_op]).sum() / NS_PER_MS / max(self.steps["step"].nunique(), 1)
        rows = [(r, r in analysis.slow_ranks, peers.get(r, []),
                 analysis.peers.unjudged.get(r, ""), float(slow.get(r, 0.0)))
                for r in analysis.trace.rank_ids]
        return pd.DataFrame(rows, columns=["rank", "straggler", "peers", "not_judged",
                                           "slow_ms"])

    @cached_property
    def findings(self) -> pd.DataFrame:
        """What the analysis found besides the bubbles: kind, severity (warning, info), title,
        suggestion, lines (the evidence, readable), evidence (the numbers)."""
        return pd.DataFrame(self._findings, columns=["kind", "severity", "title", "suggestion",
                                                     "lines", "evidence"])

    # --- what-if and figures -----------------------------------------------------------------
    def whatif(self, fix: str | list[str] = (), straggler: str | list[str] = (),
               scale: str | list[str] | dict[str, float] = (),
               remove_wait: str | list[str] = ()) -> WhatIf:
        """Replay the dependency graph with the edits of `tracegraph whatif`, by their names:
        `fix="decouple-reduction"`, `straggler="1"` (or "auto", "absent"),
        `scale={"ep_alltoall": 0.5}` (or "ep_alltoall=0.5"), `remove_wait="dp_reduction"`;
        several as lists. ValueError for an edit the bundle cannot take."""
        from tracegraph.whatif.edits import parse_edits
        from tracegraph.whatif.predict import predict

        if isinstance(scale, dict):
            scale = [f"{selector}={factor}" for selector, factor in scale.items()]
        edits = parse_edits(*(_listed(v) for v in (fix, straggler, scale, remove_wait)))
        return WhatIf(predict(self.analysis, edits, threshold_ms=self.analysis.threshold_ms))

    def figure(self, step: int | None = None, top: int = 5):  # noqa: ANN201 - plotly, lazily
        """The waterfall of `step` (default: the slowest) as a plotly figure: rows per rank and
        lane, bubbles coloured by cause, the critical path, the `top` bubbles' chains."""
        from reports.waterfall import waterfall

        return waterfall(self.analysis, self._step(step), top=top)

    def _step(self, step: int | None) -> int:
        if step is not None:
            return step
        steps = self.steps
        return int(steps.loc[steps["ms"].idxmax(), "step"]) if len(steps) else -1

    def _repr_html_(self) -> str:
        from html import escape

        from reports.verdict import verdict_html

        trace = self.analysis.trace
        return (f"<p><b>tracegraph</b>: {escape(str(trace.source))}, "
                f"{len(trace.rank_ids)} ranks, {len(self.analysis.bubbles)} bubbles</p>"
                + verdict_html(self.verdict))

    # --- helpers -------------------------------------------------------------------------------
    def _ms(self, ns):  # noqa: ANN001, ANN202 - an int, an array or a Series alike
        return (ns - self._origin) / NS_PER_MS

    def _group(self, group: str) -> str:
        return self._labels.get(group, group) if group else ""


BUBBLE_COLUMNS = ["bubble", "rank", "step", "lane", "op", "start_ms", "dur_ms", "category",
                  "root_rank", "root_lane", "root_op", "root_group", "confidence",
                  "weakest_link", "chain"]


def _listed(value: str | list[str] | tuple) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


class WhatIf:
    """A what-if prediction (`Result.whatif`): step times measured and predicted, the gain,
    the bubbles that vanish; the `Prediction` itself as `.prediction`."""

    def __init__(self, prediction) -> None:  # noqa: ANN001 - tracegraph.whatif.predict
        self.prediction = prediction

    @cached_property
    def summary(self) -> dict[str, object]:
        """As `whatif --json` prints it."""
        from tracegraph.whatif.summary import summarize_prediction

        return summarize_prediction(self.prediction)

    @property
    def changes(self) -> list[str]:
        """What each edit changed, in words."""
        return list(self.prediction.changes)

    @property
    def refused(self) -> dict[int, str]:
        """Steps not predicted, and why (their replay misses the measurement)."""
        return dict(self.prediction.refused)

    @property
    def measured_ms(self) -> float:
        """The step time measured (the slowest rank's, median over predicted steps)."""
        return self._time("measured_ms")

    @property
    def predicted_ms(self) -> float:
        """The step time predicted after the edits."""
        return self._time("predicted_ms")

    @property
    def gain_ms(self) -> float:
        """measured_ms - predicted_ms (nan when no step was predicted)."""
        return self._time("gain_ms")

    def _time(self, key: str) -> float:
        return float(self.prediction.step_time().get(key, np.nan))

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Per predicted step: measured_ms, replayed_ms, predicted_ms, slowest_rank, gain_ms,
        gain_pct."""
        return self.prediction.steps()

    @cached_property
    def ranks(self) -> pd.DataFrame:
        """Per rank and predicted step: measured_ms, predicted_ms."""
        return self.prediction.ranks()

    @cached_property
    def bubbles(self) -> pd.DataFrame:
        """Every measured bubble of a predicted step: rank, lane, step, op, start_ms,
        measured_ms, predicted_ms, state (vanished, shrank, grew, remains), category."""
        table = self.prediction.bubbles()
        origin = self.prediction.analysis.origin
        table = table.drop(columns="op").rename(columns={"name": "op"})
        return table.assign(start_ms=(table["start"] - origin) / NS_PER_MS)[
            ["rank", "lane", "step", "op", "start_ms", "measured_ms", "predicted_ms", "state",
             "category"]]

    def figure(self, step: int | None = None, top: int = 5):  # noqa: ANN201 - plotly, lazily
        """The predicted waterfall of `step` (default: the first predicted)."""
        from reports.waterfall import waterfall
        from reports.whatif import predicted_analysis

        steps = self.prediction.predicted
        if not steps:
            raise ValueError("no step was predicted: " + "; ".join(self.refused.values()))
        return waterfall(predicted_analysis(self.prediction), steps[0] if step is None else step,
                         top=top)

    def __repr__(self) -> str:
        edits = ", ".join(e.label for e in self.prediction.edits) or "no edit"
        return (f"<tracegraph.WhatIf {edits}: {self.measured_ms:.1f} → {self.predicted_ms:.1f} ms"
                f" (gain {self.gain_ms:.1f} ms)>")

    def _repr_html_(self) -> str:
        from html import escape

        lines = "".join(f"<li>{escape(change)}</li>" for change in self.changes)
        refused = "".join(f"<li>step {s} not predicted: {escape(why)}</li>"
                          for s, why in self.refused.items())
        return (f"<p><b>what-if</b>: step time {self.measured_ms:.1f} → "
                f"{self.predicted_ms:.1f} ms, gain <b>{self.gain_ms:.1f} ms</b></p>"
                f"<ul>{lines}{refused}</ul>")
