"""The simulator's format writers on a hand-built Timeline whose every answer is known by hand.

The Timeline (`hand_timeline`): 4 ranks, clock offsets 0 / +37 123 / -52 007 / +11 ns. Per rank,
on the true clock (ns): MatMul 100 000-300 000 on stream 47, EVENT_RECORD (event 1) on 47 at
300 000 + 1000·r which stream 48 waits for (EVENT_WAIT from 100 000), an allreduce of 8 MiB FP32 in
the 4-rank `dp` group on stream 48 from 300 600 + 1000·r (rank 3 arrives last) to 353 600, then
EVENT_RECORD (event 2) on 48 that stream 47 waits for, Add and MatMul on 47, a 1 MiB copy at
600 000; ranks 0 and 1 also run a batch_send_recv (4 MiB BFP16, `pp` group = comm
`group_name_19`) from 500 000 (rank 0) / 520 000 (rank 1, late) to 530 000. One step: 0-1 000 000.
"""

from __future__ import annotations

import gzip
import json
import re
import tarfile
from collections import Counter
from decimal import Decimal

import pandas as pd
import pytest

from parsers.base import GroupInfo
from parsers.classify import double_hash
from tracegraph import causes
from tracegraph.simulate import write_ascend, write_kineto
from tracegraph.simulate.bundle_writer import EPOCH_NS, joined, write_bundle
from tracegraph.simulate.timeline import TIMELINE_COLUMNS, StepSpan, Timeline

OFFSETS = {0: 0, 1: 37_123, 2: -52_007, 3: 11}
ARRIVE = {r: 300_600 + 1000 * r for r in range(4)}  # allreduce start per rank
AR_END = 353_600
P2P_START = {0: 500_000, 1: 520_000}
P2P_END = 530_000
PP_HASH = "3985310405473756128"  # double_hash("group_name_19"), verified on real data (ascend.md)
HIDDEN = ("BWD_SEND", "FSDP_REDUCE_GRAD", "meta_step", "microbatch")  # ground truth only
DEVICE_KINDS = ("compute", "wait", "record", "memcpy", "collective", "p2p")


def _op(rank: int, stream: int, name: str, kind: str, start: int, dur: int, launch: int,
        **facts: object) -> dict[str, object]:
    row = {"rank": rank, "stream": stream, "name": name, "kind": kind, "comm": "",
           "start_ns": start, "dur_ns": dur, "group": "", "peer": -1, "seq": -1, "bytes": 0,
           "dtype": "", "event_id": -1, "launch_ns": launch, "step": 1, "phase": "",
           "microbatch": -1, "chunk": -1, "meta_step": ""}
    return {**row, **facts}


def _rank_ops(r: int) -> list[dict[str, object]]:
    record1, wait2_start, wait2_end = 300_000 + 1000 * r, 330_200 + 1000 * r, AR_END + 620
    return [
        _op(r, 47, "aclnnMatmul_MatMulV3_MatMul", "compute", 100_000 + 1000 * r, 200_000, 90_000,
            phase="F", microbatch=0, chunk=0, meta_step="FWD"),
        _op(r, 47, "EVENT_RECORD", "record", record1, 20, 95_000, event_id=1),
        _op(r, 48, "EVENT_WAIT", "wait", 100_000, record1 + 520 - 100_000, 96_000, event_id=1),
        _op(r, 48, "hcom_allReduce", "collective", ARRIVE[r], AR_END - ARRIVE[r], 97_000,
            comm="allreduce", group="dp", seq=0, bytes=8_388_608, dtype="FP32",
            meta_step="FSDP_REDUCE_GRAD"),
        _op(r, 48, "EVENT_RECORD", "record", AR_END + 100, 20, 98_000, event_id=2),
        _op(r, 47, "aclnnAdd_AddAiCore_Add", "compute", 300_100 + 1000 * r, 30_000, 99_000,
            phase="B", microbatch=0, chunk=0, meta_step="BWD"),
        _op(r, 47, "EVENT_WAIT", "wait", wait2_start, wait2_end - wait2_start, 100_000,
            event_id=2),
        _op(r, 47, "aclnnMatmul_MatMulV3_MatMul", "compute", wait2_end + 100, 100_000, 101_000,
            phase="W", microbatch=1, chunk=1, meta_step="BWD"),
        _op(r, 47, "MEMCPY_ASYNC", "memcpy", 600_000, 5_000, 111_000, bytes=1_048_576),
    ]


