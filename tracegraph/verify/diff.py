"""Two sides of profiled runs, before and after a change: did it make the step faster, and why.

`compare(before, after)` takes one analysis (or `verify.runs.Run`) per side, or several, and returns
plain data (the documented JSON of `tracegraph diff --json`): step time (the slowest rank's step,
median over every step of every run) overall and per rank, bubble time per root-cause category,
critical-path composition, communication/compute overlap per group kind, the chains that
disappeared, shrank, grew or appeared (and in how many runs of each side), and a verdict.

Step time, bubble time per category and each chain are a `verify.stats.Change`: with at least two
runs per side, an interval and a p-value, and a change that is not significant is `noise`; with
one run on a side, the point change and a note that no noise estimate exists. Runs holding
different numbers of steps are compared over the steps they all hold (the first ones), with a
warning. Chains are matched across runs by (waiting rank, category, root rank, root lane, root op
without instance numbers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tracegraph.analysis.analyze import Analysis
from tracegraph.verify import stats
from tracegraph.verify.runs import CHAIN_KEYS, ChainKey, Run, Side, run_of
from tracegraph.verify.stats import Change, median_of_means, pooled_median

UNCHANGED_PCT = 2.0  # step-time changes within this are "unchanged"
CONFIDENCE = 0.95
CHAIN_FLOOR_SHARE = 0.01  # chains under this share of the step time count as absent
CHAIN_CHANGE_SHARE = 0.10  # a chain shrank or grew when it changed by this share (and the floor)
CHAIN_STATES = ("disappeared", "shrank", "grew", "appeared")
NOISE = "noise"

Runs = Analysis | Run | Sequence[Analysis | Run]


def compare(before: Runs, after: Runs, *, top: int = 5, min_chain_ms: float | None = None,
            confidence: float = CONFIDENCE, unchanged_pct: float = UNCHANGED_PCT
            ) -> dict[str, object]:
    """The diff of two sides of runs (see the module docstring); a step-time change within
    `unchanged_pct` is "unchanged" (a gate's threshold below UNCHANGED_PCT narrows it, so that
    the verdict never calls unchanged what the gate fails)."""
    runs = {"before": _runs(before), "after": _runs(after)}
    counts = {side: [len(r.step_numbers) for r in found] for side, found in runs.items()}
    steps = min(min(c) for c in counts.values())
    old, new = Side(runs["before"], steps), Side(runs["after"], steps)
    step = stats.measure(old.step_time(), new.step_time(), pooled_median, confidence)
    floor = min_chain_ms if min_chain_ms is not None else max(
        1.0, CHAIN_FLOOR_SHARE * max(_finite(step.before), _finite(step.after)))
    ranks, overlaps = (_rank_ms(old), _rank_ms(new)), (profile_overlap(old), profile_overlap(new))
    return {
        "before": profile(old, ranks[0], overlaps[0]),
        "after": profile(new, ranks[1], overlaps[1]),
        "noise": noise_note(old, new, confidence),
        "warnings": step_count_warnings(counts, steps),
        "step_time": change_dict(step),
        "verdict": verdict(step, unchanged_pct),
        "ranks": _point_rows("rank", *ranks),
        "bubbles": _change_rows("category", (old, new), "bubbles", confidence),
        "critical_path": _point_rows("kind", *(_means(side.sums("critical", "kind"))
                                               for side in (old, new))),
        "overlap": _overlap_rows(*overlaps),
        "min_chain_ms": _r(floor),
        "chains": chain_changes(old, new, floor, top, confidence),
    }


def _runs(side: Runs) -> list[Run]:
    items = [side] if isinstance(side, Analysis | Run) else list(side)
    if not items:
        raise ValueError("a side of a diff needs at least one run")
    return [item if isinstance(item, Run) else run_of(item) for item in items]


# --- one side ----------------------------------------------------------------------------------
def profile(side: Side, ranks: dict[str, float],
            overlaps: tuple[dict[str, float], dict[str, float]]) -> dict[str, object]:
    """The numbers of one side: each run's steps, and the centre of each quantity over them
    (`ranks` and `overlaps`: its `_rank_ms` and `profile_overlap`, which the diff's rows also
    read)."""
    one = len(side.runs) == 1
    runs = [{"source": run.source,
             "step_ms": _r(float(np.median(run.steps["ms"])) if len(run.steps) else math.nan),
             "steps": {str(s): _r(ms) for s, ms in zip(run.steps["step"], run.steps["ms"],
                                                       strict=True)}}
            for run in side.runs]
    overlap, comm = overlaps
    return {
        "source": ", ".join(side.sources),
        "sources": side.sources,
        "runs": runs,
        "step_ms": _r(float(pooled_median(side.step_time()))),
        "steps": {(step if one else f"{i}:{step}"): ms for i, run in enumerate(runs, 1)
                  for step, ms in run["steps"].items()},
        "ranks": _rounded(ranks),
        "bubble_ms": _rounded(_means(side.sums("bubbles", "category"))),
        "rank_bubble_ms": _rank_bubbles(side),
        "critical_path_ms": {by: _rounded(_means(side.sums("critical", by)))
                             for by in ("kind", "rank")},
        "overlap": _rounded(overlap, 4),
        "comm_ms": _rounded(comm),
    }


def _means(matrices: dict[object, np.ndarray]) -> dict[str, float]:
    """Name -> the median over runs of its mean per step, largest first."""
    centres = {str(name): float(median_of_means(m)) for name, m in matrices.items()}
    return dict(sorted(centres.items(), key=lambda kv: -kv[1]))


def _rank_ms(side: Side) -> dict[str, float]:
    """Rank -> its median step time over every step of every run."""
    times = pd.concat([run.rank_steps for run in side.runs], ignore_index=True)
    medians = times.groupby("rank")["ms"].median()
    return {str(rank): float(ms) for rank, ms in medians.sort_index().items()}


def _rank_bubbles(side: Side) -> dict[str, dict[str, float]]:
    """Rank -> category -> bubble ms per step (median over runs)."""
    out: dict[str, dict[str, float]] = {}
    for (rank, category), matrix in side.sums("bubbles", "rank", "category").items():
        out.setdefault(str(rank), {})[str(category)] = _r(float(median_of_means(matrix)))
    return out


def profile_overlap(side: Side) -> tuple[dict[str, float], dict[str, float]]:
    """Group kind -> the share of its communication time overlapped by main-lane compute (over
    every rank, step and run), and -> its communication ms per step (median over runs)."""
    table = pd.concat([run.overlap for run in side.runs], ignore_index=True)
    sums = table.groupby("dim")[["comm_ms", "overlap_ms"]].sum()
    ratios = (sums["overlap_ms"] / sums["comm_ms"].where(sums["comm_ms"] > 0)).fillna(0.0)
    return ({str(d): float(r) for d, r in ratios.items()},
            _means(side.sums("overlap", "dim", value="comm_ms")))


# --- the verdict -------------------------------------------------------------------------------
def verdict(change: Change, unchanged_pct: float = UNCHANGED_PCT) -> str:
    """improved, regressed or unchanged (within `unchanged_pct`); `noise` when the runs give a
    noise estimate and the change is not beyond it."""
    if change.estimated and not change.significant:
        return NOISE
    pct = change.pct
    if pct is None or abs(pct) <= unchanged_pct:
        return "unchanged"
    return "improved" if pct < 0 else "regressed"


def regressed_beyond(report: dict[str, object], threshold_pct: float,
                     min_ms: float = 0.0) -> bool:
    """Whether the step time got worse by more than `threshold_pct` percent and `min_ms` ms:
    with a noise estimate, the whole interval and significantly; else the point change."""
    step = report["step_time"]
    if step.get("interval_pct") is not None:
        low_pct, low_ms = step["interval_pct"][0], step["interval_ms"][0]
        return bool(step["significant"]) and low_pct > threshold_pct and low_ms > min_ms
    change, delta = step["change_pct"], step["change_ms"]
    return change is not None and change > threshold_pct and (delta or 0.0) > min_ms


def representative(report: dict[str, object], side: str) -> int:
    """The index of the run of a side whose median step is closest to the side's step time
    (the run the HTML draws and a prediction is checked against)."""
    runs, centre = report[side]["runs"], _finite(report[side]["step_ms"])
    return min(range(len(runs)), key=lambda i: abs(_finite(runs[i]["step_ms"]) - centre))


def noise_note(old: Side, new: Side, confidence: float) -> dict[str, object]:
    """Whether the runs give a noise estimate, at which confidence, and one line saying so."""
    runs = (len(old.runs), len(new.runs))
    estimated = min(runs) >= stats.MIN_RUNS
    if estimated:
        note = (f"{runs[0]} runs before, {runs[1]} after ({runs[0] * old.steps} and "
                f"{runs[1] * new.steps} steps): {100 * confidence:g} % intervals by a bootstrap "
                "over the runs, p-values by a Mann-Whitney U test on the steps")
    else:
        note = (f"no noise estimate: {_count(runs[0], 'run')} before, {runs[1]} after; profile "
                "3-5 runs per side (--before/--after, repeated) to tell a change from "
                "run-to-run noise")
    return {"estimated": estimated, "confidence": confidence, "note": note}


def step_count_warnings(counts: dict[str, list[int]], steps: int) -> list[str]:
    """A warning when the runs hold different numbers of steps (they are cut to `steps`)."""
    if len({c for found in counts.values() for c in found}) <= 1:
        return []
    held = "; ".join(f"{side}: {', '.join(map(str, found))}" for side, found in counts.items())
    return [f"the runs hold different numbers of steps ({held}): compared per step over the "
            f"first {_count(steps, 'step')} of each run, the rest left out"]


def _count(number: int, word: str) -> str:
    return f"{number} {word}{'' if number == 1 else 's'}"


# --- changes -----------------------------------------------------------------------------------
def change_dict(change: Change) -> dict[str, object]:
    """A change as the JSON carries it."""
    return {"before_ms": _r(change.before), "after_ms": _r(change.after),
            "change_ms": _r(change.delta), "change_pct": _r(change.pct, 2),
            "interval_ms": _pair(change.interval), "interval_pct": _pair(change.interval_pct, 2),
            "p_value": _r(change.p_value, 4),
            "significant": change.significant if change.estimated else None}


def _change_rows(key: str, sides: tuple[Side, Side], table: str, confidence: float
                 ) -> list[dict[str, object]]:
    """A change per value of the `key` column of a per-step table, largest first."""
    old, new = (side.sums(table, key) for side in sides)
    rows = [{key: str(name), **change_dict(stats.measure(
        _matrix(old, name, sides[0]), _matrix(new, name, sides[1]), median_of_means,
        confidence))} for name in dict.fromkeys([*old, *new])]
    return sorted(rows, key=lambda row: -max(row["before_ms"] or 0, row["after_ms"] or 0))


def _matrix(matrices: dict[object, np.ndarray], key: object, side: Side) -> np.ndarray:
    """The runs × steps matrix of `key`, zeros when it never occurs on the side."""
    return matrices[key] if key in matrices else np.zeros((len(side.runs), side.steps))


def _point_rows(key: str, old: dict[str, float], new: dict[str, float]
                ) -> list[dict[str, object]]:
    names = list(dict.fromkeys([*old, *new]))
    return [{key: name, "before_ms": _r(old.get(name, 0.0)), "after_ms": _r(new.get(name, 0.0)),
             "change_ms": _r(new.get(name, 0.0) - old.get(name, 0.0)),
             "change_pct": _r(Change(old.get(name, 0.0), new.get(name, 0.0), 0.0).pct, 2)}
            for name in names]


def _overlap_rows(old: tuple[dict, dict], new: tuple[dict, dict]) -> list[dict[str, object]]:
    (ratio_old, comm_old), (ratio_new, comm_new) = old, new
    dims = sorted(set(ratio_old) | set(ratio_new))
    return [{"dim": dim, "before": _r(ratio_old.get(dim), 4), "after": _r(ratio_new.get(dim), 4),
             "before_comm_ms": _r(comm_old.get(dim, 0.0)),
             "after_comm_ms": _r(comm_new.get(dim, 0.0))} for dim in dims]


# --- chains ------------------------------------------------------------------------------------
def chain_changes(old: Side, new: Side, floor_ms: float, top: int, confidence: float
                  ) -> dict[str, list[dict[str, object]]]:
    """The top chains per state (disappeared, shrank, grew, appeared), ms per step, each with
    the number of runs of each side it holds at least `floor_ms` per step in."""
    before, after = old.chains(), new.chains()
    found: dict[str, list[dict[str, object]]] = {state: [] for state in CHAIN_STATES}
    for key in dict.fromkeys([*before, *after]):
        was, now = _matrix(before, key, old), _matrix(after, key, new)
        change = stats.measure(was, now, median_of_means, confidence)
        state = chain_state(change.before, change.after, floor_ms)
        if state:
            later = new if state in ("grew", "appeared") else old
            found[state].append(_chain(key, change, later.example(key),
                                       [_runs_holding(m, floor_ms) for m in (was, now)]))
    for state, chains in found.items():
        chains.sort(key=lambda c: abs(c["change_ms"]), reverse=True)
        found[state] = chains[:top] if top > 0 else chains
    return found


def chain_state(was: float, now: float, floor: float) -> str:
    """disappeared, appeared, shrank, grew, or "" (unchanged or under the floor on both sides)."""
    if was >= floor > now:
        return "disappeared"
    if now >= floor > was:
        return "appeared"
    if min(was, now) < floor or abs(now - was) < max(floor, CHAIN_CHANGE_SHARE * was):
        return ""
    return "grew" if now > was else "shrank"


def _runs_holding(matrix: np.ndarray, floor_ms: float) -> int:
    return int(np.sum(matrix.mean(axis=1) >= floor_ms)) if matrix.size else 0


def _chain(key: ChainKey, change: Change, example: dict[str, object] | None,
           runs: list[int]) -> dict[str, object]:
    fields = dict(zip(CHAIN_KEYS, key, strict=True))
    shown = example or {}
    return {
        "rank": int(fields["rank"]), "category": fields["category"],
        "root": {"rank": int(fields["root_rank"]), "lane": fields["root_lane"],
                 "op": fields["root_op"]},
        **change_dict(change),
        "runs": {"before": runs[0], "after": runs[1]},
        "chain": shown.get("chain", [int(fields["rank"])]),
        "example": {k: _r(v) if isinstance(v, float) else v for k, v in shown.items()
                    if k in ("run", "step", "lane", "name", "start_ms", "dur_ms")},
    }


# --- numbers -----------------------------------------------------------------------------------
def _rounded(values: dict[str, float], digits: int = 3) -> dict[str, float]:
    return {k: _r(v, digits) for k, v in values.items()}


def _pair(values: tuple[float, float] | None, digits: int = 3) -> list[float | None] | None:
    return None if values is None else [_r(v, digits) for v in values]


def _r(value: float | None, digits: int = 3) -> float | None:
    return round(float(value), digits) if _ok(value) else None


def _ok(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _finite(value: float | None) -> float:
    return float(value) if _ok(value) else 0.0
