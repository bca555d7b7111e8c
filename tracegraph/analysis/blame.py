"""Bubble blame: every stall on a main compute lane, decomposed along its causal chain.

A bubble [a, b] ends because some op released it. Walking backward from that op, each part of
[a, b] is charged to what was really happening then: the releasing op's own execution (a transfer,
a collective after its last member arrived), earlier compute on the releasing lane (pipeline
dependency, or a compute straggler), or, recursively, whatever an earlier wait on that lane waited
for. The walk crosses streams (event waits), ranks (P2P halves, the last member of a collective) and
threads (a gloo worker and the host op that launched it). See docs/blame.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.match import Matches
from tracegraph.graph.ops import Ops

MAX_DEPTH = 600  # links followed before the rest of an interval is left unexplained
RELEASE_WINDOW_NS = 2_000_000  # a host thread resumes this soon after the op it waited on ends
sys.setrecursionlimit(max(sys.getrecursionlimit(), 8 * MAX_DEPTH + 1_000))  # a frame or 4 a link
MIN_PIECE_NS = 2_000  # shorter pieces (wake-up latencies, record slots) fold into a neighbour
UNKNOWN = "unknown"
QUEUE_WINDOW_NS = 50_000  # a serialized stream starts this soon after the op ahead of it ends
HOST_SYNC_WINDOW_NS = 1_000_000  # a host blocked on the device launches this soon after it ends
_DEVICE_WORK = (schema.COMPUTE, schema.COLLECTIVE, schema.P2P, schema.MEMCPY)
_DIM_CATEGORY = {"pp": schema.PP_P2P, "dp": schema.DP_REDUCTION, "ep": schema.EP_ALLTOALL}
_COMM_CATEGORY = {"alltoall": schema.EP_ALLTOALL, "send": schema.PP_P2P, "recv": schema.PP_P2P,
                  "batch_send_recv": schema.PP_P2P}


@dataclass
class Interval:
    """A piece of a bubble charged to one root cause."""

    start: int
    end: int
    category: str
    rank: int  # rank of the root op
    lane: str
    name: str
    note: str = ""
    unprofiled_group: str = ""  # the group whose unprofiled members hold the straggler

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class Bubble:
    """A stall on a rank's main compute lane and its decomposition."""

    rank: int
    lane: str
    start: int
    end: int
    name: str  # the waiting op, or "idle" for a gap
    step: int
    intervals: list[Interval] = field(default_factory=list)

    @property
    def dur(self) -> int:
        return self.end - self.start

    def by_category(self) -> dict[str, int]:
        """ns charged per category."""
        totals: dict[str, int] = {}
        for piece in self.intervals:
            totals[piece.category] = totals.get(piece.category, 0) + piece.dur
        return totals

    @property
    def category(self) -> str:
        """The category charged the most time."""
        totals = self.by_category()
        return max(totals, key=totals.get) if totals else UNKNOWN

    @property
    def root(self) -> Interval | None:
        """The longest interval of the dominant category."""
        pieces = [p for p in self.intervals if p.category == self.category]
        return max(pieces, key=lambda p: p.dur) if pieces else None

    def chain(self) -> list[int]:
        """Ranks in causal order: this rank, then each rank the explanation reached walking
        back in time, up to the root's rank."""
        ranks = [self.rank]
        root = self.root
        for piece in sorted(self.intervals, key=lambda p: -p.start):
            if root is not None and ranks[-1] == root.rank and piece.start < root.start:
                break
            if piece.rank != ranks[-1] and piece.rank not in ranks:
                ranks.append(piece.rank)
        return ranks


