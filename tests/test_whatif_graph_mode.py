"""What-if on a real graph-mode profile: ../shared/real_traces/ascend/mindspore_graph_ddp2_prof
(MindSpore, 2 ranks DDP, 10 iterations of 15-18 ms after a 47/57 ms first one; raw msprof: no
host launches, no event ids, no correlation ids).

Read by hand: each iteration the main stream records its gradients, the HCCL stream waits for
that record, runs `Default/AllReduce-op534_0` and records, and the main stream idles until its
wait on that record; the dropout stream runs two `DropoutGenMask` at the iteration's start.
Nothing overlaps the AllReduce, so removing it saves, per step, the AllReduce of the rank that
arrived last (its transfer after both members arrived: the shorter of the two).
"""

from __future__ import annotations

import warnings
from functools import cache

import numpy as np
import pandas as pd

import tracegraph
from tests.test_ascend_prof import BUNDLE
from tracegraph import schema
from tracegraph.api import ProfileWarning
from tracegraph.whatif.ceilings import subject_of
from tracegraph.whatif.edits import Scale
from tracegraph.whatif.model import KIND, end, start
from tracegraph.whatif.predict import predict
from tracegraph.whatif.replay import MAX_ERROR
from tracegraph.whatif.subject import Subject


@cache
def result() -> tracegraph.Result:
    with warnings.catch_warnings():  # world's 4 members outside the bundle, as analyze says
        warnings.simplefilter("ignore", ProfileWarning)
        return tracegraph.analyze(BUNDLE, use_cache=False, progress=False, jobs=1)


def subject() -> Subject:
    return subject_of(result().analysis)


def measured_allreduce_ms() -> pd.Series:
    """Per step: the AllReduce of the member that arrived last (the shorter), ms."""
    graph, steps = subject().graph, subject().steps
    ops = np.flatnonzero(graph.kind == schema.COLLECTIVE)
    table = pd.DataFrame({"step": steps.table["step"].to_numpy()[steps.row[ops]],
                          "ms": (graph.end[ops] - graph.start[ops]) / 1e6})
    return table.groupby("step")["ms"].min()


def test_faster_collectives_never_predict_a_slower_step():
    """Every rank's every step: no slower with the collective at half its time than measured,
    none slower with it gone than at half (the replay drifted: 42 → 120 ms per step before)."""
    half = predict(subject(), [Scale("collective", 0.5)]).ranks()
    gone = predict(subject(), [Scale("collective", 0.0)]).ranks()
    slack = MAX_ERROR * half["measured_ms"]
    assert (half["predicted_ms"] <= half["measured_ms"] + slack).all(), half
    assert (gone["predicted_ms"] <= half["predicted_ms"] + slack).all(), gone


def test_removing_the_collective_saves_its_allreduce_each_step():
    steps = predict(subject(), [Scale("collective", 0.0)]).steps().set_index("step")
    expected = measured_allreduce_ms().reindex(steps.index)
    off = (steps["gain_ms"] - expected).abs()
    assert (off <= MAX_ERROR * steps["measured_ms"]).all(), pd.DataFrame(
        {"gain": steps["gain_ms"], "allreduce": expected})


def test_a_step_starts_every_lane_from_the_previous_step_end():
    """Each iteration after the first: the dropout and HCCL lanes' first ops hang off the op of
    the step before that ended last (on the main stream), not their own lane's last op."""
    model, graph, steps = subject().model, subject().graph, subject().steps
    tied = model.kind == KIND["step"]
    src, dst = model.src[tied] // 2, model.dst[tied] // 2
    assert (model.src[tied] == end(src)).all() and (model.dst[tied] == start(dst)).all()
    row = steps.row[dst]
    pairs = set(zip(steps.table["rank"].to_numpy()[row].tolist(),
                    steps.table["step"].to_numpy()[row].tolist(), graph.lane[dst].tolist(),
                    strict=True))
    side = {0: ("stream 4", "stream 13"), 1: ("stream 1", "stream 8")}
    assert pairs == {(r, s, lane) for r, lanes in side.items() for s in range(2, 11)
                     for lane in lanes}
    main = {0: "stream 2", 1: "stream 4"}
    assert all(graph.lane[op] == main[int(graph.rank[op])] for op in src)
    previous = steps.table["step"].to_numpy()[steps.row[src]]
    assert (previous == steps.table["step"].to_numpy()[row] - 1).all()


def test_the_hccl_wait_is_tied_to_the_gradients_record():
    """Rank 0, iteration 2: the HCCL stream's EVENT_WAIT (93.995 ms) waited for the main
    stream's EVENT_RECORD at 93.973 ms, 22 µs before it (read by hand)."""
    model, graph = subject().model, subject().graph
    origin = result().analysis.origin
    at = (graph.start - origin) / 1e6
    wait = int(np.flatnonzero((graph.rank == 0) & (graph.lane == "stream 13")
                              & (graph.kind == schema.WAIT) & (np.abs(at - 93.995) < 0.001))[0])
    tied = (model.kind == KIND["event_wait"]) & (model.dst == start(wait))
    [record] = model.src[tied] // 2
    assert (graph.lane[record], graph.kind[record]) == ("stream 2", schema.RECORD)
    assert abs(at[record] - 93.973) < 0.001


def test_the_verdict_counts_every_share_on_the_headline_step():
    """Shares and ms per step on one basis: each cause's ms is its share of the headline
    (median) step, the stalled ms likewise, and the shares add up to no more than the stalled
    share; the collective's ms is a typical step's, not the mean with the 57 ms warm-up."""
    verdict = result().verdict
    step_ms = verdict["step_ms"]
    assert step_ms == round(float(np.median([s["ms"] for s in verdict["steps"]])), 3)
    for cause in verdict["causes"]:
        assert abs(cause["ms"] - cause["share"] * step_ms) <= 0.001 + 1e-4 * step_ms, cause
    assert abs(verdict["stalled_ms"] - verdict["stalled_share"] * step_ms) <= 0.001
    assert sum(c["share"] for c in verdict["causes"]) <= verdict["stalled_share"] + 1e-3
    [collective] = [c for c in verdict["causes"] if c["category"] == "collective"]
    typical = measured_allreduce_ms().drop(1)
    assert typical.min() <= collective["ms"] <= typical.max() + 1.0, (collective, typical)
    assert abs(verdict["fix"]["gain_ms"] - float(np.median(measured_allreduce_ms()))) <= \
        MAX_ERROR * step_ms, verdict["fix"]
