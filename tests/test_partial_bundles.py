"""Bundles that lack part of the job: a pipeline rank absent, no step markers.

Known answers: the seed sample's ground truth (PP4 × VPP2 × 16 microbatches, stage s = rank
4096·s, its schedule) with rank 8192's profile removed from the archive; the HTA trace
`critical_path/cuda_event_sync_multi_stream`, read by hand: one rank, no `ProfilerStep#N`
event, its CPU ops from 0 to 19.6 ms, four kernels of ~0.1 ms each on streams 20, 24 and 28.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

import tracegraph
from tests.conftest import SAMPLES
from tests.ground_truth_eval import labelled_right
from tests.test_checks import run_cli
from tracegraph.analysis import pipeline
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.findings import stage_of
from tracegraph.loading.steps import NO_STEPS
from tracegraph.simulate import truth_pipeline
from tracegraph.verdict import verdict
from tracegraph.whatif.ceilings import gain_ceilings

SEED = SAMPLES / "simulated" / "hsdp-straggler-sync-ascend.tar.gz"
TRUTH = SEED.with_name("hsdp-straggler-sync-ascend.ground_truth.json")


@pytest.fixture(scope="module")
def without_8192(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed bundle with stage 2 (rank 8192, the folder holding profiler_info_8192.json)
    taken out."""
    folder = tmp_path_factory.mktemp("seed")
    with tarfile.open(SEED) as archive:
        archive.extractall(folder, filter="data")
    [info] = folder.rglob("profiler_info_8192.json")
    for path in sorted(info.parent.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    info.parent.rmdir()
    return folder


@pytest.fixture(scope="module")
def analysed(without_8192: Path):
    return analyze(tracegraph.load(without_8192, use_cache=False))


def test_the_absent_pipeline_rank_is_named_first(analysed) -> None:
    """8192 is the peer of 4096's and 12288's P2P ops and a member of their pp groups: the
    warning names it before the 381 absent HSDP members."""
    [said] = [w for w in analysed.trace.warnings if "absent from the bundle" in w]
    assert said.startswith("382 rank(s) that the groups' stated members name are absent from "
                           "the bundle: 8192 (of its pipeline: peers of its P2P ops or members "
                           "of its pipeline groups); and 32, 64,")


def test_stages_come_from_the_layout_not_from_who_is_present(analysed) -> None:
    """12288 stays stage 3 with stage 2 absent: in the findings' stages and the schedule, whose
    blocks on the ranks present are labelled as the simulator ran them."""
    assert stage_of(analysed) == {0: 0, 4096: 1, 12288: 3}
    found = pipeline.recover(analysed)
    assert found.reason == ""
    assert dict(found.blocks.groupby("rank")["stage"].first()) == {0: 0, 4096: 1, 12288: 3}
    ratio = found.bubble_ratio(found.steps[0])
    assert (ratio.stages, ratio.chunks, ratio.microbatches) == (4, 2, 16)
    truth = truth_pipeline.from_timeline(analysed, truth_pipeline.timeline_from_truth(TRUTH))
    present = truth.blocks["rank"].isin([0, 4096, 12288]).mean()
    assert labelled_right(truth, found) == pytest.approx(present)  # every present block


def test_ceilings_that_add_up_to_less_than_removing_all_say_so(analysed) -> None:
    """Without 8192 the replay's causes stand in for each other (one removed alone, another still
    holds the step): removing them all together gains more than the sum of their single
    ceilings (603.0 against 584.4 ms as measured). The rule says so, with the numbers."""
    ceilings = gain_ceilings(analysed)
    single = sum(c["ceiling_ms"] for c in ceilings["causes"] if c["ceiling_ms"] is not None)
    assert ceilings["together"]["ceiling_ms"] > single + 1
    assert ceilings["rule"].startswith(
        f"removing every cause together saves {ceilings['together']['ceiling_ms']:.1f} ms, "
        f"more than the sum {single:.1f} ms of the single ceilings")
    alone = max(c["ceiling_ms"] for c in ceilings["causes"] if c["ceiling_ms"] is not None)
    little = alone < 0.5 * ceilings["together"]["ceiling_ms"]  # no one fix gains half of it
    assert ("a fix of one gains little" in ceilings["rule"]) == little


def test_no_step_markers_analyses_the_whole_span_and_says_so(real: Path, tmp_path: Path
                                                             ) -> None:
    bundle = real / "kineto/hta/critical_path/cuda_event_sync_multi_stream"
    result = run_cli("analyze", bundle, "--json", "--cache-dir", tmp_path)
    summary = json.loads(result.stdout)
    assert NO_STEPS in summary["warnings"]
    [step] = summary["steps"]
    assert step["step"] == -1 and step["max_ms"] == pytest.approx(19.6, abs=0.05)
    assert summary["critical_path"]["-1"]["length_ms"] == pytest.approx(step["max_ms"], abs=0.01)
    text = run_cli("analyze", bundle, "--cache-dir", tmp_path).stdout
    assert "the whole trace (no step markers)" in " ".join(text.split())
    detail = run_cli("analyze", bundle, "--detail", "--cache-dir", tmp_path).stdout
    assert "whole span (no step markers)" in " ".join(detail.split())
    assert "no bubbles: no stall of 1 ms or more on any rank's main compute lane" in text


@pytest.fixture(scope="module")
def without_rank_3(tmp_path_factory: pytest.TempPathFactory):
    """The real gloo PP2 × DP2 job (rank 1 sleeps 200 ms before its DP all_reduce; ranks 0 and
    2 wait for it ~203 ms in the MOE all_to_all over all ranks) without rank 3, rank 1's DP
    peer and a member of every group rank 1 is in."""
    folder = tmp_path_factory.mktemp("gloo")
    for path in (SAMPLES / "gloo_pp2_dp2").glob("rank[012].json"):
        (folder / path.name).write_bytes(path.read_bytes())
    return analyze(tracegraph.load(folder, use_cache=False))


def test_a_collectives_late_member_is_no_pipeline_fill_when_its_peer_is_absent(
        without_rank_3) -> None:
    """Nothing is left to judge rank 1 a straggler by, but the waits reach its sleep through
    the all_to_all, not through the pipeline, so they are a peer's compute, never its fill."""
    waits = [b for b in without_rank_3.bubbles
             if b.rank in (0, 2) and b.name == "MOE a2a" and b.dur > 150e6]
    assert len(waits) == 4  # ranks 0 and 2, steps 2 and 3
    for bubble in waits:
        assert (bubble.root.rank, bubble.root.name) == (1, "straggler_sleep")
        assert bubble.category == "peer_compute"
        assert "pipeline_fill" not in {c.category for c in bubble.listed_causes()}


def test_whom_to_profile_names_each_group_once(without_rank_3) -> None:
    """The world group's absent member was waited on in P2P, the all_to_all and an all_reduce:
    the advice names the group once, with those waits together."""
    said = verdict(without_rank_3)
    named = [g["group"] for g in said["profile"]]
    assert sorted(named) == sorted(set(named)) and {"0", "2"} <= set(named)
    assert all(g["ranks"] == [3] for g in said["profile"])
