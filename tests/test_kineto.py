"""Kineto parser on the real traces in ../shared/real_traces/kineto.

Known answers were counted by hand with a separate script that loads each file with the stdlib
`json` module and counts events by name / category / args (no tracegraph code), or come from
../shared/real_traces/README.md and formats/kineto.md.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from parsers import kineto
from parsers.base import ParsedRank, RankFiles, TraceError
from tracegraph import schema

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REAL = SHARED / "real_traces" / "kineto"
GLOO = [f"gloo_pp2_dp2/rank{r}.json" for r in range(4)]


def _bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if path.suffix == ".gz" else raw


def parse(rel: str, rank: int | None = None, raw: bytes | None = None) -> ParsedRank:
    path = REAL / rel
    data = _bytes(path) if raw is None else raw
    files = RankFiles("kineto", str(path), {"trace": rel}, rank)
    return kineto.parse(files, lambda member: data)


def frame(parsed: ParsedRank) -> pd.DataFrame:
    return parsed.events.to_pandas()


@pytest.fixture(scope="module")
def gloo() -> list[tuple[ParsedRank, pd.DataFrame]]:
    assert REAL.is_dir(), f"real traces missing: {REAL} (CI must check out ../shared)"
    return [(parsed, frame(parsed)) for parsed in map(parse, GLOO)]


def test_schema_and_meta(gloo):
    parsed, events = gloo[0]
    assert parsed.events.schema.equals(schema.EVENTS)
    assert parsed.meta["framework"] == "pytorch" and parsed.meta["format"] == "kineto"
    assert parsed.meta["backend"] == "gloo" and parsed.meta["world_size"] == 4
    assert parsed.meta["clock_base_ns"] == 1790857026000000000
    assert parsed.meta["version"] == "schema=1"
    # rank0 has 734 X events in cpu_op + user_annotation; the Trace span is not an event
    assert len(events) == parsed.meta["events"] == 734


def test_ranks_steps_and_time(gloo):
    for rank, (parsed, events) in enumerate(gloo):
        assert parsed.rank == rank
        assert (events["rank"] == rank).all()
        assert set(events["step"]) == {2, 3}  # every kept event lies in ProfilerStep#2 or #3
    # rank1 ProfilerStep#2: ts 5157037511064.284 µs after the base 1790857026000000000 ns
    events = gloo[1][1]
    step2 = events[events["name"] == "ProfilerStep#2"].iloc[0]
    assert step2["start_ns"] == 1790857026000000000 + 5157037511064284
    assert step2["dur_ns"] == 227197880 and step2["kind"] == schema.MARKER


def test_straggler_sleep_on_rank1_only(gloo):
    for rank, (_, events) in enumerate(gloo):
        sleeps = events[events["name"] == "straggler_sleep"]
        if rank != 1:
            assert sleeps.empty
            continue
        # 200223.790 µs in step 2 and 200224.637 µs in step 3
        assert sleeps["dur_ns"].tolist() == [200223790, 200224637]
        assert sleeps["step"].tolist() == [2, 3]
        assert (sleeps["annotation"] == "straggler_sleep").all()


# Concrete Inputs[2] of every c10d::send / recv_ is the group-local peer: "1", "0", "3", "2".
# pg_config: rank 0 is in "0" [0..3] and "1" [0, 2], where local 1 is rank 1 or rank 2: its own
# profile cannot tell (the loader can: test_load); ranks 1-3 have one group with that local rank.
@pytest.mark.parametrize(("rank", "local", "peer"), [(0, 1, -1), (1, 0, 0), (2, 3, 3), (3, 2, 2)])
def test_gloo_send_recv(gloo, rank, local, peer):
    events = gloo[rank][1]
    for name, comm, side in (("c10d::send", "send", "dst_rank"),
                             ("c10d::recv_", "recv", "src_rank")):
        calls = events[events["name"] == name]
        assert len(calls) == 8 and (calls["kind"] == schema.HOST).all()
        assert (calls["comm"] == comm).all() and (calls[side] == local).all()
        assert (calls["peer"] == peer).all()
        assert (calls["group"] == ("" if peer < 0 else "0")).all()
        assert (calls["event_id"] == 0).all()  # tag 0 (Concrete Inputs[3])
        done = events[events["name"] == f"gloo:{comm}"]
        assert len(done) == 8 and (done["kind"] == schema.P2P).all()
        assert (done[side] == local).all() and (done["peer"] == peer).all()
        assert (done["lane_kind"] == schema.THREAD).all()
        assert (done["bytes"] == 16 * 64 * 4).all()  # Input Dims [[16, 64]], float
    # stage 0 (ranks 0, 2) sends in FWD, stage 1 receives there: mb 0..3 in each step
    fwd = events[(events["name"] == ("gloo:send" if rank in (0, 2) else "gloo:recv"))]
    assert fwd["annotation"].tolist() == [f"FWD mb={i}" for i in range(4)] * 2


def test_gloo_collectives_on_comm_lanes(gloo):
    for rank, (_, events) in enumerate(gloo):
        done = events[events["name"].isin(["gloo:all_reduce", "gloo:all_to_all"])]
        assert len(done) == 6  # per step: DP all_reduce, all_to_all, async all_reduce
        assert (done["lane_kind"] == schema.COMM).all()
        assert (done["kind"] == schema.COLLECTIVE).all()
        assert done["lane"].str.endswith("pt_gloo_runloop").all()
        assert set(done["comm"]) == {"allreduce", "alltoall"}
        # DP all_reduce = Input Dims [[64, 64]] float: pg "1" = [0, 2], pg "2" = [1, 3]
        dp = done[done["bytes"] == 64 * 64 * 4].sort_values("start_ns")
        assert len(dp) == 2 and (dp["group"] == ("1" if rank in (0, 2) else "2")).all()
        assert (dp["annotation"] == "OPT step").all() and dp["step"].tolist() == [2, 3]
        world = done.drop(dp.index)
        assert (world["group"] == "0").all() and (world["annotation"] == "MOE a2a").all()
        # the issuing c10d::allreduce_ ops (2 DP + 2 async world per rank) get the group too
        calls = events[events["name"] == "c10d::allreduce_"]
        assert sorted(calls["group"]) == sorted(["0", "0"] + dp["group"].tolist())


def test_gloo_worker_ops_name_their_issuing_c10d_op(gloo):
    """meta["cross_rank"]["issuers"]: each worker-thread collective with the c10d op that
    issued it (same comm and first Input Dims), for the loader to carry group and issue order."""
    for parsed, events in gloo:
        pairs = parsed.meta["cross_rank"]["issuers"]
        assert len(pairs) == 6 and all(h >= 0 for _, h in pairs)
        workers, calls = events.loc[[w for w, _ in pairs]], events.loc[[h for _, h in pairs]]
        assert calls["name"].str.startswith("c10d::").all()
        assert (workers["comm"].to_numpy() == calls["comm"].to_numpy()).all()
        assert (workers["start_ns"].to_numpy() >= calls["start_ns"].to_numpy()).all()


def test_gloo_worker_op_takes_the_group_its_c10d_op_states():
    """Synthetic: groups "0" and "1" have the same members, so only a `record_param_comms`
    inside the issuing c10d::allreduce_ (Process Group Name "1") can tell which one ran it."""
    pgs = [{"pg_name": n, "pg_desc": d, "pg_size": 2, "ranks": [0, 1]}
           for n, d in (("0", "default_pg"), ("1", "dp"))]
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2,
         "args": {"name": "thread 2 (pt_gloo_runloop)"}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10,
         "dur": 5, "args": {"Input Dims": [[[4]], [], [], [], [], []]}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 11,
         "dur": 2, "args": {"Collective name": "allreduce", "Process Group Name": "1"}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2,
         "ts": 12, "dur": 3, "args": {"Input Dims": [[4]], "Input type": ["float"]}},
    ]
    doc = {"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2, "pg_config": pgs},
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}
    events = frame(parse("synthetic.json", raw=json.dumps(doc).encode())).set_index("name")
    assert events.loc["gloo:all_reduce", "group"] == events.loc["c10d::allreduce_", "group"] == "1"


def test_gloo_groups_from_pg_config(gloo):
    for rank, (parsed, _) in enumerate(gloo):
        groups = {g.group: (g.desc, g.ranks, g.source, g.size) for g in parsed.groups}
        dp = ("1", ("dp_stage0", (0, 2))) if rank in (0, 2) else ("2", ("dp_stage1", (1, 3)))
        assert groups == {"0": ("default_pg", (0, 1, 2, 3), "pg_config", 4),  # pg_size 4
                          dp[0]: (*dp[1], "pg_config", 2)}


def test_rank0_waits_for_the_straggler_in_all_to_all(gloo):
    events = gloo[0][1]
    a2a = events[events["name"] == "gloo:all_to_all"]
    # README: rank0 waits ~203 ms in MOE a2a; its gloo:all_to_all lasts 201863.497 µs in step 2
    assert a2a["dur_ns"].tolist()[0] == 201863497 and a2a["step"].tolist() == [2, 3]


def test_autograd_sequence_numbers_tie_backward_ops_to_their_forward(gloo):
    """Read by hand in rank1.json: `aten::mean` (forward, ts …522413) and the
    `autograd::engine::evaluate_function: MeanBackward0` / `MeanBackward0` that run its
    backward (ts …522620, …522622) all carry `Sequence number` 59; the c10d ops carry the
    same arg (not a comm seq) and annotations none."""
    _, events = gloo[1]
    tied = events[events["autograd_seq"] == 59].sort_values("start_ns")
    assert tied["name"].tolist() == ["aten::mean", "autograd::engine::evaluate_function: "
                                     "MeanBackward0", "MeanBackward0"]
    assert (events.loc[events["name"] == "c10d::recv_", "autograd_seq"] >= 0).all()
    annotations = events["task_type"] == "user_annotation"
    assert (events.loc[annotations, "autograd_seq"] == schema.NO_INT).all()
    assert (events.loc[events["name"].str.startswith("ProfilerStep"), "autograd_seq"]
            == schema.NO_INT).all()


def test_sniff_rank():
    for rank, rel in enumerate(GLOO):
        assert kineto.sniff_rank((REAL / rel).read_bytes()[:65536]) == rank
    assert kineto.sniff_rank(_bytes(REAL / "hta/rank_unavailable/rank_not_found.json.gz")
                             [:65536]) is None
    cut = b'{"distributedInfo": {"backend": "nccl", "rank": "7", "pg_config": [{"ranks": [1, 2'
    assert kineto.sniff_rank(cut) == 7  # string rank, object cut by the head limit


def test_nccl_collectives_and_waits():
    events = frame(parse("hta/nccl_parser_config/nccl_data.json.gz"))
    kernels = events[events["task_type"] == "kernel"]
    comm = kernels[kernels["kind"] == schema.COLLECTIVE]
    # README: allreduce x15, broadcast x6 = the NCCL kernels (all on stream 40, pg "0"); the same
    # counts are the record_param_comms CPU ops and the nccl:* annotations
    assert comm.groupby("comm").size().to_dict() == {"allreduce": 15, "broadcast": 6}
    assert (comm["lane"] == "stream 40").all() and (comm["stream"] == 40).all()
    assert (comm["group"] == "0").all()
    assert (comm["correlation"] >= 0).all() and set(comm["step"]) == {4, 5, 6}
    # In msg nelems of the allreduce kernels (Float): 5 sizes, 3 steps each
    sizes = [2049000, 2431040, 6563840, 6637568, 7875584]
    allreduce = comm[comm["comm"] == "allreduce"]
    assert allreduce["bytes"].value_counts().to_dict() == {4 * n: 3 for n in sizes}
    assert (allreduce["dtype"] == "Float").all()
    calls = events[events["name"] == "record_param_comms"]
    assert calls.groupby("comm").size().to_dict() == {"": 6, "allreduce": 15, "broadcast": 6}
    # README's cudaStreamWaitEvent x84 are host runtime calls: no cuda_sync events in this file
    runtime = events[events["task_type"] == "cuda_runtime"]
    assert (runtime["name"] == "cudaStreamWaitEvent").sum() == 84
    assert (runtime["name"] == "cudaEventRecord").sum() == 1077
    assert (events["kind"] == schema.WAIT).sum() == 0
    assert (runtime["kind"] == schema.HOST).all() and (runtime["lane_kind"] == schema.THREAD).all()


def test_stream_wait_event():
    events = frame(parse("hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"))
    wait = events[events["name"] == "Stream Wait Event"]
    assert len(wait) == 1
    row = wait.iloc[0]
    assert (row["kind"], row["lane"], row["stream"]) == (schema.WAIT, "stream 24", 24)
    assert (row["wait_on_stream"], row["event_id"], row["correlation"]) == (20, 1385, 1389)
    # the record it waits on is the host cudaEventRecord with correlation 1385
    record = events[events["correlation"] == 1385]
    assert record["name"].tolist() == ["cudaEventRecord"]


def test_event_and_context_sync():
    events = frame(parse("hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"))
    syncs = events[events["task_type"] == "cuda_sync"]
    assert (syncs["kind"] == schema.WAIT).all() and len(syncs) == 4
    event_sync = syncs[syncs["name"] == "Event Sync"]
    assert event_sync["event_id"].tolist() == [1533, 1533]
    assert (event_sync["wait_on_stream"] == 7).all() and (event_sync["stream"] == -1).all()
    stream_sync = syncs[syncs["name"] == "Stream Sync"]
    assert stream_sync["lane"].tolist() == ["stream 7"] and stream_sync["event_id"].tolist() == [-1]


def test_legacy_process_group_id_and_absolute_us():
    parsed = parse("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    events = frame(parsed)
    calls = events[events["name"] == "record_param_comms"]
    # "Process Group ID": 0 on all 45 calls: allreduce x25, broadcast x10, wait x10
    assert calls.groupby("comm").size().to_dict() == {"": 10, "allreduce": 25, "broadcast": 10}
    assert (calls["group"] == "0").all()
    # displayTimeUnit "ns" but ts in epoch µs, no baseTimeNanoseconds
    assert parsed.meta["clock_base_ns"] == 0
    step = events[events["name"] == "ProfilerStep#101"].iloc[0]
    assert step["start_ns"] == 1712195495502094500 and step["dur_ns"] == 35115869
    assert {g.group: g.ranks for g in parsed.groups} == {"0": (0,)}


def test_amd_trace_needs_a_rank_hint_and_reads_hip():
    rel = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    with pytest.raises(TraceError, match="--rank-map"):
        parse(rel)
    parsed = parse(rel, rank=5)
    events = frame(parsed)
    assert parsed.rank == 5 and parsed.meta["device"] == "AMD Radeon Graphics"
    # 14 kernels + 2 memcpy on device 2 stream 0; 21 HIP runtime calls ("stream": "0x0" args)
    device = events[events["lane_kind"] == schema.STREAM]
    assert device["kind"].value_counts().to_dict() == {"compute": 14, "memcpy": 2, "marker": 2}
    assert (device["lane"] == "stream 0").all() and (device["stream"] == 0).all()
    assert (events["task_type"] == "cuda_runtime").sum() == 21
    kernels = events[events["kind"] == schema.COMPUTE]
    launches = events[events["task_type"] == "cuda_runtime"]
    assert set(kernels["correlation"]) <= set(launches["correlation"])  # all 14 launched


def test_rank_unavailable():
    rel = "hta/rank_unavailable/rank_not_found.json.gz"
    with pytest.raises(TraceError, match=r"rank_not_found\.json\.gz: no rank id.*--rank-map"):
        parse(rel)
    parsed = parse(rel, rank=3)
    assert parsed.rank == 3 and parsed.events.num_rows == 2424 + 43  # cpu_op + user_annotation


def test_alltoall_kernels_classified_by_their_annotation():
    events = frame(parse("hta/negative_queue_length_values_check/rank0.json.gz"))
    kernels = events[(events["task_type"] == "kernel") & events["name"].str.startswith("nccl")]
    # all 80 NCCL kernels are named SendRecv and carry no comm args; the launches of 75 lie
    # inside nccl:all_to_all (45), nccl:_reduce_scatter_base / all_reduce / _all_gather_base
    # (10 each); 5 were launched before the window (name only)
    assert kernels.groupby("comm").size().to_dict() == {
        "allgather": 10, "allreduce": 10, "alltoall": 45, "batch_send_recv": 5,
        "reducescatter": 10}
    assert (kernels[kernels["comm"] == "alltoall"]["kind"] == schema.COLLECTIVE).all()
    marks = events[events["name"] == "nccl:all_to_all"]
    assert len(marks) == 55 and (marks["kind"] == schema.MARKER).all()


def test_truncated_file_keeps_complete_events(tmp_path):
    raw = (REAL / GLOO[0]).read_bytes()
    cut = tmp_path / "rank0.json.tmp"
    cut.write_bytes(raw[: len(raw) * 6 // 10])
    parsed = parse(GLOO[0], raw=cut.read_bytes())
    # the first 60% of the file (177810 bytes) ends inside event 505; cutting at the last "},"
    # and closing the array keeps 504 events, 436 of them X events in cpu_op / user_annotation
    assert parsed.rank == 0 and parsed.events.num_rows == 436
    assert len(parsed.warnings) == 1 and "truncated" in parsed.warnings[0]
    assert "rank0.json" in parsed.warnings[0]
    full = frame(parse(GLOO[0]))
    part = frame(parsed)
    assert part["start_ns"].tolist() == full["start_ns"].tolist()[:436]


def test_cut_before_the_clock_base_warns():
    rel = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    raw = _bytes(REAL / rel)
    # this (2025) file writes baseTimeNanoseconds after traceEvents (byte 66854 of 66897)
    assert parse(rel, rank=0).meta["clock_base_ns"] == 1735632360000000000
    parsed = parse(rel, rank=0, raw=raw[: len(raw) // 2])
    assert parsed.meta["clock_base_ns"] == 0 and len(parsed.warnings) == 2
    assert "baseTimeNanoseconds" in parsed.warnings[1]
    assert parsed.events.num_rows > 0


def test_rccl_kernels_and_skipped_python_functions():
    parsed = parse("tracelens/mi300/resnet_act_checkpoint.json.gz")
    events = frame(parsed)
    # 49208 X events: 34405 python_function and 1 Trace span are skipped
    assert len(events) == 14802
    comm = events[events["kind"] == schema.COLLECTIVE]
    # 17 ncclDevKernel_Generic on stream 4: 6 allreduce + 6 broadcast with PG args, 5 without
    # args whose launches precede the window
    assert comm.groupby(["comm", "group"]).size().to_dict() == {
        ("", ""): 5, ("allreduce", "0"): 6, ("broadcast", "0"): 6}
    assert (comm["lane"] == "stream 4").all()
    assert (events["name"] == "hipStreamWaitEvent").sum() == 24
    assert parsed.meta["device"] == "AMD Instinct MI300X"
    assert "nccl=2.22.3" in parsed.meta["version"]
    assert {g.group: g.ranks for g in parsed.groups} == {"0": tuple(range(8))}


@pytest.mark.parametrize("raw", [b"<html>not json</html>", b'{"schemaVersion": 1}', b"[]", b""])
def test_bad_input_names_the_file(raw):
    with pytest.raises(TraceError, match=r"rank0\.json"):
        parse(GLOO[0], raw=raw)
