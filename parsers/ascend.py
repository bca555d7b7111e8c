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
from itertools import compress, repeat
from operator import attrgetter, eq

import msgspec
import numpy as np
import pandas as pd

from parsers import ascend_layout, ascend_memory
from parsers.ascend_comm import load_side, resolve_rank
from parsers.ascend_csv import kernel_frame
from parsers.ascend_layout import recognizes as recognizes  # the format's test, re-exported
from parsers.ascend_rows import (
    GROUP_THREAD,
    Context,
    Scalar,
    Steps,
    all_steps,
    attach_device_tasks,
    comm_lane,
    comm_only_frame,
    concat,
    device_kinds,
    device_lane,
    device_step_marks,
    groups,
    hccl_names,
    local_ranks,
    meta,
    notify_ids,
    op_bytes,
    op_group,
    op_streams,
    set_peers,
    table,
    texts,
    thread_lane,
)
from parsers.base import Format, ParsedRank, RankFiles, Reader, TraceError
from parsers.classify import parse_hccl_name
from parsers.values import LABEL_LIMIT, cut, decimal_micros_to_ns, ints, micros_to_ns, to_int
from tracegraph.schema import (
    COLLECTIVE,
    COMM,
    COMM_TASK,
    HOST,
    MARKER,
    NO_INT,
    P2P,
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
_PLANE_THREAD = re.compile(r"Plane (\d+)")


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
STAGE_SLACK = 0.01  # a step's device span may differ from step_trace_time's Stage by 1%
_NO_ARGS = _Args()
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One rank's Ascend profile as normalized events, groups and rank metadata: from its trace,
    else from its kernel table, plus communication.json's ops where neither has HCCL op rows."""
    warnings: list[str] = []
    side = load_side(files, read, warnings)
    rank = resolve_rank(files, side.info, warnings)
    roles = sorted((r for r in files.files if r == "trace" or r.startswith("trace.")),
                   key=lambda r: int(r.partition(".")[2] or 0))
    ctx = Context(rank, files.files[roles[0]] if roles else files.root, side, warnings)
    events = [e for role in roles
              for e in decode_trace(files.files[role], read(files.files[role]), warnings)]
    frame, device_pid = _trace_frame(events, ctx) if roles else (concat([]), None)
    if not roles and "kernels" in files.files:
        frame = concat([kernel_frame(files.files["kernels"], read, ctx)])
    if side.ops and not frame["kind"].isin([COLLECTIVE, P2P]).any():
        if roles:
            warnings.append(f"{ctx.where}: no HCCL op rows: communication ops from "
                            "communication.json")
        elif "kernels" not in files.files:
            warnings.append(f"{files.root}: no trace, no timeline: events are "
                            "communication.json's ops only")
        ctx.where = files.files["communication"]
        frame = concat([frame, comm_only_frame(ctx)])
    marks = device_step_marks(frame)
    gaps = _span_gaps(marks, side.stages_us, files.files.get("kernels", files.root))
    warnings += [f"{gap}: the table is incomplete, step times and stragglers read from it are "
                 "not reliable" for gap in gaps]
    frame = concat([frame, marks])
    found = meta(files, side, _pid_device(device_pid), layers=ctx.layers)
    return ParsedRank(rank=rank, events=table(frame, rank), groups=groups(side, frame),
                      meta=found | ({"incomplete": "; ".join(gaps)} if gaps else {}),
                      warnings=warnings, memory=ascend_memory.memory(files, read, rank, warnings))


def _span_gaps(marks: pd.DataFrame, stages_us: dict[int, float], where: str) -> list[str]:
    """Where a step's device tasks span less (or more) than step_trace_time.csv's Stage for it:
    the kernel table lacks rows, and step times read from it are not the step's."""
    gaps = []
    for step, dur in zip(marks["step"], marks["dur_ns"], strict=True):
        stage = stages_us.get(int(step))
        if stage is not None and abs(dur / 1e3 - stage) > max(STAGE_SLACK * stage, 1.0):
            gaps.append(f"{where}: its tasks of step {step} span {dur / 1e6:.3f} ms, "
                        f"step_trace_time.csv's Stage {stage / 1e3:.3f} ms")
    return gaps


def _pid_device(pid: int | None) -> int | None:
    """The device id in the low 5 bits of msprof's layer pid (`(pid << 10) | (layer << 5) |
    device`), when the pid has that form."""
    return pid & 0x1F if pid and pid >= 1 << 10 else None


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


def _args(events: list[_Event], key: str) -> list[Scalar]:
    get = attrgetter(key)
    return [get(e.args or _NO_ARGS) for e in events]


def _base(events: list[_Event], where: str) -> pd.DataFrame:
    """Name, times, pid and tid of a list of complete events."""
    return pd.DataFrame({
        "name": texts([e.name for e in events]),
        "start_ns": decimal_micros_to_ns([e.ts for e in events]),
        "dur_ns": micros_to_ns([e.dur for e in events]),
        "pid": pd.Series([e.pid for e in events], dtype=object),
        "tid": pd.Series([e.tid for e in events], dtype=object),
    })


# --- layers ----------------------------------------------------------------------------------


def _trace_frame(events: list[_Event], ctx: Context) -> tuple[pd.DataFrame, int | None]:
    """All rows of the trace, and the pid of its Ascend Hardware layer."""
    layers, device_pid = _split_layers(events, ctx)
    framework = _framework_frame(layers["framework"], layers["marker"], ctx)
    ctx.steps = Steps.of(framework)
    cann = _cann_frame(layers["cann"], ctx)
    ctx.steps.link(cann)
    ops_events, task_events = _split_comm(layers["comm"])
    op_conns = set(ints(_args(ops_events, "connection_id"))) - {NO_INT}
    device = _device_frame(layers["device"], op_conns, ctx)
    ops = _op_frame(ops_events, device, ctx)
    tasks = _task_frame(task_events, ops, ctx)
    attach_device_tasks(device, ops)
    set_peers(ops, tasks, ctx)
    frame = concat([framework, cann, device, ops, tasks.drop(columns="op")])
    frame["step"] = all_steps(frame, ctx.steps)
    return frame, device_pid


def _split_layers(events: list[_Event],
                  ctx: Context) -> tuple[dict[str, list[_Event]], int | None]:
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
    ctx.layers = set(names.values())
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
                     ctx: Context) -> pd.DataFrame:
    """Framework ops (host) and annotations (marker): ProfilerStep#N, user annotations, scope
    and mstx layers."""
    events = framework + markers
    frame = _base(events, ctx.where)
    thread_lane(frame)
    marker = (frame["name"].str.startswith("ProfilerStep#")
              | texts([e.cat for e in events]).eq("user_annotation")
              | (np.arange(len(events)) >= len(framework)))
    frame["kind"] = np.where(marker, MARKER, HOST)
    return frame


