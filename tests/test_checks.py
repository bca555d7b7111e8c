"""Checks (tracegraph/checks.py) on profiles whose answers are known independently:

- a hand-built two-rank miniature of the seed case in its sync form (tests/test_blame_chain.py:
  rank 1's stream 47 waits on its 32-rank HSDP AllReduce 40.0001 → 89.999 ms, and its
  batchSendRecv with rank 0 starts 11 µs later) and an async form built here (the P2P posted at
  40.01 ms, right after the BWD; the AllReduce runs 40.001 → 129.9 ms under compute 40.1 → 120 ms,
  drained by a wait 120 → 130 ms);
- the simulated seed bundles (hsdp-straggler-sync / -async, Ascend and Kineto), checked against
  the simulator's own Timeline (its meta_step labels FSDP_REDUCE_GRAD and BWD_SEND);
- real profiles, with the numbers read from the raw files by hand (stated at each test);
- a two-stage miniature with no data parallelism (mini_pp_trace) and the real Ascend export that
  holds communication summaries only, for checks that are not applicable.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import xmlschema
from typer.testing import CliRunner

from parsers.base import TraceError
from tests.conftest import REAL, REPO
from tests.test_blame_chain import BSR, P2P, builder, mini_seed_trace
from tracegraph import causes, schema
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.cli.app import app
from tracegraph.loading.loader import load
from tracegraph.loading.trace import Trace
from tracegraph.verify import metrics
from tracegraph.verify.checks import (
    NOT_APPLICABLE,
    PRESETS,
    CheckResult,
    evaluate,
    load_rules,
    preset,
)

MS = 1_000_000
JUNIT_XSD = REPO / "tests" / "data" / "junit.xsd"
GLOO = REAL / "kineto" / "gloo_pp2_dp2"
DDP = REAL / "ascend" / "torch_npu_ddp8_level1"
PP2DP2 = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
SEED = "hsdp-async-reduction"


# --- inputs ------------------------------------------------------------------------------------
def mini_async_trace() -> Trace:
    """The miniature after the fix: BWD_SEND first, the reduction on stream 52 under compute."""
    b = builder()
    b.group("dp1", (1, *range(100, 131)), dim="dp", name="hsdp-32")
    r0_47, r0_50 = b.stream(0, 47), b.stream(0, 50)
    r0_47.step(1, 0, 121.5)
    r0_47.compute(0, 10)
    r0_47.wait(10, 40.501)
    r0_47.compute(40.502, 121.5)
    r0_50.batch_send_recv(10, 40.5, peer=1, name=BSR, **P2P)
    r0_50.record(40.5005)
    r1_47, r1_50, r1_52 = b.stream(1, 47), b.stream(1, 50), b.stream(1, 52)
    r1_47.step(1, 0, 141)
    r1_47.compute(0, 40, "MatMulGrad")
    r1_47.record(40.0)
    r1_47.compute(40.1, 120)
    r1_47.wait(120, 130)
    r1_47.compute(130.001, 141)
    r1_52.wait(0, 40.0005)
    r1_52.collective(40.001, 129.9, "allreduce", group="dp1", seq=0,
                     name="hcom_allReduce__dp1_0_1")
    r1_52.record(129.9985)
    r1_50.wait(0, 40.0008)
    r1_50.batch_send_recv(40.01, 40.5, peer=0, name=BSR, **P2P)
    return b.trace("mini")


def mini_pp_trace() -> Trace:
    """Two pipeline stages and no data parallelism: rank 0's stream 47 waits 10 → 60 ms on its
    batchSendRecv with rank 1 (stream 50), whose half is posted at 50.01 ms, after rank 1's
    compute 0 → 50 ms; the transfer ends at 59.9 ms."""
    b = builder()
    r0, r0_50 = b.stream(0, 47), b.stream(0, 50)
    r0.step(1, 0, 100)
    r0.compute(0, 10)
    r0.wait(10, 60)
    r0.compute(60.001, 100)
    r0_50.batch_send_recv(10, 59.9, peer=1, name=BSR, **P2P)
    r0_50.record(59.9995)
    r1, r1_50 = b.stream(1, 47), b.stream(1, 50)
    r1.step(1, 0, 100)
    r1.compute(0, 50, "MatMulGrad")
    r1.record(50.0)
    r1.compute(50.1, 100)
    r1_50.wait(0, 50.0005)
    r1_50.batch_send_recv(50.01, 59.9, peer=0, name=BSR, **P2P)
    return b.trace("mini-pp")


SIM = {"sync": "hsdp-straggler-sync", "async": "hsdp-straggler-async"}


@functools.cache
def timeline(mode: str):
    from tracegraph.simulate import simulate

    return simulate(SIM[mode])


@functools.cache
def sim_dir() -> Path:
    """A folder for the simulated bundles, removed when the test process exits."""
    folder = Path(tempfile.mkdtemp(prefix="tracegraph-sim-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def comm_only() -> Path:
    """The real pp2dp2 level-2 folder without its kernel_details.csv: every rank has only its
    communication.json ops, no compute timeline."""
    folder = sim_dir() / "comm_only"
    for path in PP2DP2.rglob("*"):
        if path.is_file() and path.name != "kernel_details.csv":
            copy = folder / path.relative_to(PP2DP2)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())
    return folder


@functools.cache
def sim_bundle(mode: str, fmt: str) -> Path:
    """The simulated seed case, before (sync) or after (async) the fix, in one format."""
    from tracegraph.simulate.bundle_writer import write_bundle

    return write_bundle(timeline(mode), sim_dir() / f"{SIM[mode]}-{fmt}", fmt)


@functools.cache
def sim_analysis(mode: str, fmt: str) -> Analysis:
    return analyze(load(sim_bundle(mode, fmt), jobs=1, use_cache=False))


def by_rule(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.rule: r for r in results}


def validated(xml: Path) -> dict:
    """A JUnit file checked against the JUnit XSD, as a dict."""
    schema_ = xmlschema.XMLSchema(JUNIT_XSD)
    schema_.validate(xml)
    return schema_.to_dict(xml)


def tally(suite: dict) -> tuple[int, int, int]:
    """A suite's tests, failures and skipped."""
    return suite["@tests"], suite["@failures"], suite["@skipped"]


