"""What a timeline viewer shows of an analysis, whatever the file format: processes, tracks,
slices and flows. `perfetto_trace.py` and `chrome_trace.py` only encode what this lays out.

One process per rank. In it, a track per lane (device stream, HCCL plane, host thread: the lane
names of the trace) holding the profile's own events, names and fields kept, and three tracks of
the verdict: `bubbles` (every bubble over the threshold, named by its cause, its charged
intervals nested in it), `critical path` (the path's segments that ran on the rank) and
`causal chains` (the pieces of the top bubbles' chains that ran on the rank). One top-level
`critical path` track holds every step's whole path. Flows: one per edge, from each path segment
to the next where the path moves to another rank, and along each top bubble's chain, from its
earliest piece to the next and at last to where the bubble ended. Times are ns on the clock
aligned across ranks (the analysis's), shifted only if some would be negative.

Everything is streamed in batches, in the order slices are placed: track after track, each
track's slices by start, longest first, so a writer nests each slice in the one before it or
opens an overflow track (same name) for one that overlaps without nesting (`Nesting`). The
events can be cut into parts between tracks, for writers to encode in parallel
(parallel_write.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble

PID_BASE = 1_000_000  # rank r is process PID_BASE + r (pid 0 is the idle process in Perfetto)
BATCH = 32_768  # profile events per batch
MIN_PIECE = 0.02  # chain pieces shorter than this share of their bubble are not drawn
BUBBLES, PATH, CHAINS = "bubbles", "critical path", "causal chains"
VERDICT = "tracegraph"  # the category of every slice of the verdict
EVENT_ARGS = ("comm", "group", "peer", "seq", "bytes", "dtype", "correlation", "event_id",
              "wait_on_stream", "notify_id", "src_rank", "dst_rank", "annotation")
"""Fields of the normalized events kept as a slice's args (where the profile set them); its
category is the profile's own (`task_type`: Kineto's `cat`, Ascend's task type) and tracegraph's
kind of op, "kernel,compute"."""

ArgColumn = tuple[str, Sequence[int], Sequence[object]]
"""An arg of a batch: its name, the positions of the slices that have it, and their values."""


@dataclass(frozen=True)
class Process:
    """A rank's process."""

    rank: int
    pid: int
    name: str
    labels: tuple[str, ...]  # framework, device, the clock offset applied


@dataclass(frozen=True)
class Track:
    """A named row: a lane of a rank, a verdict track of a rank, or the top-level path."""

    index: int
    name: str
    rank: int | None  # the rank whose process holds it; None for the top-level track
    order: int  # its place among the process's tracks


@dataclass
class Batch:
    """Slices in placement order: by track, then start, longest first."""

    track: np.ndarray  # Track.index of each slice
    start: np.ndarray  # ns
    end: np.ndarray
    flat: np.ndarray  # the slice overlaps none of its track: everything before it has ended
    name: Sequence[str]
    category: Sequence[str]  # the profile's category and the op kind, or VERDICT
    args: Sequence[ArgColumn]
    flow_in: Sequence[int] | None = None  # the edge that ends at each slice (0: none)
    flow_out: Sequence[int] | None = None  # the edge that leaves it (0: none)

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class Timeline:
    """Processes, tracks and the slice batches of one export."""

    processes: list[Process]
    tracks: list[Track]
    verdict: Batch  # bubbles, path segments, chain pieces (small)
    events: int  # how many profile events `batches` yields
    shift: int  # ns added to every aligned time (0 unless some would be negative)
    flow_runs: dict[int, int] = field(default_factory=dict)
    """edge -> the first edge of its run of edges that share slices (one id per run where a
    format can give a slice only one flow id, as Chrome's v2 `bind_id`)"""
    _source: _EventSource | None = None

    @property
    def pids(self) -> dict[int, int]:
        """rank -> the pid of its process."""
        return {p.rank: p.pid for p in self.processes}

    def parts(self, count: int) -> list[tuple[int, int]]:
        """The profile's events cut into `count` or fewer ranges of about equal size, between
        tracks (a track's slices are placed in one go): [start, stop) in placement order."""
        if self._source is None or count <= 1:
            return [(0, self.events)] if self.events else []
        track = self._source.track[self._source.order]
        cuts = np.flatnonzero(track[1:] != track[:-1]) + 1  # where a track begins
        wanted = np.linspace(0, self.events, count + 1)[1:-1]
        chosen = np.unique(cuts[np.minimum(np.searchsorted(cuts, wanted), len(cuts) - 1)]) \
            if len(cuts) else np.zeros(0, dtype=np.int64)
        bounds = [0, *chosen.tolist(), self.events]
        return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    def batches(self, rows: tuple[int, int]) -> Iterator[Batch]:
        """The profile's events of `rows` (a range of `parts`), streamed."""
        if self._source is not None:
            yield from self._source.batches(*rows)


