"""Write a simulated `Timeline` as Nsight Systems SQLite exports of an NCCL job: one export per
node (nsys wrapping the node's launcher), each profiled rank of the node a process in it.

Tables and columns are those of the real exports (nsys 2022.1, schema 2.9.1; a subset of their
columns): StringIds, CUPTI_ACTIVITY_KIND_RUNTIME / KERNEL / MEMCPY / SYNCHRONIZATION /
CUDA_EVENT, NVTX_EVENTS, ThreadNames, PROCESSES, TARGET_INFO_GPU, TARGET_INFO_SESSION_START_TIME,
ANALYSIS_DETAILS and EXPORT_META_DATA. A rank's host calls, kernels, copies and waits are the
Kineto writer's (`write_kineto.RankTrace`: same correlation ids, times and kernel names), so both
formats describe one schedule; what nsys records differently is written as nsys records it:
`cudaEventRecord` as a CUDA_EVENT record (event id, stream, correlation id), each stream wait as
a SYNCHRONIZATION row (`syncType` 2, CUPTI's STREAM_WAIT_EVENT) naming the event, NCCL's own NVTX
ranges (domain NCCL) with their payloads as JSON text (`NCCL communicator ID`, `Message size
[bytes]`, `Peer rank`: a rank's place in the communicator): `ncclCommInitRank` of the world
communicator and `ncclCommSplit` of each group, `ncclAllReduce` … around each collective's
launch, `ncclGroupStart`, `ncclSend`, `ncclRecv`, `ncclGroupEnd` around a batched P2P or an
all-to-all; `ProfilerStep#N` and the framework's forward / backward ranges as NVTX ranges of the
default domain. Times are ns since the node's capture began, TARGET_INFO_SESSION_START_TIME its
wall-clock start.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from tracegraph.schema import COLLECTIVE, COMPUTE, MEMCPY, P2P, RECORD, WAIT
from tracegraph.simulate.bundle_writer import Data
from tracegraph.simulate.timeline import Timeline
from tracegraph.simulate.write_kineto import Job, RankTrace, cuda_kernel, sync_span

RANKS_PER_NODE = 8
VM = 1 << 56  # globalVid of the profiled machine: globalPid = VM | pid << 24
PRODUCT = "2022.1.1.61"
SCHEMA = "2.9.1"
NCCL_DOMAIN = 1
WORLD = "\0world"  # the world communicator's key for `comm_id` (no group id is)
STREAM_WAIT_EVENT = 2  # CUpti_ActivitySynchronizationType
PUSH_POP, DOMAIN_CREATE = 59, 75  # NVTX event types
SESSION_LEAD_NS = 5_000_000  # the capture begins this long before a node's first event
_CALLS = {COMPUTE: "cudaLaunchKernel_v7000", MEMCPY: "cudaMemcpyAsync_v3020",
          RECORD: "cudaEventRecord_v3020", WAIT: "cudaStreamWaitEvent_v3020",
          COLLECTIVE: "cudaLaunchKernelExC_v11060", P2P: "cudaLaunchKernelExC_v11060"}
_API = {"allreduce": "ncclAllReduce", "reducescatter": "ncclReduceScatter",
        "allgather": "ncclAllGather", "broadcast": "ncclBroadcast", "reduce": "ncclReduce",
        "gather": "ncclGather", "scatter": "ncclScatter", "barrier": "ncclAllReduce",
        "send": "ncclSend", "recv": "ncclRecv"}
_COPY = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
_MEMORY = {"Pageable": 1, "Pinned": 2, "Device": 3}
_GPU = ("NVIDIA H100 80GB HBM3", 85017755648, 132)
_TABLES = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "EXPORT_META_DATA": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "ANALYSIS_DETAILS": "globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
                        "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, "
                       "totalMemory INTEGER, smCount INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                   "eventClass INTEGER NOT NULL, globalTid INTEGER, "
                                   "correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                  "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                                  "streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, demangledName INTEGER NOT NULL, "
                                  "shortName INTEGER NOT NULL, gridX INTEGER NOT NULL, "
                                  "blockX INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                  "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                                  "streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, bytes INTEGER NOT NULL, "
                                  "copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
                                           "deviceId INTEGER NOT NULL, "
                                           "contextId INTEGER NOT NULL, "
                                           "streamId INTEGER NOT NULL, correlationId INTEGER, "
                                           "globalPid INTEGER, syncType INTEGER NOT NULL, "
                                           "eventId INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_CUDA_EVENT": "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                                      "streamId INTEGER NOT NULL, correlationId INTEGER, "
                                      "globalPid INTEGER, eventId INTEGER NOT NULL",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
                   "text TEXT, globalTid INTEGER, domainId INTEGER, jsonText TEXT",
}


def iter_files(timeline: Timeline) -> Iterator[tuple[str, Data]]:
    """Every node's export as (file name, bytes), in name order."""
    job = Job(timeline)
    for name, ranks in sorted((f"node{n}.sqlite", r) for n, r in _nodes(timeline).items()):
        yield name, _NodeExport(job, ranks).data()


