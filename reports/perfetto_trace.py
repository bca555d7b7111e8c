"""A `Timeline` (tracks.py) as a Perfetto protobuf trace, written with the `perfetto` package's
trace builder and streamed: packets are serialized a chunk at a time, each chunk a `Trace`
message (concatenated `Trace` messages are one `Trace`: its only field is repeated).

A packet sequence per part (parallel_write.py): the processes and the verdict, then each range
of the profile's events. In each, names, categories, arg names and string values are interned
(sent once, then referred to by id), tracks are described before their first slice, each slice
is a begin and an end packet on its track. A flow is one id per edge (`flow_ids` on the slice
it leaves, `terminating_flow_ids` on the slice it reaches): a Perfetto flow cannot fork.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from reports.parallel_write import write_parts
from reports.tracks import Batch, Nesting, Timeline, Track

CHUNK = 20_000  # packets serialized at a time (between batches)
_BEGIN, _END = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END
_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS_STATE = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_PROCESS = 1 << 62  # a process's track uuid: _PROCESS | pid


def write_perfetto(timeline: Timeline, path: Path, jobs: int | None = None) -> int:
    """Write `timeline` to `path` (.pftrace), the profile's events encoded in up to `jobs`
    processes; the number of packets written."""
    return write_parts(timeline, path, _head, _part, b"", "perfetto trace", jobs)


def track_uuid(index: int, level: int) -> int:
    """The uuid of a track's row at `level` (0: the track, then its overflow rows): the same
    in every part of the trace."""
    return level << 32 | index + 1


def _head(timeline: Timeline, file: BinaryIO) -> int:
    """Sequence 1: a process per rank, then the verdict's slices."""
    writer = _Writer(file, timeline, sequence=1)
    for process in timeline.processes:
        descriptor = writer.packet().track_descriptor
        descriptor.uuid = _PROCESS | process.pid
        descriptor.process.pid = process.pid
        descriptor.process.process_name = process.name
        descriptor.process.process_labels.extend(process.labels)
        descriptor.child_ordering = TrackDescriptor.EXPLICIT
    writer.write(timeline.verdict)
    return writer.finish()


def _part(timeline: Timeline, rows: tuple[int, int], number: int, file: BinaryIO) -> int:
    """Part N of the profile's events: sequence N + 1, its own interned strings."""
    writer = _Writer(file, timeline, sequence=number + 1)
    for batch in timeline.batches(rows):
        writer.write(batch)
    return writer.finish()


class _Interned:
    """One interning table: a string's id, added to the packet being written when new."""

    def __init__(self, field: str, key: str, as_bytes: bool = False) -> None:
        self.field, self.key, self.as_bytes = field, key, as_bytes
        self.ids: dict[str, int] = {}

    def __call__(self, value: str, packet: TracePacket) -> int:
        iid = self.ids.get(value)
        if iid is None:
            iid = self.ids[value] = len(self.ids) + 1
            text = value.encode() if self.as_bytes else value
            getattr(packet.interned_data, self.field).add(iid=iid, **{self.key: text})
        return iid


