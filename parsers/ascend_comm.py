"""The small JSON / CSV files beside an Ascend trace: profiler_info, profiler_metadata,
communication.json, communication_matrix.json and step_trace_time.csv.

They give the rank id, versions, group membership (`parallel_group_info`), each HCCL op's full group
hash (`name@group` keys) and, when a rank has no timeline, the communication ops themselves.
"""

from __future__ import annotations

import contextlib
import csv
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from parsers.base import GroupInfo, NoRankId, RankFiles, Reader, TraceError
from parsers.classify import double_hash
from parsers.values import rank_id
from tracegraph.schema import NO_INT

Scalar = int | float | str | None


class _TimeInfo(msgspec.Struct):
    start: msgspec.Raw = msgspec.field(name="Start Timestamp(us)", default=msgspec.Raw())
    elapse_ms: float = msgspec.field(name="Elapse Time(ms)", default=0.0)
    transit_ms: float = msgspec.field(name="Transit Time(ms)", default=0.0)
    wait_ms: float = msgspec.field(name="Wait Time(ms)", default=0.0)
    sync_ms: float = msgspec.field(name="Synchronization Time(ms)", default=0.0)
    idle_ms: float = msgspec.field(name="Idle Time(ms)", default=0.0)


class _OpStats(msgspec.Struct):
    time: _TimeInfo | None = msgspec.field(name="Communication Time Info", default=None)


class _GroupEntry(msgspec.Struct):
    group_name: str = ""
    global_ranks: list[int] = []


class _Metadata(msgspec.Struct):
    parallel_group_info: dict[str, _GroupEntry] = {}
    distributed_args: dict[str, Any] = {}


# step key -> "p2p" | "collective" -> "name@group" -> stats
_Communication = dict[str, dict[str, dict[str, _OpStats]]]
# step key -> section -> "name@group" (or "allreduce-top1@group") -> "src-dst" -> link stats
_Matrix = dict[str, dict[str, dict[str, dict[str, Any]]]]


@dataclass(frozen=True)
class CommOp:
    """One HCCL op instance as communication.json reports it (times of the master plane)."""

    step: int  # from the "step{N}" key, NO_INT for a bare "step"
    name: str  # instance name without "@group"
    group: str  # full group hash
    start_us: str  # "Start Timestamp(us)" exactly as written
    elapse_ms: float
    wait_ms: float
    sync_ms: float
    transit_ms: float
    idle_ms: float
    link: tuple[int, int] | None  # group-local (src, dst) of its one remote matrix link, if any

    def times(self) -> dict[str, object]:
        """The op's time breakdown as a JSON-ready record (kept in ParsedRank.meta)."""
        return {"step": self.step, "name": self.name, "group": self.group,
                "elapse_ms": self.elapse_ms, "wait_ms": self.wait_ms, "sync_ms": self.sync_ms,
                "transit_ms": self.transit_ms, "idle_ms": self.idle_ms}


@dataclass
class Side:
    """What the files beside the trace say about one rank."""

    info: dict[str, Any] = field(default_factory=dict)
    metadata: _Metadata = field(default_factory=_Metadata)
    ops: list[CommOp] = field(default_factory=list)
    device: int | None = None  # from step_trace_time.csv's Device_id
    stages_us: dict[int, float] = field(default_factory=dict)  # step -> step_trace_time.csv's
    # Stage: msprof's step time, first to last device task (µs)
    computing_us: dict[int, float] = field(default_factory=dict)  # step -> its Computing (µs)
    local_ranks: dict[str, set[int]] = field(default_factory=dict)  # group hash -> the
    # group-local ranks its communication_matrix.json links name

    def groups(self) -> dict[str, GroupInfo]:
        """Group hash -> membership from `parallel_group_info` (this rank's groups only)."""
        return {double_hash(comm): GroupInfo(group=double_hash(comm), name=comm,
                                             desc=entry.group_name,
                                             ranks=tuple(sorted(entry.global_ranks)),
                                             source="parallel_group_info")
                for comm, entry in self.metadata.parallel_group_info.items()}

    def op_groups(self) -> tuple[dict[tuple[int, str], str], dict[str, set[str]]]:
        """(step, op name) -> group, and op name -> every group it appears with."""
        by_step = {(op.step, op.name): op.group for op in self.ops}
        by_name: dict[str, set[str]] = defaultdict(set)
        for op in self.ops:
            by_name[op.name].add(op.group)
        return by_step, by_name

    def world_size(self) -> int | None:
        """`distributed_args.world_size` when the metadata has it."""
        value = self.metadata.distributed_args.get("world_size")
        return value if isinstance(value, int) else None


def load_side(files: RankFiles, read: Reader, warnings: list[str]) -> Side:
    """Read every side file `files` names; a truncated one is skipped with a warning."""
    side = Side()
    if "info" in files.files:
        side.info = _load(files.files["info"], read, dict[str, Any], warnings) or {}
    if "metadata" in files.files:
        side.metadata = _load(files.files["metadata"], read, _Metadata, warnings) or _Metadata()
    matrix: _Matrix = {}
    if "matrix" in files.files:
        matrix = _load(files.files["matrix"], read, _Matrix, warnings) or {}
        side.local_ranks = _matrix_local_ranks(matrix)
    if "communication" in files.files:
        stats = _load(files.files["communication"], read, _Communication, warnings) or {}
        side.ops = _comm_ops(stats, _matrix_links(matrix))
    if "step_trace" in files.files:
        member = files.files["step_trace"]
        side.device, side.stages_us, side.computing_us = _step_trace(read(member), member,
                                                                     warnings)
    return side


