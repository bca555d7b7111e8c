"""Normalized Ascend rows, whichever file they come from.

The trace_view.json / msprof_*.json reader (`parsers.ascend`), the `.db` reader
(`parsers.ascend_db`) and the CSV timeline (`parsers.ascend_csv`) each turn their source into the
same frames; what they share lives here: exact µs -> ns columns, the kind of a device task, HCCL
op names, steps, P2P peers, and the assembly of the EVENTS table, the groups and the rank's
metadata.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.ascend_comm import Side
from parsers.base import GroupInfo, RankFiles
from parsers.classify import HcclName, comm_kind, comm_type, double_hash, parse_hccl_name
from parsers.values import (
    LABEL_LIMIT,
    decimal_micros_to_ns,
    ints,
    micros_to_ns,
    rank_id,
    to_int,
)
from parsers.values import texts as capped_texts
from tracegraph import schema
from tracegraph.heap import hand_back
from tracegraph.schema import (
    COMM,
    COMM_TASK,
    COMPUTE,
    MARKER,
    MEMCPY,
    NO_INT,
    P2P,
    RECORD,
    STREAM,
    THREAD,
    WAIT,
)

INVALID_NOTIFY = frozenset({"18446744073709551615", "9223372036854775807"})  # u64 max; the
# .db stores it clamped to i64 max
DTYPE_BYTES = {"INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BFP16": 2, "BF16": 2,
               "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}
WAIT_TYPES = frozenset({"EVENT_WAIT_SQE", "EVENT_WAIT"})
RECORD_TYPES = frozenset({"EVENT_RECORD_SQE", "EVENT_RECORD"})
GROUP_THREAD = re.compile(r"Group (.+?) (?:Aicpu )?Communication")
_INT32_MAX = np.iinfo(np.int32).max

Scalar = int | float | str | None


# --- column helpers --------------------------------------------------------------------------


def texts(values: Sequence[Scalar]) -> pd.Series:
    """Strings with "" where missing, cut to NAME_LIMIT."""
    return pc.fill_null(capped_texts(values), "").to_pandas()


def local_ranks(values: Sequence[Scalar]) -> np.ndarray:
    """Group-local ranks; 4294967295 (a local, on-chip task) and missing -> NO_INT."""
    ranks = ints(values)
    return np.where((ranks < 0) | (ranks > _INT32_MAX), NO_INT, ranks)


def notify_ids(values: Sequence[Scalar]) -> pd.Series:
    """Decimal notify ids; "" for the invalid sentinels; legacy hex ids converted."""
    ids = texts(values)
    hexa = ids.str.startswith("0x")
    if hexa.any():
        ids[hexa] = ids[hexa].map(lambda s: str(n) if (n := to_int(s)) >= 0 else "")
    return ids.where(~ids.isin(INVALID_NOTIFY), "")


def comm_lane(groups: pd.Series) -> pd.Series:
    """"hccl {group}" ("hccl unknown" when the group is not known)."""
    return "hccl " + groups.where(groups != "", "unknown")


def thread_lane(frame: pd.DataFrame) -> None:
    """Host rows: lane "thread {tid}"."""
    frame["lane"] = "thread " + frame["tid"].astype(str)
    frame["lane_kind"] = THREAD


def device_kinds(name: pd.Series, task_type: pd.Series, correlation: np.ndarray,
                 op_conns: set[int]) -> np.ndarray:
    """wait / record / comm_task (a subtask of an HCCL op: its connection id) / memcpy / compute
    of device tasks. Events are told by their task type or name (an EVENT_RECORD may run as a
    PLACE_HOLDER_SQE task)."""
    return np.select(
        [task_type.isin(WAIT_TYPES) | name.eq("EVENT_WAIT"),
         task_type.isin(RECORD_TYPES) | name.eq("EVENT_RECORD"),
         pd.Series(correlation).isin(op_conns).to_numpy(),
         name.eq("MEMCPY_ASYNC") | task_type.str.contains("DMA|MEMCPY", regex=True)],
        [WAIT, RECORD, COMM_TASK, MEMCPY], COMPUTE)


def device_lane(frame: pd.DataFrame) -> None:
    """Device rows: lane "stream {stream}"."""
    frame["lane"] = "stream " + frame["stream"].astype(str)
    frame["lane_kind"] = STREAM


def hccl_names(frame: pd.DataFrame) -> list[HcclName | None]:
    """Split the HCCL op names of `frame` (in place: name without "@group", seq, comm, kind);
    the parsed names, for their "@group" and group tail."""
    parsed = [parse_hccl_name(n) for n in frame["name"]]
    frame["name"] = frame["name"].str.split("@").str[0]
    frame["seq"] = np.array([p.index if p else NO_INT for p in parsed], dtype=np.int64)
    comm = [p.comm if p else comm_type(n) for p, n in zip(parsed, frame["name"], strict=True)]
    frame["comm"] = pd.Series(comm, dtype=str, index=frame.index)
    frame["kind"] = pd.Series([comm_kind(c) for c in comm], dtype=str, index=frame.index)
    return parsed


def op_bytes(count: np.ndarray, dtype: pd.Series) -> np.ndarray:
    """Payload bytes of HCCL ops: element count x element size, NO_INT when either is unknown."""
    width = dtype.map(DTYPE_BYTES).fillna(0).to_numpy(np.int64)
    return np.where((count >= 0) & (width > 0), count * width, NO_INT)


# --- steps -----------------------------------------------------------------------------------


@dataclass
class Steps:
    """ProfilerStep#N ranges on the host and the host step of each connection id."""

    starts: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray
    by_conn: pd.Series

    @classmethod
    def of(cls, framework: pd.DataFrame) -> Steps:
        marks = framework.assign(number=step_numbers(framework["name"]))
        marks = marks[marks["number"] != NO_INT].sort_values("start_ns")
        return cls(marks["start_ns"].to_numpy(np.int64),
                   (marks["start_ns"] + marks["dur_ns"]).to_numpy(np.int64),
                   marks["number"].to_numpy(np.int64), pd.Series(dtype=np.int64))

    def link(self, host: pd.DataFrame) -> None:
        """Device work launched by `host` calls (by correlation) takes their step."""
        known = host[(host["correlation"] != NO_INT) & (host["step"] != NO_INT)]
        self.by_conn = known.drop_duplicates("correlation").set_index("correlation")["step"]

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


