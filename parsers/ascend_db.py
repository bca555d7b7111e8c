"""Ascend profiler databases -> EVENTS: torch_npu's `ascend_pytorch_profiler_{rank}.db`,
MindSpore's `ascend_mindspore_profiler[_{rank}].db` and msprof's `msprof_*.db`.

One schema family, msprof's: times in ns on the rank's clock, every string an id into
STRING_IDS. Device tasks are TASK (names from COMPUTE_TASK_INFO), HCCL ops COMMUNICATION_OP with
their comm name (the group is its `double_hash`, as the text files write it), their small tasks
COMMUNICATION_TASK_INFO joined to TASK for times, host calls CANN_API and PYTORCH_API, steps
PYTORCH_API's ProfilerStep#N or STEP_TIME; the memory tables give the memory rows
(`parsers.ascend_memory`, as the memory CSVs do). The rows are built as the trace_view.json reader
builds them (`parsers.ascend_rows`), so both give the same events. The database is opened read
only and never written beside (`parsers.sqlite_file`). Which tables and columns are read is
checked first: a database lacking one gets one line naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

from parsers import ascend_layout, ascend_memory, sqlite_file
from parsers.ascend_comm import load_side, resolve_rank, stated_metadata
from parsers.ascend_rows import (
    Context,
    Rows,
    Steps,
    attach_device_tasks,
    comm_lane,
    concat,
    device_kinds,
    device_lane,
    groups,
    hccl_names,
    local_ranks,
    meta,
    notify_ids,
    op_bytes,
    op_streams,
    set_peers,
    stepped,
    thread_lane,
)
from parsers.base import Format, ParsedRank, RankFiles, Reader, TraceError
from parsers.classify import comm_type, double_hash
from parsers.sqlite_file import Database
from tracegraph.schema import COMM, COMM_TASK, HOST, MARKER, NO_INT, THREAD

KNOWN_MAJOR = 1  # META_DATA SCHEMA_VERSION_MAJOR this reader was written against
REQUIRED = {"STRING_IDS": ("id", "value"),
            "TASK": ("startNs", "endNs", "connectionId", "globalTaskId", "taskType", "streamId")}
OPTIONAL = {  # read when present; each must then have these columns
    "COMPUTE_TASK_INFO": ("name", "globalTaskId"),
    "COMMUNICATION_OP": ("opName", "startNs", "endNs", "connectionId", "groupName", "opId"),
    "COMMUNICATION_TASK_INFO": ("globalTaskId", "taskType", "planeId", "groupName", "notifyId",
                                "srcRank", "dstRank", "size", "opId"),
    "CANN_API": ("startNs", "endNs", "type", "globalTid", "connectionId", "name"),
    "PYTORCH_API": ("startNs", "endNs", "globalTid", "name", "type"),
    "MSTX_EVENTS": ("startNs", "endNs", "message", "globalTid"),
    "STEP_TIME": ("id", "startNs", "endNs"),
    "RANK_DEVICE_MAP": ("rankId", "deviceId"),
    "META_DATA": ("name", "value"),
    "ENUM_API_TYPE": ("id", "name"),
    "ENUM_HCCL_DATA_TYPE": ("id", "name"),
    "MEMCPY_INFO": ("globalTaskId", "size"),
}
API_LEVELS = {20000: "acl", 15000: "model", 10000: "node", 5500: "communication",
              5000: "runtime", 50001: "op", 50002: "queue", 50003: "trace", 50004: "mstx"}
"""ENUM_API_TYPE as msprof documents it, for a database without the table."""
API_PREFIX = {"acl": "AscendCL", "runtime": "Runtime", "node": "Node", "model": "Model",
              "hccl": "Hccl", "communication": "Communication"}
"""CANN API level -> the prefix trace_view.json gives its calls (`AscendCL@aclrtRecordEvent`)."""
LOW_32 = 0xFFFFFFFF  # globalTid: pid << 32 | tid
QUERY_ROWS = 1 << 16  # rows fetched from SQLite at once


# --- opening ---------------------------------------------------------------------------------


@contextmanager
def opened(member: str, read: Reader) -> Iterator[Database]:
    """The database `member`, checked and open read only (see `parsers.sqlite_file`)."""
    with sqlite_file.opened(member, read, _read_table) as db:
        _check_schema(db)
        yield db


def _read_table(name: str) -> bool:
    return name in REQUIRED or name in OPTIONAL or name in ascend_memory.DB_READ


def _check_schema(db: Database) -> None:
    """TraceError naming the first required table or read column the database lacks."""
    db.stated = db.values("META_DATA")
    db.version = db.stated.get("SCHEMA_VERSION", "")
    seen = f" (schema {db.version})" if db.version else " (no SCHEMA_VERSION in META_DATA)"
    for name in REQUIRED:
        if name not in db.tables:
            raise TraceError(f"{db.where}: no table {name}: not an Ascend profiler database"
                             f"{seen}")
    for name, columns in (REQUIRED | OPTIONAL).items():
        missing = [c for c in columns if name in db.tables and c not in db.tables[name]]
        if missing:
            raise TraceError(f"{db.where}: table {name} has no column {missing[0]}{seen}")


# --- parsing ---------------------------------------------------------------------------------


def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One rank's profiler database (with the JSON / CSV files beside it) as normalized events,
    groups and rank metadata."""
    member = files.files.get("db") or files.files["trace"]
    warnings: list[str] = []
    side = load_side(files, read, warnings)
    with opened(member, read) as db:
        stated_metadata(side, db.stated, member, warnings)
        _check_version(db, warnings)
        rank_row = _rank_device(db)
        info = side.info if "rank_id" in side.info else {**side.info, "rank_id": rank_row[0]}
        rank = resolve_rank(files, info, warnings, "RANK_DEVICE_MAP")
        ctx = Context(rank, member, side, warnings)
        rows = Rows()
        ops = _frame(db, ctx, rows)
        device = rank_row[1] if rank_row[1] is not None else _device_id(db, warnings)
        memory = ascend_memory.database_memory(db, rank, warnings)
    if memory is None:  # a text export beside the database may hold the memory CSVs
        memory = ascend_memory.memory(files, read, rank, warnings)
    found = meta(files, side, device, {"db_schema": db.version} if db.version else None)
    if not side.ops:
        found["comm_times"] = _comm_times(ops)
    names = dict(zip(ops["group"], ops["comm_name"], strict=True))
    return ParsedRank(rank=rank, events=rows.table(rank),
                      groups=groups(side, rows.grouped(), names),
                      meta=found, warnings=warnings, memory=memory)


