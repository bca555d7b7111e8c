"""Ascend parser on the real torch_npu / msprof profiles in ../shared/real_traces/ascend.

Known answers were counted by hand with a separate script (json.load, then collections.Counter
over the events, grouping them by their `process_name` metadata), or read from the files'
communication.json / profiler_metadata.json; each test says which. The last test checks the
parser against a simulated job written by the simulator's Ascend writer (known by construction).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parsers.ascend import parse
from parsers.base import GroupInfo, ParsedRank, RankFiles, TraceError
from parsers.classify import double_hash
from parsers.values import decimal_micros_to_ns
from tracegraph import schema
from tracegraph.simulate import write_ascend
from tracegraph.simulate.bundle_writer import clock_shift
from tracegraph.simulate.timeline import TIMELINE_COLUMNS, StepSpan, Timeline

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
ASCEND = SHARED / "real_traces" / "ascend"
DDP8 = "torch_npu_ddp8_level1/rank{}_ascend_pt"
PP2DP2 = "torch_npu_pp2dp2_level2_comm/rank_{}_ascend_pt"
DDP8_GROUP = "17522688603477080586"  # the `@group` of every op key in ddp8's communication.json
_OUTPUT = {"trace": "trace_view.json", "communication": "communication.json",
           "matrix": "communication_matrix.json", "step_trace": "step_trace_time.csv"}


def _read(member: str) -> bytes:
    return (ASCEND / member).read_bytes()


def _profile(root: str, rank: int | None = None) -> RankFiles:
    """RankFiles for a real profile folder, with the roles discovery gives its files."""
    base = ASCEND / root
    out = base / "ASCEND_PROFILER_OUTPUT"
    out = out if out.is_dir() else base
    found = {role: out / name for role, name in _OUTPUT.items()}
    found["metadata"] = base / "profiler_metadata.json"
    found["info"] = next(base.glob("profiler_info*.json"), base / "profiler_info.json")
    files = {role: p.relative_to(ASCEND).as_posix() for role, p in found.items() if p.is_file()}
    assert files, f"{base} holds no profile (is ../shared present?)"
    return RankFiles("ascend", root, files, rank)


@cache
def _parsed(root: str, rank: int | None = None) -> ParsedRank:
    return parse(_profile(root, rank), _read)


@cache
def _events(root: str, rank: int | None = None) -> pd.DataFrame:
    return schema.plain_strings(_parsed(root, rank).events).to_pandas()


# --- torch_npu DDP, 8 ranks, level 1: ranks 0 and 1 --------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp8_layers_streams_and_event_tasks(rank: int) -> None:
    ev = _events(DDP8.format(rank))
    # X events outside "Overlap Analysis": Python 2460 + CANN 707/708 + Ascend Hardware 535
    # + HCCL 300 (json.load + Counter by process_name).
    assert len(ev) == 2460 + (707, 708)[rank] + 535 + 300
    device = ev[ev["lane_kind"] == "stream"]
    assert len(device) == 535
    assert set(device["stream"]) == {0, 2, 3, 4}
    assert (device["lane"] == "stream " + device["stream"].astype(str)).all()
    # Task Type EVENT_WAIT_SQE: 10; name EVENT_RECORD: 14 EVENT_RECORD_SQE + 2 PLACE_HOLDER_SQE.
    waits = device[device["kind"] == "wait"]
    records = device[device["kind"] == "record"]
    assert len(waits) == 10
    assert records["task_type"].value_counts().to_dict() == {"EVENT_RECORD_SQE": 14,
                                                             "PLACE_HOLDER_SQE": 2}
    # Each EVENT_WAIT shares its connection_id with one AscendCL@aclrtStreamWaitEvent (10 = 10).
    apis = ev[ev["name"] == "AscendCL@aclrtStreamWaitEvent"]
    assert sorted(waits["correlation"]) == sorted(apis["correlation"])
    assert (apis["kind"] == "host").all() and apis["lane"].str.startswith("thread ").all()


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp8_allreduce_instances(rank: int) -> None:
    ev = _events(DDP8.format(rank))
    ops = ev[ev["kind"] == "collective"].sort_values("seq")
    assert list(ops["name"]) == [f"hcom_allReduce__586_{i}_1" for i in range(4)]
    assert list(ops["seq"]) == [0, 1, 2, 3]
    assert set(ops["group"]) == {DDP8_GROUP}
    assert set(ops["lane"]) == {f"hccl {DDP8_GROUP}"} and set(ops["lane_kind"]) == {"comm"}
    assert set(ops["stream"]) == {4} and set(ops["comm"]) == {"allreduce"}
    assert set(ops["step"]) == {50}  # the one ProfilerStep#50
    # args count x FP32: 4097000 / 16781312 / 37752832 / 2469696 elements of 4 bytes
    assert list(ops["bytes"]) == [4 * n for n in (4097000, 16781312, 37752832, 2469696)]
    # Each op: 74 device subtasks on stream 4 with its connection_id (28 Write Value,
    # 28 Notify Wait, 18 SDMA) and 74 small tasks on Plane threads inside its time range.
    tasks = ev[ev["kind"] == "comm_task"]
    for conn, seq in zip(ops["correlation"], ops["seq"], strict=True):
        mine = tasks[tasks["correlation"] == conn]
        on_stream = mine[mine["lane_kind"] == "stream"]
        assert on_stream["task_type"].value_counts().to_dict() == {
            "Write Value": 28, "Notify Wait": 28, "SDMA": 18}
        assert set(on_stream["stream"]) == {4}
        planes = mine[mine["lane_kind"] == "comm"]
        assert len(planes) == 74 and set(planes["seq"]) == {seq}
        assert planes["lane"].str.match(rf"hccl {DDP8_GROUP} plane [0-7]$").all()


def test_ddp8_exact_ns_conversion() -> None:
    op = _events(DDP8.format(0)).set_index("name").loc["hcom_allReduce__586_0_1"]
    # trace_view.json: "ts": "1736408883732241.564", "dur": 79089.52021875
    assert op["start_ns"] == 1736408883732241564
    assert op["dur_ns"] == 79089520
    assert float("1736408883732241.564") * 1000 != 1736408883732241564  # why floats are banned
    got = decimal_micros_to_ns(["1736412474757059.740", "12", "5.5", "0.0004", 1.25, 7])
    assert list(got) == [1736412474757059740, 12000, 5500, 0, 1250, 7000]


def test_ddp8_notify_ids_pair_across_ranks() -> None:
    """rank 0's Notify_Record to rank 1 uses the notify ids rank 1's Notify_Wait on rank 0 uses
    (ids read by hand: 0x100000044 and 0x100000040 one way, 0x5c and 0x58 the other)."""
    r0, r1 = _events(DDP8.format(0)), _events(DDP8.format(1))

    def ids(ev: pd.DataFrame, task: str, dst: int) -> set[str]:
        return set(ev[(ev["task_type"] == task) & (ev["dst_rank"] == dst)]["notify_id"])

    assert ids(r0, "Notify_Record", 1) == ids(r1, "Notify_Wait", 0) == {"4294967364",
                                                                         "4294967360"}
    assert ids(r1, "Notify_Record", 0) == ids(r0, "Notify_Wait", 1) == {"92", "88"}
    local = r0[r0["task_type"] == "Memcpy"]
    assert (local["notify_id"] == "").all()  # 18446744073709551615: not a notify task


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp8_steps_and_meta(rank: int) -> None:
    ev = _events(DDP8.format(rank))
    device = ev[ev["lane_kind"] == "stream"]
    # Only PROFILING_ENABLE (stream 0) runs before ProfilerStep#50 begins on the host.
    assert list(device[device["step"] == -1]["name"]) == ["PROFILING_ENABLE"]
    assert set(device["step"]) == {-1, 50}
    marker = ev[ev["kind"] == "marker"]
    assert list(marker["name"]) == ["ProfilerStep#50"] and list(marker["step"]) == [50]
    parsed = _parsed(DDP8.format(rank))
    assert parsed.rank == rank  # rank_id (an int) of profiler_info_{rank}.json
    assert parsed.meta["framework"] == "torch_npu" and parsed.meta["backend"] == "hccl"
    assert parsed.meta["device"] == f"npu:{rank}"
    # No parallel_group_info in this job: the group is known only from the op keys. Its size:
    # communication_matrix.json's "allreduce-*@<group>" links are "0-0".."0-7" on rank 0 and
    # "1-0".."1-7" on rank 1, and the Notify/Memcpy tasks' dst rank runs 0..7: group-local ranks
    # 0-7, so at least 8 members (the README: 2 of 8 ranks of a DDP job); no world size stated.
    assert [(g.group, g.ranks, g.size) for g in parsed.groups] == [(DDP8_GROUP, (), 8)]
    assert parsed.groups[0].source == "at least: HCCL group-local ranks up to 7 named"
    assert parsed.warnings == []


# --- torch_npu PP2 x DP2, level 2, communication files only -------------------------------------


@pytest.mark.parametrize(("rank", "pp_group", "peer", "tail"),
                         [(0, "group_name_19", 2, "128"), (2, "group_name_19", 0, "128"),
                          (1, "group_name_22", 3, "764"), (3, "group_name_22", 1, "764")])
def test_pp2dp2_batch_send_recv_from_communication_json(rank: int, pp_group: str, peer: int,
                                                        tail: str) -> None:
    parsed = _parsed(PP2DP2.format(rank))  # no hint: rank_id is the string "{rank}"
    assert parsed.rank == rank
    assert parsed.warnings == [f"{PP2DP2.format(rank)}: no trace, no timeline: events are "
                               "communication.json's ops only"]
    ev = _events(PP2DP2.format(rank))
    p2p = ev[ev["kind"] == "p2p"].sort_values("seq")
    assert list(p2p["name"]) == [f"hcom_batchSendRecv__{tail}_{i}_1" for i in (3, 4, 5)]
    assert set(p2p["group"]) == {double_hash(pp_group)}
    assert set(p2p["peer"]) == {peer}
    assert set(p2p["comm"]) == {"batch_send_recv"} and set(p2p["step"]) == {13}
    assert set(p2p["lane"]) == {f"hccl {double_hash(pp_group)}"}
    # communication.json op keys with "@": 15 on ranks 0 / 1, 23 on ranks 2 / 3
    assert len(ev) == (15, 15, 23, 23)[rank]
    assert (ev["kind"].isin(["collective", "p2p"])).all()


def test_pp2dp2_times_are_exact_and_wait_time_is_kept() -> None:
    ev = _events(PP2DP2.format(0)).set_index("name")
    op = ev.loc["hcom_batchSendRecv__128_4_1"]
    # "Start Timestamp(us)": 1764246877228630.0, "Elapse Time(ms)": 158.55328
    assert op["start_ns"] == 1764246877228630000 and op["dur_ns"] == 158553280
    assert ev.loc["hcom_batchSendRecv__128_3_1", "start_ns"] == 1764246877147674500
    times = {t["name"]: t for t in _parsed(PP2DP2.format(0)).meta["comm_times"]}
    assert times["hcom_batchSendRecv__128_4_1"]["wait_ms"] == 158.10198


def test_pp2dp2_groups_and_meta() -> None:
    """parallel_group_info of each rank's profiler_metadata.json, read by hand."""

    def groups(rank: int) -> dict[str, tuple[int, ...]]:
        return {g.desc: g.ranks for g in _parsed(PP2DP2.format(rank)).groups
                if g.source == "parallel_group_info"}

    assert groups(0)["pp"] == groups(2)["pp"] == (0, 2)
    assert groups(1)["pp"] == groups(3)["pp"] == (1, 3)
    assert groups(2)["dp"] == groups(3)["dp"] == (2, 3)
    assert groups(0)["dp_cp"] == groups(1)["dp_cp"] == (0, 1)
    assert "dp" not in groups(0)  # ranks 0 and 1 list only dp_cp
    pp = next(g for g in _parsed(PP2DP2.format(0)).groups if g.desc == "pp")
    assert (pp.group, pp.name) == ("3985310405473756128", "group_name_19")
    meta = _parsed(PP2DP2.format(2)).meta
    assert meta["world_size"] == 4 and meta["device"] == "npu:4"  # Device_id in step_trace_time
    assert meta["version"] == "torch_npu=2.7.1;cann=8.3.RC1" and meta["framework"] == "torch_npu"