def hand_timeline() -> Timeline:
    """The Timeline described in the module docstring."""
    rows = [row for r in range(4) for row in _rank_ops(r)]
    rows += [_op(r, 49, "hcom_batchSendRecv", "p2p", start, P2P_END - start, 110_000,
                 comm="batch_send_recv", group="pp", peer=1 - r, seq=0, bytes=4_194_304,
                 dtype="BFP16", meta_step="BWD_SEND") for r, start in P2P_START.items()]
    ops = pd.DataFrame(rows).astype(TIMELINE_COLUMNS)
    ops = ops.sort_values(["rank", "stream", "start_ns"]).reset_index(drop=True)
    groups = {"dp": GroupInfo("dp", "", "dp", (0, 1, 2, 3)),
              "pp": GroupInfo("pp", "group_name_19", "pp", (0, 1))}
    steps = [StepSpan(r, 1, 0, 1_000_000) for r in range(4)]
    return Timeline("hand", {"world_size": 4}, ops, groups, steps, dict(OFFSETS),
                    ground_truth={"causes": [{"rank": 1, "category": causes.PP_P2P}]})


def local_ns(rank: int, true_ns: int) -> int:
    """A true time on `rank`'s wall clock, computed independently of the writers."""
    return EPOCH_NS + true_ns + OFFSETS[rank]


def us_text(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def expected_counts(timeline: Timeline, rank: int) -> dict[str, int]:
    ops = timeline.ops[timeline.ops["rank"] == rank]
    return {k: int((ops["kind"] == k).sum()) for k in DEVICE_KINDS}


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return hand_timeline()


def materialize(members) -> dict[str, bytes]:
    """A writer's (path, data) stream as {path: bytes}, checking it comes in path order."""
    files = {path: joined(data) for path, data in members}
    assert list(files) == sorted(files)
    return files


@pytest.fixture(scope="module")
def ascend_files(timeline: Timeline) -> dict[str, bytes]:
    return materialize(write_ascend.iter_files(timeline))


@pytest.fixture(scope="module")
def kineto_files(timeline: Timeline) -> dict[str, bytes]:
    return materialize(write_kineto.iter_files(timeline))


# --- Ascend -------------------------------------------------------------------------------------

def rank_roots(files: dict[str, bytes]) -> dict[int, str]:
    """Rank -> profile folder, from the `profiler_info_{rank}.json` names."""
    found = (re.fullmatch(r"(.+)/profiler_info_(\d+)\.json", p) for p in files)
    return {int(m[2]): m[1] for m in found if m}


def ascend_json(files: dict[str, bytes], rank: int, name: str) -> object:
    root = rank_roots(files)[rank]
    inner = "" if name.startswith("profiler_") else "ASCEND_PROFILER_OUTPUT/"
    return json.loads(files[f"{root}/{inner}{name}"])


class View:
    """One rank's trace_view.json, indexed by layer and thread name."""

    def __init__(self, events: list[dict]):
        self.events = events
        self.layer = {e["pid"]: e["args"]["name"] for e in events
                      if e["ph"] == "M" and e["name"] == "process_name"}
        self.thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                       if e["ph"] == "M" and e["name"] == "thread_name"}

    def pid(self, layer: str) -> int:
        return next(p for p, name in self.layer.items() if name == layer)

    def x(self, layer: str) -> list[dict]:
        return [e for e in self.events if e["ph"] == "X" and self.layer.get(e["pid"]) == layer]

    def hardware(self, task_type: str) -> list[dict]:
        return [e for e in self.x("Ascend Hardware") if e["args"]["Task Type"] == task_type]

    def comm_ops(self) -> list[dict]:
        return [e for e in self.x("HCCL")
                if self.thread[(e["pid"], e["tid"])].endswith(" Communication")]

    def small_tasks(self, name: str) -> list[dict]:
        return [e for e in self.x("HCCL") if e["name"] == name]