def _check_version(db: Database, warnings: list[str]) -> None:
    major = db.version.partition(".")[0]
    if major.isdigit() and int(major) > KNOWN_MAJOR:
        warnings.append(f"{db.where}: schema {db.version} is newer than the {KNOWN_MAJOR}.x this "
                        "reader knows; read the tables and columns it names")


def _frame(db: Database, ctx: Context, rows: Rows) -> pd.DataFrame:
    """Every row of the database as events, into `rows`, each table's let go once taken;
    the HCCL ops (with their comm names)."""
    framework = _framework_frame(db)
    ctx.steps = Steps.of(framework)
    rows.add(stepped(framework, ctx.steps))
    del framework
    cann = _cann_frame(db, ctx)
    ctx.steps.link(cann)
    rows.add(stepped(cann, ctx.steps))
    del cann
    ops = _op_frame(db)
    device = _device_frame(db, set(ops["correlation"]))
    op_streams(ops, device)
    ops["step"] = ctx.steps.device(ops["start_ns"].to_numpy(), ops["correlation"].to_numpy())
    tasks = _task_frame(db, ops)
    attach_device_tasks(device, ops)
    set_peers(ops, tasks, ctx)
    rows.add(stepped(device, ctx.steps))
    del device
    rows.add(stepped(ops.drop(columns=["op_id", "comm_name", "wait_ns"]), ctx.steps))
    rows.add(stepped(tasks.drop(columns="op"), ctx.steps))
    return ops


def _rank_device(db: Database) -> tuple[int | None, int | None]:
    """(rank, device) of RANK_DEVICE_MAP's first row; None for what it does not state."""
    if "RANK_DEVICE_MAP" not in db.tables:
        return None, None
    rows = db.query("SELECT rankId, deviceId FROM RANK_DEVICE_MAP LIMIT 1")
    if rows.empty:
        return None, None
    rank, device = (None if pd.isna(v) or int(v) < 0 else int(v) for v in rows.iloc[0])
    return rank, device