def skipped(suite: dict) -> dict[str, str]:
    """Test case name -> its <skipped> message."""
    return {c["@name"]: c["skipped"]["@message"] for c in suite["testcase"] if "skipped" in c}


# --- loading rules -----------------------------------------------------------------------------
def test_rules_file_combines_presets_and_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('presets = ["hsdp-async-reduction"]\n\n[[rule]]\ntype = "max_step_time"\n'
                    'ms = 250\nname = "step under 250 ms"\n\n[[rule]]\ntype = "min_overlap"\n'
                    'dim = "dp"\n')
    rules = load_rules(path, [])
    assert [r.type for r in rules] == [r.type for r in PRESETS[SEED]] + ["max_step_time",
                                                                          "min_overlap"]
    assert rules[-2].title == "step under 250 ms" and rules[-2].params == {"ms": 250}


@pytest.mark.parametrize(("text", "says"), [
    ("[[rule]]\nms = 3\n", "needs a type"),
    ('[[rule]]\ntype = "max_wait"\nms = 3\n', "unknown rule type 'max_wait'"),
    ('[[rule]]\ntype = "max_bubble"\nms = 3\n', "missing category"),
    ('[[rule]]\ntype = "max_bubble"\ncategory = "slowness"\nms = 3\n', "category must be"),
    ('[[rule]]\ntype = "max_step_time"\nms = "fast"\n', "ms must be a number"),
    ('[[rule]]\ntype = "max_step_time"\nms = 1\nrank = 3\n', "unknown rank"),
    ('presets = ["nope"]\n', "unknown preset 'nope'"),
    ("[[rule]\n", "not valid TOML"),
    ("", "no rules"),
])
def test_bad_rules_file_names_the_file_and_the_problem(tmp_path: Path, text: str,
                                                       says: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(TraceError, match=says) as error:
        load_rules(path, [])
    assert "\n" not in str(error.value)
    if "preset" not in says:
        assert str(path) in str(error.value)


def test_unknown_preset_is_bad_input() -> None:
    with pytest.raises(TraceError, match="known: hsdp-async-reduction"):
        preset("hsdp-sync")


# --- the seed miniature --------------------------------------------------------------------------
def test_preset_fails_the_sync_miniature_naming_rank_stage_ops_and_times() -> None:
    results = by_rule(evaluate(preset(SEED), analyze(mini_seed_trace())))
    assert not any(r.passed for r in results.values())
    [wait] = results["no_reduction_wait_before_p2p"].violations
    # rank 1 = stage 1 of the pp group g01 = (0, 1); its stream-47 wait 40.0001 → 89.999 ms is
    # released by the AllReduce (ends 89.9, record 89.9985); the P2P starts 90.01 ms
    assert (wait.rank, wait.stage, wait.step) == (1, 1, 1)
    assert wait.start_ms == pytest.approx(40.0001, abs=1e-5)
    assert wait.end_ms == pytest.approx(89.999, abs=1e-5)
    assert "hcom_allReduce__dp1_0_1" in wait.text and "hcom_batchSendRecv" in wait.text
    assert "posted 0.011 ms after the wait" in wait.text
    [late] = results["p2p_before_reduction_end"].violations
    assert late.rank == 1
    assert (late.start_ms, late.end_ms) == pytest.approx((40.001, 89.9), abs=1e-5)
    assert "posted 0.110 ms after its stage reduction completed" in late.text
    [overlap] = results["min_overlap"].violations  # stream 47 waits throughout the reduction
    assert overlap.rank == 1 and results["min_overlap"].value == 0.0


def test_preset_passes_the_async_miniature() -> None:
    results = by_rule(evaluate(preset(SEED), analyze(mini_async_trace())))
    assert all(r.passed for r in results.values()), [r.summary for r in results.values()]
    # the drain wait 120 → 130 ms is released by the reduction, but no P2P follows it
    assert results["no_reduction_wait_before_p2p"].value == 0.0
    assert "1 of 1 P2P" in results["p2p_before_reduction_end"].summary
    # AllReduce 40.001 → 129.9 ms under compute 40.1 → 120 ms: 79.9 of 89.899 ms
    assert results["min_overlap"].value == pytest.approx(79.9 / 89.899, abs=1e-5)


def test_generic_rules_on_the_miniature() -> None:
    rules = [
        _rule("max_bubble", category=causes.DP_REDUCTION, ms=10),
        _rule("max_group_wait", dim="dp", ms=10),
        _rule("max_group_wait", dim="pp", ms=100),
        _rule("max_step_time", ms=150)]
    bubble, dp_wait, pp_wait, step = evaluate(rules, analyze(mini_seed_trace()))
    # rank 0's 90 ms wait holds 49.9 ms of dp_reduction (test_blame_chain); rank 1's own wait
    # 40.0001 → 89.999 ms is dp_reduction until the AllReduce ends at 89.9 (the record after it
    # is launched 98.5 µs late)
    assert {v.rank for v in bubble.violations} == {0, 1}
    assert bubble.value == pytest.approx(89.9 - 40.0001, abs=0.001)
    # direct releasers: rank 1's wait by the AllReduce; rank 0's by its P2P (pp), under 100 ms
    assert [(v.rank, round(v.end_ms - v.start_ms, 4)) for v in dp_wait.violations] == [
        (1, 49.9989)]
    assert pp_wait.passed and pp_wait.value == pytest.approx(90.0)
    assert [(v.rank, v.step) for v in step.violations] == [(0, 1)]  # both ranks' steps: 181 ms


def _rule(kind: str, **params: object):
    from tracegraph.verify.checks import Rule

    return Rule(kind, params)


# --- real profiles -----------------------------------------------------------------------------
def test_dp_wait_and_overlap_on_the_real_ddp_profile() -> None:
    analysis = analyze(load(DDP, jobs=1, use_cache=False))
    dp_wait, wait, overlap = evaluate([_rule("max_group_wait", dim="dp", ms=10),
                                       _rule("max_bubble", category=causes.COLLECTIVE, ms=10),
                                       _rule("min_overlap", dim="dp", ratio=0.5)], analysis)
    # The profile names its one HCCL group but not its parallel dimension: its all-reduces are
    # charged as collectives of unknown dimension, not assumed to be DP reductions, so a DP wait
    # check has nothing to test.
    assert dp_wait.status == NOT_APPLICABLE and not dp_wait.violations
    assert dp_wait.reason == "no dp group in this bundle (its collectives' groups have no known " \
                             "dimension)"
    # trace_view.json, "Ascend Hardware" Stream 2, EVENT_WAIT > 10 ms, read by hand:
    # rank 0: 65554.570 µs and 21871.657 µs; rank 1: 59438.2 µs and 21861.8 µs; each ends as an
    # hcom_allReduce on stream 4 ends (per rank the longest is the violation's span)
    assert sorted((v.rank, round(v.end_ms - v.start_ms, 3)) for v in wait.violations) == [
        (0, 65.555), (1, 59.438)]
    assert all("hcom_allReduce" in v.text for v in wait.violations)
    # nor a DP overlap check: the overlap table names the group's dimension as blame does
    assert overlap.status == NOT_APPLICABLE and not overlap.violations
    # the 4 hcom_allReduce of the HCCL "Group 0 Communication" row against the AI_CORE/MIX_AIV
    # tasks of Stream 2 (pairwise overlap summed by a script): rank 0 4.029 of 105.992 ms,
    # rank 1 4.017 of 100.376 ms, as collectives of unknown dimension
    table = metrics.overlap_table(analysis).set_index("rank")
    assert set(table["dim"]) == {"collective"}
    assert table.loc[[0, 1], ["overlap_ms", "comm_ms"]].to_numpy().round(3).tolist() == [
        [4.029, 105.992], [4.016, 100.375]]


def test_max_step_time_names_the_slowest_rank_of_each_step() -> None:
    [step] = evaluate([_rule("max_step_time", ms=220)], analyze(load(GLOO, jobs=1)))
    # ProfilerStep durations in rank{0..3}.json: #2 224.597/227.198/227.682/227.621 ms,
    # #3 216.508/219.374/217.218/217.173 ms: only step 2 is over 220 ms, its slowest is rank 2
    assert [(v.rank, v.step) for v in step.violations] == [(2, 2)]
    assert step.value == pytest.approx(227.682, abs=1e-3)


# --- not applicable ----------------------------------------------------------------------------
def test_dp_rules_are_not_applicable_without_a_dp_group() -> None:
    dp_wait, dp_bubble, pp_wait, *seed = evaluate(
        [_rule("max_group_wait", dim="dp", ms=1),
         _rule("max_bubble", category=causes.DP_REDUCTION, ms=1),
         _rule("max_group_wait", dim="pp", ms=10), *preset(SEED)], analyze(mini_pp_trace()))
    skipped_ = [dp_wait, dp_bubble, *seed]
    assert [r.status for r in skipped_] == [NOT_APPLICABLE] * 5
    assert dp_wait.reason == dp_bubble.reason == "no dp group in this bundle"
    assert [r.reason for r in seed] == ["no DP reduction in this bundle"] * 2 + [
        "no dp communication in this bundle's steps"]
    assert all(r.summary == r.reason and not r.violations and r.value is None for r in skipped_)
    assert dp_wait.as_dict() | {"name": ""} == {
        "name": "", "rule": "max_group_wait", "passed": True, "status": NOT_APPLICABLE,
        "reason": "no dp group in this bundle", "summary": "no dp group in this bundle",
        "value": None, "violations": []}
    # the same bundle's PP wait is tested: rank 0's 10 → 60 ms wait, released by its P2P
    assert pp_wait.status == "fail" and pp_wait.reason == ""
    assert [(v.rank, v.start_ms, v.end_ms) for v in pp_wait.violations] == [(0, 10.0, 60.0)]


def test_dp_rules_apply_on_the_real_gloo_profile() -> None:
    # pg_config names groups 1 = (0, 2) and 2 = (1, 3) dp; rank 1 sleeps 200 ms before its DP
    # all_reduce (README), so its DP peer waits longer than that on the all_reduce
    dp_wait, reduction = evaluate([_rule("max_group_wait", dim="dp", ms=1000),
                                   _rule("max_bubble", category=causes.DP_REDUCTION, ms=1000)],
                                  analyze(load(GLOO, jobs=1)))
    assert dp_wait.status == reduction.status == "pass"
    assert dp_wait.value > 200 and reduction.value > 0


def test_checks_on_a_bundle_without_timeline_are_not_applicable() -> None:
    # communication.json only (every rank: "no trace, no timeline"): nothing computes, so there
    # is nothing to overlap with, and no main lane to wait on
    overlap, pp_wait, *seed = evaluate([_rule("min_overlap", dim="dp"),
                                        _rule("max_group_wait", dim="pp", ms=1), *preset(SEED)],
                                       analyze(load(comm_only(), jobs=1, use_cache=False)))
    assert [r.status for r in (overlap, pp_wait, *seed)] == [NOT_APPLICABLE] * 5
    assert overlap.reason == pp_wait.reason == "no compute timeline in this bundle"
    wait, late, seed_overlap = seed
    assert wait.reason == seed_overlap.reason == "no compute timeline in this bundle"
    # it has P2P and DP reductions, but no P2P posted while one ran: "0 of 0" is not a pass
    assert late.reason == ("no P2P posted during or within 1.0 ms after a stage reduction of at "
                           "least 1.0 ms")


# --- the simulated seed case -------------------------------------------------------------------
def assert_same_places(result: CheckResult, expected: list[tuple[int, int, float]]) -> None:
    """The violations are exactly the expected (rank, step) places, with the same durations."""
    found = sorted((v.rank, v.step, v.end_ms - v.start_ms) for v in result.violations)
    assert [(r, s) for r, s, _ in found] == [(r, s) for r, s, _ in expected]
    assert [ms for _, _, ms in found] == pytest.approx([ms for _, _, ms in expected], abs=0.01)


def expected_gating_waits(mode: str) -> list[tuple[int, int, float]]:
    """From the Timeline: compute-stream FSDP_REDUCE_GRAD waits over 1 ms whose rank starts a
    BWD_SEND P2P within 1 ms of their end: (rank, step, ms)."""
    tl = timeline(mode)
    ops = tl.ops.assign(end=tl.ops["start_ns"] + tl.ops["dur_ns"])
    waits = ops[(ops["stream"] == tl.compute_stream) & (ops["kind"] == schema.WAIT)
                & (ops["meta_step"] == "FSDP_REDUCE_GRAD") & (ops["dur_ns"] > MS)]
    sends = ops[(ops["kind"] == schema.P2P) & ops["meta_step"].str.contains("BWD_SEND")]
    found = []
    for w in waits.itertuples():
        mine = sends[sends["rank"] == w.rank]
        if ((mine["start_ns"] >= w.end) & (mine["start_ns"] <= w.end + MS)).any():
            found.append((int(w.rank), int(w.step), w.dur_ns / MS))
    return sorted(found)


def expected_late_sends(mode: str) -> list[tuple[int, int, float]]:
    """From the Timeline: each (rank, step, chunk) stage reduction (its FSDP_REDUCE_GRAD
    collectives) whose chunk's last BWD_SEND starts after it completed: (rank, step, ms)."""
    ops = timeline(mode).ops
    ops = ops.assign(end=ops["start_ns"] + ops["dur_ns"])
    found = []
    reductions = ops[(ops["kind"] == schema.COLLECTIVE) & (ops["meta_step"] == "FSDP_REDUCE_GRAD")]
    for (rank, step, chunk), run in reductions.groupby(["rank", "step", "chunk"]):
        sends = ops[(ops["rank"] == rank) & (ops["step"] == step) & (ops["chunk"] == chunk)
                    & (ops["kind"] == schema.P2P) & ops["meta_step"].str.contains("BWD_SEND")]
        if len(sends) and sends.loc[sends["microbatch"].idxmax(), "start_ns"] >= run["end"].max():
            found.append((int(rank), int(step), (run["end"].max() - run["start_ns"].min()) / MS))
    return sorted(found)


def test_timeline_ground_truth_is_what_the_seed_describes() -> None:
    # the seed: rank 12288 exposes ≈473 ms of HSDP AllReduce tails on stream 47 before its
    # BWD_SEND, rank 8192 ≈133 ms; the async fix leaves no such wait
    sync = {(rank, step): round(ms) for rank, step, ms in expected_gating_waits("sync")}
    assert sync[(12288, 1)] == 473 and sync[(8192, 1)] == 133
    assert expected_gating_waits("async") == [] and expected_late_sends("async") == []
    # 4 ranks × 2 local chunks × 2 steps = 16 stage reductions; the first stage's chunk 0 (rank 0)
    # sends no gradient upstream, so 14 are followed by a BWD_SEND, each posted only after
    assert len(expected_late_sends("sync")) == 14


@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_seed_preset_fails_sync_and_names_ranks_stages_and_reductions(fmt: str) -> None:
    results = by_rule(evaluate(preset(SEED), sim_analysis("sync", fmt)))
    late = results["p2p_before_reduction_end"]
    assert not late.passed
    assert_same_places(late, expected_late_sends("sync"))
    # ranks 0, 4096, 8192, 12288 are stages 0..3 of the simulated pipeline
    assert {(v.rank, v.stage) for v in late.violations} == {(0, 0), (4096, 1), (8192, 2),
                                                           (12288, 3)}
    overlap = results["min_overlap"]
    assert overlap.value == pytest.approx(timeline_overlap("sync"), abs=0.005)
    assert {v.rank for v in overlap.violations} == {0, 4096, 8192, 12288}


def test_seed_preset_names_the_gating_waits_exactly_on_ascend() -> None:
    wait = by_rule(evaluate(preset(SEED), sim_analysis("sync", "ascend")))[
        "no_reduction_wait_before_p2p"]
    expected = expected_gating_waits("sync")
    assert_same_places(wait, expected)
    assert wait.value == pytest.approx(max(ms for _, _, ms in expected), abs=0.05)
    assert all("stream 47 EVENT_WAIT" in v.text and "hcom_allReduce" in v.text
               and "hcom_batchSendRecv" in v.text for v in wait.violations)


@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_seed_preset_passes_async(fmt: str) -> None:
    results = by_rule(evaluate(preset(SEED), sim_analysis("async", fmt)))
    assert all(r.passed for r in results.values()), [r.summary for r in results.values()]
    assert results["min_overlap"].value == pytest.approx(timeline_overlap("async"), abs=0.005)
    assert results["min_overlap"].value > 0.5


def timeline_overlap(mode: str) -> float:
    """Share of DP-collective time during which the rank's compute stream ran a kernel, summed
    over ranks, from the Timeline by a plain sweep over each rank's ops."""
    tl = timeline(mode)
    dp = {g for g, info in tl.groups.items() if info.desc == "dp"}
    total = covered = 0
    for _, ops in tl.ops.groupby("rank"):
        kernels = ops[(ops["stream"] == tl.compute_stream) & (ops["kind"] == schema.COMPUTE)]
        busy: list[list[int]] = []
        for s, d in sorted(zip(kernels["start_ns"], kernels["dur_ns"], strict=True)):
            if busy and s <= busy[-1][1]:
                busy[-1][1] = max(busy[-1][1], s + d)
            else:
                busy.append([s, s + d])
        comm = ops[(ops["kind"] == schema.COLLECTIVE) & ops["group"].isin(dp)]
        for s, d in zip(comm["start_ns"], comm["dur_ns"], strict=True):
            total += d
            covered += sum(max(0, min(s + d, b) - max(s, a)) for a, b in busy)
    return covered / total


# --- the command -------------------------------------------------------------------------------
def run_cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args] + ["--jobs", "1"])