@pytest.fixture(scope="module")
def views(ascend_files: dict[str, bytes]) -> dict[int, View]:
    return {r: View(ascend_json(ascend_files, r, "trace_view.json")) for r in range(4)}


def end_ns(event: dict) -> int:
    return int(Decimal(event["ts"]) * 1000) + round(event["dur"] * 1000)


def test_ascend_layout_is_one_ascend_ms_folder_per_rank(ascend_files):
    roots = rank_roots(ascend_files)
    assert sorted(roots) == [0, 1, 2, 3]
    for rank, root in roots.items():
        assert re.fullmatch(r"node0_\d+_\d{17}_ascend_ms", root)
        assert sorted(p[len(root) + 1:] for p in ascend_files if p.startswith(root + "/")) == [
            "ASCEND_PROFILER_OUTPUT/communication.json",
            "ASCEND_PROFILER_OUTPUT/communication_matrix.json",
            "ASCEND_PROFILER_OUTPUT/step_trace_time.csv",
            "ASCEND_PROFILER_OUTPUT/trace_view.json",
            f"profiler_info_{rank}.json", "profiler_metadata.json"]
        assert ascend_json(ascend_files, rank, f"profiler_info_{rank}.json")["rank_id"] == rank


def test_trace_view_is_msprof_shaped(views):
    for rank, view in views.items():
        assert sorted(view.layer.values()) == ["Ascend Hardware", "CANN", "HCCL", "MindSpore"]
        framework = view.pid("MindSpore")
        for layer, bits in (("CANN", 7), ("Ascend Hardware", 13), ("HCCL", 15)):
            assert view.pid(layer) == framework << 10 | bits << 5 | rank % 8
        timed = [e for e in view.events if e["ph"] in "Xsf"]
        assert all(re.fullmatch(r"\d{16}\.\d{3}", e["ts"]) for e in timed)
        assert all(isinstance(e["dur"], float) for e in timed if e["ph"] == "X")
        assert {n for (p, _), n in view.thread.items() if p == view.pid("Ascend Hardware")} == {
            "Stream 47", "Stream 48", "Stream 49"} - ({"Stream 49"} if rank > 1 else set())


def test_ascend_device_ops_match_the_timeline(views, timeline):
    hand = {"compute": 3, "wait": 2, "record": 2, "memcpy": 1, "collective": 1}
    for rank, view in views.items():
        want = expected_counts(timeline, rank)
        assert want == {**hand, "p2p": 1 if rank < 2 else 0}
        got = {"compute": len(view.hardware("AI_CORE")),
               "wait": len(view.hardware("EVENT_WAIT_SQE")),
               "record": len(view.hardware("EVENT_RECORD_SQE")),
               "memcpy": len(view.hardware("SDMA_SQE"))}
        names = Counter(e["name"].split("__")[0] for e in view.comm_ops())
        got.update(collective=names["hcom_allReduce"], p2p=names["hcom_batchSendRecv"])
        assert got == want


def test_hccl_names_carry_group_hash_tail_and_index(ascend_files, views):
    groups = ascend_json(ascend_files, 0, "profiler_metadata.json")["parallel_group_info"]
    dp_comm = next(name for name, g in groups.items() if g["group_name"] == "dp")
    assert double_hash("group_name_19") == PP_HASH and groups["group_name_19"]["group_name"] == "pp"
    dp = double_hash(dp_comm)
    assert {e["name"] for e in views[0].comm_ops()} == {
        f"hcom_allReduce__{dp[-3:]}_0_1", f"hcom_batchSendRecv__{PP_HASH[-3:]}_0_1"}
    comm = ascend_json(ascend_files, 0, "communication.json")["step1"]
    assert set(comm["collective"]) == {f"hcom_allReduce__{dp[-3:]}_0_1@{dp}", "Total Op Info"}
    assert set(comm["p2p"]) == {f"hcom_batchSendRecv__128_0_1@{PP_HASH}", "Total Op Info"}