# --- 2023 torch_npu: two-part op names -------------------------------------------------------


@pytest.mark.parametrize(("rank", "dst"), [(0, 8), (1, 9)])
def test_2023_two_part_names(rank: int, dst: int) -> None:
    ev = _events(f"torch_npu_2023_comm/test_rank_{rank}")
    assert len(ev) == 28  # op keys with "@" in communication.json
    send = ev.set_index("name").loc["hcom_send__822_0"]
    assert (send["kind"], send["comm"], send["seq"]) == ("p2p", "send", 0)
    assert send["group"] == "13337953553061386822"
    # communication_matrix.json: the op's links are "{r}-{r}" (LOCAL) and "{r}-{dst}" (RDMA);
    # the group's members are unknown, so the global peer stays unknown.
    assert (send["src_rank"], send["dst_rank"], send["peer"]) == (rank, dst, -1)
    assert ev.set_index("name").loc["hcom_allReduce__483_19", "seq"] == 19
    # The "@group" suffixes of its communication.json keys; no metadata gives their members.
    own = {0: {"10471851537367425459", "4067293946368353693"},
           1: {"368314942532213303", "7879368582424938016"}}[rank]
    groups = _parsed(f"torch_npu_2023_comm/test_rank_{rank}").groups
    assert {g.group for g in groups} == {"9350434047717501483", "13337953553061386822"} | own
    assert {g.ranks for g in groups} == {()}
    # their matrix links name group-local ranks up to 8 (rank 0, "0-8") / 9 (rank 1, "1-9")
    sizes = {g.group: g.size for g in groups}
    assert sizes["13337953553061386822"] == dst + 1


