"""Nsight Systems SQLite exports (`nsys export --type sqlite`) -> EVENTS, one rank per process.

An export holds every process of the profiled session (a node's ranks when nsys wrapped the
launcher), each row tagged with its process (`globalPid`, or `globalTid` whose low 24 bits are
the thread): discovery lists the processes with GPU activity and each becomes one rank
(`split`). Times are ns since the capture began; TARGET_INFO_SESSION_START_TIME gives that
instant on the wall clock. Strings are ids into StringIds.

Rows, named and laid out as the Kineto reader names them (so both formats feed the analysis the
same events): CUPTI_ACTIVITY_KIND_KERNEL on `stream N` (`device D stream N` when a process drives
several GPUs), MEMCPY (`Memcpy HtoD (Pinned -> Device)`, as CUPTI names them) and MEMSET, the
CUDA runtime calls on `thread TID NAME` with their correlation ids (a device row's launch; named
without nsys's `_v7000` suffix),
SYNCHRONIZATION as `cuda_sync` waits (`Stream Wait Event`, `Event Sync`, `Stream Sync`,
`Context Sync`, told by the runtime call sharing the correlation id, else by which of stream and
event the record names), NVTX ranges as markers. A wait on an event names the record it waited
for: the CUDA_EVENT record with the same `eventSyncId` where the schema has that column, else
the latest record of the same `eventId` issued before the wait's call (correlation ids grow in
call order; which one is said in the rank's `version`); `event_id` is then the record's
correlation id and `wait_on_stream` its stream, as Kineto's `wait_on_stream` and
`wait_on_cuda_event_record_corr_id`.

NCCL kernels (`ncclDevKernel_AllReduce_…`, `ncclKernel_SendRecv`) are classified by name as
Kineto's are; NCCL's own NVTX ranges (domain NCCL: `ncclAllReduce`, `ncclSend`, …; their
payloads, exported as JSON, name the communicator, the message size and the peer's rank in the
communicator) enclosing a kernel's launch give its group (the communicator id), bytes and local
peer; a fused `SendRecv` kernel launched by `ncclGroupEnd` takes the send / recv ranges issued
on its thread since the thread's previous NCCL launch. `ncclCommInitRank*` / `ncclCommSplit`
payloads give each communicator's size and this rank's place in it, from which the loader turns
local peers into global ranks across ranks. NCCL records no process-group description, so a
communicator's parallel dimension is unknown unless its use says it (P2P, all-to-all).

The rank of a process: RANK in an environment table of the export that names its process (or of
a one-process export), else this rank's place in the largest communicator it initialized, else
LOCAL_RANK, else the file name's (one-process exports), else --rank-map. `.nsys-rep` reports are
NVIDIA's binary format: they get a one-line error telling the export command.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow as pa

from parsers import sqlite_file
from parsers.base import (
    Format,
    Found,
    GroupInfo,
    NoRankId,
    ParsedRank,
    RankFiles,
    Reader,
    Sniff,
    TraceError,
    name_rank,
)
from parsers.classify import P2P_COMMS, comm_kind, comm_type
from parsers.intervals import cover
from parsers.sqlite_file import Database
from parsers.values import LABEL_LIMIT, UNREADABLE, capped, cut, rank_id, texts, to_int
from tracegraph import schema
from tracegraph.schema import NO_INT

NAME = "nsys"
SUFFIXES = (".sqlite", ".nsys-sqlite")
REPORT = ".nsys-rep"
PROCESS_ROLE = "process."  # role "process.{globalPid}" -> the export: that process is the rank
KERNEL, MEMCPY, MEMSET, SYNC = (f"CUPTI_ACTIVITY_KIND_{k}" for k in (
    "KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION"))
RUNTIME, CUDA_EVENT = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
DEVICE_TABLES = (KERNEL, MEMCPY, MEMSET)
_MARKERS = (b"CREATE TABLE StringIds", b"TARGET_INFO_", b"CUPTI_ACTIVITY_KIND_", b"NVTX_EVENTS")
_PID_SHIFT = 24  # globalTid = globalPid | tid; globalPid = vm << 56 | pid << 24
_LOW_24 = (1 << _PID_SHIFT) - 1
_INVALID = 0xFFFFFFFF  # CUPTI's "not applicable" stream / event id
_RANGES = (59, 60)  # NVTX push/pop and start/end ranges
_DOMAIN = 75  # NVTX domain creation: its text names the domain
_NCCL_DOMAIN = "NCCL"
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
               8: "DtoD", 9: "HtoH", 10: "PtoP"}  # CUpti_ActivityMemcpyKind
_MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                 6: "Device Static", 7: "Managed Static"}  # CUpti_ActivityMemoryKind
_SYNC_CALLS = (("StreamWaitEvent", "Stream Wait Event"), ("EventSynchronize", "Event Sync"),
               ("StreamSynchronize", "Stream Sync"), ("CtxSynchronize", "Context Sync"),
               ("DeviceSynchronize", "Context Sync"))
_API_VERSION = r"_v\d+$"  # nsys names runtime calls by their CUPTI id: cudaLaunchKernel_v7000
_STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
_STEP_LIKE = re.compile(r"^(?:iteration|train_step|training_step|step)[ _#:=-]*(\d{1,9})$", re.I)
_COMM_KEY, _PEER_KEY, _SIZE_KEY = "NCCL communicator ID", "Peer rank", "Message size [bytes]"
_RANK_KEY, _RANKS_KEY = "Rank", "No. of ranks"
_ENV_RANKS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


# --- discovery -------------------------------------------------------------------------------
def wants(name: str) -> bool:
    """Exports and reports, by their names: their first bytes tell which are exports."""
    return name.lower().endswith((*SUFFIXES, REPORT))


def sniff(name: str, head: bytes) -> Sniff:
    """An export named `.nsys-sqlite`, or `.sqlite` unless it is someone else's SQLite database
    (its first page names no nsys table); a `.nsys-rep` report (parse then says how to export
    it). The rank its file name states."""
    low = name.lower()
    ours = low.endswith((".nsys-sqlite", REPORT)) or not head.startswith(
        sqlite_file.SQLITE_MAGIC) or any(m in head for m in _MARKERS)
    return Sniff(ours, name_rank(name)) if ours else Sniff(False)


def find(names: list[str], sniffs: dict[str, Sniff], label: str, notes: list[str]) -> Found:
    """One profile per export (processes are split later, see `split`); a report beside its
    own export is left for the export."""
    exports = {_stem(n) for n in names if n.lower().endswith(SUFFIXES) and sniffs.get(
        n, Sniff(False)).profile}
    found, left = [], []
    for name in names:
        said = sniffs.get(name, Sniff(False))
        if name.lower().endswith(REPORT) and _stem(name) in exports:
            notes.append(f"{name}: read from its SQLite export beside it")
        elif said.profile:
            found.append(RankFiles(NAME, name, {"trace": name}, said.rank))
        else:
            left.append(name)
    return found, left


def _stem(name: str) -> str:
    base = name.lower()
    for suffix in (*SUFFIXES, REPORT):
        base = base.removesuffix(suffix)
    return base


def split(profile: RankFiles, read: Reader) -> list[RankFiles]:
    """One profile per process with GPU activity in the export, each with the rank it states."""
    member = profile.files["trace"]
    if member.lower().endswith(REPORT):
        return [profile]
    with _opened(member, read) as db:
        pids = _gpu_processes(db)
        if len(pids) <= 1:
            stated = _stated_rank(db, pids[0], True) if pids else None
            return [replace(profile, rank=stated if stated is not None else profile.rank)]
        return [RankFiles(NAME, f"{profile.root}#pid{pid >> _PID_SHIFT & _LOW_24}",
                          {"trace": member, f"{PROCESS_ROLE}{pid}": member},
                          _stated_rank(db, pid, False)) for pid in pids]


# --- opening ---------------------------------------------------------------------------------
@contextmanager
def _opened(member: str, read: Reader) -> Iterator[Database]:
    if member.lower().endswith(REPORT):
        export = posixpath.basename(member)[: -len(REPORT)] + ".sqlite"
        raise TraceError(f"{member}: an Nsight Systems report (.nsys-rep) is NVIDIA's binary "
                         f"format; export it first: nsys export --type sqlite --output {export} "
                         f"{posixpath.basename(member)}")
    with sqlite_file.opened(member, read) as db:
        if "StringIds" not in db.tables or not any(t in db.tables for t in DEVICE_TABLES):
            missing = "StringIds" if "StringIds" not in db.tables else " / ".join(DEVICE_TABLES)
            raise TraceError(f"{member}: no table {missing}: not an Nsight Systems export with "
                             "CUDA trace (nsys profile --trace=cuda, then nsys export --type "
                             "sqlite)")
        db.stated = db.values("EXPORT_META_DATA")
        db.version = db.stated.get("EXPORT_SCHEMA_VERSION", "")
        yield db


def _gpu_processes(db: Database) -> list[int]:
    """The processes (globalPid) with kernels, copies or memsets, in order."""
    parts = [f"SELECT DISTINCT globalPid FROM {t}" for t in DEVICE_TABLES if db.has(t, "globalPid")]
    if not parts:
        return []
    rows = db.query(" UNION ".join(parts))["globalPid"].dropna()
    return sorted(int(p) for p in rows)


def _same_process(column: str) -> str:
    """SQL: `column` (a globalTid) belongs to the process `?` (a globalPid)."""
    return f"({column} >> {_PID_SHIFT}) = (? >> {_PID_SHIFT})"


# --- the rank --------------------------------------------------------------------------------
def _stated_rank(db: Database, pid: int, alone: bool) -> int | None:
    """The rank a process states: RANK (see the module docstring), its place in the largest
    communicator it initialized, LOCAL_RANK; None when nothing says."""
    env = _environment(db, pid, alone)
    for key in _ENV_RANKS:
        if rank_id(env.get(key)) is not None:
            return rank_id(env.get(key))
    world = _world(_communicators(_nvtx(db, pid)))
    if world is not None:
        return world[1]
    return rank_id(env.get("LOCAL_RANK"))


def _environment(db: Database, pid: int, alone: bool) -> dict[str, str]:
    """Name -> value of the export's environment tables that name this process (those naming
    none only for a one-process export)."""
    found: dict[str, str] = {}
    for table, columns in sorted(db.tables.items()):
        if "ENV" not in table.upper() or not {"name", "value"} <= columns:
            continue
        if "globalPid" in columns:
            rows = db.query(f"SELECT name, value FROM {table} WHERE globalPid = ?", (pid,))
        elif alone:
            rows = db.query(f"SELECT name, value FROM {table}")
        else:
            continue
        found |= {str(k): str(v) for k, v in zip(rows["name"], rows["value"], strict=True)}
    return found


# --- NVTX ------------------------------------------------------------------------------------
def _nvtx(db: Database, pid: int) -> pd.DataFrame:
    """The process's NVTX ranges: start, end, globalTid, text, domain name, payload (dict)."""
    if not db.has("NVTX_EVENTS", "start", "end", "eventType", "globalTid"):
        return pd.DataFrame(columns=["start", "end", "globalTid", "text", "domain", "payload"])
    cols = db.tables["NVTX_EVENTS"]
    text = _coalesced(cols, ("text", "t"), ("textId", "t"))
    payload = _coalesced(cols, ("jsonText", "j"), ("jsonTextId", "j"))
    joins = "".join(f" LEFT JOIN StringIds {alias} ON {alias}.id = n.{column}"
                    for column, alias in (("textId", "t"), ("jsonTextId", "j")) if column in cols)
    domain = "n.domainId" if "domainId" in cols else "NULL"
    rows = db.query(
        f"SELECT n.start, n.end, n.eventType, n.globalTid, {text} AS text, {payload} AS payload, "
        f"{domain} AS domain FROM NVTX_EVENTS n{joins} "
        f"WHERE n.eventType IN ({', '.join(map(str, (*_RANGES, _DOMAIN)))}) "
        f"AND {_same_process('n.globalTid')}", (pid,))
    names = {d: str(t) for d, t, e in zip(rows["domain"], rows["text"], rows["eventType"],
                                          strict=True) if e == _DOMAIN and t is not None}
    rows = rows[rows["eventType"].isin(_RANGES) & rows["end"].notna()]
    return rows.assign(text=rows["text"].fillna("").astype(str),
                       domain=rows["domain"].map(names).fillna(""),
                       payload=[_payload(p) for p in rows["payload"]]).reset_index(drop=True)


