"""The cross-rank dependency DAG: every op a node, every reason one op waited for another an edge.

Node i is row i of `Ops.frame`, timed on the aligned clock. Edges live in one table (`src`, `dst`,
`kind`, `confidence`, `reason`); an edge a → b means b could not go on before a reached the point
`RELEASED_AT[kind]` (its start or its end):

| kind | a | b |
|---|---|---|
| stream | the op before b on its lane (device order) | b |
| launch | the host op that handed b to a worker thread (gloo) | comm op b |
| event_wait | the producer of stream wait b: the recorded stream work, or another wait | wait b |
| queue | what was enqueued on b's stream just before stream wait b | wait b |
| gate | a stream wait enqueued right before b on its stream | b |
| host_wait | on another stream, launched before a host stream-wait call, the op ending last | b |
| p2p | the half of a transfer posted last (aligned clock) | the half that waited for it |
| collective | the member of an instance that arrived last (aligned clock) | every other member |
| host_release | a comm op on another thread of b's rank, ended as b's thread resumed | host op b |
| host_sync | the device op whose end freed b's host, blocked on the device | device op b |
| shared_queue | the op on another stream of b's rank ahead of b in one hardware queue | op b |

A host stream-wait call (`cudaStreamWaitEvent`, `hipStreamWaitEvent`) whose device side the
profile lacks gates the next op the host launched (host_wait). A transfer is one edge and a
collective instance a star from its last arriver, so matching never makes a cycle. The last
three kinds are inferred by time when a walk needs them (they depend on the stretch being
explained, and searching every gap of a million-op trace up front costs more than the whole
analysis): each one found is recorded, so blame, the critical path and the export read the same
edges. `cycles()` checks the whole graph in linear time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.match import Matches
from tracegraph.graph.ops import Ops, first_parts

EDGE_KINDS = ("stream", "launch", "event_wait", "queue", "gate", "host_wait", "p2p",
              "collective", "host_release", "host_sync", "shared_queue")
RELEASED_AT = {"stream": "end", "launch": "start", "event_wait": "end", "queue": "end",
               "gate": "end", "host_wait": "end", "p2p": "start", "collective": "start",
               "host_release": "end", "host_sync": "end", "shared_queue": "end"}
"""Which point of the source op the destination waited for, per edge kind."""
RELEASE_WINDOW_NS = 5_000_000  # a host thread resumes this soon after the op it waited on ends
RELEASE_SHARE = 0.1  # ... or within this share of a long stretch (a busy CPU wakes it late)
QUEUE_WINDOW_NS = 50_000  # a serialized stream starts this soon after the op ahead of it ends
IN_FLIGHT_SHARE = 0.5  # a comm op in flight through this share of an unexplained idle gap
HOST_SYNC_WINDOW_NS = 1_000_000  # a host blocked on the device launches this soon after it ends
BUSY_SHARE = 0.5  # a releaser (or its lane) ran through at least this share of the stretch
HOST_CLOCK_SLACK_NS = 20_000  # a host thread may resume this long before its releaser's end
_COMM = (schema.COLLECTIVE, schema.P2P)


@dataclass
class DepGraph:
    """The dependency DAG over `ops`: per-op lookup arrays for walks, and the edge table."""

    ops: Ops
    start: np.ndarray  # aligned ns, per op
    end: np.ndarray
    dep: np.ndarray  # the cross dependency each op waited for (edge kinds event_wait/p2p/...), -1
    how: np.ndarray  # how dep was matched: "event_id", "timing", "p2p", "collective", ""
    launcher: np.ndarray  # launch edge source per op, -1
    queued: np.ndarray  # queue edge source per stream wait, -1
    gates: dict[int, list[int]]  # op -> the stream waits gating it
    host_gate: np.ndarray  # per op: what a host stream-wait call made its stream wait for, -1
    launch: np.ndarray  # when the host enqueued each device op (aligned ns), -1 if unknown
    unprofiled: np.ndarray  # per comm op: members of its group (a P2P: its peer) absent
    unmatched: np.ndarray  # per comm op: a profiled peer's matching op was not found
    posted: np.ndarray  # when each op was posted (a gloo P2P record: when its host call began)
    warnings: list[str] = field(default_factory=list)
    _static: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    _inferred: dict[tuple[int, int, str], str] = field(default_factory=dict, repr=False)
    _edges: pd.DataFrame | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        frame = self.ops.frame
        self.rank = frame["rank"].to_numpy()
        self.kind = frame["kind"].to_numpy()
        self.lane = frame["lane"].to_numpy()
        self.name = frame["name"].to_numpy()
        self.group = frame["group"].to_numpy()
        self.peer = frame["peer"].to_numpy()
        self.lane_id = frame["lane_id"].to_numpy()
        self.mode = self.ops.lanes["mode"].to_numpy()[self.lane_id]
        self.host_side = host_side_waits(frame)
        self.prev = _device_prev(self.ops.lane_prev(), self.host_side)  # -1: a lane's first
        lanes = self.lane_id.max() + 1 if len(frame) else 0
        self.lane_first = np.searchsorted(self.lane_id, np.arange(lanes + 1))
        self.dep_confidence = np.ones(len(frame), dtype=np.float32)  # of each op's dep edge
        self.dep_reason = np.full(len(frame), "", dtype=object)
        self.sampled = False  # collectives refused order matching: events may be missing
        self.incomplete: dict[int, str] = {}  # rank -> why its parser knows it misses events
        self._comm_ends = _ends_by_rank(frame, self.end, _COMM)
        self._device_ends = _ends_by_rank(frame, self.end, schema.DEVICE_WORK)
        starts = pd.Series(self.start).groupby(self.rank).min() if len(frame) else pd.Series()
        self.profile_start = {int(r): int(t) for r, t in starts.items()}
        """rank -> when its profile begins (its earliest op, aligned): nothing before is known"""

    def __len__(self) -> int:
        return len(self.start)

    # --- the edge table ------------------------------------------------------------------------
    @property
    def edges(self) -> pd.DataFrame:
        """Every edge: src, dst, kind, confidence, reason (static ones, then those inferred)."""
        if self._edges is None:
            inferred = pd.DataFrame(
                [(s, d, k, INFERRED_CONFIDENCE[k], r) for (s, d, k), r in self._inferred.items()],
                columns=["src", "dst", "kind", "confidence", "reason"])
            parts = [p for p in (self._static, inferred) if len(p)]
            table = pd.concat(parts, ignore_index=True) if parts else inferred
            self._edges = table.astype({"src": "int64", "dst": "int64", "kind": _KIND_DTYPE,
                                        "confidence": "float32", "reason": "category"})
        return self._edges

    def cycles(self) -> list[np.ndarray]:
        """The node sets of every cycle: strongly connected sets of more than one op, and ops
        with an edge to themselves (of a graph of some ranks, those among its own ops)."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        n = len(self)
        edges = self.edges[self.edges["src"] < n]
        if not len(edges):
            return []
        adjacency = coo_matrix((np.ones(len(edges)), (edges["src"], edges["dst"])), (n, n))
        count, label = connected_components(adjacency, directed=True, connection="strong")
        sizes = np.bincount(label, minlength=count)
        loops = np.unique(edges.loc[edges["src"] == edges["dst"], "src"].to_numpy())
        return [np.flatnonzero(label == c) for c in np.flatnonzero(sizes > 1)] + [
            np.array([op]) for op in loops.tolist() if sizes[label[op]] == 1]

    def cycle_warnings(self) -> list[str]:
        """A warning per cycle: matches that contradict each other (no real run has one)."""
        warnings = []
        for ops in self.cycles():
            ranks = sorted({int(r) for r in self.rank[ops]})
            names = ", ".join(sorted({str(n) for n in self.name[ops]})[:3])
            warnings.append(f"dependency cycle among {len(ops)} ops of ranks {ranks} ({names}): "
                            "their matches contradict each other; verdicts through them are "
                            "unsure")
        return warnings

    # --- edges inferred by time, recorded as found ---------------------------------------------
    def host_release(self, n: int, lo: int, hi: int) -> int:
        """The comm op on another thread of n's rank that ended last within 5 ms (10 % of a long
        stretch) before `hi` (or 20 µs after: host clocks), after `lo`, and ran through most of
        [lo, hi] — else whose thread did, one op after another (a queue of reductions launched
        earlier, the last one short): what n's idle thread waited for, or -1."""
        window = max(RELEASE_WINDOW_NS, int(RELEASE_SHARE * (hi - lo)))
        found = self._releaser(n, lo, hi, window, self._comm_ends, lane_busy=False,
                               late_ns=HOST_CLOCK_SLACK_NS)
        if found < 0:
            found = self._releaser(n, lo, hi, window, self._comm_ends, lane_busy=True,
                                   late_ns=HOST_CLOCK_SLACK_NS)
        return found

    def shared_queue(self, n: int, lo: int, hi: int) -> int:
        """The device op on another stream of n's rank that ended last < 50 µs before `hi`, that
        stream busy through most of [lo, hi] (one hardware queue), or -1."""
        return self._releaser(n, lo, hi, QUEUE_WINDOW_NS, self._device_ends, lane_busy=True,
                              late_ns=0)

    def in_flight(self, n: int, lo: int, hi: int) -> tuple[int, float]:
        """The comm op on another lane of n's rank in flight through most (IN_FLIGHT_SHARE) of
        [lo, hi], and the share it covers: what an idle lane with no recorded wait likely
        waited for; (-1, 0.0) if none."""
        _, idx, lanes = self._comm_ends.get(int(self.rank[n]), (None, None, None))
        if idx is None:
            return -1, 0.0
        comm = np.sort(idx[lanes != self.lane_id[n]])
        covered = np.minimum(self.end[comm], hi) - np.maximum(self.start[comm], lo)
        if not len(comm) or covered.max() < IN_FLIGHT_SHARE * (hi - lo):
            return -1, 0.0
        k = int(np.argmax(covered))
        return int(comm[k]), float(covered[k] / (hi - lo))

    def host_sync(self, n: int) -> int:
        """The device op of n's rank that ended last shortly (1 ms) before the host launched n:
        the host was blocked on it (a synchronize), or -1."""
        ends, idx, _ = self._device_ends.get(int(self.rank[n]), (None, None, None))
        launch = self.launch[n]
        if ends is None or not 0 <= launch <= self.start[n]:  # a launch after the op: no sync
            return -1
        pos = np.searchsorted(ends, launch, side="right") - 1
        while pos >= 0 and idx[pos] == n:  # a zero-length op is not its own releaser
            pos -= 1
        return int(idx[pos]) if pos >= 0 and launch - ends[pos] <= HOST_SYNC_WINDOW_NS else -1

    def record(self, src: int, dst: int, kind: str) -> None:
        """Keep an inferred edge a walk followed (one of INFERRED_REASONS' kinds)."""
        if (src, dst, kind) not in self._inferred:
            self._inferred[(src, dst, kind)] = INFERRED_REASONS[kind]
            self._edges = None

    def _releaser(self, n: int, lo: int, hi: int, window: int, table: dict, lane_busy: bool,
                  late_ns: int) -> int:
        """The op of `table` on another lane of n's rank that ended last within `window` before
        `hi` (`late_ns` after it at most), after `lo`, and ran (`lane_busy`: its lane ran)
        through at least BUSY_SHARE of [lo, hi]; -1 if none."""
        ends, idx, lanes = table.get(int(self.rank[n]), (None, None, None))
        if ends is None:
            return -1
        last = np.searchsorted(ends, hi + late_ns, side="right")
        first = np.searchsorted(ends, hi - window, side="left")
        lane_busy_ns: dict[int, int] = {}
        for pos in range(last - 1, first - 1, -1):
            op, lane = idx[pos], lanes[pos]
            if lane == self.lane_id[n] or self.end[op] <= lo:
                continue
            if lane_busy:
                if lane not in lane_busy_ns:
                    lane_busy_ns[lane] = self.busy(lane, lo, hi)
                busy = lane_busy_ns[lane]
            else:
                busy = min(hi, self.end[op]) - max(lo, self.start[op])
            if busy >= BUSY_SHARE * (hi - lo):
                return int(op)
        return -1

    def busy(self, lane_id: int, lo: int, hi: int) -> int:
        """ns of [lo, hi] during which ops of the lane ran (device lanes run one op at a time)."""
        first, stop = self.lane_first[lane_id], self.lane_first[lane_id + 1]
        starts = self.start[first:stop]
        begin = first + max(int(np.searchsorted(starts, lo, side="left")) - 1, 0)
        end = first + int(np.searchsorted(starts, hi, side="left"))
        ran = np.minimum(self.end[begin:end], hi) - np.maximum(self.start[begin:end], lo)
        return int(ran[(ran > 0) & ~self.host_side[begin:end]].sum())