def test_ascend_times_are_each_ranks_clock_to_the_ns(views, timeline):
    # rank 2's first EVENT_RECORD: 302 000 ns true, clock 52 007 ns behind
    record = views[2].hardware("EVENT_RECORD_SQE")[0]
    assert record["ts"] == "1767225600000249.993"
    for rank, view in views.items():
        ops = timeline.ops[(timeline.ops["rank"] == rank) & (timeline.ops["kind"] == "compute")]
        want = sorted(us_text(local_ns(rank, t)) for t in ops["start_ns"])
        assert sorted(e["ts"] for e in view.hardware("AI_CORE")) == want
        ar = next(e for e in view.comm_ops() if "allReduce" in e["name"])
        assert ar["ts"] == us_text(local_ns(rank, ARRIVE[rank]))
        assert end_ns(ar) == local_ns(rank, AR_END)


def test_events_never_name_the_event_a_wait_waits_on(views):
    for view in views.values():
        for task in view.hardware("EVENT_WAIT_SQE") + view.hardware("EVENT_RECORD_SQE"):
            assert list(task["args"]) == ["Model Id", "Task Type", "Physic Stream Id", "Task Id",
                                          "Batch Id", "Subtask Id", "connection_id"]
        assert not [k for e in view.events for k in e.get("args", {}) if "event" in k.lower()]
        calls = [e for e in view.x("CANN") if "Event" in e["name"]]
        assert len(calls) == 4 and all(e["args"]["item_id"] == "0" for e in calls)


def test_host_calls_share_connection_ids_with_device_tasks(views, timeline):
    expected_call = {"EVENT_WAIT_SQE": "AscendCL@aclrtStreamWaitEvent",
                     "EVENT_RECORD_SQE": "AscendCL@aclrtRecordEvent",
                     "AI_CORE": "Node@launch", "SDMA_SQE": "AscendCL@aclrtMemcpyAsync"}
    for rank, view in views.items():
        calls = Counter((e["args"]["connection_id"], e["name"]) for e in view.x("CANN"))
        for task_type, call in expected_call.items():
            for task in view.hardware(task_type):
                assert calls[(task["args"]["connection_id"], call)] == 1
        launch = {e["args"]["connection_id"]: e for e in view.x("CANN")
                  if e["name"] == "Node@launch"}
        stream_48 = [e for e in view.x("Ascend Hardware") if e["tid"] == 48
                     and e["args"]["Task Type"] in ("Write Value", "Notify Wait", "SDMA")]
        for op in view.comm_ops():  # Node@launch names the HCCL op type, as in real data
            assert launch[op["args"]["connection_id"]]["args"]["item_id"] == (
                op["name"].split("__")[0] + "_")
        allreduce = next(e for e in view.comm_ops() if "allReduce" in e["name"])
        assert {t["args"]["connection_id"] for t in stream_48} == {
            allreduce["args"]["connection_id"]}
        # the CANN call sits at the op's launch time: allreduce launched at 97 000 ns
        call = launch[allreduce["args"]["connection_id"]]
        assert call["ts"] == us_text(local_ns(rank, 97_000))
        flows = Counter((e["ph"], e["id"]) for e in view.events if e.get("cat") == "HostToDevice")
        assert {i for ph, i in flows if ph == "s"} == {i for ph, i in flows if ph == "f"}


def test_notify_waits_pair_across_ranks_and_end_when_the_peer_arrives(views):
    def notifies(rank: int, name: str) -> Counter:
        return Counter((e["args"]["notify_id"], e["args"]["src rank"], e["args"]["dst rank"])
                       for e in views[rank].small_tasks(name) if e["tid"] <= 4)  # dp planes

    for a in range(4):
        for notify, src, dst in notifies(a, "Notify_Record"):
            assert notifies(dst, "Notify_Wait")[(notify, dst, src)] == 1
    waits = {(e["args"]["dst rank"]): e for e in reversed(views[0].small_tasks("Notify_Wait"))
             if e["tid"] <= 4}  # the first wait toward each dp peer
    assert end_ns(waits[3]) == local_ns(0, ARRIVE[3])  # rank 3 arrived last
    assert waits[1]["dur"] == 0.0  # rank 1 had arrived before rank 0 started waiting
    p2p = [e for e in views[0].small_tasks("Notify_Wait") if e["tid"] > 4]
    assert end_ns(p2p[0]) == local_ns(0, P2P_START[1])  # rank 0 waited for late rank 1
    assert [e for e in views[1].small_tasks("Notify_Wait") if e["tid"] > 4][0]["dur"] == 0.0


