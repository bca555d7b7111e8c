"""Raw msprof `PROF_*` folders with one timeline file per iteration (MindSpore graph mode and
the CANN of 2023) -> EVENTS.

Each device of a run is a folder `PROF_{n}_{stamp}_{id}/device_{d}/` holding `info.json.{d}`
(`rank_id`, hostname), `start_info.{d}` / `end_info.{d}` (the wall clock and CLOCK_MONOTONIC_RAW
read at one instant, when collection began and ended) and `timeline/`, whose files are named
`{kind}_{device}_{model}_{iteration}.json`: `msprof_*` every layer of the iteration (device tasks
on `Ascend Hardware`, HCCL ops and their small tasks, CANN host calls, the step trace),
`task_time_*` its device tasks and `hccl_*` its HCCL rows alone, `step_trace_*` the iterations
(`Iteration N`, `FP_BP Time N`, `Iteration Refresh N`, `Reduce_N_k`). An iteration is read from its
`msprof_*` file, else from its `task_time_*` and `hccl_*` files; every iteration of the device
goes into one rank timeline, each row's step the iteration of its file, and each iteration
becomes the step marker `ProfilerStep#N` over its `Iteration N` span.

Times are µs of the host's CLOCK_MONOTONIC_RAW (device times already converted by msprof);
start_info / end_info pair that clock with the wall clock, so times are moved onto the wall clock
(the offset drawn linearly between the two readings). A graph-mode HCCL op
(`Default/AllReduce-op534_0`, on the `Communication Kernel` thread) names no communicator: its
small tasks' `src rank` is this rank's place in it, and where that equals the global rank the op
is taken to be on MindSpore's `hccl_world_group` (whose local ranks are the global ones); its
device tasks are those whose (stream, task id) its small tasks name, and it runs on the stream of
its plane-0 (master) tasks. Event waits carry no event id: they are matched to records later by
the timing rule, as trace_view.json's are.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd

from parsers import ascend_layout
from parsers.ascend import CANN_LAYERS, COMM_LAYERS, DEVICE_LAYERS, SKIPPED_LAYERS
from parsers.ascend_comm import Side
from parsers.ascend_rows import (
    Context,
    Scalar,
    comm_lane,
    concat,
    device_kinds,
    device_lane,
    local_ranks,
    notify_ids,
    set_peers,
    table,
    texts,
    thread_lane,
)
from parsers.ascend_timeline import Args, Event
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
)
from parsers.classify import comm_kind, comm_type
from parsers.values import ints, micros_to_ns, rank_id, to_int
from tracegraph.schema import COMM, COMM_TASK, HOST, MARKER, NO_INT, STREAM

NAME = "ascend_prof"
WORLD = "hccl_world_group"
"""MindSpore's default communicator: its local ranks are the global ranks."""
_TIMELINE = re.compile(r"^timeline/(?P<kind>msprof|task_time|hccl|step_trace)_\d+_(?P<model>\d+)_"
                       r"(?P<iter>\d+)\.json$")
_INFO = re.compile(r"^(info\.json|start_info|end_info)\.(\d+)$")
_DEVICE = re.compile(r"^device_\d+$")
_STEP_NAME = re.compile(r"^(?:Iteration|FP_BP Time|Iteration Refresh|Reduce)[ _](\d+)")
_PLANE = re.compile(r"^Plane (\d+)$")
_FRAMEWORK_SCOPES = ("Default/", "Gradients/", "recompute_Default/")  # MindSpore graph scopes
_INFO_ROLES = {"info.json": "info", "start_info": "start", "end_info": "end"}
STEP_LANE = "step trace"


# --- discovery -------------------------------------------------------------------------------
def _in_device(name: str, label: str = "") -> tuple[str, str] | None:
    """(device folder, path inside it) of a member of a `device_N` folder (the bundle itself
    when `label`, its name, is one), else None."""
    parts = name.split("/")
    for at in range(len(parts) - 2, -1, -1):
        if _DEVICE.match(parts[at]):
            return "/".join(parts[:at + 1]), "/".join(parts[at + 1:])
    return ("", name) if _DEVICE.match(label) else None


def wants(name: str) -> bool:
    """A device folder's info.json.N: its first bytes state the rank."""
    inside = _in_device(name)
    return inside is not None and inside[1].startswith("info.json.")


def sniff(name: str, head: bytes) -> Sniff:
    """The `rank_id` an info.json.N states (never a profile by itself)."""
    return ascend_layout.sniff(name, head)


