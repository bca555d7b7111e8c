"""Verdicts on the recorded corpus (real PyTorch-profiler runs with injected causes).

The ground truth is what bench/record_corpus.py injected, never tracegraph's own output: each
expected wait (a rank waiting on the injected rank in a step) must be the rank's longest bubble
of that step, charged to the injected cause along the injected chain of ranks, to the injected
rank (or, when it is not in the bundle, asking to profile it); healthy controls have no
straggler."""

from __future__ import annotations

import pytest

import tracegraph
from tests.corpus import CASES, folder, truth
from tracegraph import causes
from tracegraph.analysis.analyze import Analysis, analyze

INJECTED = [c for c in CASES if not truth(c).get("healthy")]
HEALTHY = [c for c in CASES if truth(c).get("healthy")]


def analysed(case: str) -> Analysis:
    return analyze(tracegraph.load(folder(case), use_cache=False))


def expected_waits(case: str) -> list[tuple[int, int, dict]]:
    """(rank, step, wait) for each wait of the truth in each step its injection covers."""
    known = truth(case)
    steps = sorted({s for i in known["injections"] for s in i.get("steps") or
                    known["profiled_steps"]})
    return [(w["rank"], step, w) for w in known["expected"]["waits"]
            for step in ([w["step"]] if w.get("step") else steps)]


@pytest.mark.parametrize("case", INJECTED)
def test_each_wait_is_charged_to_the_injected_rank(case: str) -> None:
    analysis, root = analysed(case), truth(case)["expected"]["root_rank"]
    absent = set(truth(case)["absent_ranks"])
    for rank, step, wait in expected_waits(case):
        mine = [b for b in analysis.bubbles if b.rank == rank and b.step == step]
        assert mine, f"rank {rank} step {step}: no bubble"
        if wait.get("per_microbatch"):
            assert_charged_per_microbatch(case, mine, root, wait)
            continue
        longest = max(mine, key=lambda b: b.dur)
        where = f"rank {rank} step {step}: {longest.name} {longest.dur / 1e6:.1f} ms"
        assert longest.dur >= 0.5 * wait["approx_ms"] * 1e6, where
        assert longest.category == wait["category"], where
        assert longest.chain() == [r for r in wait["chain"] if r not in absent], where
        if root in absent:  # like the seed: the chain ends in a group with the root unprofiled
            assert root in unprofiled_members(analysis, longest), where
        else:
            assert longest.root.rank == root, where


def unprofiled_members(analysis: Analysis, bubble) -> list[int]:
    """The ranks the verdict asks to profile: its root group's members absent from the bundle."""
    members = analysis.trace.group_members().get(bubble.root.unprofiled_group, ())
    return [r for r in members if r not in analysis.trace.rank_ids]


def assert_charged_per_microbatch(case: str, mine: list, root: int, wait: dict) -> None:
    """A wait for every microbatch: of the step's injected delay (microbatches × ms), at least
    three quarters is charged to the injected rank and cause (the rest overlaps work)."""
    (injection,) = truth(case)["injections"]
    injected_ms = len(injection["microbatches"]) * injection["duration_ms"]
    charged = sum(i.dur for b in mine for i in b.intervals
                  if (i.rank, i.category) == (root, wait["category"])) / 1e6
    assert charged >= 0.75 * injected_ms, f"rank {mine[0].rank}: {charged:.1f} ms charged"


@pytest.mark.parametrize("case", HEALTHY)
def test_healthy_controls_have_no_straggler(case: str) -> None:
    analysis = analysed(case)
    assert analysis.slow_ranks == set()
    straggling = [b for b in analysis.bubbles if b.category == causes.COMPUTE_STRAGGLER]
    assert not straggling, [(b.rank, b.step, b.name, b.dur) for b in straggling[:3]]


def test_the_seed_fix_pair_passes_the_check_only_after_the_fix() -> None:
    """The seed's check (the main lane never waits on a DP reduction before its P2P send) on
    the recorded bug and fix: the bug fails it on both stage-1 ranks (their DP_GRAD_WAIT comes
    before BWD_SEND by construction), the fix passes it."""
    from tracegraph.verify.checks import evaluate, preset

    rule = [r for r in preset("hsdp-async-reduction") if r.type == "no_reduction_wait_before_p2p"]
    (bug,) = evaluate(rule, analysed("pp2dp2_wait_before_send"))
    (fix,) = evaluate(rule, analysed("pp2dp2_wait_after_send"))
    assert not bug.passed and {v.rank for v in bug.violations} == {2, 3}
    assert fix.passed and not fix.violations


@pytest.mark.parametrize("case", CASES)
def test_unprofiled_members_only_when_ranks_are_absent(case: str) -> None:
    """Every rank of a group profiled: no wait is blamed on 'unprofiled members'; a rank
    absent: the verdict names it."""
    analysis = analysed(case)
    absent = set(truth(case)["absent_ranks"])
    named = {r for b in analysis.bubbles for i in b.intervals if i.unprofiled_group
             for r in analysis.trace.group_members()[i.unprofiled_group]
             if r not in analysis.trace.rank_ids}
    assert named <= absent
    if not absent:
        assert not any("absent from the bundle" in i.note for b in analysis.bubbles
                       for i in b.intervals)


@pytest.mark.parametrize("case", [c for c in CASES if truth(c)["parallelism"]["pp"] == 1])
def test_a_job_without_a_pipeline_has_no_pipeline_causes(case: str) -> None:
    charged = {i.category for b in analysed(case).bubbles for i in b.intervals}
    assert not charged & {causes.PIPELINE_FILL, causes.PP_P2P}, charged
