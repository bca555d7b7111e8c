"""Stragglers are judged against peers doing the same work, on real profiles read by hand.

- torch_npu_pp2dp2_level2_comm (PP2 × DP2; pp groups [0, 2] and [1, 3], dp [0, 1] and [2, 3]):
  ranks 1 and 3 ship no kernel_details.csv, so only ranks 0 (stage 0) and 2 (stage 1) hold
  compute; step_trace_time.csv: Computing 231290 µs on rank 0, 400448 µs on rank 2 (the last
  stage computes the loss over a 151936-word vocabulary: Exp / Sub / Div kernels rank 0 never
  runs). Neither has a replica whose compute is in the profile: no straggler can be named.
- torch_npu_2023_comm: both kernel_details.csv are 21- and 22-row excerpts (their step 2 spans
  267.850 / 16.420 ms of step_trace_time.csv's 291.698 / 294.587 ms).
- gloo_pp2_dp2: rank 1 sleeps 200 ms; dp groups [0, 2] and [1, 3] (pg_config).
- tests/data/corpus: pp4_1f1b_* are PP4 whose stage 0 has one layer more and stage 3 the loss
  (stages 1 and 2 run the same ops); world_metrics_allreduce is a healthy PP2 × DP2 control.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

import tracegraph
from tests.conftest import REAL
from tests.corpus import CASES, folder, truth
from tests.test_checks import run_cli
from tracegraph import causes
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.bubbles import INCOMPLETE_CONFIDENCE
from tracegraph.analysis.peers import op_mix

PP2DP2 = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
EXCERPTS = REAL / "ascend" / "torch_npu_2023_comm"


@cache
def analysed(path: Path) -> Analysis:
    return analyze(tracegraph.load(path, use_cache=False))


def test_the_last_pipeline_stage_is_not_a_straggler_of_the_first():
    analysis = analysed(PP2DP2)
    compute = analysis.ops.frame.groupby("rank")["kind"].apply(lambda k: (k == "compute").sum())
    assert set(compute[compute > 0].index) == {0, 2}  # ranks 1, 3: communication.json only
    assert {"aclnnExp_ExpAiCore_Exp"} <= set(op_mix(analysis.ops).loc[2][lambda n: n > 0].index)
    assert analysis.slow_ranks == set()
    assert not analysis.slow_op.any()
    assert not [b for b in analysis.bubbles if b.category == causes.COMPUTE_STRAGGLER]
    unjudged = analysis.peers.unjudged
    assert set(unjudged) == {0, 2}
    # step_trace_time.csv's Computing, by hand: 230903.72 µs (rank 1), 401131.7 µs (rank 3)
    no_timeline = "its profile holds no compute timeline; its step table states Computing"
    assert unjudged[0].endswith(f"rank 1: {no_timeline} 230.9 ms")
    assert unjudged[2].endswith(f"rank 3: {no_timeline} 401.1 ms")


def test_analyze_says_who_was_not_judged_and_why(tmp_path: Path):
    run = run_cli("analyze", PP2DP2, "--json", "--cache-dir", tmp_path)
    summary = json.loads(run.stdout)
    assert summary["slow_ranks"] == [] and summary["stragglers"]["peers"] == []
    assert set(summary["stragglers"]["not_judged"]) == {"0", "2"}
    text = run_cli("analyze", PP2DP2, "--cache-dir", tmp_path, "--detail").stdout
    assert "compute stragglers: none named" in text
    assert "rank 2 not judged: no peer doing the same work" in text


def test_no_straggler_is_named_from_tables_the_parser_knows_are_incomplete():
    analysis = analysed(EXCERPTS)
    assert analysis.trace.incomplete_ranks().keys() == {0, 1}
    assert "span 16.420 ms, step_trace_time.csv's Stage 294.587 ms" in \
        analysis.trace.incomplete_ranks()[1]
    assert analysis.slow_ranks == set() and not analysis.slow_op.any()
    assert set(analysis.peers.unjudged) == {0, 1}
    assert all("misses events" in why for why in analysis.peers.unjudged.values())
    assert analysis.bubbles
    for bubble in analysis.bubbles:
        assert bubble.sureness == "low" and bubble.confidence == INCOMPLETE_CONFIDENCE
        assert "profile misses events" in bubble.evidence


def test_a_complete_table_is_not_flagged():
    assert analysed(PP2DP2).trace.incomplete_ranks() == {}
    assert all(b.confidence > INCOMPLETE_CONFIDENCE for b in analysed(PP2DP2).bubbles)


def test_dp_replicas_are_peers_and_the_sleeper_is_named(real: Path):
    analysis = analysed(real / "kineto" / "gloo_pp2_dp2")
    assert analysis.peers.groups() == [[0, 2], [1, 3]]
    assert analysis.slow_ranks == {1}


@pytest.mark.parametrize("case", ["pp4_1f1b_healthy", "pp4_1f1b_bwd_straggler"])
def test_pipeline_stages_with_the_same_ops_are_peers(case: str):
    analysis = analysed(folder(case))
    assert analysis.peers.groups() == [[1, 2]]  # stage 0 embeds, stage 3 computes the loss
    assert set(analysis.peers.unjudged) == {0, 3}
    assert analysis.slow_ranks == ({2} if case.endswith("straggler") else set())


def test_two_peers_judge_each_other_against_the_other_pairs_spread():
    """In the healthy PP2 × DP2 control each pair's ranks differ by up to 45 % (a busy host):
    as much as the other pair's, so no straggler."""
    analysis = analysed(folder("world_metrics_allreduce"))
    assert analysis.peers.groups() == [[0, 2], [1, 3]]
    assert analysis.slow_ranks == set()


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_stragglers_are_the_injected_ones(case: str):
    """Each step's stragglers are the ranks that slept in that step: ground_truth.json's
    compute_straggler injections (pp4_1f1b_bwd_straggler: 50 ms in each of 8 backwards) on a
    rank with a peer, in the profiled steps; no healthy rank in any step. A rank
    that slept in one step only (dp4_opt_straggler: rank 1, step 2) is that step's straggler,
    not the next step's, where the others wait for it. In hsdp_tail_* rank 3's 150 ms sleep sits
    beside 250 ms of LOCAL_WORK that every rank does: 1.6x its peer's step, below STEP_FACTOR
    (the whole-profile judgement names it)."""
    t = truth(case)
    analysis = analysed(folder(case))
    slept = {(step, i["rank"]) for i in t["injections"] if i["rank"] in analysis.peers.classes
             and i["root_category"] == causes.COMPUTE_STRAGGLER and not case.startswith("hsdp")
             for step in i["steps"]}
    found = set(zip(analysis.step_stragglers["step"], analysis.step_stragglers["rank"],
                    strict=True))
    assert found == slept
    assert (analysis.step_stragglers["ratio"] >= 2).all()
    if case == "dp4_opt_straggler":  # its sleep is compute_straggler in step 2 only
        slow = analysis.ops.frame[analysis.slow_op]
        assert set(zip(slow["rank"], slow["name"], strict=True)) >= {(1, "straggler_sleep")}


def test_analyze_lists_each_steps_stragglers(tmp_path: Path):
    """dp4_opt_straggler: rank 1 sleeps 200 ms in OPT step of step 2, its peers work ~3.5 ms."""
    bundle = folder("dp4_opt_straggler")
    summary = json.loads(run_cli("analyze", bundle, "--json", "--cache-dir", tmp_path).stdout)
    [row] = summary["stragglers"]["by_step"]
    assert (row["step"], row["rank"]) == (2, 1) and row["work_ms"] > 200 > 20 * row["peers_ms"]
    text = " ".join(run_cli("analyze", bundle, "--detail", "--cache-dir", tmp_path).stdout.split())
    assert f"in step 2: rank 1 worked {row['work_ms']:.1f} ms, {row['ratio']:.1f}×" in text
