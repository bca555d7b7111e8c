"""`diff` refuses to compare profiles that cannot be runs of one job (tracegraph/verify/samejob.py).

What the real profiles hold, read from their files: `gloo_pp2_dp2` and its `_fixed` rerun are
Kineto, world_size 4 in distributedInfo, ranks 0-3, groups default_pg [0-3], dp_stage0 [0, 2],
dp_stage1 [1, 3]; `torch_npu_ddp8_level1` is Ascend (torch_npu), ranks 0 and 1 of an HCCL group of
8 (communication_group.json), no world size stated; its `_db_level1` twin is the same job exported
as .db; the bundled seed `hsdp-straggler-sync-ascend` is Ascend, ranks 0, 4096, 8192, 12288 with
twelve whole HSDP and PP groups.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REAL, REPO
from tests.test_checks import run_cli
from tracegraph import schema
from tracegraph.loading.loader import load
from tracegraph.loading.trace import Trace
from tracegraph.verify.samejob import differences

SAMPLES = REPO / "sample_traces"
GLOO, GLOO_FIXED = SAMPLES / "gloo_pp2_dp2", SAMPLES / "gloo_pp2_dp2_fixed"
DDP8 = REAL / "ascend" / "torch_npu_ddp8_level1"
SEED_SYNC = SAMPLES / "simulated" / "hsdp-straggler-sync-ascend.tar.gz"


def one_line(text: str) -> str:
    return " ".join(text.split())


# --- the command -------------------------------------------------------------------------------
def test_kineto_pp2dp2_against_ascend_ddp8_is_refused_in_one_line(tmp_path: Path) -> None:
    run = run_cli("diff", GLOO, DDP8, "--cache-dir", tmp_path / "cache")
    assert run.exit_code == 2 and run.stdout == ""
    [error] = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert str(GLOO) in error and str(DDP8) in error
    assert "profiler kineto vs ascend; world size 4 vs at least 8" in error
    assert "--allow-different-jobs" in error and "Traceback" not in run.stderr


def test_the_seed_bundle_against_the_gloo_fix_is_refused(tmp_path: Path) -> None:
    run = run_cli("diff", SEED_SYNC, GLOO_FIXED, "--json",
                  "--cache-dir", tmp_path / "cache")
    assert run.exit_code == 2 and run.stdout == ""
    error = one_line(run.stderr)
    assert (f"{SEED_SYNC} and {GLOO_FIXED} cannot be runs of the same job: profiler ascend vs "
            "kineto; world size at least 12289 vs 4; no communication group in common (12 vs 3 "
            "groups, none with the same members)") in error


def test_allow_different_jobs_compares_with_the_warning_in_every_output(tmp_path: Path) -> None:
    md = tmp_path / "diff.md"
    run = run_cli("diff", GLOO, DDP8, "--allow-different-jobs", "--json", "--markdown", md,
                  "--cache-dir", tmp_path / "cache")
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert report["warnings"][0].startswith(f"{GLOO} and {DDP8} cannot be runs of the same job")
    assert report["warnings"][0].endswith("compared anyway (--allow-different-jobs)")
    assert "compared anyway" in one_line(run.stderr) and "compared anyway" in md.read_text()


def test_a_stray_run_among_repeated_runs_is_named(tmp_path: Path) -> None:
    run = run_cli("diff", "--before", GLOO, "--before", GLOO_FIXED, "--after", GLOO_FIXED,
                  "--after", DDP8, "--cache-dir", tmp_path / "cache")
    assert run.exit_code == 2
    assert f"{GLOO} and {DDP8} cannot be runs of the same job" in one_line(run.stderr)


# --- the rules ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gloo() -> Trace:
    return load(GLOO, use_cache=False)


def variant(trace: Trace, ranks: list[int] | None = None, world_size: int | None = None,
            groups: list[tuple[list[int], str]] | None = None) -> Trace:
    """`trace`'s ranks and groups, cut to `ranks`, with another stated world size (-1: none) or
    other groups ((members, source) each; their names and dims carry no weight here)."""
    table = trace.ranks[trace.ranks["rank"].isin(ranks)] if ranks else trace.ranks.copy()
    if world_size is not None:
        table = table.assign(world_size=world_size)
    frame = trace.groups if groups is None else pd.DataFrame(
        [{"group": str(i), "name": "", "desc": "", "dim": "", "ranks": members,
          "size": len(members), "source": source} for i, (members, source) in enumerate(groups)],
        columns=schema.GROUPS.names)
    return Trace(source=trace.source, events=pd.DataFrame(), groups=frame,
                 ranks=table.reset_index(drop=True))


def test_what_a_fix_may_change_is_the_same_job(gloo: Trace) -> None:
    # fewer ranks profiled, and a new parallel layout that keeps the world group
    relaid = variant(gloo, ranks=[0, 1], groups=[([0, 1, 2, 3], "pg_config"), ([0, 1], "pg")])
    assert differences(gloo, relaid) == [] and differences(relaid, gloo) == []
    # the bundled pairs, as loaded
    assert differences(gloo, load(GLOO_FIXED, use_cache=False)) == []
    async_seed = SAMPLES / "simulated" / "hsdp-straggler-async-ascend.tar.gz"
    assert differences(load(SEED_SYNC, use_cache=False), load(async_seed, use_cache=False)) == []


def test_ascend_text_and_db_exports_are_one_profiler_family(real: Path) -> None:
    text = load(real / "ascend" / "torch_npu_ddp8_level1", use_cache=False)
    db = load(real / "ascend" / "torch_npu_ddp8_db_level1", use_cache=False)
    assert differences(text, db) == []


def test_no_rank_in_common(gloo: Trace) -> None:
    low = variant(gloo, ranks=[0, 1], world_size=-1, groups=[])
    high = variant(gloo, ranks=[2, 3], world_size=-1, groups=[])
    assert differences(low, high) == ["no rank in common (ranks 0, 1 vs 2, 3)"]


def test_world_sizes_stated_or_implied(gloo: Trace) -> None:
    assert differences(gloo, variant(gloo, world_size=8)) == ["world size 4 vs 8"]
    unstated = variant(gloo, world_size=-1, groups=[([0, 1, 2, 3, 4, 5], "observed")])
    assert differences(gloo, unstated) == ["world size 4 vs at least 6"]
    assert differences(unstated, gloo) == ["world size at least 6 vs 4"]
    within = variant(gloo, world_size=-1, groups=[([0, 1, 2, 3], "hccl")])
    assert differences(gloo, within) == []  # nothing beyond 4: it may be the same job


def test_disjoint_group_layouts_and_observed_groups(gloo: Trace) -> None:
    pairs = variant(gloo, groups=[([0, 2], "pg"), ([1, 3], "pg")])
    halves = variant(gloo, groups=[([0, 1], "pg"), ([2, 3], "pg")])
    assert differences(pairs, halves) == [
        "no communication group in common (2 vs 2 groups, none with the same members)"]
    seen = variant(gloo, groups=[([0, 1], "observed"), ([2, 3], "observed")])
    assert differences(pairs, seen) == []  # members seen in use, not stated: no layout known
