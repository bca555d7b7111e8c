"""Bubble blame and matching on real profiles, checked against what was read in them by hand.

real_traces/README.md: in gloo_pp2_dp2 rank 1 sleeps 200 ms (`straggler_sleep`) before its DP
all_reduce; ranks 0 and 2 wait ≈203 ms inside `MOE a2a`, rank 3 ≈205 ms in its DP all_reduce.
gloo_pp2_dp2_fixed is the same job without the sleep. In torch_npu_ddp8_level1 every long
EVENT_WAIT on compute stream 2 is a `work.wait()` on an `hcom_allReduce` on stream 4.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from tracegraph import causes, schema
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.summary import summarize


@pytest.fixture(scope="module")
def gloo(real: Path, tmp_path_factory) -> Analysis:
    cache = tmp_path_factory.mktemp("cache")
    return analyze(tracegraph.load(real / "kineto/gloo_pp2_dp2", cache_dir=cache))


def test_rank1_sleep_is_the_root_of_the_long_waits(gloo: Analysis) -> None:
    long = [b for b in gloo.bubbles if b.dur > 150e6]
    assert {b.rank for b in long} == {0, 2, 3}
    assert {b.step for b in long} == {2, 3}
    for bubble in long:
        assert bubble.root.rank == 1 and bubble.root.name == "straggler_sleep"
        assert bubble.category == causes.COMPUTE_STRAGGLER
        assert bubble.by_category()[causes.COMPUTE_STRAGGLER] > 0.9 * bubble.dur
        assert bubble.chain()[-1] == 1
    assert gloo.slow_ranks == {1}


def test_the_waits_are_where_the_readme_says(gloo: Analysis) -> None:
    step2 = {b.rank: b for b in gloo.bubbles if b.step == 2 and b.dur > 150e6}
    assert step2[0].name == step2[2].name == "MOE a2a"
    assert step2[3].name == "OPT step"  # inside its DP all_reduce with rank 1
    assert 195e6 < step2[0].dur < 210e6 and 195e6 < step2[3].dur < 212e6


def test_fixed_job_has_no_long_bubble(real: Path, tmp_path: Path) -> None:
    fixed = analyze(tracegraph.load(real / "kineto/gloo_pp2_dp2_fixed", cache_dir=tmp_path))
    assert fixed.bubbles, "the fixed job still has small pipeline waits"
    assert max(b.dur for b in fixed.bubbles) < 10e6
    steps = fixed.steps.groupby("step").apply(lambda s: (s["end"] - s["start"]).max())
    assert steps.max() < 25e6  # README: step ≈ 18 ms
    assert fixed.slow_ranks == set()  # no rank sleeps: no straggler (stage 0 was named before)


@pytest.fixture(scope="module")
def ddp8(real: Path, tmp_path_factory) -> Analysis:
    cache = tmp_path_factory.mktemp("cache")
    return analyze(tracegraph.load(real / "ascend/torch_npu_ddp8_level1", cache_dir=cache))


def long_waits(analysis: Analysis) -> pd.DataFrame:
    """The ops of the stream waits longer than 1 ms."""
    frame = analysis.ops.frame
    return frame[(frame["kind"] == schema.WAIT) & (frame["end"] - frame["start"] > 1e6)]


def assert_released_by_allreduces(analysis: Analysis, prefix: str) -> None:
    """Each long wait matched by the timing rule to a record on another stream, right after an
    all-reduce named `prefix...` (back-to-back records are equivalent), within 5 µs."""
    frame, matches, prev = analysis.ops.frame, analysis.matches, analysis.ops.lane_prev()
    for i, row in long_waits(analysis).iterrows():
        record = matches.dep[i]
        assert matches.how[i] == "timing" and frame.at[record, "kind"] == schema.RECORD
        assert frame.at[record, "stream"] != row["stream"]
        producer = prev[record]
        while frame.at[producer, "kind"] == schema.RECORD:
            producer = prev[producer]
        assert frame.at[producer, "name"].startswith(prefix)
        assert 0 <= row["end"] - frame.at[producer, "end"] < 5_000


def assert_clocks_aligned(analysis: Analysis) -> None:
    """Two ranks whose same collective ends ≈1-80 µs apart (a clock offset, README): the offset
    is estimated, and removing it ends every matched instance within 10 µs."""
    offset = analysis.offsets[1] - analysis.offsets[0]
    assert 1_000 < abs(offset) < 80_000
    frame = analysis.ops.frame
    for ops in analysis.matches.instances["ops"]:
        ends = [frame.at[i, "end"] - analysis.offsets[int(frame.at[i, "rank"])] for i in ops]
        assert max(ends) - min(ends) < 10_000


def test_each_long_event_wait_is_matched_to_its_allreduce(ddp8: Analysis) -> None:
    assert len(long_waits(ddp8)) == 8  # four work.wait() stalls per rank (65.6, 2.1, 2.1,
    # 21.9 ms), by hand
    assert_released_by_allreduces(ddp8, "hcom_allReduce__586_")


def test_clock_offset_between_the_two_ranks(ddp8: Analysis) -> None:
    assert_clocks_aligned(ddp8)


def test_long_waits_are_charged_to_the_allreduce(ddp8: Analysis) -> None:
    long = [b for b in ddp8.bubbles if b.name == "EVENT_WAIT" and b.dur > 2e6]
    assert len(long) == 8
    for bubble in long:  # the profile does not say the group is DP: no category assumed
        assert bubble.category == causes.COLLECTIVE
        assert bubble.root.name.startswith("hcom_allReduce__586_")


def test_sampled_traces_are_flagged_unsafe_for_order_matching(real: Path, tmp_path: Path) -> None:
    trace = tracegraph.load(real / "kineto/hta/trace_filter", cache_dir=tmp_path)
    analysis = analyze(trace)
    assert any("unsafe" in w for w in analysis.warnings)
    assert not analysis.matches.instances["safe"].all()
    # its gaps may be kernels the sampler dropped: no verdict on it is more than low
    assert analysis.bubbles and {b.sureness for b in analysis.bubbles} == {"low"}
    # and so is the step's critical path (its "late launches" may be lost launch/kernel pairs:
    # every launch left has its kernel); no gain ceiling is replayed on such a graph
    summary = summarize(analysis)
    assert all("sub-sampled" in path["caveat"] for path in summary["critical_path"].values())
    assert summary["gain_ceilings"]["causes"] == []
    assert "sub-sampled" in summary["gain_ceilings"]["refused"][0]


def test_critical_path_runs_through_the_sleep(gloo: Analysis) -> None:
    for path in gloo.critical_paths.values():
        on_sleep = sum(s.end - s.start for s in path
                       if s.rank == 1 and s.name == "straggler_sleep")
        assert on_sleep > 190e6  # the 200 ms sleep holds the step
        assert {s.category for s in path if s.name == "straggler_sleep"} == {
            causes.COMPUTE_STRAGGLER}


def test_check_and_analyze_name_the_same_dimension(ddp8: Analysis) -> None:
    """ddp8's HCCL group states no parallel dimension: blame charges its all-reduces to
    `collective`, so the overlap table (diff, min_overlap) calls them `collective` too, never
    `dp`, and a DP overlap check has nothing to test."""
    from tracegraph.verify import metrics
    from tracegraph.verify.checks import Rule, evaluate

    dims = metrics.comm_dims(ddp8)
    charged = {i.op: i.category for b in ddp8.bubbles for i in b.intervals
               if ddp8.ops.frame.at[i.op, "kind"] == schema.COLLECTIVE}
    assert charged and set(charged.values()) == {causes.COLLECTIVE}
    assert {dims[op] for op in charged} == {"collective"}
    assert set(dims[dims != ""]) == {"collective"}
    assert set(metrics.overlap_ratios(ddp8)) == {"collective"}
    (overlap,) = evaluate([Rule("min_overlap", {"dim": "dp", "ratio": 0.25})], ddp8)
    assert overlap.status == "not_applicable"


@pytest.fixture(scope="module")
def mi300(real: Path, tmp_path_factory) -> Analysis:
    cache = tmp_path_factory.mktemp("cache")
    return analyze(tracegraph.load(real / "kineto/tracelens/mi300", cache_dir=cache))


def test_a_first_step_starts_when_the_device_reaches_it(mi300: Analysis, real: Path,
                                                        tmp_path: Path) -> None:
    """The MI300X trace (read by hand): ProfilerStep#15–17 on the host last 16.8 / 16.0 / 15.9
    ms; the GPU runs ~30 ms behind, so the trace opens with kernels launched before profiling
    began (no hipLaunchKernel for their correlation ids) until the first kernel step 15
    launched starts. Each step as the device ran it is then ≈ 19 ms, the first one too (it
    was 49 ms, the backlog counted in); and the queue-length trace's first step likewise."""
    steps = mi300.step_table().set_index("step")["ms"]
    assert list(steps.index) == [15, 16, 17]
    assert all(18.0 < ms < 19.5 for ms in steps)
    first = analyze(tracegraph.load(real / "kineto/hta/negative_queue_length_values_check",
                                    cache_dir=tmp_path)).step_table()["ms"]
    assert first.iloc[0] < 1.05 * first.iloc[1:].max()


