"""Findings on simulated bundles whose injected cause is known (ground truth), in both formats,
and their absence on a control: exposed EP all-to-all, serialized streams, stage memory, and
the stage reductions' overlap of the seed case before and after its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import tracegraph
from reports.html import render
from tests.conftest import SAMPLES
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.findings import find_all, stage_memory, stage_of
from tracegraph.analysis.findings.exposed import exposed_table
from tracegraph.analysis.overlap import reduction_overlap
from tracegraph.analysis.pipeline import recover
from tracegraph.cli.app import app
from tracegraph.simulate import simulate
from tracegraph.simulate.bundle_writer import write_bundle
from tracegraph.verify.checks import Rule, evaluate
from tracegraph.whatif.ceilings import gain_ceilings

FORMATS = ("ascend", "kineto")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory):
    """scenario -> (ground truth, {format: (archive, analysis)}), built once per module."""
    made = {}

    def get(name: str):
        if name not in made:
            timeline = simulate(name)
            out = tmp_path_factory.mktemp(name)
            runs = {}
            for fmt in FORMATS:
                archive = write_bundle(timeline, out / f"{name}-{fmt}.tar.gz", fmt)
                runs[fmt] = (archive, analyze(tracegraph.load(archive, use_cache=False)))
            made[name] = (timeline.ground_truth, runs)
        return made[name]
    return get


def kinds(analysis) -> dict[str, object]:
    return {f.kind: f for f in find_all(analysis)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_exposed_all_to_all_matches_the_injected_overlap(bundles, fmt: str) -> None:
    truth, runs = bundles("ep-a2a-overlap")
    analysis = runs[fmt][1]
    table = exposed_table(analysis, stage_of(analysis)).set_index(["rank", "dim"])
    steps = 2
    for rank, dims in truth["overlap"].items():
        expected = dims["ep"]["exposed_ms"] / steps
        assert table.loc[(int(rank), "ep"), "exposed_ms"] == pytest.approx(expected, rel=0.05)
        assert table.loc[(int(rank), "ep"), "comm_ms"] == pytest.approx(
            dims["ep"]["comm_ms"] / steps, rel=0.05)
    finding = kinds(analysis)["exposed_comm"]
    hidden = finding.evidence["by_dim"]["ep"]["hidden_share"]
    total = {k: sum(d["ep"][k] for d in truth["overlap"].values())
             for k in ("comm_ms", "exposed_ms")}
    assert hidden == pytest.approx(1 - total["exposed_ms"] / total["comm_ms"], abs=0.02)
    assert 0.5 < hidden < 0.9  # combined 1F1B hides most of it, the late rank's peers not all


@pytest.mark.parametrize("fmt", FORMATS)
def test_serialized_streams_found_with_their_cost(bundles, fmt: str) -> None:
    truth, runs = bundles("serialized-streams")
    analysis = runs[fmt][1]
    finding = kinds(analysis)["serialized_streams"]
    assert finding.evidence["ranks"] == sorted(s["rank"] for s in truth["serialized"])
    assert all(p["concurrent_ms"] == 0 for p in finding.evidence["pairs"])
    assert {(p["main"], p["comm"]) for p in finding.evidence["pairs"]} == {
        ("stream 7", "stream 32")}
    exposed = max(d["ep"]["exposed_ms"] for d in truth["overlap"].values()) / 2
    assert finding.evidence["exposed_ms_per_step"] == pytest.approx(exposed, rel=0.05)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in finding.suggestion
    [check] = evaluate([Rule("no_serialized_streams", {})], analysis)
    assert check.status == "fail" and {v.rank for v in check.violations} == set(
        finding.evidence["ranks"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_serialization_in_the_overlapped_control(bundles, fmt: str) -> None:
    _, runs = bundles("ep-a2a-overlap")
    analysis = runs[fmt][1]
    assert "serialized_streams" not in kinds(analysis)
    [check] = evaluate([Rule("no_serialized_streams", {})], analysis)
    assert check.status == "pass"


@pytest.mark.parametrize("fmt", FORMATS)
def test_stage_memory_against_the_injected_profile(bundles, fmt: str) -> None:
    truth, runs = bundles("pp-memory")
    analysis = runs[fmt][1]
    finding = kinds(analysis)["stage_memory"]
    memory = truth["memory"]
    peaks = {int(r): m["peak_bytes"] for r, m in memory.items()}
    rows = {r["rank"]: r for r in finding.evidence["per_rank"]}
    for rank, peak in peaks.items():
        assert rows[rank]["peak"] == pytest.approx(peak, rel=0.05)
        assert rows[rank]["stage"] == memory[str(rank)]["stage"]
    order = sorted(rows, key=lambda r: -rows[r]["peak"])
    assert order == sorted(peaks, key=lambda r: -peaks[r]) == [0, 1, 2, 3]  # first stage most
    imbalance = max(peaks.values()) / min(peaks.values()) - 1
    assert finding.evidence["imbalance"] == pytest.approx(imbalance, rel=0.05)
    assert finding.severity == "warning"
    # activations in flight: p - r microbatches, as 1F1B expects and the model injected
    in_flight = [memory[str(r)]["peak_in_flight"] for r in range(4)]
    assert finding.evidence["expected_in_flight"] == in_flight == [4, 3, 2, 1]
    held = [rows[r]["activations"] / rows[0]["activations"] * 4 for r in range(4)]
    assert held == pytest.approx(in_flight, rel=0.01)
    if fmt == "kineto":  # deviceProperties state the capacity: 24 GiB
        assert finding.evidence["closest_rank"] == 0
        assert finding.evidence["closest_share"] == pytest.approx(
            rows[0]["reserved"] / (24 * 2**30), abs=1e-4)
    [check] = evaluate([Rule("max_stage_memory_imbalance", {"ratio": 0.1})], analysis)
    assert check.status == "fail" and check.value == pytest.approx(imbalance, rel=0.05)


def test_stage_memory_is_the_same_from_the_db_export(bundles, tmp_path: Path) -> None:
    """`pp-memory` written as a `.db` export (MEMORY_RECORD) and as text (memory_record.csv):
    the same memory rows, and so the same stage-memory finding, number for number."""
    _, runs = bundles("pp-memory")
    text = runs["ascend"][1]
    archive = write_bundle(simulate("pp-memory"), tmp_path / "pp-memory-db.tar.gz", "ascend",
                           "db")
    trace = tracegraph.load(archive, use_cache=False)
    assert set(trace.ranks["format"]) == {"ascend_db"}
    columns = list(trace.memory.columns)
    same = [m.sort_values(columns, ignore_index=True) for m in (trace.memory, text.trace.memory)]
    assert len(same[0]) == 2 * 33 * 4  # MindSpore and MindSpore+GE after each of 33 events
    pd.testing.assert_frame_equal(*same)
    found, expected = kinds(analyze(trace))["stage_memory"], kinds(text)["stage_memory"]
    assert found.evidence == expected.evidence and found.evidence["imbalance"] > 0.1
    assert (found.title, found.lines, found.severity) == (
        expected.title, expected.lines, expected.severity)


@pytest.mark.parametrize("fmt", FORMATS)
def test_stage_memory_of_the_recovered_interleaved_pipeline(bundles, fmt: str) -> None:
    """`vpp` (PP4 × VPP2, 16 microbatches, no annotations): with the pipeline recovered from
    op order, the expectation is interleaved 1F1B's ((p − r − 1)·2 + (v − 1)·p + 1)/v chunks of
    activations in flight, the model's peaks (11, 9, 7, 5 chunks) halved."""
    truth, runs = bundles("vpp")
    analysis = runs[fmt][1]
    found = {f.kind: f for f in find_all(analysis, recover(analysis))}["stage_memory"]
    in_flight = [truth["memory"][str(r)]["peak_in_flight"] / 2 for r in range(4)]
    assert found.evidence["chunks"] == 2
    assert found.evidence["expected_in_flight"] == in_flight == [5.5, 4.5, 3.5, 2.5]
    rows = {r["rank"]: r for r in found.evidence["per_rank"]}
    held = [rows[r]["activations"] / rows[0]["activations"] * 5.5 for r in range(4)]
    assert held == pytest.approx(in_flight, rel=0.05)


