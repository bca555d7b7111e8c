"""Pipeline replicas: the sets of ranks that P2P ops (or `pp` groups) link, their stages in rank
order, and whether one wraps around from its last stage to its first (interleaved stages).

A replica is the job's layout, not who is present: the ranks its P2P ops and `pp` groups name
but the bundle lacks keep their stages (a missing stage 2 leaves the next rank stage 3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Replica:
    """One pipeline replica: its ranks, stage 0 first (those absent from the bundle included),
    and whether its last stage sends to its first (the ring of interleaved stages, where the
    last stage feeds the next chunk)."""

    stages: list[int]
    ring: bool


def components(trace, ranks: list[int], pairs: set[tuple[int, int]] | None = None
               ) -> list[list[int]]:
    """The replicas holding any of `ranks`: components of the ranks P2P peers and `pp` groups
    link, each sorted, with the linked ranks absent from the bundle; `pairs`: the pipeline's
    P2P pairs (`pipeline_links`) when the caller has them."""
    parent: dict[int, int] = {r: r for r in ranks}

    def find(r: int) -> int:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    links = list(pipeline_links(trace, trace.p2p_links()) if pairs is None else pairs)
    for members in trace.groups.loc[trace.groups["dim"] == "pp", "ranks"]:
        links += [(int(members[0]), int(m)) for m in members[1:]]
    for a, b in links:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    grouped: dict[int, list[int]] = {}
    for r in sorted(parent):
        grouped.setdefault(find(r), []).append(r)
    present = set(ranks)
    return [members for members in grouped.values() if present & set(members)]


def pipeline_links(trace, pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Of the (rank, peer) pairs of P2P ops, those between pipeline stages: not a ring of a
    context-parallel group's (`blame.comm_categories`: the smallest known groups holding both
    ends say their dimension)."""
    from tracegraph.analysis.blame import pair_dims

    if not pairs or not len(trace.groups):
        return set(pairs)
    ordered = sorted(pairs)
    dims = pair_dims(np.array([a for a, _ in ordered]), np.array([b for _, b in ordered]),
                     trace.groups)
    return {pair for pair, dim in zip(ordered, dims, strict=True) if dim in ("", "pp")}


def replicas(trace, ranks: list[int]) -> dict[int, int]:
    """rank -> replica number (by smallest member) of each of `ranks`."""
    present = set(ranks)
    return {r: k for k, members in enumerate(components(trace, ranks)) for r in members
            if r in present}


def layout(trace, ranks: list[int], order: dict[int, int] | None = None) -> list[Replica]:
    """The replicas of 2+ of `ranks`, stages by `order` then rank (the usual layout numbers
    stages in rank order), their absent ranks included."""
    pairs = pipeline_links(trace, trace.p2p_links())  # on a cluster, where the ranks lie
    present = set(ranks)
    found = []
    for members in components(trace, ranks, pairs):
        stages = sorted(members, key=lambda r: ((order or {}).get(r, 0), r))
        if len(present & set(stages)) > 1:
            found.append(Replica(stages, len(stages) > 2 and bool(
                {(stages[0], stages[-1]), (stages[-1], stages[0])} & pairs)))
    return found


def rank_stages(trace) -> dict[int, int]:
    """Rank -> stage of every rank of the bundle: its position, in rank order, among the ranks
    P2P ops or `pp` groups link into one replica (the usual layout numbers stages in rank
    order), those absent from the bundle included."""
    return stages_of(trace, trace.rank_ids, {})


def stages_of(trace, ranks: list[int], order: dict[int, float]) -> dict[int, int]:
    """Rank -> stage of each of `ranks`: its position in its replica (absent ranks included)
    by `order`, then rank."""
    present = set(ranks)
    return {r: s for members in components(trace, ranks) for s, r in enumerate(
        sorted(members, key=lambda r: (order.get(r, 0), r))) if r in present}