def test_check_command_exit_codes_markdown_and_junit(tmp_path: Path) -> None:
    sync, after = sim_bundle("sync", "ascend"), sim_bundle("async", "ascend")
    md, xml = tmp_path / "check.md", tmp_path / "check.xml"
    failed = run_cli("check", sync, "--preset", SEED, "--markdown", md, "--junit", xml,
                     "--cache-dir", tmp_path / "cache")
    assert failed.exit_code == 1, failed.output
    assert "FAIL" in failed.stdout and "rank 12288 (stage 3)" in failed.stdout
    text = md.read_text()
    assert "0 of 3 checks pass" in text and "rank 8192 (stage 2) step 1" in text
    assert tally(validated(xml)) == (3, 3, 0)
    passed = run_cli("check", after, "--preset", SEED, "--json", "--junit", xml,
                     "--cache-dir", tmp_path / "cache")
    assert passed.exit_code == 0, passed.output
    report = json.loads(passed.stdout)
    assert report["passed"] and [c["passed"] for c in report["checks"]] == [True] * 3
    assert [c["status"] for c in report["checks"]] == ["pass"] * 3
    assert report["check_counts"] == {"pass": 3, "fail": 0, "not_applicable": 0}
    assert validated(xml)["@failures"] == 0


def test_check_command_not_applicable_fails_nothing(tmp_path: Path) -> None:
    rules, xml = tmp_path / "rules.toml", tmp_path / "check.xml"
    rules.write_text('[[rule]]\ntype = "max_group_wait"\ndim = "dp"\nms = 1\n\n'
                     '[[rule]]\ntype = "max_step_time"\nms = 200\n')
    run = run_cli("check", DDP, "--rules", rules, "--junit", xml, "--cache-dir", tmp_path / "c")
    # no dp group (the wait check is skipped); the step is 156 ms (see above)
    assert run.exit_code == 0, run.output
    assert "1 of 1 checks pass, 1 not applicable" in run.stdout
    assert "not applicable" in run.stdout and "verified nothing" not in run.stderr
    suite = validated(xml)
    assert tally(suite) == (2, 0, 1)
    assert skipped(suite) == {"max_group_wait(dim=dp, ms=1)": "no dp group in this bundle (its "
                              "collectives' groups have no known dimension)"}