class Nesting:
    """Places slices given track after track, each track's by start (longest first): each
    nests in an open slice of its row or follows it; one overlapping an open slice without
    nesting goes to the first overflow row (level) of its track where it fits. `place` returns
    the level and the (track, level, end) of the slices it closed, `close` those still open.
    A slice alone on its track is never held open."""

    def __init__(self) -> None:
        self.track = -1
        self.open: list[list[int]] = []  # per level, the ends of its open slices, innermost last

    def place(self, track: int, start: int, end: int, alone: bool = False
              ) -> tuple[int, list[tuple[int, int, int]]]:
        """Its level and the slices it closed; a slice `alone` on its track (Batch.flat)
        closes whatever is open and stays open itself only until the caller ends it."""
        closed = self.close() if track != self.track or (alone and self.open) else []
        self.track = track
        if alone:
            return 0, closed
        for level, ends in enumerate(self.open):
            while ends and ends[-1] <= start:
                closed.append((track, level, ends.pop()))
            if not ends or end <= ends[-1]:
                ends.append(end)
                return level, closed
        self.open.append([end])
        return len(self.open) - 1, closed

    def close(self) -> list[tuple[int, int, int]]:
        closed = [(self.track, level, end) for level, ends in enumerate(self.open)
                  for end in reversed(ends)]
        self.open = []
        return closed


def build_timeline(analysis: Analysis, *, top: int = 10) -> Timeline:
    """Lay out `analysis` (its trace's events, bubbles, critical paths) for a timeline viewer;
    the chains of the `top` longest bubbles become flows."""
    events = analysis.trace.events
    offsets = analysis.offsets
    aligned = events["start_ns"].to_numpy() - events["rank"].map(offsets).fillna(0).to_numpy(
        dtype=np.int64) if len(events) else np.zeros(0, dtype=np.int64)
    earliest = min([int(aligned.min())] if len(aligned) else [0])
    shift = max(0, -earliest)
    lanes = _lane_tracks(analysis)
    tracks = [Track(0, PATH, None, 0)]
    processes = [_process(analysis, rank) for rank in analysis.trace.rank_ids]
    verdict_tracks: dict[tuple[int, str], Track] = {}
    for rank, lane_rows in lanes.groupby("rank", sort=True):
        names = [lane for lane in lane_rows["lane"] if lane]
        for order, name in enumerate([*names[:1], BUBBLES, PATH, CHAINS, *names[1:]]):
            track = Track(len(tracks), name, int(rank), order)
            tracks.append(track)
            verdict_tracks[int(rank), name] = track
    verdict, runs = _Verdict(analysis, verdict_tracks, tracks[0], shift).batch(top)
    source = _EventSource(events, aligned + shift, verdict_tracks) if len(events) else None
    return Timeline(processes, tracks, verdict, len(events), shift, runs, source)


