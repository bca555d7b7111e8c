"""Per-rank clock offsets, estimated from operations that end together on every rank.

Members of a collective instance, and the two halves of a P2P transfer, executed on devices
finish within microseconds of each other in true time (CPU collectives such as gloo's do not);
a constant difference between the ends a pair of ranks reports is the offset between their
clocks. Offsets are solved by least squares over every pair of ranks that share such
operations, the lowest rank of each connected set anchored at 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.match import Matches
from tracegraph.graph.ops import Ops, startswith


def estimate_offsets(ops: Ops, matches: Matches, ranks: list[int] | None = None
                     ) -> dict[int, int]:
    """rank -> ns to subtract from the rank's timestamps to put it on the common clock, for
    `ranks` (default: those of `ops`; more when `ops` are some of the ops, the comm ones)."""
    diffs = _end_differences(ops, matches)
    ranks = sorted(int(r) for r in ops.frame["rank"].unique()) if ranks is None else ranks
    if diffs.empty:
        return dict.fromkeys(ranks, 0)
    pairs = diffs.groupby(["a", "b"])["diff"].median().reset_index()
    return _solve(ranks, pairs)


def _end_differences(ops: Ops, matches: Matches) -> pd.DataFrame:
    """(a, b, diff): end of an op on rank a minus the end of its partner on rank b (a < b), for
    every device-side collective member (against the instance's first one) and P2P pair."""
    frame = ops.frame
    end, rank = frame["end"].to_numpy(), frame["rank"].to_numpy().astype(np.int64)
    on_device = startswith(frame["lane"], "stream ")
    first, other = _instance_pairs(matches.instances.get("ops", []), on_device)
    p2p = np.flatnonzero((matches.how == "p2p") & on_device)
    partner = matches.dep[p2p]
    keep = (p2p < partner) & on_device[partner] & (frame["kind"].to_numpy()[p2p] == schema.P2P)
    i = np.concatenate([other, p2p[keep]])  # CPU (gloo) collectives do not end together
    j = np.concatenate([first, partner[keep]])
    a, b, diff = rank[i], rank[j], end[i] - end[j]
    swap = a > b
    table = pd.DataFrame({"a": np.where(swap, b, a), "b": np.where(swap, a, b),
                          "diff": np.where(swap, -diff, diff)})
    return table[table["a"] != table["b"]]


def _instance_pairs(instances: pd.Series, on_device: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, other): each device-side member of a collective instance after its first one,
    beside that first one."""
    sizes = np.fromiter((len(idx) for idx in instances), dtype=np.int64, count=len(instances))
    member = np.concatenate([np.zeros(0, dtype=np.int64),
                             *(np.asarray(idx, dtype=np.int64) for idx in instances)])
    instance = np.repeat(np.arange(len(sizes)), sizes)
    member, instance = member[on_device[member]], instance[on_device[member]]
    if not len(member):
        return member, member
    lead = np.r_[True, instance[1:] != instance[:-1]]
    first = member[lead][np.cumsum(lead) - 1]
    return first[~lead], member[~lead]


def _solve(ranks: list[int], pairs: pd.DataFrame) -> dict[int, int]:
    """Least squares for offset[a] - offset[b] = diff, the first rank of each component at 0.

    Solved through the normal equations (a ranks × ranks graph Laplacian plus the anchors):
    a dense least-squares solve of the pairs × ranks system costs seconds at 1,024 ranks."""
    order = np.asarray(ranks, dtype=np.int64)
    a = np.searchsorted(order, pairs["a"].to_numpy())
    b = np.searchsorted(order, pairs["b"].to_numpy())
    diff = pairs["diff"].to_numpy(dtype=float)
    normal = np.zeros((len(ranks), len(ranks)))
    for i, j, sign in ((a, a, 1.0), (b, b, 1.0), (a, b, -1.0), (b, a, -1.0)):
        np.add.at(normal, (i, j), sign)
    roots = np.searchsorted(order, _component_roots(ranks, pairs))
    normal[roots, roots] += 1.0
    rhs = np.bincount(a, diff, len(ranks)) - np.bincount(b, diff, len(ranks))
    solution = np.linalg.solve(normal, rhs)
    return {r: int(round(solution[i])) for i, r in enumerate(ranks)}


def _component_roots(ranks: list[int], pairs: pd.DataFrame) -> list[int]:
    parent = {r: r for r in ranks}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for a, b in zip(pairs["a"], pairs["b"], strict=True):
        parent[max(find(a), find(b))] = min(find(a), find(b))
    return sorted({find(r) for r in ranks})
