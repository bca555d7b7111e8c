"""Ascend profiles (torch_npu `*_ascend_pt`, MindSpore `*_ascend_ms`, msprof `PROF_*`) -> EVENTS.

trace_view.json / msprof_*.json slices are decoded by msgspec into Structs that declare only the
fields used; the columns are then built with pyarrow / numpy / pandas. Layers are told apart by
their `process_name` metadata, never by pid arithmetic (by the events' content when a truncated
file lost its metadata). communication.json gives each HCCL op its full group; a rank without a
timeline gets its communication ops from that file alone. Which folders are Ascend profiles, and
which of their files play which role, is `parsers.ascend_layout`'s call.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers import ascend_layout
from parsers.ascend_comm import Side, load_side, resolve_rank
from parsers.ascend_layout import recognizes as recognizes  # the format's test, re-exported
from parsers.base import Format, GroupInfo, ParsedRank, RankFiles, Reader, TraceError
from parsers.classify import HcclName, comm_kind, comm_type, double_hash, parse_hccl_name
from parsers.values import (
    LABEL_LIMIT,
    cut,
    decimal_micros_to_ns,
    ints,
    micros_to_ns,
    texts,
    to_int,
)
from tracegraph import schema
from tracegraph.schema import (
    COLLECTIVE,
    COMM,
    COMM_TASK,
    COMPUTE,
    HOST,
    MARKER,
    MEMCPY,
    NO_INT,
    P2P,
    RECORD,
    STREAM,
    THREAD,
    WAIT,
)

DEVICE_LAYERS = frozenset({"Ascend Hardware"})
COMM_LAYERS = frozenset({"HCCL", "Communication"})
CANN_LAYERS = frozenset({"CANN"})
MARKER_LAYERS = frozenset({"Scope Layer", "python", "python3"})  # graph scopes, mstx ranges
FRAMEWORK_LAYERS = frozenset({"Python", "MindSpore", "CPU OP", "PID Name"}) | MARKER_LAYERS
SKIPPED_LAYERS = frozenset({  # overlap summary and counter tracks: no operations
    "Overlap Analysis", "AI Core Freq", "HBM", "PCle", "HCCS", "LLC", "NPU MEM", "Stars Soc Info",
    "Stars Chip Trans", "Acc PMU", "SIO", "QoS", "NIC", "RoCE",
})
_INVALID_NOTIFY = "18446744073709551615"
_DTYPE_BYTES = {"INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BFP16": 2, "BF16": 2,
                "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}
_STEP = re.compile(r"ProfilerStep#(\d+)")
_GROUP_THREAD = re.compile(r"Group (.+?) (?:Aicpu )?Communication")
_PLANE_THREAD = re.compile(r"Plane (\d+)")
_INT32_MAX = np.iinfo(np.int32).max

Scalar = int | float | str | None


class _Args(msgspec.Struct, gc=False):
    name: Scalar = None  # process_name / thread_name metadata
    task_type: Scalar = msgspec.field(name="Task Type", default=None)
    physic_stream: Scalar = msgspec.field(name="Physic Stream Id", default=None)
    stream_id: Scalar = msgspec.field(name="Stream Id", default=None)
    connection_id: Scalar = None
    data_size: Scalar = msgspec.field(name="data size(Byte)", default=None)
    size_b: Scalar = msgspec.field(name="size(B)", default=None)
    size_byte: Scalar = msgspec.field(name="size(Byte)", default=None)
    notify_id: Scalar = None
    src_rank: Scalar = msgspec.field(name="src rank", default=None)
    dst_rank: Scalar = msgspec.field(name="dst rank", default=None)
    small_task_type: Scalar = msgspec.field(name="task type", default=None)
    data_type: Scalar = None
    count: Scalar = None
    rank_size: Scalar = None  # newer HCCL op events: the group's member count


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: str | int | float | None = None
    dur: float | str | None = None
    cat: str | None = None
    args: _Args | None = None


class _Wrapped(msgspec.Struct):
    traceEvents: list[_Event]  # noqa: N815 - the JSON key


_DECODER = msgspec.json.Decoder(list[_Event] | _Wrapped)
_PH, _PID = attrgetter("ph"), attrgetter("pid")
_MAX_PASSES = 64
_NO_ARGS = _Args()
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One rank's Ascend profile as normalized events, groups and rank metadata."""
    warnings: list[str] = []
    side = load_side(files, read, warnings)
    rank = resolve_rank(files, side.info, warnings)
    roles = sorted((r for r in files.files if r == "trace" or r.startswith("trace.")),
                   key=lambda r: int(r.partition(".")[2] or 0))
    ctx = _Context(rank, files.files[roles[0]] if roles else files.root, side, warnings)
    events = [e for role in roles
              for e in decode_trace(files.files[role], read(files.files[role]), warnings)]
    frame, device_pid = _trace_frame(events, ctx) if roles else (_concat([]), None)
    if side.ops and not frame["kind"].isin([COLLECTIVE, P2P]).any():
        why = f"{ctx.where}: no HCCL op rows" if roles else f"{files.root}: no trace, no timeline"
        warnings.append(f"{why}: events are communication.json's ops only")
        ctx.where = files.files["communication"]
        frame = _concat([frame, _comm_only_frame(ctx)])
    return ParsedRank(rank=rank, events=_table(frame, rank), groups=_groups(side, frame),
                      meta=_meta(files, side, device_pid), warnings=warnings)


