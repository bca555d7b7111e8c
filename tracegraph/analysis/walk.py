"""The binding-predecessor walk over the `DepGraph`: what held any lane at every instant.

To explain a stretch [a, b] of any lane, walk backward from the op that ended it: the op's own
execution, then, before it started, whatever held it: the dependency satisfied last (the record
a wait waited on, the P2P half posted last, the member of a collective that arrived last, the
stream wait that gated it, the host op that launched it or the device op that freed the host),
else the previous op on its lane. Every instant of [a, b] is explained by exactly one piece, so the
pieces tile the stretch; they alternate between work and waits and cross streams, threads and
ranks. Blame (blame.py) labels the pieces of each bubble with root causes; the critical path
(critical_path.py) is the same walk over the whole step of its slowest rank.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracegraph import schema
from tracegraph.graph.depgraph import (
    HOST_WAIT,
    HOST_WAIT_CONFIDENCE,
    INFERRED_CONFIDENCE,
    INFERRED_REASONS,
    LAUNCH_CONFIDENCE,
    DepGraph,
)

MAX_DEPTH = 600  # links followed before the rest of a stretch is left unexplained
sys.setrecursionlimit(max(sys.getrecursionlimit(), 8 * MAX_DEPTH + 1_000))  # a frame or 4 a link
MIN_PIECE_NS = 2_000  # shorter pieces (wake-up latencies, record slots) fold into a neighbour

# what a piece's op was doing (a critical-path segment's kind)
COMPUTE, TRANSFER, WAIT = "compute", "transfer", "wait"
# why the walk stopped at a piece (blame maps each to a root cause)
RAN = "ran"  # the op's own execution: compute, or a transfer after what it waited for came
WAITING = "waiting"  # a comm op waiting for no matched op (an unprofiled member, an unmatched peer)
NO_RECORD = "no matching record found"
UNMATCHED_STREAM_WAIT = "stream wait without a matched record"
TOO_DEEP = "causal chain too deep"
LAUNCHED_LATE = "device idle: launched late"
UNSEEN_LAUNCH = "device idle: the profile holds neither its host launch nor a stream wait"
HOST_IDLE = "host thread idle"
LAUNCHER = "waiting for the host op that launched it"
STEP_TAIL = "step marker runs past the rank's last op"  # only at the end of a critical path
NOT_RECORDED = "before the rank's profile begins: not recorded"
_BLOCKING = (schema.WAIT, schema.COLLECTIVE, schema.P2P)
_ACROSS_RANKS = ("p2p", "collective")  # dependencies matched on another rank
UNMATCHED_CONFIDENCE = 0.3  # a comm op whose peers' op was not found: who was late is unknown
ABSENT_PEER_CONFIDENCE = 0.5  # a P2P half whose peer is absent: a late post or the transfer


@dataclass
class Piece:
    """A stretch explained by one op: what held the lane then (`op`), and why the walk ended."""

    op: int
    start: int
    end: int
    why: str
    hops: tuple[int, ...] = ()
    """the comm ops whose cross-rank dependencies the walk followed to reach it, outermost
    first (a P2P half, a collective member of the rank that waited); () on the explained
    lane's own rank"""

    @property
    def via(self) -> int:
        """The last comm op crossed to reach it, -1 if none."""
        return self.hops[-1] if self.hops else -1

    @property
    def dur(self) -> int:
        return self.end - self.start