def _coalesced(columns: set[str], inline: tuple[str, str], by_id: tuple[str, str]) -> str:
    """SQL for a text NVTX gives inline or as a StringIds id, whichever the schema has."""
    parts = [f"n.{inline[0]}"] if inline[0] in columns else []
    parts += [f"{by_id[1]}.value"] if by_id[0] in columns else []
    return f"COALESCE({', '.join(parts)})" if len(parts) > 1 else (parts or ["NULL"])[0]


def _payload(text: object) -> dict:
    """An NVTX extended payload as nsys exports it (a JSON object), {} for anything else."""
    if not isinstance(text, str) or not text.startswith("{"):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class _Comm:
    """What NCCL's payloads say of one communicator, from this rank."""

    group: str  # the communicator id, as the group id
    size: int  # its member count (NO_INT when unknown)
    local: int  # this rank's place in it (NO_INT when unknown)
    root: bool  # created by ncclCommInitRank* (not split from another)


def _comm_id(payload: dict) -> str:
    """A payload's communicator id as the group id ("0x…", NCCL's commHash), else ""."""
    value = payload.get(_COMM_KEY)
    number = value if isinstance(value, int) and not isinstance(value, bool) else _int(value)
    return f"0x{number:x}" if number >= 0 else ""


def _communicators(nvtx: pd.DataFrame) -> dict[str, _Comm]:
    """Communicator id -> size and this rank's place, from ncclCommInitRank* / ncclCommSplit."""
    found: dict[str, _Comm] = {}
    inits = nvtx[(nvtx["domain"] == _NCCL_DOMAIN) & nvtx["text"].str.startswith("ncclComm")]
    for text, payload in zip(inits["text"], inits["payload"], strict=True):
        group = _comm_id(payload)
        if group and ("Init" in text or "Split" in text):
            found[group] = _Comm(group, _int(payload.get(_RANKS_KEY)),
                                 _int(payload.get(_RANK_KEY)), "Init" in text)
    return found