# --- tracks ----------------------------------------------------------------------------------
def _lane_tracks(analysis: Analysis) -> pd.DataFrame:
    """rank, lane of every lane with events, each rank's main lane first, then its streams,
    comm lanes and threads in natural order; ranks without events get their verdict tracks."""
    events = analysis.trace.events
    lanes = events[["rank", "lane", "lane_kind"]].drop_duplicates().astype(
        {"rank": "int64", "lane": str, "lane_kind": str})
    main = {(int(r), str(lane)) for r, lane in zip(
        analysis.ops.lanes.loc[analysis.ops.lanes["main"], "rank"],
        analysis.ops.lanes.loc[analysis.ops.lanes["main"], "lane"], strict=True)}
    kinds = {kind: i for i, kind in enumerate(schema.LANE_KINDS)}
    lanes["key"] = [(0 if (r, lane) in main else 1, kinds.get(kind, 9), _natural(lane))
                    for r, lane, kind in zip(lanes["rank"], lanes["lane"], lanes["lane_kind"],
                                             strict=True)]
    missing = set(analysis.trace.rank_ids) - set(lanes["rank"])
    empty = pd.DataFrame({"rank": sorted(missing), "lane": "", "lane_kind": "",
                          "key": [(0, 0, ())] * len(missing)})
    lanes = pd.concat([lanes, empty], ignore_index=True) if missing else lanes
    return lanes.sort_values(["rank", "key"], kind="stable", ignore_index=True)


