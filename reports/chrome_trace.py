"""A `Timeline` (tracks.py) as Chrome trace-event JSON, for chrome://tracing and older tools,
streamed a batch at a time.

A process per rank (`process_name`, `process_labels`, `process_sort_index` metadata), a thread
per track row (`thread_name`, `thread_sort_index`), each slice a complete (`X`) event with its
fields as `args`. Flows are v2: `bind_id` with `flow_out` on the slice an arrow leaves and
`flow_in` on the one it reaches; a slice takes one `bind_id`, so each run of edges that share
slices (a chain, a stretch of the path across ranks) is one id. Times are µs written from the
integer ns (`ts` 1796014063510329.256 is exact; a float would round it). Written in parts
(parallel_write.py): the head opens the array, the parts' events follow it after commas.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from reports.parallel_write import write_parts
from reports.tracks import PID_BASE, Batch, Nesting, Timeline, Track

TOP_PID = PID_BASE - 1  # the process holding the top-level tracks


def write_chrome(timeline: Timeline, path: Path, jobs: int | None = None) -> int:
    """Write `timeline` to `path` (.json), the profile's events encoded in up to `jobs`
    processes; the number of trace events written."""
    return write_parts(timeline, path, _head, _part, b"\n]}\n", "chrome trace", jobs)


def _head(timeline: Timeline, file: BinaryIO) -> int:
    """The array's start, the processes' metadata, the verdict's slices."""
    file.write(b'{"displayTimeUnit":"ns","traceEvents":[\n')
    writer = _Writer(file, timeline, first=True)
    writer.metadata(TOP_PID, 0, "process_name", name="tracegraph")
    for process in timeline.processes:
        writer.metadata(process.pid, 0, "process_name", name=process.name)
        writer.metadata(process.pid, 0, "process_labels", labels=", ".join(process.labels))
        writer.metadata(process.pid, 0, "process_sort_index", sort_index=process.rank)
    writer.write(timeline.verdict)
    return writer.count


def _part(timeline: Timeline, rows: tuple[int, int], number: int, file: BinaryIO) -> int:
    """The events of a range, each after a comma (the head wrote the array's first ones)."""
    writer = _Writer(file, timeline, first=False)
    for batch in timeline.batches(rows):
        writer.write(batch)
    return writer.count


def _us(ns: np.ndarray) -> list[bytes]:
    """ns as exact decimal counts of µs."""
    whole, part = np.divmod(ns, 1000)
    return [b"%d.%03d" % pair for pair in zip(whole.tolist(), part.tolist(), strict=True)]


class _Writer:
    def __init__(self, file: BinaryIO, timeline: Timeline, first: bool) -> None:
        self.file, self.timeline, self.first = file, timeline, first
        self.count = 0
        self.pid = {p.rank: p.pid for p in timeline.processes}
        self.tids: dict[tuple[int, int], tuple[int, int]] = {}  # (track, level) -> pid, tid
        self.encoded: dict[str, bytes] = {}
        self.nesting = Nesting()

    def emit(self, events: list[bytes]) -> None:
        """Trace events, each already JSON."""
        if events:
            lead = b"" if self.first and not self.count else b",\n"
            self.file.write(lead + b",\n".join(events))
            self.count += len(events)

    def metadata(self, pid: int, tid: int, what: str, **args: object) -> None:
        self.emit([orjson.dumps({"ph": "M", "name": what, "pid": pid, "tid": tid,
                                 "args": args})])

    def where(self, track: Track, level: int) -> tuple[int, int]:
        """pid, tid of a track's row at `level` (0: itself, then overflow rows), named when
        first used."""
        pid = self.pid[track.rank] if track.rank is not None else TOP_PID
        if (track.index, level) not in self.tids:
            tid = level << 24 | track.index + 1  # the same in every part
            self.tids[track.index, level] = (pid, tid)
            self.metadata(pid, tid, "thread_name", name=track.name)
            self.metadata(pid, tid, "thread_sort_index", sort_index=track.order)
        return self.tids[track.index, level]

    def write(self, batch: Batch) -> None:
        """The batch's slices as complete events; args and flows as JSON objects."""
        tracks, place = self.timeline.tracks, self.nesting.place
        args = self._args(batch)
        flows = self._flows(batch)
        texts = []
        for i, (index, start, end, flat, ts, dur) in enumerate(zip(
                batch.track.tolist(), batch.start.tolist(), batch.end.tolist(),
                batch.flat.tolist(), _us(batch.start), _us(batch.end - batch.start),
                strict=True)):
            level = 0 if flat and not self.nesting.open else place(index, start, end, flat)[0]
            pid, tid = self.tids.get((index, level)) or self.where(tracks[index], level)
            texts.append(b'{"ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"name":%s,"cat":%s,'
                         b'"args":%s%s}' % (ts, dur, pid, tid, self.json(batch.name[i]),
                                            self.json(batch.category[i]), args[i], flows[i]))
        self.emit(texts)

    def json(self, text: str) -> bytes:
        """A string as JSON, each distinct one encoded once."""
        encoded = self.encoded.get(text)
        if encoded is None:
            encoded = self.encoded[text] = orjson.dumps(text)
        return encoded

    def _args(self, batch: Batch) -> list[bytes]:
        """Each slice's args as a JSON object, built column by column."""
        fields: list[list[bytes]] = [[] for _ in range(len(batch))]
        for name, where, values in batch.args:
            key = self.json(name) + b":"
            for i, value in zip(where, values, strict=True):
                fields[i].append(key + (self.json(value) if isinstance(value, str)
                                        else orjson.dumps(value)))
        return [b"{" + b",".join(f) + b"}" for f in fields]

    def _flows(self, batch: Batch) -> list[bytes]:
        """v2 flow fields of each slice (empty for most)."""
        if batch.flow_in is None:
            return [b""] * len(batch)
        runs = self.timeline.flow_runs
        return [b',"bind_id":%d,"flow_in":%s,"flow_out":%s' % (
            runs[into or out], b"true" if into else b"false", b"true" if out else b"false")
            if into or out else b"" for into, out in zip(batch.flow_in, batch.flow_out,
                                                         strict=True)]