def _world(comms: dict[str, _Comm]) -> tuple[int, int] | None:
    """(size, this rank's place) of the largest communicator initialized from scratch, when
    every such communicator of that size places the rank alike."""
    roots = [c for c in comms.values() if c.root and c.size > 0 and c.local >= 0]
    if not roots:
        return None
    size = max(c.size for c in roots)
    places = {c.local for c in roots if c.size == size}
    return (size, places.pop()) if len(places) == 1 else None


def _int(value: object) -> int:
    """A count, id or size from the export: NO_INT when absent, negative or unreadable."""
    number = to_int(value.item() if isinstance(value, np.generic) else value)
    return number if number >= 0 else NO_INT


# --- rows ------------------------------------------------------------------------------------
def _kernels(db: Database, pid: int) -> pd.DataFrame:
    cols = db.tables.get(KERNEL, set())
    if not cols:
        return pd.DataFrame()
    names = [f"{a}.value" for c, a in (("demangledName", "d"), ("shortName", "s")) if c in cols]
    name = f"COALESCE({', '.join([*names, repr('')])})"
    joins = "".join(f" LEFT JOIN StringIds {a} ON {a}.id = k.{c}" for c, a in (
        ("demangledName", "d"), ("shortName", "s")) if c in cols)
    rows = db.query(f"SELECT k.start, k.end, k.deviceId AS device, k.streamId AS stream, "
                    f"k.correlationId AS correlation, {name} AS name FROM {KERNEL} k{joins} "
                    "WHERE k.globalPid = ?", (pid,))
    return rows.assign(task_type="kernel", kind=schema.COMPUTE)