# --- msprof-analyze single rank: legacy arg names, no HCCL --------------------------------------

SINGLE = "msprof_analyze_single/test/ut/advisor/timeline_advice"


def test_msprof_single_legacy_stream_id() -> None:
    ev = _events(SINGLE, 0)
    device = ev[ev["lane_kind"] == "stream"]
    # 276 Ascend Hardware events, all with "Stream Id": 3; Task Type Other 274, AI_CPU 2;
    # two of them are MEMCPY_ASYNC.
    assert len(device) == 276 and set(device["stream"]) == {3} and set(device["lane"]) == {
        "stream 3"}
    assert device["task_type"].value_counts().to_dict() == {"Other": 274, "AI_CPU": 2}
    assert list(device[device["kind"] == "memcpy"]["name"]) == ["MEMCPY_ASYNC"] * 2
    assert not ev["kind"].isin(["collective", "p2p", "comm_task", "wait", "record"]).any()
    assert set(device["step"]) == {1}  # ProfilerStep#1 covers the whole capture
    assert _parsed(SINGLE, 0).groups == []


def test_rank_is_required() -> None:
    with pytest.raises(TraceError, match="no rank id"):
        parse(_profile(SINGLE), _read)  # no profiler_info and no hint


# --- bad and partial input ---------------------------------------------------------------------


