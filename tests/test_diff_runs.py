"""`tracegraph diff` over several runs per side (tracegraph/verify/stats.py, runs.py, diff.py):
intervals, p-values and run-to-run noise, on simulated runs whose causes are known and whose
healthy steps vary between runs as a real cluster's do (`simulate --jitter 0.01`: each run's
compute speed and each rank's per step, log-normal, sigma 1 %).

Known answers come from the simulator: each run's step times from its Timeline (the slowest
rank's StepSpan per step), the injected straggler of pp-compute-straggler (rank 2 computes 1.3x
slower) and the seed case's chain (rank 4096 waits on 8192, which waits on 12288's HSDP
reductions), which the async fix removes. Healthy runs against healthy runs differ by no cause at
all: whatever the diff finds there is noise.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from tests.test_checks import SEED, run_cli, sim_dir, validated
from tracegraph import causes
from tracegraph.simulate import simulate
from tracegraph.verify import stats

JITTER = 0.01
HEALTHY = "pp-compute-healthy"
STRAGGLER = "pp-compute-straggler"  # rank 2 computes 1.3x slower
BEFORE, AFTER = (12, 13, 14), (15, 16, 17)  # seeds; the after runs' median is 1.6 % slower
SYNC, ASYNC = "hsdp-straggler-sync", "hsdp-straggler-async"


@functools.cache
def timeline(scenario: str, seed: int, steps: int | None = None):
    extra = {"steps": steps} if steps else {}
    return simulate(scenario, seed=seed, jitter=JITTER, **extra)


@functools.cache
def bundle(scenario: str, seed: int, fmt: str = "kineto", steps: int | None = None) -> Path:
    from tracegraph.simulate.bundle_writer import write_bundle

    return write_bundle(timeline(scenario, seed, steps), sim_dir() / f"{scenario}-j{seed}-{steps}",
                        fmt)


def step_times(scenario: str, seed: int) -> list[float]:
    """The Timeline's step times: the slowest rank's StepSpan of each step (ms)."""
    return slowest_steps(timeline(scenario, seed))


def slowest_steps(simulated) -> list[float]:
    spans: dict[int, list[float]] = {}
    for span in simulated.steps:
        spans.setdefault(span.step, []).append((span.end_ns - span.start_ns) / 1e6)
    return [max(times) for _, times in sorted(spans.items())]


def pooled_median(scenario: str, seeds: tuple[int, ...]) -> float:
    return float(np.median([ms for seed in seeds for ms in step_times(scenario, seed)]))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module: each run is analysed once, however many diffs read it."""
    return tmp_path_factory.mktemp("cache")


def diff(cache: Path, before: list[Path], after: list[Path], *args: object):
    sides = [a for side, paths in (("--before", before), ("--after", after))
             for path in paths for a in (side, path)]
    run = run_cli("diff", *sides, *args, "--json", "--cache-dir", cache)
    return run, (json.loads(run.stdout) if run.stdout.startswith("{") else None)


def runs(scenario: str, seeds: tuple[int, ...], fmt: str = "kineto") -> list[Path]:
    return [bundle(scenario, seed, fmt) for seed in seeds]


# --- healthy against healthy: noise ------------------------------------------------------------
def test_three_healthy_runs_against_three_others_pass_at_one_percent(cache: Path) -> None:
    old, new = pooled_median(HEALTHY, BEFORE), pooled_median(HEALTHY, AFTER)
    assert 100 * (new / old - 1) > 1.0  # the medians alone would fail a 1 % gate
    run, report = diff(cache, runs(HEALTHY, BEFORE), runs(HEALTHY, AFTER),
                       "--fail-on-regression", "1%")
    assert run.exit_code == 0, run.output
    step = report["step_time"]
    assert (step["before_ms"], step["after_ms"]) == (pytest.approx(old, abs=0.01),
                                                     pytest.approx(new, abs=0.01))
    low, high = step["interval_pct"]
    assert low < 0 < high and low < step["change_pct"] < high
    assert report["verdict"] == "noise" and step["significant"] is False
    assert report["noise"]["estimated"] and report["passed"]
    assert [len(report[side]["runs"]) for side in ("before", "after")] == [3, 3]
    # every step of every run is in the sample, each labelled with its run
    assert sorted(report["before"]["steps"].values()) == pytest.approx(
        sorted(ms for seed in BEFORE for ms in step_times(HEALTHY, seed)), abs=1e-3)


def test_one_run_per_side_is_the_point_change_with_a_note(cache: Path, tmp_path: Path) -> None:
    md = tmp_path / "diff.md"
    run, report = diff(cache, runs(HEALTHY, BEFORE[:1]), runs(HEALTHY, AFTER[:1]),
                       "--fail-on-regression", "1%", "--markdown", md)
    change = 100 * (pooled_median(HEALTHY, AFTER[:1]) / pooled_median(HEALTHY, BEFORE[:1]) - 1)
    assert change > 1.0 and run.exit_code == 1  # today's gate: the point change, +1.6 %
    # the verdict's "unchanged" band (2 %) narrows to the gate's 1 %: never unchanged and failed
    assert report["verdict"] == "regressed" and report["step_time"]["interval_pct"] is None
    assert report["step_time"]["p_value"] is None and not report["noise"]["estimated"]
    assert "no noise estimate: 1 run before, 1 after" in md.read_text()