def _copies(db: Database, pid: int) -> pd.DataFrame:
    parts = []
    if db.has(MEMCPY, "copyKind", "bytes"):
        kinds = ", ".join(f"{c}" if c in db.tables[MEMCPY] else f"NULL AS {c}"
                          for c in ("srcKind", "dstKind"))
        rows = db.query(f"SELECT start, end, deviceId AS device, streamId AS stream, "
                        f"correlationId AS correlation, bytes, copyKind, {kinds} FROM {MEMCPY} "
                        "WHERE globalPid = ?", (pid,))
        names = [f"Memcpy {_COPY_KINDS.get(_int(k), '?')} ({_MEMORY_KINDS.get(_int(s), '?')} "
                 f"-> {_MEMORY_KINDS.get(_int(d), '?')})"
                 for k, s, d in zip(rows["copyKind"], rows["srcKind"], rows["dstKind"],
                                    strict=True)]
        parts.append(rows.drop(columns=["copyKind", "srcKind", "dstKind"]).assign(
            name=names, task_type="gpu_memcpy"))
    if db.has(MEMSET, "bytes"):
        rows = db.query(f"SELECT start, end, deviceId AS device, streamId AS stream, "
                        f"correlationId AS correlation, bytes FROM {MEMSET} WHERE globalPid = ?",
                        (pid,))
        parts.append(rows.assign(name="Memset (Device)", task_type="gpu_memset"))
    return pd.concat(parts, ignore_index=True).assign(kind=schema.MEMCPY) if parts else (
        pd.DataFrame())


def _runtime(db: Database, pid: int) -> pd.DataFrame:
    if not db.has(RUNTIME, "start", "end", "globalTid", "correlationId", "nameId"):
        return pd.DataFrame(columns=["start", "end", "globalTid", "correlation", "name"])
    rows = db.query(f"SELECT r.start, r.end, r.globalTid, r.correlationId AS correlation, "
                    f"COALESCE(s.value, '') AS name FROM {RUNTIME} r LEFT JOIN StringIds s "
                    f"ON s.id = r.nameId WHERE {_same_process('r.globalTid')}", (pid,))
    return rows.assign(name=rows["name"].str.replace(_API_VERSION, "", regex=True))


def _syncs(db: Database, pid: int, calls: pd.DataFrame) -> pd.DataFrame:
    """SYNCHRONIZATION rows as waits, each event wait joined to its record (module docstring)."""
    if not db.has(SYNC, "start", "end", "streamId", "correlationId", "eventId"):
        return pd.DataFrame()
    by_sync_id = _event_join(db) == "eventSyncId"
    extra = ", eventSyncId AS sync_id" if by_sync_id else ""
    rows = db.query(f"SELECT start, end, deviceId AS device, streamId AS stream, "
                    f"correlationId AS correlation, eventId AS event{extra} FROM {SYNC} "
                    "WHERE globalPid = ?", (pid,))
    called = calls.drop_duplicates("correlation").set_index("correlation")["name"]
    rows["name"] = [_sync_name(str(called.get(c, "")), s, e)
                    for c, s, e in zip(rows["correlation"], rows["stream"], rows["event"],
                                       strict=True)]
    record, stream = _records(db, pid, rows, by_sync_id)
    rows = rows.assign(event_id=record, wait_on_stream=stream, task_type="cuda_sync",
                       kind=schema.WAIT)
    return rows.drop(columns=["event", *(["sync_id"] if by_sync_id else [])])


def _event_join(db: Database) -> str:
    """How event waits are joined to their record: by eventSyncId where both tables have it."""
    if db.has(SYNC, "eventSyncId") and db.has(CUDA_EVENT, "eventSyncId"):
        return "eventSyncId"
    return "eventId+call order" if db.has(SYNC, "eventId") else ""


def _sync_name(call: str, stream: object, event: object) -> str:
    """Kineto's name of a synchronization: by the call it records, else by what it names."""
    for word, name in _SYNC_CALLS:
        if word in call:
            return name
    has_stream, has_event = _int(stream) not in (NO_INT, _INVALID), _int(event) != _INVALID
    return ("Stream Wait Event" if has_stream and has_event else "Event Sync" if has_event
            else "Stream Sync" if has_stream else "Context Sync")


