"""The terminal output on the real gloo_pp2_dp2 trace: rank 1's sleep reads as one line in its
chain diagram; per-step totals say they sum over ranks, beside the slowest rank's own; groups by
their names."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

import tracegraph
from parsers.classify import double_hash
from reports.terminal import (
    cause_lines,
    chain_text,
    merged_intervals,
    print_analysis,
    straggler_lines,
)
from tests.conftest import REAL, SAMPLES
from tests.test_checks import run_cli
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.summary import summarize
from tracegraph.verify import metrics

MS = 1e6


def test_chain_folds_runs_on_one_lane_into_a_line(cache_dir: Path) -> None:
    summary = summarize(analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", cache_dir=cache_dir)))
    top = summary["bubbles"][0]
    lines = merged_intervals(top["intervals"])
    assert len(lines) < len(top["intervals"])
    lanes = [(p["rank"], p["lane"]) for p in lines]
    assert all(a != b for a, b in zip(lanes[:-1], lanes[1:], strict=True))  # neighbours differ
    total = sum(p["dur_ms"] for p in top["intervals"])
    assert abs(sum(p["dur_ms"] for p in lines) - total) < 1e-6  # no time lost in the merge
    sleep = max(lines, key=lambda p: p["dur_ms"])
    assert sleep["rank"] == 1 and sleep["category"] == causes.COMPUTE_STRAGGLER
    assert sleep["name"].startswith("straggler_sleep") and sleep["dur_ms"] > 195
    text = chain_text(top)
    assert text.count("\n") == len(lines) + 1 + len(cause_lines(top))
    assert "straggler_sleep +" in text
    assert "root " in cause_lines(top)[0] and "rank 1 " in cause_lines(top)[0]


def test_step_totals_are_rank_ms_beside_the_slowest_rank_s_own(cache_dir: Path) -> None:
    analysis = analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", cache_dir=cache_dir))
    console = Console(record=True, width=300)
    print_analysis(console, summarize(analysis), analysis)
    text = console.export_text()
    assert text.count("bubble time by cause, summed over 4 ranks (rank·ms): ") == 2
    steps = analysis.steps.assign(ms=(analysis.steps["end"] - analysis.steps["start"]) / MS)
    for step, spans in steps.groupby("step"):
        rank, step_ms = spans.loc[spans["ms"].idxmax(), ["rank", "ms"]]
        mine = [b for b in analysis.bubbles if b.rank == rank and b.step == step]
        by_cause: dict[str, float] = {}
        for bubble in mine:
            for cause, ns in bubble.by_category().items():
                by_cause[cause] = by_cause.get(cause, 0.0) + ns / MS
        exposed = sum(b.dur for b in mine) / MS
        assert exposed < step_ms
        causes_text = ", ".join(f"{c} {ms:.1f}" for c, ms in sorted(by_cause.items(),
                                                                     key=lambda kv: -kv[1])
                                if f"{ms:.1f}" != "0.0")  # what rounds to nothing is left out
        assert (f"rank {int(rank)} (slowest) exposed bubble time in stalls ≥ 1 ms: "
                f"{exposed:.1f} ms: "
                f"{causes_text}") in text
        # the sum over ranks exceeds the step itself: rank 1's 200 ms sleep, waited on by 3
        total = analysis.blame(int(step))[causes.COMPUTE_STRAGGLER]
        assert total > step_ms and f"compute_straggler {total:.1f}" in text


def test_each_chain_says_how_sure_it_is(cache_dir: Path) -> None:
    """The real gloo job: its threads are released by their gloo workers, a link inferred by
    time, so the chain of its longest wait is said to be of low confidence, with that link."""
    summary = summarize(analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", cache_dir=cache_dir)))
    top = summary["bubbles"][0]
    assert top["confidence"]["level"] == "low"
    chain_line = chain_text(top).splitlines()[1]
    assert chain_line.endswith(f"(confidence low: {top['confidence']['weakest_link']})")
    assert "inferred by time" in chain_line


def test_two_groups_with_absent_members_stay_two_lines(cache_dir: Path) -> None:
    """The seed sample's rank 12288 waits on its 128-rank HSDP group, then its 32-rank one:
    the folded chain keeps a line for each group to profile."""
    bundle = SAMPLES / "simulated" / "hsdp-straggler-sync-ascend.tar.gz"
    summary = summarize(analyze(tracegraph.load(bundle, cache_dir=cache_dir)), top=0)
    wait = max((b for b in summary["bubbles"] if b["rank"] == 12288), key=lambda b: b["dur_ms"])
    lines = [p for p in merged_intervals(wait["intervals"]) if p.get("absent_group")]
    assert len({p["absent_group"] for p in lines}) == 2 == len(lines)
    text = chain_text(wait)
    assert "the 127 members of group" in text and "the 31 members of group" in text


def test_groups_are_named_not_numbered(tmp_path: Path) -> None:
    """The Ascend PP2 × DP2 job's HCCL groups are hashes of their names (profiler_metadata.json:
    group_name_5 = dp_cp [0, 1]); the terminal names lanes, comm ops and absent members by the
    group's name, the JSON keeps the id."""
    bundle = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
    text = run_cli("analyze", bundle, "--cache-dir", tmp_path, "--top", "0",
                   "--inventory").stdout
    dp = double_hash("group_name_5")
    assert "hccl group_name_5 (dp_cp)" in text and f"hccl {dp}" not in text
    assert "@group_name_19" in text.replace("\n", "").replace("│", "").replace(" ", "")
    summary = json.loads(run_cli("analyze", bundle, "--json", "--cache-dir", tmp_path).stdout)
    assert {c["group"] for r in summary["ranks"] for c in r["comm_ops"]} >= {dp}