def step_numbers(names: pd.Series) -> np.ndarray:
    """N for "ProfilerStep#N", NO_INT otherwise."""
    numbers = np.full(len(names), NO_INT, dtype=np.int64)
    text = pa.array(names, type=pa.string(), from_pandas=True)
    steps = pc.fill_null(pc.starts_with(text, "ProfilerStep#"), False).to_numpy(
        zero_copy_only=False)
    if steps.any():
        found = names[steps].str.extract(r"^ProfilerStep#(\d+)$")[0]
        numbers[steps] = ints(found.fillna("").tolist())
    return numbers


def all_steps(frame: pd.DataFrame, steps: Steps) -> np.ndarray:
    """The step column: kept where set, else host rows by time, device rows by launch or time."""
    have = frame["step"].to_numpy(np.int64)
    start = frame["start_ns"].to_numpy(np.int64)
    corr = frame["correlation"].to_numpy(np.int64)
    guess = np.where(frame["lane_kind"] == THREAD, steps.host(start), steps.device(start, corr))
    marks = step_numbers(frame["name"])
    guess = np.where(marks != NO_INT, marks, guess)
    return np.where(have != NO_INT, have, guess)


def stepped(frame: pd.DataFrame, steps: Steps) -> pd.DataFrame:
    """`frame` with every EVENTS column, its step column set by `all_steps`."""
    frame = complete(frame)
    frame["step"] = all_steps(frame, steps)
    return frame


def device_step_marks(device: pd.DataFrame) -> pd.DataFrame:
    """`ProfilerStep#N` markers for a timeline without host steps (`device`: its device rows
    with a step): each spans the device rows of step N on the rank's busiest stream (msprof's
    step: first to last device task), as Kineto's GPU-side step markers do."""
    if device.empty:
        return device.iloc[:0]
    ends = device["start_ns"] + device["dur_ns"]
    spans = device.assign(end=ends).groupby("step").agg(start_ns=("start_ns", "min"),
                                                        end=("end", "max"))
    busiest = int(device["stream"].value_counts().idxmax())
    return pd.DataFrame({
        "name": [f"ProfilerStep#{int(s)}" for s in spans.index], "kind": MARKER,
        "start_ns": spans["start_ns"].to_numpy(np.int64),
        "dur_ns": (spans["end"] - spans["start_ns"]).to_numpy(np.int64),
        "step": spans.index.to_numpy(np.int64), "stream": busiest,
        "lane": f"stream {busiest}", "lane_kind": STREAM})