def test_check_command_when_no_check_applies(tmp_path: Path) -> None:
    md, xml, cache = tmp_path / "check.md", tmp_path / "check.xml", tmp_path / "cache"
    run = run_cli("check", comm_only(), "--preset", SEED, "--json", "--markdown", md, "--junit",
                  xml, "--cache-dir", cache)
    assert run.exit_code == 1, run.output  # a gate that verified nothing is not a pass
    report = json.loads(run.stdout)
    assert report["nothing_verified"] and not report["passed"]
    assert report["check_counts"] == {"pass": 0, "fail": 0, "not_applicable": 3}
    assert all(c["status"] == NOT_APPLICABLE and c["reason"] and c["passed"]
               for c in report["checks"])
    assert "the gate verified nothing" in " ".join(run.stderr.split())
    text = md.read_text()
    assert "⚠️ no check applies: 3 of 3 not applicable" in text
    assert "| not applicable | no compute timeline in this bundle |" in text
    suite = validated(xml)
    assert tally(suite) == (4, 1, 3)
    assert skipped(suite) == {c["name"]: c["reason"] for c in report["checks"]}
    [failed] = [c for c in suite["testcase"] if "failure" in c]
    assert failed["@name"] == "checks applicable"
    allowed = run_cli("check", comm_only(), "--preset", SEED, "--allow-not-applicable",
                      "--junit", xml, "--cache-dir", cache)
    assert allowed.exit_code == 0, allowed.output
    assert "no check applies: 3 of 3 not applicable" in allowed.stdout
    assert "verified nothing" in " ".join(allowed.stderr.split())
    assert tally(validated(xml)) == (3, 0, 3)


