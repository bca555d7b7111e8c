"""Loading whole bundles: merge of ranks, groups, cache, rank map, archives, duplicates."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import parsers
import tracegraph
from parsers.base import TraceError
from tests.conftest import SAMPLES
from tracegraph import schema
from tracegraph.loading.inventory import inventory

GLOO = "kineto/gloo_pp2_dp2"


def test_gloo_bundle_merges_four_ranks_and_their_groups(real: Path, cache_dir: Path) -> None:
    trace = tracegraph.load(real / GLOO, cache_dir=cache_dir)
    assert trace.rank_ids == [0, 1, 2, 3]
    members = trace.group_members()
    # distributedInfo.pg_config, read by hand: "0" default_pg [0..3], "1" dp_stage0 [0, 2] (ranks
    # 0 and 2 list it), "2" dp_stage1 [1, 3] (ranks 1 and 3 list it).
    assert members["0"] == (0, 1, 2, 3)
    assert members["1"] == (0, 2)
    assert members["2"] == (1, 3)
    dims = dict(zip(trace.groups["group"], trace.groups["dim"], strict=True))
    assert dims == {"0": "world", "1": "dp", "2": "dp"}
    summary = inventory(trace)
    steps = {r["rank"]: r["steps"] for r in summary["ranks"]}
    for rank in range(4):  # README: step ≈ 225 ms, ProfilerStep#2 and #3 held
        assert set(steps[rank]) == {"2", "3"}
        assert 200 < steps[rank]["2"] < 240


def test_gloo_p2p_peers_are_global_once_loaded(real: Path, cache_dir: Path) -> None:
    """Rank 0's sends name local peer "1", which its pg_config fits to rank 1 (group "0") and
    to rank 2 (dp_stage0 [0, 2]); rank 2 never names local peer 0, so it is rank 1 on "0" (the
    README: P2P within replica A = ranks 0, 1 and replica B = ranks 2, 3)."""
    trace = tracegraph.load(real / GLOO, cache_dir=cache_dir)
    p2p = trace.events[trace.events["name"].isin(["gloo:send", "gloo:recv"])]
    peers = {int(r): set(p) for r, p in p2p.groupby("rank")["peer"]}
    assert peers == {0: {1}, 1: {0}, 2: {3}, 3: {2}}
    assert set(p2p["group"]) == {"0"}
    assert not [w for w in trace.warnings if "gloo" in w]


def test_ascend_pp2dp2_groups(real: Path, cache_dir: Path) -> None:
    trace = tracegraph.load(real / "ascend/torch_npu_pp2dp2_level2_comm", cache_dir=cache_dir)
    assert trace.rank_ids == [0, 1, 2, 3]
    pp = trace.groups[trace.groups["desc"] == "pp"]
    assert sorted(tuple(r) for r in pp["ranks"]) == [(0, 2), (1, 3)]
    assert set(pp["dim"]) == {"pp"}


def test_export_writes_the_public_schema(real: Path, tmp_path: Path, cache_dir: Path) -> None:
    trace = tracegraph.load(real / GLOO, cache_dir=cache_dir)
    written = trace.to_parquet(tmp_path / "out")
    assert [p.name for p in written] == ["events.parquet", "groups.parquet", "ranks.parquet",
                                         "memory.parquet"]
    memory = pq.read_table(tmp_path / "out" / "memory.parquet")
    assert memory.schema.names == schema.MEMORY.names and memory.num_rows == 0  # none recorded
    events = pq.read_table(tmp_path / "out" / "events.parquet")
    assert events.schema.equals(schema.EVENTS)  # plain strings, whatever the trace holds
    assert events.num_rows == len(trace.events)
    ranks = pq.read_table(tmp_path / "out" / "ranks.parquet").to_pandas()
    assert ranks["events"].sum() == len(trace.events)


def test_event_strings_are_held_once_per_distinct_value(real: Path, cache_dir: Path) -> None:
    """Every string column of the events is a Categorical over Python strings: a value used by
    many rows is one object (codes of 2 bytes or less a row here), and reads back as it is."""
    trace = tracegraph.load(real / GLOO, cache_dir=cache_dir)
    events = trace.events
    for name in schema.STRING_DEFAULTS:
        column = events[name]
        assert isinstance(column.dtype, pd.CategoricalDtype), name
        assert column.cat.categories.dtype == object, name
        assert column.cat.codes.dtype.itemsize <= 2, name
        values = column.to_numpy()
        first = {}
        assert all(first.setdefault(v, v) is v for v in values), name  # shared objects
    kinds = events["kind"].to_numpy()
    assert set(kinds) <= set(schema.KINDS) and (kinds == schema.HOST).sum() > 0
    per_event = events.memory_usage(deep=True).sum() / len(events)
    assert per_event < 120, per_event  # 13 integer columns (84 bytes) and 10 small codes


def test_second_load_comes_from_the_cache(real: Path, cache_dir: Path, monkeypatch) -> None:
    first = tracegraph.load(real / GLOO, cache_dir=cache_dir, jobs=1)

    def refuse(*_args, **_kwargs):
        raise AssertionError("parsed again although the cache holds every rank")

    monkeypatch.setattr("tracegraph.loading.loader.parse_rank", refuse)
    second = tracegraph.load(real / GLOO, cache_dir=cache_dir, jobs=1)
    assert second.events.equals(first.events)
    assert not any(cache_dir.glob("*.tmp"))


def test_archive_loads_like_the_folder(real: Path, tmp_path: Path) -> None:
    archive = tmp_path / "gloo.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(real / GLOO, arcname="gloo_pp2_dp2")
    from_dir = tracegraph.load(real / GLOO, use_cache=False, jobs=1)
    from_tar = tracegraph.load(archive, use_cache=False, jobs=2)  # streamed to worker processes
    assert from_tar.rank_ids == from_dir.rank_ids
    assert len(from_tar.events) == len(from_dir.events)
    assert from_tar.events["start_ns"].sum() == from_dir.events["start_ns"].sum()


def test_two_different_profiles_of_one_rank_are_refused(real: Path, tmp_path: Path) -> None:
    """rank0.json of the job and of its fixed rerun both state rank 0: which is meant cannot
    be told."""
    shutil.copy(real / GLOO / "rank0.json", tmp_path / "a.json")
    shutil.copy(real / "kineto/gloo_pp2_dp2_fixed/rank0.json", tmp_path / "b.json")
    with pytest.raises(TraceError, match=r"b\.json: duplicate rank 0 \(also a\.json\)"):
        tracegraph.load(tmp_path, use_cache=False)


def test_a_copy_of_a_profile_is_read_once_with_a_warning(real: Path, tmp_path: Path) -> None:
    shutil.copy(real / GLOO / "rank0.json", tmp_path / "a.json")
    shutil.copy(real / GLOO / "rank0.json", tmp_path / "b.json")
    trace = tracegraph.load(tmp_path, use_cache=False)
    assert trace.rank_ids == [0]
    assert list(trace.ranks["path"]) == ["a.json"]
    assert len(trace.events) == len(tracegraph.load(real / GLOO / "rank0.json",
                                                    use_cache=False).events)
    assert "rank 0: b.json is a copy of a.json; read once" in trace.warnings


def test_rank_map_names_a_rankless_profile(real: Path, tmp_path: Path) -> None:
    """Beside another rank's profile, a Kineto file that states no rank needs --rank-map."""
    source = real / "kineto/hta/rank_unavailable/rank_not_found.json.gz"
    shutil.copy(source, tmp_path / source.name)
    shutil.copy(real / GLOO / "rank1.json", tmp_path / "rank1.json")
    with pytest.raises(TraceError, match="--rank-map"):
        tracegraph.load(tmp_path, use_cache=False)
    trace = tracegraph.load(tmp_path, use_cache=False, rank_map={source.name: 7})
    assert trace.rank_ids == [1, 7]
    assert set(trace.events["rank"]) == {1, 7}