def test_analyze_shows_one_step_time_per_step(real: Path, tmp_path: Path) -> None:
    """The inventory's step times are the step tables' (the device's); the host markers stay
    in the JSON as host_steps."""
    import json

    from tests.test_checks import run_cli

    run = run_cli("analyze", real / "kineto/tracelens/mi300", "--json", "--cache-dir", tmp_path)
    summary = json.loads(run.stdout)
    [rank] = summary["ranks"]
    assert rank["steps"] == {str(s["step"]): s["time_ms"]["0"] for s in summary["steps"]}
    assert rank["host_steps"] == {"15": 16.799, "16": 15.951, "17": 15.887}
    text = run_cli("analyze", real / "kineto/tracelens/mi300", "--cache-dir", tmp_path,
                   "--inventory").stdout
    assert "#15: 19.0" in text and "16.8" not in text


def test_a_wait_the_host_issued_gates_the_next_launch(mi300: Analysis) -> None:
    """The MI300X trace has 24 hipStreamWaitEvent calls and no device-side wait: each is
    followed by a launch onto the stream told to wait (12 RCCL kernels on stream 4, 12 copies
    on stream 0). Compute stream 0's long idles are its waits on the all-reduce before them,
    by host call order and their ends (medium), not a guess that both streams share one queue
    (low): each copy starts after an RCCL kernel launched before the call ends (9 of the 12
    within 30 µs, the others 0.18 ms)."""
    edges = mi300.graph.edges
    waits = edges[edges["kind"] == "host_wait"]
    frame = mi300.ops.frame
    assert len(waits) == 24
    assert sorted(frame.loc[waits["dst"], "lane"].astype(str).value_counts().items()) == [
        ("stream 0", 12), ("stream 4", 12)]
    on_copy = waits[frame.loc[waits["dst"], "lane"].to_numpy() == "stream 0"]
    assert set(frame.loc[on_copy["src"], "name"].str.startswith("ncclDevKernel")) == {True}
    gap = mi300.start[on_copy["dst"]] - mi300.end[on_copy["src"]]
    assert ((gap > 0) & (gap < 200_000)).all() and (gap < 30_000).sum() == 9
    long = [b for b in mi300.bubbles if b.dur > 5e6]
    assert len(long) == 3
    for bubble in long:
        assert bubble.category == causes.COLLECTIVE and bubble.sureness == "medium"
        assert "stream wait the host issued" in bubble.evidence
    assert not (edges["kind"] == "shared_queue").any()


@pytest.mark.parametrize("bundle", ["kineto/tracelens/mi300", "kineto/hta/critical_path/alexnet",
                                    "kineto/hta/nccl_parser_config"])
def test_a_rank_alone_waits_on_no_peer(real: Path, tmp_path: Path, bundle: str) -> None:
    """One rank in the bundle, no pipeline: compute it or its critical path waited for is its
    own, never a peer's."""
    analysis = analyze(tracegraph.load(real / bundle, cache_dir=tmp_path))
    charged = {i.category for b in analysis.bubbles for i in b.intervals}
    on_path = {s.category for path in analysis.critical_paths.values() for s in path
               if s.kind == "compute"}
    assert causes.PEER_COMPUTE not in charged | on_path
    assert on_path <= {causes.OWN_COMPUTE}
    assert on_path or bundle.endswith("alexnet")  # its path: the host launching late only