def test_no_stage_memory_without_a_memory_profile(bundles) -> None:
    _, runs = bundles("ep-a2a-overlap")
    analysis = runs["ascend"][1]
    assert stage_memory.finding(analysis, stage_of(analysis)) is None
    [check] = evaluate([Rule("max_stage_memory_imbalance", {"ratio": 0.1})], analysis)
    assert check.status == "not_applicable" and "profile_memory" in check.reason


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_stage_reductions_overlap_only_after_the_fix(fmt: str, cache_dir: Path) -> None:
    ratios = {}
    for mode in ("sync", "async"):
        bundle = SAMPLES / "simulated" / f"hsdp-straggler-{mode}-{fmt}.tar.gz"
        analysis = analyze(tracegraph.load(bundle, cache_dir=cache_dir))
        table = reduction_overlap(analysis)
        assert len(table) == 8  # 4 stages x 2 chunks: one stage reduction each
        ratios[mode] = float(table["overlap_ms"].sum() / table["ms"].sum())
        finding = kinds(analysis)["exposed_comm"]
        assert len(finding.evidence["stage_reductions"]) == 8
    assert ratios["sync"] < 0.01  # the reduction blocks stream 47: nothing computes meanwhile
    assert ratios["async"] > 0.5  # on its own stream, under the later chunks' compute