LAUNCH_CONFIDENCE = 0.9  # a gloo worker op's launcher: the last host call of its comm type
HOST_WAIT_CONFIDENCE = 0.85  # a host stream-wait call's producer: by host call order
HOST_WAIT = ("a stream wait the host issued (its event's record is not in the profile): the "
             "op of another stream, launched before the call, that ended last before it ran")
HOST_WAIT_SCAN = 64  # device ops ending before a host-gated op searched for its producer
OPEN_GROUP_CONFIDENCE = 0.6  # a gloo collective whose group the profiles leave open
OPEN_GROUP = ("arrived last among the ranks whose gloo group is left open (order; which group "
              "is ambiguous)")
INFERRED_CONFIDENCE = {"host_release": 0.6, "host_sync": 0.6, "shared_queue": 0.7}
INFERRED_REASONS = {"host_release": "ended as the thread resumed",
                    "host_sync": "ended just before the host launched it",
                    "shared_queue": "ahead of it in one hardware queue"}
_KIND_DTYPE = pd.CategoricalDtype(EDGE_KINDS)


def build_graph(ops: Ops, matches: Matches, start: np.ndarray, end: np.ndarray,
                groups: pd.DataFrame | None = None) -> DepGraph:
    """The DAG of `ops` from the matches, with P2P and collective edges directed on the aligned
    clock (`start`, `end`): the later arriver releases the others. `groups`: the GROUPS table
    (a collective whose group has members absent from `ops` may wait for them)."""
    present = set(np.unique(ops.frame["rank"].to_numpy()).tolist())
    unprofiled, unmatched = missing_peers(ops.frame, matches, groups, present)
    dep, how = matches.dep.copy(), matches.how.copy()
    exchange = exchanges(ops)
    times = CommTimes(start, end, posted_times(ops, start, exchange), exchange)
    direct(dep, how, times, matches.instances)
    sampled = bool(len(matches.instances)) and not matches.instances["safe"].all()
    return assemble(ops, matches, start, end, (dep, how, unprofiled, unmatched), sampled)


