"""Write a simulated `Timeline` as MindSpore `*_ascend_ms` profiles (one folder per rank).

Shapes follow the real torch_npu / msprof output (`formats/ascend.md` and the real files), with
MindSpore's documented names: framework layer `MindSpore`, host ops `PynativeFramework::*`, flows
`mindspore_to_npu`. Per rank: `{host}_{pid}_{stamp}_ascend_ms/` with `profiler_info_{rank}.json`,
`profiler_metadata.json` and `ASCEND_PROFILER_OUTPUT/` holding `trace_view.json`,
`communication.json`, `communication_matrix.json` and `step_trace_time.csv`. As in real profiles,
nothing names the record an EVENT_WAIT waits on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import orjson
import pandas as pd

from parsers.classify import double_hash
from tracegraph.schema import COLLECTIVE, COMPUTE, MEMCPY, P2P, RECORD, WAIT
from tracegraph.simulate.bundle_writer import (
    Data,
    clock_shift,
    comm_instances,
    host_room,
    joined,
    json_array,
    json_strings,
    micros,
    plain_strings,
    rank_frames,
    render,
    time_bounds,
)
from tracegraph.simulate.timeline import StepSpan, Timeline, range_names

INVALID = 4294967295  # msprof's "none" for Model Id / Subtask Id / dst rank
NO_NOTIFY = "18446744073709551615"
LAYER_MSTX, LAYER_CANN, LAYER_HARDWARE, LAYER_HCCL = 1, 7, 13, 15  # msprof layer sort indexes
MSTX_NAMES = {"F": "forward", "B": "backward"}  # MindSpeed's mstx messages (pp_chart reads them)
COMM_KINDS = (COLLECTIVE, P2P)
MESH_MAX = 8  # groups up to this size talk to every member (mesh), larger ones to ring neighbours
LINK_BYTES_PER_NS = 20  # 20 GB/s: a nominal HCCS link, to date transfers when a peer is unprofiled
HCOM_OPS = {
    "allreduce": ("hcom_allReduce_", "allreduce"),
    "reducescatter": ("hcom_reduceScatter_", "reduce"),
    "allgather": ("hcom_allGather_", "allgather"),
    "alltoall": ("hcom_alltoall_", "alltoall"),
    "broadcast": ("hcom_broadcast_", "broadcast"),
    "reduce": ("hcom_reduce_", "reduce"),
    "gather": ("hcom_gather_", "gather"),
    "scatter": ("hcom_scatter_", "scatter"),
    "barrier": ("hcom_barrier_", "barrier"),
    "send": ("hcom_send_", "send"),
    "recv": ("hcom_receive_", "receive"),
    "batch_send_recv": ("hcom_batchSendRecv_", "batchsendrecv"),
}
"""comm type -> (HCCL op-type prefix, op type in communication_matrix.json keys)."""
REDUCING = ("allreduce", "reducescatter", "reduce")
COPIES = ("Memcpy", "Reduce_Inline")
DTYPE_BYTES = {"FP32": 4, "FP16": 2, "BFP16": 2, "INT32": 4, "INT64": 8, "INT8": 1, "UINT8": 1}
HW_TASK = {"Notify_Record": "Write Value", "Notify_Wait": "Notify Wait", "Memcpy": "SDMA",
           "Reduce_Inline": "SDMA"}
"""HCCL small task -> the FFTS+ subtask type its device row shows."""
TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")
LARGE_PACKET_MB = 32.0
MS_VERSION, CANN_VERSION = "2.6.0", "8.3.RC1"
MS_MB = 1024 * 1000  # MindSpore's memory_record "MB": bytes / 1024 (KB) / 1000
MEMORY_COMPONENTS = ("MindSpore", "MindSpore+GE")  # its allocator, and the sum with GE's (none)


def files(timeline: Timeline) -> dict[str, bytes]:
    """Every rank's profile folder as `{relative path: bytes}` (small jobs; see `iter_files`)."""
    return {path: joined(data) for path, data in iter_files(timeline)}


def iter_files(timeline: Timeline, writer: type[RankWriter] | None = None
               ) -> Iterator[tuple[str, Data]]:
    """Every rank's profile folder as (relative path, data), in path order, one rank at a time
    (`writer`: the rank writer of another export type, e.g. `write_ascend_db`'s)."""
    job, writer = Job(timeline), writer or RankWriter
    for rank in sorted(timeline.ranks, key=lambda r: writer(job, r).root):
        yield from sorted(writer(job, rank).files().items())


def group_ids(timeline: Timeline) -> dict[str, str]:
    """Timeline group id -> the HCCL group hash the files use (`double_hash(comm name)`)."""
    return {gid: g.hash for gid, g in _groups(timeline).items()}


def rank_roots(timeline: Timeline) -> dict[int, str]:
    """Rank -> its profile folder."""
    job = Job(timeline)
    return {rank: RankWriter(job, rank).root for rank in timeline.ranks}


@dataclass(frozen=True)
class _Group:
    comm_name: str
    hash: str
    desc: str
    ranks: tuple[int, ...]


def _groups(timeline: Timeline) -> dict[str, _Group]:
    """Group id -> its HCCL comm name, hash, parallel dim and sorted member ranks."""
    groups = {}
    for index, (gid, info) in enumerate(sorted(timeline.groups.items())):
        comm_name = info.name or f"group_name_{index}"
        groups[gid] = _Group(comm_name, double_hash(comm_name), info.desc,
                             tuple(sorted(int(r) for r in info.ranks)))
    return groups


