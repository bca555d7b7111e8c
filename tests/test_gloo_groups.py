"""Process groups, global peers and group membership on real gloo and Ascend profiles.

The known answers are the recorded corpus's ground_truth.json (`groups`: torch's own pg names,
ranks and roles from `pg_config`; `parallelism.stage_of_rank`) and facts read by hand from the
files, cited where used. torch 2.13's gloo names no group on any op and gives P2P peers as
group-local ranks (tests/data/corpus/README.md, "Quirks"), so each fact below is one the loader
must derive; none holds on the code before the cross-rank step (tracegraph/loading/resolve.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from tests.corpus import CASES, folder, raw, truth
from tracegraph.loading.groups import parallel_dim
from tracegraph.loading.trace import Trace

GLOO_OPS = ("gloo:all_reduce", "gloo:all_to_all")
P2P_OPS = ("c10d::send", "c10d::recv_", "gloo:send", "gloo:recv")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trace]:
    cache = tmp_path_factory.mktemp("cache")
    return {case: tracegraph.load(folder(case), cache_dir=cache, jobs=1) for case in CASES}


def _truth_groups(case: str) -> dict[str, dict]:
    """The truth's groups that some file of the case lists (pp2dp2_one_replica lacks the
    pg_config of ranks 1 and 3, so nothing in it states group "4")."""
    return {g["name"]: g for g in truth(case)["groups"] if g["listed_by"]}


def _dp_group_of(case: str, rank: int) -> str:
    return next(name for name, g in _truth_groups(case).items()
                if g["dim"] == "dp" and rank in g["ranks"])


def _ops(trace: Trace, names: tuple[str, ...]) -> pd.DataFrame:
    return trace.events[trace.events["name"].isin(names)]


# --- defect 1: the group of each worker-thread collective --------------------------------------
@pytest.mark.parametrize("case", ["pp2dp2_wait_before_send", "pp2dp2_wait_after_send"])
def test_dp_all_reduce_runs_on_the_dp_group_of_its_rank(loaded: dict[str, Trace], case: str
                                                        ) -> None:
    ops = _ops(loaded[case], ("gloo:all_reduce", "c10d::allreduce_"))
    assert len(ops) == 16  # per rank: 2 steps x (c10d::allreduce_ + its gloo:all_reduce)
    for rank, mine in ops.groupby("rank"):
        assert set(mine["group"]) == {_dp_group_of(case, int(rank))}  # "1" for 0, 1; "2" else


def test_one_replica_all_reduce_on_its_dp_group_though_the_partner_is_absent(
        loaded: dict[str, Trace]) -> None:
    ops = _ops(loaded["pp2dp2_one_replica"], ("gloo:all_reduce",))
    assert dict(zip(ops["rank"], ops["group"], strict=True)) == {0: "1", 2: "2"}


def test_world_metrics_dp_reductions_settled_and_the_world_one_left_open(
        loaded: dict[str, Trace]) -> None:
    """The DP all_reduce (stage 0: 3 layers of 128 x 129 floats, stage 1: 2) runs on
    dp_stage0 / dp_stage1 ("3" / "4"); the 1-float metrics all_reduce runs on the world group,
    which nothing in the files proves (each rank's PP and DP groups fit its timing too): it
    stays group-less, never put on a DP group."""
    trace = loaded["world_metrics_allreduce"]
    ops = _ops(trace, ("gloo:all_reduce",))
    dp = ops[ops["bytes"].isin([3 * 128 * 129 * 4, 2 * 128 * 129 * 4])]
    assert len(dp) == 8
    assert all(g == _dp_group_of("world_metrics_allreduce", r)
               for r, g in zip(dp["rank"], dp["group"], strict=True))
    assert set(ops.loc[ops["bytes"] == 4, "group"]) == {""}
    said = [w for w in trace.warnings
            if "gloo collectives on 2 worker thread(s) is one of 0, " in w]
    assert len(said) == 4  # each step's metrics all_reduce fits the world group, both ranks'
    assert all("; 4 assignments of the open worker threads" in w for w in said)  # world or
    # pp, alike on all four ranks, in each of the 2 steps: not dp, whose worker threads (gloo
    # starts a group's together) are the two settled ones, further away


def test_every_assignment_that_fits_is_counted(loaded: dict[str, Trace]) -> None:
    """dp4_before_allreduce: each rank's DP all_reduces fit the world group "0", the DP group
    "5" or, every rank on its own, its TP singleton ("1"-"4"): three assignments, no mix (a
    rank on a group the others are not on would leave that group's members disagreeing)."""
    said = [w for w in loaded["dp4_before_allreduce"].warnings if "worker thread(s)" in w]
    assert [w.split(":")[0] for w in said] == [f"rank {r}" for r in range(4)]
    assert all("; 3 assignments of the open worker threads to groups agree" in w for w in said)


@pytest.mark.parametrize("case", ["pp2dp2_wait_before_send", "hsdp_tail_wait_before_send",
                                  "pp2dp2_one_replica"])
def test_the_members_agreement_alone_settles_the_dp_reductions(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the timing facts (each op's partners overlapping it), the one assignment of the
    worker threads every group's members agree with (the stages' all_reduces differ in size) is
    the truth's: each rank's DP group."""
    from tracegraph.loading import resolve

    monkeypatch.setattr(resolve, "_narrow_collectives", lambda work, bundle: True)
    ops = _ops(tracegraph.load(folder(case), use_cache=False), ("gloo:all_reduce",))
    assert len(ops)
    for rank, mine in ops.groupby("rank"):
        assert set(mine["group"]) == {_dp_group_of(case, int(rank))}


@pytest.mark.parametrize("case", ["dp4_opt_straggler", "dp4_host_stall", "ep4_a2a_layers"])
def test_groups_with_the_same_members_are_not_guessed(loaded: dict[str, Trace], case: str
                                                      ) -> None:
    """Groups "0" and "1" both hold ranks 0-3: no fact in a gloo profile tells them apart."""
    trace = loaded[case]
    assert set(_ops(trace, GLOO_OPS)["group"]) == {""}
    said = [w for w in trace.warnings if "is one of 0, 1 (same members)" in w]
    assert [w.split(":")[0] for w in said] == [f"rank {r}" for r in range(4)]


def test_sequence_numbers_follow_the_issued_order(loaded: dict[str, Trace]) -> None:
    """dp4_fwd_straggler: two async buckets per step; on some rank the worker spans start in
    another order than the c10d::allreduce_ calls (README quirks). The instance numbers follow
    the calls, so every instance has one size on all four ranks."""
    ops = _ops(loaded["dp4_fwd_straggler"], ("gloo:all_reduce",))
    by_start = ops.sort_values("start_ns").groupby("rank")["bytes"].apply(list)
    assert by_start.map(tuple).nunique() > 1  # the spans alone would pair unlike buckets
    assert sorted(ops["seq"].unique()) == [0, 1, 2, 3]
    assert (ops.groupby("seq")["bytes"].nunique() == 1).all()
    assert (ops.groupby("seq")["rank"].nunique() == 4).all()


# --- defect 2: P2P peers are group-local -------------------------------------------------------
@pytest.mark.parametrize("case", ["pp2dp2_wait_before_send", "pp2dp2_wait_after_send",
                                  "pp2dp2_one_replica"])
def test_p2p_has_the_global_peer_of_the_other_stage_and_the_pp_group(
        loaded: dict[str, Trace], case: str) -> None:
    """Every send / recv says peer "1" (stage 0) or "0" (stage 1), local to its PP group."""
    p2p = _ops(loaded[case], P2P_OPS)
    assert len(p2p) == 32 * len(truth(case)["ranks"])
    pp = {r: g for g in _truth_groups(case).values() if g["dim"] == "pp" for r in g["ranks"]}
    for rank, mine in p2p.groupby("rank"):
        other = next(r for r in pp[int(rank)]["ranks"] if r != rank)  # 0<->2, 1<->3
        assert set(mine["peer"]) == {other}
        assert set(mine["group"]) == {pp[int(rank)]["name"]}
        assert set(mine["dst_rank"].where(mine["comm"] == "send", mine["src_rank"])) == {
            pp[int(rank)]["ranks"].index(other)}  # the local peer is kept


@pytest.mark.parametrize("case", ["pp4_1f1b_healthy", "pp4_1f1b_bwd_straggler",
                                  "world_metrics_allreduce"])
def test_p2p_peers_are_the_neighbouring_stages(loaded: dict[str, Trace], case: str) -> None:
    t = truth(case)
    stage = {int(r): s for r, s in t["parallelism"]["stage_of_rank"].items()}
    pp = {r: g["ranks"] for g in t["groups"] if g["dim"] == "pp" for r in g["ranks"]}
    p2p = _ops(loaded[case], P2P_OPS)
    assert (p2p["peer"] >= 0).all()
    for rank, peer in set(zip(p2p["rank"], p2p["peer"], strict=True)):
        assert abs(stage[rank] - stage[peer]) == 1 and peer in pp[rank]


def test_p2p_group_left_open_between_groups_with_the_same_members(
        loaded: dict[str, Trace]) -> None:
    """pp4: PP group "5" and the default group "0" both hold ranks 0-3 in the same order."""
    trace = loaded["pp4_1f1b_healthy"]
    assert set(_ops(trace, P2P_OPS)["group"]) == {""}
    assert sum("group one of 0, 5 (same members)" in w for w in trace.warnings) == 6


# --- defect 3: membership and size from what the profiles state --------------------------------
@pytest.mark.parametrize("case", CASES)
def test_group_members_and_sizes_are_the_truth(loaded: dict[str, Trace], case: str) -> None:
    groups = loaded[case].groups.set_index("group")
    expected = _truth_groups(case)
    assert set(groups.index) == set(expected)  # also those whose threads never appear
    for name, g in expected.items():
        assert list(groups.at[name, "ranks"]) == g["ranks"]
        assert groups.at[name, "size"] == len(g["ranks"])
        assert groups.at[name, "source"] == "pg_config"


def test_ddp8_group_size_is_what_the_profile_states(real: Path, tmp_path: Path) -> None:
    """torch_npu_ddp8_level1 holds 2 of 8 ranks. Nothing states a world size (profiler_info
    has only rank_id, profiler_metadata.json only ENV_VARIABLES); communication_matrix.json's
    `allreduce-*@17522688603477080586` entries link "0-0".."0-7" (rank 0) and "1-0".."1-7"
    (rank 1), and the HCCL tasks' dst rank runs 0..7: group-local ranks 0-7, 8 members."""
    trace = tracegraph.load(real / "ascend/torch_npu_ddp8_level1", cache_dir=tmp_path)
    group = trace.groups.set_index("group").loc["17522688603477080586"]
    assert (group["size"], list(group["ranks"])) == (8, [0, 1])  # only 0, 1 are known by rank
    assert [w for w in trace.warnings if "17522688603477080586 has 8 members" in w] == [
        "group 17522688603477080586 has 8 members (2 in the bundle: 0, 1); the other 6 are not "
        "in the bundle and their global ranks are not stated"]


def test_a_group_is_named_alike_in_warnings_inventory_and_chains(real: Path,
                                                                 tmp_path: Path) -> None:
    """torch_npu_ddp8_db_level1: COMMUNICATION_OP's groupName of hashed group
    17148521525495523210 is "90.91.105.46%enp189s0f0_60000_0_1736410538306028" (read in the
    .db); gloo_pp2_dp2: pg "1" is desc `dp_stage0`. The warning, the comm ops, the groups
    table and the chains name each group by that one label."""
    from tests.test_checks import run_cli

    db = real / "ascend/torch_npu_ddp8_db_level1"
    label = "90.91.105.46%enp189s0f0_60000_0_1736410538306028"
    trace = tracegraph.load(db, cache_dir=tmp_path)
    assert f"group {label} has 8 members (2 in the bundle: 0, 1)" in " ".join(trace.warnings)
    assert not any("17148521525495523210 has" in w for w in trace.warnings)
    text = run_cli("analyze", real / "kineto/gloo_pp2_dp2", "--cache-dir", tmp_path,
                   "--inventory").stdout
    assert "@dp_stage0" in text and "@dp_stage1" in text  # the inventory's comm ops
    rows = {tuple(cell.strip() for cell in line.split("│")[1:4]) for line in text.splitlines()}
    assert {("0", "default_pg", "world"), ("1", "dp_stage0", "dp"),
            ("2", "dp_stage1", "dp")} <= rows  # the groups table: id, name, dim


def test_ascend_world_group_from_parallel_group_info(real: Path, tmp_path: Path) -> None:
    """torch_npu_pp2dp2_level2_comm: parallel_group_info "group_name_0" (default_group) lists
    global_ranks [0, 1, 2, 3]; distributed_args.world_size is 4."""
    trace = tracegraph.load(real / "ascend/torch_npu_pp2dp2_level2_comm", cache_dir=tmp_path)
    world = trace.groups[trace.groups["desc"] == "default_group"].iloc[0]
    assert (list(world["ranks"]), world["size"], world["dim"]) == ([0, 1, 2, 3], 4, "world")
    assert not any("absent" in w for w in trace.warnings)


# --- defect 4: the parallel dimension never contradicts the role -------------------------------
@pytest.mark.parametrize("case", CASES)
def test_dims_never_contradict_the_truth(loaded: dict[str, Trace], case: str) -> None:
    """Right or "" — except that the default group stays "world": in dp4_healthy and
    dp4_fwd_straggler the job uses it for DP (truth "dp"), which its name does not say."""
    dims = dict(zip(loaded[case].groups["group"], loaded[case].groups["dim"], strict=True))
    for name, g in _truth_groups(case).items():
        if g["desc"] == "default_pg":
            assert dims[name] == "world"
        else:
            assert dims[name] in (g["dim"], "")
            if parallel_dim(g["desc"]):  # a group whose name says its role has it
                assert dims[name] == g["dim"]


# --- defect 5: a rank missing from the bundle --------------------------------------------------
def test_one_replica_warns_once_that_ranks_1_and_3_are_absent(loaded: dict[str, Trace]) -> None:
    said = [w for w in loaded["pp2dp2_one_replica"].warnings if "absent" in w]
    assert said == ["2 rank(s) that world_size 4 and the groups' stated members name are absent "
                    "from the bundle: 1, 3"]


@pytest.mark.parametrize("case", [c for c in CASES if not truth(c)["absent_ranks"]])
def test_complete_bundles_do_not_warn_of_absent_ranks(loaded: dict[str, Trace], case: str
                                                      ) -> None:
    assert not [w for w in loaded[case].warnings if "absent" in w]


# --- no guess when the timings contradict every group ------------------------------------------
def test_clocks_apart_leave_the_groups_open(tmp_path: Path) -> None:
    """Rank 3 of pp2dp2_wait_before_send shifted 260 ms earlier: its all_reduces (244.4-245.7
    and 526.9-529.8 ms, rank 2's at 0-245.6 and 285.6-529.7) fall where no rank has one, so
    the timings contradict every group they could be on; nothing is settled by them."""
    case = "pp2dp2_wait_before_send"
    shutil.copytree(folder(case), tmp_path / case)
    doc = raw(case, 3)
    for event in doc["traceEvents"]:
        if "ts" in event:
            event["ts"] -= 260_000
    (tmp_path / case / "rank3.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    trace = tracegraph.load(tmp_path / case, use_cache=False)
    assert any("timings rule out every group" in w for w in trace.warnings)
    assert set(_ops(trace, ("gloo:all_reduce",))["group"]) == {""}


@pytest.mark.parametrize("case", CASES)
def test_the_members_of_an_instance_run_at_one_moment(loaded: dict[str, Trace], case: str
                                                       ) -> None:
    """No member finishes a collective before another starts it: on one host (one clock) the
    members of every numbered instance overlap by more than the slack the settling allows
    (SAME_HOST_SLACK_NS), which is so only a tolerance for the clock's rounding."""
    from tracegraph.loading.resolve import SAME_HOST_SLACK_NS

    ops = _ops(loaded[case], GLOO_OPS)
    ops = ops[(ops["seq"] >= 0) & (ops["group"] != "")]
    ends = ops["start_ns"] + ops["dur_ns"]
    by = ops.assign(end=ends).groupby(["group", "seq"], observed=True)
    apart = (by["start_ns"].max() - by["end"].min()).to_numpy()
    assert (apart < -SAME_HOST_SLACK_NS).all()