def test_waits_on_an_unprofiled_member_last_until_the_transfer_starts(timeline):
    # the dp group also holds rank 4, absent from the Timeline; a 400 kB allreduce moves 80 kB
    # per peer, 4 µs at 20 GB/s, so the transfer starts 4 µs + the closing handshake before the
    # op ends (353.6 µs), well after the last profiled member (rank 3) arrived at 303.6 µs
    groups = {**timeline.groups, "dp": GroupInfo("dp", "", "dp", (0, 1, 2, 3, 4))}
    ops = timeline.ops.assign(bytes=timeline.ops["bytes"].where(
        timeline.ops["comm"] != "allreduce", 400_000))
    wider = Timeline("wider", {}, ops, groups, timeline.steps, timeline.clock_offset_ns)
    view = View(ascend_json(materialize(write_ascend.iter_files(wider)), 0, "trace_view.json"))
    waits = {e["args"]["dst rank"]: e for e in reversed(view.small_tasks("Notify_Wait"))
             if e["tid"] <= 5}
    transfer = next(e for e in view.small_tasks("Reduce_Inline") if e["args"]["dst rank"] == 4)
    assert end_ns(waits[4]) == int(Decimal(transfer["ts"]) * 1000)
    assert local_ns(0, ARRIVE[3]) < end_ns(waits[4]) < local_ns(0, AR_END - 4_000)
    assert end_ns(waits[3]) == local_ns(0, ARRIVE[3])  # a profiled peer: its own arrival


def test_communication_json_follows_msprofs_definitions(ascend_files):
    info = {r: ascend_json(ascend_files, r, "communication.json")["step1"]["p2p"]
            for r in (0, 1)}
    key = f"hcom_batchSendRecv__128_0_1@{PP_HASH}"
    early, late = info[0][key]["Communication Time Info"], info[1][key]["Communication Time Info"]
    assert list(early) == ["Start Timestamp(us)", "Elapse Time(ms)", "Transit Time(ms)",
                           "Wait Time(ms)", "Synchronization Time(ms)", "Idle Time(ms)",
                           "Wait Time Ratio", "Synchronization Time Ratio"]
    assert early["Start Timestamp(us)"] == local_ns(0, 500_000) / 1000
    assert early["Elapse Time(ms)"] == 0.03 and late["Elapse Time(ms)"] == 0.01
    # rank 0 waited for rank 1, 20 µs late, less a handshake of at most 5 % of the 30 µs op
    assert 0.0185 <= early["Synchronization Time(ms)"] <= 0.020
    assert late["Synchronization Time(ms)"] < 0.001
    for t in (early, late):
        assert t["Idle Time(ms)"] == pytest.approx(
            t["Elapse Time(ms)"] - t["Transit Time(ms)"] - t["Wait Time(ms)"], abs=1e-12)
        assert t["Wait Time Ratio"] == round(
            t["Wait Time(ms)"] / (t["Wait Time(ms)"] + t["Transit Time(ms)"]), 4)
    # msprof's slow-rank rule: the rank with the smallest wait ratio is the slow one
    assert late["Wait Time Ratio"] < early["Wait Time Ratio"]
    bandwidth = info[0][key]["Communication Bandwidth Info"]
    assert list(bandwidth) == ["RDMA", "HCCS", "PCIE", "SDMA", "SIO"]
    assert bandwidth["HCCS"]["Transit Size(MB)"] == 4.194304  # the whole 4 MiB batch
    assert "Start Timestamp(us)" not in info[0]["Total Op Info"]["Communication Time Info"]


def test_communication_matrix_picks_links_per_op(ascend_files):
    matrix = ascend_json(ascend_files, 0, "communication_matrix.json")["step1"]
    dp = next(k.split("@")[1] for k in matrix["collective"])
    assert sorted(matrix["collective"]) == sorted(
        f"allreduce-{pick}@{dp}" for pick in ("top1", "middle", "bottom1", "total"))
    links = matrix["collective"][f"allreduce-top1@{dp}"]
    assert sorted(links) == ["0-0", "0-1", "0-2", "0-3"]
    assert links["0-0"]["Transport Type"] == "LOCAL" and links["0-1"]["Transport Type"] == "HCCS"
    assert links["0-1"]["Transit Size(MB)"] == 2.097152  # 8 MiB over 4 ranks
    assert links["0-1"]["Op Name"] == f"hcom_allReduce__{dp[-3:]}_0_1"
    assert sorted(matrix["p2p"][f"batchsendrecv-total@{PP_HASH}"]) == ["0-0", "0-1"]