def _natural(name: str) -> tuple:
    """"stream 5" before "stream 47": digits compared as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _process(analysis: Analysis, rank: int) -> Process:
    ranks = analysis.trace.ranks
    row = ranks[ranks["rank"] == rank].iloc[0]
    offset = analysis.offsets.get(rank, 0)
    labels = tuple(str(v) for v in (row["framework"], row["device"]) if str(v))
    return Process(rank, PID_BASE + rank, f"rank {rank}",
                   (*labels, f"clock offset {-offset / 1e3:+.1f} µs"))


# --- the verdict -----------------------------------------------------------------------------
@dataclass
class _Slice:
    track: Track
    start: int
    end: int
    name: str
    args: list[tuple[str, object]]
    flow_in: int = 0
    flow_out: int = 0


class _Verdict:
    """Bubbles, critical paths and the top bubbles' chains as slices and flows."""

    def __init__(self, analysis: Analysis, tracks: dict[tuple[int, str], Track], top: Track,
                 shift: int) -> None:
        self.analysis, self.tracks, self.top, self.shift = analysis, tracks, top, shift
        self.slices: list[_Slice] = []
        self.runs: dict[int, int] = {}

    def batch(self, top: int) -> tuple[Batch, dict[int, int]]:
        for number, bubble in enumerate(self.analysis.bubbles, start=1):
            self._bubble(bubble, number if number <= top else 0)
        for step, path in sorted(self.analysis.critical_paths.items()):
            self._path(step, path)
        for number, bubble in enumerate(self.analysis.bubbles[:top], start=1):
            self._chain(number, bubble)
        slices = sorted(self.slices, key=lambda s: (s.track.index, s.start, -s.end))
        columns: dict[str, tuple[list[int], list[object]]] = {}
        for i, piece in enumerate(slices):
            for name, value in piece.args:
                column = columns.setdefault(name, ([], []))
                column[0].append(i)
                column[1].append(value)
        return Batch(
            track=np.array([s.track.index for s in slices], dtype=np.int64),
            start=np.array([s.start + self.shift for s in slices], dtype=np.int64),
            end=np.array([s.end + self.shift for s in slices], dtype=np.int64),
            flat=np.zeros(len(slices), dtype=bool), name=[s.name for s in slices],
            category=[VERDICT] * len(slices),
            args=[(name, *column) for name, column in columns.items()],
            flow_in=[s.flow_in for s in slices], flow_out=[s.flow_out for s in slices]
        ), self.runs

    def _add(self, rank: int, track: str, start: int, end: int, name: str,
             args: list[tuple[str, object]]) -> _Slice | None:
        where = self.tracks.get((rank, track))
        if where is None:
            return None
        piece = _Slice(where, start, end, name, args)
        self.slices.append(piece)
        return piece

    def _link(self, pieces: list[_Slice | None]) -> None:
        """Flows from each piece to the next: one edge each, one run for the whole list."""
        pieces = [p for p in pieces if p is not None]
        first = 0
        for source, target in zip(pieces, pieces[1:], strict=False):
            edge = len(self.runs) + 1
            first = first or edge
            self.runs[edge] = first
            source.flow_out, target.flow_in = edge, edge

    def _bubble(self, bubble: Bubble, number: int) -> None:
        root = bubble.root
        args: list[tuple[str, object]] = [
            ("cause", bubble.category), ("waiting", bubble.name), ("lane", bubble.lane),
            ("step", bubble.step), ("dur_ms", round(bubble.dur / 1e6, 3)),
            ("chain", " ← ".join(f"rank {r}" for r in bubble.chain())),
            ("confidence", bubble.sureness), ("confidence score", round(bubble.confidence, 2))]
        if bubble.evidence:
            args.append(("weakest link", bubble.evidence))
        if root is not None:
            args += _root_args(root)
        if number:
            args.append(("top", f"#{number}"))
        self._add(bubble.rank, BUBBLES, bubble.start, bubble.end, bubble.category, args)
        for piece in bubble.intervals:
            self._add(bubble.rank, BUBBLES, piece.start, piece.end, piece.category,
                      _root_args(piece))

    def _path(self, step: int, path: list) -> None:
        pieces = []
        for seg in path:
            name = f"{seg.kind}: {seg.category}"
            args = [("step", step), ("kind", seg.kind), ("category", seg.category),
                    ("rank", seg.rank), ("lane", seg.lane), ("op", seg.name),
                    *([("note", seg.note)] if seg.note else [])]
            self.slices.append(_Slice(self.top, seg.start, seg.end, name, args))
            pieces.append(self._add(seg.rank, PATH, seg.start, seg.end, name, args))
        hops: list[_Slice | None] = []  # runs of consecutive segments on different ranks
        for before, after in zip(pieces, pieces[1:], strict=False):
            if before is None or after is None or before.track.rank == after.track.rank:
                self._link(hops)
                hops = []
                continue
            hops = hops or [before]
            hops.append(after)
        self._link(hops)

    def _chain(self, number: int, bubble: Bubble) -> None:
        """The chain's pieces on the ranks that ran them, in time, and where the bubble ended."""
        pieces = sorted((p for p in bubble.intervals if p.dur >= MIN_PIECE * bubble.dur),
                        key=lambda p: p.start)
        label = f"#{number} rank {bubble.rank} {bubble.lane} {bubble.name}"
        slices = [self._add(p.rank, CHAINS, p.start, p.end, f"#{number} {p.category}",
                            [("bubble", label), ("category", p.category), *_root_args(p)])
                  for p in pieces]
        slices.append(self._add(bubble.rank, CHAINS, bubble.end, bubble.end,
                                f"#{number} released",
                                [("bubble", label), ("cause", bubble.category),
                                 ("dur_ms", round(bubble.dur / 1e6, 3))]))
        self._link(slices)


def _root_args(piece) -> list[tuple[str, object]]:
    """root.rank / root.lane / root.op of a charged interval, and its note."""
    args: list[tuple[str, object]] = [("root.rank", piece.rank), ("root.lane", piece.lane),
                                      ("root.op", piece.name)]
    if piece.note:
        args.append(("root.note", piece.note))
    if piece.unprofiled_group:
        args.append(("root.absent group", piece.unprofiled_group))
    return args


