"""`tracegraph whatif`, the gain ceilings of `analyze` and `diff --predicted`, as a user runs
them: a real subprocess, exit codes, JSON on stdout, one-line errors on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REAL, SAMPLES
from tests.test_cli import tracegraph

SEED = SAMPLES / "simulated" / "hsdp-straggler-sync-ascend.tar.gz"
GLOO = SAMPLES / "gloo_pp2_dp2"


def test_whatif_json_on_the_seed(cache_dir: Path) -> None:
    run = tracegraph("whatif", str(SEED), "--fix", "decouple-reduction", "--json", "--top", "0",
                     cache=cache_dir)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["edits"][0]["edit"] == "fix decouple-reduction"
    assert out["replay"]["max_error_pct"] <= 1.0 and out["refused"] == {}
    time = out["step_time"]
    assert time["measured_ms"] == pytest.approx(6649.687, abs=0.01)  # the sync sample's step
    assert time["predicted_ms"] == pytest.approx(6104.41, rel=0.05)  # the async sample's
    assert time["best_gain_ms"] == time["worst_gain_ms"] == time["gain_ms"]  # one step
    assert {r["rank"] for r in out["ranks"]} == {0, 4096, 8192, 12288}
    vanished = out["bubbles"]["vanished"]
    assert any(b["rank"] == 4096 and b["lane"] == "stream 47" and 5389 < b["start_ms"] < 5391
               for b in vanished)
    assert out["bubbles"]["counts"]["vanished"] == len(vanished)
    path = out["critical_path"]["1"]
    # the predicted path runs from the slowest rank's step end back to the step's start
    assert path["length_ms"] == pytest.approx(time["predicted_ms"], rel=0.01)
    assert path["segments"][-1]["rank"] == 0 and path["by_kind"]["compute"] > 0


def test_whatif_prints_the_gain_and_the_bubbles(cache_dir: Path) -> None:
    run = tracegraph("whatif", str(GLOO), "--straggler", "1=median", "--top", "3",
                     cache=cache_dir)
    assert run.returncode == 0, run.stderr
    assert "rank 1:" in run.stdout and "own-work ops at their peers' median" in run.stdout
    assert "bubbles that vanish" in run.stdout and "predicted critical path, step 2" in run.stdout
    # the measured step is the median of the slowest ranks' ProfilerStep#2 and #3 (227.682 and
    # 219.374 ms, read in the files); the headline is styled, never printed as markup
    assert "step time 223.5 → " in run.stdout and "[bold]" not in run.stdout
    # the spread over the steps reads as gains, not as step times
    time = json.loads(tracegraph("whatif", str(GLOO), "--straggler", "1=median", "--json",
                                 cache=cache_dir).stdout)["step_time"]
    assert (f"median of 2 steps; gain per step: best {time['best_gain_ms']:.1f} ms, worst "
            f"{time['worst_gain_ms']:.1f} ms") in " ".join(run.stdout.split())


@pytest.mark.parametrize(("args", "said"), [
    (("--straggler", "99"), "no such rank"),
    (("--scale", "nosuchkernel*=2"), "matches no op"),
    (("--scale", "compute=-1"), "factor >= 0"),
    (("--fix", "faster"), "unknown fix"),
])
def test_an_edit_the_bundle_cannot_take_is_one_line_exit_2(cache_dir: Path, args: tuple,
                                                          said: str) -> None:
    run = tracegraph("whatif", str(GLOO), *args, cache=cache_dir)
    assert run.returncode == 2, run.stdout
    assert "Traceback" not in run.stderr
    assert said in run.stderr.strip().splitlines()[-1]


def test_a_step_the_replay_cannot_reproduce_is_refused_exit_1(tmp_path: Path,
                                                            cache_dir: Path) -> None:
    """Two kernels overlapping on one stream (a profile no device writes): the replay serialises
    them and misses the step by 10 %; nothing is predicted and the reason is printed."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100,
         "tid": 100, "ts": 1000.0, "dur": 100000.0},
        {"ph": "X", "cat": "kernel", "name": "Long", "pid": 0, "tid": 7, "ts": 1000.0,
         "dur": 100000.0, "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "Inside", "pid": 0, "tid": 7, "ts": 11000.0,
         "dur": 10000.0, "args": {"device": 0, "stream": 7, "correlation": 2}}]
    (tmp_path / "rank0.json").write_text(json.dumps(
        {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    run = tracegraph("whatif", str(tmp_path), "--scale", "compute=0.5", cache=cache_dir)
    assert run.returncode == 1, run.stderr
    assert "[red]" not in run.stdout
    assert "step 1 not predicted" in run.stdout and "misses its measured step by 10.0 %" in (
        " ".join(run.stdout.split()))


def test_one_ceiling_has_no_sum_to_compare(cache_dir: Path) -> None:
    """The 2023 two-rank Ascend profile: its only bubbles a fix can remove are collective ones
    (the rest, idle device time, has no ceiling), so there is no sum to say ceilings exceed."""
    run = tracegraph("analyze", str(REAL / "ascend" / "torch_npu_2023_comm"), "--json",
                     cache=cache_dir)
    assert run.returncode == 0, run.stderr
    ceilings = json.loads(run.stdout)["gain_ceilings"]
    assert [r["category"] for r in ceilings["causes"] if r["ceiling_ms"] is not None] == [
        "collective"]
    assert ceilings["rule"] == ""
    printed = tracegraph("analyze", str(REAL / "ascend" / "torch_npu_2023_comm"), "--top", "1",
                         cache=cache_dir)
    assert "gain ceilings by replay" in printed.stdout and "not the sum" not in printed.stdout


def test_analyze_gives_gain_ceilings_that_do_not_add_and_says_how(cache_dir: Path) -> None:
    run = tracegraph("analyze", str(GLOO), "--json", cache=cache_dir)
    assert run.returncode == 0, run.stderr
    ceilings = json.loads(run.stdout)["gain_ceilings"]
    top = ceilings["causes"][0]
    # README: rank 1's 200 ms sleep holds every rank; removing it saves ≈200 of ≈224 ms
    assert top["category"] == "compute_straggler" and 190 < top["ceiling_ms"] < 215
    assert top["edit"] == "straggler 1=median"
    together = ceilings["together"]["ceiling_ms"]  # 215.4 ms, above the sum 213.6 ms
    total = sum(c["ceiling_ms"] for c in ceilings["causes"] if c["ceiling_ms"] is not None)
    assert together > total + 1
    assert ceilings["rule"].startswith(f"removing every cause together saves {together:.1f} ms, "
                                       f"more than the sum {total:.1f} ms")
    assert "gains little" not in ceilings["rule"]  # the straggler alone gains most of it
    printed = tracegraph("analyze", str(GLOO), "--top", "1", cache=cache_dir)
    assert "gain ceilings by replay" in printed.stdout
    assert "more than the sum" in " ".join(printed.stdout.split())


def test_diff_predicted_checks_a_saved_prediction(tmp_path: Path, cache_dir: Path) -> None:
    saved = tmp_path / "prediction.json"
    run = tracegraph("whatif", str(GLOO), "--straggler", "auto", "--json", cache=cache_dir)
    assert run.returncode == 0, run.stderr
    saved.write_text(run.stdout)
    fixed = SAMPLES / "gloo_pp2_dp2_fixed"
    diff = tracegraph("diff", str(GLOO), str(fixed), "--predicted", str(saved), "--json",
                      cache=cache_dir)
    assert diff.returncode == 0, diff.stderr
    checked = json.loads(diff.stdout)["predicted"]
    assert checked["measured_ms"] == pytest.approx(json.loads(diff.stdout)["after"]["step_ms"])
    assert abs(checked["error_pct"]) <= 10.0
    assert 90 <= checked["delivered_pct"] <= 110
    assert [r["rank"] for r in checked["ranks"]] == [0, 1, 2, 3]
    printed = tracegraph("diff", str(GLOO), str(fixed), "--predicted", str(saved),
                         cache=cache_dir)
    assert "after the fix (prediction off by" in " ".join(printed.stdout.split())
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    refused = tracegraph("diff", str(GLOO), str(fixed), "--predicted", str(bad), cache=cache_dir)
    assert refused.returncode == 2 and "bad.json" in refused.stderr.strip().splitlines()[-1]


def test_no_edit_is_the_replay_of_the_measurement_and_says_so(cache_dir: Path) -> None:
    """Without an edit the replay reproduces the measured steps, gains nothing, and one warning
    says that this is the model's own check, naming the flags that make a what-if."""
    run = tracegraph("whatif", str(GLOO), "--json", cache=cache_dir)
    assert run.returncode == 0, run.stderr
    assert [x for x in run.stderr.splitlines() if x.startswith("warning: no edit given")] == [
        "warning: no edit given (--fix, --straggler, --scale, --remove-wait): the replay of the "
        "measurement as it is, the model's own check"]
    steps = json.loads(run.stdout)["steps"]
    assert steps and all(abs(s["gain_ms"]) < 0.01 for s in steps)