def test_step_trace_time_splits_the_step(ascend_files):
    root = rank_roots(ascend_files)[0]
    text = ascend_files[f"{root}/ASCEND_PROFILER_OUTPUT/step_trace_time.csv"].decode()
    header, row = text.splitlines()
    assert header == ("Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,"
                      "Communication,Free,Stage,Bubble,"
                      "Communication(Not Overlapped and Exclude Receive),Preparing")
    # rank 0 by hand (µs): compute 200 + 30 + 100; comm 53 (allreduce) + 30 (p2p); the Add
    # (300.1-330.1) overlaps the allreduce (300.6-353.6) by 29.5; first device op at 100
    assert [float(v) for v in row.split(",")] == [0, 1, 330.0, 53.5, 29.5, 83.0, 616.5, 1000.0,
                                                  0.0, 53.5, 100.0]


def test_profiler_metadata_lists_this_ranks_groups(ascend_files):
    pp = {"group_name_19": {"group_name": "pp", "group_rank": 1, "global_ranks": [0, 1]}}
    info = ascend_json(ascend_files, 1, "profiler_metadata.json")["parallel_group_info"]
    assert info["group_name_19"] == pp["group_name_19"] and len(info) == 2
    info = ascend_json(ascend_files, 2, "profiler_metadata.json")["parallel_group_info"]
    assert [g["group_name"] for g in info.values()] == ["dp"]
    assert next(iter(info.values()))["group_rank"] == 2


def test_ground_truth_never_reaches_the_files(timeline, ascend_files, kineto_files):
    assert set(timeline.ops["meta_step"]) >= {"BWD_SEND", "FSDP_REDUCE_GRAD"}
    for path, data in {**ascend_files, **kineto_files}.items():
        text = gzip.decompress(data) if path.endswith(".gz") else data
        assert not [word for word in HIDDEN if word.encode() in text], path


# --- Kineto -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def traces(kineto_files: dict[str, bytes]) -> dict[int, dict]:
    loaded = [json.loads(gzip.decompress(data)) for data in kineto_files.values()]
    return {t["distributedInfo"]["rank"]: t for t in loaded}


def of(trace: dict, cat: str, name: str | None = None) -> list[dict]:
    return [e for e in trace["traceEvents"]
            if e.get("cat") == cat and (name is None or e["name"] == name)]


def test_kineto_files_are_named_and_laid_out_like_torch_2_13(kineto_files, traces):
    assert len(kineto_files) == 4
    for name in kineto_files:
        assert re.fullmatch(r"node0_\d+\.\d{19}\.pt\.trace\.json\.gz", name)
    for rank, trace in traces.items():
        assert list(trace) == ["schemaVersion", "deviceProperties", "trace_id", "distributedInfo",
                               "host_name", "displayTimeUnit", "baseTimeNanoseconds",
                               "traceEvents", "traceName"]
        dist = trace["distributedInfo"]
        assert (dist["backend"], dist["world_size"], dist["pg_count"]) == ("nccl", 4, 3)
        assert [pg["pg_name"] for pg in dist["pg_config"]] == (["0", "1", "2"] if rank < 2
                                                              else ["0", "1"])
        assert trace["baseTimeNanoseconds"] % 7_889_238_000_000_000 == 0


def test_kineto_device_ops_match_the_timeline(traces, timeline):
    for rank, trace in traces.items():
        kernels = of(trace, "kernel")
        got = {"compute": sum(not k["name"].startswith("ncclDevKernel") for k in kernels),
               "wait": len(of(trace, "cuda_sync", "Stream Wait Event")),
               "record": len(of(trace, "cuda_runtime", "cudaEventRecord")),
               "memcpy": len(of(trace, "gpu_memcpy")),
               "collective": sum("AllReduce" in k["name"] for k in kernels),
               "p2p": sum("SendRecv" in k["name"] for k in kernels)}
        assert got == expected_counts(timeline, rank)