# --- communication ---------------------------------------------------------------------------


@dataclass
class Context:
    """What every frame builder needs about the rank."""

    rank: int
    where: str  # the member the events come from, for messages
    side: Side
    warnings: list[str]
    steps: Steps | None = None
    threads: dict[tuple[object, object], str] = field(default_factory=dict)
    layers: set[str] = field(default_factory=set)  # the trace's process (layer) names
    members: dict[str, GroupInfo] = field(init=False)
    by_step: dict[tuple[int, str], str] = field(init=False)
    by_name: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.members = self.side.groups()
        self.by_step, self.by_name = self.side.op_groups()


def op_group(ctx: Context, name: str, parsed: HcclName | None, step: int, thread: str) -> str:
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
    match = GROUP_THREAD.fullmatch(thread)
    candidates = (match[1], double_hash(match[1])) if match and tail else ()
    return next((c for c in candidates if len(c) > 3 and c.endswith(tail)), "")


def op_streams(ops: pd.DataFrame, device: pd.DataFrame) -> None:
    """Each HCCL op's device stream: that of its device subtasks (same connection id)."""
    tasks = device[device["kind"] == COMM_TASK].drop_duplicates("correlation")
    stream = ops["correlation"].map(tasks.set_index("correlation")["stream"])
    ops["stream"] = stream.fillna(NO_INT).astype(np.int64)


def attach_device_tasks(device: pd.DataFrame, ops: pd.DataFrame) -> None:
    """Device subtasks of an HCCL op (same connection id) take its group and instance number."""
    owner = ops.drop_duplicates("correlation").set_index("correlation")
    sub = (device["kind"] == COMM_TASK).to_numpy()
    found = owner.reindex(device["correlation"].to_numpy())
    device["group"] = np.where(sub, found["group"].fillna(""), "")
    device["seq"] = np.where(sub, found["seq"].fillna(NO_INT), NO_INT).astype(np.int64)


def set_peers(ops: pd.DataFrame, tasks: pd.DataFrame, ctx: Context) -> None:
    """P2P ops: the peer from a 2-member group, else from their Notify tasks' dst rank
    (`tasks["op"]`: the row of `ops` each task belongs to)."""
    notify = tasks[tasks["task_type"].str.startswith("Notify") & (tasks["op"] >= 0)
                   & (tasks["dst_rank"] >= 0) & (tasks["dst_rank"] != tasks["src_rank"])]
    pairs = notify.drop_duplicates(["op", "src_rank", "dst_rank"])
    single = pairs[~pairs["op"].duplicated(keep=False)]
    links = {op: (s, d) for op, s, d in zip(single["op"], single["src_rank"], single["dst_rank"],
                                             strict=True)}
    peers = [peer(ctx, group, links.get(i)) if kind == P2P else (NO_INT,) * 3
             for i, (kind, group) in enumerate(zip(ops["kind"], ops["group"], strict=True))]
    ops["peer"], ops["src_rank"], ops["dst_rank"] = np.array(peers, np.int64).reshape(-1, 3).T


def peer(ctx: Context, group: str, link: tuple[int, int] | None) -> tuple[int, int, int]:
    """(global peer, local src, local dst) of a P2P op in `group`."""
    info = ctx.members.get(group)
    ranks = sorted(info.ranks) if info else []
    src, dst = link or (NO_INT, NO_INT)
    if len(ranks) == 2 and ctx.rank in ranks:
        found = ranks[1 - ranks.index(ctx.rank)]
    else:
        found = ranks[dst] if 0 <= dst < len(ranks) else NO_INT
    return (found if rank_id(found) is not None else NO_INT), src, dst  # 2**64 is no rank:
    # unknown (`parsers.validate` counts the group's members out of range)


def comm_only_frame(ctx: Context) -> pd.DataFrame:
    """communication.json ops as events, for a rank without a timeline of them."""
    ops = ctx.side.ops
    frame = pd.DataFrame({
        "name": [op.name for op in ops],
        "start_ns": decimal_micros_to_ns([op.start_us for op in ops]),
        "dur_ns": micros_to_ns([op.elapse_ms for op in ops], unit_us=1e3),
        "group": [op.group for op in ops], "step": [op.step for op in ops],
    })
    hccl_names(frame)
    peers = [peer(ctx, op.group, op.link) if k == P2P else (NO_INT,) * 3
             for op, k in zip(ops, frame["kind"], strict=True)]
    frame["peer"], frame["src_rank"], frame["dst_rank"] = np.array(peers, np.int64).reshape(-1, 3).T
    frame["lane"] = comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    return frame