def _device_id(db: Database, warnings: list[str]) -> int | None:
    """The device TASK's rows ran on (the most frequent one, with a warning if several)."""
    rows = db.query("SELECT deviceId, COUNT(*) AS n FROM TASK GROUP BY deviceId "
                    "ORDER BY n DESC") if db.has("TASK", "deviceId") else pd.DataFrame()
    if rows.empty:
        return None
    if len(rows) > 1:
        warnings.append(f"{db.where}: tasks of {len(rows)} devices; read as one rank "
                        f"(device {int(rows['deviceId'].iloc[0])} has the most)")
    return int(rows["deviceId"].iloc[0])


def _framework_frame(db: Database) -> pd.DataFrame:
    """PYTORCH_API (host ops; ProfilerStep#N and mstx as markers), MSTX_EVENTS markers, and
    STEP_TIME's steps that no ProfilerStep#N row names."""
    parts = []
    if "PYTORCH_API" in db.tables:
        rows = db.query(
            "SELECT CAST(p.startNs AS INTEGER) AS start_ns, CAST(p.endNs AS INTEGER) AS end_ns, "
            "p.globalTid AS tid, COALESCE(s.value, '') AS name, p.type AS type "
            "FROM PYTORCH_API p LEFT JOIN STRING_IDS s ON s.id = p.name",
            batch=QUERY_ROWS)
        levels = _api_levels(db, rows["type"])
        marker = rows["name"].str.startswith("ProfilerStep#") | (levels == "mstx")
        parts.append(_host_rows(rows).assign(kind=np.where(marker, MARKER, HOST)))
    if "MSTX_EVENTS" in db.tables:
        rows = db.query("SELECT m.startNs AS start_ns, m.endNs AS end_ns, m.globalTid AS tid, "
                        "COALESCE(s.value, '') AS name FROM MSTX_EVENTS m "
                        "LEFT JOIN STRING_IDS s ON s.id = m.message", batch=QUERY_ROWS)
        parts.append(_host_rows(rows).assign(kind=MARKER))
    frame = concat(parts)
    return concat([frame, _step_time_frame(db, frame)])


def _step_time_frame(db: Database, framework: pd.DataFrame) -> pd.DataFrame:
    """STEP_TIME rows as host `ProfilerStep#N` markers, for the steps the framework rows lack."""
    if "STEP_TIME" not in db.tables:
        return pd.DataFrame()
    rows = db.query("SELECT id, CAST(startNs AS INTEGER) AS start_ns, "
                    "CAST(endNs AS INTEGER) AS end_ns FROM STEP_TIME")
    names = "ProfilerStep#" + rows["id"].astype(str)
    rows = rows[~names.isin(framework["name"])]
    return pd.DataFrame({"name": names[rows.index], "start_ns": rows["start_ns"],
                         "dur_ns": rows["end_ns"] - rows["start_ns"], "kind": MARKER,
                         "lane": "steps", "lane_kind": THREAD})


def _host_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """start_ns / end_ns / tid (a globalTid) / name rows as host rows on their thread's lane."""
    frame = pd.DataFrame({"name": rows["name"].astype(str), "start_ns": _ints(rows["start_ns"]),
                          "dur_ns": np.maximum(_ints(rows["end_ns"]) - _ints(rows["start_ns"]), 0),
                          "tid": _ints(rows["tid"]) & LOW_32})
    thread_lane(frame)
    return frame.drop(columns="tid")


def _api_levels(db: Database, types: pd.Series) -> pd.Series:
    """CANN / framework API type ids -> their level ("acl", "node", "op", "mstx", ...)."""
    known = dict(API_LEVELS)
    if "ENUM_API_TYPE" in db.tables:
        enum = db.query("SELECT id, name FROM ENUM_API_TYPE")
        known |= dict(zip(enum["id"].astype(int), enum["name"].astype(str), strict=True))
    return pd.Series(_ints(types), index=types.index).map(known).fillna("")


def _cann_frame(db: Database, ctx: Context) -> pd.DataFrame:
    """CANN_API calls as host rows named as trace_view.json names them (`AscendCL@...`)."""
    if "CANN_API" not in db.tables:
        return pd.DataFrame()
    rows = db.query("SELECT c.startNs AS start_ns, c.endNs AS end_ns, c.globalTid AS tid, "
                    "c.connectionId AS correlation, c.type AS type, "
                    "COALESCE(s.value, '') AS api FROM CANN_API c "
                    "LEFT JOIN STRING_IDS s ON s.id = c.name", batch=QUERY_ROWS)
    levels = _api_levels(db, rows["type"])
    prefix = levels.map(API_PREFIX).fillna(levels.str.capitalize())
    frame = _host_rows(rows.assign(name=prefix + "@" + rows["api"]))
    frame["kind"] = HOST
    frame["correlation"] = _ints(rows["correlation"])
    frame["step"] = ctx.steps.host(frame["start_ns"].to_numpy())
    return frame