def test_record_param_comms_carry_pg_seq_and_comms_id(traces):
    ids = set()
    for rank, trace in traces.items():
        comms = of(trace, "cpu_op", "record_param_comms")
        allreduce = next(e["args"] for e in comms if e["args"]["Collective name"] == "allreduce")
        assert {k: allreduce[k] for k in ("Process Group Name", "Group size", "Process Group Ranks",
                                          "Seq", "Rank", "dtype", "In msg nelems")} == {
            "Process Group Name": "1", "Group size": 4, "Process Group Ranks": "[0, 1, 2, 3]",
            "Seq": 0, "Rank": rank, "dtype": "Float", "In msg nelems": 2_097_152}
        ids.add(allreduce["Comms Id"])
        kernel = next(k["args"] for k in of(trace, "kernel") if "AllReduce" in k["name"])
        assert (kernel["Process Group Name"], kernel["Seq"], kernel["Comms Id"]) == (
            "1", 0, allreduce["Comms Id"])
    assert len(ids) == 1  # one id for the one allreduce instance, on every member


def test_batch_p2p_is_drawn_as_nccl_coalesces_it(traces):
    trace = traces[0]
    halves = {e["args"]["Collective name"]: e["args"] for e in of(trace, "cpu_op",
                                                                   "record_param_comms")}
    assert halves["send"]["Dst Rank"] == 1 and halves["recv"]["Src Rank"] == 1
    notes = {e["name"]: e for e in of(trace, "user_annotation")}
    assert {"nccl:send 0->1", "nccl:recv 0<-1", "nccl:coalesced"} <= set(notes)
    fused = next(k for k in of(trace, "kernel") if "SendRecv" in k["name"])
    assert not {"Process Group Name", "Dst Rank", "Src Rank", "Collective name"} & set(
        fused["args"])
    assert fused["args"]["External id"] == notes["nccl:coalesced"]["args"]["External id"]


def test_kernels_link_to_their_launch_by_correlation_and_ac2g(traces):
    for trace in traces.values():
        runtime = {e["args"]["correlation"]: e for e in of(trace, "cuda_runtime")}
        flows = {(e["ph"], e["id"]): e for e in of(trace, "ac2g")}
        for gpu in of(trace, "kernel") + of(trace, "gpu_memcpy"):
            corr = gpu["args"]["correlation"]
            launch = runtime[corr]
            assert launch["name"] in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync")
            assert launch["args"]["External id"] == gpu["args"]["External id"]
            assert flows[("s", corr)]["ts"] == launch["ts"]
            assert (flows[("f", corr)]["ts"], flows[("f", corr)]["tid"]) == (gpu["ts"], gpu["tid"])


def test_stream_wait_events_name_the_recording_stream_and_record(traces):
    for trace in traces.values():
        records = sorted(of(trace, "cuda_runtime", "cudaEventRecord"), key=lambda e: e["ts"])
        waits = {e["tid"]: e["args"] for e in of(trace, "cuda_sync", "Stream Wait Event")}
        # event 1: recorded on 47 (launched first), waited on 48; event 2: recorded on 48
        assert (waits[48]["wait_on_stream"], waits[48]["wait_on_cuda_event_record_corr_id"]) == (
            47, records[0]["args"]["correlation"])
        assert (waits[47]["wait_on_stream"], waits[47]["wait_on_cuda_event_record_corr_id"]) == (
            48, records[1]["args"]["correlation"])


def test_kineto_ts_is_relative_us_exact_to_the_ns(traces, timeline):
    first = min(of(traces[2], "kernel"), key=lambda k: k["ts"])
    assert round(first["ts"] * 1000) + traces[2]["baseTimeNanoseconds"] == (
        1_767_225_600_000_049_993)  # rank 2's first MatMul: 102 000 ns true, clock -52 007
    for rank, trace in traces.items():
        ops = timeline.ops[(timeline.ops["rank"] == rank)
                           & timeline.ops["kind"].isin(["compute", "collective", "p2p"])]
        base = trace["baseTimeNanoseconds"]
        assert sorted(round(k["ts"] * 1000) + base for k in of(trace, "kernel")) == sorted(
            local_ns(rank, t) for t in ops["start_ns"])


