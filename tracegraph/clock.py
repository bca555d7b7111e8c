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
from tracegraph.match import Matches
from tracegraph.ops import Ops


def estimate_offsets(ops: Ops, matches: Matches) -> dict[int, int]:
    """rank -> ns to subtract from the rank's timestamps to put it on the common clock."""
    diffs = _end_differences(ops, matches)
    ranks = sorted(int(r) for r in ops.frame["rank"].unique())
    if diffs.empty:
        return dict.fromkeys(ranks, 0)
    pairs = diffs.groupby(["a", "b"])["diff"].median().reset_index()
    return _solve(ranks, pairs)


def _end_differences(ops: Ops, matches: Matches) -> pd.DataFrame:
    frame = ops.frame
    end, rank = frame["end"].to_numpy(), frame["rank"].to_numpy()
    on_device = frame["lane"].str.startswith("stream ").to_numpy()
    rows = []
    for idx in matches.instances.get("ops", []):  # CPU (gloo) collectives do not end together
        idx = [i for i in idx if on_device[i]]
        rows += [(rank[i], rank[idx[0]], end[i] - end[idx[0]]) for i in idx[1:]]
    p2p = np.flatnonzero((matches.how == "p2p") & on_device)
    for i in p2p:
        j = matches.dep[i]
        if i < j and on_device[j] and frame.at[i, "kind"] == schema.P2P:
            rows.append((rank[i], rank[j], end[i] - end[j]))
    a, b, diff = np.array(rows, dtype=np.int64).reshape(-1, 3).T
    swap = a > b
    table = pd.DataFrame({"a": np.where(swap, b, a), "b": np.where(swap, a, b),
                          "diff": np.where(swap, -diff, diff)})
    return table[table["a"] != table["b"]]


def _solve(ranks: list[int], pairs: pd.DataFrame) -> dict[int, int]:
    """Least squares for offset[a] - offset[b] = diff, the first rank of each component at 0."""
    position = {r: i for i, r in enumerate(ranks)}
    rows = np.zeros((len(pairs) + len(ranks), len(ranks)))
    rhs = np.zeros(len(pairs) + len(ranks))
    for k, (a, b, diff) in enumerate(pairs[["a", "b", "diff"]].itertuples(index=False)):
        rows[k, position[a]], rows[k, position[b]], rhs[k] = 1.0, -1.0, diff
    for root in _component_roots(ranks, pairs):
        rows[len(pairs) + position[root], position[root]] = 1.0
    solution, *_ = np.linalg.lstsq(rows, rhs, rcond=None)
    return {r: int(round(solution[position[r]])) for r in ranks}


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
