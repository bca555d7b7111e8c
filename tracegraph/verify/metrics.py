"""Per-step numbers of an `Analysis` that `diff` compares and `checks` test.

Every time here is on the aligned clock (`ops.frame` times minus the rank's clock offset), every
duration in ms. "Step time" is the slowest rank's `ProfilerStep` of each step, its median over the
steps; per-step quantities (bubble time, critical-path composition, chains) are tables with a
row per step, which `verify.runs` keeps and `diff` compares step against step.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

import numpy as np
import pandas as pd

from tracegraph import causes
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble, Interval
from tracegraph.analysis.overlap import (  # noqa: F401 - diff and checks read them here
    REDUCTIONS,
    comm_categories,
    comm_dims,
    main_compute,
    overlap_ratios,
    overlap_table,
)

NS_PER_MS = 1e6
SETTLE_NS = 50_000  # pieces this short at a wait's end (a record, a wake-up) do not release it
SETTLE_SHARE = 0.01  # ... nor pieces under this share of the wait
_INSTANCE = re.compile(r"(?:[_@#]\d+)+(?:@[^@\s]+)?$")  # "_982_37_1@<group>", "#3", "_12"
_THREAD_ID = re.compile(r"^thread \d+")


# --- clocks and steps --------------------------------------------------------------------------
def step_table(analysis: Analysis) -> pd.DataFrame:
    """rank, step, start, end (aligned ns), ms: the ProfilerStep windows, else each rank's whole
    span as step -1."""
    return analysis.step_table()


def step_times(analysis: Analysis) -> pd.DataFrame:
    """rank, step, ms, stated: every rank's step time, from its window, else (stated True) from
    its step table alone (`Analysis.stated_steps`: a rank without a timeline)."""
    timed = step_table(analysis)[["rank", "step", "ms"]].assign(stated=False)
    stated = analysis.stated_steps()[["rank", "step", "ms"]].assign(stated=True)
    return pd.concat([timed, stated] if len(stated) else [timed], ignore_index=True)


def step_ms(analysis: Analysis) -> dict[int, float]:
    """Step -> the slowest rank's step time."""
    return {int(s): float(ms) for s, ms in step_times(analysis).groupby("step")["ms"].max().items()}


def step_time_ms(analysis: Analysis) -> float:
    """The job's step time: the slowest rank's step, median over the steps (nan if none)."""
    per_step = list(step_ms(analysis).values())
    return float(np.median(per_step)) if per_step else float("nan")


def rank_step_ms(analysis: Analysis) -> dict[int, float]:
    """Rank -> its median step time."""
    return {int(r): float(ms) for r, ms in step_times(analysis).groupby("rank")["ms"].median()
            .items()}


# --- bubbles and the critical path -------------------------------------------------------------
def bubble_table(analysis: Analysis) -> pd.DataFrame:
    """step, rank, category, ms: bubble time charged to each root-cause category."""
    rows = [(b.step, b.rank, category, ns / NS_PER_MS)
            for b in analysis.bubbles for category, ns in b.by_category().items()]
    table = pd.DataFrame(rows, columns=["step", "rank", "category", "ms"])
    return table.groupby(["step", "rank", "category"], as_index=False)["ms"].sum()


class SlowestRank(NamedTuple):
    """A step's slowest rank and the bubble time it stood exposed itself (not summed over
    ranks): in all, and by category, most first; `stated`: its step time is from its step table
    alone (no timeline, so its bubbles are unknown)."""

    rank: int
    exposed_ms: float
    by_cause: dict[str, float]
    stated: bool = False


def slowest_rank_bubbles(analysis: Analysis) -> dict[int, SlowestRank]:
    """Step -> its slowest rank's own bubbles in that step."""
    steps, table = step_times(analysis), bubble_table(analysis)
    exposed: Counter[tuple[int, int]] = Counter()
    for bubble in analysis.bubbles:
        exposed[bubble.step, bubble.rank] += bubble.dur
    slowest = steps.loc[steps.groupby("step")["ms"].idxmax(), ["step", "rank", "stated"]]
    out = {}
    for step, rank, stated in slowest.itertuples(index=False):
        mine = table[(table["step"] == step) & (table["rank"] == rank)]
        out[int(step)] = SlowestRank(int(rank), exposed[step, rank] / NS_PER_MS,
                                     _sorted(dict(zip(mine["category"], mine["ms"], strict=True))),
                                     bool(stated))
    return out


