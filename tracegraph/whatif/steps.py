"""Which ops make each measured step of each rank: what a replay reads its steps off, and
what ties a step's lanes to the step before it in the timing model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph.analysis.analyze import Analysis
from tracegraph.graph.depgraph import DepGraph
from tracegraph.verify.metrics import step_table


@dataclass
class StepOps:
    """Which ops make each measured step of each rank."""

    table: pd.DataFrame  # rank, step, start, end (measured ns), ms: metrics.step_table
    row: np.ndarray  # per op: its row of `table`, -1 outside every step
    first: np.ndarray  # per row: the op that started first in it, -1 if none
    last_end: np.ndarray  # per row: the latest measured end of its ops


def step_ops(analysis: Analysis) -> StepOps:
    """Assign every timeline op to the step of its rank it started in."""
    graph = analysis.graph
    table = step_table(analysis)
    n = len(graph)
    ops = pd.DataFrame({"rank": graph.rank.astype(np.int64), "time": graph.start,
                        "op": np.arange(n)})
    ops = ops[~graph.host_side].sort_values("time", kind="stable")
    windows = table.assign(row=np.arange(len(table)), rank=table["rank"].astype(np.int64))
    windows = windows.sort_values("start", kind="stable")
    hit = pd.merge_asof(ops, windows[["rank", "start", "end", "row"]], left_on="time",
                        right_on="start", by="rank", direction="backward")
    inside = hit["row"].notna().to_numpy() & (hit["time"] < hit["end"]).to_numpy()
    row = np.full(n, -1, dtype=np.int64)
    row[hit["op"].to_numpy()[inside]] = hit["row"].to_numpy()[inside].astype(np.int64)
    member = np.flatnonzero(row >= 0)
    first = np.full(len(table), -1, dtype=np.int64)
    order = member[np.lexsort((graph.start[member], row[member]))]
    lead = np.r_[True, row[order][1:] != row[order][:-1]] if len(order) else order.astype(bool)
    first[row[order][lead]] = order[lead]
    last_end = np.full(len(table), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_end, row[member], graph.end[member])
    return StepOps(table=table, row=row, first=first, last_end=last_end)


def step_launches(graph: DepGraph, steps: StepOps) -> tuple[np.ndarray, np.ndarray]:
    """(ended, launched): each lane's first op of a rank's step, of those whose launch the
    profile does not hold (no host side: a graph-mode step launched whole), paired with the op
    of the rank's previous step that ended last, where it started after that end: the rank's
    device was idle in between, so the host launched the step after the one before it ended
    (it synchronized on it). A step's lanes thus start together from one point, as its host
    launched them, not each a fixed time after its own last op of the step before."""
    member = np.flatnonzero(steps.row >= 0)
    table = steps.table
    if not len(member) or not len(table):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    by_end = member[np.lexsort((graph.end[member], steps.row[member]))]
    last = np.full(len(table), -1, dtype=np.int64)
    last[steps.row[by_end]] = by_end  # per row: its op that ended last
    order = np.lexsort((table["start"].to_numpy(), table["rank"].to_numpy()))
    previous = np.full(len(table), -1, dtype=np.int64)
    same = table["rank"].to_numpy()[order][1:] == table["rank"].to_numpy()[order][:-1]
    previous[order[1:][same]] = last[order[:-1][same]]  # per row: the last op of the step before
    unknown = member[(graph.launch[member] < 0) & ~graph.host_side[member]]
    first = unknown[np.lexsort((graph.start[unknown], graph.lane_id[unknown],
                                steps.row[unknown]))]
    lead = np.ones(len(first), dtype=bool)
    lead[1:] = ((steps.row[first][1:] != steps.row[first][:-1])
                | (graph.lane_id[first][1:] != graph.lane_id[first][:-1]))
    first = first[lead]
    ended = previous[steps.row[first]]
    keep = (ended >= 0) & (graph.start[first] >= graph.end[np.maximum(ended, 0)]) & (
        graph.prev[first] != ended)
    return ended[keep], first[keep]