def test_check_command_bad_input_and_usage_exit_2(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\ntype = "max_wait"\n')
    bad_rules = run_cli("check", GLOO, "--rules", rules, "--no-cache")
    assert bad_rules.exit_code == 2
    assert bad_rules.stderr.count("\n") == 1 and str(rules) in bad_rules.stderr
    missing = run_cli("check", tmp_path / "nowhere", "--preset", SEED)
    assert missing.exit_code == 2 and "nowhere" in missing.stderr
    assert run_cli("check", GLOO).exit_code == 2  # neither --rules nor --preset
    assert run_cli("check", GLOO, "--preset", "nope", "--no-cache").exit_code == 2


def test_overlap_violation_says_how_many_steps_it_sums() -> None:
    """A rank's dp communication in the gloo job is summed over its 2 profiled steps: the
    violation says so, its ms being the sum of the overlap table's per-step rows."""
    analysis = analyze(load(GLOO, jobs=1))
    [overlap] = evaluate([_rule("min_overlap", dim="dp", ratio=0.25)], analysis)
    table = metrics.overlap_table(analysis)
    dp = table[(table["dim"] == "dp") & (table["rank"] == 3)]
    assert dp["step"].nunique() == 2
    [rank3] = [v for v in overlap.violations if v.rank == 3]
    assert f"of {dp['comm_ms'].sum():.3f} ms of dp communication over 2 steps " in rank3.text