def critical_path_table(analysis: Analysis) -> pd.DataFrame:
    """step, kind, rank, ms: the critical path's composition per step, by the root-cause
    category its segments are charged to and the rank they ran on."""
    rows = [(step, seg.category, int(seg.rank), (seg.end - seg.start) / NS_PER_MS)
            for step, path in analysis.critical_paths.items() for seg in path]
    table = pd.DataFrame(rows, columns=["step", "kind", "rank", "ms"])
    return table.groupby(["step", "kind", "rank"], as_index=False)["ms"].sum()


def _sorted(values: dict[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in sorted(values.items(), key=lambda kv: -kv[1])}


# --- what released a wait, and chains ----------------------------------------------------------
def releaser(bubble: Bubble) -> Interval | None:
    """The piece of a bubble that released it: the last one, passing over the short records and
    wake-ups (under SETTLE_NS or SETTLE_SHARE of the bubble) that follow the op waited for; a
    communication piece releases however short it is (the transfer after a late member)."""
    pieces = sorted(bubble.intervals, key=lambda p: p.end)
    settle = max(SETTLE_NS, SETTLE_SHARE * bubble.dur)
    for piece in reversed(pieces):
        if piece.dur >= settle or (piece.dur >= SETTLE_NS and _communication(piece)):
            return piece
    return pieces[-1] if pieces else None


def _communication(piece: Interval) -> bool:
    return bool(causes.get(piece.category).dim) or piece.category == causes.COLLECTIVE


def reduction_names(analysis: Analysis) -> frozenset[str]:
    """Names of the ops whose comm type is a reduction (AllReduce, ReduceScatter, Reduce)."""
    frame = analysis.ops.frame
    return frozenset(frame.loc[frame["comm"].isin(REDUCTIONS), "name"].unique())


def is_reduction(piece: Interval, reductions: frozenset[str]) -> bool:
    """Whether a blamed piece is a DP-dimension reduction; `reductions`: reduction_names."""
    return piece.category == causes.DP_REDUCTION and piece.name in reductions


def op_family(name: str) -> str:
    """An op name without its instance numbers (and the group after them, as in HCCL names):
    `hcom_allReduce__982_37_1@123` → hcom_allReduce, `ProfilerStep#3` → ProfilerStep."""
    return _INSTANCE.sub("", name).rstrip("_") or name


def lane_family(lane: str) -> str:
    """A lane name that stays the same across runs (host thread ids differ from run to run)."""
    return _THREAD_ID.sub("thread", lane)


CHAIN_KEYS = ["rank", "category", "root_rank", "root_lane", "root_op"]


def chain_table(analysis: Analysis) -> pd.DataFrame:
    """Bubbles grouped into chains by (rank, category, root rank, root lane, root op family),
    per step: step, the keys, ms, bubble count, and the longest bubble as the example."""
    rows = []
    for bubble in analysis.bubbles:
        root = bubble.root
        rows.append({"step": bubble.step, "rank": bubble.rank, "category": bubble.category,
                     "root_rank": root.rank if root else bubble.rank,
                     "root_lane": lane_family(root.lane) if root else "",
                     "root_op": op_family(root.name) if root else "",
                     "ns": bubble.dur, "bubble": bubble})
    keys = ["step", *CHAIN_KEYS]
    if not rows:
        return pd.DataFrame(columns=[*keys, "ms", "count", "example"])
    table = pd.DataFrame(rows)
    grouped = table.groupby(keys, sort=False)
    chains = grouped.agg(ns=("ns", "sum"), count=("ns", "size")).reset_index()
    chains["ms"] = chains.pop("ns") / NS_PER_MS
    chains["example"] = grouped["bubble"].agg(lambda b: max(b, key=lambda x: x.dur)).to_numpy()
    return chains.sort_values("ms", ascending=False, ignore_index=True)