class Blamer:
    """Explains intervals of time on any lane by following binding dependencies."""

    def __init__(self, ops: Ops, matches: Matches, start: np.ndarray, end: np.ndarray,
                 groups: pd.DataFrame, slow_ranks: set[int]) -> None:
        frame = ops.frame
        self.ops, self.matches, self.start, self.end = ops, matches, start, end
        self.kind = frame["kind"].to_numpy()
        self.rank = frame["rank"].to_numpy()
        self.lane = frame["lane"].to_numpy()
        self.name = frame["name"].to_numpy()
        # a Kineto stream wait sits at its host call, not on the device: lane walks skip it
        self.host_side = (self.kind == schema.WAIT) & (frame["wait_on_stream"].to_numpy() >= 0)
        self.prev = _device_prev(ops.lane_prev(), self.host_side)
        self.lane_id = frame["lane_id"].to_numpy()
        self._lane_first = np.searchsorted(self.lane_id, np.arange(self.lane_id.max() + 1
                                                                   if len(frame) else 0))
        self.mode = ops.lanes["mode"].to_numpy()[frame["lane_id"].to_numpy()]
        self.slow_ranks = slow_ranks
        self.slow_op: np.ndarray | None = None  # per op straggler compute (analysis.slow_ops)
        self.comm_category = _comm_categories(frame, groups)
        self.unprofiled = _unprofiled_members(len(frame), matches.instances)
        self.group = frame["group"].to_numpy()
        launch = frame["launch"].to_numpy() if "launch" in frame else np.full(len(frame), -1)
        self.launch = np.where(launch >= 0, launch - (frame["start"].to_numpy() - start), -1)
        self._other_lane_ends = _ends_by_rank(frame, end)
        self._device_ends = _ends_by_rank(frame, end, _DEVICE_WORK)
        self._pass_ns: dict[int, int] = {}  # recorded stream wait -> when it passed

    # --- entry points ------------------------------------------------------------------------
    def blocked(self, i: int, a: int, b: int, depth: int = 0) -> list[Interval]:
        """Explain [a, b] inside blocking op `i` (a wait, a P2P half, a collective member)."""
        out: list[Interval] = []
        self._blocked(i, a, b, depth, out)
        return _merge(out)

    def gap(self, n: int, a: int, b: int) -> list[Interval]:
        """Explain [a, b], idle time on op `n`'s lane just before `n`."""
        out: list[Interval] = []
        self._gap(n, a, b, 0, out)
        return _merge(out)

    def history(self, j: int, a: int, b: int) -> list[Interval]:
        """Explain all of [a, b], up to the end of op j: j's own execution, then what held its
        lane (and, through its binding dependencies, other lanes and ranks) before it."""
        out: list[Interval] = []
        lo = max(a, self.start[j])
        if lo < b:
            self._op(j, lo, b, 0, out)
        if lo > a:
            self._before(j, a, lo, 0, out)
        return _merge(out)

    def blocked_thread(self, k: int, a: int, b: int) -> list[Interval]:
        """Explain [a, b], a host thread inside annotation `k` but in no op."""
        out: list[Interval] = []
        self._idle_thread(k, a, b, 0, out)
        return _merge(out)

    def released_by(self, i: int) -> int:
        """For a host-thread stretch with no op (a marker-only segment): the comm op on another
        lane of the rank that ran through it and whose end released it, or -1."""
        return self._releaser(int(self.rank[i]), self.ops.frame.at[i, "lane_id"], self.start[i],
                              self.end[i])

    # --- the walk ----------------------------------------------------------------------------
    def _blocked(self, i: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        if b <= a:
            return
        d = self.matches.dep[i]
        if d >= 0 and depth < MAX_DEPTH:
            release = self._release(i, d)
            if release > a:
                cut = min(b, release)
                first_new = len(out)
                self._released(i, d, a, cut, depth + 1, out)
                if self.kind[i] == schema.WAIT and len(out) > first_new and cut < b:
                    last = max(range(first_new, len(out)), key=lambda k: out[k].end)
                    out[last] = _extended(out[last], b)  # the wake-up latency
                else:
                    self._charge_self(i, cut, b, out)
                return
        self._charge_self(i, a, b, out)

    def _release(self, i: int, d: int, depth: int = 0) -> int:
        """When dependency `d` let op `i` go on (a producer that is itself a stream wait
        releases when it passes)."""
        if self.matches.how[i] != "event_id":
            return int(self.start[d])
        return self._passed(d, depth) if self.kind[d] == schema.WAIT else int(self.end[d])

    def _passed(self, w: int, depth: int = 0) -> int:
        """When recorded stream wait `w` passed: once its stream reached it and its own producer
        released it (without either, its host-side end)."""
        if w not in self._pass_ns:
            times = [self._reached(w, depth)]
            if self.matches.dep[w] >= 0 and depth < MAX_DEPTH:
                times.append(self._release(w, self.matches.dep[w], depth + 1))
            self._pass_ns[w] = max(times) if max(times) >= 0 else int(self.end[w])
        return self._pass_ns[w]

    def _reached(self, w: int, depth: int = 0) -> int:
        """When the op or wait queued before stream wait `w` was done (-1: nothing queued)."""
        q = self.matches.queued.get(w, -1)
        if q < 0 or depth >= MAX_DEPTH:
            return -1
        return self._passed(q, depth + 1) if self.kind[q] == schema.WAIT else int(self.end[q])

    def _released(self, i: int, d: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """Explain [a, b] during which `i` waited for `d` (b <= release of d)."""
        if self.matches.how[i] == "event_id" and self.kind[d] == schema.WAIT:
            self._in_wait(d, a, b, depth, out)
            return
        if self.matches.how[i] == "event_id":  # d is the producer op: it ran, then released
            lo = max(a, self.start[d])
            if lo < b:
                self._op(d, lo, b, depth, out)
            b = min(b, self.start[d])
        if b > a:
            self._before(d, a, b, depth, out)

    def _in_wait(self, w: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """Explain [a, b] (b <= when recorded stream wait `w` passed): until its stream reached
        it, what was queued before it; then what it waited for."""
        reached = self._reached(w)
        if b > max(a, reached):
            if self.matches.dep[w] >= 0 and depth < MAX_DEPTH:
                self._released(w, self.matches.dep[w], max(a, reached), b, depth + 1, out)
            else:
                self._charge(UNKNOWN, w, max(a, reached), b, out,
                             "stream wait without a matched record")
        q, b = self.matches.queued.get(w, -1), min(b, reached)
        if b <= a or depth >= MAX_DEPTH:
            return
        if self.kind[q] == schema.WAIT:
            self._in_wait(q, a, b, depth + 1, out)
        else:
            self._released_thread(q, a, b, depth, out)

    def _before(self, j: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """Explain [a, b] (b <= start[j]) by what op j's lane did before j."""
        if depth >= MAX_DEPTH:
            self._charge(UNKNOWN, j, a, b, out, "causal chain too deep")
            return
        nxt, k = j, self._last_before(j, b)
        if k >= 0 and self.host_side[k]:
            k = self.prev[k]
        after = k + 1 if k >= 0 else self._lane_first[self.lane_id[j]]
        if after < j:  # the first device op after k
            nxt = after + int(np.argmin(self.host_side[after:j + 1]))
        while b > a:
            gap_lo = max(a, self.end[k]) if k >= 0 else a
            gap_hi = min(b, self.start[nxt])
            if gap_hi > gap_lo:
                self._gap(nxt, gap_lo, gap_hi, depth + 1, out)
            if k < 0 or self.end[k] <= a:
                return
            lo, hi = max(a, self.start[k]), min(b, self.end[k])
            if hi > lo:
                self._op(k, lo, hi, depth + 1, out)
            b = min(b, self.start[k])
            nxt, k = k, self.prev[k]

    def _last_before(self, j: int, b: int) -> int:
        """The last op on j's lane, before j, that starts before b (-1 if none)."""
        first = self._lane_first[self.lane_id[j]]
        pos = first + int(np.searchsorted(self.start[first:j], b, side="left")) - 1
        return pos if pos >= first else -1

    def _op(self, k: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """Explain [a, b] while op k occupied its lane."""
        kind = self.kind[k]
        if kind in (schema.WAIT, schema.COLLECTIVE, schema.P2P):
            self._blocked(k, a, b, depth, out)
        elif kind == schema.MARKER and self.mode[k] == schema.THREAD:
            self._idle_thread(k, a, b, depth, out)
        else:
            self._charge_compute(k, a, b, out)

    def _gap(self, n: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """Explain [a, b]: n's lane idle before n."""
        p = self._gating_wait(n)
        if p >= 0 and self.kind[p] == schema.WAIT and self.matches.dep[p] >= 0:
            release = self._release(p, self.matches.dep[p])
            if release > a and depth < MAX_DEPTH:  # a stream wait whose device side shows as a gap
                cut = min(b, release)
                self._released(p, self.matches.dep[p], a, cut, depth + 1, out)
                a = cut
        launcher = self.matches.launcher[n] if len(self.matches.launcher) else -1
        if b > a and launcher >= 0 and self.start[launcher] < b:
            lo = max(a, self.start[launcher])
            self._charge(schema.HOST_LAUNCH, launcher, lo, b, out)
            b = lo
            if b > a:
                self._before(launcher, a, b, depth + 1, out)
            return
        if b > a and self.mode[n] == schema.THREAD:
            self._idle_thread_until(n, a, b, depth, out)
        elif b > a:
            self._launched_late(n, a, b, depth, out)

    def _launched_late(self, n: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """The device idled until the host enqueued n. If the host had itself been waiting on
        the device (a step-end synchronize), the op whose end freed it explains the wait."""
        launch = self.launch[n]
        freed = self._host_freed_by(n, launch) if a < launch and depth < MAX_DEPTH else -1
        if freed >= 0 and self.end[freed] > a:
            cut = min(b, self.end[freed])
            self._released_thread(freed, a, cut, depth, out)
            a = cut
        queued = self._releaser(int(self.rank[n]), self.lane_id[n], a, b, QUEUE_WINDOW_NS,
                                self._device_ends, lane_busy=True) \
            if b - a >= MIN_PIECE_NS and depth < MAX_DEPTH and launch < a else -1
        if queued >= 0:  # one hardware queue: n ran as soon as an op on another stream ended
            cut = min(b, self.end[queued])
            self._released_thread(queued, a, cut, depth, out)
            a = cut
        self._charge(schema.HOST_LAUNCH, n, a, b, out, "device idle: launched late")

    def _host_freed_by(self, n: int, launch: int) -> int:
        """The device op of n's rank that ended last shortly before the host launched n."""
        ends, idx, _ = self._device_ends.get(int(self.rank[n]), (None, None, None))
        if ends is None:
            return -1
        pos = np.searchsorted(ends, launch, side="right") - 1
        if pos >= 0 and launch - ends[pos] <= HOST_SYNC_WINDOW_NS:
            return int(idx[pos])
        return -1

    def _gating_wait(self, n: int) -> int:
        """The stream wait that released op n last: of the waits enqueued right before it, or
        the op before it on its lane."""
        candidates = self.matches.gates.get(n) or [self.prev[n]]
        matched = [w for w in candidates if w >= 0 and self.matches.dep[w] >= 0]
        if not matched:
            return candidates[-1]
        return max(matched, key=lambda w: self._release(w, self.matches.dep[w]))

    def _idle_thread(self, k: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        """A host thread inside an annotation but in no op: waiting, or busy (sleep, Python)."""
        releaser = self.released_by(k)
        if releaser >= 0 and depth < MAX_DEPTH:
            self._released_thread(releaser, a, b, depth, out)
        else:
            self._charge_compute(k, a, b, out)

    def _idle_thread_until(self, n: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        releaser = self._releaser(int(self.rank[n]), self.ops.frame.at[n, "lane_id"], a, b)
        if releaser >= 0 and depth < MAX_DEPTH:
            self._released_thread(releaser, a, b, depth, out)
        else:
            self._charge(schema.HOST_LAUNCH, n, a, b, out, "host thread idle")

    def _released_thread(self, r: int, a: int, b: int, depth: int, out: list[Interval]) -> None:
        lo = max(a, self.start[r])
        if lo < b:
            self._op(r, lo, min(b, self.end[r]), depth + 1, out)
        if lo > a:
            self._before(r, a, lo, depth + 1, out)

    def _releaser(self, rank: int, lane_id: int, lo: int, hi: int,
                  window: int = RELEASE_WINDOW_NS, table: dict | None = None,
                  lane_busy: bool = False) -> int:
        """The op (of `table`: comm ops by default) on another lane of `rank` that ended last
        within `window` before `hi` after `lo`, and ran through most of [lo, hi] (`lane_busy`:
        its lane did), or -1."""
        table = self._other_lane_ends if table is None else table
        ends, idx, lanes = table.get(rank, (None, None, None))
        if ends is None:
            return -1
        last = np.searchsorted(ends, hi + 20_000, side="right")
        first = np.searchsorted(ends, hi - window, side="left")
        lane_busy_ns: dict[int, int] = {}
        for pos in range(last - 1, first - 1, -1):
            op, lane = idx[pos], lanes[pos]
            if lane == lane_id or self.end[op] <= lo:
                continue
            if lane_busy:
                if lane not in lane_busy_ns:
                    lane_busy_ns[lane] = self._busy(lane, lo, hi)
                busy = lane_busy_ns[lane]
            else:
                busy = min(hi, self.end[op]) - max(lo, self.start[op])
            if busy >= 0.5 * (hi - lo):
                return int(op)
        return -1

    def _busy(self, lane_id: int, lo: int, hi: int) -> int:
        """ns of [lo, hi] during which ops of the lane ran (device lanes run one op at a time)."""
        first = self._lane_first[lane_id]
        stop = self._lane_first[lane_id + 1] if lane_id + 1 < len(self._lane_first) else len(
            self.start)
        begin = first + max(int(np.searchsorted(self.start[first:stop], lo, side="left")) - 1, 0)
        end = first + int(np.searchsorted(self.start[first:stop], hi, side="left"))
        ran = (np.minimum(self.end[begin:end], hi) - np.maximum(self.start[begin:end], lo))
        return int(ran[(ran > 0) & ~self.host_side[begin:end]].sum())

    # --- charging ----------------------------------------------------------------------------
    def _charge_self(self, i: int, a: int, b: int, out: list[Interval]) -> None:
        if b <= a:
            return
        if self.kind[i] in (schema.COLLECTIVE, schema.P2P):
            note, group = "", ""
            if self.unprofiled[i]:
                group = str(self.group[i])
                note = (f"straggler among the {self.unprofiled[i]} unprofiled members of group "
                        f"{group}")
            self._charge(self.comm_category[i], i, a, b, out, note, group)
        elif self.kind[i] == schema.WAIT:
            self._charge(UNKNOWN, i, a, b, out, "no matching record found")
        else:
            self._charge_compute(i, a, b, out)

    def _charge_compute(self, k: int, a: int, b: int, out: list[Interval]) -> None:
        slow = self.slow_op[k] if self.slow_op is not None else int(self.rank[k]) in self.slow_ranks
        self._charge(schema.COMPUTE_STRAGGLER if slow else schema.PIPELINE_FILL, k, a, b, out)

    def _charge(self, category: str, k: int, a: int, b: int, out: list[Interval],
                note: str = "", unprofiled_group: str = "") -> None:
        if b > a:
            out.append(Interval(int(a), int(b), category, int(self.rank[k]), str(self.lane[k]),
                                str(self.name[k]), note, unprofiled_group))


def _extended(piece: Interval, end: int) -> Interval:
    """The piece stretched to `end` (in place: pieces belong to the walk that made them)."""
    piece.end = max(piece.end, end)
    return piece


def _merge(pieces: list[Interval]) -> list[Interval]:
    """Sorted intervals: slivers folded into their neighbour, then adjacent pieces of the same
    category, rank and lane joined."""
    merged: list[Interval] = []
    for piece in _fold_slivers(sorted(pieces, key=lambda p: p.start)):
        last = merged[-1] if merged else None
        if (last and last.category == piece.category and last.rank == piece.rank
                and last.lane == piece.lane and piece.start - last.end <= 1_000):
            if piece.dur > last.dur:
                last.name, last.note = piece.name, piece.note
                last.unprofiled_group = piece.unprofiled_group
            last.end = max(last.end, piece.end)
        else:
            merged.append(piece)
    return merged


def _fold_slivers(pieces: list[Interval]) -> list[Interval]:
    kept: list[Interval] = []
    for piece in pieces:
        if piece.dur < MIN_PIECE_NS and kept and piece.start - kept[-1].end <= MIN_PIECE_NS:
            kept[-1] = _extended(kept[-1], piece.end)
        else:
            kept.append(piece)
    if len(kept) > 1 and kept[0].dur < MIN_PIECE_NS:
        kept[:2] = [replace(kept[1], start=kept[0].start)]
    return kept


def _device_prev(prev: np.ndarray, host_side: np.ndarray) -> np.ndarray:
    """The previous op on the same lane that is not host-side (-1 if none)."""
    idx = np.arange(len(prev))
    lane_first = np.maximum.accumulate(np.where(prev < 0, idx, 0)) if len(idx) else idx
    last = np.maximum.accumulate(np.where(host_side, -1, idx)) if len(idx) else idx
    out = np.full(len(prev), -1, dtype=np.int64)
    out[1:] = last[:-1]
    out[out < lane_first] = -1
    return out


def _comm_categories(frame: pd.DataFrame, groups: pd.DataFrame) -> np.ndarray:
    """Per op: its group's parallel dimension's category, else its comm type's."""
    dims = dict(zip(groups["group"], groups["dim"], strict=True)) if len(groups) else {}
    group_code, group_names = pd.factorize(frame["group"], use_na_sentinel=False)
    comm_code, comm_names = pd.factorize(frame["comm"], use_na_sentinel=False)
    pair, first = np.unique(group_code.astype(np.int64) * len(comm_names) + comm_code,
                            return_inverse=True)
    table = np.array([_DIM_CATEGORY.get(dims.get(group_names[p // len(comm_names)], ""))
                      or _COMM_CATEGORY.get(comm_names[p % len(comm_names)], schema.DP_REDUCTION)
                      for p in pair.tolist()], dtype=object)
    return table[first]


def _unprofiled_members(n: int, instances: pd.DataFrame) -> np.ndarray:
    missing = np.zeros(n, dtype=np.int64)
    for ops, size in zip(instances.get("ops", []), instances.get("size", []), strict=True):
        if size > len(ops):
            missing[ops] = size - len(ops)
    return missing


def _ends_by_rank(frame: pd.DataFrame, end: np.ndarray,
                  kinds: tuple[str, ...] = (schema.COLLECTIVE, schema.P2P)) -> dict[int, tuple]:
    """rank -> (sorted ends, op index, lane id) of its ops of these kinds."""
    table = {}
    comm = frame["kind"].isin(kinds).to_numpy()
    for rank, idx in pd.Series(np.flatnonzero(comm)).groupby(frame["rank"].to_numpy()[comm]):
        idx = idx.to_numpy()
        order = np.argsort(end[idx], kind="stable")
        table[int(rank)] = (end[idx][order], idx[order], frame["lane_id"].to_numpy()[idx][order])
    return table
