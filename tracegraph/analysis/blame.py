"""Bubble blame: every stall on a main compute lane, decomposed along its causal chain.

A bubble [a, b] ends because some op released it. The binding walk (walk.py) tiles [a, b]
with what was really happening then, back along that op's dependencies in the `DepGraph`; blame
charges each piece to a root cause: the releasing op's own execution (a transfer, a collective
after its last member arrived) to its communication's category, earlier compute to the pipeline
dependency or a compute straggler, an unexplained device idle to the host. See docs/blame.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import causes, schema
from tracegraph.analysis import walk
from tracegraph.analysis.walk import BindingWalk, Piece
from tracegraph.graph.ops import comm_calls
from tracegraph.loading.groups import group_labels

UNMATCHED = "its peers' matching op was not found: the member that arrived last is unknown"
_UNPEERED = "unpeered"  # a point-to-point op naming no peer: no comm type of its own
_HOST_NOTES = {walk.LAUNCHED_LATE: walk.LAUNCHED_LATE, walk.HOST_IDLE: walk.HOST_IDLE,
               walk.LAUNCHER: "", walk.STEP_TAIL: walk.STEP_TAIL}
_LOCKSTEP = (causes.TP_COLLECTIVE, causes.CP_COLLECTIVE)
NOT_RECORDED = ("the rank's profile begins later (each rank enters the profiled steps on its "
                "own): what it did then is not in the bundle")


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
    unprofiled_group: str = ""  # a group with members absent from the bundle it waits on
    op: int = -1  # the op (node of the DepGraph) the piece is charged to
    path: tuple[int, ...] = ()  # the ranks the walk crossed to reach it, ending with its own

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
    op: int = -1  # the waiting op, or the op after the gap (node of the DepGraph)
    confidence: float = 1.0  # of the least sure link its chain followed (1: ids, sequences)
    evidence: str = ""  # that link: how it was matched or inferred

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
    def sureness(self) -> str:
        """high (links matched by ids or sequence numbers), medium (by order or timing rule)
        or low (inferred by time, or a peer's op not found)."""
        return sureness_level(self.confidence)

    @property
    def category(self) -> str:
        """The root cause's category (UNKNOWN with no decomposition)."""
        found = self.causes()
        return found[0].category if found else causes.UNKNOWN

    def causes(self) -> list[BubbleCause]:
        """The bubble's causes, the root first, then by time held: its intervals grouped by
        origin (category, rank, and for absent late members their group)."""
        return grouped_causes(self.intervals, self.dur)

    def listed_causes(self) -> list[BubbleCause]:
        """The root and every other cause holding at least LISTED_SHARE of the bubble."""
        return [c for k, c in enumerate(self.causes())
                if k == 0 or c.ns >= causes.LISTED_SHARE * self.dur]

    @property
    def root(self) -> Interval | None:
        """The root cause's longest interval (its rank, lane, op and note): what a fix would
        remove, see `causes.root_of`."""
        found = self.causes()
        return found[0].longest if found else None

    def chain(self) -> list[int]:
        """Ranks in causal order, from this rank to the root's: those the walk crossed to
        reach the root's longest piece, else (intervals that do not say) each rank the
        explanation reached walking back in time, as far as the earliest listed cause (a
        sliver further back is no link)."""
        root = self.root
        if root is not None and root.path:
            ranks = [self.rank]
            for rank in root.path:
                if rank != ranks[-1]:
                    ranks.append(rank)
            return ranks
        listed = self.listed_causes()
        back_to = min((c.start for c in listed), default=self.start)
        ranks = [self.rank]
        for piece in sorted(self.intervals, key=lambda p: -p.start):
            if piece.start >= back_to and piece.rank not in ranks:
                ranks.append(piece.rank)
        return ranks


def sureness_level(confidence: float) -> str:
    """high, medium or low: what a confidence says (`Bubble.sureness`)."""
    return "high" if confidence >= 0.95 else "medium" if confidence >= 0.85 else "low"


@dataclass
class BubbleCause:
    """One origin of a bubble's time: the intervals charged to one category on one rank (for a
    wait on absent members, in one group), with their total and share of the bubble."""

    category: str
    rank: int
    group: str  # the group whose absent members it waits on, or ""
    ns: int
    share: float  # of the bubble
    start: int  # when its first piece began
    longest: Interval  # its longest piece: lane, op, note

    @property
    def lane(self) -> str:
        return self.longest.lane

    @property
    def name(self) -> str:
        return self.longest.name


def grouped_causes(intervals: list[Interval], bubble_ns: int) -> list[BubbleCause]:
    """`intervals` grouped by origin, the root (`causes.root_of`) first, the rest by time."""
    groups: dict[tuple[str, int, str], list[Interval]] = {}
    for piece in intervals:
        groups.setdefault((piece.category, piece.rank, piece.unprofiled_group), []).append(piece)
    found = [BubbleCause(category, rank, group, ns, ns / bubble_ns if bubble_ns else 0.0,
                         min(p.start for p in pieces), max(pieces, key=lambda p: p.dur))
             for (category, rank, group), pieces in groups.items()
             for ns in [sum(p.dur for p in pieces)]]
    found.sort(key=lambda c: (-c.ns, c.start))
    root = causes.root_of([(c.ns, c.start) for c in found], bubble_ns)
    if root > 0:
        found.insert(0, found.pop(root))
    return found


class Blamer:
    """Charges the pieces of binding walks to root causes: bubbles' intervals, path categories."""

    def __init__(self, walk: BindingWalk, groups: pd.DataFrame,
                 slow_op: np.ndarray | None = None, pipelined: bool | None = None) -> None:
        graph = walk.graph
        self.walk, self.graph = walk, graph
        self.slow_op = slow_op if slow_op is not None else np.zeros(len(graph), dtype=bool)
        self.comm_category = comm_categories(graph.ops.frame, groups)
        if pipelined is None:  # given when the graph holds part of the job's ranks
            pipelined = pipelined_job(graph.ops.frame, groups)
        self.idle_compute = causes.PIPELINE_FILL if pipelined else causes.PEER_COMPUTE
        """what waiting on compute that no straggler did is: a pipeline's dependency, or, in a
        job without one, a peer's normal variation (the rank's own compute, when it is its)"""
        self.comm_call = comm_calls(graph.ops.frame)
        self.group_names = group_labels(groups)

    def blocked(self, i: int, a: int, b: int) -> list[Interval]:
        """Explain [a, b] inside blocking op `i` (a wait, a P2P half, a collective member)."""
        return self.intervals(self.walk.blocked(i, a, b), int(self.graph.rank[i]))

    def gap(self, n: int, a: int, b: int) -> list[Interval]:
        """Explain [a, b], idle time on op `n`'s lane just before `n`."""
        return self.intervals(self.walk.gap(n, a, b), int(self.graph.rank[n]))

    def blocked_thread(self, k: int, a: int, b: int) -> list[Interval]:
        """Explain [a, b], a host thread inside annotation `k` but in no op."""
        return self.intervals(self.walk.idle_thread(k, a, b), int(self.graph.rank[k]))

    def intervals(self, pieces: list[Piece], rank: int | None = None) -> list[Interval]:
        """Pieces as charged intervals of a stretch of `rank`: slivers folded, neighbours of
        one cause joined."""
        return merged([self._interval(p, rank) for p in walk.fold_slivers(pieces)])

    def category(self, piece: Piece, rank: int | None = None) -> str:
        """The root cause a piece of a walk explaining a stretch of `rank` is charged to."""
        op = piece.op
        if piece.why in _HOST_NOTES:
            return causes.HOST_LAUNCH
        if piece.why not in (walk.RAN, walk.WAITING):
            return causes.UNKNOWN
        if self.graph.kind[op] in (schema.COLLECTIVE, schema.P2P) or self.comm_call[op]:
            return str(self.comm_category[op])
        if self.slow_op[op]:
            return causes.COMPUTE_STRAGGLER
        category = own_or(self.idle_compute, int(self.graph.rank[op]), rank)
        return through(category, str(self.comm_category[piece.via]) if piece.via >= 0 else "")

    def _interval(self, piece: Piece, rank: int | None = None) -> Interval:
        graph, op = self.graph, piece.op
        note, group = _HOST_NOTES.get(piece.why, piece.why), ""
        if piece.why == walk.NOT_RECORDED:
            note = NOT_RECORDED
        elif piece.why == walk.RAN:
            note = ""
        elif piece.why == walk.WAITING and graph.unprofiled[op] and graph.kind[op] == schema.P2P:
            group = str(graph.group[op])
            note = (f"peer {graph.peer[op]} absent from the bundle: it posted its half late, or "
                    "the transfer itself")
        elif piece.why == walk.WAITING and graph.unprofiled[op]:
            group = str(graph.group[op])
            note = (f"waits on the {graph.unprofiled[op]} members of group "
                    f"{self.group_names.get(group, group)} absent from the bundle: a late one, or "
                    "the transfer itself")
        elif piece.why == walk.WAITING:
            note = UNMATCHED
        return Interval(piece.start, piece.end, self.category(piece, rank), int(graph.rank[op]),
                        str(graph.lane[op]), str(graph.name[op]), note, group, op,
                        (*(int(graph.rank[h]) for h in piece.hops), int(graph.rank[op])))


def own_or(category: str, op_rank: int, rank: int | None) -> str:
    """`category` of compute on `op_rank` explaining a stretch of `rank`: a peer's compute that
    is the rank's own is its own."""
    return causes.OWN_COMPUTE if category == causes.PEER_COMPUTE and op_rank == rank \
        else category


def through(category: str, via: str) -> str:
    """A peer's compute charged `category`, reached through a comm op charged `via`: in a
    tensor- or context-parallel group the ranks run in lockstep, so waiting for a member's
    compute is that group's collective waiting for its late member, never the pipeline's."""
    if via in _LOCKSTEP and category in (causes.PIPELINE_FILL, causes.PEER_COMPUTE):
        return via
    if category == causes.PIPELINE_FILL and via not in ("", causes.PP_P2P):
        return causes.PEER_COMPUTE  # a collective's late member: the pipeline does not order it
    return category


def merged(pieces: list[Interval]) -> list[Interval]:
    """Sorted intervals with adjacent pieces of the same category, rank and lane joined (not
    across groups with members absent: two groups, two places to look)."""
    merged: list[Interval] = []
    for piece in sorted(pieces, key=lambda p: p.start):
        last = merged[-1] if merged else None
        if (last and last.category == piece.category and last.rank == piece.rank
                and last.lane == piece.lane and piece.start - last.end <= 1_000
                and last.unprofiled_group == piece.unprofiled_group):
            if piece.dur > last.dur:
                last.name, last.note, last.op, last.path = (piece.name, piece.note, piece.op,
                                                             piece.path)
                last.unprofiled_group = piece.unprofiled_group
            last.end = max(last.end, piece.end)
        else:
            merged.append(piece)
    return merged


def comm_categories(frame: pd.DataFrame, groups: pd.DataFrame) -> np.ndarray:
    """Per op, the category its communication is charged to ("" for ops that are not
    communication): its group's parallel dimension's, else its comm type's, else the category
    of communication whose dimension is unknown (never a guess); a point-to-point op is a
    pipeline transfer only when it names its peer, and one whose profile names no group (gloo)
    belongs to the dimension of the smallest groups holding both ends (a context-parallel
    ring's sends are the CP group's). Blame, the metrics and the checks all read a group's
    dimension from here."""
    dims = dict(zip(groups["group"], groups["dim"], strict=True)) if len(groups) else {}
    comm = frame["comm"].to_numpy(dtype=object)
    peer = frame["peer"].to_numpy()
    unpeered = np.isin(comm, list(schema.P2P_COMMS)) & (peer < 0)
    is_comm = frame["kind"].isin([schema.COLLECTIVE, schema.P2P]).to_numpy() | (comm != "")
    rows = np.flatnonzero(is_comm)  # factorize those only: most ops are not communication
    kinds = np.where(unpeered[rows], _UNPEERED, comm[rows])
    group = frame["group"].to_numpy(dtype=object)[rows]
    pairs = np.isin(kinds, list(schema.P2P_COMMS)) & (group == "")
    dim = np.array([dims.get(g, "") for g in group], dtype=object)
    if pairs.any():
        dim[pairs] = pair_dims(frame["rank"].to_numpy()[rows][pairs], peer[rows][pairs], groups)
    codes, uniques = pd.factorize(pd.MultiIndex.from_arrays([dim, kinds]))
    out = np.full(len(frame), "", dtype=object)
    if len(uniques):
        out[rows] = np.array([causes.for_collective(str(d), str(kind)) for d, kind in uniques],
                             dtype=object)[codes]
    return out


def pair_dims(rank: np.ndarray, peer: np.ndarray, groups: pd.DataFrame) -> np.ndarray:
    """Per (rank, peer): the parallel dimension of the smallest groups of a known dimension
    (not the world) holding both, "" where there is none or they disagree."""
    known = groups[~groups["dim"].isin(["", "world"])] if len(groups) else groups
    sets = sorted(((len(r), frozenset(int(x) for x in r), str(d))
                   for r, d in zip(known.get("ranks", []), known.get("dim", []), strict=True)),
                  key=lambda t: t[0])
    found: dict[tuple[int, int], str] = {}
    for key in set(zip(rank.tolist(), peer.tolist(), strict=True)):
        holding = [(size, d) for size, members, d in sets if set(key) <= members]
        smallest = {d for size, d in holding if size == holding[0][0]} if holding else set()
        found[key] = smallest.pop() if len(smallest) == 1 else ""
    return np.array([found[k] for k in zip(rank.tolist(), peer.tolist(), strict=True)],
                    dtype=object)


def pipelined_job(frame: pd.DataFrame, groups: pd.DataFrame) -> bool:
    """Whether the job has pipeline parallelism: a pp group, or P2P ops naming their peer
    that are pipeline transfers (not a context-parallel ring's)."""
    if len(groups) and (groups["dim"] == "pp").any():
        return True
    p2p = frame[(frame["kind"] == schema.P2P).to_numpy() & (frame["peer"] >= 0).to_numpy()]
    return bool((comm_categories(p2p, groups) == causes.PP_P2P).any())