# --- assembly --------------------------------------------------------------------------------


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every EVENTS column (defaults where absent), so no concat goes via float."""
    for column in schema.EVENTS:
        if column.name not in frame:
            frame[column.name] = "" if pa.types.is_string(column.type) else NO_INT
    return frame


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The frames as one, every EVENTS column present."""
    return pd.concat([complete(f) for f in frames if len(f)] or [complete(pd.DataFrame())],
                     ignore_index=True)


CHUNK_ROWS = 1 << 17  # rows turned into a chunk of the table at once
_COMM_COLUMNS = ["group", "src_rank", "dst_rank"]
_SPAN_COLUMNS = ["step", "start_ns", "dur_ns", "stream"]
_INT_COLUMNS = [c.name for c in schema.EVENTS if pa.types.is_integer(c.type)]


class Rows:
    """A rank's EVENTS rows, gathered frame by frame: each frame becomes at once a chunk of the
    table (its strings dictionary-coded) and can go, so a rank's rows are never one pandas
    frame. What is read across all rows later is kept aside: the kinds seen, the rows of a
    group (`groups`), and, while no row is a `ProfilerStep#N`, the device rows of a step
    (`step_marks`)."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()
        self._chunks: list[pa.Table] = []
        self._grouped: list[pd.DataFrame] = []
        self._device: list[pd.DataFrame] | None = []  # None once a row is a ProfilerStep#N

    def add(self, frame: pd.DataFrame) -> None:
        """Take a frame's rows (in order after those taken before)."""
        if not len(frame):
            return
        frame = complete(frame)
        self.kinds.update(frame["kind"].unique())
        grouped = (frame["group"] != "").to_numpy()
        if grouped.any():
            columns = _COMM_COLUMNS + (["rank_size"] if "rank_size" in frame else [])
            self._grouped.append(frame.loc[grouped, columns])
        if self._device is not None and (step_numbers(frame["name"]) != NO_INT).any():
            self._device = None
        if self._device is not None:
            spans = ((frame["lane_kind"] == STREAM) & (frame["step"] != NO_INT)).to_numpy()
            self._device.append(frame.loc[spans, _SPAN_COLUMNS])
        for lo in range(0, len(frame), CHUNK_ROWS):
            self._chunks.append(_chunk(frame.iloc[lo: lo + CHUNK_ROWS]))

    def grouped(self) -> pd.DataFrame:
        """The rows of a group: group, src_rank, dst_rank (and rank_size, where stated)."""
        return pd.concat(self._grouped, ignore_index=True) if self._grouped else \
            pd.DataFrame({c: pd.Series(dtype=object) for c in _COMM_COLUMNS})

    def step_marks(self) -> pd.DataFrame:
        """`device_step_marks` of the rows taken, none where a row is a ProfilerStep#N."""
        device = pd.concat(self._device, ignore_index=True) if self._device else \
            pd.DataFrame({c: pd.Series(dtype=np.int64) for c in _SPAN_COLUMNS})
        return device_step_marks(device)

    def table(self, rank: int) -> pa.Table:
        """The EVENTS table of the rows taken, sorted by start time (stable), the rows let go
        column by column; text columns dictionary-coded (`schema.IN_MEMORY_EVENTS`) but for
        those holding a value of LABEL_LIMIT characters or more, left plain for
        `parsers.validate` to count what was cut."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return schema.events_table({}, 0)
        whole = pa.concat_tables(chunks)
        del chunks
        hand_back()  # what building the chunks freed: the sorted columns come on top
        order = pc.sort_indices(whole["start_ns"])
        names, columns = whole.column_names, whole.columns
        del whole
        for i, name in enumerate(names):  # one column's rows held twice at a time
            column, columns[i] = columns[i], None
            freed = column.nbytes
            columns[i] = np.full(len(order), rank, np.int32) if name == "rank" \
                else _plain_if_long(column.take(order))
            del column
            hand_back(freed)  # the column's chunks
        return pa.table(columns, names=names)


def table(frame: pd.DataFrame, rank: int) -> pa.Table:
    """The EVENTS table of one frame's rows, as `Rows` makes it."""
    rows = Rows()
    rows.add(frame)
    return rows.table(rank)


