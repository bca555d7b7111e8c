"""`tracegraph diff` (tracegraph/diff.py, metrics.py, reports/) on before/after pairs whose answers
are known independently:

- the real gloo pair: `gloo_pp2_dp2` (rank 1 sleeps 200 ms before its DP all_reduce) and
  `gloo_pp2_dp2_fixed` (no sleep). ProfilerStep durations read from rank{0..3}.json with a short
  json script: before #2 224.597/227.198/227.682/227.621 ms, #3 216.508/219.374/217.218/217.173 ms;
  after #2 17.530/18.379/18.895/18.646 ms, #3 22.473/20.213/24.644/23.527 ms (ranks 0..3);
- the seed miniature before/after (tests/test_checks.py, known by construction);
- the simulated seed case, against the simulator's Timeline.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import REAL
from tests.test_blame_chain import mini_seed_trace
from tests.test_checks import (
    SEED,
    comm_only,
    mini_async_trace,
    run_cli,
    sim_analysis,
    sim_bundle,
    skipped,
    tally,
    timeline,
    timeline_overlap,
    validated,
)
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.loading.loader import load
from tracegraph.verify.diff import compare, regressed_beyond, verdict
from tracegraph.verify.stats import Change

BEFORE, AFTER = REAL / "kineto" / "gloo_pp2_dp2", REAL / "kineto" / "gloo_pp2_dp2_fixed"
STEPS_BEFORE = {0: (224.597, 216.508), 1: (227.198, 219.374), 2: (227.682, 217.218),
                3: (227.621, 217.173)}
STEPS_AFTER = {0: (17.530, 22.473), 1: (18.379, 20.213), 2: (18.895, 24.644),
               3: (18.646, 23.527)}


def slowest_median(steps: dict[int, tuple[float, ...]]) -> float:
    """Median over steps of the slowest rank."""
    return statistics.median(max(times) for times in zip(*steps.values(), strict=True))


def diff_json(*args: object, tmp: Path):
    run = run_cli("diff", *args, "--json", "--cache-dir", tmp / "cache")
    return run, (json.loads(run.stdout) if run.stdout.startswith("{") else None)


# --- the real gloo pair ------------------------------------------------------------------------
def test_gloo_fix_is_an_improvement_and_rank1_chain_vanishes(tmp_path: Path) -> None:
    md, xml = tmp_path / "diff.md", tmp_path / "diff.xml"
    run, report = diff_json(BEFORE, AFTER, "--markdown", md, "--junit", xml, tmp=tmp_path)
    assert run.exit_code == 0, run.output
    step = report["step_time"]
    assert step["before_ms"] == pytest.approx(slowest_median(STEPS_BEFORE), abs=1e-3)  # 223.528
    assert step["after_ms"] == pytest.approx(slowest_median(STEPS_AFTER), abs=1e-3)  # 21.770
    assert report["verdict"] == "improved" and step["change_pct"] == pytest.approx(-90.26, abs=0.01)
    ranks = {int(r["rank"]): (r["before_ms"], r["after_ms"]) for r in report["ranks"]}
    for rank, (before, after) in ranks.items():
        assert before == pytest.approx(statistics.median(STEPS_BEFORE[rank]), abs=1e-3)
        assert after == pytest.approx(statistics.median(STEPS_AFTER[rank]), abs=1e-3)
    # rank 1's 200 ms sleep held ranks 0 and 2 (MOE a2a) and rank 3 (DP all_reduce) each step
    gone = [c for c in report["chains"]["disappeared"] if c["root"]["rank"] == 1]
    assert {c["rank"] for c in gone} == {0, 2, 3}
    assert all(c["before_ms"] > 190 and c["after_ms"] == 0 for c in gone)
    assert not [c for state in ("grew", "appeared") for c in report["chains"][state]
                if c["after_ms"] > 20]
    text = md.read_text()
    assert "improved: step time 223.528 → 21.770 ms (-90.3 %)" in text
    assert "Chains that disappeared" in text and "rank 1 thread python" in text
    # summed over ranks, it exceeds the step: rank 1's sleep waited on by 3 ranks, per step
    assert "### Bubble time by root cause per step, summed over 4 ranks (rank·ms)" in text
    assert report["before"]["bubble_ms"][causes.COMPUTE_STRAGGLER] > step["before_ms"]
    suite = validated(xml)
    assert suite["@failures"] == 0 and "step_time" in case_names(suite)


def test_gloo_reversed_is_a_regression_exit_1(tmp_path: Path) -> None:
    xml = tmp_path / "diff.xml"
    run, report = diff_json(AFTER, BEFORE, "--fail-on-regression", "5%", "--junit", xml,
                            tmp=tmp_path)
    assert run.exit_code == 1
    assert report["verdict"] == "regressed" and not report["passed"]
    gained = [c for c in report["chains"]["appeared"] if c["root"]["rank"] == 1]
    assert {c["rank"] for c in gained} == {0, 2, 3}
    suite = validated(xml)
    assert suite["@failures"] == 1
    [failed] = [c for c in suite["testcase"] if "failure" in c]
    assert failed["@name"] == "step_time" and "worse by more than 5 %" in failed["failure"][
        "@message"]
    # +926.8 %: a looser threshold, or none, passes
    assert diff_json(AFTER, BEFORE, "--fail-on-regression", "1000%", tmp=tmp_path)[0].exit_code == 0
    assert diff_json(AFTER, BEFORE, "--fail-on-regression", "off", tmp=tmp_path)[0].exit_code == 0


def test_diff_bad_input_and_usage_exit_2(tmp_path: Path) -> None:
    missing = run_cli("diff", BEFORE, tmp_path / "nowhere", "--no-cache")
    assert missing.exit_code == 2 and missing.stderr.count("\n") == 1
    assert "nowhere" in missing.stderr
    assert run_cli("diff", BEFORE, AFTER, "--fail-on-regression", "abc").exit_code == 2
    rules = tmp_path / "rules.toml"
    rules.write_text("[[rule]]\ntype = 'min_overlap'\ndim = 'tensor'\n")
    bad = run_cli("diff", BEFORE, AFTER, "--rules", rules, "--no-cache")
    assert bad.exit_code == 2 and "dim must be one of" in bad.stderr


def test_terminal_output_names_the_verdict_and_chains(tmp_path: Path) -> None:
    run = run_cli("diff", BEFORE, AFTER, "--cache-dir", tmp_path / "cache")
    assert run.exit_code == 0
    assert "improved: step time 223.528 → 21.770 ms" in run.stdout
    assert "chains that disappeared" in run.stdout and "straggler_sleep" in run.stdout


def test_diff_whose_checks_all_are_not_applicable(tmp_path: Path) -> None:
    md, xml = tmp_path / "diff.md", tmp_path / "diff.xml"
    args = (comm_only(), comm_only(), "--preset", SEED, "--markdown", md, "--junit", xml)
    run, report = diff_json(*args, tmp=tmp_path)
    assert run.exit_code == 1 and report["verdict"] == "unchanged"  # only the checks gate
    assert report["nothing_verified"] and not report["passed"]
    assert report["check_counts"] == {"pass": 0, "fail": 0, "not_applicable": 3}
    assert "verified nothing" in " ".join(run.stderr.split())
    text = md.read_text()
    assert "verified nothing" in text and "### Checks (after: no check applies: 3 of 3" in text
    assert "| not applicable | not applicable | no compute timeline in this bundle |" in text
    suite = validated(xml)
    assert skipped(suite) == {c["name"]: c["after"]["reason"] for c in report["checks"]}
    assert {c["@name"] for c in suite["testcase"] if "failure" in c} == {"checks applicable"}
    allowed, report = diff_json(*args, "--allow-not-applicable", tmp=tmp_path)
    assert allowed.exit_code == 0 and report["passed"] and report["nothing_verified"]
    assert tally(validated(xml))[1:] == (0, 3)


# --- the seed miniature ------------------------------------------------------------------------
def test_miniature_fix_removes_the_cross_rank_reduction_chain() -> None:
    before, after = analyze(mini_seed_trace()), analyze(mini_async_trace())
    report = compare(before, after)
    # both ranks' ProfilerStep: 181 ms before; 121.5 (rank 0) and 141 ms (rank 1) after
    assert (report["step_time"]["before_ms"], report["step_time"]["after_ms"]) == (181.0, 141.0)
    assert report["verdict"] == "improved"
    [gone] = report["chains"]["disappeared"]  # rank 0 waited on rank 1's AllReduce
    assert (gone["rank"], gone["category"], gone["root"]) == (  # instance numbers _0_1 dropped
        0, causes.DP_REDUCTION, {"rank": 1, "lane": "stream 52", "op": "hcom_allReduce__dp1"})
    assert gone["chain"] == [0, 1] and gone["before_ms"] == pytest.approx(90.0, abs=1e-3)
    # rank 1's own reduction wait: 40.0001 → 89.999 ms before, the drain 120 → 130 ms after
    [shrank] = report["chains"]["shrank"]
    assert (shrank["rank"], shrank["before_ms"], shrank["after_ms"]) == (
        1, pytest.approx(49.9989, abs=1e-3), pytest.approx(10.0, abs=1e-3))
    [dp] = [row for row in report["overlap"] if row["dim"] == "dp"]
    assert dp["before"] == 0.0 and dp["after"] == pytest.approx(79.9 / 89.899, abs=1e-4)


def test_verdict_band_and_regression_threshold() -> None:
    same = analyze(mini_seed_trace())
    report = compare(same, same)
    assert report["verdict"] == "unchanged" and report["step_time"]["change_pct"] == 0.0
    assert all(not chains for chains in report["chains"].values())
    assert not report["noise"]["estimated"] and "no noise estimate" in report["noise"]["note"]
    assert verdict(Change(100.0, 101.9, 0.95)) == "unchanged"
    assert verdict(Change(100.0, 102.1, 0.95)) == "regressed"
    assert verdict(Change(100.0, 97.9, 0.95)) == "improved"
    # with a noise estimate: beyond the noise only when the interval excludes 0 and p < 5 %
    assert verdict(Change(100.0, 110.0, 0.95, (-1.0, 20.0), (-1.0, 20.0), 0.01)) == "noise"
    assert verdict(Change(100.0, 110.0, 0.95, (2.0, 20.0), (2.0, 20.0), 0.2)) == "noise"
    assert verdict(Change(100.0, 110.0, 0.95, (2.0, 20.0), (2.0, 20.0), 0.01)) == "regressed"
    assert regressed_beyond({"step_time": {"change_pct": 5.1, "change_ms": 5.1}}, 5.0)
    assert not regressed_beyond({"step_time": {"change_pct": 4.9, "change_ms": 4.9}}, 5.0)
    assert not regressed_beyond({"step_time": {"change_pct": 5.1, "change_ms": 5.1}}, 5.0, 6.0)
    # the whole interval must be beyond both thresholds
    interval = {"change_pct": 8.0, "change_ms": 8.0, "interval_pct": [4.0, 12.0],
                "interval_ms": [4.0, 12.0], "significant": True}
    assert not regressed_beyond({"step_time": interval}, 5.0)
    assert regressed_beyond({"step_time": interval}, 3.0)
    assert not regressed_beyond({"step_time": interval}, 3.0, 4.5)


# --- the simulated seed case -------------------------------------------------------------------
def timeline_step_ms(mode: str) -> float:
    """The Timeline's step time: median over steps of the slowest rank's StepSpan."""
    spans: dict[int, list[float]] = {}
    for s in timeline(mode).steps:
        spans.setdefault(s.step, []).append((s.end_ns - s.start_ns) / 1e6)
    return statistics.median(max(times) for times in spans.values())


def test_seed_fix_diff_on_ascend_reports_gain_overlap_and_checks(tmp_path: Path) -> None:
    sync, fixed = sim_bundle("sync", "ascend"), sim_bundle("async", "ascend")
    md, xml = tmp_path / "diff.md", tmp_path / "diff.xml"
    run, report = diff_json(sync, fixed, "--preset", SEED, "--markdown", md, "--junit", xml,
                            tmp=tmp_path)
    assert run.exit_code == 0, run.output
    step = report["step_time"]
    assert step["before_ms"] == pytest.approx(timeline_step_ms("sync"), abs=0.01)
    assert step["after_ms"] == pytest.approx(timeline_step_ms("async"), abs=0.01)
    assert report["verdict"] == "improved" and step["change_pct"] < -5
    [dp] = [row for row in report["overlap"] if row["dim"] == "dp"]
    assert dp["before"] == pytest.approx(timeline_overlap("sync"), abs=0.005)
    assert dp["after"] == pytest.approx(timeline_overlap("async"), abs=0.005)
    # the seed's chain: rank 4096 waited on 8192, which waited on 12288's HSDP AllReduce tails
    assert any(c["rank"] == 4096 and c["chain"] == [4096, 8192, 12288]
               and c["category"] == causes.DP_REDUCTION for c in report["chains"]["disappeared"])
    assert [(c["before"]["passed"], c["after"]["passed"]) for c in report["checks"]] == [
        (False, True)] * 3
    assert "| DP reduction overlaps main-lane compute | FAIL | pass |" in md.read_text()
    suite = validated(xml)
    assert suite["@failures"] == 0
    assert case_names(suite) >= {"step_time", "overlap.dp", f"bubble.{causes.DP_REDUCTION}",
                                 "P2P posted before the stage reduction completes"}


def test_seed_fix_reversed_on_ascend_exits_1(tmp_path: Path) -> None:
    xml = tmp_path / "diff.xml"
    run, report = diff_json(sim_bundle("async", "ascend"), sim_bundle("sync", "ascend"),
                            "--preset", SEED, "--junit", xml, tmp=tmp_path)
    assert run.exit_code == 1 and report["verdict"] == "regressed"
    suite = validated(xml)
    failed = {c["@name"] for c in suite["testcase"] if "failure" in c}
    assert "step_time" in failed and len(failed) == 4  # the step time and the 3 checks


def test_seed_fix_diff_on_kineto() -> None:
    sync, fixed = sim_analysis("sync", "kineto"), sim_analysis("async", "kineto")
    forward, backward = compare(sync, fixed), compare(fixed, sync)
    assert forward["step_time"]["before_ms"] == pytest.approx(timeline_step_ms("sync"), abs=0.01)
    assert forward["step_time"]["after_ms"] == pytest.approx(timeline_step_ms("async"), abs=0.01)
    assert forward["verdict"] == "improved" and not regressed_beyond(forward, 5.0)
    assert backward["verdict"] == "regressed" and regressed_beyond(backward, 5.0)
    [dp] = [row for row in forward["overlap"] if row["dim"] == "dp"]
    assert dp["after"] == pytest.approx(timeline_overlap("async"), abs=0.005)


# --- HTML --------------------------------------------------------------------------------------
def test_html_diff_draws_both_steps_over_the_same_span(tmp_path: Path) -> None:
    from reports.diff_html import diff_waterfalls, median_step, write_diff_html
    from reports.waterfall import step_window

    before, after = (analyze(load(path, jobs=1, use_cache=False)) for path in (BEFORE, AFTER))
    report = compare(before, after)
    figures = diff_waterfalls(before, after)
    spans = [fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0] for fig in figures]
    widest = max(hi - lo for lo, hi in (step_window(a, median_step(a))
                                        for a in (before, after))) / 1e6
    assert spans == pytest.approx([widest, widest])
    assert figures[0].layout.title.text.startswith("before: step ")
    page = write_diff_html(before, after, report, tmp_path / "diff.html").read_text()
    assert page.count("Plotly.newPlot") == 3 and "improved: step time" in page


# --- helpers -----------------------------------------------------------------------------------
def case_names(suite: dict) -> set[str]:
    return {case["@name"] for case in suite["testcase"]}