# --- the profile's events --------------------------------------------------------------------
class _EventSource:
    """The trace's events as batches, by track then start (longest first), never all at once
    as Python objects: each batch takes its rows from the columns (strings as codes)."""

    def __init__(self, events: pd.DataFrame, start: np.ndarray,
                 tracks: dict[tuple[int, str], Track]) -> None:
        self.events = events
        lanes = _Strings(events["lane"])
        rank = events["rank"].to_numpy(dtype=np.int64)
        ranks = np.unique(rank)
        key = np.searchsorted(ranks, rank) * (len(lanes.values) + 1) + lanes.codes
        keys, inverse = np.unique(key, return_inverse=True)
        table = np.array([tracks[int(ranks[k // (len(lanes.values) + 1)]),
                                 str(lanes.values[k % (len(lanes.values) + 1)])].index
                          for k in keys], dtype=np.int32)
        del lanes, key, rank
        self.track = table[inverse]
        self.start = start
        self.end = start + np.maximum(events["dur_ns"].to_numpy(), 0)
        self.order = np.lexsort((-self.end, self.start, self.track))
        self.flat = _alone(self.track[self.order], self.start[self.order],
                           self.end[self.order])
        self.strings = {c: _Strings(events[c]) for c in ("name", "kind", "task_type", *EVENT_ARGS)
                        if not pd.api.types.is_integer_dtype(events[c].dtype)}

    def batches(self, first: int, stop: int) -> Iterator[Batch]:
        for lo in range(first, stop, BATCH):
            rows = self.order[lo:min(lo + BATCH, stop)]
            yield Batch(track=self.track[rows], start=self.start[rows], end=self.end[rows],
                        flat=self.flat[lo:lo + len(rows)], name=self.strings["name"].take(rows),
                        category=self._categories(rows), args=self._args(rows))

    def _categories(self, rows: np.ndarray) -> list[str]:
        """"kernel,compute": the profile's category, then the kind of op."""
        source, kind = self.strings["task_type"], self.strings["kind"]
        width = len(kind.values) + 1
        pairs, inverse = np.unique((source.codes[rows].astype(np.int64) + 1) * width
                                   + kind.codes[rows] + 1, return_inverse=True)
        names = np.array([",".join(part.values[code] for part, code in (
            (source, pair // width - 1), (kind, pair % width - 1)) if code >= 0)
            for pair in pairs.tolist()], dtype=object)
        return names[inverse].tolist()

    def _args(self, rows: np.ndarray) -> list[ArgColumn]:
        """The fields that the profile set (not the schema's default), column by column."""
        args: list[ArgColumn] = []
        for column in EVENT_ARGS:
            strings = self.strings.get(column)
            if strings is None:
                values = self.events[column].to_numpy()[rows]
                where = np.flatnonzero(values != schema.NO_INT)
                values = values[where].tolist()
            else:
                codes = strings.codes[rows]
                where = np.flatnonzero(codes >= 0)
                values = strings.values[codes[where]].tolist()
            if len(where):
                args.append((column, where.tolist(), values))
        return args


class _Strings:
    """A string column as codes (int32, -1 for missing or empty) into its distinct values."""

    def __init__(self, series: pd.Series) -> None:
        codes, uniques = pd.factorize(series)
        self.values = np.asarray(uniques, dtype=object)
        empty = np.flatnonzero(self.values == "")
        if len(empty):
            codes[codes == empty[0]] = -1
        self.codes = codes.astype(np.int32)

    def take(self, rows: np.ndarray) -> list[str]:
        if not len(self.values):
            return [""] * len(rows)
        codes = self.codes[rows]
        return np.where(codes >= 0, self.values[codes], "").tolist()


def _alone(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per slice (sorted by track, then start): whether it overlaps no other of its track,
    beginning after every earlier one ended and ending before the next begins."""
    reach = pd.Series(end).groupby(track).cummax().to_numpy()
    same = track[1:] == track[:-1]
    alone = np.ones(len(track), dtype=bool)
    alone[1:] &= ~same | (start[1:] >= reach[:-1])
    alone[:-1] &= ~same | (start[1:] >= end[:-1])
    return alone