class CommTimes(NamedTuple):
    """Per op, what directing the matches reads (aligned clock)."""

    start: np.ndarray
    end: np.ndarray
    posted: np.ndarray  # `posted_times`
    exchange: np.ndarray  # `exchanges`


def direct(dep: np.ndarray, how: np.ndarray, times: CommTimes, instances: pd.DataFrame) -> None:
    """Direct the matched pairs and instances (in place): of a transfer, the half posted last
    releases the other; the member of an instance that arrived last releases the others; an
    exchange's waits go to the half that ends it (`_close_exchanges`)."""
    partner = np.where(how == "p2p", dep, -1)
    _direct_pairs(dep, how, times.posted)
    _close_exchanges(dep, how, times, partner)
    _direct_instances(dep, how, times.start, instances)


def assemble(ops: Ops, matches: Matches, start: np.ndarray, end: np.ndarray,
             cross: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], sampled: bool
             ) -> DepGraph:
    """The DepGraph of `ops` from its lanes, its within-rank `matches` and its `cross`
    dependencies already directed: dep, how, unprofiled and unmatched per op. A dep of len(ops)
    or more stands for an op outside `ops` (a graph of some ranks of a job: another's op)."""
    frame = ops.frame
    n = len(frame)
    dep, how, unprofiled, unmatched = cross
    queued = np.full(n, -1, dtype=np.int64)
    if matches.queued:
        queued[list(matches.queued)] = list(matches.queued.values())
    launcher = matches.launcher if len(matches.launcher) else np.full(n, -1, dtype=np.int64)
    posted = posted_times(ops, start)
    launch = frame["launch"].to_numpy() if "launch" in frame else np.full(n, -1)
    aligned_launch = np.where(launch >= 0, launch - (frame["start"].to_numpy() - start), -1)
    graph = DepGraph(ops=ops, start=start, end=end, dep=dep, how=how, launcher=launcher,
                     queued=queued, gates=matches.gates, host_gate=_host_gates(frame, start, end),
                     launch=aligned_launch,
                     unprofiled=unprofiled, unmatched=unmatched, posted=posted,
                     warnings=list(matches.warnings))
    graph.sampled = sampled
    graph._static = _static_edges(graph)
    deps = graph._static[graph._static["kind"].isin(["event_wait", "p2p", "collective"])]
    graph.dep_confidence[deps["dst"].to_numpy()] = deps["confidence"].to_numpy()
    graph.dep_reason[deps["dst"].to_numpy()] = deps["reason"].to_numpy()
    return graph


