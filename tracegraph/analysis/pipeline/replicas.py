"""Pipeline replicas: the sets of ranks that P2P ops (or `pp` groups) link, their stages in rank
order, and whether one wraps around from its last stage to its first (interleaved stages)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Replica:
    """One pipeline replica: its ranks, stage 0 first, and whether its last stage sends to its
    first (the ring of interleaved stages, where the last stage feeds the next chunk)."""

    stages: list[int]
    ring: bool


def replicas(trace, ranks: list[int], pairs: set[tuple[int, int]] | None = None
             ) -> dict[int, int]:
    """rank -> replica number: components of P2P peers and `pp` groups, by smallest member."""
    parent = {r: r for r in ranks}

    def find(r: int) -> int:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    links = list(trace.p2p_links() if pairs is None else pairs)
    for members in trace.groups.loc[trace.groups["dim"] == "pp", "ranks"]:
        links += [(int(members[0]), int(m)) for m in members[1:]]
    for a, b in links:
        if a in parent or b in parent:
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    roots = {r: find(r) for r in ranks}
    number = {root: i for i, root in enumerate(sorted(set(roots.values())))}
    return {r: number[root] for r, root in roots.items()}


def layout(trace, ranks: list[int], order: dict[int, int] | None = None) -> list[Replica]:
    """The replicas of 2+ ranks among `ranks`, stages by `order` then rank (the usual layout
    numbers stages in rank order)."""
    pairs = trace.p2p_links()  # on a cluster, found where the ranks lie
    found = replicas(trace, ranks, pairs)
    grouped: dict[int, list[int]] = {}
    for r in sorted(found, key=lambda r: ((order or {}).get(r, 0), r)):
        grouped.setdefault(found[r], []).append(r)
    return [Replica(stages, len(stages) > 2 and bool(
        {(stages[0], stages[-1]), (stages[-1], stages[0])} & pairs))
        for stages in grouped.values() if len(stages) > 1]


def rank_stages(trace) -> dict[int, int]:
    """Rank -> stage: its position, in rank order, among the ranks P2P ops or `pp` groups link
    into one replica (the usual layout numbers stages in rank order)."""
    ranks = trace.rank_ids
    found = replicas(trace, ranks)
    stage: dict[int, int] = {}
    seen: Counter[int] = Counter()
    for r in sorted(ranks, key=lambda r: (found[r], r)):
        stage[r] = seen[found[r]]
        seen[found[r]] += 1
    return stage