def _device_frame(db: Database, op_conns: set[int]) -> pd.DataFrame:
    """TASK rows: named by COMPUTE_TASK_INFO where it names them, else by their task type."""
    kernel, joins, copied = "NULL", "", "NULL"
    if "COMPUTE_TASK_INFO" in db.tables:
        kernel = "k.value"
        joins += (" LEFT JOIN COMPUTE_TASK_INFO c ON c.globalTaskId = t.globalTaskId"
                  " LEFT JOIN STRING_IDS k ON k.id = c.name")
    if "MEMCPY_INFO" in db.tables:
        copied = "m.size"
        joins += " LEFT JOIN MEMCPY_INFO m ON m.globalTaskId = t.globalTaskId"
    rows = db.query(
        f"SELECT t.startNs AS start_ns, t.endNs AS end_ns, t.streamId AS stream, "
        f"t.connectionId AS correlation, COALESCE(y.value, '') AS task_type, "
        f"COALESCE({kernel}, y.value, '') AS name, {copied} AS bytes "
        f"FROM TASK t LEFT JOIN STRING_IDS y ON y.id = t.taskType{joins}",
        batch=QUERY_ROWS)
    frame = pd.DataFrame({
        "name": rows["name"].astype(str), "start_ns": _ints(rows["start_ns"]),
        "dur_ns": np.maximum(_ints(rows["end_ns"]) - _ints(rows["start_ns"]), 0),
        "stream": _ints(rows["stream"]), "task_type": rows["task_type"].astype(str),
        "correlation": _ints(rows["correlation"]), "bytes": _ints(rows["bytes"])})
    device_lane(frame)
    frame["kind"] = device_kinds(frame["name"], frame["task_type"],
                                 frame["correlation"].to_numpy(), op_conns)
    return frame


def _op_frame(db: Database) -> pd.DataFrame:
    """COMMUNICATION_OP rows: HCCL ops with their group (double_hash of the comm name), type,
    instance number and bytes; `comm_name`, `op_id` and `wait_ns` kept beside."""
    if "COMMUNICATION_OP" not in db.tables:
        return pd.DataFrame(columns=["op_id", "name", "start_ns", "dur_ns", "correlation",
                                     "group", "comm_name", "kind", "wait_ns"])
    dtype = ("COALESCE(d.name, '')", " LEFT JOIN ENUM_HCCL_DATA_TYPE d ON d.id = o.dataType"
             ) if "ENUM_HCCL_DATA_TYPE" in db.tables else ("''", "")
    extra = "".join(f", o.{column} AS {alias}" for column, alias in
                    (("waitNs", "wait_ns"), ("rankSize", "rank_size"), ("count", "count"))
                    if db.has("COMMUNICATION_OP", column))
    rows = db.query(
        f"SELECT o.opId AS op_id, COALESCE(n.value, '') AS name, o.startNs AS start_ns, "
        f"o.endNs AS end_ns, o.connectionId AS correlation, COALESCE(g.value, '') AS comm_name, "
        f"COALESCE(y.value, '') AS op_type, {dtype[0]} AS dtype{extra} "
        f"FROM COMMUNICATION_OP o LEFT JOIN STRING_IDS n ON n.id = o.opName "
        f"LEFT JOIN STRING_IDS g ON g.id = o.groupName "
        f"LEFT JOIN STRING_IDS y ON y.id = o.opType{dtype[1]}", batch=QUERY_ROWS)
    frame = pd.DataFrame({
        "op_id": _ints(rows["op_id"]), "name": rows["name"].astype(str),
        "start_ns": _ints(rows["start_ns"]),
        "dur_ns": np.maximum(_ints(rows["end_ns"]) - _ints(rows["start_ns"]), 0),
        "correlation": _ints(rows["correlation"]), "comm_name": rows["comm_name"].astype(str),
        "dtype": rows["dtype"].astype(str)})
    hccl_names(frame)
    typed = frame["comm"] == ""
    frame.loc[typed, "comm"] = rows.loc[typed, "op_type"].map(comm_type)
    frame["group"] = frame["comm_name"].map(group_id)
    frame["bytes"] = op_bytes(_ints(rows.get("count"), len(rows)), frame["dtype"])
    frame["rank_size"] = _ints(rows.get("rank_size"), len(rows))
    frame["wait_ns"] = _ints(rows.get("wait_ns"), len(rows))
    frame["lane"] = comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    return frame


