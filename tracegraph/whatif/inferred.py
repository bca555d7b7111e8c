"""The edges inferred by time that the replay needs: where the static edges leave a stretch
unexplained, what ended just as it did (the rules of `DepGraph.host_sync`, `shared_queue` and
`host_release`, which the walk uses the same way).

- a device op launched after everything it waits for was done, once the host was free: the device
  op of its rank that ended last, at most 1 ms before the launch, on another lane (a blocked host:
  a synchronize);
- a device op launched early that still started late: the op of another stream that ended just
  before it, that stream busy through the stretch (one hardware queue);
- a host thread idle, or in an annotation but in no op: the comm op on another thread that ran
  through the stretch and ended as it resumed.

Candidates are filtered with sorted end times per rank first, so the graph's own rules run only
where an op of the right kind ended in the stretch: a CPU-bound trace gaps before every kernel.
"""

from __future__ import annotations

import numpy as np

from tracegraph import schema
from tracegraph.graph.depgraph import HOST_CLOCK_SLACK_NS, HOST_SYNC_WINDOW_NS, DepGraph

GAP_NS = 2_000  # a start this much after its latest predecessor: look for what held it
_WORK = (schema.COMPUTE, schema.MEMCPY, schema.COLLECTIVE, schema.P2P)
_HELD = (*_WORK, schema.RECORD, schema.WAIT)
_COMM = (schema.COLLECTIVE, schema.P2P)

Found = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
"""kind -> (releasing op, held op, True where the held op's end waited, else its start)"""


def inferred_edges(graph: DepGraph, latest: np.ndarray, gap: np.ndarray) -> Found:
    """The inferred edges: `latest` is each op's start's latest predecessor (-1: none), `gap`
    how long after it the op started."""
    device, comm = _Ends(graph, np.isin(graph.kind, _WORK)), _Ends(graph, np.isin(graph.kind,
                                                                                 _COMM))
    held = np.flatnonzero((gap >= GAP_NS) & (graph.mode == schema.STREAM) & ~graph.host_side
                          & np.isin(graph.kind, _HELD) & (latest >= 0))
    launch = graph.launch[held]
    late = (launch > latest[held]) & (launch <= graph.start[held])
    found = {"host_sync": _host_syncs(graph, device, held[late], latest[held[late]]),
             "shared_queue": _shared_queues(graph, device, held[~late], latest[held[~late]])}
    thread = graph.mode == schema.THREAD
    stretches = np.flatnonzero(thread & (graph.kind == schema.MARKER))
    gaps = np.flatnonzero(thread & (gap >= GAP_NS) & (latest >= 0))
    found["host_release"] = _concat(
        _releases(graph, comm, stretches, graph.start[stretches], graph.end[stretches], True),
        _releases(graph, comm, gaps, latest[gaps], graph.start[gaps], False))
    return found


class _Ends:
    """The ops of a mask, by rank and end: which ended last by a time."""

    def __init__(self, graph: DepGraph, mask: np.ndarray) -> None:
        ops = np.flatnonzero(mask)
        self.ops = ops[np.lexsort((graph.end[ops], graph.rank[ops]))]
        self.end = graph.end[self.ops]
        ranks = graph.rank[self.ops]
        self.ranks, first = np.unique(ranks, return_index=True)
        self.bounds = np.append(first, len(ranks))
        self.rank_of = graph.rank

    def last(self, ops: np.ndarray, by: np.ndarray) -> np.ndarray:
        """Per op: the op of its rank that ended last at or before `by`, -1 if none."""
        out = np.full(len(ops), -1, dtype=np.int64)
        if not len(self.ranks):
            return out
        where = np.searchsorted(self.ranks, self.rank_of[ops])
        known = (where < len(self.ranks)) & (self.ranks[np.minimum(where, len(self.ranks) - 1)]
                                            == self.rank_of[ops])
        for k in np.unique(where[known]).tolist():
            mine = np.flatnonzero(known & (where == k))
            lo, hi = self.bounds[k], self.bounds[k + 1]
            pos = np.searchsorted(self.end[lo:hi], by[mine], side="right") - 1
            out[mine[pos >= 0]] = self.ops[lo:hi][pos[pos >= 0]]
        return out


def _host_syncs(graph: DepGraph, device: _Ends, ops: np.ndarray, lo: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DepGraph.host_sync for many ops: the device op that ended last, at most 1 ms before the
    launch, after what the op waited for; kept where it is on another lane (on the op's own lane
    the stream order already says it)."""
    launch = graph.launch[ops]
    freed = device.last(ops, launch)
    ok = freed >= 0
    ok[ok] &= ((launch[ok] - graph.end[freed[ok]] <= HOST_SYNC_WINDOW_NS)
               & (graph.end[freed[ok]] > lo[ok]) & (freed[ok] != ops[ok])
               & (graph.lane_id[freed[ok]] != graph.lane_id[ops[ok]]))
    return freed[ok], ops[ok], np.zeros(int(ok.sum()), dtype=bool)


def _shared_queues(graph: DepGraph, device: _Ends, ops: np.ndarray, lo: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DepGraph.shared_queue where an op of another lane of the rank ended in the stretch."""
    ahead = device.last(ops, graph.start[ops])
    maybe = np.flatnonzero((ahead >= 0) & (graph.end[np.maximum(ahead, 0)] > lo))
    pairs = [(q, int(ops[k])) for k in maybe.tolist()
             if (q := graph.shared_queue(int(ops[k]), int(lo[k]), int(graph.start[ops[k]]))) >= 0]
    return _arrays(pairs, False)


def _releases(graph: DepGraph, comm: _Ends, ops: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              at_end: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DepGraph.host_release of [lo, hi] for many ops, where a comm op of the rank ended in it."""
    ended = comm.last(ops, hi + HOST_CLOCK_SLACK_NS)
    maybe = np.flatnonzero((ended >= 0) & (graph.end[np.maximum(ended, 0)] > lo))
    pairs = [(r, int(ops[k])) for k in maybe.tolist()
             if (r := graph.host_release(int(ops[k]), int(lo[k]), int(hi[k]))) >= 0]
    return _arrays(pairs, at_end)


def _arrays(pairs: list[tuple[int, int]], at_end: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*pairs, strict=True)) if pairs else (
        np.zeros(0, dtype=np.int64),) * 2
    return src, dst, np.full(len(src), at_end)


def _concat(*parts: tuple[np.ndarray, np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))