def _cann_frame(events: list[_Event], ctx: Context) -> pd.DataFrame:
    frame = _base(events, ctx.where)
    thread_lane(frame)
    frame["kind"] = HOST
    frame["correlation"] = ints(_args(events, "connection_id"))
    frame["step"] = ctx.steps.host(frame["start_ns"].to_numpy())
    return frame


def _device_frame(events: list[_Event], op_conns: set[int], ctx: Context) -> pd.DataFrame:
    """Device tasks: wait / record / memcpy / comm_task (subtask of an HCCL op) / compute."""
    frame = _base(events, ctx.where)
    stream = ints(_args(events, "physic_stream"))
    for fallback in (ints(_args(events, "stream_id")), ints(frame["tid"].tolist())):
        stream = np.where(stream == NO_INT, fallback, stream)
    frame["stream"] = stream
    device_lane(frame)
    frame["task_type"] = texts(_args(events, "task_type"))
    frame["correlation"] = ints(_args(events, "connection_id"))
    size = ints(_args(events, "data_size"))
    frame["bytes"] = np.where(size == NO_INT, ints(_args(events, "size_b")), size)
    frame["kind"] = device_kinds(frame["name"], frame["task_type"],
                                 frame["correlation"].to_numpy(), op_conns)
    return frame


def _op_frame(events: list[_Event], device: pd.DataFrame, ctx: Context) -> pd.DataFrame:
    """HCCL op rows: collective / p2p with group, instance number, device stream and bytes."""
    frame = _base(events, ctx.where)
    frame["correlation"] = ints(_args(events, "connection_id"))
    frame["dtype"] = texts(_args(events, "data_type"))
    frame["bytes"] = op_bytes(ints(_args(events, "count")), frame["dtype"])
    op_streams(frame, device)
    frame["step"] = ctx.steps.device(frame["start_ns"].to_numpy(), frame["correlation"].to_numpy())
    parsed = hccl_names(frame)
    threads = [ctx.threads.get((p, t), "") for p, t in zip(frame["pid"], frame["tid"], strict=True)]
    frame["group"] = pd.Series([op_group(ctx, *row) for row in zip(
        frame["name"], parsed, frame["step"], threads, strict=True)], dtype=str)
    unknown = int((frame["group"] == "").sum())
    if unknown:
        ctx.warnings.append(f"{ctx.where}: {unknown} HCCL ops with no known group")
    frame["lane"] = comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    frame["rank_size"] = ints(_args(events, "rank_size"))
    return frame