def resolve_rank(files: RankFiles, info: dict[str, Any], warnings: list[str],
                 source: str = "profiler_info") -> int:
    """The rank: discovery's hint (a file name, --rank-map), else the `rank_id` that `source`
    states (int or string, -1 = none); a file handed over on its own that states none is rank 0,
    with a warning."""
    stated = rank_id(info.get("rank_id"))
    if files.rank is not None:
        if stated is not None and stated != files.rank:
            warnings.append(f"{files.root}: rank_id {stated} in {source} differs from the "
                            f"rank {files.rank} of its file name; using {files.rank}")
        return files.rank
    if stated is None and files.root in files.files.values():
        warnings.append(f"{files.root}: no rank stated (no profiler_info, no rank in its name); "
                        "taken as rank 0 (--rank-map sets it)")
        return 0
    if stated is None:
        raise NoRankId(f"{files.files.get('info', files.root)}: no rank id "
                         "(no profiler_info_{rank}.json name and no valid rank_id)")
    return stated


def stated_metadata(side: Side, values: dict[str, str], where: str, warnings: list[str]) -> None:
    """`parallel_group_info` / `distributed_args` that a database's META_DATA states (as JSON
    text), where no profiler_metadata.json stated them."""
    keys = ("parallel_group_info", "distributed_args")
    found = {k: values[k] for k in keys if k in values}
    if not found or side.metadata.parallel_group_info:
        return
    doc = "{" + ",".join(f'"{k}":{v}' for k, v in found.items()) + "}"
    try:
        side.metadata = msgspec.json.decode(doc, type=_Metadata)
    except msgspec.DecodeError as err:
        warnings.append(f"{where}: META_DATA {', '.join(found)} unreadable ({err}); ignored")


def _load(member: str, read: Reader, kind: Any, warnings: list[str]) -> Any:
    """Decode one JSON side file; None (and a warning) when it is truncated."""
    data = read(member)
    try:
        return msgspec.json.decode(data, type=kind)
    except RecursionError:
        raise TraceError(f"{member}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as err:
        raise TraceError(f"{member}: unexpected content: {err}") from None
    except msgspec.DecodeError as err:
        if data.strip() and "truncated" in str(err):
            warnings.append(f"{member}: truncated; ignored")
            return None
        raise TraceError(f"{member}: invalid JSON: {err}") from None


def _comm_ops(stats: _Communication, links: dict[str, tuple[int, int]]) -> list[CommOp]:
    """Every `name@group` entry of communication.json that has a time section."""
    ops = []
    for step_key, sections in stats.items():
        step = _step_number(step_key)
        for entries in sections.values():
            for key, entry in entries.items():
                name, _, group = key.rpartition("@")
                if not name or entry.time is None or not bytes(entry.time.start):
                    continue  # "Total Op Info" and keys without a group
                t = entry.time
                start = bytes(t.start).decode().strip('"')  # the number's exact text
                ops.append(CommOp(step, name, group, start, t.elapse_ms,
                                  t.wait_ms, t.sync_ms, t.transit_ms, t.idle_ms, links.get(key)))
    return ops


def _matrix_links(matrix: _Matrix) -> dict[str, tuple[int, int]]:
    """`name@group` -> its one remote (src, dst) link, for ops that have their own matrix entry.

    Newer matrices aggregate links into top/middle/bottom entries; those name no single op.
    """
    links = {}
    for sections in matrix.values():
        for entries in sections.values():
            for key, pairs in entries.items():
                remote = {_link(pair) for pair in pairs} - {None}
                if len(remote) == 1:
                    links[key] = remote.pop()
    return links


def _matrix_local_ranks(matrix: _Matrix) -> dict[str, set[int]]:
    """Group hash -> the group-local ranks named by the "src-dst" link keys of its entries
    (`name@group`, or aggregated `allreduce-top1@group`): the group has at least that many."""
    ranks: dict[str, set[int]] = defaultdict(set)
    for sections in matrix.values():
        for entries in sections.values():
            for key, pairs in entries.items():
                group = key.rpartition("@")[2]
                for pair in pairs:
                    src, _, dst = pair.partition("-")
                    if group and src.isdigit() and dst.isdigit():
                        ranks[group] |= {int(src), int(dst)}
    return dict(ranks)


def _link(pair: str) -> tuple[int, int] | None:
    """"0-8" -> (0, 8); None for a self link or anything else."""
    src, _, dst = pair.partition("-")
    if not (src.isdigit() and dst.isdigit()) or src == dst:
        return None
    return int(src), int(dst)


def _step_number(key: str) -> int:
    match = re.fullmatch(r"step(\d+)", key)
    return int(match[1]) if match else NO_INT


def _step_trace(data: bytes, member: str, warnings: list[str]
                ) -> tuple[int | None, dict[int, float], dict[int, float]]:
    """step_trace_time.csv's `Device_id` (first row, if the column exists), each step's `Stage`
    and each step's `Computing` (µs)."""
    lines = data.decode("utf-8", errors="replace").splitlines()  # a bare CR ends one too
    try:
        rows = list(csv.DictReader(lines))
    except csv.Error as err:  # e.g. a field over the csv module's size limit
        warnings.append(f"{member}: unreadable CSV ({err}); device id and step times unknown")
        return None, {}, {}
    device = rank_id(rows[0].get("Device_id")) if rows else None
    return device, _column(rows, "Stage"), _column(rows, "Computing")


def _column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    """Step -> the number in column `name` of step_trace_time.csv's rows (where both read)."""
    values = {}
    for row in rows:
        step = rank_id(row.get("Step"))
        with contextlib.suppress(ValueError):
            if step is not None:
                values[step] = float(row.get(name) or "")
    return values