def group_ids(timeline: Timeline) -> dict[str, str]:
    """Timeline group id -> its NCCL communicator id as the reader names it (hex)."""
    return {gid: f"0x{comm_id(gid):x}" for gid in timeline.groups}


def rank_roots(timeline: Timeline) -> dict[int, str]:
    """Rank -> its profile: the node's export, and its process when the export holds several."""
    job = Job(timeline)
    roots = {}
    for node, ranks in _nodes(timeline).items():
        for rank in ranks:
            pid = RankTrace(job, rank).pid
            roots[rank] = f"node{node}.sqlite" + (f"#pid{pid}" if len(ranks) > 1 else "")
    return roots


def comm_id(group: str) -> int:
    """A stable 64-bit communicator id (NCCL's commHash) for a group: the same on every member."""
    return int.from_bytes(hashlib.blake2b(group.encode(), digest_size=8).digest(), "little")


def _nodes(timeline: Timeline) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    for rank in timeline.ranks:
        nodes.setdefault(rank // RANKS_PER_NODE, []).append(rank)
    return nodes


class _Strings:
    """StringIds: each distinct string once."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, value: str) -> int:
        return self.ids.setdefault(value, len(self.ids))


class _NodeExport:
    """One node's export: its ranks' processes on one capture clock."""

    def __init__(self, job: Job, ranks: list[int]):
        self.job = job
        self.traces = [RankTrace(job, rank) for rank in ranks]
        self.session = min(t.start for t in self.traces) - SESSION_LEAD_NS
        self.strings = _Strings()
        self.rows: dict[str, list[tuple]] = {table: [] for table in _TABLES}

    def data(self) -> bytes:
        for trace in self.traces:
            _RankRows(self, trace).add()
        stop = max(t.end for t in self.traces) - self.session + 1_000_000
        self.rows["TARGET_INFO_SESSION_START_TIME"].append((self.session, "", ""))
        self.rows["ANALYSIS_DETAILS"].append((VM, stop, 0, stop))
        self.rows["EXPORT_META_DATA"] += [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", PRODUCT), ("EXPORT_SCHEMA_VERSION", SCHEMA),
            ("EXPORT_SCHEMA_VERSION_MAJOR", SCHEMA.split(".")[0]),
            ("EXPORT_SCHEMA_VERSION_MINOR", SCHEMA.split(".")[1])]
        self.rows["StringIds"] = [(i, s) for s, i in self.strings.ids.items()]
        return _sqlite(self.rows)


class _RankRows:
    """One rank's rows in its node's export."""

    def __init__(self, export: _NodeExport, trace: RankTrace):
        self.export, self.trace = export, trace
        self.pid = trace.pid
        self.gpid = VM | trace.pid << 24
        self.gtid = self.gpid | trace.pid  # the main thread
        self.session = export.session

    @cached_property
    def ops(self) -> pd.DataFrame:
        return self.trace.ops

    def add(self) -> None:
        rows, s = self.export.rows, self.export.strings
        rows["PROCESSES"].append((self.gpid, self.pid, "python3"))
        rows["ThreadNames"].append((s.id("python3"), 10, self.gtid))
        gpu, memory, sms = _GPU
        if self.trace.device not in {r[1] for r in rows["TARGET_INFO_GPU"]}:
            rows["TARGET_INFO_GPU"].append((0, self.trace.device, gpu, memory, sms))
        self._runtime()
        self._device()
        self._nvtx()

    def _at(self, ns: object) -> np.ndarray:
        return np.asarray(ns, dtype=np.int64) - self.session

    def _runtime(self) -> None:
        ops, s = self.ops, self.export.strings
        start, dur = self._at(ops["lt"]), ops["after"].to_numpy(np.int64) // 2
        names = [s.id(_CALLS[k]) for k in ops["kind"]]
        self.export.rows["CUPTI_ACTIVITY_KIND_RUNTIME"] += zip(
            start.tolist(), (start + dur).tolist(), [0] * len(ops), [self.gtid] * len(ops),
            ops["corr"].tolist(), names, [0] * len(ops), strict=True)

    def _device(self) -> None:
        ops, s, rows = self.ops, self.export.strings, self.export.rows
        device = self.trace.device
        kernels = ops[ops["kind"].isin((COMPUTE, COLLECTIVE, P2P))]
        names = [self._kernel_name(r) for r in kernels.itertuples()]
        start = self._at(kernels["t0"])
        rows["CUPTI_ACTIVITY_KIND_KERNEL"] += zip(
            start.tolist(), (start + kernels["dur_ns"].to_numpy(np.int64)).tolist(),
            [device] * len(kernels), [1] * len(kernels), kernels["stream"].tolist(),
            kernels["corr"].tolist(), [self.gpid] * len(kernels), [s.id(n) for n in names],
            [s.id(n.split("(")[0].split("<")[0].split(" ")[-1]) for n in names],
            [132] * len(kernels), [384] * len(kernels), strict=True)
        copies = ops[ops["kind"] == MEMCPY]
        start = self._at(copies["t0"])
        kinds = [_copy_kinds(n) for n in copies["name"]]
        rows["CUPTI_ACTIVITY_KIND_MEMCPY"] += [
            (a, a + d, device, 1, stream, corr, self.gpid, size, *kind)
            for a, d, stream, corr, size, kind in zip(
                start.tolist(), copies["dur_ns"].tolist(), copies["stream"].tolist(),
                copies["corr"].tolist(), copies["bytes"].tolist(), kinds, strict=True)]
        records = ops[ops["kind"] == RECORD]
        rows["CUPTI_ACTIVITY_KIND_CUDA_EVENT"] += [
            (device, 1, stream, corr, self.gpid, event) for stream, corr, event in zip(
                records["stream"].tolist(), records["corr"].tolist(),
                records["event_id"].tolist(), strict=True)]
        waits = ops[ops["kind"] == WAIT]
        begin, dur = sync_span(waits)
        rows["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"] += [
            (a, a + d, device, 1, stream, corr, self.gpid, STREAM_WAIT_EVENT, event)
            for a, d, stream, corr, event in zip(
                self._at(begin).tolist(), dur.tolist(), waits["stream"].tolist(),
                waits["corr"].tolist(), waits["event_id"].tolist(), strict=True)]

    def _kernel_name(self, op) -> str:
        if op.kind == COMPUTE:
            return op.name if self.trace.job.cuda else cuda_kernel(op.name)[1]
        return RankTrace.nccl_kernel_name(op.comm, op.dtype)

    # --- NVTX ----------------------------------------------------------------------------------
    def _range(self, start: int, end: int, text: str, domain: int = 0,
               payload: dict | None = None) -> None:
        self.export.rows["NVTX_EVENTS"].append((
            start - self.session, end - self.session, PUSH_POP, text, self.gtid, domain,
            json.dumps(payload, separators=(",", ":")) if payload else None))

    def _nvtx(self) -> None:
        trace = self.trace
        first = trace.start - SESSION_LEAD_NS // 2
        self.export.rows["NVTX_EVENTS"].append((first - 1000 - self.session, None, DOMAIN_CREATE,
                                                "NCCL", self.gtid, NCCL_DOMAIN, None))
        world = self.trace.job.world
        self._range(first, first + 500_000, "ncclCommInitRank", NCCL_DOMAIN,
                    {"NCCL communicator ID": comm_id(WORLD), "No. of ranks": world,
                     "Rank": trace.rank, "CUDA device": trace.device})
        for n, (gid, pg) in enumerate(sorted(trace.job.pgs.items())):
            if trace.rank in pg.ranks:
                at = first + 600_000 + 10_000 * n
                self._range(at, at + 5_000, "ncclCommSplit", NCCL_DOMAIN, {
                    "NCCL communicator ID": comm_id(gid),
                    "Parent NCCL communicator ID": comm_id(WORLD),
                    "No. of ranks": len(pg.ranks), "Rank": pg.ranks.index(trace.rank),
                    "CUDA device": trace.device, "Color": pg.ranks[0],
                    "Key": pg.ranks.index(trace.rank)})
        for span in trace.steps:
            self._range(span.start_ns + trace.shift, span.end_ns + trace.shift,
                        f"ProfilerStep#{span.step}")
        self._framework_ranges()
        for op in self.ops[self.ops["kind"].isin((COLLECTIVE, P2P))].itertuples():
            self._nccl_ranges(op)

    def _framework_ranges(self) -> None:
        ranges = self.trace.job.timeline.ranges
        if ranges is None:
            return
        mine = ranges[ranges["rank"] == self.trace.rank]
        for phase, start, end in zip(mine["phase"], mine["host_start_ns"], mine["host_end_ns"],
                                     strict=True):
            name = {"F": "forward_step", "B": "backward_step"}[phase]
            self._range(int(start) + self.trace.shift, int(end) + self.trace.shift, name)

    def _nccl_ranges(self, op) -> None:
        """NCCL's API ranges around one comm op's launch at `op.lt` (inside its host room)."""
        lt, b, a = int(op.lt), int(op.before), int(op.after)
        pg = self.trace.job.pgs[op.group]
        comm = comm_id(op.group)
        if op.comm in ("batch_send_recv", "alltoall"):
            peers = ([pg.ranks.index(int(op.peer))] if op.comm == "batch_send_recv" else
                     [i for i, r in enumerate(pg.ranks) if r != self.trace.rank])
            share = int(op.bytes) // max(len(peers), 1)
            self._range(lt - b * 19 // 20, lt - b * 9 // 10, "ncclGroupStart", NCCL_DOMAIN)
            calls = [(api, peer) for peer in peers for api in ("ncclSend", "ncclRecv")]
            step = max(b * 7 // 10 // max(len(calls), 1), 2)
            for k, (api, peer) in enumerate(calls):
                at = lt - b * 9 // 10 + k * step
                self._range(at, at + step // 2, api, NCCL_DOMAIN, {
                    "NCCL communicator ID": comm, "Message size [bytes]": share,
                    "Peer rank": peer})
            self._range(lt - b // 10, lt + a * 9 // 10, "ncclGroupEnd", NCCL_DOMAIN)
            return
        payload = {"NCCL communicator ID": comm, "Message size [bytes]": int(op.bytes)}
        if op.comm in ("send", "recv"):
            payload["Peer rank"] = pg.ranks.index(int(op.peer))
        self._range(lt - b // 2, lt + a * 7 // 10, _API[op.comm], NCCL_DOMAIN, payload)


def _copy_kinds(name: str) -> tuple[int, int, int]:
    """(copyKind, srcKind, dstKind) of a copy named as CUPTI names them, else device to device."""
    parts = name.replace("(", " ").replace(")", " ").split()
    if len(parts) >= 5 and parts[0] == "Memcpy" and parts[1] in _COPY:
        return _COPY[parts[1]], _MEMORY.get(parts[2], 3), _MEMORY.get(parts[4], 3)
    return _COPY["DtoD"], _MEMORY["Device"], _MEMORY["Device"]


def _sqlite(rows: dict[str, list[tuple]]) -> bytes:
    """The tables as an SQLite file's bytes (written in a private temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="tracegraph-nsys-") as folder:
        path = Path(folder) / "export.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode = OFF")
            for table, columns in _TABLES.items():
                conn.execute(f"CREATE TABLE {table} ({columns})")
                if rows[table]:
                    marks = ", ".join("?" * len(rows[table][0]))
                    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows[table])
        conn.close()
        return path.read_bytes()
