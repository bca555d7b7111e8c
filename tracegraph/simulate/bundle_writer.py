"""Simulated bundles: all ranks' profiles in one deterministic `.tar.gz`, the ground truth beside.

The format writers (`write_ascend`, `write_kineto`, `write_nsys`) turn a `Timeline` into
`(member path, data)` pairs, one rank (an nsys export: one node) at a time and in sorted path
order; this module streams them into an archive that the same Timeline always regenerates bit for
bit, and holds the helpers the writers share (rank clocks, host-call room, chunked JSON rows).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterable, Sequence
from importlib import import_module
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from tracegraph.schema import COLLECTIVE, COMM_TYPES, COMPUTE, MEMCPY, P2P, RECORD, WAIT
from tracegraph.simulate.timeline import TIMELINE_COLUMNS, Timeline

EPOCH_NS = 1_767_225_600_000_000_000
"""Wall-clock ns (2026-01-01T00:00:00Z) of true time 0, for Timelines whose clock starts near 0."""

WRITERS = {("ascend", "text"): "tracegraph.simulate.write_ascend",
           ("ascend", "db"): "tracegraph.simulate.write_ascend_db",
           ("kineto", "text"): "tracegraph.simulate.write_kineto",
           ("nsys", "text"): "tracegraph.simulate.write_nsys"}
"""(format, layout) -> the writer module; `db` is the profiler's database export."""
DEVICE_KINDS = (COMPUTE, WAIT, RECORD, COLLECTIVE, P2P, MEMCPY)
CHUNK_ROWS = 100_000  # rows rendered per chunk: bounds the Python objects alive at once

Data = bytes | list[bytes]
"""A member's content: bytes, or parts to concatenate (a big trace need never exist joined)."""


def write_bundle(timeline: Timeline, out: Path, fmt: str, layout: str = "text") -> Path:
    """Write `OUT.tar.gz` (every rank's profile as `fmt`, its files as `layout`: text or db)
    and `OUT.ground_truth.json` beside it.

    Regenerates bit for bit: sorted members, fixed mtimes/owners, gzip mtime 0.
    """
    if (fmt, layout) not in WRITERS:
        known = sorted({f for f, _ in WRITERS})
        if fmt not in known:
            raise ValueError(f"unknown simulated format {fmt!r}; expected one of {known}")
        raise ValueError(f"format {fmt} has no {layout!r} layout; expected one of "
                         f"{sorted(lay for f, lay in WRITERS if f == fmt)}")
    check_timeline(timeline)
    writer = import_module(WRITERS[(fmt, layout)])
    out = Path(out)
    stem = out.name.removesuffix(".tar.gz")
    archive = out.with_name(f"{stem}.tar.gz")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{stem}.tar.gz.partial")
    try:
        write_tar_gz(partial, ((f"{stem}/{path}", data)
                               for path, data in writer.iter_files(timeline)))
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    truth = ground_truth(timeline, fmt, writer.group_ids(timeline), writer.rank_roots(timeline))
    archive.with_name(f"{stem}.ground_truth.json").write_bytes(truth)
    return archive


def check_timeline(timeline: Timeline) -> None:
    """ValueError (one line, saying what is wrong) unless the writers can use `timeline`."""
    ops = timeline.ops
    missing = [c for c in TIMELINE_COLUMNS if c not in ops.columns]
    if missing:
        raise ValueError(f"Timeline.ops lacks the columns {missing}")
    if ops.empty:
        raise ValueError("Timeline.ops holds no ops")
    if (ops["dur_ns"] < 0).any():
        raise ValueError(f"Timeline.ops has {int((ops['dur_ns'] < 0).sum())} negative dur_ns")
    unknown = set(ops["kind"]) - set(DEVICE_KINDS)
    if unknown:
        raise ValueError(f"Timeline.ops has kinds {sorted(unknown)}; expected {DEVICE_KINDS}")
    comm = ops.loc[ops["kind"].isin((COLLECTIVE, P2P)), ["rank", "group", "comm", "kind", "peer"]]
    unknown = set(comm["comm"]) - set(COMM_TYPES)
    if unknown:
        raise ValueError(f"Timeline.ops has comm types {sorted(unknown)}; expected {COMM_TYPES}")
    members = {gid: {int(r) for r in info.ranks} for gid, info in timeline.groups.items()}
    pairs = comm[["rank", "group"]].drop_duplicates()
    strays = [(int(r), g) for r, g in zip(pairs["rank"], pairs["group"], strict=True)
              if int(r) not in members.get(g, ())]
    if strays:
        raise ValueError(f"comm ops of (rank, group) {strays[:5]} name a group missing from "
                         "Timeline.groups or not holding that rank")
    p2p = comm.loc[comm["kind"] == P2P, ["group", "peer"]].drop_duplicates()
    lost = [(g, int(p)) for g, p in zip(p2p["group"], p2p["peer"], strict=True)
            if int(p) not in members[g]]
    if lost:
        raise ValueError(f"P2P ops of (group, peer) {lost[:5]} name a peer outside the group")