def test_two_runs_per_side_within_their_spread_are_noise(cache: Path) -> None:
    before, after = BEFORE[2:] + AFTER[:1], AFTER[1:]  # seeds 14, 15 against 16, 17
    times = {seeds: [ms for s in seeds for ms in step_times(HEALTHY, s)] for seeds in
             (before, after)}
    apart = abs(np.median(times[after]) - np.median(times[before]))
    assert apart < min(np.ptp(t) for t in times.values())  # the case the issue names
    run, report = diff(cache, runs(HEALTHY, before), runs(HEALTHY, after),
                       "--fail-on-regression", "1%")
    assert run.exit_code == 0, run.output
    assert report["verdict"] == "noise" and not report["step_time"]["significant"]
    low, high = report["step_time"]["interval_ms"]
    assert low < 0 < high


# --- a real regression -------------------------------------------------------------------------
def test_three_healthy_against_three_stragglers_fail_with_interval_and_p(
        cache: Path, tmp_path: Path) -> None:
    md, xml, page = tmp_path / "diff.md", tmp_path / "diff.xml", tmp_path / "diff.html"
    run, report = diff(cache, runs(HEALTHY, BEFORE), runs(STRAGGLER, AFTER),
                       "--fail-on-regression", "1%", "--min-regression-ms", "20",
                       "--markdown", md, "--junit", xml, "--html", page)
    assert run.exit_code == 1 and not report["passed"] and report["regressed_beyond_threshold"]
    step = report["step_time"]
    assert step["after_ms"] == pytest.approx(pooled_median(STRAGGLER, AFTER), abs=0.01)
    assert report["verdict"] == "regressed" and step["significant"]
    assert step["interval_pct"][0] > 1.0 and step["interval_ms"][0] > 20.0
    # 6 steps against 6, every straggler step slower than every healthy one: U = 0
    assert step["p_value"] == pytest.approx(2 / 924, abs=1e-4)
    [straggler] = [r for r in report["bubbles"] if r["category"] == causes.COMPUTE_STRAGGLER]
    assert straggler["before_ms"] == 0 and straggler["interval_ms"][0] > 0
    assert straggler["p_value"] < 0.05
    # the injected cause: chains rooted at rank 2 appear, in all three straggler runs and none
    # of the healthy ones
    rooted = [c for c in report["chains"]["appeared"]
              if c["category"] == causes.COMPUTE_STRAGGLER and c["root"]["rank"] == 2]
    assert rooted and all(c["runs"] == {"before": 0, "after": 3} for c in rooted)
    assert all(c["significant"] for c in rooted)
    text = md.read_text()
    assert "95 % interval" in text and f"p = {step['p_value']:.2g}" in text
    assert "| after | 3 |" in text and "3 runs before, 3 after" in text
    suite = validated(xml)
    [failed] = [c for c in suite["testcase"] if "failure" in c]
    assert failed["@name"] == "step_time" and "95 % interval" in failed["failure"]["@message"]
    props = {p["@name"]: p["@value"] for p in suite["properties"]["property"]}
    assert props["step_change.p_value"] == f"{step['p_value']:.2g}"
    assert props["step_change.interval"].startswith("95 % +")
    html = page.read_text()
    assert "95 % interval" in html and "Changes" in html and "(runs 0/3 → 3/3)" in html


def test_straggler_below_the_absolute_threshold_passes(cache: Path) -> None:
    """+18 % (about 190 ms) is beyond 1 % but not beyond --min-regression-ms 500: both must be."""
    run, report = diff(cache, runs(HEALTHY, BEFORE), runs(STRAGGLER, AFTER),
                       "--fail-on-regression", "1%", "--min-regression-ms", "500")
    assert run.exit_code == 0 and report["verdict"] == "regressed"
    assert not report["regressed_beyond_threshold"] and report["min_regression_ms"] == 500