class Job:
    """Job-wide facts every rank writer needs: groups, clocks, comm instance numbers, arrivals."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.groups = _groups(timeline)
        self.shift = clock_shift(timeline)
        self.bounds = time_bounds(timeline)
        self.steps: dict[int, list[StepSpan]] = {}
        for span in sorted(timeline.steps, key=lambda s: (s.rank, s.step)):
            self.steps.setdefault(span.rank, []).append(span)

    @cached_property
    def frames(self) -> dict[int, pd.DataFrame]:
        return rank_frames(self.timeline)

    @cached_property
    def inst(self) -> pd.Series:
        return comm_instances(self.frames)

    @cached_property
    def arrival(self) -> pd.Series:
        """(group, instance, rank) -> true ns the rank started that comm op."""
        comm = pd.concat([f[f["kind"].isin(COMM_KINDS)] for f in self.frames.values()])
        return pd.Series(comm["start_ns"].to_numpy(), index=pd.MultiIndex.from_arrays(
            [comm["group"].astype(str), self.inst[comm.index], comm["rank"].astype("int64")],
            names=["group", "inst", "rank"]))

    @cached_property
    def last_arrival(self) -> pd.Series:
        """(group, instance) -> the latest start among its profiled members."""
        return self.arrival.groupby(level=["group", "inst"]).max()


class RankWriter:
    """One rank's `*_ascend_ms` folder."""

    export_type = "text"  # profiler_info's `_export_type`

    def __init__(self, job: Job, rank: int):
        self.job, self.rank = job, rank
        self.shift = job.shift[rank]
        self.pid = 100_000 + (rank * 7919) % 4_000_000
        self.device = rank % 8
        self.main_tid, self.launch_tid = self.pid, self.pid + 5
        self.hw_pid, self.cann_pid, self.hccl_pid, self.mstx_pid = (
            (self.pid << 10) | (layer << 5) | self.device
            for layer in (LAYER_HARDWARE, LAYER_CANN, LAYER_HCCL, LAYER_MSTX))
        self.steps = job.steps.get(rank, [])

    @cached_property
    def root(self) -> str:
        first = self.job.bounds[self.rank][0] + self.shift
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(first // 10**9))
        return f"node{self.rank // 8}_{self.pid}_{stamp}{first // 10**6 % 1000:03d}_ascend_ms"

    def files(self) -> dict[str, Data]:
        out = f"{self.root}/ASCEND_PROFILER_OUTPUT"
        files = {
            f"{self.root}/profiler_info_{self.rank}.json": self.profiler_info(),
            f"{self.root}/profiler_metadata.json": self.profiler_metadata(),
            f"{out}/trace_view.json": self.trace_view(),
            f"{out}/communication.json": self.communication(),
            f"{out}/communication_matrix.json": self.communication_matrix(),
            f"{out}/step_trace_time.csv": self.step_trace_time(),
        }
        if self.job.timeline.memory is not None:
            files[f"{out}/memory_record.csv"] = self.memory_record()
        return files

    def memory_record(self) -> bytes:
        """memory_record.csv as MindSpore's AscendMemoryViewer writes it: a `MindSpore` row
        per allocator event and the `MindSpore+GE` sum beside it (no GE memory here), sizes
        in its "MB" of 1024 × 1000 bytes, the µs timestamp as Decimal text."""
        mine = self.memory_samples()
        micros_text = [f"{t // 1000}.{t % 1000:03d}" for t in mine["ts"].tolist()]
        lines = ["Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),"
                 "Total Active(MB),Device Type"]
        for ts, allocated, reserved in zip(micros_text, mine["allocated"].tolist(),
                                           mine["reserved"].tolist(), strict=True):
            sizes = f"{allocated / MS_MB!r},{reserved / MS_MB!r},{allocated / MS_MB!r}"
            for component in MEMORY_COMPONENTS:
                lines.append(f"{component},{ts},{sizes},NPU:{self.rank}")
        return ("\n".join(lines) + "\n").encode()

    def memory_samples(self) -> pd.DataFrame:
        """The rank's allocator totals (bytes) after each event, at `ts` on its local clock."""
        memory = self.job.timeline.memory
        mine = memory[memory["rank"] == self.rank]
        return pd.DataFrame({"ts": mine["time_ns"].to_numpy(np.int64) + self.shift,
                             "allocated": mine["allocated"].to_numpy(np.int64),
                             "reserved": mine["reserved"].to_numpy(np.int64)})

    # --- the rank's ops, with the ids msprof assigns ---------------------------------------------

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The rank's ops in launch order, on its local clock, with connection and task ids."""
        ops = plain_strings(self.job.frames[self.rank]).sort_values(["launch_ns", "start_ns"],
                                                                     kind="stable")
        ops = ops.assign(t0=ops["start_ns"] + self.shift, lt=ops["launch_ns"] + self.shift)
        ops["t1"] = ops["t0"] + ops["dur_ns"]
        ops["launcher"] = ops["kind"].isin((COMPUTE, *COMM_KINDS))  # AscendCL call + Node@launch
        last = 1000 + np.cumsum(np.where(ops["launcher"], 2, 1))
        ops["conn"] = last  # the device task's connection_id (Node@launch's when there is one)
        ops["acl_conn"] = last - ops["launcher"].astype(int)
        ops["task"] = 1000 + ops.sort_values("t0", kind="stable").groupby("stream").cumcount()
        ops["inst"] = self.job.inst.reindex(ops.index).fillna(-1).astype("int64")
        ops["hcom"] = pd.Series(  # object dtype: it is iterated per op below
            [f"{HCOM_OPS[c][0]}_{self.job.groups[g].hash[-3:]}_{i}_1" if i >= 0 else ""
             for c, g, i in zip(ops["comm"], ops["group"], ops["inst"], strict=True)],
            index=ops.index, dtype=object)
        ops["before"], ops["after"] = host_room(ops["lt"].to_numpy(np.int64))
        return ops

    @cached_property
    def comm(self) -> pd.DataFrame:
        return self.ops[self.ops["kind"].isin(COMM_KINDS)]

    @cached_property
    def group_tids(self) -> dict[str, int]:
        """HCCL group -> tid of its op row; its `Plane k` rows follow (msprof's layout)."""
        tids, nxt = {}, 0
        planes = self.tasks.groupby("group")["plane"].max()
        for group in dict.fromkeys(self.comm["group"]):
            tids[group] = nxt
            nxt += int(planes[group]) + 2
        return tids

    # --- HCCL small tasks ------------------------------------------------------------------------

    @cached_property
    def tasks(self) -> pd.DataFrame:
        """Every HCCL small task of the rank's comm ops (true clock), one row each.

        Per peer plane: Notify_Record, a Notify_Wait lasting until that peer arrived, the transfer
        once every member arrived, then a closing Notify_Record / Notify_Wait pair. Plane 0 holds
        the on-chip copy. The waits are what shows, as in real data, who was late. Members the
        Timeline does not hold (unprofiled ranks) are taken to arrive when the transfer starts:
        no sooner than the last profiled member, nor later than the op's end less the transfer
        time at `LINK_BYTES_PER_NS`.
        """
        links = self._links()
        op = self.comm.loc[links["op"]]
        start = op["start_ns"].to_numpy(np.int64)
        end = start + op["dur_ns"].to_numpy(np.int64)
        pre = np.clip((end - start) // 20, 0, 4_000)
        n = links["n"].to_numpy()
        moved = np.where((op["kind"] == P2P) | (n > MESH_MAX), op["bytes"], op["bytes"] // n)
        keys = [op["group"].astype(str), op["inst"]]
        last = self.job.last_arrival.reindex(pd.MultiIndex.from_arrays(keys))
        ready = np.clip(np.maximum(_or(last, start), end - pre - moved // LINK_BYTES_PER_NS),
                        start + pre, end - pre)
        peers = self.job.arrival.reindex(pd.MultiIndex.from_arrays([*keys, links["peer"]]))
        wait1 = start + pre // 2
        local = links["plane"].to_numpy() == 0
        record, wait = np.full(len(links), "Notify_Record"), np.full(len(links), "Notify_Wait")
        phases = [  # (name, start, end) of each task on a peer plane; phase 0 is plane 0's copy
            (np.where(local, "Memcpy", record), start, start + pre // 4),
            (wait, wait1, np.clip(_or(peers, ready), wait1, ready)),
            (np.where(op["comm"].isin(REDUCING), "Reduce_Inline", "Memcpy"), ready, end - pre),
            (record, end - pre, end - pre + pre // 4),
            (wait, end - pre // 2, end),
        ]
        common = {c: op[c].to_numpy() for c in ("group", "comm", "kind", "step", "stream",
                                                 "task", "conn", "hcom")}
        frames = []
        for phase, (name, t0, t1) in enumerate(phases):
            keep = np.ones(len(links), bool) if phase == 0 else ~local
            frames.append(links.assign(
                phase=phase, name=name, start=t0, dur=np.maximum(t1 - t0, 0),
                size=np.where(np.isin(name, COPIES), moved, 0), **common)[keep])
        tasks = pd.concat(frames, ignore_index=True)
        tasks["link"] = np.select([tasks["size"] == 0, tasks["plane"] == 0],
                                  ["INVALID_TYPE", "ON_CHIP"], "HCCS")
        tasks["notify"] = _notify_ids(tasks)
        tasks = tasks.sort_values(["op", "start", "plane", "phase"], kind="stable")
        tasks["context"] = tasks.groupby("op", sort=False).cumcount()
        return tasks.reset_index(drop=True)

    def _links(self) -> pd.DataFrame:
        """One row per (comm op, plane): plane 0 is the local copy, plane k the k-th peer."""
        rows = []
        for index, group in zip(self.comm.index, self.comm["group"], strict=True):
            members = self.job.groups[group].ranks
            n, me = len(members), members.index(self.rank)
            steps = range(1, n) if n <= MESH_MAX else (1, n - 1)
            rows.append((index, 0, me, self.rank, n, me))
            rows.extend((index, plane, (me + s) % n, members[(me + s) % n], n, me)
                        for plane, s in enumerate(steps, start=1))
        return pd.DataFrame(rows, columns=["op", "plane", "peer_local", "peer", "n", "me"])

    # --- trace_view.json -------------------------------------------------------------------------

    def trace_view(self) -> list[bytes]:
        return json_array([self._metadata(), self._framework(), self._mstx(), self._cann(),
                           self._hardware(), self._hccl(), self._flows()])

    def _metadata(self) -> list[bytes]:
        threads = [self.main_tid, self.launch_tid]
        rows = [_meta_ms(self.pid, 0, "process_name", "name", "MindSpore"),
                _meta_ms(self.pid, 0, "process_labels", "labels", "CPU"),
                _meta_ms(self.pid, 0, "process_sort_index", "sort_index", 0)]
        rows += [_meta_ms(self.pid, t, "thread_name", "name", f"Thread {t}") for t in threads]
        rows += [_meta_ms(self.pid, t, "thread_sort_index", "sort_index", t) for t in threads]
        streams = sorted(int(s) for s in self.ops["stream"].unique())
        layers = [
            (self.hw_pid, "Ascend Hardware", "NPU", LAYER_HARDWARE,
             [(s, f"Stream {s}") for s in streams]),
            (self.cann_pid, "CANN", "CPU", LAYER_CANN,
             [(self.launch_tid, f"Thread {self.launch_tid}")]),
            (self.hccl_pid, "HCCL", "NPU", LAYER_HCCL, self._hccl_threads()),
        ]
        if self.job.timeline.ranges is not None:
            layers.append((self.mstx_pid, "python3", "CPU", LAYER_MSTX,
                           [(self.main_tid, f"Thread {self.main_tid}")]))
        for pid, name, label, sort, named in layers:
            rows.append(_meta(pid, 0, "process_name", "name", name))
            rows += [_meta(pid, tid, "thread_name", "name", text) for tid, text in named]
            rows += [_meta(pid, tid, "thread_sort_index", "sort_index", tid) for tid, _ in named]
            rows.append(_meta(pid, 0, "process_labels", "labels", label))
            rows.append(_meta(pid, 0, "process_sort_index", "sort_index", sort))
        return [",\n".join(rows).encode()]

    def _hccl_threads(self) -> list[tuple[int, str]]:
        named = []
        planes = self.tasks.groupby("group")["plane"].unique()
        for group, tid in self.group_tids.items():
            named.append((tid, f"Group {self.job.groups[group].hash} Communication"))
            named += [(tid + int(p) + 1, f"Plane {int(p)}") for p in sorted(planes[group])]
        return named

    def _framework(self) -> list[bytes]:
        template = ('{"ph":"X","name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,'
                    '"cat":"cpu_op","args":{"Sequence number":-1,"Fwd thread id":0}}')
        start = np.array([s.start_ns for s in self.steps], dtype=np.int64) + self.shift
        end = np.array([s.end_ns for s in self.steps], dtype=np.int64) + self.shift
        fwk = self._fwk_ops
        return [*render(template, [json_strings(f"ProfilerStep#{s.step}" for s in self.steps),
                                   self.pid, self.main_tid, *_times(start, end - start)],
                        len(self.steps)),
                *render(template, [json_strings(fwk["fwk_name"]), self.pid, self.launch_tid,
                                   *_times(fwk["fwk_ts"], fwk["fwk_dur"])], len(fwk))]

    def _mstx(self) -> list[bytes]:
        """The framework's mstx range around the launches of each forward and backward
        (`mstx.range_start("forward")` without a stream: host side only), in the mstx layer."""
        ranges = self.job.timeline.ranges
        if ranges is None:
            return []
        mine = ranges[ranges["rank"] == self.rank]
        start = mine["host_start_ns"].to_numpy(np.int64) + self.shift
        end = mine["host_end_ns"].to_numpy(np.int64) + self.shift
        return render('{"ph":"X","name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,'
                      '"cat":"mstx","args":{}}',
                      [json_strings(range_names(mine, MSTX_NAMES, str(
                          self.job.timeline.params.get("range_label", "")))),
                       self.mstx_pid, self.main_tid,
                       *_times(start, end - start)], len(mine))

    @cached_property
    def _fwk_ops(self) -> pd.DataFrame:
        """The MindSpore PyNative launch op around each kernel / comm launch."""
        ops = self.ops[self.ops["launcher"]]
        names = [f"PynativeFramework::PyNativeLaunchTask::{_op_type(n, h)}"
                 for n, h in zip(ops["name"], ops["hcom"], strict=True)]
        ts = ops["lt"] - ops["before"] * 4 // 5
        return ops.assign(fwk_name=names, fwk_ts=ts,
                          fwk_dur=ops["lt"] + ops["after"] * 9 // 10 - ts)

    def _cann(self) -> list[bytes]:
        """AscendCL calls (and Node@launch for kernels and HCCL ops) on the launch thread."""
        calls = self.cann_calls()
        template = ('{"name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,"args":{'
                    '"Thread Id":%d,"Mode":%s,"level":%s,"id":%s,"item_id":%s,'
                    '"connection_id":%d},"ph":"X"}')
        return render(template, [
            json_strings(calls["name"]), self.cann_pid, self.launch_tid,
            *_times(calls["ts"], calls["dur"]), self.launch_tid, json_strings(calls["mode"]),
            json_strings(calls["level"]), json_strings(calls["id"]), json_strings(calls["item"]),
            calls["conn"].to_numpy()], len(calls))

    def cann_calls(self) -> pd.DataFrame:
        """The CANN API calls: name (`AscendCL@...`, `Node@launch`), ts, dur, mode, level, id,
        item and connection id (`conn`), in time order."""
        ops = self.ops
        kind, lt, after = ops["kind"].to_numpy(), ops["lt"].to_numpy(), ops["after"].to_numpy()
        api = [_acl_api(k, n, h) for k, n, h in zip(kind, ops["name"], ops["hcom"], strict=True)]
        is_hcom = np.isin(kind, COMM_KINDS)
        acl_ts = np.where(kind == COMPUTE, lt - ops["before"].to_numpy() // 2, lt)
        acl = pd.DataFrame({
            "name": [f"AscendCL@{a}" for a in api], "ts": acl_ts,
            "dur": lt + after * 4 // 5 - acl_ts,
            "mode": np.select([is_hcom, kind == COMPUTE], ["HOST_HCCL", "ACL_NN"], "ACL_RTS"),
            "level": "acl", "id": api, "item": np.where(is_hcom, api, "0"),
            "conn": ops["acl_conn"].to_numpy()})
        launched = ops[ops["launcher"]]
        node = pd.DataFrame({
            "name": "Node@launch", "ts": launched["lt"].to_numpy(),
            "dur": np.where(launched["kind"] == COMPUTE, launched["after"] // 2,
                            launched["after"] * 4 // 5),
            "mode": "launch", "level": "node", "id": "0",
            "item": [h.split("__")[0] + "_" if h else n  # HCCL: the op type, as msprof
                     for n, h in zip(launched["name"], launched["hcom"], strict=True)],
            "conn": launched["conn"].to_numpy()})
        return pd.concat([acl, node], ignore_index=True).sort_values(["ts", "conn"])

    def _hardware(self) -> list[bytes]:
        """Device tasks: kernels, events and copies, plus every HCCL op's FFTS+ subtasks."""
        rows = self.device_tasks()
        template = ('{"name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,"args":{'
                    '"Model Id":4294967295,"Task Type":%s,"Physic Stream Id":%d,"Task Id":%d,'
                    '"Batch Id":0,"Subtask Id":%d,"connection_id":%d},"ph":"X"}')
        streams = rows["stream"].to_numpy()
        return render(template, [
            json_strings(rows["name"]), self.hw_pid, streams, *_times(rows["ts"], rows["dur"]),
            json_strings(rows["type"]), streams, rows["task"].to_numpy(),
            rows["subtask"].to_numpy(np.int64), rows["conn"].to_numpy()], len(rows))

    def device_tasks(self) -> pd.DataFrame:
        """Kernels, events and copies, then every HCCL op's FFTS+ subtasks (`sub`: the row of
        `tasks`, -1 for the others): name, type, ts, dur, subtask, stream, task and conn, by
        stream and time."""
        plain = self.ops[~self.ops["kind"].isin(COMM_KINDS)]
        kinds = [plain["kind"] == WAIT, plain["kind"] == RECORD, plain["kind"] == MEMCPY]
        sub = self.tasks
        rows = pd.DataFrame({
            "name": np.concatenate([
                np.select(kinds, ["EVENT_WAIT", "EVENT_RECORD", "MEMCPY_ASYNC"],
                          plain["name"].to_numpy(object)),
                sub["name"].map(HW_TASK).to_numpy(object)]),
            "type": np.concatenate([
                np.select(kinds, ["EVENT_WAIT_SQE", "EVENT_RECORD_SQE", "SDMA_SQE"], "AI_CORE"),
                sub["name"].map(HW_TASK).to_numpy(object)]),
            "ts": np.concatenate([plain["t0"], sub["start"] + self.shift]),
            "subtask": np.concatenate([np.full(len(plain), INVALID), sub["context"]]),
            **{c: np.concatenate([plain[c], sub[c]]).astype(np.int64)
               for c in ("stream", "task", "conn")},
            "dur": np.concatenate([plain["dur_ns"], sub["dur"]]),
            "sub": np.concatenate([np.full(len(plain), -1), sub.index.to_numpy()]),
        })
        return rows.sort_values(["stream", "ts"], kind="stable")

    def _hccl(self) -> list[bytes]:
        """HCCL op rows on `Group … Communication` and small tasks on `Plane k` rows."""
        comm, tasks = self.comm, self.tasks
        dtype = _dtype(comm["dtype"])
        op_template = ('{"name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,"args":{'
                       '"connection_id":%d,"model id":4294967295,"data_type":%s,'
                       '"alg_type":"MESH-RING","count":%d},"ph":"X"}')
        rows = render(op_template, [
            json_strings(comm["hcom"]), self.hccl_pid,
            comm["group"].map(self.group_tids).to_numpy(np.int64),
            *_times(comm["t0"], comm["dur_ns"]), comm["conn"].to_numpy(), json_strings(dtype),
            comm["bytes"].to_numpy() // [DTYPE_BYTES.get(d, 4) for d in dtype]], len(comm))
        names = tasks["name"].to_numpy(object)
        size, dur = tasks["size"].to_numpy(np.int64), tasks["dur"].to_numpy(np.int64)
        task_template = (
            '{"name":%s,"pid":%d,"tid":%d,"ts":"%d.%03d","dur":%d.%03d,"args":{"notify_id":%s,'
            '"duration estimated(us)":%r,"stream id":%d,"task id":%d,"context id":%d,'
            '"task type":%s,"src rank":%d,"dst rank":%d,"transport type":%s,"size(Byte)":%d,'
            '"data type":%s,"link type":%s,"bandwidth(GB/s)":%r,"model id":4294967295},"ph":"X"}')
        encoded = json_strings(names)
        return rows + render(task_template, [
            encoded, self.hccl_pid,
            (tasks["group"].map(self.group_tids) + tasks["plane"] + 1).to_numpy(np.int64),
            *_times(tasks["start"] + self.shift, dur), json_strings(tasks["notify"]),
            np.where(size > 0, size / 19_000.0, np.where(names == "Notify_Wait", 0.02, 1.0)),
            tasks["stream"].to_numpy(), tasks["task"].to_numpy(), tasks["context"].to_numpy(),
            encoded, tasks["me"].to_numpy(), tasks["peer_local"].to_numpy(),
            json_strings(np.where(names == "Notify_Wait", "LOCAL", "SDMA")), size,
            json_strings(np.where(names == "Reduce_Inline",
                                  tasks["op"].map(pd.Series(dtype, index=comm.index)),
                                  "INVALID_TYPE")),
            json_strings(tasks["link"]), np.where(size > 0, size / np.maximum(dur, 1), 0.0)],
            len(tasks))

    def _flows(self) -> list[bytes]:
        """HostToDevice (CANN launch -> device) and mindspore_to_npu (framework -> device)."""
        ops = self.ops[self.ops["kind"].isin((COMPUTE, MEMCPY, *COMM_KINDS))]
        is_comm = ops["kind"].isin(COMM_KINDS).to_numpy()
        stream = ops["stream"].to_numpy(np.int64)
        flow_id = _flow_ids(ops, is_comm)
        end_pid = np.where(is_comm, self.hccl_pid, self.hw_pid)
        end_tid = np.where(is_comm, ops["group"].map(self.group_tids).fillna(0), stream)
        end_tid = end_tid.astype(np.int64)
        end = micros(ops["t0"])
        rows = render('{"name":"HostToDevice%d","ph":"s","cat":"HostToDevice","id":"%d",'
                      '"pid":%d,"tid":%d,"ts":"%d.%03d"}',
                      [flow_id, flow_id, self.cann_pid, self.launch_tid, *micros(ops["lt"])],
                      len(ops))
        rows += render('{"name":"HostToDevice%d","ph":"f","id":"%d","ts":"%d.%03d",'
                       '"cat":"HostToDevice","pid":%d,"tid":%d,"bp":"e"}',
                       [flow_id, flow_id, *end, end_pid, end_tid], len(ops))
        launched = ops["launcher"].to_numpy()
        template = ('{"ph":"%s","bp":"e","name":"mindspore_to_npu","id":"%d.%03d","pid":%d,'
                    '"tid":%d,"ts":"%d.%03d","cat":"async_npu"}')  # id: the device task's ts
        ids = [part[launched] for part in end]
        rows += render(template, ["s", *ids, self.pid, self.launch_tid,
                                  *micros(self._fwk_ops["fwk_ts"])], int(launched.sum()))
        return rows + render(template, ["f", *ids, end_pid[launched], end_tid[launched], *ids],
                             int(launched.sum()))

    # --- communication.json, communication_matrix.json, step_trace_time.csv ---------------------

    @cached_property
    def _transit(self) -> pd.DataFrame:
        """Tasks that move data off chip (msprof's transit tasks)."""
        tasks = self.tasks
        return tasks[(tasks["size"] > 0) & (tasks["link"] == "HCCS")]

    @cached_property
    def _op_times(self) -> pd.DataFrame:
        """Per comm op: msprof's time split (ns) from the master plane (plane 1)."""
        master = self.tasks[self.tasks["plane"] == 1]
        moving = (master["size"] > 0) & (master["link"] == "HCCS")
        first = master["op"].map(master[moving].groupby("op")["start"].min()).fillna(np.inf)
        waits = master[master["name"] == "Notify_Wait"]
        return pd.DataFrame({
            "elapse": self.comm["dur_ns"],
            "transit": master[moving].groupby("op")["dur"].sum(),
            "wait": waits.groupby("op")["dur"].sum(),
            "sync": waits[waits["start"] < first[waits.index]].groupby("op")["dur"].sum(),
        }, index=self.comm.index).fillna(0) / 1e6

    def communication(self) -> bytes:
        out = {}
        for step in self._step_numbers():
            ops = self.comm[self.comm["step"] == step]
            out[f"step{step}"] = {kind: self._comm_section(ops[ops["kind"] == kind])
                                  for kind in (P2P, COLLECTIVE)}
        return orjson.dumps(out)

    def _comm_section(self, ops: pd.DataFrame) -> dict[str, object]:
        if ops.empty:
            return {}
        times, (sizes, per_op) = self._op_times, self._packets
        none = sizes.iloc[:0].droplevel(0)
        section: dict[str, object] = {
            f"{hcom}@{self.job.groups[group].hash}": {
                "Communication Time Info": {"Start Timestamp(us)": int(t0) / 1000,
                                            **_time_info(times.loc[index])},
                "Communication Bandwidth Info": _bandwidth(per_op.get(index, none), True)}
            for index, hcom, group, t0 in zip(ops.index, ops["hcom"], ops["group"], ops["t0"],
                                              strict=True)}
        mine = sizes[sizes.index.get_level_values(0).isin(ops.index)]
        section["Total Op Info"] = {
            "Communication Time Info": _time_info(times.loc[ops.index].sum()),
            "Communication Bandwidth Info": _bandwidth(mine.groupby(level=1).sum(), False)}
        return section

    @cached_property
    def _packets(self) -> tuple[pd.DataFrame, dict[int, pd.DataFrame]]:
        """Transit packets per (op, size): count and total ns; also split by op."""
        sizes = self._transit.groupby(["op", "size"])["dur"].agg(["size", "sum"])
        return sizes, {op: rows.droplevel(0) for op, rows in sizes.groupby(level=0)}

    def _step_numbers(self) -> list[int]:
        return sorted({s.step for s in self.steps} | {int(s) for s in self.comm["step"]})

    def communication_matrix(self) -> bytes:
        moved = self.tasks[self.tasks["size"] > 0]
        links = moved.assign(key=moved["me"].astype(str) + "-" + moved["peer_local"].astype(str),
                             gh=moved["group"].map({g: v.hash for g, v in self.job.groups.items()}))
        per_op = links.groupby(["step", "kind", "comm", "gh", "key", "hcom"], sort=False).agg(
            link=("link", "first"), mb=("size", "sum"), ms=("dur", "sum")).reset_index()
        per_op = per_op.assign(mb=per_op["mb"] / 1e6, ms=per_op["ms"] / 1e6)
        per_op["bw"] = (per_op["mb"] / per_op["ms"].where(per_op["ms"] > 0)).fillna(0).round(4)
        out = {}
        for step in self._step_numbers():
            rows = per_op[per_op["step"] == step]
            out[f"step{step}"] = {kind: _matrix_section(rows[rows["kind"] == kind])
                                  for kind in (P2P, COLLECTIVE)}
        return orjson.dumps(out)

    def step_trace_time(self) -> bytes:
        """Per step: msprof's compute / comm overlap split (µs) of the device timeline."""
        header = ("Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,"
                  "Communication,Free,Stage,Bubble,"
                  "Communication(Not Overlapped and Exclude Receive),Preparing")
        ops = self.ops
        lines = [header]
        for span in self.steps:
            lo, hi = span.start_ns + self.shift, span.end_ns + self.shift
            compute, comm, recv = (_clip(frame, lo, hi) for frame in (
                ops[ops["kind"] == COMPUTE], self.comm, self.comm[self.comm["comm"] == "recv"]))
            computing, communication, bubble = _union(*compute), _union(*comm), _union(*recv)
            busy = _union(np.concatenate([compute[0], comm[0]]),
                          np.concatenate([compute[1], comm[1]]))
            overlapped = computing + communication - busy
            first = ops.loc[(ops["t0"] >= lo) & (ops["t0"] < hi), "t0"].min()
            values = [computing, communication - overlapped, overlapped, communication,
                      hi - lo - busy, hi - lo, bubble, communication - overlapped - bubble,
                      float(first - lo) if pd.notna(first) else 0.0]
            lines.append(",".join([str(self.device), str(span.step),
                                   *(repr(v / 1000) for v in values)]))
        return ("\n".join(lines) + "\n").encode()

    # --- profiler_info_{rank}.json, profiler_metadata.json --------------------------------------

    def profiler_info(self) -> bytes:
        start, end = (t + self.shift for t in self.job.bounds[self.rank])
        boot = self.shift - 86_400 * 10**9  # the host booted a day before true time 0
        first_step = min((s.step for s in self.steps), default=1)
        info = {
            "config": {
                "common_config": {
                    "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                    "schedule": {"wait": 0, "active": 1, "warmup": 1, "repeat": 1,
                                 "skip_first": max(first_step - 1, 0)},
                    "record_shapes": False,
                    "profile_memory": bool(self.job.timeline.params.get("memory")),
                    "with_stack": False, "with_flops": False, "with_modules": False},
                "experimental_config": {
                    "_profiler_level": "Level1", "_aic_metrics": "ACL_AICORE_PIPE_UTILIZATION",
                    "_l2_cache": False, "_msprof_tx": False, "_data_simplification": True,
                    "record_op_args": False, "_export_type": self.export_type, "_op_attr": False}},
            "start_info": {"syscnt_enable": True, "freq": 100, "start_cnt": (start - boot) // 10,
                           "start_monotonic": start - boot},
            "end_info": {"collectionTimeEnd": end, "MonotonicTimeEnd": end - boot},
            "ms_version": MS_VERSION,
            "cann_version": CANN_VERSION,
            "rank_id": self.rank,
        }
        return orjson.dumps(info, option=orjson.OPT_INDENT_2)

    def profiler_metadata(self) -> bytes:
        info = {g.comm_name: {"group_name": g.desc, "group_rank": g.ranks.index(self.rank),
                              "global_ranks": list(g.ranks)}
                for g in self.job.groups.values() if self.rank in g.ranks}
        return orjson.dumps({"parallel_group_info": info})


# --- small pure helpers ----------------------------------------------------------------------

def _meta(pid: int, tid: int, name: str, key: str, value: object) -> str:
    """An msprof metadata event (key order as msprof writes it)."""
    return orjson.dumps({"name": name, "pid": pid, "tid": tid, "args": {key: value},
                         "ph": "M"}).decode()


def _meta_ms(pid: int, tid: int, name: str, key: str, value: object) -> str:
    """A framework-layer metadata event (key order as the framework writes it)."""
    return orjson.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid,
                         "args": {key: value}}).decode()


def _flow_ids(ops: pd.DataFrame, is_comm: np.ndarray) -> np.ndarray:
    """msprof's HostToDevice ids: a kernel's (stream, task, batch, subtask) key, an HCCL op's
    (AscendCL connection id, subtask), a copy's connection id (as in the real traces)."""
    ids = np.array([(s << 64) | (t << 48) | INVALID for s, t in
                    zip(ops["stream"].tolist(), ops["task"].tolist(), strict=True)], dtype=object)
    ids[is_comm] = (ops["acl_conn"].to_numpy(np.int64)[is_comm] << 32) | INVALID
    copies = (ops["kind"] == MEMCPY).to_numpy()
    ids[copies] = ops["conn"].to_numpy(np.int64)[copies]
    return ids


def _times(ts, dur) -> list[np.ndarray]:
    """The four columns of `"ts":"%d.%03d","dur":%d.%03d` (µs exact to the ns)."""
    return [*micros(ts), *micros(dur)]


def _or(values: pd.Series, fallback: np.ndarray) -> np.ndarray:
    """`values` as int64 ns, `fallback` where missing."""
    found = values.to_numpy(np.float64)
    return np.where(np.isnan(found), fallback, found).astype(np.int64)


def _dtype(values) -> list[str]:
    return [v if isinstance(v, str) and v else "FP32" for v in values]


def _notify_ids(tasks: pd.DataFrame) -> np.ndarray:
    """A record toward B and B's wait on us share an id: (waiter << 32) | index(source, phase)."""
    is_record = (tasks["name"] == "Notify_Record").to_numpy()
    me, peer = tasks["me"].to_numpy(np.int64), tasks["peer_local"].to_numpy(np.int64)
    waiter, source = np.where(is_record, peer, me), np.where(is_record, me, peer)
    notify = (waiter << 32) | (64 + 2 * source + (tasks["phase"].to_numpy() > 2))
    other = np.where(tasks["name"] == "Reduce_Inline", "0", NO_NOTIFY)
    return np.where(tasks["name"].str.startswith("Notify"), notify.astype(str), other)


def _op_type(name: str, hcom: str) -> str:
    """The op type MindSpore names a launch after: `MatMul` for `aclnnMatmul_MatMulV3_MatMul`."""
    if hcom:
        op = hcom.split("_")[1]
        return op[:1].upper() + op[1:]
    return name.rsplit("_", 1)[-1]


def _acl_api(kind: str, name: str, hcom: str) -> str:
    """The AscendCL call that launches an op of `kind`."""
    if kind in COMM_KINDS:
        return hcom.split("__")[0] + "_"
    if kind == COMPUTE:
        head = name.split("_", 1)[0]
        return head if head.startswith("aclnn") else f"aclnn{head[:1].upper()}{head[1:]}"
    return {MEMCPY: "aclrtMemcpyAsync", RECORD: "aclrtRecordEvent",
            WAIT: "aclrtStreamWaitEvent"}[kind]


def _time_info(s: pd.Series) -> dict[str, float]:
    """msprof's Communication Time Info (ms) and ratios from elapse / transit / wait / sync."""
    return {"Elapse Time(ms)": float(s["elapse"]), "Transit Time(ms)": float(s["transit"]),
            "Wait Time(ms)": float(s["wait"]), "Synchronization Time(ms)": float(s["sync"]),
            "Idle Time(ms)": float(s["elapse"] - s["transit"] - s["wait"]),
            "Wait Time Ratio": _ratio(s["wait"], s["wait"] + s["transit"]),
            "Synchronization Time Ratio": _ratio(s["sync"], s["sync"] + s["transit"])}


def _ratio(part: float, whole: float) -> float:
    return round(float(part) / float(whole), 4) if abs(whole) > 1e-15 else 0


def _bandwidth(sizes: pd.DataFrame, per_op: bool) -> dict[str, dict[str, object]]:
    """Communication Bandwidth Info from transit packets by size (bytes -> `size` count, `sum` ns).

    All transit in the simulated cluster is SDMA over HCCS.
    """
    size_mb = sizes.index.to_numpy(np.float64) / 1e6
    count, time_ms = sizes["size"].to_numpy(np.int64), sizes["sum"].to_numpy(np.float64) / 1e6
    dist = {repr(float(m)): [int(n), float(t)]
            for m, n, t in zip(size_mb.tolist(), count.tolist(), time_ms.tolist(), strict=True)}
    mb, ms = float(size_mb @ count), float(time_ms.sum())
    large = float(count[size_mb > LARGE_PACKET_MB].sum() / count.sum()) if count.sum() else 0
    info = {}
    for transport in TRANSPORTS:
        moved = transport in ("HCCS", "SDMA")
        t_mb, t_ms = (mb, ms) if moved else (0, 0)
        by_size = dist if transport == "HCCS" else {}
        if per_op:
            info[transport] = {"Transit Size(MB)": t_mb, "Transit Time(ms)": t_ms,
                               "Bandwidth(GB/s)": round(t_mb / t_ms, 4) if t_ms else 0,
                               "Large Packet Ratio": large if transport == "HCCS" else 0,
                               "Size Distribution": by_size}
        else:
            info[transport] = {"Transit Time(ms)": t_ms, "Transit Size(MB)": t_mb,
                               "Size Distribution": by_size}
    return info


def _matrix_section(per_op: pd.DataFrame) -> dict[str, dict[str, object]]:
    """`{type}-{top1|middle|bottom1|total|bottom2|bottom3}@{group}` -> link -> op, by bandwidth."""
    section: dict[str, dict[str, object]] = {}
    for (comm, gh, key), rows in per_op.groupby(["comm", "gh", "key"], sort=False):
        rows = rows.sort_values("bw", ascending=False, kind="stable")
        entries = [{"Transport Type": "LOCAL" if r.link == "ON_CHIP" else r.link,
                    "Transit Size(MB)": float(r.mb), "Transit Time(ms)": float(r.ms),
                    "Bandwidth(GB/s)": float(r.bw), "Op Name": r.hcom} for r in rows.itertuples()]
        mb, ms = float(rows["mb"].sum()), float(rows["ms"].sum())
        picks = {"top1": entries[0], "middle": entries[len(entries) // 2], "bottom1": entries[-1],
                 "total": {"Transport Type": entries[0]["Transport Type"], "Transit Size(MB)": mb,
                           "Transit Time(ms)": ms, "Bandwidth(GB/s)": _ratio(mb, ms)}}
        picks.update({f"bottom{k}": entries[-k] for k in (2, 3) if len(entries) >= k})
        for pick, entry in picks.items():
            section.setdefault(f"{HCOM_OPS[comm][1]}-{pick}@{gh}", {})[key] = entry
    return section


def _clip(ops: pd.DataFrame, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of `ops` (local clock) cut to [lo, hi]."""
    return (np.clip(ops["t0"].to_numpy(np.int64), lo, hi),
            np.clip(ops["t1"].to_numpy(np.int64), lo, hi))


def _union(start: np.ndarray, end: np.ndarray) -> float:
    """Total length covered by the union of intervals [start, end)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    start, end = start[order], np.maximum.accumulate(end[order])
    covered = np.concatenate([[start[0]], end[:-1]])
    return float(np.sum(np.maximum(end - np.maximum(start, covered), 0)))