class BindingWalk:
    """Explains stretches of time on any lane of `graph` by following binding dependencies."""

    def __init__(self, graph: DepGraph) -> None:
        self.graph = graph
        self.start, self.end, self.kind = graph.start, graph.end, graph.kind
        self._pass_ns: dict[int, int] = {}  # recorded stream wait -> when it passed
        self._blind = _blind_ranks(graph)
        self.weakest: tuple[float, str] = (1.0, "")
        """the least sure link the last walk followed: (confidence, why it was drawn)"""

    # --- entry points ------------------------------------------------------------------------
    def blocked(self, i: int, a: int, b: int) -> list[Piece]:
        """Explain [a, b] inside blocking op `i` (a wait, a P2P half, a collective member)."""
        return self._collect(self._blocked, i, a, b)

    def gap(self, n: int, a: int, b: int) -> list[Piece]:
        """Explain [a, b], idle time on op `n`'s lane just before `n`."""
        return self._collect(self._gap, n, a, b)

    def idle_thread(self, k: int, a: int, b: int) -> list[Piece]:
        """Explain [a, b], a host thread inside annotation `k` but in no op."""
        return self._collect(self._idle_thread, k, a, b)

    def history(self, j: int, a: int, b: int) -> list[Piece]:
        """Explain all of [a, b], up to the end of op j: j's own execution, then what held its
        lane (and, through its binding dependencies, other lanes and ranks) before it."""
        return self._collect(self._history, j, a, b)

    def released_by(self, i: int) -> int:
        """For a host-thread stretch with no op (a marker-only segment): the comm op on another
        lane of the rank that ran through it and whose end released it, or -1."""
        return self.graph.host_release(i, int(self.start[i]), int(self.end[i]))

    def kind_of(self, piece: Piece) -> str:
        """compute, transfer or wait: what the piece's op was doing then."""
        if piece.why != RAN:
            return WAIT
        return TRANSFER if self.kind[piece.op] in (schema.COLLECTIVE, schema.P2P) else COMPUTE

    def _link(self, confidence: float, reason: str) -> None:
        """Note a link the walk follows; keep the least sure one."""
        if confidence < self.weakest[0]:
            self.weakest = (float(confidence), str(reason))

    def _follow(self, src: int, dst: int, kind: str) -> None:
        """Follow an edge inferred by time: recorded in the graph, noted as a link."""
        self.graph.record(src, dst, kind)
        self._link(INFERRED_CONFIDENCE[kind], f"{INFERRED_REASONS[kind]} (inferred by time)")

    def _collect(self, step: Callable, i: int, a: int, b: int) -> list[Piece]:
        out: list[Piece] = []
        self.weakest = (1.0, "")
        step(i, a, b, 0, out)
        return sorted(out, key=lambda p: p.start)

    # --- the walk ----------------------------------------------------------------------------
    def _history(self, j: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        lo = max(a, self.start[j])
        if lo < b:
            self._op(j, lo, b, depth, out)
        if lo > a:
            self._before(j, a, lo, depth, out)

    def _blocked(self, i: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        if b <= a:
            return
        d = self.graph.dep[i]
        if d >= 0 and depth < MAX_DEPTH:
            release = self._release(i, d)
            if release > a:
                self._link(self.graph.dep_confidence[i], self.graph.dep_reason[i])
                cut = min(b, release)
                first_new = len(out)
                crosses = self.graph.how[i] in _ACROSS_RANKS
                if crosses:
                    self._enter(out, i)
                self._released(i, d, a, cut, depth + 1, out)
                if crosses:
                    self._leave(out, first_new, i)
                if self.kind[i] == schema.WAIT and len(out) > first_new and cut < b:
                    self._wake(out, first_new, b)
                else:
                    self._own(i, cut, b, out)
                return
        self._own(i, a, b, out)

    def _release(self, i: int, d: int, depth: int = 0) -> int:
        """When dependency `d` let op `i` go on (a producer that is itself a stream wait
        releases when it passes)."""
        if self.graph.how[i] != "event_id":
            return int(self.start[d])
        return self._passed(d, depth) if self.kind[d] == schema.WAIT else int(self.end[d])

    def _passed(self, w: int, depth: int = 0) -> int:
        """When recorded stream wait `w` passed: once its stream reached it and its own producer
        released it (without either, its host-side end)."""
        if w not in self._pass_ns:
            times = [self._reached(w, depth)]
            if self.graph.dep[w] >= 0 and depth < MAX_DEPTH:
                times.append(self._release(w, self.graph.dep[w], depth + 1))
            self._pass_ns[w] = max(times) if max(times) >= 0 else int(self.end[w])
        return self._pass_ns[w]

    def _reached(self, w: int, depth: int = 0) -> int:
        """When the op or wait queued before stream wait `w` was done (-1: nothing queued)."""
        q = self.graph.queued[w]
        if q < 0 or depth >= MAX_DEPTH:
            return -1
        return self._passed(q, depth + 1) if self.kind[q] == schema.WAIT else int(self.end[q])

    def _released(self, i: int, d: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b] during which `i` waited for `d` (b <= release of d)."""
        if self.graph.how[i] == "event_id" and self.kind[d] == schema.WAIT:
            self._in_wait(d, a, b, depth, out)
            return
        if self.graph.how[i] == "event_id":  # d is the producer op: it ran, then released
            lo = max(a, self.start[d])
            if lo < b:
                self._op(d, lo, b, depth, out)
            b = min(b, self.start[d])
        if b > a:
            self._before(d, a, b, depth, out)

    def _in_wait(self, w: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b] (b <= when recorded stream wait `w` passed): until its stream reached
        it, what was queued before it; then what it waited for."""
        reached = self._reached(w)
        if b > max(a, reached):
            if self.graph.dep[w] >= 0 and depth < MAX_DEPTH:
                self._link(self.graph.dep_confidence[w], self.graph.dep_reason[w])
                self._released(w, self.graph.dep[w], max(a, reached), b, depth + 1, out)
            else:
                _add(out, w, max(a, reached), b, UNMATCHED_STREAM_WAIT)
        q, b = self.graph.queued[w], min(b, reached)
        if b <= a:
            return
        if depth >= MAX_DEPTH:
            _add(out, w, a, b, TOO_DEEP)
            return
        if self.kind[q] == schema.WAIT:
            self._in_wait(q, a, b, depth + 1, out)
        else:
            self._released_thread(q, a, b, depth, out)

    def _before(self, j: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b] (b <= start[j]) by what op j's lane did before j."""
        if depth >= MAX_DEPTH:
            _add(out, j, a, b, TOO_DEEP)
            return
        graph = self.graph
        nxt, k = j, self._last_before(j, b)
        if k >= 0 and graph.host_side[k]:
            k = graph.prev[k]
        after = k + 1 if k >= 0 else graph.lane_first[graph.lane_id[j]]
        if after < j:  # the first device op after k
            nxt = after + int(np.argmin(graph.host_side[after:j + 1]))
        begins = graph.profile_start.get(int(graph.rank[j]), a)
        while b > a:
            gap_lo = max(a, self.end[k]) if k >= 0 else a
            gap_hi = min(b, self.start[nxt])
            if k < 0 and gap_lo < begins:  # the lane's first op: the profile began after a
                _add(out, nxt, gap_lo, min(gap_hi, begins), NOT_RECORDED)
                gap_lo = max(gap_lo, min(gap_hi, begins))
            if gap_hi > gap_lo:
                self._gap(nxt, gap_lo, gap_hi, depth + 1, out)
            if k < 0 or self.end[k] <= a:
                return
            lo, hi = max(a, self.start[k]), min(b, self.end[k])
            if hi > lo:
                self._op(k, lo, hi, depth + 1, out)
            b = min(b, self.start[k])
            nxt, k = k, graph.prev[k]

    def _last_before(self, j: int, b: int) -> int:
        """The last op on j's lane, before j, that starts before b (-1 if none)."""
        first = self.graph.lane_first[self.graph.lane_id[j]]
        pos = first + int(np.searchsorted(self.start[first:j], b, side="left")) - 1
        return pos if pos >= first else -1

    def _op(self, k: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b] while op k occupied its lane."""
        kind = self.kind[k]
        if kind in _BLOCKING:
            self._blocked(k, a, b, depth, out)
        elif kind == schema.MARKER and self.graph.mode[k] == schema.THREAD:
            self._idle_thread(k, a, b, depth, out)
        else:
            _add(out, k, a, b, RAN)

    def _gap(self, n: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b]: n's lane idle before n."""
        graph = self.graph
        p = self._gating_wait(n)
        if p >= 0 and self.kind[p] == schema.WAIT and graph.dep[p] >= 0:
            release = self._release(p, graph.dep[p])
            if release > a and depth < MAX_DEPTH:  # a stream wait whose device side shows as a gap
                self._link(graph.dep_confidence[p], graph.dep_reason[p])
                cut = min(b, release)
                self._released(p, graph.dep[p], a, cut, depth + 1, out)
                a = cut
        h = graph.host_gate[n]
        if h >= 0 and a < self.end[h] <= b and depth < MAX_DEPTH:  # a wait the host issued
            self._link(HOST_WAIT_CONFIDENCE, HOST_WAIT)
            self._released_thread(h, a, int(self.end[h]), depth, out)
            a = int(self.end[h])
        launcher = graph.launcher[n]
        if b > a and launcher >= 0 and self.start[launcher] < b:
            lo = max(a, self.start[launcher])
            self._link(LAUNCH_CONFIDENCE, "host launch: the last call of its comm type before it")
            _add(out, launcher, lo, b, LAUNCHER)
            b = lo
            if b > a:
                self._before(launcher, a, b, depth + 1, out)
            return
        if b > a and graph.mode[n] == schema.THREAD:
            self._idle_thread_until(n, a, b, depth, out)
        elif b > a:
            self._launched_late(n, a, b, depth, out)

    def _launched_late(self, n: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """The device idled until the host enqueued n. If the host had itself been waiting on
        the device (a step-end synchronize), the op whose end freed it explains the wait. On a
        rank whose profile shows neither launches nor stream waits, it is left unexplained."""
        graph = self.graph
        launch = graph.launch[n]
        freed = graph.host_sync(n) if a < launch and depth < MAX_DEPTH else -1
        if freed >= 0 and self.end[freed] > a:
            self._follow(freed, n, "host_sync")
            cut = min(b, self.end[freed])
            self._released_thread(freed, a, cut, depth, out)
            a = cut
        queued = graph.shared_queue(n, a, b) \
            if b - a >= MIN_PIECE_NS and depth < MAX_DEPTH and launch < a else -1
        if queued >= 0:  # one hardware queue: n ran as soon as an op on another stream ended
            self._follow(queued, n, "shared_queue")
            cut = min(b, self.end[queued])
            self._released_thread(queued, a, cut, depth, out)
            a = cut
        if launch < 0 and b - a >= MIN_PIECE_NS and graph.rank[n] in self._blind:
            self._link(UNMATCHED_CONFIDENCE, "device idle, and no host launch in the profile")
            _add(out, n, a, b, self._unseen_launch(n, a, b))
            return
        _add(out, n, a, b, LAUNCHED_LATE)

    def _unseen_launch(self, n: int, a: int, b: int) -> str:
        """UNSEEN_LAUNCH, naming the comm op of the rank on another lane that was in flight
        through most of [a, b]: what the lane likely waited for, which the profile cannot show."""
        k, share = self.graph.in_flight(n, a, b)
        if k < 0:
            return UNSEEN_LAUNCH
        return (f"{UNSEEN_LAUNCH}; {self.graph.name[k]} ({self.graph.lane[k]}) was in flight "
                f"through {share:.0%} of it: likely what it waited for, which the profile "
                "cannot show")

    def _gating_wait(self, n: int) -> int:
        """The stream wait that released op n last: of the waits enqueued right before it, or
        the op before it on its lane."""
        graph = self.graph
        candidates = graph.gates.get(n) or [graph.prev[n]]
        matched = [w for w in candidates if w >= 0 and graph.dep[w] >= 0]
        if not matched:
            return candidates[-1]
        return max(matched, key=lambda w: self._release(w, graph.dep[w]))

    def _idle_thread(self, k: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """A host thread inside an annotation but in no op: waiting, or busy (sleep, Python)."""
        releaser = self.released_by(k)
        if releaser >= 0 and depth < MAX_DEPTH and self.end[releaser] > a:
            self._follow(releaser, k, "host_release")
            self._released_thread(releaser, a, b, depth, out)
        else:
            _add(out, k, a, b, RAN)

    def _idle_thread_until(self, n: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        releaser = self.graph.host_release(n, a, b)
        if releaser >= 0 and depth < MAX_DEPTH:
            self._follow(releaser, n, "host_release")
            self._released_thread(releaser, a, b, depth, out)
        else:
            _add(out, n, a, b, HOST_IDLE)

    def _released_thread(self, r: int, a: int, b: int, depth: int, out: list[Piece]) -> None:
        """Explain [a, b] of a lane released by op r's end: r, what held r before, and the
        wake-up after r ended (charged with the piece that ended last)."""
        first_new = len(out)
        lo = max(a, self.start[r])
        if lo < b:
            self._op(r, lo, min(b, self.end[r]), depth + 1, out)
        if lo > a:
            self._before(r, a, lo, depth + 1, out)
        if self.end[r] < b:
            self._wake(out, first_new, b)

    def _enter(self, out: list[Piece], i: int) -> None:
        """The walk follows comm op i's dependency onto another rank (see `_leave`)."""

    def _leave(self, out: list[Piece], first_new: int, i: int) -> None:
        """Back from following op i's dependency: the pieces found since `first_new` were
        reached through i, then through what they were reached by from there."""
        for piece in out[first_new:]:
            piece.hops = (i, *piece.hops)

    def _wake(self, out: list[Piece], first_new: int, b: int) -> None:
        """The lane was released a little after what it waited for ended: `wake_up`."""
        wake_up(out, first_new, b)

    def _own(self, i: int, a: int, b: int, out: list[Piece]) -> None:
        """[a, b] of blocking op i that nothing else explains: a transfer after its release, a
        comm op waiting for nobody matched, a wait with no record."""
        if b <= a:
            return
        if self.kind[i] == schema.WAIT:
            _add(out, i, a, b, NO_RECORD)
        elif self.graph.unprofiled[i]:  # after the last profiled member: absent ones, or the
            if self.kind[i] == schema.P2P:  # transfer itself; the profile cannot tell which
                self._link(ABSENT_PEER_CONFIDENCE,
                           f"peer {self.graph.peer[i]} absent from the bundle: when it posted "
                           "its half is unknown")
            _add(out, i, a, b, WAITING)
        elif self.graph.dep[i] < 0 and self.graph.unmatched[i]:
            self._link(UNMATCHED_CONFIDENCE, "a peer's matching op was not found")
            _add(out, i, a, b, WAITING)
        else:
            _add(out, i, a, b, RAN)


def _blind_ranks(graph: DepGraph) -> set[int]:
    """Ranks whose profile shows neither a stream wait nor a host launch (a kernel table): what
    held their idle streams cannot be told."""
    waits = set(np.unique(graph.rank[graph.kind == schema.WAIT]).tolist())
    launched = set(np.unique(graph.rank[graph.launch >= 0]).tolist())
    return set(np.unique(graph.rank).tolist()) - waits - launched


def _add(out: list[Piece], op: int, a: int, b: int, why: str) -> None:
    if b > a:
        out.append(Piece(int(op), int(a), int(b), why))


def wake_up(out: list[Piece], first_new: int, b: int) -> None:
    """Stretch the latest-ending piece added since `first_new` to `b`: the wake-up latency of
    a lane released a little after what it waited for ended."""
    if len(out) == first_new:
        return
    last = max(range(first_new, len(out)), key=lambda k: out[k].end)
    out[last].end = max(out[last].end, b)


def fold_slivers(pieces: list[Piece]) -> list[Piece]:
    """Pieces sorted by start, those shorter than MIN_PIECE_NS folded into the one before."""
    kept: list[Piece] = []
    for piece in sorted(pieces, key=lambda p: p.start):
        if piece.dur < MIN_PIECE_NS and kept and piece.start - kept[-1].end <= MIN_PIECE_NS:
            kept[-1] = Piece(kept[-1].op, kept[-1].start, max(kept[-1].end, piece.end),
                             kept[-1].why, kept[-1].hops)
        else:
            kept.append(piece)
    if len(kept) > 1 and kept[0].dur < MIN_PIECE_NS:
        kept[:2] = [Piece(kept[1].op, kept[0].start, kept[1].end, kept[1].why, kept[1].hops)]
    return kept
