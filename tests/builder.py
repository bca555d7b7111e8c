"""Hand-built traces that read like a timeline.

    b = TraceBuilder(unit=US)                       # times below in µs (MS for ms)
    s7 = b.stream(0, 7)                             # rank 0, device stream 7
    mm = s7.compute(0, 10, "MatMul")
    s7.collective(10, 50, "allreduce", group="dp", seq=0)
    b.group("dp", (0, 1), dim="dp")
    b.shift(1, 250)                                 # rank 1's clock reads 250 µs late
    trace = b.trace()                               # a real Trace, the parsers' schema

Every add returns the event's row in `trace.events`; `op_index` finds its op after `build_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from parsers.base import GroupInfo
from tracegraph import schema
from tracegraph.graph.ops import Ops
from tracegraph.loading.groups import groups_frame
from tracegraph.loading.steps import STEP_NAME
from tracegraph.loading.trace import Trace, events_frame

NS, US, MS = 1, 1_000, 1_000_000
_DEFAULTS = schema.STRING_DEFAULTS | schema.INT_DEFAULTS


@dataclass(frozen=True)
class Lane:
    """One timeline of a rank (device stream, host thread or comm row) that events go on."""

    builder: TraceBuilder
    rank: int
    lane: str
    lane_kind: str
    stream: int = schema.NO_INT

    def add(self, kind: str, start: float, end: float, name: str, **columns: object) -> int:
        """An event of `kind` from `start` to `end` (builder units); `columns` as in EVENTS."""
        return self.builder.add(self.row(kind, start, end, name, **columns))

    def row(self, kind: str, start: float, end: float, name: str, **columns: object
            ) -> dict[str, object]:
        """The EVENTS row `add` would append (every column, defaults filled)."""
        if unknown := set(columns) - set(schema.EVENTS.names):
            raise ValueError(f"not EVENTS columns: {sorted(unknown)}")
        start_ns, end_ns = self.builder.ns(start), self.builder.ns(end)
        return _DEFAULTS | {
            "rank": self.rank, "lane": self.lane, "lane_kind": self.lane_kind,
            "stream": self.stream, "name": name, "kind": kind, "start_ns": start_ns,
            "dur_ns": end_ns - start_ns} | columns

    def compute(self, start: float, end: float, name: str = "MatMul", **columns: object) -> int:
        return self.add(schema.COMPUTE, start, end, name, **columns)

    def host(self, start: float, end: float, name: str, **columns: object) -> int:
        return self.add(schema.HOST, start, end, name, **columns)

    def wait(self, start: float, end: float, name: str = "EVENT_WAIT", **columns: object) -> int:
        """A stream wait; Kineto's carry `event_id` and `wait_on_stream`, Ascend's neither."""
        return self.add(schema.WAIT, start, end, name, **columns)

    def record(self, at: float, name: str = "EVENT_RECORD", **columns: object) -> int:
        """An instantaneous event record at `at`."""
        return self.add(schema.RECORD, at, at, name, **columns)

    def collective(self, start: float, end: float, comm: str = "allreduce", *, group: str,
                   seq: int = schema.NO_INT, name: str = "", **columns: object) -> int:
        return self.add(schema.COLLECTIVE, start, end, name or comm, comm=comm, group=group,
                        seq=seq, **columns)

    def send(self, start: float, end: float, *, peer: int, group: str = "",
             seq: int = schema.NO_INT, name: str = "", **columns: object) -> int:
        return self._p2p("send", start, end, peer, group, seq, name, columns)

    def recv(self, start: float, end: float, *, peer: int, group: str = "",
             seq: int = schema.NO_INT, name: str = "", **columns: object) -> int:
        return self._p2p("recv", start, end, peer, group, seq, name, columns)

    def batch_send_recv(self, start: float, end: float, *, peer: int, group: str = "",
                        seq: int = schema.NO_INT, name: str = "", **columns: object) -> int:
        return self._p2p("batch_send_recv", start, end, peer, group, seq, name, columns)

    def marker(self, start: float, end: float, name: str, **columns: object) -> int:
        return self.add(schema.MARKER, start, end, name, **columns)

    def step(self, n: int, start: float, end: float) -> int:
        """A `ProfilerStep#n` marker: the rank's events starting inside it get `step` n."""
        return self.marker(start, end, f"ProfilerStep#{n}")

    def _p2p(self, comm: str, start: float, end: float, peer: int, group: str, seq: int,
             name: str, columns: dict[str, object]) -> int:
        return self.add(schema.P2P, start, end, name or comm, comm=comm, peer=peer, group=group,
                        seq=seq, **columns)