def test_a_lone_rankless_kineto_file_is_rank_0_with_a_warning(real: Path) -> None:
    """HTA's rank_not_found.json.gz handed over on its own (no distributedInfo.rank, no rank in
    its name) is read as rank 0, said in a warning, as a lone Ascend trace_view.json is."""
    trace = tracegraph.load(real / "kineto/hta/rank_unavailable/rank_not_found.json.gz",
                            use_cache=False)
    assert trace.rank_ids == [0] and set(trace.events["rank"]) == {0}
    assert [w for w in trace.warnings if "rank_not_found.json.gz: no rank stated" in w
            and "taken as rank 0 (--rank-map sets it)" in w]


def test_parse_rank_rejects_unknown_formats() -> None:
    files = parsers.RankFiles("nvtx", "x", {})
    with pytest.raises(TraceError, match="unknown profile format"):
        parsers.parse_rank(files, lambda member: b"")


def test_rank_map_file_must_be_json(tmp_path: Path) -> None:
    from tracegraph.cli.common import read_rank_map as _read_rank_map

    bad = tmp_path / "map.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(TraceError, match="map.json"):
        _read_rank_map(bad)


def test_long_rank_lists_are_cut_in_warnings() -> None:
    """The seed bundle misses 508 ranks of its groups: the warning lists runs, then a count."""
    from parsers.groups import span_text

    assert span_text([0, 1, 2, 3, 9]) == "0-3, 9"
    strided = span_text(range(32, 32 * 509, 32))
    assert strided.startswith("32, 64, 96") and strided.endswith("… (508 ranks in all)")
    assert strided.count(",") == 16