def _chunk(frame: pd.DataFrame) -> pa.Table:
    """A complete frame's rows as a table of IN_MEMORY_EVENTS (rank left unset)."""
    ints = schema.events_table({c: frame[c].to_numpy() for c in _INT_COLUMNS if c != "rank"},
                               len(frame))
    return pa.Table.from_arrays(
        [pa.array(frame[f.name], pa.string()).dictionary_encode()
         if pa.types.is_dictionary(f.type) else ints[f.name] for f in schema.IN_MEMORY_EVENTS],
        schema=schema.IN_MEMORY_EVENTS)


def _plain_if_long(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-coded column as plain text when a value reaches LABEL_LIMIT characters."""
    if not pa.types.is_dictionary(column.type):
        return column
    longest = max((pc.max(pc.binary_length(c.dictionary)).as_py() or 0 for c in column.chunks),
                  default=0)
    return column.cast(pa.string()) if longest >= LABEL_LIMIT else column


def groups(side: Side, rows: pd.DataFrame, names: dict[str, str] | None = None
           ) -> list[GroupInfo]:
    """This rank's groups: `parallel_group_info`, plus groups seen only in op names, whose size
    comes from the op's `rank_size`, else is at least the group-local ranks its HCCL tasks and
    communication_matrix.json links name (`rows`: the rows of a group, `Rows.grouped`;
    `names`: group -> its comm name, where known)."""
    found = side.groups()
    seen = set(rows["group"].unique())
    stated = _stated_sizes(rows)
    local = _local_ranks(rows, side)
    for group in sorted(seen | {op.group for op in side.ops}):
        if group and group not in found:
            size, source = stated.get(group, 0), "rank_size of its HCCL ops"
            if not size and local.get(group):
                size = max(local[group]) + 1
                source = f"at least: HCCL group-local ranks up to {size - 1} named"
            found[group] = GroupInfo(group=group, name=(names or {}).get(group, ""),
                                     source=source if size else "op name", size=size)
    return list(found.values())


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


def meta(files: RankFiles, side: Side, device: int | None,
         versions: dict[str, str] | None = None,
         layers: set[str] | frozenset[str] = frozenset()) -> dict[str, object]:
    """RANKS columns (and the per-op time breakdown of communication.json under "comm_times");
    `layers`: the trace's layer names, telling the framework of a trace handed over alone."""
    stated = {k.removesuffix("_version"): v for k, v in side.info.items()
              if k.endswith("_version") and v} | (versions or {})
    device = side.device if side.device is not None else device
    found: dict[str, object] = {
        "framework": framework(files, side, layers), "format": "ascend",
        "version": ";".join(f"{k}={v}" for k, v in stated.items()),
        "device": f"npu:{device}" if device is not None else "", "backend": "hccl",
        "clock_base_ns": 0, "comm_times": [op.times() for op in side.ops],
        "stated_steps": stated_steps(side),
    }
    if side.world_size() is not None:
        found["world_size"] = side.world_size()
    return found


def stated_steps(side: Side) -> str:
    """step_trace_time.csv's steps as the RANKS `stated_steps` JSON: step -> [Stage, Computing]
    in µs (Computing null where the table lacks it); "" without the table."""
    steps = {str(step): [stage, side.computing_us.get(step)]
             for step, stage in sorted(side.stages_us.items())}
    return json.dumps(steps, separators=(",", ":")) if steps else ""


def framework(files: RankFiles, side: Side, layers: set[str] | frozenset[str] = frozenset()
              ) -> str:
    """torch_npu, mindspore or msprof, from the folder's name, its files and profiler_info, else
    from the trace's framework layer (torch_npu's `Python`, MindSpore's `MindSpore`)."""
    root = files.root.rstrip("/").rsplit("/", 1)[-1]
    members = files.files.values()
    if root.endswith("_ascend_pt") or "torch_npu_version" in side.info or any(
            "ascend_pytorch_profiler" in m for m in members):
        return "torch_npu"
    if root.endswith("_ascend_ms") or any(k.startswith(("ms_", "mindspore")) for k in side.info) \
            or any("ascend_mindspore_profiler" in m for m in members):
        return "mindspore"
    if root.startswith("PROF_") or any("mindstudio_profiler_output" in m or
                                       posixpath.basename(m).startswith("msprof_")
                                       for m in members):
        return "msprof"
    return "mindspore" if "MindSpore" in layers else "torch_npu" if "Python" in layers else ""