@dataclass
class TraceBuilder:
    """Collects events, groups and clock shifts; `trace()` makes the `Trace` a loader would."""

    unit: int = US  # ns per time unit of every start / end given
    base_ns: int = 0  # the clock reading at time 0 (an epoch, as real profiles have)
    rows: list[dict[str, object]] = field(default_factory=list)
    groups: list[tuple[GroupInfo, str]] = field(default_factory=list)
    shifts: dict[int, int] = field(default_factory=dict)  # rank -> ns its clock reads late

    def ns(self, t: float) -> int:
        return self.base_ns + round(t * self.unit)

    def stream(self, rank: int, stream: int) -> Lane:
        """Device stream `stream` of `rank` (lane "stream N")."""
        return Lane(self, rank, f"stream {stream}", schema.STREAM, stream)

    def thread(self, rank: int, tid: int, name: str = "") -> Lane:
        """A host thread (Kineto's lane "thread TID NAME")."""
        return Lane(self, rank, f"thread {tid} {name}".strip(), schema.THREAD)

    def comm_lane(self, rank: int, lane: str, stream: int = schema.NO_INT) -> Lane:
        """A comm row: a gloo worker thread, an HCCL group row (`stream`: where its ops ran)."""
        return Lane(self, rank, lane, schema.COMM, stream)

    def add(self, row: dict[str, object]) -> int:
        """Append one full EVENTS row; its index in `trace().events`."""
        self.rows.append(row)
        return len(self.rows) - 1

    def group(self, group: str, ranks: tuple[int, ...], dim: str = "", name: str = "",
              desc: str = "") -> None:
        """A communicator and its members, as the profiles state them."""
        self.groups.append((GroupInfo(group, name, desc or dim, ranks, "test"), dim))

    def shift(self, rank: int, by: float) -> None:
        """`rank`'s clock reads `by` (units) later than true time: every event of it moves."""
        self.shifts[rank] = round(by * self.unit)

    def trace(self, source: str = "built") -> Trace:
        """A Trace laid out as `tracegraph.loading.loader.load` returns one."""
        frame = pd.DataFrame(self.rows, columns=schema.EVENTS.names)
        frame["start_ns"] += frame["rank"].map(self.shifts).fillna(0).astype("int64")
        frame["step"] = _steps(frame)
        table = schema.events_table({c: frame[c].to_numpy() for c in frame}, len(frame))
        groups, _ = groups_frame([info for info, _ in self.groups], table)
        dims = {info.group: dim for info, dim in self.groups if dim}
        groups["dim"] = [dims.get(g, d) for g, d in zip(groups["group"], groups["dim"],
                                                        strict=True)]
        events = events_frame([schema.in_memory(table)])
        return Trace(Path(source), events, groups, _ranks(frame))


def _steps(frame: pd.DataFrame) -> np.ndarray:
    """Each event's ProfilerStep number: the marker of its rank it starts in (NO_INT if none)."""
    step = np.full(len(frame), schema.NO_INT, dtype=np.int64)
    markers = frame[(frame["kind"] == schema.MARKER) & frame["name"].str.match(STEP_NAME)]
    for rank, start, dur, name in markers[["rank", "start_ns", "dur_ns", "name"]].itertuples(
            index=False):
        inside = ((frame["rank"] == rank) & (frame["start_ns"] >= start)
                  & (frame["start_ns"] < start + dur)).to_numpy()
        step[inside] = int(name.rsplit("#", 1)[1])
    return step


def _ranks(frame: pd.DataFrame) -> pd.DataFrame:
    """The RANKS table of the ranks that have events."""
    counts = frame.groupby("rank").size()
    return pd.DataFrame({
        "rank": counts.index.astype("int32"), "framework": "", "format": "",
        "path": [f"rank{r}" for r in counts.index], "version": "", "device": "", "backend": "",
        "world_size": np.int32(len(counts)), "clock_base_ns": np.int64(0),
        "clock_offset_ns": np.int64(0), "events": counts.to_numpy(dtype=np.int64),
    }, columns=schema.RANKS.names)


def op_index(ops: Ops, event: int) -> int:
    """The op made from event row `event` (its first segment, for a flattened host event)."""
    found = np.flatnonzero(ops.frame["event"].to_numpy() == event)
    if not len(found):
        raise KeyError(f"event {event} made no op")
    return int(found[0])