def test_a_rank_without_a_timeline_is_timed_from_its_step_table(tmp_path: Path) -> None:
    """Ranks 1 and 3 of the Ascend PP2 × DP2 job hold only communication.json; their
    step_trace_time.csv, by hand: step 13, Stage 809431.75 and 810150.25 µs, Computing
    230903.72 and 401131.7 µs. Rank 3 is the slowest (rank 0's Stage 810022.25 µs comes next);
    its bubbles are unknown, and the critical path stays on rank 0, the slowest with a timeline."""
    bundle = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
    summary = json.loads(run_cli("analyze", bundle, "--json", "--cache-dir", tmp_path).stdout)
    step = summary["steps"][0]
    assert step["time_ms"] == {"0": 810.022, "1": 809.432, "2": 809.803, "3": 810.15}
    assert step["max_ms"] == 810.15 and step["from_step_table"] == ["1", "3"]
    ranks = {r["rank"]: r for r in summary["ranks"]}
    assert ranks[3]["steps"] == {"13": 810.15} and ranks[3]["steps_from_step_table"] == ["13"]
    assert "steps_from_step_table" not in ranks[0]
    assert summary["stragglers"]["not_judged"]["0"].endswith(
        "rank 1: its profile holds no compute timeline; its step table states Computing 230.9 ms")
    text = " ".join(run_cli("analyze", bundle, "--cache-dir", tmp_path, "--detail"
                            ).stdout.split())
    assert "│ 3 │ 810.150 │ its step table (no timeline) │" in text
    assert "summed over 2 ranks with a timeline (ranks 1, 3: step table only)" in text
    assert "rank 3 (slowest) exposed bubble time: unknown" in text
    assert ("critical path 810.022 ms (rank 0's step, the slowest with a timeline; rank 3's step "
            "table states 810.150 ms)") in text


def test_exposed_bubble_time_names_the_threshold_of_the_analysis_run(tmp_path: Path) -> None:
    """Bubbles are the stalls of at least --threshold-ms: the slowest rank's line says which,
    also when a second run reads the analysis from the cache."""
    bundle = SAMPLES / "gloo_pp2_dp2"
    for _ in range(2):
        text = run_cli("analyze", bundle, "--threshold-ms", "2.5", "--cache-dir", tmp_path,
                       "--top", "0", "--detail").stdout
        assert text.count("(slowest) exposed bubble time in stalls ≥ 2.5 ms: ") == 2, text
    assert list(tmp_path.glob("analysis-*"))  # the second run read the stored analysis


def test_causes_that_round_to_zero_are_left_out_of_the_text(cache_dir: Path) -> None:
    """gloo_pp2_dp2_fixed: the slowest rank's host_launch bubble time in a step rounds to
    0.0 ms; the numbers keep it, the terminal's cause lists leave it out."""
    analysis = analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2_fixed", cache_dir=cache_dir))
    slowest = metrics.slowest_rank_bubbles(analysis)
    assert [c for s in slowest.values() for c, ms in s.by_cause.items() if round(ms, 1) == 0]
    console = Console(record=True, width=300)
    print_analysis(console, summarize(analysis), analysis)
    cause_lines = [line for line in console.export_text().splitlines() if "bubble time" in line]
    assert len(cause_lines) == 2 * len(slowest)
    assert not [line for line in cause_lines if " 0.0" in line], cause_lines


def test_stragglers_line_says_what_the_peer_lists_are(cache_dir: Path) -> None:
    """gloo_pp2_dp2: rank 1 (its 200 ms sleep) is the straggler, judged against the ranks of
    its pipeline stage: stage 0 is ranks 0 and 2, stage 1 ranks 1 and 3."""
    analysis = analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", cache_dir=cache_dir))
    summary = summarize(analysis)
    assert summary["stragglers"]["peers"] == [[0, 2], [1, 3]]
    [line] = [line for line in straggler_lines(summary) if "stragglers" in line]
    assert line == ("compute stragglers: [1] (judged against peers doing the same work: "
                    "[0, 2], [1, 3])")