def _synthetic(tmp_path: Path, slices: list[list[dict]], extra: dict[str, object] | None = None,
               rank: int | None = 0) -> ParsedRank:
    """Parse a profile written to tmp_path: trace slices plus JSON side files."""
    files = {}
    for i, events in enumerate(slices):
        files["trace" if i == 0 else f"trace.{i}"] = f"msprof_slice_{i}.json"
        (tmp_path / f"msprof_slice_{i}.json").write_text(json.dumps(events))
    for role, content in (extra or {}).items():
        (tmp_path / f"{role}.json").write_text(json.dumps(content))
        files[role] = f"{role}.json"
    return parse(RankFiles("ascend", "PROF_1", files, rank),
                 lambda m: (tmp_path / m).read_bytes())


def _device_events(n: int) -> list[dict]:
    meta = {"ph": "M", "name": "process_name", "pid": 1056, "tid": 0,
            "args": {"name": "Ascend Hardware"}}
    return [meta] + [{"ph": "X", "name": f"k{i}", "pid": 1056, "tid": 2, "ts": f"{100 + i}.125",
                      "dur": 0.5, "args": {"Task Type": "AI_CORE", "Physic Stream Id": 2,
                                           "connection_id": i}} for i in range(n)]


@pytest.mark.parametrize("cut", ["inside the third task", "right after the second"])
def test_truncated_trace_keeps_complete_events(tmp_path: Path, cut: str) -> None:
    text = json.dumps(_device_events(3))
    third = text.index('{"ph": "X", "name": "k2"')
    cut = third + 30 if cut.startswith("inside") else text.rindex("}", 0, third) + 1
    (tmp_path / "trace_view.json").write_text(text[:cut])
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    parsed = parse(files, lambda m: (tmp_path / m).read_bytes())
    assert list(parsed.events.column("name").to_pylist()) == ["k0", "k1"]
    assert parsed.events.column("start_ns").to_pylist() == [100125, 101125]  # "100.125" µs
    assert any("truncated" in w for w in parsed.warnings)


