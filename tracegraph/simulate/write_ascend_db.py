"""Write a simulated `Timeline` as MindSpore `*_ascend_ms` profiles exported as a database
(`export_type` db): per rank `profiler_info_{rank}.json`, `profiler_metadata.json` and
`ASCEND_PROFILER_OUTPUT/ascend_mindspore_profiler_{rank}.db`, and no text timeline.

The database holds the same tasks, HCCL ops, small tasks and CANN calls as `write_ascend`'s
trace_view.json (one `RankWriter`, so the same ids and times), and, when the job profiles memory,
memory_record.csv's rows as MEMORY_RECORD, in msprof's schema: every table and column is one the
real torch_npu export (schema 1.0.0) has, with the same declared types (the structure test
checks them). MindSpore's framework layer has no table in msprof's schema:
the steps are STEP_TIME's. As in real databases, nothing names the record an EVENT_WAIT waits on.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd

from tracegraph.schema import COMPUTE, MEMCPY, RECORD, WAIT
from tracegraph.simulate import write_ascend
from tracegraph.simulate.bundle_writer import Data
from tracegraph.simulate.timeline import Timeline
from tracegraph.simulate.write_ascend import INVALID, NO_NOTIFY, RankWriter

SCHEMA_VERSION = (1, 0, 0)
TABLES = {  # name -> column definitions, as the real torch_npu export declares them
    "STRING_IDS": "id INTEGER PRIMARY KEY,value TEXT",
    "META_DATA": "name TEXT,value TEXT",
    "RANK_DEVICE_MAP": "rankId INTEGER, deviceId INTEGER",
    "NPU_INFO": "id INTEGER,name TEXT",
    "SESSION_TIME_INFO": "startTimeNs INTEGER,endTimeNs INTEGER",
    "STEP_TIME": "id INTEGER, startNs INTEGER, endNs INTEGER",
    "ENUM_API_TYPE": "id INTEGER PRIMARY KEY,name TEXT",
    "ENUM_HCCL_DATA_TYPE": "id INTEGER PRIMARY KEY,name TEXT",
    "ENUM_HCCL_LINK_TYPE": "id INTEGER PRIMARY KEY,name TEXT",
    "ENUM_HCCL_TRANSPORT_TYPE": "id INTEGER PRIMARY KEY,name TEXT",
    "ENUM_HCCL_RDMA_TYPE": "id INTEGER PRIMARY KEY,name TEXT",
    "TASK": "startNs INTEGER,endNs INTEGER,deviceId INTEGER,connectionId INTEGER,"
            "globalTaskId INTEGER,globalPid INTEGER,taskType INTEGER,contextId INTEGER,"
            "streamId INTEGER,taskId INTEGER,modelId INTEGER",
    "COMPUTE_TASK_INFO": "name INTEGER,globalTaskId INTEGER PRIMARY KEY,blockDim INTEGER,"
                         "mixBlockDim INTEGER,taskType INTEGER,opType INTEGER,"
                         "inputFormats INTEGER,inputDataTypes INTEGER,inputShapes INTEGER,"
                         "outputFormats INTEGER,outputDataTypes INTEGER,outputShapes INTEGER,"
                         "attrInfo INTEGER",
    "COMMUNICATION_OP": "opName INTEGER,startNs INTEGER,endNs INTEGER,connectionId INTEGER,"
                        "groupName INTEGER,opId INTEGER PRIMARY KEY,relay INTEGER,retry INTEGER,"
                        "dataType INTEGER,algType INTEGER,count NUMERIC,opType INTEGER",
    "COMMUNICATION_TASK_INFO": "name INTEGER,globalTaskId INTEGER,taskType INTEGER,"
                               "planeId INTEGER,groupName INTEGER,notifyId INTEGER,"
                               "rdmaType INTEGER,srcRank INTEGER,dstRank INTEGER,"
                               "transportType INTEGER,size INTEGER,dataType INTEGER,"
                               "linkType INTEGER,opId INTEGER",
    "CANN_API": "startNs INTEGER,endNs INTEGER,type INTEGER,globalTid INTEGER,"
                "connectionId INTEGER PRIMARY KEY,name INTEGER",
}
MEMORY_TABLES = {  # written when the job profiles memory, as the real export declares them
    "MEMORY_RECORD": "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, "
                     "totalReserved INTEGER, totalActive INTEGER, streamPtr INTEGER, "
                     "deviceId INTEGER",
}
API_TYPES = {5000: "runtime", 5500: "hccl", 10000: "node", 15000: "model", 20000: "acl",
             50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"}
DATA_TYPES = {0: "INT8", 1: "INT16", 2: "INT32", 3: "FP16", 4: "FP32", 5: "INT64",
              6: "UINT64", 7: "UINT8", 8: "UINT16", 9: "UINT32", 10: "FP64", 11: "BFP16",
              12: "INT128", 65534: "N/A", 65535: "INVALID_TYPE"}
LINK_TYPES = {0: "ON_CHIP", 1: "HCCS", 2: "PCIE", 3: "ROCE", 4: "SIO", 5: "HCCS_SW",
              6: "STANDARD_ROCE", 7: "RESERVED", 65534: "N/A", 65535: "INVALID_TYPE"}
TRANSPORT_TYPES = {0: "SDMA", 1: "RDMA", 2: "LOCAL", 65534: "N/A", 65535: "INVALID_TYPE"}
RDMA_TYPES = {0: "RDMA_SEND_NOTIFY", 1: "RDMA_SEND_PAYLOAD", 2: "RDMA_PAYLOAD_PREPARE",
              3: "RDMA_PAYLOAD_CHECK", 4: "RDMA_PAYLOAD_ACK", 5: "RDMA_SEND_OP",
              65534: "N/A", 65535: "INVALID_TYPE"}
TASK_TYPES = {COMPUTE: "KERNEL_AICORE", WAIT: "EVENT_WAIT", RECORD: "EVENT_RECORD",
              MEMCPY: "MEMCPY_ASYNC"}
"""Device task kind -> TASK.taskType as the real export names it (HCCL subtasks: their FFTS+
type, `Notify Wait`, `Write Value`, `SDMA`)."""
NOTIFY_MAX = (1 << 63) - 1  # the u64 "no notify" sentinel, clamped to SQLite's i64 as msprof does


def iter_files(timeline: Timeline) -> Iterator[tuple[str, Data]]:
    """Every rank's profile folder as (relative path, data), in path order, one rank at a time."""
    return write_ascend.iter_files(timeline, DbRankWriter)