def _task_frame(events: list[_Event], ops: pd.DataFrame, ctx: Context) -> pd.DataFrame:
    """HCCL small tasks on `Plane k` threads, each attached to the op row that contains it."""
    frame = _base(events, ctx.where)
    frame["kind"] = COMM_TASK
    frame["lane_kind"] = COMM
    frame["task_type"] = texts(_args(events, "small_task_type"))
    frame["notify_id"] = notify_ids(_args(events, "notify_id"))
    frame["src_rank"] = local_ranks(_args(events, "src_rank"))
    frame["dst_rank"] = local_ranks(_args(events, "dst_rank"))
    frame["bytes"] = ints(_args(events, "size_byte"))
    frame["block"] = _blocks(ints(frame["tid"].tolist()), ops, ctx)
    frame["op"] = _containing_op(frame, ops)
    own = frame["op"].to_numpy() >= 0
    pick = np.clip(frame["op"].to_numpy(), 0, None)
    for column, default in (("group", ""), ("seq", NO_INT), ("correlation", NO_INT),
                            ("step", NO_INT)):
        values = ops[column].to_numpy()[pick] if len(ops) else default
        frame[column] = np.where(own, values, default)
    by_block = ops.assign(block=ints(ops["tid"].tolist())).groupby("block")["group"].max()
    frame["group"] = frame["group"].where(own, frame["block"].map(by_block).fillna(""))
    plane = [_plane(ctx.threads.get((p, t), ""), t, b)
             for p, t, b in zip(frame["pid"], frame["tid"], frame["block"], strict=True)]
    frame["lane"] = comm_lane(frame["group"]) + " plane " + pd.Series(plane, dtype=str)
    return frame.drop(columns="block")


def _blocks(tids: np.ndarray, ops: pd.DataFrame, ctx: Context) -> np.ndarray:
    """The op-row thread ("Group … Communication") each plane thread belongs to: msprof numbers
    a group's planes right after its op thread."""
    named = [t for (_, t), name in ctx.threads.items() if GROUP_THREAD.fullmatch(name)]
    op_tids = np.unique(np.concatenate([ints(ops["tid"].tolist()), ints(named)]))
    op_tids = op_tids[op_tids != NO_INT]
    if not len(op_tids):
        return np.zeros(len(tids), dtype=np.int64)
    return op_tids[np.clip(np.searchsorted(op_tids, tids, side="right") - 1, 0, None)]


def _containing_op(tasks: pd.DataFrame, ops: pd.DataFrame) -> pd.Series:
    """Row index in `ops` of the op whose [start, end] contains each task on its thread block."""
    if ops.empty or tasks.empty:
        return pd.Series(NO_INT, index=tasks.index, dtype=np.int64)
    right = pd.DataFrame({"start_ns": ops["start_ns"], "end": ops["start_ns"] + ops["dur_ns"],
                          "block": ints(ops["tid"].tolist()), "pid": ops["pid"].astype(str),
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


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name=ascend_layout.NAME, looked_for=ascend_layout.LOOKED_FOR, parse=parse,
                wants=ascend_layout.wants, sniff=ascend_layout.sniff, find=ascend_layout.find,
                encloses=ascend_layout.encloses)