def test_truncated_real_trace_is_a_prefix(tmp_path: Path) -> None:
    full = _events(DDP8.format(0))
    data = _read(_profile(DDP8.format(0)).files["trace"])
    (tmp_path / "trace_view.json").write_bytes(data[:len(data) // 2])
    parsed = parse(RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0),
                   lambda m: (tmp_path / m).read_bytes())
    part = parsed.events.to_pandas()
    assert 0 < len(part) < len(full)
    keys = set(zip(full["name"], full["start_ns"], strict=True))
    assert all(k in keys for k in zip(part["name"], part["start_ns"], strict=True))
    assert any("truncated" in w for w in parsed.warnings)


@pytest.mark.parametrize("role", ["trace", "communication", "metadata"])
def test_invalid_json_names_the_file(tmp_path: Path, role: str) -> None:
    (tmp_path / "bad.json").write_text('{"x": oops}')
    files = {"trace": "ok.json", role: "bad.json"}
    (tmp_path / "ok.json").write_text(json.dumps(_device_events(1)))
    with pytest.raises(TraceError, match=r"^bad\.json: invalid JSON"):
        parse(RankFiles("ascend", "r", files, 0), lambda m: (tmp_path / m).read_bytes())


def test_p2p_peer_from_notify_tasks(tmp_path: Path) -> None:
    """Simulated: a send in a 4-member group whose only Notify_Record goes to local rank 2; the
    op's group is the one own group with the name's 3-digit tail (no communication.json)."""
    group = double_hash("pipe_edge")
    hccl = {"ph": "M", "name": "process_name", "pid": 1088, "tid": 0, "args": {"name": "HCCL"}}
    thread = {"ph": "M", "name": "thread_name", "pid": 1088, "tid": 0,
              "args": {"name": "Group 0 Communication"}}
    op = {"ph": "X", "name": f"hcom_send__{group[-3:]}_7_1", "pid": 1088, "tid": 0,
          "ts": "200.000", "dur": 10.0, "args": {"connection_id": 42, "data_type": "FP16",
                                                 "count": 1024}}
    task = {"ph": "X", "name": "Notify_Record", "pid": 1088, "tid": 2, "ts": "205.500",
            "dur": 0.5, "args": {"notify_id": "0x0000000100000090", "task type": "Notify_Record",
                                 "src rank": 0, "dst rank": 2, "size(Byte)": 0}}
    sub = {"ph": "X", "name": "Notify Wait", "pid": 1056, "tid": 7, "ts": "200.000", "dur": 10.0,
           "args": {"Task Type": "Notify Wait", "Physic Stream Id": 7, "connection_id": 42}}
    metadata = {"parallel_group_info": {"pipe_edge": {"group_name": "pp", "global_ranks":
                                                      [12, 0, 8, 4]}}}
    parsed = _synthetic(tmp_path, [_device_events(1) + [sub], [hccl, thread, op, task]],
                        {"metadata": metadata})
    ev = parsed.events.to_pandas().set_index("name")
    send = ev.loc[f"hcom_send__{group[-3:]}_7_1"]
    assert (send["kind"], send["group"], send["seq"], send["stream"]) == ("p2p", group, 7, 7)
    assert (send["peer"], send["src_rank"], send["dst_rank"]) == (8, 0, 2)  # sorted ranks[2]
    assert send["bytes"] == 2048 and send["dtype"] == "FP16"
    note = ev.loc["Notify_Record"]
    assert note["notify_id"] == str(0x100000090) and note["lane"] == f"hccl {group} plane 1"
    assert (ev.loc["Notify Wait", "kind"], ev.loc["Notify Wait", "group"]) == ("comm_task", group)
    assert parsed.meta["framework"] == "msprof"
    assert np.array_equal(parsed.events.column("rank").to_numpy(), np.zeros(len(ev)))


def test_group_size_from_the_ops_rank_size(tmp_path: Path) -> None:
    """Simulated: newer HCCL op events carry `rank_size` (formats/ascend.md §2.5): a group that
    no metadata lists gets that size, though its tasks name only group-local ranks 0 and 1."""
    group = double_hash("some_comm")
    hccl = {"ph": "M", "name": "process_name", "pid": 1088, "tid": 0, "args": {"name": "HCCL"}}
    op = {"ph": "X", "name": f"hcom_allReduce__{group[-3:]}_0_1@{group}", "pid": 1088, "tid": 0,
          "ts": "200.000", "dur": 10.0, "args": {"connection_id": 42, "rank_size": 16}}
    task = {"ph": "X", "name": "Notify_Wait", "pid": 1088, "tid": 2, "ts": "205.500",
            "dur": 0.5, "args": {"task type": "Notify_Wait", "src rank": 0, "dst rank": 1}}
    parsed = _synthetic(tmp_path, [_device_events(1), [hccl, op, task]], {})
    assert [(g.group, g.size, g.source) for g in parsed.groups] == [
        (group, 16, "rank_size of its HCCL ops")]


# --- simulated ground truth: Timeline -> write_ascend -> parse ---------------------------------


def _simulated_job() -> Timeline:
    """4 ranks, PP {0,2} / {1,3} and DP {0,1} / {2,3}: per rank a kernel, a record on the compute
    stream, a wait on stream 48, a batchSendRecv to the PP peer and a DP allreduce."""
    base, rows = 1_700_000_000_000_000_000, []
    for r in range(4):
        t = base + 1_000_000 * r
        pp, dp = ("pp0" if r % 2 == 0 else "pp1"), ("dp0" if r < 2 else "dp1")
        rows += [(r, 47, "fwd", "compute", "", t, 100_000, "", -1, -1, -1),
                 (r, 47, "EVENT_RECORD", "record", "", t + 100_000, 20, "", -1, -1, -1),
                 (r, 48, "EVENT_WAIT", "wait", "", t + 50_000, 50_020, "", -1, -1, -1),
                 (r, 48, "p2p", "p2p", "batch_send_recv", base + 5_000_000, 300_000, pp,
                  (r + 2) % 4, 0, 1 << 20),
                 (r, 49, "ar", "collective", "allreduce", base + 6_000_000 + 1000 * r, 200_000,
                  dp, -1, 0, 1 << 22)]
    ops = pd.DataFrame(rows, columns=["rank", "stream", "name", "kind", "comm", "start_ns",
                                      "dur_ns", "group", "peer", "seq", "bytes"])
    ops = ops.assign(dtype=np.where(ops["comm"] != "", "BFP16", ""), event_id=-1, step=5,
                     launch_ns=ops["start_ns"] - 5000, phase="", microbatch=-1, chunk=-1,
                     meta_step="").astype(TIMELINE_COLUMNS)
    groups = {g: GroupInfo(g, "", g[:2], ranks) for g, ranks in
              (("pp0", (0, 2)), ("pp1", (1, 3)), ("dp0", (0, 1)), ("dp1", (2, 3)))}
    steps = [StepSpan(r, 5, base - 1_000_000, base + 8_000_000) for r in range(4)]
    return Timeline("roundtrip", {}, ops, groups, steps, {r: 1000 * r for r in range(4)})


@pytest.mark.parametrize("rank", range(4))
def test_simulated_profile_round_trip(rank: int) -> None:
    job = _simulated_job()
    written = write_ascend.files(job)
    root = write_ascend.rank_roots(job)[rank]
    out = f"{root}/ASCEND_PROFILER_OUTPUT"
    files = {role: f"{out}/{name}" for role, name in _OUTPUT.items()}
    files |= {"info": f"{root}/profiler_info_{rank}.json",
              "metadata": f"{root}/profiler_metadata.json"}
    parsed = parse(RankFiles("ascend", root, files), written.__getitem__)
    ev = parsed.events.to_pandas()
    got = ev[ev["lane_kind"] == "stream"].query("kind != 'comm_task'").sort_values("start_ns")
    truth = job.ops[job.ops["rank"] == rank].sort_values("start_ns")
    truth["group"] = truth["group"].map(write_ascend.group_ids(job)).fillna("")
    shift = clock_shift(job)[rank]
    assert list(got["kind"]) == ["compute", "wait", "record"]
    comm = ev[ev["kind"].isin(["p2p", "collective"])].sort_values("start_ns")
    for column in ("kind", "comm", "group", "seq", "peer", "stream", "bytes", "dur_ns"):
        assert list(comm[column]) == list(truth[truth["comm"] != ""][column]), column
    both = pd.concat([got, comm]).sort_values("start_ns")
    assert list(both["start_ns"] - shift) == list(truth["start_ns"])
    assert set(ev[ev["lane_kind"] != "thread"]["step"]) == {5}
    assert parsed.rank == rank and parsed.meta["framework"] == "mindspore"