group_ids = write_ascend.group_ids
rank_roots = write_ascend.rank_roots


class DbRankWriter(RankWriter):
    """One rank's `*_ascend_ms` folder, exported as a database."""

    export_type = "db"

    def files(self) -> dict[str, Data]:
        out = f"{self.root}/ASCEND_PROFILER_OUTPUT"
        return {
            f"{self.root}/profiler_info_{self.rank}.json": self.profiler_info(),
            f"{self.root}/profiler_metadata.json": self.profiler_metadata(),
            f"{out}/ascend_mindspore_profiler_{self.rank}.db": self.database(),
        }

    def database(self) -> bytes:
        """The SQLite file's bytes (written in a private temporary folder, then read back)."""
        strings = _Strings()
        tasks, compute, sub_tasks = self._device(strings)
        rows = {"TASK": tasks, "COMPUTE_TASK_INFO": compute, "CANN_API": self._cann_api(strings),
                **self._communication(strings, sub_tasks), **self._facts()}
        tables = dict(TABLES)
        if self.job.timeline.memory is not None:
            rows["MEMORY_RECORD"] = self._memory_record(strings)
            tables |= MEMORY_TABLES
        rows["STRING_IDS"] = strings.rows()
        with tempfile.TemporaryDirectory(prefix="tracegraph-sim-") as folder:
            path = Path(folder) / "profile.db"
            with closing(sqlite3.connect(path)) as conn, conn:
                for name, columns in tables.items():
                    conn.execute(f"CREATE TABLE {name} ({columns})")
                    if rows.get(name):
                        marks = ",".join("?" * len(rows[name][0]))
                        conn.executemany(f"INSERT INTO {name} VALUES ({marks})", rows[name])
            return path.read_bytes()

    # --- tables ----------------------------------------------------------------------------

    def _device(self, strings: _Strings) -> tuple[list[tuple], list[tuple], pd.Series]:
        """TASK rows (globalTaskId: their order), COMPUTE_TASK_INFO rows of the kernels, and
        the globalTaskId of each HCCL small task's device row (by row of `tasks`)."""
        rows = self.device_tasks().reset_index(drop=True)
        sub = rows["sub"].to_numpy()
        kind = rows["name"].map({"EVENT_WAIT": WAIT, "EVENT_RECORD": RECORD,
                                 "MEMCPY_ASYNC": MEMCPY}).fillna(COMPUTE).where(sub < 0, "")
        task_type = kind.map(TASK_TYPES).where(sub < 0, rows["type"])
        tasks = list(zip(
            rows["ts"].astype(int), (rows["ts"] + rows["dur"]).astype(int),
            [self.device] * len(rows), rows["conn"].astype(int), rows.index.astype(int),
            [self.pid] * len(rows), [strings.id(t) for t in task_type],
            rows["subtask"].astype(int), rows["stream"].astype(int), rows["task"].astype(int),
            [INVALID] * len(rows), strict=True))
        none = strings.id("N/A")
        kernels = rows[kind == COMPUTE]
        compute = [(strings.id(name), int(i), 20, 0, strings.id("AI_CORE"),
                    strings.id(name.rsplit("_", 1)[-1]), *[none] * 7)
                   for i, name in zip(kernels.index, kernels["name"], strict=True)]
        return tasks, compute, pd.Series(rows.index[sub >= 0], index=sub[sub >= 0])

    def _cann_api(self, strings: _Strings) -> list[tuple]:
        calls = self.cann_calls()
        types = {name: code for code, name in API_TYPES.items()}
        tid = (self.pid << 32) | self.launch_tid
        return [(int(ts), int(ts + dur), types[level], tid, int(conn),
                 strings.id(name.partition("@")[2]))
                for name, ts, dur, level, conn in zip(
                    calls["name"], calls["ts"], calls["dur"], calls["level"], calls["conn"],
                    strict=True)]

    def _communication(self, strings: _Strings, sub_tasks: pd.Series) -> dict[str, list[tuple]]:
        """COMMUNICATION_OP (opId from 1, in launch order) and COMMUNICATION_TASK_INFO rows."""
        comm, tasks = self.comm, self.tasks
        data = {name: code for code, name in DATA_TYPES.items()}
        dtype = pd.Series([d if d in data else "FP32" for d in comm["dtype"]], index=comm.index)
        op_id = pd.Series(np.arange(1, len(comm) + 1), index=comm.index)
        names = {g: v.comm_name for g, v in self.job.groups.items()}
        ops = [(strings.id(hcom), int(t0), int(t1), int(conn), strings.id(names[group]),
                int(op_id[i]), 0, 0, data[dtype[i]], strings.id("MESH-RING"),
                int(size // write_ascend.DTYPE_BYTES.get(dtype[i], 4)),
                strings.id(hcom.split("__")[0] + "_"))
               for i, hcom, t0, t1, conn, group, size in zip(
                   comm.index, comm["hcom"], comm["t0"], comm["t1"], comm["conn"],
                   comm["group"], comm["bytes"], strict=True)]
        links = {name: code for code, name in LINK_TYPES.items()}
        reduced = np.where(tasks["name"] == "Reduce_Inline",
                           tasks["op"].map(dtype).map(data).fillna(65535), 65535)
        small = [(strings.id(hcom), int(sub_tasks[i]), strings.id(name), int(plane),
                  strings.id(names[group]), NOTIFY_MAX if note == NO_NOTIFY else int(note),
                  65535, int(me), int(peer), 2 if name == "Notify_Wait" else 0, int(size),
                  int(typed), links[link], int(op_id[op]))
                 for i, hcom, name, plane, group, note, me, peer, size, typed, link, op in zip(
                     tasks.index, tasks["hcom"], tasks["name"], tasks["plane"], tasks["group"],
                     tasks["notify"], tasks["me"], tasks["peer_local"], tasks["size"], reduced,
                     tasks["link"], tasks["op"], strict=True)]
        return {"COMMUNICATION_OP": ops, "COMMUNICATION_TASK_INFO": small}

    def _memory_record(self, strings: _Strings) -> list[tuple]:
        """MEMORY_RECORD: memory_record.csv's rows (`memory_record`) in bytes and ns, the
        component a STRING_IDS id, the device its id; no stream pointer (the CSV has none)."""
        samples = self.memory_samples()
        return [(strings.id(component), ts, allocated, reserved, allocated, None, self.device)
                for ts, allocated, reserved in zip(
                    samples["ts"].tolist(), samples["allocated"].tolist(),
                    samples["reserved"].tolist(), strict=True)
                for component in write_ascend.MEMORY_COMPONENTS]

    def _facts(self) -> dict[str, list[tuple]]:
        """META_DATA, RANK_DEVICE_MAP, STEP_TIME, session, NPU and the ENUM tables."""
        start, end = (t + self.shift for t in self.job.bounds[self.rank])
        major, minor, micro = SCHEMA_VERSION
        return {
            "META_DATA": [("SCHEMA_VERSION_MICRO", str(micro)),
                          ("SCHEMA_VERSION_MINOR", str(minor)),
                          ("SCHEMA_VERSION_MAJOR", str(major)),
                          ("SCHEMA_VERSION", f"{major}.{minor}.{micro}"),
                          ("ENV_VARIABLES", json.dumps({"ASCEND_GLOBAL_LOG_LEVEL": ""}))],
            "RANK_DEVICE_MAP": [(self.rank, self.device)],
            "NPU_INFO": [(self.device, "Ascend910B")],
            "SESSION_TIME_INFO": [(int(start), int(end))],
            "STEP_TIME": [(s.step, s.start_ns + self.shift, s.end_ns + self.shift)
                          for s in self.steps],
            "ENUM_API_TYPE": sorted(API_TYPES.items()),
            "ENUM_HCCL_DATA_TYPE": sorted(DATA_TYPES.items()),
            "ENUM_HCCL_LINK_TYPE": sorted(LINK_TYPES.items()),
            "ENUM_HCCL_TRANSPORT_TYPE": sorted(TRANSPORT_TYPES.items()),
            "ENUM_HCCL_RDMA_TYPE": sorted(RDMA_TYPES.items()),
        }


class _Strings:
    """STRING_IDS: each distinct string's id, in order of first use."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def id(self, value: str) -> int:
        return self._ids.setdefault(str(value), len(self._ids))

    def rows(self) -> list[tuple[int, str]]:
        return [(i, value) for value, i in self._ids.items()]

