"""Reading a written Perfetto trace back with the `perfetto` package's protobuf classes, the way
Perfetto's trace processor does: interned strings resolved per sequence, packets ordered by
timestamp (stably), each track's begin/end events matched innermost first, a flow id joining the
slice it leaves to the slice that terminates it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent


@dataclass
class Slice:
    track: int  # uuid
    start: int
    end: int
    name: str
    category: str
    args: dict[str, object]
    depth: int
    flow_out: list[int] = field(default_factory=list)
    flow_in: list[int] = field(default_factory=list)


@dataclass
class Decoded:
    processes: dict[int, tuple[int, str, list[str]]]  # uuid -> pid, name, labels
    tracks: dict[int, tuple[str, int, int]]  # uuid -> name, parent uuid, sibling order
    slices: list[Slice]
    unmatched_ends: int

    def track_names(self, process_uuid: int) -> list[str]:
        """A process's tracks' names in their declared order (overflow rows included)."""
        rows = [(order, name) for name, parent, order in self.tracks.values()
                if parent == process_uuid]
        return [name for _, name in sorted(rows, key=lambda row: row[0])]

    def on(self, process_name: str, track_name: str) -> list[Slice]:
        """The slices of a process's tracks of that name (overflow rows included), by start."""
        process = next(uuid for uuid, (_, name, _) in self.processes.items()
                       if name == process_name)
        uuids = {uuid for uuid, (name, parent, _) in self.tracks.items()
                 if parent == process and name == track_name}
        return sorted((s for s in self.slices if s.track in uuids), key=lambda s: s.start)

    def flows(self) -> list[tuple[Slice, Slice]]:
        """(source, destination) of every flow id."""
        out = {f: s for s in self.slices for f in s.flow_out}
        into = {f: s for s in self.slices for f in s.flow_in}
        return [(out[f], into[f]) for f in sorted(out.keys() & into.keys())]


def decode(path: Path) -> Decoded:
    trace = Trace()
    trace.ParseFromString(Path(path).read_bytes())
    interned: dict[str, dict[int, str]] = {}
    processes, tracks, events = {}, {}, []
    for index, packet in enumerate(trace.packet):
        if packet.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            interned = {}
        for table, entries in packet.interned_data.ListFields():
            for entry in entries:
                text = entry.str.decode() if table.name == "debug_annotation_string_values" \
                    else entry.name
                interned.setdefault(table.name, {})[entry.iid] = text
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                processes[d.uuid] = (d.process.pid, d.process.process_name,
                                     list(d.process.process_labels))
            else:
                tracks[d.uuid] = (d.name, d.parent_uuid, d.sibling_order_rank)
        if packet.HasField("track_event"):
            event = packet.track_event
            resolved = (interned["event_names"][event.name_iid],
                        interned["event_categories"][event.category_iids[0]],
                        _args(event, interned)) if event.type == TrackEvent.TYPE_SLICE_BEGIN \
                else None
            events.append((packet.timestamp, index, event, resolved))
    events.sort(key=lambda e: (e[0], e[1]))
    open_slices: dict[int, list[Slice]] = {}
    slices, unmatched = [], 0
    for ts, _, event, resolved in events:
        stack = open_slices.setdefault(event.track_uuid, [])
        if resolved is not None:
            piece = Slice(event.track_uuid, ts, -1, *resolved, len(stack),
                          list(event.flow_ids), list(event.terminating_flow_ids))
            stack.append(piece)
            slices.append(piece)
        elif event.type == TrackEvent.TYPE_SLICE_END:
            if stack:
                stack.pop().end = ts
            else:
                unmatched += 1
    return Decoded(processes, tracks, slices, unmatched)


def _args(event: TrackEvent, names: dict[str, dict[int, str]]) -> dict[str, object]:
    args = {}
    for a in event.debug_annotations:
        key = names["debug_annotation_names"][a.name_iid]
        if a.HasField("string_value_iid"):
            args[key] = names["debug_annotation_string_values"][a.string_value_iid]
        elif a.HasField("double_value"):
            args[key] = a.double_value
        else:
            args[key] = a.int_value
    return args