def test_inventory_counts_host_calls(real: Path, cache_dir: Path) -> None:
    """HTA negative_queue_length_values_check rank 0, read by hand: 55 `c10d::alltoall_base_`,
    10 each of allreduce_, _allgather_base_, _reduce_scatter_base_ (cpu_ops); 80 SendRecv
    kernels, 75 launched inside those calls (10 all-to-all calls launched none the trace kept)
    and 5 whose launch the trace does not hold (their type unknown: NCCL runs all-to-all and
    P2P with the same kernel). mi300: 6 allreduce_ and 6 broadcast_ calls (each with a nested
    record_param_comms, not counted again), 5 Generic kernels launched before the window.
    The corpus' gloo ranks: 8 c10d::send, 8 c10d::recv_ and 2 c10d::allreduce_ each."""
    def comm_ops(bundle: Path) -> list[dict[str, object]]:
        return inventory(tracegraph.load(bundle, cache_dir=cache_dir))["ranks"][0]["comm_ops"]

    hta = comm_ops(real / "kineto/hta/negative_queue_length_values_check")
    assert {(c["comm"], c["count"], c.get("no_kernel")) for c in hta if "host_call" not in c} == {
        ("allgather", 10, 0), ("allreduce", 10, 0), ("alltoall", 55, 10),
        ("reducescatter", 10, 0)}
    assert [c for c in hta if "host_call" in c] == [
        {"comm": "", "group": "", "count": 5, "host_call": False, "kernel": "SendRecv"}]
    mi300 = comm_ops(real / "kineto/tracelens/mi300")
    assert [(c["comm"], c["count"], c.get("kernel")) for c in mi300] == [
        ("allreduce", 6, None), ("broadcast", 6, None), ("", 5, "Generic")]
    gloo = comm_ops(Path(__file__).parent / "data/corpus/pp2dp2_wait_before_send")
    assert [(c["comm"], c["group"], c["count"]) for c in gloo] == [
        ("allreduce", "1", 2), ("recv", "3", 8), ("send", "3", 8)]


def test_inventory_counts_what_each_rank_holds(cache_dir: Path) -> None:
    """A rank's kinds, lanes and comm ops are its own, in the order of their names (the
    events' string coding is shared by every rank: a kind only another rank has is not
    listed with 0)."""
    trace = tracegraph.load(SAMPLES / "simulated/hsdp-straggler-sync-ascend.tar.gz",
                            cache_dir=cache_dir)
    summary = inventory(trace)
    events = trace.events
    for rank in summary["ranks"]:
        mine = events[events["rank"] == rank["rank"]]
        assert rank["kinds"] == {k: int((mine["kind"] == k).sum()) for k in rank["kinds"]}
        assert set(rank["kinds"]) == set(mine["kind"].astype(str))
        assert all(n > 0 for n in rank["kinds"].values())
        comm = [(c["comm"], c["group"]) for c in rank["comm_ops"]]
        assert comm == sorted(comm) and comm