def _host_gates(frame: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per device op launched right after a host stream-wait call (Ops' `host_wait`; the
    profile holds no device-side wait for it): the device work on another stream of its rank,
    launched before the call, that ended last before the op started: the event waited on was
    recorded after it (the profile holds neither the record nor its stream). -1 for the
    others, and where none ended within HOST_WAIT_SCAN such ends before the op."""
    out = np.full(len(frame), -1, dtype=np.int64)
    called = frame["host_wait"].to_numpy() if "host_wait" in frame else out
    if not (called >= 0).any():
        return out
    work = np.flatnonzero(frame["kind"].isin(schema.DEVICE_WORK).to_numpy()
                          & (frame["correlation"] >= 0).to_numpy())
    ranks, corr = frame["rank"].to_numpy(), frame["correlation"].to_numpy()
    lane = frame["lane_id"].to_numpy()
    for rank in np.unique(ranks[called >= 0]):
        mine = work[ranks[work] == rank]
        mine = mine[np.argsort(end[mine], kind="stable")]
        for op in np.flatnonzero((called >= 0) & (ranks == rank)).tolist():
            last = int(np.searchsorted(end[mine], start[op], side="right"))
            for k in mine[max(last - HOST_WAIT_SCAN, 0):last][::-1].tolist():
                if lane[k] != lane[op] and corr[k] < called[op]:
                    out[op] = k
                    break
    return out


def host_side_waits(frame: pd.DataFrame) -> np.ndarray:
    """Kineto's stream waits: they sit at their host call, not on the device (walks skip them)."""
    return (frame["kind"].to_numpy() == schema.WAIT) & (frame["wait_on_stream"].to_numpy() >= 0)


def exchanges(ops: Ops) -> np.ndarray:
    """Per op, the first op of the exchange it is part of (-1 outside one): on a host thread,
    the P2P calls and records that follow each other with no other op between (a send, or a
    batch: `c10d::send`, `gloo:send`, `c10d::recv_`, `gloo:recv`) were posted together, when
    the first call began."""
    frame = ops.frame
    kind, comm = frame["kind"].to_numpy(), frame["comm"].to_numpy()
    thread = ops.lanes["mode"].to_numpy()[frame["lane_id"].to_numpy()] == schema.THREAD
    part = thread & np.isin(comm, list(schema.P2P_COMMS)) & np.isin(kind, [schema.P2P,
                                                                         schema.HOST])
    prev = ops.lane_prev()
    joined = part & (prev >= 0) & part[np.maximum(prev, 0)]  # continues the run before it
    run = np.cumsum(~joined)  # ops are sorted by lane and time: a run is consecutive
    first = np.flatnonzero(~joined)
    out = np.full(len(frame), -1, dtype=np.int64)
    out[part] = first[run[part] - 1]
    return out[first_parts(frame)]  # a record's later parts belong to its first's exchange


def posted_times(ops: Ops, start: np.ndarray, exchange: np.ndarray | None = None
                 ) -> np.ndarray:
    """When each op was posted: an exchange's (`exchanges`) when its first call began (gloo's
    `gloo:recv` starts when `c10d::recv_` returns, and that call may block), every other op
    when it starts."""
    exchange = exchanges(ops) if exchange is None else exchange
    posted = start[first_parts(ops.frame)]
    inside = exchange >= 0
    posted[inside] = start[exchange[inside]]
    return posted


def _close_exchanges(dep: np.ndarray, how: np.ndarray, times: CommTimes,
                     partner: np.ndarray) -> None:
    """An exchange's thread waits once, for all its halves (`batch_isend_irecv`, or a send
    with its wait): the waits its halves have on their peers belong to the half that ends
    last, which waits for the peer half posted last. The other records only post (a gloo send
    record ends when posted; it completes when its receive is)."""
    halves = np.flatnonzero((partner >= 0) & (times.exchange >= 0))
    if not len(halves):
        return
    table = pd.DataFrame({"half": halves, "exchange": times.exchange[halves],
                          "end": times.end[halves], "dep": dep[halves]})
    closing = table.loc[table.groupby("exchange")["end"].idxmax(), ["exchange", "half"]]
    waiting = table[table["dep"] >= 0]
    if not len(waiting):
        return
    waiting = waiting.assign(late=times.posted[waiting["dep"].to_numpy()])
    binding = waiting.loc[waiting.groupby("exchange")["late"].idxmax(), ["exchange", "dep"]]
    closed = binding.merge(closing, on="exchange")
    dep[waiting["half"].to_numpy()], how[waiting["half"].to_numpy()] = -1, ""
    dep[closed["half"].to_numpy()] = closed["dep"].to_numpy()
    how[closed["half"].to_numpy()] = "p2p"


def _direct_pairs(dep: np.ndarray, how: np.ndarray, posted: np.ndarray) -> None:
    """Each matched P2P pair keeps one edge: from the half posted last to the other."""
    halves = np.flatnonzero(how == "p2p")
    partner = dep[halves]
    first = halves < partner
    a, b = halves[first], partner[first]
    b_later = (posted[b] > posted[a]) | ((posted[b] == posted[a]) & (b > a))
    later, earlier = np.where(b_later, b, a), np.where(b_later, a, b)
    dep[later], how[later] = -1, ""
    dep[earlier] = later


def _direct_instances(dep: np.ndarray, how: np.ndarray, start: np.ndarray,
                      instances: pd.DataFrame) -> None:
    """Every member of a collective instance depends on the member that started last."""
    if not len(instances):
        return
    sizes = instances["ops"].map(len).to_numpy()
    member = np.concatenate([np.asarray(m, dtype=np.int64) for m in instances["ops"]])
    instance = np.repeat(np.arange(len(instances)), sizes)
    order = np.lexsort((member, -start[member], instance))
    member, instance = member[order], instance[order]
    lead = np.r_[True, instance[1:] != instance[:-1]]
    last = member[lead][np.cumsum(lead) - 1]
    dep[member], how[member] = -1, ""
    waiting = member != last
    dep[member[waiting]], how[member[waiting]] = last[waiting], "collective"


def _static_edges(graph: DepGraph) -> pd.DataFrame:
    """The edges known from lane order and matching, in one table."""
    frame = graph.ops.frame
    idx = np.arange(len(graph))
    has_seq = (frame["seq"].to_numpy() >= 0) & (frame["group"].to_numpy() != "")
    gates = [(w, op) for op, waits in graph.gates.items() for w in waits]
    gate_src, gate_dst = (np.array(x, dtype=np.int64) for x in zip(*gates, strict=True)) \
        if gates else (np.zeros(0, dtype=np.int64),) * 2
    stream = (graph.prev >= 0) & ~graph.host_side
    wait = np.isin(graph.how, ["event_id", "timing"])
    pair, coll = graph.how == "p2p", graph.how == "collective"
    open_group = (frame["group"].to_numpy() == "") & (graph.mode == schema.COMM)
    host = graph.host_gate >= 0
    parts = [
        (graph.prev[stream], idx[stream], "stream", 1.0, "lane order"),
        (graph.launcher[graph.launcher >= 0], idx[graph.launcher >= 0], "launch",
         LAUNCH_CONFIDENCE,
         "last host call of its comm type before it"),
        (graph.dep[wait], idx[wait], "event_wait", np.where(graph.how[wait] == "event_id", 1.0,
                                                            0.9),
         np.where(graph.how[wait] == "event_id", "event id", "record < 5 µs before it ended")),
        (graph.queued[graph.queued >= 0], idx[graph.queued >= 0], "queue", 1.0,
         "enqueued before it on its stream"),
        (gate_src, gate_dst, "gate", 1.0, "stream wait enqueued right before it"),
        (graph.host_gate[host], idx[host], "host_wait", HOST_WAIT_CONFIDENCE, HOST_WAIT),
        (graph.dep[pair], idx[pair], "p2p", np.where(has_seq[idx[pair]], 1.0, 0.9),
         np.where(has_seq[idx[pair]], "posted last (pair by group and instance)",
                  "posted last (pair by order)")),
        (graph.dep[coll], idx[coll], "collective",
         np.where(has_seq[idx[coll]], 1.0, np.where(open_group[idx[coll]],
                                                     OPEN_GROUP_CONFIDENCE, 0.9)),
         np.where(has_seq[idx[coll]], "arrived last (instance by sequence number)",
                  np.where(open_group[idx[coll]], OPEN_GROUP,
                           "arrived last (instance by order in the group)"))),
    ]
    return pd.concat([pd.DataFrame({"src": s, "dst": d, "kind": k, "confidence": c, "reason": r})
                      for s, d, k, c, r in parts], ignore_index=True)


def _device_prev(prev: np.ndarray, host_side: np.ndarray) -> np.ndarray:
    """The previous op on the same lane that is not host-side (-1 if none)."""
    idx = np.arange(len(prev))
    lane_first = np.maximum.accumulate(np.where(prev < 0, idx, 0)) if len(idx) else idx
    last = np.maximum.accumulate(np.where(host_side, -1, idx)) if len(idx) else idx
    out = np.full(len(prev), -1, dtype=np.int64)
    out[1:] = last[:-1]
    out[out < lane_first] = -1
    return out


def missing_peers(frame: pd.DataFrame, matches: Matches, groups: pd.DataFrame | None,
                  present: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per op: how many members of its collective's group are absent from the bundle (of its
    stated size, when the profile states more members than it names; a P2P half's peer, 1),
    and whether a peer in
    the bundle has no op matched with it (its instance lacks a present member, or a P2P half
    has no partner): then who arrived last is unknown."""
    n = len(frame)
    unprofiled, unmatched = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    stated = {} if groups is None or not len(groups) else {
        str(g): (tuple(int(r) for r in ranks), int(size))
        for g, ranks, size in zip(groups["group"], groups["ranks"], groups["size"], strict=True)}
    instances = matches.instances
    for ops, group in zip(instances.get("ops", []), instances.get("group", []), strict=True):
        ranks, size = stated.get(str(group), ((), 0))
        profiled = sum(r in present for r in ranks)
        unprofiled[ops] = max(size, len(ranks)) - profiled
        unmatched[ops] = len(ops) < profiled
    p2p = (frame["kind"].to_numpy() == schema.P2P) & (matches.how != "p2p")
    peer = frame["peer"].to_numpy()
    here = np.isin(peer, list(present))
    unmatched[p2p & here] = True
    unprofiled[p2p & ~here & (peer >= 0)] = 1  # its peer, absent: posted late, or on time
    return unprofiled, unmatched


def _ends_by_rank(frame: pd.DataFrame, end: np.ndarray, kinds: tuple[str, ...]
                  ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """rank -> (sorted ends, op index, lane id) of its ops of these kinds."""
    table = {}
    chosen = frame["kind"].isin(kinds).to_numpy()
    lane_id = frame["lane_id"].to_numpy()
    for rank, idx in pd.Series(np.flatnonzero(chosen)).groupby(frame["rank"].to_numpy()[chosen]):
        idx = idx.to_numpy()
        order = np.argsort(end[idx], kind="stable")
        table[int(rank)] = (end[idx][order], idx[order], lane_id[idx][order])
    return table