def test_findings_in_json_terminal_and_html(bundles) -> None:
    _, runs = bundles("serialized-streams")
    archive, analysis = runs["kineto"]
    run = CliRunner().invoke(app, ["analyze", str(archive), "--json", "--no-cache"])
    assert run.exit_code == 0, run.output
    found = {f["kind"]: f for f in json.loads(run.output)["findings"]}
    assert found["serialized_streams"]["severity"] == "warning"
    assert found["serialized_streams"]["evidence"]["ranks"] == list(range(8))
    text = CliRunner().invoke(app, ["analyze", str(archive), "--no-cache"]).output
    assert "findings:" in text and "never ran together" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in text
    html = render(analysis)
    assert "<h2>Findings</h2>" in html and 'data-kind="serialized_streams"' in html


def test_exposure_waiting_on_a_late_peer_is_not_the_transfers(real: Path) -> None:
    """gloo_pp2_dp2 (read by hand): rank 1 sleeps 200 ms in each step before its DP all_reduce;
    ranks 0 and 2 wait ≈ 203 ms inside `MOE a2a`'s all_to_all, rank 3 ≈ 205 ms in its DP
    all_reduce. That exposure is the sleeper's, which no overlap hides: the transfers' own is a
    few ms, and no exposed-communication warning names the all-to-all."""
    analysis = analyze(tracegraph.load(real / "kineto/gloo_pp2_dp2", use_cache=False))
    table = exposed_table(analysis, stage_of(analysis)).set_index(["rank", "dim"])
    for rank, dim in ((0, "ep"), (2, "ep"), (3, "dp")):
        row = table.loc[(rank, dim)]
        assert row["exposed_ms"] > 195 and row["waiting_ms"] > 190 and row["own_ms"] < 6
    assert table["own_ms"].max() < 10
    finding = kinds(analysis)["exposed_comm"]
    assert finding.severity == "info" and "waiting for work elsewhere" in finding.title
    assert finding.evidence["by_dim"]["ep"]["waiting_ms"] > 380  # ranks 0 and 2 together


def test_the_transfers_own_time_is_what_the_path_and_the_replay_credit() -> None:
    """The seed sample's PP P2P (hcom_batchSendRecv on streams 49 / 50): an op waits for its
    peer's half, then moves its 8 MiB in ~0.5 ms. Of the P2P time the compute stream does not
    hide, only what runs after the peer's half was posted is the transfers' own (before: ~1,869
    of 3,995 ms per step over the ranks, while the replay credits P2P with 17.8 ms): the
    critical path's transfer stretches lie in exactly that part of their ops, and the replay's
    P2P ceiling is the path's P2P transfer time."""
    analysis = analyze(tracegraph.load(SAMPLES / "simulated/hsdp-straggler-sync-ascend.tar.gz",
                                       use_cache=False))
    pp = exposed_table(analysis, stage_of(analysis)).set_index(["rank", "dim"]).xs(
        "pp", level="dim")
    assert (pp["own_ms"] < 0.03 * pp["exposed_ms"]).all()
    assert (pp["waiting_ms"] > 0.95 * pp["exposed_ms"]).all()
    released, end = analysis.released(), analysis.end
    [path] = analysis.critical_paths.values()
    moving = [s for s in path if s.kind == "transfer"]
    assert moving and all(released[s.op] - 2_000 <= s.start and s.end <= end[s.op] + 2_000
                          for s in moving)  # slivers (< 2 µs) fold into their neighbours
    on_path = sum(s.end - s.start for s in moving if s.category == "pp_p2p") / 1e6
    finding = kinds(analysis)["exposed_comm"].evidence["by_dim"]["pp"]
    assert finding["exposed_ms"] - finding["waiting_ms"] == pytest.approx(pp["own_ms"].sum(),
                                                                          abs=0.01)
    ceiling = next(c for c in gain_ceilings(analysis)["causes"] if c["category"] == "pp_p2p")
    assert ceiling["ceiling_ms"] == pytest.approx(on_path, rel=0.05)


