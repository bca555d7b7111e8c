"""Ascend profiles (torch_npu `*_ascend_pt`, MindSpore `*_ascend_ms`, msprof `PROF_*`) -> EVENTS.

The timeline (trace_view.json / msprof_*.json) is read a slice at a time into columns
(`parsers.ascend_timeline`); its rows are built layer by layer, the big layers (framework, CANN,
device) CHUNK_ROWS rows at a time with pyarrow / numpy / pandas, and each chunk goes into the
rank's table at once (`parsers.ascend_rows.Rows`): a rank's peak grows with its table, not with
its file. Layers are told apart by their `process_name` metadata, never by pid arithmetic (by the
events' content when a truncated file lost its metadata). communication.json gives each HCCL op
its full group; a rank without a timeline gets its communication ops from that file alone.
Which folders are Ascend profiles, and which of their files play which role, is
`parsers.ascend_layout`'s call.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pandas as pd

from parsers import ascend_layout, ascend_memory
from parsers.ascend_comm import load_side, resolve_rank
from parsers.ascend_csv import kernel_frame
from parsers.ascend_layout import recognizes as recognizes  # the format's test, re-exported
from parsers.ascend_rows import (
    CHUNK_ROWS,
    GROUP_THREAD,
    Context,
    Rows,
    Steps,
    attach_device_tasks,
    comm_lane,
    comm_only_frame,
    device_kinds,
    device_lane,
    groups,
    hccl_names,
    local_ranks,
    meta,
    notify_ids,
    op_bytes,
    op_group,
    op_streams,
    set_peers,
    step_numbers,
    stepped,
    thread_lane,
)
from parsers.ascend_timeline import NO_ARGS, Fields, Timeline, read_timeline
from parsers.base import Format, ParsedRank, RankFiles, Reader
from parsers.classify import parse_hccl_name
from parsers.values import ints, to_int
from tracegraph.heap import hand_back
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
STAGE_SLACK = 0.01  # a step's device span may differ from step_trace_time's Stage by 1%


def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One rank's Ascend profile as normalized events, groups and rank metadata: from its trace,
    else from its kernel table, plus communication.json's ops where neither has HCCL op rows."""
    warnings: list[str] = []
    side = load_side(files, read, warnings)
    rank = resolve_rank(files, side.info, warnings)
    roles = sorted((r for r in files.files if r == "trace" or r.startswith("trace.")),
                   key=lambda r: int(r.partition(".")[2] or 0))
    ctx = Context(rank, files.files[roles[0]] if roles else files.root, side, warnings)
    rows, device_pid, cut = Rows(), None, []
    if roles:
        device_pid = _trace_rows(read_timeline([files.files[role] for role in roles], read,
                                               warnings, cut), ctx, rows)
    elif "kernels" in files.files:
        rows.add(kernel_frame(files.files["kernels"], read, ctx))
    if side.ops and not rows.kinds & {COLLECTIVE, P2P}:
        if roles:
            warnings.append(f"{ctx.where}: no HCCL op rows: communication ops from "
                            "communication.json")
        elif "kernels" not in files.files:
            warnings.append(f"{files.root}: no trace, no timeline: events are "
                            "communication.json's ops only")
        ctx.where = files.files["communication"]
        rows.add(comm_only_frame(ctx))
    marks = rows.step_marks()
    gaps = _span_gaps(marks, side.stages_us, files.files.get("kernels", files.root))
    warnings += [f"{gap}: the table is incomplete, step times and stragglers read from it are "
                 "not reliable" for gap in gaps]
    incomplete = gaps + cut  # a truncated timeline lost the events after its cut
    rows.add(marks)
    found = meta(files, side, _pid_device(device_pid), layers=ctx.layers)
    return ParsedRank(rank=rank, events=rows.table(rank), groups=groups(side, rows.grouped()),
                      meta=found | ({"incomplete": "; ".join(incomplete)} if incomplete else {}),
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


def _chunks(rows: np.ndarray) -> Iterator[np.ndarray]:
    for lo in range(0, len(rows), CHUNK_ROWS):
        yield rows[lo: lo + CHUNK_ROWS]


# --- layers ----------------------------------------------------------------------------------


def _trace_rows(timeline: Timeline, ctx: Context, rows: Rows) -> int | None:
    """Every row of the trace, into `rows` (framework, CANN, device, HCCL ops, their tasks),
    the timeline split by layer first and each layer let go once taken; the pid of its Ascend
    Hardware layer."""
    layers, device_pid = _split_layers(timeline, ctx)
    marker = layers.pop("marker")
    framework = np.concatenate([layers.pop("framework"), marker])
    marked = np.arange(len(framework)) >= len(framework) - len(marker)
    parts = timeline.split({"framework": framework, **layers})
    del timeline, layers
    hand_back()
    _framework_rows(parts.pop("framework"), marked, ctx, rows)
    hand_back()
    _cann_rows(parts.pop("cann"), ctx, rows)
    hand_back()
    comm, device = parts.pop("comm"), parts.pop("device")
    ops_rows, task_rows = _split_comm(comm)
    op_conns = set(comm.ints("connection_id", ops_rows).tolist()) - {NO_INT}
    every = np.arange(device.n)
    launched = every[np.isin(device.ints("connection_id", every), list(op_conns))]
    ops = _op_frame(comm, ops_rows, _device_frame(device, launched, op_conns), ctx)
    tasks = _task_frame(comm, task_rows, ops, ctx)
    del comm
    set_peers(ops, tasks, ctx)
    _device_rows(device, op_conns, ops, ctx, rows)
    del device
    hand_back()
    rows.add(stepped(ops, ctx.steps))
    rows.add(stepped(tasks.drop(columns="op"), ctx.steps))
    return device_pid


def _framework_rows(layer: Timeline, marked: np.ndarray, ctx: Context, rows: Rows) -> None:
    """The framework and marker layers' rows (`marked`: those of a marker layer), into `rows`;
    the host steps they hold, to `ctx.steps`."""
    ctx.steps = Steps.of(_step_rows(layer))
    for part in _chunks(np.arange(layer.n)):
        rows.add(stepped(_framework_frame(layer, part, marked[part]), ctx.steps))


def _device_rows(layer: Timeline, op_conns: set[int], ops: pd.DataFrame, ctx: Context,
                 rows: Rows) -> None:
    """The device layer's rows, into `rows`; those of an HCCL op take its group and number."""
    for part in _chunks(np.arange(layer.n)):
        frame = _device_frame(layer, part, op_conns)
        attach_device_tasks(frame, ops)
        rows.add(stepped(frame, ctx.steps))


def _cann_rows(layer: Timeline, ctx: Context, rows: Rows) -> None:
    """The CANN layer's rows, into `rows`; the steps of the device work they launched, to
    `ctx.steps`."""
    links = [_linked(rows, _cann_frame(layer, part, ctx), ctx)
             for part in _chunks(np.arange(layer.n))]
    ctx.steps.link(pd.concat(links, ignore_index=True) if links else pd.DataFrame(
        {"correlation": pd.Series(dtype=np.int64), "step": pd.Series(dtype=np.int64)}))


def _linked(rows: Rows, cann: pd.DataFrame, ctx: Context) -> pd.DataFrame:
    """Add CANN rows; the connection ids and host steps of those that have both, for
    `Steps.link`."""
    known = cann.loc[(cann["correlation"] != NO_INT) & (cann["step"] != NO_INT),
                     ["correlation", "step"]]
    rows.add(stepped(cann, ctx.steps))
    return known


def _step_rows(layer: Timeline) -> pd.DataFrame:
    """The rows named like a `ProfilerStep#N` (their name, start and duration)."""
    names = layer.names.column
    named = np.flatnonzero(step_numbers(names.dictionary.to_pandas()) != NO_INT)
    return layer.base(np.flatnonzero(np.isin(names.indices.to_numpy(), named)))


def _split_layers(timeline: Timeline, ctx: Context) -> tuple[dict[str, np.ndarray], int | None]:
    """Rows of complete events by layer kind, each layer's pids in order of first appearance
    and their rows in file order (thread names go to ctx); the device layer's pid."""
    names = timeline.processes
    ctx.threads.update(timeline.threads)
    ctx.layers = set(names.values())
    codes, pids = pd.factorize(timeline.pid.values)
    kinds: list[str] = []
    unknown, guessed, device_pid = set(), [], None
    for pid in pids.tolist():
        name = names.get(pid)
        kind = _layer_kind(name) if name is not None else _guess_layer(timeline.first[pid])
        if name is None:
            guessed.append(f"{pid} as {kind}")
        if kind == "unknown":
            unknown.add(name)
        if kind == "device" and isinstance(pid, int):
            device_pid = pid
        kinds.append(kind)
    if guessed:
        ctx.warnings.append(f"{ctx.where}: no process_name for pids {', '.join(guessed)} "
                            "(layer inferred from the events)")
    if unknown:
        ctx.warnings.append(f"{ctx.where}: skipped unknown layers {sorted(unknown)}")
    kept = ("framework", "marker", "cann", "device", "comm")
    kind_of = np.array([kept.index(k) if k in kept else -1 for k in kinds], np.int8)[codes]
    layers = {}
    for i, kind in enumerate(kept):
        mine = np.flatnonzero(kind_of == i)
        layers[kind] = mine[np.argsort(codes[mine], kind="stable")]
    return layers, device_pid


def _layer_kind(process: str) -> str:
    for kind, names in (("device", DEVICE_LAYERS), ("comm", COMM_LAYERS), ("cann", CANN_LAYERS),
                        ("marker", MARKER_LAYERS), ("framework", FRAMEWORK_LAYERS),
                        ("skip", SKIPPED_LAYERS)):
        if process in names:
            return kind
    return "unknown"


def _guess_layer(event: Fields) -> str:
    """The layer kind of an unnamed process, from one of its events."""
    args = event.args or NO_ARGS
    if args.task_type is not None:
        return "device"
    if args.small_task_type is not None or parse_hccl_name(event.name):
        return "comm"
    if "@" in event.name and args.connection_id is not None:
        return "cann"
    return "framework"


def _split_comm(comm: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """HCCL op rows (no "task type" arg) and their small tasks."""
    every = np.arange(comm.n)
    tasks = comm.present("small_task_type", every)
    return every[~tasks], every[tasks]


def _framework_frame(timeline: Timeline, rows: np.ndarray, marked: np.ndarray) -> pd.DataFrame:
    """Framework ops (host) and annotations (marker): ProfilerStep#N, user annotations, scope
    and mstx layers (`marked`: the rows of a marker layer)."""
    frame = timeline.base(rows)
    thread_lane(frame)
    marker = (frame["name"].str.startswith("ProfilerStep#")
              | timeline.annotation.values[rows] | marked)
    frame["kind"] = np.where(marker, MARKER, HOST)
    return frame


def _cann_frame(timeline: Timeline, rows: np.ndarray, ctx: Context) -> pd.DataFrame:
    frame = timeline.base(rows)
    thread_lane(frame)
    frame["kind"] = HOST
    frame["correlation"] = timeline.ints("connection_id", rows)
    frame["step"] = ctx.steps.host(frame["start_ns"].to_numpy())
    return frame


def _device_frame(timeline: Timeline, rows: np.ndarray, op_conns: set[int]) -> pd.DataFrame:
    """Device tasks: wait / record / memcpy / comm_task (subtask of an HCCL op) / compute."""
    frame = timeline.base(rows)
    stream = timeline.ints("physic_stream", rows)
    for fallback in (timeline.ints("stream_id", rows), ints(frame["tid"].tolist())):
        stream = np.where(stream == NO_INT, fallback, stream)
    frame["stream"] = stream
    device_lane(frame)
    frame["task_type"] = timeline.texts("task_type", rows)
    frame["correlation"] = timeline.ints("connection_id", rows)
    size = timeline.ints("data_size", rows)
    frame["bytes"] = np.where(size == NO_INT, timeline.ints("size_b", rows), size)
    frame["kind"] = device_kinds(frame["name"], frame["task_type"],
                                 frame["correlation"].to_numpy(), op_conns)
    return frame


def _op_frame(timeline: Timeline, rows: np.ndarray, device: pd.DataFrame,
              ctx: Context) -> pd.DataFrame:
    """HCCL op rows: collective / p2p with group, instance number, device stream and bytes
    (`device`: the device rows of the ops' connection ids)."""
    frame = timeline.base(rows)
    frame["correlation"] = timeline.ints("connection_id", rows)
    frame["dtype"] = timeline.texts("data_type", rows)
    frame["bytes"] = op_bytes(timeline.ints("count", rows), frame["dtype"])
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
    frame["rank_size"] = timeline.ints("rank_size", rows)
    return frame


def _task_frame(timeline: Timeline, rows: np.ndarray, ops: pd.DataFrame,
                ctx: Context) -> pd.DataFrame:
    """HCCL small tasks on `Plane k` threads, each attached to the op row that contains it."""
    frame = timeline.base(rows)
    frame["kind"] = COMM_TASK
    frame["lane_kind"] = COMM
    frame["task_type"] = timeline.texts("small_task_type", rows)
    frame["notify_id"] = notify_ids(timeline.texts("notify_id", rows).tolist())
    frame["src_rank"] = local_ranks(timeline.ints("src_rank", rows))
    frame["dst_rank"] = local_ranks(timeline.ints("dst_rank", rows))
    frame["bytes"] = timeline.ints("size_byte", rows)
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