def encloses(name: str) -> bool:
    """An iteration timeline file lies in this format's profile (no other format reads it)."""
    inside = _in_device(name)
    return inside is not None and bool(_TIMELINE.match(inside[1]))


def find(names: list[str], sniffs: dict[str, Sniff], label: str, notes: list[str]) -> Found:
    """One profile per `device_N` folder holding per-iteration timeline files, outside any
    torch_npu / MindSpore profile folder (whose ASCEND_PROFILER_OUTPUT says more); one per rank,
    the latest run's where several runs hold the same rank."""
    folders: dict[str, dict[str, str]] = defaultdict(dict)
    placed = {name: _in_device(name, label) for name in names}
    for name, inside in placed.items():
        found = inside and _TIMELINE.match(inside[1])
        if found and not ascend_layout.encloses(name):
            folders[inside[0]][f"{found['kind']}.{found['model']}.{found['iter']}"] = name
    for name, inside in placed.items():
        found = inside and inside[0] in folders and _INFO.match(inside[1])
        if found and posixpath.basename(inside[0] or label).endswith(f"_{found[2]}"):
            folders[inside[0]][_INFO_ROLES[found[1]]] = name
    profiles = [RankFiles(NAME, folder or ".", roles, _stated_rank(roles, sniffs))
                for folder, roles in sorted(folders.items())]
    return ascend_layout.latest_per_rank(profiles, notes, _run_stamp), [
        name for name, inside in placed.items() if not (inside and inside[0] in folders)]


def _stated_rank(roles: dict[str, str], sniffs: dict[str, Sniff]) -> int | None:
    said = sniffs.get(roles.get("info", ""))
    return said.rank if said else None


def _run_stamp(root: str) -> int:
    """The timestamp of the `PROF_{n}_{stamp}_{id}` run holding a device folder, else -1."""
    return ascend_layout.timestamp(posixpath.dirname(root))


# --- decoding --------------------------------------------------------------------------------
class _Args(Args, gc=False):
    """The timeline's args, with the HCCL task's own ids of these files."""

    task_id: Scalar = msgspec.field(name="Task Id", default=None)
    hccl_stream: Scalar = msgspec.field(name="stream id", default=None)
    hccl_task: Scalar = msgspec.field(name="task id", default=None)


_NO_ARGS = _Args()


class _Event(Event, gc=False):
    args: _Args | None = None


_DECODER = msgspec.json.Decoder(list[_Event])
_ROWS = ("device", "small", "op", "host", "step")


@dataclass
class _Rows:
    """Complete events of every iteration file, by what they are, each with its iteration."""

    by_kind: dict[str, list[tuple[int, _Event, str]]]  # kind -> (iteration, event, thread)
    unknown: set[str]

    @classmethod
    def empty(cls) -> _Rows:
        return cls({kind: [] for kind in _ROWS}, set())

    def add(self, iteration: int, events: list[_Event]) -> None:
        """File one decoded file's complete events by layer (its `process_name` metadata)."""
        process, thread = {}, {}
        for e in events:
            if e.ph == "M" and e.args is not None and e.name == "process_name":
                process[e.pid] = str(e.args.name)
            elif e.ph == "M" and e.args is not None and e.name == "thread_name":
                thread[(e.pid, e.tid)] = str(e.args.name)
        for e in events:
            if e.ph != "X":
                continue
            kind = _row_kind(process.get(e.pid, ""), e)
            if kind in _ROWS:
                self.by_kind[kind].append((iteration, e, thread.get((e.pid, e.tid), "")))
            elif kind == "unknown":
                self.unknown.add(process.get(e.pid, "") or f"pid {e.pid}")


def _row_kind(layer: str, e: _Event) -> str:
    args = e.args or _NO_ARGS
    if layer in DEVICE_LAYERS:
        return "device" if args.task_type is not None else "step"
    if layer in COMM_LAYERS:
        return "op" if args.small_task_type is None else "small"
    if layer in CANN_LAYERS:
        return "host"
    if layer == "Step Trace":
        return "step"
    return "skip" if layer in SKIPPED_LAYERS else "unknown"