def _records(db: Database, pid: int, syncs: pd.DataFrame, by_sync_id: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per sync row, the correlation id and stream of the event record it waited for."""
    out = np.full(len(syncs), NO_INT, dtype=np.int64), np.full(len(syncs), NO_INT, dtype=np.int64)
    if not db.has(CUDA_EVENT, "streamId", "correlationId", "eventId") or syncs.empty:
        return out
    extra = ", eventSyncId AS sync_id" if by_sync_id else ""
    records = db.query(f"SELECT streamId AS stream, correlationId AS correlation, eventId AS event"
                       f"{extra} FROM {CUDA_EVENT} WHERE globalPid = ?", (pid,))
    if by_sync_id:
        found = syncs[["sync_id"]].merge(records.drop_duplicates("sync_id"), on="sync_id",
                                         how="left")
    else:
        left = syncs[["correlation", "event"]].fillna(NO_INT).assign(row=np.arange(len(syncs)))
        records = records.dropna(subset=["correlation", "event"])
        found = pd.merge_asof(left.sort_values("correlation"),
                              records.sort_values("correlation").rename(
                                  columns={"correlation": "recorded"}),
                              left_on="correlation", right_on="recorded", by="event",
                              allow_exact_matches=False).sort_values("row")
        found = found.assign(correlation=found["recorded"])
    valid = (syncs["event"].to_numpy() != _INVALID)
    corr = found["correlation"].fillna(NO_INT).to_numpy(np.int64)
    stream = found["stream"].fillna(NO_INT).to_numpy(np.int64)
    return np.where(valid, corr, NO_INT), np.where(valid, _streams(stream), NO_INT)


def _streams(values: np.ndarray) -> np.ndarray:
    """Stream ids with CUPTI's "none" (0xFFFFFFFF) as NO_INT."""
    return np.where((values < 0) | (values >= _INVALID), NO_INT, values)


# --- the rank's table ------------------------------------------------------------------------
def _lanes(device: pd.DataFrame) -> pd.Series:
    """`stream N` (`device sync` for none), prefixed by the device when there are several."""
    stream = _streams(device["stream"].fillna(NO_INT).to_numpy(np.int64))
    lane = np.where(stream >= 0, "stream " + stream.astype(str), "device sync")
    devices = device["device"].fillna(NO_INT).astype(np.int64)
    if devices.nunique() > 1:
        lane = "device " + devices.astype(str).to_numpy() + " " + lane
    return pd.Series(lane, index=device.index, dtype=object)


def _threads(db: Database, pid: int) -> dict[int, str]:
    """globalTid -> the thread's name (ThreadNames)."""
    if not db.has("ThreadNames", "nameId", "globalTid"):
        return {}
    rows = db.query(f"SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s "
                    f"ON s.id = t.nameId WHERE {_same_process('t.globalTid')}", (pid,))
    return {int(t): cut(str(n), LABEL_LIMIT) for t, n in zip(rows["globalTid"], rows["value"],
                                                             strict=True)}


def _thread_lanes(global_tids: pd.Series, names: dict[int, str]) -> pd.Series:
    """`thread TID NAME` of each row's thread (each distinct thread formatted once)."""
    def lane(gtid: int) -> str:
        name = names.get(gtid, "")
        return f"thread {gtid & _LOW_24} {name}" if name else f"thread {gtid & _LOW_24}"
    codes, uniques = pd.factorize(global_tids.astype(np.int64))
    labels = np.array([lane(int(g)) for g in uniques] + [""], dtype=object)
    return pd.Series(labels[codes], index=global_tids.index, dtype=object)


@dataclass
class _Rank:
    """One process's rows: host calls, NVTX ranges and device rows, with their columns."""

    host: pd.DataFrame  # runtime calls: start, end, globalTid, correlation, name
    ranges: pd.DataFrame  # NVTX ranges: start, end, globalTid, text, domain, payload
    device: pd.DataFrame  # kernels, copies, syncs: start, end, device, stream, correlation, ...
    comms: dict[str, _Comm]
    rank: int

    def parents(self) -> np.ndarray:
        """Per device row, the row of `host` launching it (same correlation id), else -1."""
        host = self.host[self.host["correlation"].notna()]
        first = host.drop_duplicates("correlation")
        index = pd.Series(first.index.to_numpy(), index=first["correlation"].astype(np.int64))
        corr = self.device["correlation"].fillna(NO_INT).astype(np.int64)
        return corr.map(index).fillna(-1).astype(np.int64).to_numpy()


def _nccl(r: _Rank, parent: np.ndarray) -> pd.DataFrame:
    """comm, group, bytes and group-local peer of the device rows: NCCL kernels by name, their
    communicator, size and peer from the NCCL ranges around their launch."""
    names = r.device["name"].tolist()
    comm = [comm_type(n) if n[:4].lower() == "nccl" else "" for n in names]
    out = {"comm": comm, "group": [""] * len(names), "local": [NO_INT] * len(names),
           "nbytes": [NO_INT] * len(names)}
    nccl = r.ranges[r.ranges["domain"] == _NCCL_DOMAIN].sort_values("start", kind="stable")
    rows = np.flatnonzero((np.array(comm, dtype=object) != "") & (parent >= 0))
    calls = r.host.iloc[parent[rows]]
    for gtid in np.unique(calls["globalTid"]) if len(nccl) else ():
        mine = rows[(calls["globalTid"] == gtid).to_numpy()]
        launched = r.host["start"].to_numpy(np.int64)[parent[mine]]
        for row, facts in zip(mine[np.argsort(launched, kind="stable")].tolist(),
                              _launches(np.sort(launched), nccl[nccl["globalTid"] == gtid],
                                        r.comms), strict=True):
            if facts is not None:
                for key, value in facts.items():
                    out[key][row] = value
    return pd.DataFrame(out, index=r.device.index)


def _launches(launched: np.ndarray, ranges: pd.DataFrame, comms: dict[str, _Comm]
              ) -> Iterator[dict[str, object] | None]:
    """For each NCCL launch of one thread (`launched`, in time order), what the NCCL ranges
    that issued it say: the range around the launch, or for a group's launch (`ncclGroupEnd`)
    the ranges begun since the thread's previous NCCL launch."""
    starts = ranges["start"].to_numpy(np.int64)
    text, payload = ranges["text"].tolist(), ranges["payload"].tolist()
    around = cover(np.arange(len(ranges)), starts, ranges["end"].to_numpy(np.int64), launched)
    since = np.searchsorted(starts, np.r_[np.iinfo(np.int64).min, launched[:-1]], "right")
    upto = np.searchsorted(starts, launched, "right")
    for inner, lo, hi in zip(around.tolist(), since.tolist(), upto.tolist(), strict=True):
        issued = [inner] if inner >= 0 and "GroupEnd" not in text[inner] else range(lo, hi)
        yield _issued([(text[i], payload[i]) for i in issued], comms)


def _issued(calls: list[tuple[str, dict]], comms: dict[str, _Comm]) -> dict[str, object] | None:
    """A kernel's communicator, bytes, and comm and local peer where the calls that issued it
    (one collective, or a group's sends / receives) settle them; None when they name no one
    communicator."""
    ops = [(c, p) for c, p in ((comm_type(t.removeprefix("nccl")), p) for t, p in calls) if c]
    groups = {_comm_id(p) for _, p in ops} - {""}
    if len(groups) != 1:
        return None
    group = groups.pop()
    sizes = [_int(p.get(_SIZE_KEY)) for _, p in ops]
    facts: dict[str, object] = {"group": group, "nbytes": sum(sizes) if min(sizes) >= 0
                                else NO_INT}
    comms_used = {c for c, _ in ops}
    if not comms_used <= P2P_COMMS:
        if len(comms_used) == 1:
            facts["comm"] = comms_used.pop()
        return facts
    peers = {_int(p.get(_PEER_KEY)) for _, p in ops} - {NO_INT}
    size = comms[group].size if group in comms else NO_INT
    if len(peers) == 1:
        facts["comm"] = comms_used.pop() if len(comms_used) == 1 else "batch_send_recv"
        facts["local"] = peers.pop()
    elif size > 2 and len(peers) == size - 1:
        facts["comm"] = "alltoall"  # every other member: PyTorch's all-to-all
    return facts


def _context(r: _Rank, parent: np.ndarray, marks: pd.DataFrame
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """step and annotation of the host calls and of the device rows (their launch's): the
    ProfilerStep#N range covering the time; the innermost user (not NCCL) range on the row's
    own thread, or on any thread for threads without ranges."""
    steps = marks[marks["step"] != NO_INT]
    users = r.ranges[(r.ranges["domain"] != _NCCL_DOMAIN)
                     & ~r.ranges["text"].str.match(_STEP) & ~r.ranges["text"].str.match(
                         _STEP_LIKE)]

    def label_of(at: np.ndarray, gtid: np.ndarray) -> np.ndarray:
        label = np.full(len(at), "", dtype=object)
        owned = np.isin(gtid, users["globalTid"].to_numpy())
        for tid in np.unique(gtid[owned]):
            where = np.flatnonzero(gtid == tid)
            label[where] = _covering(users[users["globalTid"] == tid], "text", at[where], "")
        label[~owned] = _covering(users, "text", at[~owned], "")
        return label

    host_at = r.host["start"].to_numpy(np.int64)
    host_tid = r.host["globalTid"].to_numpy(np.int64)
    host_step = _covering(steps, "step", host_at, NO_INT)
    host_label = label_of(host_at, host_tid)
    launched = parent >= 0
    device_step = np.where(launched, host_step[parent.clip(0)], NO_INT) if len(host_at) else (
        np.full(len(parent), NO_INT))
    device_label = np.where(launched, host_label[parent.clip(0)], "") if len(host_at) else (
        np.full(len(parent), ""))
    return host_step, host_label, device_step, device_label


def _covering(ranges: pd.DataFrame, column: str, at: np.ndarray, default: object
              ) -> np.ndarray:
    """Per time of `at`, `column` of the innermost of `ranges` covering it, else `default`."""
    found = cover(np.arange(len(ranges)), ranges["start"].to_numpy(np.int64),
                  ranges["end"].to_numpy(np.int64), at)
    values = np.append(ranges[column].to_numpy(object), default)
    return values[np.where(found >= 0, found, len(ranges))]


def _step_marks(ranges: pd.DataFrame) -> pd.DataFrame:
    """The NVTX ranges as markers, with step N on ProfilerStep#N ranges; where none is named so,
    ranges named like a step (`iteration 12`, `train_step 3`) also as ProfilerStep#N."""
    steps = ranges["text"].str.extract(_STEP)[0]
    marks = ranges.assign(name=ranges["text"], step=pd.to_numeric(steps, errors="coerce"))
    if marks["step"].isna().all():
        like = ranges["text"].str.extract(_STEP_LIKE)[0].dropna()
        named = ranges.loc[like.index].assign(name="ProfilerStep#" + like,
                                              step=pd.to_numeric(like))
        marks = pd.concat([marks, named])
    return marks.assign(step=marks["step"].fillna(NO_INT).astype(np.int64)).reset_index(
        drop=True)


def _table(r: _Rank, threads: dict[int, str]) -> tuple[pa.Table, pd.DataFrame]:
    """The EVENTS table of the rank, and its device rows' comm columns (for groups and meta)."""
    parent = r.parents()
    marks = _step_marks(r.ranges)
    nccl = _nccl(r, parent)
    host_step, host_label, device_step, device_label = _context(r, parent, marks)
    world = _world(r.comms)
    is_world = np.array([g in r.comms and world is not None and r.comms[g].root
                         and r.comms[g].size == world[0] for g in nccl["group"]], dtype=bool)
    sends = nccl["comm"].isin(["send", "batch_send_recv"]).to_numpy()
    local = nccl["local"].to_numpy(np.int64)
    kinds = [comm_kind(c) if c else k for c, k in zip(nccl["comm"], r.device["kind"],
                                                      strict=True)]
    device = {
        "lane": _lanes(r.device), "lane_kind": schema.STREAM, "kind": kinds,
        "stream": _streams(r.device["stream"].fillna(NO_INT).to_numpy(np.int64)),
        "name": r.device["name"], "task_type": r.device["task_type"],
        "comm": nccl["comm"], "group": nccl["group"],
        "bytes": np.where(nccl["nbytes"] >= 0, nccl["nbytes"],
                          r.device.get("bytes", pd.Series(NO_INT, index=r.device.index)
                                       ).fillna(NO_INT)),
        "peer": np.where(is_world, local, NO_INT),
        "dst_rank": np.where(sends, local, NO_INT), "src_rank": np.where(sends, NO_INT, local),
        "event_id": r.device.get("event_id", pd.Series(NO_INT, index=r.device.index)),
        "wait_on_stream": r.device.get("wait_on_stream",
                                       pd.Series(NO_INT, index=r.device.index)),
        "step": device_step, "annotation": device_label}
    host = {"lane": _thread_lanes(r.host["globalTid"], threads), "lane_kind": schema.THREAD,
            "kind": schema.HOST, "task_type": "cuda_runtime", "name": r.host["name"],
            "step": host_step, "annotation": host_label}
    marker = {"lane": _thread_lanes(marks["globalTid"], threads), "lane_kind": schema.THREAD,
              "kind": schema.MARKER, "task_type": "nvtx", "name": marks["name"],
              "step": marks["step"]}
    frames = [pd.DataFrame({**columns, "start_ns": rows["start"], "dur_ns": _durations(rows),
                            "correlation": rows.get("correlation")})
              for columns, rows in ((device, r.device), (host, r.host), (marker, marks))]
    frame = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
    return _events(frame, r.rank), nccl


def _durations(rows: pd.DataFrame) -> np.ndarray:
    start, end = rows["start"].to_numpy(np.int64), rows["end"].to_numpy(np.int64)
    unread = (start == UNREADABLE) | (end == UNREADABLE)
    return np.where(unread, UNREADABLE, end - np.where(unread, 0, start))


def _events(frame: pd.DataFrame, rank: int) -> pa.Table:
    columns: dict[str, object] = {"rank": np.full(len(frame), rank, dtype=np.int32)}
    for field in schema.EVENTS:
        if field.name == "rank" or field.name not in frame:
            continue
        values = frame[field.name]
        if pa.types.is_integer(field.type):
            columns[field.name] = pd.to_numeric(values, errors="coerce").fillna(
                NO_INT).to_numpy(np.int64)
        else:
            columns[field.name] = capped(texts(values.fillna("").astype(str).tolist()))
    return schema.events_table(columns, len(frame))


# --- entry point -----------------------------------------------------------------------------
def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One process of an export as one rank's normalized events, groups and meta."""
    member = files.files["trace"]
    warnings: list[str] = []
    with _opened(member, read) as db:
        pid = _process(files, db)
        rank = _rank(files, db, pid, warnings)
        base = _session_start(db, files.root, warnings)
        ranges, host = _nvtx(db, pid), _runtime(db, pid)
        device = pd.concat([f for f in (_kernels(db, pid), _copies(db, pid),
                                        _syncs(db, pid, host)) if len(f)]
                           or [pd.DataFrame(columns=_DEVICE_COLUMNS)], ignore_index=True)
        r = _Rank(*(_on_clock(f, base) for f in (host, ranges, device)), _communicators(ranges),
                  rank)
        table, nccl = _table(r, _threads(db, pid))
        meta = _meta(db, pid, files, r, nccl, base)
    return ParsedRank(rank=rank, events=table, groups=_groups(r, nccl), meta=meta,
                      warnings=warnings)


_DEVICE_COLUMNS = ["start", "end", "device", "stream", "correlation", "name", "task_type", "kind"]


def _on_clock(rows: pd.DataFrame, base: int) -> pd.DataFrame:
    """`rows` with start / end moved from ns since the capture began onto the wall clock (a
    time that does not read stays UNREADABLE: validation drops its row)."""
    return rows.assign(**{c: (_ns(rows[c]) + base).fillna(UNREADABLE).astype(np.int64)
                          for c in ("start", "end")})


def _ns(column: pd.Series) -> pd.Series:
    """A time column as nullable integers: a column with a NULL reads as floats, whose 53 bits
    would round a wall-clock time (~1.8e18 ns) to 256 ns once the session's start is added."""
    times = pd.to_numeric(column, errors="coerce")
    readable = np.isfinite(times) & (times.abs() < 2.0**62)
    return times.where(readable).round().astype("Int64")


def _process(files: RankFiles, db: Database) -> int:
    """The profile's process: its role's, else the export's one process with GPU activity."""
    named = [role[len(PROCESS_ROLE):] for role in files.files if role.startswith(PROCESS_ROLE)]
    if named:
        return int(named[0])
    pids = _gpu_processes(db)
    if not pids:
        raise TraceError(f"{files.root}: no kernel, copy or memset in the export: nothing ran "
                         "on a GPU while nsys traced CUDA")
    if len(pids) > 1:
        raise TraceError(f"{files.root}: {len(pids)} processes ran on GPUs; open the export "
                         "through tracegraph.load, which reads each as a rank")
    return pids[0]


def _rank(files: RankFiles, db: Database, pid: int, warnings: list[str]) -> int:
    """Discovery's rank (what the process or the file name states, --rank-map); else, for a
    one-process export, rank 0, said."""
    if files.rank is not None:
        return files.rank
    if any(role.startswith(PROCESS_ROLE) for role in files.files):
        raise NoRankId(f"{files.root}: no rank stated (no RANK / LOCAL_RANK, no NCCL "
                         "communicator); pass --rank-map")
    warnings.append(f"{files.root}: no rank stated (no RANK / LOCAL_RANK, no NCCL communicator, "
                    "none in the file name); taken as rank 0 (--rank-map sets it)")
    return 0


def _session_start(db: Database, where: str, warnings: list[str]) -> int:
    """The capture's start on the wall clock (ns since the epoch)."""
    if db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        rows = db.query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
        epoch = _int(rows["utcEpochNs"].iloc[0]) if len(rows) else NO_INT
        if epoch > 0:
            return epoch
    warnings.append(f"{where}: no TARGET_INFO_SESSION_START_TIME: times are ns since the "
                    "capture began, not the wall clock")
    return 0


def _groups(r: _Rank, nccl: pd.DataFrame) -> list[GroupInfo]:
    """A group per communicator the rank used or created: its size and this rank a member."""
    used = set(nccl["group"]) - {""}
    return [GroupInfo(group, group, "", (r.rank,), "NCCL communicator (NVTX payload)",
                      max(r.comms[group].size if group in r.comms else 0, 0))
            for group in sorted(used | set(r.comms))]


def _meta(db: Database, pid: int, files: RankFiles, r: _Rank, nccl: pd.DataFrame, base: int
          ) -> dict[str, object]:
    env = _environment(db, pid, not any(k.startswith(PROCESS_ROLE) for k in files.files))
    world = _world(r.comms)
    size = rank_id(env.get("WORLD_SIZE")) or (world[0] if world else NO_INT)
    devices = r.device["device"].dropna().astype(int) if len(r.device) else pd.Series([], int)
    device = int(devices.mode().iloc[0]) if len(devices) else NO_INT
    gpu = _gpu(db, device)
    process = db.query("SELECT name FROM PROCESSES WHERE globalPid = ?", (pid,))["name"] if (
        db.has("PROCESSES", "globalPid", "name")) else pd.Series([], dtype=object)
    versions = {"nsys": db.stated.get("EXPORT_PRODUCT_VERSION"), "schema": db.version,
                "event_join": _event_join(db)}
    meta: dict[str, object] = {
        "framework": str(process.iloc[0]) if len(process) and process.iloc[0] else "cuda",
        "format": NAME, "version": ";".join(f"{k}={v}" for k, v in versions.items() if v),
        "device": gpu[0], "device_memory": gpu[1], "world_size": size,
        "backend": "nccl" if (nccl["comm"] != "").any() else "", "clock_base_ns": base,
        "host": db.stated.get("EXPORT_HOST", "")}
    places = {g: c.local for g, c in r.comms.items() if c.local >= 0}
    if places:  # the loader places other ranks' peers named by their place here
        meta["cross_rank"] = {"issuers": [], "open": 0, "comm_ranks": places}
    return meta


def _gpu(db: Database, device: int) -> tuple[str, int]:
    """(name, memory bytes) of the GPU the rank ran on (TARGET_INFO_GPU)."""
    if device < 0 or not db.has("TARGET_INFO_GPU", "id", "name"):
        return "", NO_INT
    memory = "totalMemory" if db.has("TARGET_INFO_GPU", "totalMemory") else "NULL"
    rows = db.query(f"SELECT name, {memory} AS memory FROM TARGET_INFO_GPU WHERE id = ?",
                    (device,))
    if rows.empty:
        return f"cuda:{device}", NO_INT
    return f"cuda:{device} {rows['name'].iloc[0]}", _int(rows["memory"].iloc[0])


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name=NAME, looked_for="Nsight Systems *.sqlite / *.nsys-sqlite exports",
                parse=parse, wants=wants, sniff=sniff, suffixes=(*SUFFIXES, REPORT), find=find,
                split=split, profiler="Nsight Systems")
