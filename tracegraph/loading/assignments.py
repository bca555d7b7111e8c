"""Assignments of gloo worker threads to process groups that every member of every group agrees
with (the last step of `resolve`'s collectives, for threads its timing facts leave open).

A worker thread serves one group, and a group's members run its collectives in one order, each
instance on every member at once. So under the true assignment, for every group and every two of
its members with collectives in the bundle, the group's ops of one member that fall in the
other's profile window and those of the other in the first's (an op overlapping a window: its
partners overlap it too) are the same sequence: as many, of the same comm (and size, for
all-reduce-like ops), the k-th of each running at one moment. `fitting` finds every assignment
of the open threads to their candidate groups under which that holds for every group they touch
(a backtracking search, cut after SEARCH_STEPS steps: then nothing is narrowed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

SEARCH_STEPS = 50_000
"""Partial assignments tried before the search gives up (an open thread stays open)."""


@dataclass
class Collectives:
    """The gloo ranks' worker-thread collectives, one entry per op, and what `fitting` needs."""

    rank: np.ndarray
    comm: np.ndarray  # comm type codes
    size: np.ndarray  # bytes, -1 unknown
    shaped: np.ndarray  # bool: an all-reduce-like op (every member passes one shape)
    start: np.ndarray
    end: np.ndarray
    issued: np.ndarray  # when its issuing call began (its own start when that is not seen)
    unit: np.ndarray  # its thread, a row of the candidates matrix
    members: list[tuple[int, ...]]  # per group (a column of the candidates matrix)
    spans: dict[int, tuple[int, int]]  # rank -> first start, last end of its profile
    slack: int  # overlap tolerance (ns)


@dataclass
class Fit:
    """What the search found: how many assignments fit (0: the timings contradict every one),
    the groups some fitting assignment gives each thread, and whether every one was tried."""

    count: int
    allowed: np.ndarray  # bool (threads, groups)
    complete: bool


def fitting(ops: Collectives, candidates: np.ndarray) -> Fit:
    """Every assignment of the threads with several `candidates` (bool threads x groups) to one
    of them under which every group they may serve holds (module docstring)."""
    open_units = [int(u) for u in np.flatnonzero(candidates.sum(axis=1) > 1)]
    assign = np.where(candidates.sum(axis=1) == 1, np.argmax(candidates, axis=1), -1)
    search = _Search(ops, candidates, open_units, assign)
    search.run(0)
    return Fit(search.count, search.allowed, search.steps <= SEARCH_STEPS)


class _Search:
    """Backtracking over the open threads in order; a group is checked once its last open
    thread is assigned."""

    def __init__(self, ops: Collectives, candidates: np.ndarray, open_units: list[int],
                 assign: np.ndarray) -> None:
        self.ops, self.candidates, self.open, self.assign = ops, candidates, open_units, assign
        self.allowed = candidates & (assign >= 0)[:, None]  # settled threads keep their group
        self.count = self.steps = 0
        self.present = set(np.unique(ops.rank).tolist())  # ranks with worker collectives
        self.kind = pd.factorize(pd.MultiIndex.from_arrays(
            [ops.comm, np.where(ops.shaped, ops.size, -1)]))[0]  # what partners must share
        self.kinds = int(self.kind.max()) + 1 if len(self.kind) else 0
        self.present_members = [[r for r in members if r in self.present]
                                for members in ops.members]  # per group, as `_may_hold` asks
        last: dict[int, int] = {}
        for i, u in enumerate(open_units):
            for g in np.flatnonzero(candidates[u]):
                last[int(g)] = i
        self.complete_at: dict[int, list[int]] = {}
        for g, i in last.items():
            self.complete_at.setdefault(i, []).append(g)

    def run(self, i: int) -> None:
        if self.steps > SEARCH_STEPS:
            return
        if i == len(self.open):
            self.count += 1
            self.allowed[self.open, self.assign[self.open]] = True
            return
        u = self.open[i]
        for g in np.flatnonzero(self.candidates[u]):
            self.steps += 1
            self.assign[u] = g
            if all(self._may_hold(int(h)) for h in np.flatnonzero(self.candidates[u])) and all(
                    _holds(self.ops, self.assign, int(h), self.present)
                    for h in self.complete_at.get(i, ())):
                self.run(i + 1)
        self.assign[u] = -1

    def _may_hold(self, g: int) -> bool:
        """Whether group `g` can still hold: for every two of its members, the ops of each kind
        one has on it within the other's window are no more than the other can still have."""
        ops, unit = self.ops, self.ops.unit
        on = self.assign[unit] == g
        maybe = on | ((self.assign[unit] < 0) & self.candidates[unit, g])
        ranks = self.present_members[g]

        def count(mask: np.ndarray, rank: int, other: int) -> np.ndarray:
            idx = _within(ops, np.flatnonzero(mask & (ops.rank == rank)), other)
            return np.bincount(self.kind[idx], minlength=self.kinds)

        return all((count(on, a, b) <= count(maybe, b, a)).all()
                   and (count(on, b, a) <= count(maybe, a, b)).all()
                   for a in ranks[:1] for b in ranks[1:])


def _holds(ops: Collectives, assign: np.ndarray, g: int, present: set[int]) -> bool:
    """Whether the members of group `g` with worker collectives in the bundle (`present`)
    agree on the ops the assignment puts on it."""
    on = np.flatnonzero(assign[ops.unit] == g)
    ranks = [r for r in ops.members[g] if r in present]
    mine = {r: on[ops.rank[on] == r] for r in ranks}
    return all(_agree(ops, _within(ops, mine[ranks[0]], other), _within(ops, mine[other], ranks[0]))
               for other in ranks[1:])


def _within(ops: Collectives, idx: np.ndarray, rank: int) -> np.ndarray:
    """Of ops `idx`, those overlapping `rank`'s profile window, in the order they were issued."""
    lo, hi = ops.spans[rank]
    idx = idx[(ops.end[idx] >= lo) & (ops.start[idx] <= hi)]
    return idx[np.argsort(ops.issued[idx], kind="stable")]


def _agree(ops: Collectives, a: np.ndarray, b: np.ndarray) -> bool:
    """Same length and comm (and size, where all-reduce-like) sequence, k-th ops overlapping."""
    if len(a) != len(b) or (ops.comm[a] != ops.comm[b]).any():
        return False
    sized = ops.shaped[a] & (ops.size[a] >= 0) & (ops.size[b] >= 0)
    if (sized & (ops.size[a] != ops.size[b])).any():
        return False
    return bool((np.maximum(ops.start[a], ops.start[b])
                 <= np.minimum(ops.end[a], ops.end[b]) + ops.slack).all())