# --- the seed's fix, repeated ------------------------------------------------------------------
def test_seed_fix_over_repeated_runs_reports_gain_interval_and_chain_gone_everywhere(
        cache: Path) -> None:
    seeds = (0, 1, 2)
    run, report = diff(cache, runs(SYNC, seeds), runs(ASYNC, seeds),
                       "--preset", SEED)
    assert run.exit_code == 0, run.output
    step = report["step_time"]
    assert step["before_ms"] == pytest.approx(pooled_median(SYNC, seeds), abs=0.01)
    assert step["after_ms"] == pytest.approx(pooled_median(ASYNC, seeds), abs=0.01)
    assert report["verdict"] == "improved" and step["significant"]
    low, high = step["interval_ms"]
    assert low < step["change_ms"] < high < 0  # the gain, about 545 ms, with its interval
    gone = [c for c in report["chains"]["disappeared"]
            if c["rank"] == 4096 and c["category"] == causes.DP_REDUCTION]
    assert gone and all(c["runs"] == {"before": 3, "after": 0} for c in gone)
    assert any(c["root"]["rank"] == 12288 for c in gone)
    # the preset, on every run of each side
    assert [c["before"]["summary"].split(";")[0] for c in report["checks"]] == [
        "fails in 3 of 3 runs"] * 3
    assert [c["after"]["summary"].split(";")[0] for c in report["checks"]] == [
        "passes in 3 of 3 runs"] * 3
    assert all(v["text"].startswith("run ") for c in report["checks"]
               for v in c["before"]["violations"])


# --- different step counts (issue #24) ---------------------------------------------------------
def test_runs_of_different_step_counts_are_compared_per_step(tmp_path: Path) -> None:
    """A 1-step and a 2-step run of the same job and seed: step 1 is the same in both (the
    simulator draws step 1 before step 2), so per step nothing changed; averaged over the steps
    each holds, the chains of step 1 alone would look halved."""
    from tracegraph.simulate.bundle_writer import write_bundle

    one, two = (write_bundle(simulate(SYNC, steps=n), tmp_path / f"sync-{n}", "kineto")
                for n in (1, 2))
    run = run_cli("diff", one, two, "--json", "--cache-dir", tmp_path / "cache")
    report = json.loads(run.stdout)
    assert run.exit_code == 0
    assert "different numbers of steps (before: 1; after: 2)" in " ".join(run.stderr.split())
    assert report["warnings"] and "first 1 step of each run" in report["warnings"][0]
    assert report["step_time"]["change_ms"] == 0.0 and report["verdict"] == "unchanged"
    assert not any(report["chains"].values())
    assert list(report["after"]["runs"][0]["steps"]) == ["1"]


# --- usage -------------------------------------------------------------------------------------
def test_diff_needs_a_run_per_side_and_a_confidence_level() -> None:
    path = bundle(HEALTHY, BEFORE[0])
    missing = run_cli("diff", "--before", path)
    assert missing.exit_code == 2 and "no after profile" in missing.output
    bad = run_cli("diff", path, path, "--confidence", "1.5")
    assert bad.exit_code == 2 and "confidence level" in bad.output


# --- the statistics ----------------------------------------------------------------------------
def test_rank_test_is_mann_whitney_u() -> None:
    rng = np.random.default_rng(7)
    for trial in range(200):
        n1, n2 = rng.integers(1, 20, 2)
        old, new = rng.normal(0, 1, n1), rng.normal(rng.uniform(-1, 1), 1, n2)
        if trial % 2:  # ties, as chains absent from some steps have (zeros)
            old, new = np.round(old), np.round(new)
        distinct = len(np.unique(np.r_[old, new])) == n1 + n2
        if len(np.unique(np.r_[old, new])) == 1:
            continue
        expected = mannwhitneyu(old, new, alternative="two-sided",
                                method="exact" if distinct and n1 * n2 <= 400 else "asymptotic")
        assert stats.rank_test(old[None], new[None]) == pytest.approx(expected.pvalue, abs=1e-12)


def test_one_run_gives_no_interval_and_few_runs_a_wider_one() -> None:
    rng = np.random.default_rng(3)
    old, new = 100 + rng.normal(0, 1, (3, 4)), 103 + rng.normal(0, 1, (3, 4))
    single = stats.measure(old[:1], new[:1], stats.pooled_median, 0.95)
    assert not single.estimated and single.p_value is None and not single.significant
    change = stats.measure(old, new, stats.pooled_median, 0.95)
    assert change.significant and change.interval[0] > 0
    # the plain bootstrap over 3 runs, before widening, is narrower by the t correction
    assert stats.t_scale(4, 0.95) == pytest.approx(2.7764 / 1.95996, abs=1e-4)
    draws = stats.resample(old, np.random.default_rng(0), 50)
    assert draws.shape == (50, 3, 4) and all(
        any(np.array_equal(row, run) for run in old) for draw in draws for row in draw)


def test_jitter_varies_healthy_runs_like_a_cluster_and_is_seeded() -> None:
    def spread(jitter: float) -> float:
        medians = [np.median(slowest_steps(simulate(HEALTHY, seed=seed, jitter=jitter)))
                   for seed in range(12, 18)]
        return float(np.std(medians) / np.mean(medians))

    varied, still = spread(JITTER), spread(0.0)
    assert 0.004 < varied < 0.03 and varied > 3 * still  # about 1 % from run to run
    assert simulate(HEALTHY, seed=12, jitter=JITTER).ops.equals(timeline(HEALTHY, 12).ops)
