"""Peers: the ranks that do the same work, against which a rank's speed is judged.

Two ranks are peers when they run the same program: the same mix of compute op names (distinct
ops counted per name, within MIX_TOLERANCE), or replicas in one data-parallel group (the same
pipeline stage). Ranks of different pipeline stages run different layers (the first embeds, the
last computes the loss), so comparing them names the heavier stage a straggler. A rank whose
profile holds no compute (communication summaries only), or whose parser knows its timeline
misses events, measures no one; a rank with no measured peer is not judged, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.ops import Ops, comm_calls

MIX_TOLERANCE = 0.02
"""Two ranks run the same program when their op-name counts differ by at most this share of
all their ops (Bray-Curtis dissimilarity). Replicas of one stage differ by < 0.5 % (a rank that
logs a metric); the corpus' pipeline stages by 15-25 %, a real Ascend PP2 job's by 3 %."""


@dataclass
class Peers:
    """Who is judged against whom."""

    classes: dict[int, int]  # measured rank -> its class: the ranks that do the same work
    unjudged: dict[int, str] = field(default_factory=dict)  # rank -> why it is not judged

    def groups(self) -> list[list[int]]:
        """The classes of two ranks or more, as sorted rank lists."""
        members: dict[int, list[int]] = {}
        for rank, cls in sorted(self.classes.items()):
            members.setdefault(cls, []).append(rank)
        return [ranks for ranks in members.values() if len(ranks) > 1]


def find_peers(ops: Ops, groups: pd.DataFrame, incomplete: dict[int, str],
               stated: pd.DataFrame | None = None, pipelined: bool = True) -> Peers:
    """The classes of measured ranks (their main lane holds compute and their profile is not
    known to miss events) that run the same program, and why each other rank is not judged
    (`stated`: `Trace.stated_steps`, what the ranks' step tables say they computed;
    `pipelined`: whether the job has a pipeline, `blame.pipelined_job`)."""
    return peers_of(op_mix(ops), set(ops.frame["rank"].unique().tolist()), groups, incomplete,
                    stated, pipelined)


def peers_of(mix: pd.DataFrame, present: set[int], groups: pd.DataFrame,
             incomplete: dict[int, str], stated: pd.DataFrame | None = None,
             pipelined: bool = True) -> Peers:
    """`find_peers` from the ranks' `op_mix` (gathered from parts on a cluster) and the ranks
    that hold ops at all."""
    computing = _stated_computing(stated)
    complete = [r for r in mix.index if int(r) not in incomplete]
    replicas = _dp_groups(groups, pipelined)
    classes = _classes(mix.loc[complete], _replica_links(replicas, set(complete)))
    sizes = pd.Series(classes).value_counts()
    unjudged = {r: f"its profile misses events: {why}" for r, why in incomplete.items()}
    if len(present) > 1:
        for rank in (r for r in complete if sizes[classes[r]] == 1):
            unjudged[rank] = _no_peer(rank, present, replicas, classes, incomplete, computing)
    return Peers(classes={r: c for r, c in classes.items() if sizes[c] > 1},
                 unjudged=dict(sorted(unjudged.items())))


def op_mix(ops: Ops) -> pd.DataFrame:
    """rank × op name: how many distinct ops of each name the rank's main lane ran (its own
    work: compute, and on host threads the ops that are not communication calls)."""
    frame = ops.frame
    main = list(ops.main_lanes().values())
    mine = np.isin(frame["lane_id"].to_numpy(), main) & frame["kind"].isin(
        [schema.COMPUTE, schema.HOST]).to_numpy() & ~comm_calls(frame) & frame["name"].notna(
        ).to_numpy()
    chosen = frame.loc[mine, ["rank", "name", "event"]]
    return chosen.groupby(["rank", "name"], observed=True)["event"].nunique().unstack(
        fill_value=0)


def _classes(mix: pd.DataFrame, links: list[tuple[int, int]]) -> dict[int, int]:
    """rank -> class: each rank joins the first class whose first rank's mix is within
    MIX_TOLERANCE of its own (few classes: one per distinct program), then classes that
    `links` join are merged."""
    counts = mix.to_numpy(dtype=np.float64)
    leaders: list[int] = []
    parent: dict[int, int] = {}
    for k, rank in enumerate(mix.index.astype(int)):
        if leaders:
            lead = counts[leaders]
            apart = np.abs(lead - counts[k]).sum(axis=1) / np.maximum(
                (lead + counts[k]).sum(axis=1), 1)
            if apart.min() <= MIX_TOLERANCE:
                parent[rank] = int(mix.index[leaders[int(apart.argmin())]])
                continue
        leaders.append(k)
        parent[rank] = rank

    def root(r: int) -> int:
        while parent[r] != r:
            r = parent[r]
        return r

    for a, b in links:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    return {r: root(r) for r in parent}


def _replica_links(replicas: list, measured: set[int]) -> list[tuple[int, int]]:
    """Pairs of measured ranks that one data-parallel group (`replicas`) holds: replicas of
    one stage."""
    links = []
    for ranks in replicas:
        present = [int(r) for r in ranks if int(r) in measured]
        links += [(present[0], r) for r in present[1:]]
    return links


def _dp_groups(groups: pd.DataFrame, pipelined: bool) -> list:
    """The data-parallel groups' members: replicas of one stage. A job without a pipeline whose
    groups name no parallel dimension but the world's is data-parallel on the default group
    (its declared work may vary in op counts from rank to rank)."""
    if not len(groups):
        return []
    dims = set(groups["dim"])
    if not pipelined and not dims & {"dp", "pp", "tp", "ep", "cp"}:
        return list(groups.loc[groups["dim"] == "world", "ranks"])
    return list(groups.loc[groups["dim"] == "dp", "ranks"])


def _stated_computing(stated: pd.DataFrame | None) -> dict[int, str]:
    """Rank -> "Computing 230.9 ms" (per step, the mean, where it states several): what its
    step table says it computed."""
    if stated is None or not len(stated):
        return {}
    per = stated.dropna(subset=["computing_ms"]).groupby("rank")["computing_ms"].agg(
        ["mean", "size"])
    return {int(r): f"Computing {ms:.1f} ms" + (" per step" if n > 1 else "")
            for r, (ms, n) in per.iterrows()}


def _no_compute(rank: int, computing: dict[int, str]) -> str:
    """What a rank that holds ops but no compute lacks, and what its step table says."""
    if rank not in computing:
        return f"rank {rank} holds no compute"
    return (f"rank {rank}: its profile holds no compute timeline; its step table states "
            f"{computing[rank]}")


def _no_peer(rank: int, present: set[int], groups: list, classes: dict[int, int],
             incomplete: dict[int, str], computing: dict[int, str]) -> str:
    """Why `rank`, alone in its class, is not judged: its replicas' (in `groups`) compute is
    not in the profile, else no rank runs its program."""
    replicas = sorted({int(r) for ranks in groups if rank in set(ranks)
                       for r in ranks} - {rank})
    unseen = [f"rank {r} misses events" if r in incomplete else _no_compute(r, computing)
              if r in present else f"rank {r} is not in the bundle"
              for r in replicas if r not in classes]
    if unseen:
        return f"no peer doing the same work: of its data-parallel replicas, {', '.join(unseen)}"
    return "no peer doing the same work: no other rank runs the same ops (op-name mix)"
