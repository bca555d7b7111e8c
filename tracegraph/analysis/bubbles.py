"""Bubbles: every stall on a rank's main compute lane longer than a threshold, blamed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.blame import Blamer, Bubble, Interval
from tracegraph.graph.depgraph import DepGraph

SAMPLED_CONFIDENCE = 0.5  # a trace whose collectives refused order matching may miss events
SAMPLED = "collectives could not be matched by order (sub-sampled or truncated trace?)"
INCOMPLETE_CONFIDENCE = 0.2  # a chain through a rank whose parser knows it misses events:
# below every link's, so that is the weakest link said


def sureness(weakest: tuple[float, str], sampled: bool, incomplete: dict[int, str], rank: int,
             intervals: list) -> tuple[float, str]:
    """A bubble's confidence and evidence: its chain's weakest link, capped for a sampled
    trace and for a chain through a rank (its own, its intervals') whose parser knows it misses
    events (`incomplete`). On a cluster's part the intervals are still walk items: the client
    judges again once they are charged."""
    confidence, evidence = weakest
    ranks = {rank} | {p.rank for p in intervals if isinstance(p, Interval)}
    if sampled and confidence > SAMPLED_CONFIDENCE:
        confidence, evidence = SAMPLED_CONFIDENCE, SAMPLED
    missing = sorted(ranks & set(incomplete))
    if missing and confidence > INCOMPLETE_CONFIDENCE:
        confidence = INCOMPLETE_CONFIDENCE
        evidence = f"rank {missing[0]}'s profile misses events ({incomplete[missing[0]]})"
    return confidence, evidence


def find_bubbles(blamer: Blamer, steps: pd.DataFrame, threshold_ns: int) -> list[Bubble]:
    """Every wait, idle gap or waiting comm op longer than the threshold on a main lane."""
    bubbles = []
    graph = blamer.graph
    steps_of = dict(iter(steps.groupby("rank"))) if len(steps) else {}
    for rank, lane_id in graph.ops.main_lanes().items():
        idx = np.arange(graph.lane_first[lane_id], graph.lane_first[lane_id + 1])
        for step, lo, hi in _rank_steps(steps_of.get(rank), graph, idx):
            inside = idx[(graph.end[idx] > lo) & (graph.start[idx] < hi)]
            bubbles += _lane_bubbles(blamer, inside, int(step), lo, hi, threshold_ns)
    return sorted(bubbles, key=lambda b: -b.dur)


def _rank_steps(mine: pd.DataFrame | None, graph: DepGraph, idx: np.ndarray) -> list[tuple]:
    if mine is not None and len(mine):
        return list(mine[["step", "start", "end"]].itertuples(index=False))
    if not len(idx):
        return []
    return [(-1, int(graph.start[idx].min()), int(graph.end[idx].max()))]


def _lane_bubbles(blamer: Blamer, inside: np.ndarray, step: int, lo: int, hi: int,
                  threshold_ns: int) -> list[Bubble]:
    """The bubbles of one lane's ops `inside` [lo, hi]: idle gaps longer than the threshold
    (after everything before ended), and long waits, comm ops and released annotations."""
    if not len(inside):
        return []
    graph = blamer.graph
    a, b = np.maximum(graph.start[inside], lo), np.minimum(graph.end[inside], hi)
    kind = graph.kind[inside]
    p2p = kind == schema.P2P  # a P2P op waits from when its host call posted it, after the
    earlier = np.maximum.accumulate(np.where(p2p, b, lo))  # P2P ops before it (one exchange)
    a[p2p] = np.maximum(np.minimum(graph.posted[inside[p2p]], a[p2p]),
                        np.r_[lo, earlier[:-1]][p2p])
    before = np.maximum.accumulate(b)  # the latest end so far
    idle = np.zeros(len(inside), dtype=bool)
    idle[1:] = a[1:] - before[:-1] > threshold_ns
    waiting = (b - a > threshold_ns) & np.isin(kind, [schema.WAIT, schema.P2P, schema.COLLECTIVE,
                                                      schema.MARKER])
    found = []
    for k in np.flatnonzero(idle | waiting):
        i = inside[k]
        if idle[k]:
            found.append(_bubble(blamer, i, before[k - 1], a[k], step, "idle",
                                 blamer.gap(i, before[k - 1], a[k])))
        if not waiting[k]:
            continue
        if kind[k] != schema.MARKER:
            found.append(_bubble(blamer, i, a[k], b[k], step, str(graph.name[i]),
                                 blamer.blocked(i, a[k], b[k])))
        elif blamer.walk.released_by(i) >= 0:
            found.append(_bubble(blamer, i, a[k], b[k], step, str(graph.name[i]),
                                 blamer.blocked_thread(i, a[k], b[k])))
    return found


def _bubble(blamer: Blamer, i: int, a: int, b: int, step: int, name: str, intervals) -> Bubble:
    graph = blamer.graph
    confidence, evidence = sureness(blamer.walk.weakest, graph.sampled, graph.incomplete,
                                    int(graph.rank[i]), intervals)
    return Bubble(rank=int(graph.rank[i]), lane=str(graph.lane[i]), start=int(a), end=int(b),
                  name=name, step=step, intervals=intervals, op=int(i),
                  confidence=confidence, evidence=evidence)