# --- bundles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_bundle_is_deterministic_with_ground_truth_beside(fmt, timeline, tmp_path):
    first = write_bundle(timeline, tmp_path / "a" / "hand", fmt)
    second = write_bundle(timeline, tmp_path / "b" / "hand.tar.gz", fmt)
    assert first.name == second.name == "hand.tar.gz"
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header mtime
    truth = first.with_name("hand.ground_truth.json")
    assert truth.read_bytes() == second.with_name("hand.ground_truth.json").read_bytes()
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and all(n.startswith("hand/") for n in names)
    assert not [n for n in names if "ground_truth" in n]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    gt = json.loads(truth.read_text())
    assert gt["groups"]["pp"]["id"] == (PP_HASH if fmt == "ascend" else "2")
    assert gt["clock_offset_ns"] == {str(r): o for r, o in OFFSETS.items()}
    assert gt["causes"] == [{"rank": 1, "category": causes.PP_P2P}]
    assert all(any(n.startswith(f"hand/{root}") for n in names) for root in gt["ranks"].values())


def test_write_bundle_rejects_an_unknown_format(timeline, tmp_path):
    with pytest.raises(ValueError, match="unknown simulated format 'perfetto'"):
        write_bundle(timeline, tmp_path / "x", "perfetto")


@pytest.mark.parametrize(("change", "message"), [
    (lambda ops: ops.drop(columns=["launch_ns"]), r"lacks the columns \['launch_ns'\]"),
    (lambda ops: ops.iloc[:0], "holds no ops"),
    (lambda ops: ops.assign(dur_ns=ops["dur_ns"].where(ops["kind"] != "memcpy", -5)),
     "has 4 negative dur_ns"),
    (lambda ops: ops.assign(kind=ops["kind"].replace("memcpy", "memset")), r"kinds \['memset'\]"),
    (lambda ops: ops.assign(comm=ops["comm"].replace("allreduce", "all_reduce")),
     r"comm types \['all_reduce'\]"),
    (lambda ops: ops.assign(group=ops["group"].replace("pp", "tp")), r"\(0, 'tp'\)"),
    (lambda ops: ops.assign(rank=ops["rank"].replace(1, 2)), r"\(2, 'pp'\)"),
    (lambda ops: ops.assign(peer=ops["peer"].replace(1, 3)), r"\[\('pp', 3\)\] name a peer"),
])
def test_write_bundle_rejects_a_malformed_timeline(change, message, timeline, tmp_path):
    bad = Timeline("bad", {}, change(timeline.ops), timeline.groups, timeline.steps,
                   timeline.clock_offset_ns)
    with pytest.raises(ValueError, match=message):
        write_bundle(bad, tmp_path / "bad", "ascend")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_parsers_read_the_simulated_bundle_back(fmt, timeline, tmp_path):
    pytest.importorskip(f"parsers.{fmt}")  # skipped only while that parser does not exist
    from parsers import parse_rank
    from parsers.bundle import open_bundle

    archive = write_bundle(timeline, tmp_path / "hand", fmt)
    with open_bundle(archive) as bundle:
        assert [p.rank for p in bundle.profiles] == [0, 1, 2, 3]
        parsed = {p.rank: parse_rank(p, bundle.read) for p in bundle.profiles}
    for rank, result in parsed.items():
        events = result.events.to_pandas()
        device = events[events["lane_kind"] != "thread"]
        want = expected_counts(timeline, rank)
        if fmt == "kineto":  # a CUDA event record has no GPU activity: only its runtime call
            want.pop("record")
        assert {k: int((device["kind"] == k).sum()) for k in want} == want
        compute = timeline.ops[(timeline.ops["rank"] == rank)
                               & (timeline.ops["kind"] == "compute")]
        assert sorted(device.loc[device["kind"] == "compute", "start_ns"]) == sorted(
            local_ns(rank, t) for t in compute["start_ns"])
        members = {g.desc: sorted(g.ranks) for g in result.groups}
        assert members["dp"] == [0, 1, 2, 3]
        assert members.get("pp") == ([0, 1] if rank < 2 else None)
