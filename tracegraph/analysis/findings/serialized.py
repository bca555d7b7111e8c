"""Serialized streams: a rank's main compute stream and a collective stream that never run at
the same time although each keeps waiting, with work launched and ready, until the other is
idle: the signature of one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1; on Ascend, the
streams' tasks submitted through one queue). The cost is the time ops waited so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis import intervals
from tracegraph.analysis.findings.finding import WARNING, Finding

CONCURRENT_SHARE = 0.01  # streams busy together less than this share of the less busy one ...
MIN_DELAYED_OPS = 5  # ... with at least this many ops held back ...
MIN_DELAY_MS = 1.0  # ... for this long per step in all, are serialized
HELD_NS = 2_000  # an op that starts this much after it was ready waited
BUSY_SHARE = 0.9  # ... and was held by the other stream if it was busy this share of the wait
SUGGESTION = ("set CUDA_DEVICE_MAX_CONNECTIONS > 1 (on Ascend: give communication its own "
              "stream and queue, e.g. multi_stream P2P transport / HCCL on a separate stream) so "
              "compute and communication run concurrently; the TP async overlap that needs 1 "
              "conflicts with EP all-to-all overlap")


def serialized_table(analysis) -> pd.DataFrame:
    """rank, main, comm (lane names; P2P streams are left out: a pipeline's transfers and
    compute take turns by dependency), busy_main_ms, busy_comm_ms, concurrent_ms, delayed_ops,
    delayed_ms: per rank and communication stream, in all steps (rank by rank, where the ranks
    lie)."""
    return analysis.table_by_part(_serialized_rows)


def _serialized_rows(analysis) -> pd.DataFrame:
    frame = analysis.ops.frame
    start, end = analysis.start, analysis.end
    lane, lanes = frame["lane_id"].to_numpy(), analysis.ops.lanes
    streams = set(lanes.loc[lanes["mode"] == schema.STREAM, "lane_id"])
    is_comm = frame["kind"].isin([schema.COLLECTIVE, schema.P2P]).to_numpy()
    collective = (frame["kind"] == schema.COLLECTIVE).to_numpy()  # a P2P waits on its peer
    working = frame["kind"].isin([schema.COMPUTE, schema.MEMCPY]).to_numpy() | is_comm
    ready = _ready(analysis)
    rows = []
    for rank, main in analysis.ops.main_lanes().items():
        if main not in streams:
            continue
        others = np.unique(lane[collective & (frame["rank"].to_numpy() == rank)])
        for other in (o for o in others if o in streams and o != main):
            pair = (lane == main) | (lane == other)
            a, b = (_busy_intervals(start, end, working & (lane == x)) for x in (main, other))
            held = np.flatnonzero(pair & working & (start - ready > HELD_NS) & (ready >= 0))
            delayed = _held_by_the_other(held, lane[held] == main, (a, b), ready, start)
            rows.append((int(rank), _name(lanes, main), _name(lanes, other),
                         intervals.length(a) / 1e6, intervals.length(b) / 1e6,
                         intervals.overlap(a, b) / 1e6, len(delayed),
                         float(np.sum(start[delayed] - ready[delayed])) / 1e6))
    return pd.DataFrame(rows, columns=["rank", "main", "comm", "busy_main_ms", "busy_comm_ms",
                                       "concurrent_ms", "delayed_ops", "delayed_ms"])


def _busy_intervals(start: np.ndarray, end: np.ndarray, mask: np.ndarray):
    """When the ops under `mask` kept their stream busy, as disjoint intervals."""
    return intervals.union(start[mask], end[mask], -np.inf, np.inf)


def _ready(analysis) -> np.ndarray:
    """When each op could have started: launched (aligned) and its stream predecessor done; -1
    where that is not known: the launch is unknown, or the predecessor is a wait (when a wait
    let go is a matter of its match, and a dependency is not a queue)."""
    launch, prev = analysis.graph.launch, analysis.ops.lane_prev()
    kind = analysis.ops.frame["kind"].to_numpy()
    after = np.where(prev >= 0, analysis.end[np.maximum(prev, 0)], -1)
    waited = (prev >= 0) & (kind[np.maximum(prev, 0)] == schema.WAIT)
    return np.where((launch >= 0) & ~waited, np.maximum(launch, after), -1)


def _held_by_the_other(held: np.ndarray, on_main: np.ndarray, busy: tuple, ready: np.ndarray,
                       start: np.ndarray) -> np.ndarray:
    """The held ops whose other stream was busy for most of the time from ready to start."""
    main, other = busy
    lo, hi = ready[held], start[held]
    covered = np.where(on_main, intervals.covered(other, lo, hi), intervals.covered(main, lo, hi))
    return held[covered >= BUSY_SHARE * (hi - lo)]


def _name(lanes: pd.DataFrame, lane_id: int) -> str:
    return str(lanes.loc[lanes["lane_id"] == lane_id, "lane"].iloc[0])


def finding(analysis) -> Finding | None:
    """The serialized-streams finding; None when no rank shows the signature."""
    table = serialized_table(analysis)
    if not len(table):
        return None
    steps = max(analysis.step_table().groupby("rank")["step"].nunique().max(), 1)
    least = np.minimum(table["busy_main_ms"], table["busy_comm_ms"])
    hit = table[(table["concurrent_ms"] <= CONCURRENT_SHARE * least)
                & (table["delayed_ops"] >= MIN_DELAYED_OPS)
                & (table["delayed_ms"] / steps >= MIN_DELAY_MS)]
    if not len(hit):
        return None
    hit = hit.assign(exposed_ms=(hit["busy_comm_ms"] - hit["concurrent_ms"]) / steps)
    lines = [f"rank {r.rank}: {r.main} and {r.comm} never ran together ({r.concurrent_ms:.3f} of "
             f"{min(r.busy_main_ms, r.busy_comm_ms):.1f} ms); {r.delayed_ops} ops waited, "
             f"ready, until the other stream was idle; its communication ran exposed: "
             f"{r.exposed_ms:.1f} ms per step" for r in hit.itertuples()]
    cost = float(hit["exposed_ms"].max())
    return Finding(
        "serialized_streams", WARNING,
        f"compute and communication streams serialized on {hit['rank'].nunique()} rank(s) (one "
        f"hardware queue?): up to {cost:.1f} ms of communication per step cannot hide",
        SUGGESTION, lines,
        {"ranks": sorted({int(r) for r in hit["rank"]}), "exposed_ms_per_step": round(cost, 3),
         "pairs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
                   for row in hit.to_dict("records")]})
