"""The vectorized pieces of the analysis agree with the plain per-element definitions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import tracegraph
from tests.conftest import SAMPLES
from tracegraph.analysis.stragglers import median_of_others
from tracegraph.graph.ops import STRING_COLUMNS, build_ops, restore_strings, shared_strings


def test_median_of_others_matches_dropping_each_element() -> None:
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(40), rng.integers(1, 7, 40))
    values = rng.integers(0, 5, len(groups)) * 1_000  # many ties
    got = median_of_others(values, groups)
    frame = pd.DataFrame({"g": groups, "v": values})
    for i, (g, _) in enumerate(zip(groups, values, strict=True)):
        others = frame[(frame["g"] == g) & (frame.index != i)]["v"]
        expected = others.median() if len(others) else np.nan
        assert (np.isnan(expected) and np.isnan(got[i])) or got[i] == expected


def test_ops_keep_the_traces_string_dtype() -> None:
    """Ops hold strings as the trace does (Categoricals, its categories in its order); a lane
    name the trace lacks (a comm op placed on the stream it names) is a category added last."""
    trace = tracegraph.load(SAMPLES / "simulated" / "pp-compute-straggler-ascend.tar.gz",
                            use_cache=False)
    frame = build_ops(trace.events).frame
    for column in STRING_COLUMNS:
        mine, theirs = frame[column].dtype.categories, trace.events[column].dtype.categories
        assert mine[:len(theirs)].equals(theirs), column
        assert set(mine[len(theirs):]) <= set(frame[column]), column
        source = trace.events[column].reindex(frame["event"]).to_numpy()
        kept = frame[column].to_numpy() == source
        assert kept.all() or column == "lane", column


def test_restored_categories_grow_by_what_they_lack() -> None:
    dtype = pd.CategoricalDtype(["b", "a"])
    back = restore_strings(pd.Series(["a", "c", None, "a"], dtype=object), dtype)
    assert list(back.cat.categories) == ["b", "a", "c"]
    assert back.tolist()[:2] == ["a", "c"] and pd.isna(back[2]) and back[3] == "a"


def test_shared_strings_round_trip_with_missing_values() -> None:
    column = pd.Series(["a", None, "b", "a"], dtype="string[pyarrow]")
    shared = shared_strings(column)
    assert shared.dtype == object and shared[0] is shared[3] and shared[1] is None
    back = restore_strings(shared, column.dtype)
    assert back.dtype == column.dtype and back.isna().tolist() == [False, True, False, False]
    assert back.dropna().tolist() == ["a", "b", "a"]


def test_launch_times_are_the_earliest_host_call_exactly(real: Path) -> None:
    """Each device op's launch is the earliest host call sharing its (rank, correlation), to
    the nanosecond: epoch times (~1.7e18 ns) do not survive a float, as a group-by with a
    reindex returned them."""
    trace = tracegraph.load(real / "kineto/hta/negative_queue_length_values_check",
                            use_cache=False)
    frame = build_ops(trace.events).frame
    events = trace.events
    calls = events[(events["lane_kind"] == "thread") & (events["kind"] == "host")
                   & (events["correlation"] >= 0)]
    earliest: dict[tuple[int, int], int] = {}
    for rank, corr, start in zip(calls["rank"], calls["correlation"], calls["start_ns"],
                                 strict=True):
        key = (int(rank), int(corr))
        earliest[key] = min(earliest.get(key, start), int(start))
    device = frame["lane"].astype(str).str.startswith("stream ") & (frame["correlation"] >= 0)
    expected = [earliest.get((int(r), int(c)), -1) if d else -1 for r, c, d in
                zip(frame["rank"], frame["correlation"], device, strict=True)]
    assert (np.array(expected) >= 10**18).sum() > 1000  # epoch times, many launches
    assert frame["launch"].tolist() == expected