def write_tar_gz(path: Path, members: Iterable[tuple[str, Data]]) -> None:
    """Stream `members` (in sorted order) into a deterministic gzip-compressed tar at `path`."""
    last = ""
    with path.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            if name <= last:
                raise ValueError(f"archive members out of order: {name!r} after {last!r}")
            parts = [data] if isinstance(data, bytes) else data
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = sum(map(len, parts)), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, _Parts(parts))
            last = name


class _Parts(io.RawIOBase):
    """A readable stream over byte parts, without joining them."""

    def __init__(self, parts: list[bytes]):
        self._parts, self._index, self._offset = parts, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        """Fill `buffer` from as many parts as it takes (short only at the end)."""
        filled = 0
        while filled < len(buffer) and self._index < len(self._parts):
            part = self._parts[self._index]
            size = min(len(buffer) - filled, len(part) - self._offset)
            buffer[filled:filled + size] = part[self._offset:self._offset + size]
            filled, self._offset = filled + size, self._offset + size
            if self._offset == len(part):
                self._index, self._offset = self._index + 1, 0
        return filled


def joined(data: Data) -> bytes:
    """A member's content as one bytes object."""
    return data if isinstance(data, bytes) else b"".join(data)


def gzip_bytes(data: Data) -> bytes:
    """`data` gzip-compressed with no file name and mtime 0 in the header (deterministic)."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        for part in [data] if isinstance(data, bytes) else data:
            gz.write(part)
    return out.getvalue()


def ground_truth(timeline: Timeline, fmt: str, group_ids: dict[str, str],
                 roots: dict[int, str]) -> bytes:
    """ground_truth.json: the injected causes plus how the Timeline maps onto the written files."""
    truth = {
        "scenario": timeline.scenario,
        "format": fmt,
        "params": timeline.params,
        "ranks": {str(r): roots[r] for r in sorted(roots)},
        "clock_offset_ns": {str(r): int(o) for r, o in sorted(timeline.clock_offset_ns.items())},
        "groups": {
            gid: {"id": group_ids[gid], "desc": info.desc,
                  "ranks": sorted(int(r) for r in info.ranks)}
            for gid, info in sorted(timeline.groups.items())
        },
        "steps": [
            {"rank": s.rank, "step": s.step, "start_ns": s.start_ns, "end_ns": s.end_ns}
            for s in sorted(timeline.steps, key=lambda s: (s.rank, s.step))
        ],
        **timeline.ground_truth,
    }
    return json.dumps(truth, indent=2, sort_keys=True, default=_plain).encode() + b"\n"


def _plain(value: object) -> object:
    """JSON fallback for numpy scalars and arrays."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"ground truth value of type {type(value).__name__} is not JSON-serializable")


# --- helpers shared by the format writers -------------------------------------------------------

def clock_shift(timeline: Timeline) -> dict[int, int]:
    """Rank -> ns to add to a true time to get that rank's wall clock (epoch + its clock offset)."""
    base = EPOCH_NS if int(timeline.ops["start_ns"].min()) < 10**17 else 0
    return {r: base + int(timeline.clock_offset_ns.get(r, 0)) for r in timeline.ranks}