class _Writer:
    """Packets of one sequence, serialized in chunks."""

    def __init__(self, file: BinaryIO, timeline: Timeline, sequence: int) -> None:
        self.file, self.timeline, self.sequence = file, timeline, sequence
        self.builder = TraceProtoBuilder()
        self.add = self.builder.trace.packet.add
        self.count = self.pending = 0
        self.names = _Interned("event_names", "name")
        self.categories = _Interned("event_categories", "name")
        self.arg_names = _Interned("debug_annotation_names", "name")
        self.arg_strings = _Interned("debug_annotation_string_values", "str", as_bytes=True)
        self.uuids: dict[tuple[int, int], int] = {}  # (track, level) -> uuid, once described
        self.nesting = Nesting()
        self.packet(first_packet_on_sequence=True, sequence_flags=_CLEARED)

    def packet(self, **fields: int) -> TracePacket:
        """A new packet of the sequence with `fields` set (chunks end between batches only:
        a batch's args are added to its packets after they are all made)."""
        self.pending += 1
        return self.add(trusted_packet_sequence_id=self.sequence, **fields)

    def flush(self) -> None:
        self.file.write(self.builder.serialize())
        self.count += self.pending
        self.builder, self.pending = TraceProtoBuilder(), 0
        self.add = self.builder.trace.packet.add

    def finish(self) -> int:
        self._ends(self.nesting.close())
        self.flush()
        return self.count

    def track_uuid(self, track: Track, level: int) -> int:
        """The uuid of a track's row at `level`, described when first used."""
        uuid = self.uuids[track.index, level] = track_uuid(track.index, level)
        descriptor = self.packet().track_descriptor
        descriptor.uuid = uuid
        descriptor.name = track.name
        if track.rank is not None:
            descriptor.parent_uuid = _PROCESS | self.timeline.pids[track.rank]
            descriptor.sibling_order_rank = track.order
        return uuid

    def write(self, batch: Batch) -> None:
        """Begin packets of the batch's slices (an end packet right after for a slice alone on
        its track, else when a later slice or the end of its track closes it), then args."""
        if self.pending >= CHUNK:
            self.flush()
        self.pending += 2 * len(batch)
        tracks, add, nesting = self.timeline.tracks, self.add, self.nesting
        sequence = self.sequence
        name_ids, category_ids = self.names.ids, self.categories.ids
        packets = []
        row, uuid = (-1, -1), 0
        for i, (index, start, end, alone) in enumerate(zip(
                batch.track.tolist(), batch.start.tolist(), batch.end.tolist(),
                batch.flat.tolist(), strict=True)):
            if alone and not nesting.open:  # nothing open on any row: level 0, closes nothing
                level = 0
            else:
                level, closed = nesting.place(index, start, end, alone)
                if closed:
                    self._ends(closed)
            if row != (index, level):
                row = (index, level)
                uuid = self.uuids.get(row) or self.track_uuid(tracks[index], level)
            packet = add(timestamp=start, trusted_packet_sequence_id=sequence,
                         sequence_flags=_NEEDS_STATE)
            event = packet.track_event
            event.type = _BEGIN
            event.track_uuid = uuid
            name, category = batch.name[i], batch.category[i]
            event.name_iid = name_ids.get(name) or self.names(name, packet)
            event.category_iids.append(category_ids.get(category)
                                       or self.categories(category, packet))
            packets.append(packet)
            if alone:
                end_event = add(timestamp=end, trusted_packet_sequence_id=sequence).track_event
                end_event.type = _END
                end_event.track_uuid = uuid
        self._args(packets, batch)
        if batch.flow_in is not None:
            for packet, flow_in, flow_out in zip(packets, batch.flow_in, batch.flow_out,
                                                 strict=True):
                if flow_out:
                    packet.track_event.flow_ids.append(flow_out)
                if flow_in:
                    packet.track_event.terminating_flow_ids.append(flow_in)

    def _args(self, packets: list[TracePacket], batch: Batch) -> None:
        """Each arg column as debug annotations (names and string values interned)."""
        for name, where, values in batch.args:
            iid = self.arg_names(name, packets[where[0]])
            types = set(map(type, values))
            if types == {int}:
                for i, value in zip(where, values, strict=True):
                    packets[i].track_event.debug_annotations.add(name_iid=iid, int_value=value)
            elif types == {str}:
                strings, intern = self.arg_strings.ids, self.arg_strings
                for i, value in zip(where, values, strict=True):
                    packet = packets[i]
                    packet.track_event.debug_annotations.add(
                        name_iid=iid, string_value_iid=strings.get(value) or intern(value, packet))
            else:
                for i, value in zip(where, values, strict=True):
                    self._arg(packets[i], iid, value)

    def _arg(self, packet: TracePacket, iid: int, value: object) -> None:
        add = packet.track_event.debug_annotations.add
        if isinstance(value, str):
            add(name_iid=iid, string_value_iid=self.arg_strings(value, packet))
        elif isinstance(value, float):
            add(name_iid=iid, double_value=value)
        else:
            add(name_iid=iid, int_value=value)

    def _ends(self, closed: list[tuple[int, int, int]]) -> None:
        for index, level, end in closed:
            event = self.add(timestamp=end, trusted_packet_sequence_id=self.sequence).track_event
            event.type = _END
            event.track_uuid = self.uuids[index, level]
