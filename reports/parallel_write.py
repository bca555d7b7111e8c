"""Writing a timeline in parts: a head (the processes and the verdict), the profile's events cut
between tracks into parts encoded in parallel processes, then a tail, concatenated in order into
the output. Both formats allow it: a Perfetto trace is a sequence of packets (each part its own
packet sequence), Chrome's trace-event JSON an array whose pieces are joined by commas.

Workers are forked, so they share the laid-out timeline (numpy arrays) without copying it; a
part is written to a temporary file in the output's folder, then appended to the output.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from reports.tracks import Timeline
from tracegraph.progress import Progress

PARALLEL_EVENTS = 400_000  # fewer profile events than this are written in this process
PARTS_PER_JOB = 4  # parts per worker: finer progress, balanced work
PROGRESS_EVENTS = 200_000  # exports of more events than this show a progress bar

PartWriter = Callable[[Timeline, tuple[int, int], int, BinaryIO], int]
"""Writes the events of a range (Timeline.parts) as part number N (from 1) to a file; returns
how many records (packets, trace events) it wrote."""

_shared: tuple[Timeline, PartWriter] | None = None  # what forked workers read


def write_parts(timeline: Timeline, path: Path, head: Callable[[Timeline, BinaryIO], int],
                part: PartWriter, tail: bytes, label: str, jobs: int | None = None) -> int:
    """Write head, every part, tail to `path`; the number of records written."""
    workers = max(1, min(jobs or os.cpu_count() or 1, 64))
    if timeline.events < PARALLEL_EVENTS:
        workers = 1
    ranges = timeline.parts(workers * PARTS_PER_JOB if workers > 1 else 1)
    path = Path(path)
    with path.open("wb") as out, Progress(f"export: {label}", total=timeline.events,
                                          enabled=timeline.events > PROGRESS_EVENTS) as bar:
        count = head(timeline, out)
        if workers == 1:
            for number, rows in enumerate(ranges, start=1):
                count += part(timeline, rows, number, out)
                bar.advance(rows[1] - rows[0])
        else:
            count += _in_parallel(timeline, ranges, part, out, path.parent, workers, bar)
        out.write(tail)
    return count


def _in_parallel(timeline: Timeline, ranges: list[tuple[int, int]], part: PartWriter,
                 out: BinaryIO, folder: Path, workers: int, bar: Progress) -> int:
    global _shared
    _shared = (timeline, part)
    count = 0
    try:
        with tempfile.TemporaryDirectory(prefix=".tracegraph-export-", dir=folder) as tmp, \
                multiprocessing.get_context("fork").Pool(workers) as pool:
            jobs = [(rows, number, str(Path(tmp) / f"part{number}"))
                    for number, rows in enumerate(ranges, start=1)]
            results = pool.imap(_write_one, jobs)  # in order, as they finish
            for (rows, _, file), written in zip(jobs, results, strict=True):
                with open(file, "rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 22)
                os.unlink(file)
                count += written
                bar.advance(rows[1] - rows[0])
    finally:
        _shared = None
    return count


def _write_one(job: tuple[tuple[int, int], int, str]) -> int:
    rows, number, file = job
    timeline, part = _shared
    with open(file, "wb") as out:
        return part(timeline, rows, number, out)