def time_bounds(timeline: Timeline) -> dict[int, tuple[int, int]]:
    """Rank -> (first, last) true ns it profiled: host launches, device ops and steps."""
    ops = timeline.ops
    first = ops[["launch_ns", "start_ns"]].min(axis=1).groupby(ops["rank"]).min()
    last = (ops["start_ns"] + ops["dur_ns"]).groupby(ops["rank"]).max()
    bounds = {int(r): (int(first[r]), int(last[r])) for r in first.index}
    for s in timeline.steps:
        lo, hi = bounds.get(s.rank, (s.start_ns, s.end_ns))
        bounds[s.rank] = (min(lo, s.start_ns), max(hi, s.end_ns))
    return bounds


GROUND_TRUTH_ONLY = ("phase", "microbatch", "chunk", "meta_step")
"""Timeline columns no profiler records: the writers never even read them."""


def rank_frames(timeline: Timeline) -> dict[int, pd.DataFrame]:
    """Each rank's ops (fresh index), without the ground-truth-only columns."""
    ops = timeline.ops.drop(columns=list(GROUND_TRUTH_ONLY)).reset_index(drop=True)
    return {int(r): frame for r, frame in ops.groupby("rank", sort=False)}


def comm_instances(frames: dict[int, pd.DataFrame]) -> pd.Series:
    """Op index -> instance number of each comm op within its group: its `seq`, else its order
    among the rank's ops of that group (by launch)."""
    comm = pd.concat([f[f["kind"].isin((COLLECTIVE, P2P))] for f in frames.values()])
    comm = comm.sort_values(["rank", "launch_ns", "start_ns"], kind="stable")
    counted = comm.groupby(["rank", "group"], sort=False).cumcount()
    return comm["seq"].where(comm["seq"] >= 0, counted).astype("int64")


def host_room(launch_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Room (ns) before and after each host call of one thread (sorted by time).

    Spans a writer nests around a call at `t` stay inside `[t - before, t + after]`, which never
    reaches the neighbouring calls' room, so sibling host events never overlap.
    """
    gaps = np.diff(launch_ns)
    before = np.minimum(np.concatenate([[4_000], gaps // 4]), 4_000)
    after = np.minimum(np.concatenate([gaps // 2, [10_000]]), 10_000)
    return before.astype(np.int64), after.astype(np.int64)


def plain_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """String columns as plain Python objects (much faster to iterate than Arrow strings)."""
    return frame.astype({c: object for c, t in frame.dtypes.items() if t == "string"})


def json_strings(values: Iterable[str]) -> np.ndarray:
    """Each value as a JSON string literal (quoted, escaped), encoding each distinct value once."""
    if not isinstance(values, pd.Series | np.ndarray):
        values = np.asarray(list(values), dtype=object)
    codes, uniques = pd.factorize(values)
    encoded = np.array([orjson.dumps(str(u)).decode() for u in uniques], dtype=object)
    return encoded[codes] if len(codes) else np.empty(0, dtype=object)


def micros(ns) -> tuple[np.ndarray, np.ndarray]:
    """ns as (whole µs, ns remainder): formatted `%d.%03d`, a µs value exact to the ns."""
    ns = np.asarray(ns, dtype=np.int64)
    return ns // 1000, ns % 1000


def render(template: str, columns: Sequence[object], rows: int) -> list[bytes]:
    """`rows` rows of `template % (col0[i], col1[i], ...)`, joined by `,\\n`, in encoded chunks.

    A column is an array (or list) of `rows` values, or one value for every row.
    """
    arrays = [np.asarray(c) if np.ndim(c) else None for c in columns]
    chunks = []
    for lo in range(0, rows, CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, rows)
        cols = [a[lo:hi].tolist() if a is not None else [c] * (hi - lo)
                for a, c in zip(arrays, columns, strict=True)]
        chunks.append(",\n".join(template % row for row in zip(*cols, strict=True)).encode())
    return chunks


def json_array(sections: Iterable[list[bytes]]) -> list[bytes]:
    """The parts of a JSON array holding every rendered chunk of every section."""
    chunks = [c for section in sections for c in section if c]
    parts = [b"["]
    for i, chunk in enumerate(chunks):
        parts += [b",\n", chunk] if i else [chunk]
    return [*parts, b"]"]