# --- decoding --------------------------------------------------------------------------------


def decode_trace(member: str, data: bytes, warnings: list[str]) -> list[_Event]:
    """The events of one trace file; a truncated JSON array yields its complete events."""
    if not data.strip():
        raise TraceError(f"{member}: empty file")
    try:
        doc = _DECODER.decode(data)
    except RecursionError:
        raise TraceError(f"{member}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as err:
        raise TraceError(f"{member}: unexpected content: {err}") from None
    except msgspec.DecodeError as err:
        if "truncated" not in str(err):
            raise TraceError(f"{member}: invalid JSON: {err}") from None
        doc = _salvage(member, data)
        warnings.append(f"{member}: truncated; kept the {len(doc)} complete events before the cut")
    return doc.traceEvents if isinstance(doc, _Wrapped) else doc


def _salvage(member: str, data: bytes, tries: int = 8) -> list[_Event]:
    """The complete events of a JSON array cut short: close it after the last whole event."""
    if not data.lstrip().startswith(b"["):
        raise TraceError(f"{member}: truncated, and not a JSON array of events")
    whole = data.rstrip()
    if whole.endswith(b"}"):  # cut right after an event
        with contextlib.suppress(msgspec.DecodeError, RecursionError):
            return msgspec.json.decode(whole + b"]", type=list[_Event])
    window = 1 << 20
    while True:
        tail_start = max(0, len(data) - window)
        cuts = [tail_start + m.start() for m in _BOUNDARY.finditer(data, tail_start)]
        for end in reversed(cuts[-tries:]):
            try:
                return msgspec.json.decode(data[:end + 1] + b"]", type=list[_Event])
            except (msgspec.DecodeError, RecursionError):
                continue
        if tail_start == 0:
            return []
        window *= 8


# --- column helpers --------------------------------------------------------------------------


def _int64(values: Sequence[Scalar]) -> np.ndarray:
    """Integers with NO_INT where missing, UNREADABLE where unreadable."""
    return ints(values)


def _text(values: Sequence[Scalar]) -> pd.Series:
    """Strings with "" where missing, cut to NAME_LIMIT."""
    return pc.fill_null(texts(values), "").to_pandas()


def _args(events: list[_Event], key: str) -> list[Scalar]:
    get = attrgetter(key)
    return [get(e.args or _NO_ARGS) for e in events]


def _local_rank(values: list[Scalar]) -> np.ndarray:
    """Group-local ranks; 4294967295 (a local, on-chip task) and missing -> NO_INT."""
    ranks = _int64(values)
    return np.where((ranks < 0) | (ranks > _INT32_MAX), NO_INT, ranks)


def _notify_ids(values: list[Scalar]) -> pd.Series:
    """Decimal notify ids; "" for the invalid sentinel; legacy hex ids converted."""
    ids = _text(values)
    hexa = ids.str.startswith("0x")
    if hexa.any():
        ids[hexa] = ids[hexa].map(lambda s: str(n) if (n := to_int(s)) >= 0 else "")
    return ids.where(ids != _INVALID_NOTIFY, "")


def _base(events: list[_Event], where: str) -> pd.DataFrame:
    """Name, times, pid and tid of a list of complete events."""
    return pd.DataFrame({
        "name": _text([e.name for e in events]),
        "start_ns": decimal_micros_to_ns([e.ts for e in events]),
        "dur_ns": micros_to_ns([e.dur for e in events]),
        "pid": pd.Series([e.pid for e in events], dtype=object),
        "tid": pd.Series([e.tid for e in events], dtype=object),
    })


def _comm_lane(groups: pd.Series) -> pd.Series:
    """"hccl {group}" ("hccl unknown" when the group is not known)."""
    return "hccl " + groups.where(groups != "", "unknown")


def _thread_lane(frame: pd.DataFrame) -> None:
    frame["lane"] = "thread " + frame["tid"].astype(str)
    frame["lane_kind"] = THREAD


# --- layers ----------------------------------------------------------------------------------


@dataclass
class _Steps:
    """ProfilerStep#N ranges on the host and the host step of each connection id."""

    starts: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray
    by_conn: pd.Series

    @classmethod
    def of(cls, framework: pd.DataFrame) -> _Steps:
        marks = framework.assign(number=_step_numbers(framework["name"]))
        marks = marks[marks["number"] != NO_INT].sort_values("start_ns")
        return cls(marks["start_ns"].to_numpy(np.int64),
                   (marks["start_ns"] + marks["dur_ns"]).to_numpy(np.int64),
                   marks["number"].to_numpy(np.int64), pd.Series(dtype=np.int64))

    def _latest(self, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index of the latest step that began at or before each time, and its number."""
        i = np.searchsorted(self.starts, start, side="right") - 1
        if not len(self.starts):
            return i, np.full(len(start), NO_INT)
        return i, np.where(i >= 0, self.numbers[np.clip(i, 0, None)], NO_INT)

    def host(self, start: np.ndarray) -> np.ndarray:
        """The step whose host range contains each time."""
        i, number = self._latest(start)
        ends = self.ends[np.clip(i, 0, None)] if len(self.ends) else start
        return np.where(start < ends, number, NO_INT)

    def device(self, start: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """Device work: the step of its host launch (by correlation), else the latest step that
        began before it (a device runs behind its host, never ahead)."""
        by_time = pd.Series(self._latest(start)[1])
        return pd.Series(corr).map(self.by_conn).fillna(by_time).to_numpy(np.int64)


def _step_numbers(names: pd.Series) -> np.ndarray:
    """N for "ProfilerStep#N", NO_INT otherwise."""
    numbers = np.full(len(names), NO_INT, dtype=np.int64)
    text = pa.array(names.to_numpy(object), type=pa.string(), from_pandas=True)
    steps = pc.fill_null(pc.starts_with(text, "ProfilerStep#"), False).to_numpy(
        zero_copy_only=False)
    found = names[steps].str.extract(r"^ProfilerStep#(\d+)$")[0]
    numbers[steps] = ints(found.fillna("").tolist())
    return numbers


@dataclass
class _Context:
    """What every layer builder needs about the rank."""

    rank: int
    where: str  # the member the events come from, for messages
    side: Side
    warnings: list[str]
    steps: _Steps | None = None
    threads: dict[tuple[object, object], str] = field(default_factory=dict)
    members: dict[str, GroupInfo] = field(init=False)
    by_step: dict[tuple[int, str], str] = field(init=False)
    by_name: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.members = self.side.groups()
        self.by_step, self.by_name = self.side.op_groups()


def _trace_frame(events: list[_Event], ctx: _Context) -> tuple[pd.DataFrame, int | None]:
    """All rows of the trace, and the pid of its Ascend Hardware layer."""
    layers, device_pid = _split_layers(events, ctx)
    framework = _framework_frame(layers["framework"], layers["marker"], ctx)
    ctx.steps = _Steps.of(framework)
    cann = _cann_frame(layers["cann"], ctx)
    known = cann[(cann["correlation"] != NO_INT) & (cann["step"] != NO_INT)]
    ctx.steps.by_conn = known.drop_duplicates("correlation").set_index("correlation")["step"]
    ops_events, task_events = _split_comm(layers["comm"])
    op_conns = set(_int64(_args(ops_events, "connection_id"))) - {NO_INT}
    device = _device_frame(layers["device"], op_conns, ctx)
    ops = _op_frame(ops_events, device, ctx)
    tasks = _task_frame(task_events, ops, ctx)
    _attach_device_tasks(device, ops)
    _set_peers(ops, tasks, ctx)
    frame = _concat([framework, cann, device, ops, tasks.drop(columns="op")])
    frame["step"] = _all_steps(frame, ctx.steps)
    return frame, device_pid


def _split_layers(events: list[_Event],
                  ctx: _Context) -> tuple[dict[str, list[_Event]], int | None]:
    """Complete events by layer kind (thread names go to ctx), and the device layer's pid."""
    names: dict[object, str] = {}
    phases = list(map(_PH, events))
    by_pid = _by_pid(list(compress(events, map("X".__eq__, phases))))
    for e in compress(events, map("M".__eq__, phases)):
        if e.args is not None and e.name in ("process_name", "thread_name"):
            if e.name == "process_name":
                names[e.pid] = str(e.args.name)
            else:
                ctx.threads[(e.pid, e.tid)] = cut(str(e.args.name), LABEL_LIMIT)
    layers: dict[str, list[_Event]] = defaultdict(list)
    unknown, guessed, device_pid = set(), [], None
    for pid, evs in by_pid.items():
        name = names.get(pid)
        kind = _layer_kind(name) if name is not None else _guess_layer(evs[0])
        if name is None:
            guessed.append(f"{pid} as {kind}")
        if kind == "unknown":
            unknown.add(name)
        elif kind != "skip":
            layers[kind].extend(evs)
        if kind == "device" and isinstance(pid, int):
            device_pid = pid
    if guessed:
        ctx.warnings.append(f"{ctx.where}: no process_name for pids {', '.join(guessed)} "
                            "(layer inferred from the events)")
    if unknown:
        ctx.warnings.append(f"{ctx.where}: skipped unknown layers {sorted(unknown)}")
    return layers, device_pid


def _by_pid(events: list[_Event]) -> dict[object, list[_Event]]:
    """Events grouped by pid (pids in order of appearance, events in file order)."""
    pids = list(map(_PID, events))
    distinct = dict.fromkeys(pids)
    if len(distinct) > _MAX_PASSES:  # one pass per pid would cost more than a dict loop
        grouped: dict[object, list[_Event]] = defaultdict(list)
        for pid, e in zip(pids, events, strict=True):
            grouped[pid].append(e)
        return grouped
    return {pid: list(compress(events, map(eq, pids, repeat(pid)))) for pid in distinct}


def _layer_kind(process: str) -> str:
    for kind, names in (("device", DEVICE_LAYERS), ("comm", COMM_LAYERS), ("cann", CANN_LAYERS),
                        ("marker", MARKER_LAYERS), ("framework", FRAMEWORK_LAYERS),
                        ("skip", SKIPPED_LAYERS)):
        if process in names:
            return kind
    return "unknown"


def _guess_layer(event: _Event) -> str:
    """The layer kind of an unnamed process, from one of its events."""
    args = event.args or _NO_ARGS
    if args.task_type is not None:
        return "device"
    if args.small_task_type is not None or parse_hccl_name(event.name):
        return "comm"
    if "@" in event.name and args.connection_id is not None:
        return "cann"
    return "framework"


def _split_comm(events: list[_Event]) -> tuple[list[_Event], list[_Event]]:
    """HCCL op rows (no "task type" arg) and their small tasks."""
    ops, tasks = [], []
    for e in events:
        (ops if (e.args or _NO_ARGS).small_task_type is None else tasks).append(e)
    return ops, tasks


def _framework_frame(framework: list[_Event], markers: list[_Event],
                     ctx: _Context) -> pd.DataFrame:
    """Framework ops (host) and annotations (marker): ProfilerStep#N, user annotations, scope
    and mstx layers."""
    events = framework + markers
    frame = _base(events, ctx.where)
    _thread_lane(frame)
    marker = (frame["name"].str.startswith("ProfilerStep#")
              | _text([e.cat for e in events]).eq("user_annotation")
              | (np.arange(len(events)) >= len(framework)))
    frame["kind"] = np.where(marker, MARKER, HOST)
    return frame


def _cann_frame(events: list[_Event], ctx: _Context) -> pd.DataFrame:
    frame = _base(events, ctx.where)
    _thread_lane(frame)
    frame["kind"] = HOST
    frame["correlation"] = _int64(_args(events, "connection_id"))
    frame["step"] = ctx.steps.host(frame["start_ns"].to_numpy())
    return frame


def _device_frame(events: list[_Event], op_conns: set[int], ctx: _Context) -> pd.DataFrame:
    """Device tasks: wait / record / memcpy / comm_task (subtask of an HCCL op) / compute."""
    frame = _base(events, ctx.where)
    stream = _int64(_args(events, "physic_stream"))
    for fallback in (_int64(_args(events, "stream_id")), _int64(frame["tid"].tolist())):
        stream = np.where(stream == NO_INT, fallback, stream)
    frame["stream"] = stream
    frame["lane"] = "stream " + frame["stream"].astype(str)
    frame["lane_kind"] = STREAM
    frame["task_type"] = tt = _text(_args(events, "task_type"))
    frame["correlation"] = _int64(_args(events, "connection_id"))
    size = _int64(_args(events, "data_size"))
    frame["bytes"] = np.where(size == NO_INT, _int64(_args(events, "size_b")), size)
    name = frame["name"]
    frame["kind"] = np.select(
        [tt.eq("EVENT_WAIT_SQE") | name.eq("EVENT_WAIT"),
         tt.eq("EVENT_RECORD_SQE") | name.eq("EVENT_RECORD"),
         frame["correlation"].isin(op_conns),
         name.eq("MEMCPY_ASYNC") | tt.str.contains("DMA", regex=False)],
        [WAIT, RECORD, COMM_TASK, MEMCPY], COMPUTE)
    return frame


def _op_frame(events: list[_Event], device: pd.DataFrame, ctx: _Context) -> pd.DataFrame:
    """HCCL op rows: collective / p2p with group, instance number, device stream and bytes."""
    frame = _base(events, ctx.where)
    frame["correlation"] = _int64(_args(events, "connection_id"))
    frame["dtype"] = _text(_args(events, "data_type"))
    count = _int64(_args(events, "count"))
    width = frame["dtype"].map(_DTYPE_BYTES).fillna(0).to_numpy(np.int64)
    frame["bytes"] = np.where((count >= 0) & (width > 0), count * width, NO_INT)
    tasks = device[device["kind"] == COMM_TASK].drop_duplicates("correlation")
    stream = frame["correlation"].map(tasks.set_index("correlation")["stream"])
    frame["stream"] = stream.fillna(NO_INT).astype(np.int64)
    frame["step"] = ctx.steps.device(frame["start_ns"].to_numpy(), frame["correlation"].to_numpy())
    parsed = [parse_hccl_name(n) for n in frame["name"]]
    frame["name"] = frame["name"].str.split("@").str[0]
    frame["seq"] = [p.index if p else NO_INT for p in parsed]
    comm = [p.comm if p else comm_type(n) for p, n in zip(parsed, frame["name"], strict=True)]
    frame["comm"] = pd.Series(comm, dtype=str)
    frame["kind"] = pd.Series([comm_kind(c) for c in comm], dtype=str)
    threads = [ctx.threads.get((p, t), "") for p, t in zip(frame["pid"], frame["tid"], strict=True)]
    frame["group"] = pd.Series([_op_group(ctx, *row) for row in zip(
        frame["name"], parsed, frame["step"], threads, strict=True)], dtype=str)
    unknown = int((frame["group"] == "").sum())
    if unknown:
        ctx.warnings.append(f"{ctx.where}: {unknown} HCCL ops with no known group")
    frame["lane"] = _comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    frame["rank_size"] = _int64(_args(events, "rank_size"))
    return frame


def _op_group(ctx: _Context, name: str, parsed: HcclName | None, step: int,
              thread: str) -> str:
    """An op's full group hash: its own "@group", communication.json (by step, then by name
    alone), the one own group with that 3-digit tail, or the HCCL thread's name."""
    if parsed and parsed.group:
        return parsed.group
    if (step, name) in ctx.by_step:
        return ctx.by_step[(step, name)]
    seen = ctx.by_name.get(name, set())
    if len(seen) == 1:
        return next(iter(seen))
    tail = parsed.group_tail if parsed else ""
    mine = [g for g in ctx.members if tail and g.endswith(tail)]
    if len(mine) == 1:
        return mine[0]
    match = _GROUP_THREAD.fullmatch(thread)
    candidates = (match[1], double_hash(match[1])) if match and tail else ()
    return next((c for c in candidates if len(c) > 3 and c.endswith(tail)), "")


def _task_frame(events: list[_Event], ops: pd.DataFrame, ctx: _Context) -> pd.DataFrame:
    """HCCL small tasks on `Plane k` threads, each attached to the op row that contains it."""
    frame = _base(events, ctx.where)
    frame["kind"] = COMM_TASK
    frame["lane_kind"] = COMM
    frame["task_type"] = _text(_args(events, "small_task_type"))
    frame["notify_id"] = _notify_ids(_args(events, "notify_id"))
    frame["src_rank"] = _local_rank(_args(events, "src_rank"))
    frame["dst_rank"] = _local_rank(_args(events, "dst_rank"))
    frame["bytes"] = _int64(_args(events, "size_byte"))
    frame["block"] = _blocks(_int64(frame["tid"].tolist()), ops, ctx)
    frame["op"] = _containing_op(frame, ops)
    own = frame["op"].to_numpy() >= 0
    pick = np.clip(frame["op"].to_numpy(), 0, None)
    for column, default in (("group", ""), ("seq", NO_INT), ("correlation", NO_INT),
                            ("step", NO_INT)):
        values = ops[column].to_numpy()[pick] if len(ops) else default
        frame[column] = np.where(own, values, default)
    by_block = ops.assign(block=_int64(ops["tid"].tolist())).groupby("block")["group"].max()
    frame["group"] = frame["group"].where(own, frame["block"].map(by_block).fillna(""))
    plane = [_plane(ctx.threads.get((p, t), ""), t, b)
             for p, t, b in zip(frame["pid"], frame["tid"], frame["block"], strict=True)]
    frame["lane"] = _comm_lane(frame["group"]) + " plane " + pd.Series(plane, dtype=str)
    return frame.drop(columns="block")


def _blocks(tids: np.ndarray, ops: pd.DataFrame, ctx: _Context) -> np.ndarray:
    """The op-row thread ("Group … Communication") each plane thread belongs to: msprof numbers
    a group's planes right after its op thread."""
    named = [t for (_, t), name in ctx.threads.items() if _GROUP_THREAD.fullmatch(name)]
    op_tids = np.unique(np.concatenate([_int64(ops["tid"].tolist()), _int64(named)]))
    op_tids = op_tids[op_tids != NO_INT]
    if not len(op_tids):
        return np.zeros(len(tids), dtype=np.int64)
    return op_tids[np.clip(np.searchsorted(op_tids, tids, side="right") - 1, 0, None)]


def _containing_op(tasks: pd.DataFrame, ops: pd.DataFrame) -> pd.Series:
    """Row index in `ops` of the op whose [start, end] contains each task on its thread block."""
    if ops.empty or tasks.empty:
        return pd.Series(NO_INT, index=tasks.index, dtype=np.int64)
    right = pd.DataFrame({"start_ns": ops["start_ns"], "end": ops["start_ns"] + ops["dur_ns"],
                          "block": _int64(ops["tid"].tolist()), "pid": ops["pid"].astype(str),
                          "op": np.arange(len(ops))})
    left = pd.DataFrame({"start_ns": tasks["start_ns"], "block": tasks["block"],
                         "pid": tasks["pid"].astype(str), "row": np.arange(len(tasks))})
    merged = pd.merge_asof(left.sort_values("start_ns"), right.sort_values("start_ns"),
                           on="start_ns", by=["pid", "block"]).sort_values("row")
    inside = merged["start_ns"].to_numpy() <= merged["end"].to_numpy()
    return pd.Series(np.where(inside, merged["op"].fillna(NO_INT), NO_INT).astype(np.int64),
                     index=tasks.index)


def _plane(thread: str, tid: int, block: int) -> int:
    match = _PLANE_THREAD.fullmatch(thread)
    return int(match[1]) if match else to_int(tid) - int(block) - 1


def _attach_device_tasks(device: pd.DataFrame, ops: pd.DataFrame) -> None:
    """Device subtasks of an HCCL op (same connection id) take its group and instance number."""
    owner = ops.drop_duplicates("correlation").set_index("correlation")
    sub = (device["kind"] == COMM_TASK).to_numpy()
    found = owner.reindex(device["correlation"].to_numpy())
    device["group"] = np.where(sub, found["group"].fillna(""), "")
    device["seq"] = np.where(sub, found["seq"].fillna(NO_INT), NO_INT).astype(np.int64)


def _set_peers(ops: pd.DataFrame, tasks: pd.DataFrame, ctx: _Context) -> None:
    """P2P ops: the peer from a 2-member group, else from their Notify tasks' dst rank."""
    notify = tasks[tasks["task_type"].str.startswith("Notify") & (tasks["op"] >= 0)
                   & (tasks["dst_rank"] >= 0) & (tasks["dst_rank"] != tasks["src_rank"])]
    pairs = notify.drop_duplicates(["op", "src_rank", "dst_rank"])
    single = pairs[~pairs["op"].duplicated(keep=False)]
    links = {op: (s, d) for op, s, d in zip(single["op"], single["src_rank"], single["dst_rank"],
                                             strict=True)}
    peers = [_peer(ctx, group, links.get(i)) if kind == P2P else (NO_INT,) * 3
             for i, (kind, group) in enumerate(zip(ops["kind"], ops["group"], strict=True))]
    ops["peer"], ops["src_rank"], ops["dst_rank"] = np.array(peers, np.int64).reshape(-1, 3).T


def _peer(ctx: _Context, group: str, link: tuple[int, int] | None) -> tuple[int, int, int]:
    """(global peer, local src, local dst) of a P2P op in `group`."""
    info = ctx.members.get(group)
    ranks = sorted(info.ranks) if info else []
    src, dst = link or (NO_INT, NO_INT)
    if len(ranks) == 2 and ctx.rank in ranks:
        return ranks[1 - ranks.index(ctx.rank)], src, dst
    return (ranks[dst] if 0 <= dst < len(ranks) else NO_INT), src, dst


def _comm_only_frame(ctx: _Context) -> pd.DataFrame:
    """communication.json ops as events, for a rank without a timeline of them."""
    ops = ctx.side.ops
    parsed = [parse_hccl_name(op.name) for op in ops]
    comm = [p.comm if p else comm_type(op.name) for p, op in zip(parsed, ops, strict=True)]
    kind = [comm_kind(c) for c in comm]
    peers = [_peer(ctx, op.group, op.link) if k == P2P else (NO_INT,) * 3
             for op, k in zip(ops, kind, strict=True)]
    frame = pd.DataFrame({
        "name": [op.name for op in ops],
        "start_ns": decimal_micros_to_ns([op.start_us for op in ops]),
        "dur_ns": micros_to_ns([op.elapse_ms for op in ops], unit_us=1e3),
        "group": [op.group for op in ops],
        "seq": [p.index if p else NO_INT for p in parsed],
        "comm": comm, "kind": kind, "step": [op.step for op in ops],
    })
    frame["peer"], frame["src_rank"], frame["dst_rank"] = np.array(peers, np.int64).reshape(-1, 3).T
    frame["lane"] = _comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    return frame


# --- assembly --------------------------------------------------------------------------------


def _complete(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every EVENTS column (defaults where absent), so no concat goes via float."""
    for column in schema.EVENTS:
        if column.name not in frame:
            frame[column.name] = "" if pa.types.is_string(column.type) else NO_INT
    return frame


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([_complete(f) for f in frames if len(f)] or [_complete(pd.DataFrame())],
                     ignore_index=True)


def _all_steps(frame: pd.DataFrame, steps: _Steps) -> np.ndarray:
    """The step column: kept where set, else host rows by time, device rows by launch or time."""
    have = frame["step"].to_numpy(np.int64)
    start = frame["start_ns"].to_numpy(np.int64)
    corr = frame["correlation"].to_numpy(np.int64)
    guess = np.where(frame["lane_kind"] == THREAD, steps.host(start), steps.device(start, corr))
    marks = _step_numbers(frame["name"])
    guess = np.where(marks != NO_INT, marks, guess)
    return np.where(have != NO_INT, have, guess)


def _table(frame: pd.DataFrame, rank: int) -> pa.Table:
    """The EVENTS table, sorted by start time."""
    frame = frame.sort_values("start_ns", kind="stable", ignore_index=True).assign(rank=rank)
    columns = {c.name: frame[c.name].to_numpy() if pa.types.is_integer(c.type)
               else pa.array(frame[c.name], type=c.type) for c in schema.EVENTS}
    return schema.events_table(columns, len(frame))


def _groups(side: Side, frame: pd.DataFrame) -> list[GroupInfo]:
    """This rank's groups: `parallel_group_info`, plus groups seen only in op names, whose size
    comes from the op's `rank_size`, else is at least the group-local ranks its HCCL tasks and
    communication_matrix.json links name."""
    groups = side.groups()
    seen = set(frame["group"].unique())
    stated = _stated_sizes(frame)
    local = _local_ranks(frame, side)
    for group in sorted(seen | {op.group for op in side.ops}):
        if group and group not in groups:
            size, source = stated.get(group, 0), "rank_size of its HCCL ops"
            if not size and local.get(group):
                size = max(local[group]) + 1
                source = f"at least: HCCL group-local ranks up to {size - 1} named"
            groups[group] = GroupInfo(group=group, source=source if size else "op name",
                                      size=size)
    return list(groups.values())


def _stated_sizes(frame: pd.DataFrame) -> dict[str, int]:
    """Group -> the `rank_size` its HCCL op events state (newer CANN), when any does."""
    if "rank_size" not in frame:
        return {}
    sizes = frame.loc[frame["rank_size"].fillna(NO_INT) > 0, ["group", "rank_size"]]
    return {str(g): int(s) for g, s in sizes.groupby("group")["rank_size"].max().items() if g}


def _local_ranks(frame: pd.DataFrame, side: Side) -> dict[str, set[int]]:
    """Group -> the group-local ranks its HCCL tasks (src / dst rank) and matrix links name."""
    found: dict[str, set[int]] = {g: set(r) for g, r in side.local_ranks.items()}
    tasks = frame[frame["group"] != ""]
    for column in ("src_rank", "dst_rank"):
        valid = tasks[tasks[column] >= 0]
        for group, ranks in valid.groupby("group")[column]:
            found.setdefault(str(group), set()).update(int(r) for r in ranks.unique())
    return found


def _meta(files: RankFiles, side: Side, device_pid: int | None) -> dict[str, object]:
    """RANKS columns (and communication.json's per-op time breakdown under "comm_times")."""
    versions = ";".join(f"{k.removesuffix('_version')}={v}" for k, v in side.info.items()
                        if k.endswith("_version") and v)
    device = side.device if side.device is not None else (
        device_pid & 0x1F if device_pid and device_pid >= 1 << 10 else None)
    meta: dict[str, object] = {
        "framework": _framework(files, side), "format": "ascend", "version": versions,
        "device": f"npu:{device}" if device is not None else "", "backend": "hccl",
        "clock_base_ns": 0, "comm_times": [op.times() for op in side.ops],
    }
    if side.world_size() is not None:
        meta["world_size"] = side.world_size()
    return meta


def _framework(files: RankFiles, side: Side) -> str:
    root = files.root.rstrip("/").rsplit("/", 1)[-1]
    if root.endswith("_ascend_pt") or "torch_npu_version" in side.info:
        return "torch_npu"
    if root.endswith("_ascend_ms") or any(k.startswith(("ms_", "mindspore")) for k in side.info):
        return "mindspore"
    if root.startswith("PROF_") or any("mindstudio_profiler_output" in m
                                       for m in files.files.values()):
        return "msprof"
    return ""


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name=ascend_layout.NAME, looked_for=ascend_layout.LOOKED_FOR, parse=parse,
                wants=ascend_layout.wants, sniff=ascend_layout.sniff, find=ascend_layout.find,
                encloses=ascend_layout.encloses)