def _decode(member: str, data: bytes, warnings: list[str]) -> list[_Event] | None:
    """One timeline file's events; None (said in `warnings`) for a file cut short or empty
    (its iteration is then read from the others); TraceError for any other non-event array."""
    try:
        return _DECODER.decode(data)
    except RecursionError:
        raise TraceError(f"{member}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as err:
        raise TraceError(f"{member}: not an msprof timeline ({err})") from None
    except msgspec.DecodeError as err:
        if data.strip() and "truncated" not in str(err):
            raise TraceError(f"{member}: invalid JSON ({err})") from None
    warnings.append(f"{member}: {'truncated' if data.strip() else 'empty'}; left out")
    return None


# --- clock -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Clock:
    """CLOCK_MONOTONIC_RAW ns -> wall-clock ns, from readings of both at collection start and
    end (the offset drawn linearly between them)."""

    mono: tuple[int, ...] = ()
    offset: tuple[int, ...] = ()

    def wall(self, mono_ns: np.ndarray) -> np.ndarray:
        if not self.mono:
            return mono_ns
        if len(self.mono) == 1:
            return mono_ns + self.offset[0]
        drift = np.interp(mono_ns.astype(float), self.mono, self.offset)
        return mono_ns + np.rint(drift).astype(np.int64)


def _clock(files: RankFiles, read: Reader, warnings: list[str]) -> _Clock:
    readings = []
    for role, wall_key in (("start", "collectionTimeBegin"), ("end", "collectionTimeEnd")):
        info = _object(files.files.get(role), read, warnings)
        wall_us, mono_ns = to_int(info.get(wall_key)), to_int(info.get("clockMonotonicRaw"))
        if wall_us > 0 and mono_ns > 0:
            readings.append((mono_ns, wall_us * 1000 - mono_ns))
    if not readings:
        warnings.append(f"{files.root}: no start_info / end_info clock readings: times are the "
                        "host's monotonic clock, not the wall clock")
        return _Clock()
    readings.sort()
    return _Clock(tuple(m for m, _ in readings), tuple(o for _, o in readings))


def _object(member: str | None, read: Reader, warnings: list[str]) -> dict:
    """A small JSON object file (info.json.N, start_info.N), {} when absent or unreadable."""
    if member is None:
        return {}
    try:
        value = msgspec.json.decode(read(member))
    except (msgspec.DecodeError, RecursionError) as err:
        warnings.append(f"{member}: unreadable ({err}); ignored")
        return {}
    return value if isinstance(value, dict) else {}


# --- frames ----------------------------------------------------------------------------------
def _base(rows: list[tuple[int, _Event, str]], clock: _Clock) -> pd.DataFrame:
    events = [e for _, e, _ in rows]
    start = micros_to_ns([e.ts for e in events])
    known = start != np.iinfo(np.int64).min
    start[known] = clock.wall(start[known])
    return pd.DataFrame({
        "name": texts([e.name for e in events]), "start_ns": start,
        "dur_ns": micros_to_ns([e.dur for e in events]),
        "step": np.array([i for i, _, _ in rows], dtype=np.int64),
        "tid": pd.Series([e.tid for e in events], dtype=object),
        "thread": pd.Series([t for _, _, t in rows], dtype=object)})


def _args(rows: list[tuple[int, _Event, str]], key: str) -> list[object]:
    return [getattr(e.args or _NO_ARGS, key) for _, e, _ in rows]


def _device_frame(rows: list[tuple[int, _Event, str]], clock: _Clock) -> pd.DataFrame:
    frame = _base(rows, clock)
    stream = ints(_args(rows, "stream_id"))
    frame["stream"] = np.where(stream == NO_INT, ints(frame["tid"].tolist()), stream)
    frame["task_id"] = ints(_args(rows, "task_id"))
    frame["task_type"] = texts(_args(rows, "task_type"))
    device_lane(frame)
    frame["group"] = ""
    correlation = np.full(len(frame), NO_INT, dtype=np.int64)
    frame["kind"] = device_kinds(frame["name"], frame["task_type"], correlation, set())
    return frame


def _small_frame(rows: list[tuple[int, _Event, str]], clock: _Clock) -> pd.DataFrame:
    frame = _base(rows, clock)
    frame["kind"], frame["lane_kind"] = COMM_TASK, COMM
    frame["task_type"] = texts(_args(rows, "small_task_type"))
    frame["notify_id"] = notify_ids(_args(rows, "notify_id"))
    frame["src_rank"] = local_ranks(_args(rows, "src_rank"))
    frame["dst_rank"] = local_ranks(_args(rows, "dst_rank"))
    frame["bytes"] = ints(_args(rows, "size_byte"))
    frame["hccl_stream"] = ints(_args(rows, "hccl_stream"))
    frame["task_id"] = ints(_args(rows, "hccl_task"))
    planes = [_PLANE.match(t) for t in frame["thread"]]
    frame["plane"] = [int(m[1]) if m else to_int(t) for m, t in zip(planes, frame["tid"],
                                                                      strict=True)]
    return frame


def _op_frame(rows: list[tuple[int, _Event, str]], clock: _Clock) -> pd.DataFrame:
    """Graph-mode HCCL ops: the comm type from the last part of their scope name."""
    frame = _base(rows, clock)
    comm = [comm_type(n.rsplit("/", 1)[-1]) for n in frame["name"]]
    frame["comm"] = pd.Series(comm, dtype=str, index=frame.index)
    frame["kind"] = [comm_kind(c) for c in comm]
    frame["lane_kind"] = COMM
    return frame


def _attach(ops: pd.DataFrame, small: pd.DataFrame, device: pd.DataFrame, rank: int,
            warnings: list[str], where: str) -> None:
    """Each small task's op (by iteration and time), each op's stream (its plane-0 tasks'),
    group and the local rank it names; device tasks its small tasks name become its tasks."""
    small["op"] = _containing(small, ops)
    owned = small[small["op"] >= 0]
    master = owned.sort_values("plane", kind="stable").drop_duplicates("op")
    ops["stream"] = master.set_index("op")["hccl_stream"].reindex(range(len(ops))).fillna(
        NO_INT).to_numpy(np.int64)
    local = owned[owned["src_rank"] >= 0].groupby("op")["src_rank"].agg(
        lambda r: Counter(r).most_common(1)[0][0])
    ops["local_rank"] = local.reindex(range(len(ops))).fillna(NO_INT).to_numpy(np.int64)
    ops["group"] = np.where(ops["local_rank"] == rank, WORLD, "")
    if unknown := int((ops["group"] == "").sum()):
        warnings.append(f"{where}: {unknown} HCCL ops whose small tasks do not place this rank at "
                        f"its global rank in the communicator: communicator unknown")
    ops["lane"] = comm_lane(ops["group"])
    pick = np.clip(small["op"].to_numpy(), 0, None)
    own = small["op"].to_numpy() >= 0
    small["group"] = np.where(own, ops["group"].to_numpy()[pick] if len(ops) else "", "")
    small["lane"] = comm_lane(small["group"]) + " plane " + small["plane"].astype(str)
    keys = pd.MultiIndex.from_frame(owned[["step", "hccl_stream", "task_id"]])
    mine = pd.MultiIndex.from_frame(device[["step", "stream", "task_id"]]).isin(keys)
    device.loc[mine, "kind"] = COMM_TASK
    task_op = owned.drop_duplicates(["step", "hccl_stream", "task_id"]).set_index(
        ["step", "hccl_stream", "task_id"])["op"]
    device.loc[mine, "group"] = ops["group"].to_numpy()[task_op.reindex(
        pd.MultiIndex.from_frame(device.loc[mine, ["step", "stream", "task_id"]])).to_numpy()]


def _containing(tasks: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Row of `ops` (same iteration) whose [start, end] holds each task's start, else -1."""
    if ops.empty or tasks.empty:
        return np.full(len(tasks), -1, dtype=np.int64)
    right = pd.DataFrame({"start_ns": ops["start_ns"], "end": ops["start_ns"] + ops["dur_ns"],
                          "step": ops["step"], "op": np.arange(len(ops))}).sort_values("start_ns")
    left = tasks[["start_ns", "step"]].assign(row=np.arange(len(tasks))).sort_values("start_ns")
    merged = pd.merge_asof(left, right, on="start_ns", by="step").sort_values("row")
    inside = (merged["start_ns"] <= merged["end"]).to_numpy()
    return np.where(inside, merged["op"].fillna(-1), -1).astype(np.int64)


def _step_frame(rows: list[tuple[int, _Event, str]], clock: _Clock) -> pd.DataFrame:
    """The step trace's spans (one copy each: every file may repeat them) as markers, and each
    `Iteration N` also as the step marker `ProfilerStep#N`."""
    frame = _base(rows, clock).drop_duplicates(["name", "start_ns"], ignore_index=True)
    number = frame["name"].str.extract(_STEP_NAME)[0]
    frame["step"] = pd.to_numeric(number, errors="coerce").fillna(NO_INT).astype(np.int64)
    iterations = frame[frame["name"].str.match(r"^Iteration \d+$")]
    steps = iterations.assign(name="ProfilerStep#" + iterations["step"].astype(str))
    frame = pd.concat([frame, steps], ignore_index=True)
    frame["kind"], frame["lane"], frame["lane_kind"] = MARKER, STEP_LANE, STREAM
    return frame


# --- entry point -----------------------------------------------------------------------------
def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One device folder's iterations as one rank's normalized events, groups and meta."""
    warnings: list[str] = []
    info = _object(files.files.get("info"), read, warnings)
    rank = _rank(files, info, warnings)
    clock = _clock(files, read, warnings)
    rows = _read_iterations(files, read, warnings)
    if rows.unknown:
        warnings.append(f"{files.root}: skipped unknown layers {sorted(rows.unknown)}")
    device = _device_frame(rows.by_kind["device"], clock)
    small = _small_frame(rows.by_kind["small"], clock)
    ops = _op_frame(rows.by_kind["op"], clock)
    _attach(ops, small, device, rank, warnings, files.root)
    ctx = Context(rank, files.root, Side(), warnings)
    size = int(max(small["src_rank"].max(), small["dst_rank"].max(), rank) + 1) if len(
        small) else rank + 1
    ctx.members = {WORLD: GroupInfo(WORLD, WORLD, "world", tuple(range(size)))}
    set_peers(ops, small, ctx)
    host = _base(rows.by_kind["host"], clock)
    thread_lane(host)
    frame = concat([device.drop(columns="task_id"), ops.drop(columns="local_rank"),
                    small.drop(columns=["op", "hccl_stream", "task_id", "plane"]),
                    host.assign(kind=HOST), _step_frame(rows.by_kind["step"], clock)])
    frame = frame.drop(columns=["tid", "thread"])
    groups = [GroupInfo(WORLD, WORLD, "world", source="MindSpore's default communicator (the "
                        "timeline names none; local ranks are global)", size=size)
              ] if (ops["group"] == WORLD).any() else []
    return ParsedRank(rank=rank, events=table(frame, rank), groups=groups,
                      meta=_meta(files, info, device, clock), warnings=warnings)


def _rank(files: RankFiles, info: dict, warnings: list[str]) -> int:
    """Discovery's rank (--rank-map, info.json's rank_id), else the device id, said."""
    if files.rank is not None:
        return files.rank
    stated = rank_id(info.get("rank_id"))
    if stated is not None:
        return stated
    named = files.files.get("info", posixpath.basename(files.root).replace("_", "."))
    device = rank_id(named.rpartition(".")[2])
    if device is None:
        raise NoRankId(f"{files.root}: no rank id (no info.json rank_id); pass --rank-map")
    warnings.append(f"{files.root}: info.json states no rank_id; taken as rank {device}, its "
                    "device id (--rank-map sets it)")
    return device


def _read_iterations(files: RankFiles, read: Reader, warnings: list[str]) -> _Rows:
    """Every iteration's events: its msprof_* file, else (absent or cut short) its task_time_*
    and hccl_* files; the step trace from every file that holds it. Steps are the iterations of
    the model with the most iterations (the training graph); other models' rows keep none."""
    by_iteration: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for role, member in files.files.items():
        kind, _, rest = role.partition(".")
        if rest:
            model, _, iteration = rest.partition(".")
            by_iteration[(int(model), int(iteration))][kind] = member
    models = Counter(model for model, _ in by_iteration)
    if not models:
        raise TraceError(f"{files.root}: no timeline file")
    main = models.most_common(1)[0][0]
    if len(models) > 1:
        warnings.append(f"{files.root}: timelines of models {sorted(models)}: steps are model "
                        f"{main}'s iterations")
    rows = _Rows.empty()
    for (model, iteration), kinds in sorted(by_iteration.items()):
        step = iteration if model == main else NO_INT
        read_all = ["task_time", "hccl"]
        if "msprof" in kinds:
            whole = _decode(kinds["msprof"], read(kinds["msprof"]), warnings)
            if whole is not None:
                rows.add(step, whole)
                read_all = []
        for kind in [*read_all, "step_trace"]:
            events = _decode(kinds[kind], read(kinds[kind]), warnings) if kind in kinds else None
            if events is not None:
                rows.add(step, events)
    if not any(rows.by_kind.values()):
        raise TraceError(f"{files.root}: no event in any of its timeline files")
    return rows


def _meta(files: RankFiles, info: dict, device: pd.DataFrame, clock: _Clock
          ) -> dict[str, object]:
    scoped = device["name"].str.startswith(_FRAMEWORK_SCOPES).any()
    devices = str(info.get("devices", "") or "")
    return {"framework": "mindspore" if scoped else "msprof", "format": NAME,
            "version": f"msprof_info={info['version']}" if info.get("version") else "",
            "device": f"npu:{devices}" if devices else "", "backend": "hccl",
            "clock_base_ns": clock.offset[0] if clock.offset else 0,
            "host": str(info.get("hostname", "") or "")}


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name=NAME, looked_for="PROF_*/device_*/timeline/ per-iteration msprof files",
                parse=parse, wants=wants, sniff=sniff, find=find, encloses=encloses)
