"""A rank whose profile was cut (the events after the cut lost, its waits' releasers among them)
is marked as missing events: it is judged against no peer, and what passes through it is no
surer than the data. gloo_pp2_dp2 with rank2.json cut to 150 KB (the tool then refuses to match
group 0's collectives by order): rank 2's `MOE a2a`, a 203 ms wait on rank 1's 200 ms
straggler_sleep in the whole bundle, was counted as 24 ms of rank 2's straggling compute with
high confidence. Damaged copies of the real profiles, written under tmp_path."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import tracegraph
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.bubbles import SAMPLED
from tracegraph.verdict import verdict

CUT = "rank2.json: truncated JSON, kept the"


@pytest.fixture(scope="module")
def cut(real: Path, tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    bundle = Path(shutil.copytree(real / "kineto/gloo_pp2_dp2",
                                  tmp_path_factory.mktemp("cut") / "gloo",
                                  copy_function=shutil.copyfile))
    with (bundle / "rank2.json").open("r+b") as file:
        file.truncate(150_000)
    return analyze(tracegraph.load(bundle, use_cache=False))


def test_the_cut_rank_is_marked_missing_events_and_judged_against_no_peer(cut: Analysis
                                                                           ) -> None:
    assert cut.trace.incomplete_ranks()[2].startswith(CUT)
    assert cut.peers.unjudged[2].startswith(f"its profile misses events: {CUT}")
    assert 2 not in set(cut.step_stragglers["rank"]) and 2 not in cut.slow_ranks


def test_a_wait_of_the_cut_rank_is_no_straggling_compute(cut: Analysis) -> None:
    frame = cut.ops.frame
    waits = np.flatnonzero((frame["rank"] == 2).to_numpy() & (frame["name"] == "MOE a2a")
                           .to_numpy())
    assert len(waits) and not cut.slow_op[waits].any()
    assert not any(seg.rank == 2 and seg.category == "compute_straggler"
                   for path in cut.critical_paths.values() for seg in path)


def test_what_passes_through_the_cut_rank_is_capped(cut: Analysis) -> None:
    through = [b for b in cut.bubbles if 2 in b.chain()]
    assert through and all(b.sureness == "low" for b in through)
    assert all(b.evidence.startswith("rank 2's profile misses events") for b in through)


def test_own_straggling_is_no_surer_than_the_matching(real: Path, cut: Analysis) -> None:
    """Order matching refused: rank 1's straggling on a step's critical path is low, saying
    why; on the whole bundle it is measured and high."""
    assert cut.sampled and cut.straggling_sureness(1) == ("low", SAMPLED)
    whole = analyze(tracegraph.load(real / "kineto/gloo_pp2_dp2", use_cache=False))
    assert whole.straggling_sureness(1) == ("high", "its own ops against its peers' median")


def test_the_verdicts_straggler_is_no_surer_than_the_matching(cut: Analysis) -> None:
    """The verdict's compute_straggler (rank 1's sleep, on the steps' critical paths) says the
    matching was refused, where the cut once made it high."""
    [straggler] = [c for c in verdict(cut)["causes"] if c["category"] == "compute_straggler"]
    assert {o["rank"] for o in straggler["origins"]} == {1}
    assert (straggler["confidence"], straggler["evidence"]) == ("low", SAMPLED)


def test_a_truncated_ascend_timeline_marks_its_rank(real: Path, tmp_path: Path) -> None:
    bundle = Path(shutil.copytree(real / "ascend/torch_npu_ddp8_level1", tmp_path / "ddp8",
                                  copy_function=shutil.copyfile))
    view = bundle / "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"
    with view.open("r+b") as file:
        file.truncate(view.stat().st_size // 2)
    trace = tracegraph.load(bundle, use_cache=False)
    assert set(trace.incomplete_ranks()) == {0}
    assert "trace_view.json: truncated; kept the" in trace.incomplete_ranks()[0]