def group_id(comm_name: str) -> str:
    """The group id the text files write for an HCCL comm name: its msprof `double_hash` (a name
    that already is a decimal hash is kept)."""
    return comm_name if comm_name.isdigit() or not comm_name else double_hash(comm_name)


def _task_frame(db: Database, ops: pd.DataFrame) -> pd.DataFrame:
    """COMMUNICATION_TASK_INFO rows (HCCL small tasks, timed by their TASK row) on their op's
    plane lanes; `op` is the row of `ops` each belongs to."""
    if "COMMUNICATION_TASK_INFO" not in db.tables:
        return pd.DataFrame(columns=["op", "task_type", "src_rank", "dst_rank"])
    rows = db.query(
        "SELECT c.opId AS op_id, COALESCE(y.value, '') AS task_type, c.planeId AS plane, "
        "c.notifyId AS notify, c.srcRank AS src, c.dstRank AS dst, c.size AS bytes, "
        "COALESCE(g.value, '') AS comm_name, t.startNs AS start_ns, t.endNs AS end_ns "
        "FROM COMMUNICATION_TASK_INFO c JOIN TASK t ON t.globalTaskId = c.globalTaskId "
        "LEFT JOIN STRING_IDS y ON y.id = c.taskType "
        "LEFT JOIN STRING_IDS g ON g.id = c.groupName", batch=QUERY_ROWS)
    position = pd.Series(np.arange(len(ops)), index=ops["op_id"].to_numpy())
    op = rows["op_id"].map(position).fillna(NO_INT).astype(np.int64).to_numpy()
    own = op >= 0
    pick = np.clip(op, 0, None)
    frame = pd.DataFrame({
        "name": rows["task_type"].astype(str), "task_type": rows["task_type"].astype(str),
        "start_ns": _ints(rows["start_ns"]),
        "dur_ns": np.maximum(_ints(rows["end_ns"]) - _ints(rows["start_ns"]), 0),
        "notify_id": notify_ids([None if pd.isna(v) else str(int(v)) for v in rows["notify"]]),
        "src_rank": local_ranks(_ints(rows["src"])), "dst_rank": local_ranks(_ints(rows["dst"])),
        "bytes": _ints(rows["bytes"]), "kind": COMM_TASK, "lane_kind": COMM, "op": op})
    for column, default in (("group", ""), ("seq", NO_INT), ("correlation", NO_INT),
                            ("step", NO_INT)):
        values = ops[column].to_numpy()[pick] if len(ops) else np.full(len(frame), default)
        frame[column] = np.where(own, values, default)
    frame.loc[~own, "group"] = rows.loc[~own, "comm_name"].map(group_id)
    plane = pd.Series(_ints(rows["plane"]), dtype=str)
    frame["lane"] = comm_lane(frame["group"]) + " plane " + plane
    return frame


def _comm_times(ops: pd.DataFrame) -> list[dict[str, object]]:
    """Each HCCL op's elapse and, where the database has `waitNs`, its wait (ms), as the text
    path keeps communication.json's."""
    return [{"step": int(step), "name": name, "group": group, "elapse_ms": dur / 1e6,
             "wait_ms": wait / 1e6 if wait >= 0 else None}
            for step, name, group, dur, wait in zip(
                ops["step"], ops["name"], ops["group"], ops["dur_ns"], ops["wait_ns"],
                strict=True)]


def _ints(values: pd.Series | None, rows: int = 0) -> np.ndarray:
    """An SQLite column as int64, NO_INT where NULL (None: a column the table lacks, `rows`
    long)."""
    if values is None:
        return np.full(rows, NO_INT, dtype=np.int64)
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers.fillna(NO_INT).astype(np.int64).to_numpy()


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name=ascend_layout.DB_FORMAT, looked_for="ascend_*_profiler*.db / msprof_*.db",
                parse=parse, wants=ascend_layout.wants_db, sniff=ascend_layout.sniff_db,
                suffixes=(".db",))
"""A database on its own is one rank; in a profile folder, the Ascend format's discovery
(`parsers.ascend_layout`) hands it over with the files beside it."""