def test_exposure_only_of_ranks_whose_compute_is_timed(real: Path) -> None:
    """torch_npu_pp2dp2_level2_comm: ranks 1 and 3 ship communication.json alone: how much of
    their communication compute hid is unknown, so they get no exposed time (not 100 %)."""
    path = real / "ascend/torch_npu_pp2dp2_level2_comm"
    analysis = analyze(tracegraph.load(path, use_cache=False))
    assert set(exposed_table(analysis, stage_of(analysis))["rank"]) == {0, 2}
    assert set(reduction_overlap(analysis)["rank"]) <= {0, 2}


def test_exposure_the_profile_cannot_explain_is_not_called_the_transfers(real: Path) -> None:
    """torch_npu_pp2dp2_level2_comm rank 0 (stage 0): communication.json's batchSendRecv ops
    _3_1 / _4_1 / _5_1 last 0.436 + 158.553 + 154.888 = 313.877 ms while stage 1 computes
    (HCCL's own Wait Time for _4_1: 158.102 ms); the profile has no trace_view.json, so no
    stream wait links the idle compute stream to them. That is no proof the transfers are
    slow: no warning tells to overlap P2P; the finding says the profile cannot tell."""
    analysis = analyze(tracegraph.load(real / "ascend/torch_npu_pp2dp2_level2_comm",
                                       use_cache=False))
    row = exposed_table(analysis, stage_of(analysis)).set_index(["rank", "dim"]).loc[(0, "pp")]
    assert row["exposed_ms"] == pytest.approx(313.877, abs=0.01)
    assert row["unexplained_ms"] > 313 and row["own_ms"] < 1
    finding = kinds(analysis)["exposed_comm"]
    assert finding.severity == "info" and "the profile does not hold" in finding.title
    assert finding.evidence["by_dim"]["pp"]["unexplained_ms"] > 380  # ranks 0 and 2


def test_one_stage_memory_is_not_compared_with_itself(real: Path) -> None:
    """torch_npu_ddp8_level1 (plain DDP, one stage): memory_record.csv's Total Allocated peaks at
    1261.043 MB (1.23 GiB) on both ranks; there is no other stage to hold it against."""
    analysis = analyze(tracegraph.load(real / "ascend/torch_npu_ddp8_level1", use_cache=False))
    finding = kinds(analysis)["stage_memory"]
    assert finding.title == "device memory: peak 1.23 GiB" and finding.severity == "info"
    assert finding.evidence["stages"] == 1
    assert "one pipeline stage: no stage to compare it with" in finding.lines[0]


def test_a_dim_with_next_to_no_communication_is_left_to_the_evidence(real: Path) -> None:
    """torch_npu_pp2dp2_level2_comm: its TP communication inside the steps rounds to 0.0 ms; the
    finding keeps it in its evidence but prints no "TP: 0.0 of 0.0 ms exposed" line."""
    analysis = analyze(tracegraph.load(real / "ascend/torch_npu_pp2dp2_level2_comm",
                                       use_cache=False))
    finding = kinds(analysis)["exposed_comm"]
    assert round(finding.evidence["by_dim"]["tp"]["comm_ms"], 1) == 0
    assert not [line for line in finding.lines if line.startswith("TP:")]
    assert [line for line in finding.lines if line.startswith("PP P2P: ")]
