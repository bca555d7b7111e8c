"""Step stragglers: a rank whose main-lane work in one step is STEP_FACTOR times its peers'
median there (peers.py) is that step's straggler, whatever it does in the other steps (a
straggler that rotates between ranks averages out over the profile, which stragglers.py judges);
the op names that made it slow in that step are its straggler compute there."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph.analysis.peers import Peers
from tracegraph.analysis.stragglers import (
    SLOW_OP_SHARE,
    SLOW_RANK_FACTOR,
    main_work,
    median_of_others,
    on_host,
    own_work,
)
from tracegraph.analysis.walk import BindingWalk
from tracegraph.graph.ops import Ops

STEP_FACTOR = 2.0  # work this many times its peers' median in a step: that step's straggler
STEP_SHARE = 0.05  # ... by at least this share of the step
HOST_STEP_NOISE_NS = 20_000_000  # ... and, measured on host threads, by this much: a core held
# by other processes for a few scheduler slices adds that much to a step's work (a healthy
# PP2 x DP2 gloo job: one aten::transpose of 4.5 ms where its peer's took 0.06 ms)
COLUMNS = ["step", "rank", "work_ms", "peers_ms", "ratio"]


def step_work(walk: BindingWalk, steps: pd.DataFrame, working: np.ndarray | None = None
              ) -> pd.DataFrame:
    """step, rank, name, ns: each rank's main-lane work (`main_work`, computed unless given)
    in each of its step windows (`steps`: rank, step, start, end), per op name; an op counts
    in the window it starts in, up to the window's end."""
    graph = walk.graph
    working = np.flatnonzero(main_work(walk) if working is None else working)
    step, end = _step_of(graph.rank[working], graph.start[working], steps)
    inside = step >= 0
    idx = working[inside]
    frame = pd.DataFrame({"step": step[inside], "rank": graph.rank[idx].astype(np.int64),
                          "name": graph.ops.frame["name"].to_numpy(dtype=object)[idx],
                          "ns": np.minimum(graph.end[idx], end[inside]) - graph.start[idx]})
    return frame.dropna(subset=["name"]).groupby(["step", "rank", "name"], as_index=False)[
        "ns"].sum()


def _step_of(rank: np.ndarray, start: np.ndarray, steps: pd.DataFrame
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per op (its rank and start): the step whose window of its rank it starts in (-1 if
    none) and that window's end."""
    step = np.full(len(rank), -1, dtype=np.int64)
    end = np.zeros(len(rank), dtype=np.int64)
    for r, windows in steps.sort_values("start").groupby("rank"):
        mine = np.flatnonzero(rank == r)
        lo, hi = windows["start"].to_numpy(), windows["end"].to_numpy()
        k = np.searchsorted(lo, start[mine], "right") - 1
        ok = (k >= 0) & (start[mine] < hi[np.maximum(k, 0)])
        step[mine[ok]] = windows["step"].to_numpy()[k[ok]]
        end[mine[ok]] = hi[k[ok]]
    return step, end


def by_step(walk: BindingWalk, steps: pd.DataFrame, peers: Peers,
            working: np.ndarray | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """The step stragglers (`stragglers`) and the mask of the ops that made each slow in
    its step (`step_slow_names`); `working`: `main_work`, when the caller has it."""
    work, host = step_work(walk, steps, working), on_host(walk.graph.ops)
    found = stragglers(work, steps, peers, host)
    flagged = step_slow_names(work, found, peers, host)
    return found, step_slow_mask(walk.graph.ops, flagged, steps, walk.graph.start)


def stragglers(work: pd.DataFrame, steps: pd.DataFrame, peers: Peers, host: bool
                    ) -> pd.DataFrame:
    """COLUMNS of each rank whose work in a step (`step_work`) is STEP_FACTOR times the
    median of its peers' in that step at least, by STEP_SHARE of the step's length (and by
    HOST_STEP_NOISE_NS for a job seen through host threads, `host`: see `on_host`)."""
    totals = work.groupby(["step", "rank"], as_index=False)["ns"].sum()
    totals = totals[totals["rank"].isin(list(peers.classes))]
    if totals.empty:
        return pd.DataFrame(columns=COLUMNS)
    cls = totals["rank"].map(peers.classes).to_numpy(dtype=np.int64)
    key = pd.factorize(pd.MultiIndex.from_arrays([totals["step"], cls]))[0]
    others = median_of_others(totals["ns"].to_numpy(), key)
    length = steps.assign(ns=steps["end"] - steps["start"]).set_index(["rank", "step"])["ns"]
    span = length.reindex(pd.MultiIndex.from_frame(totals[["rank", "step"]])).to_numpy()
    ns = totals["ns"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        slow = (ns >= STEP_FACTOR * others) & (ns - others >= STEP_SHARE * span) & (
            ns - others >= (HOST_STEP_NOISE_NS if host else 0))
        ratio = ns / others
    found = totals[slow].assign(work_ms=ns[slow] / 1e6, peers_ms=others[slow] / 1e6,
                                ratio=ratio[slow])
    return found[COLUMNS].sort_values(["step", "rank"], ignore_index=True)


def step_slow_names(work: pd.DataFrame, stragglers: pd.DataFrame, peers: Peers, host: bool
                    ) -> set[tuple[int, int, str]]:
    """(step, rank, name) of the op names of each step straggler whose time in that step
    exceeds SLOW_RANK_FACTOR times its peers' median for the name in the step (a name they do
    not run there, any time): what made it slow (a sleep, every kernel of a throttled device),
    not its ordinary work; on host threads (`host`) by SLOW_OP_SHARE of its work in the step at
    least (a host's noise moves each small op's time by more than SLOW_RANK_FACTOR)."""
    flagged: set[tuple[int, int, str]] = set()
    for step, rank in stragglers[["step", "rank"]].itertuples(index=False):
        mine = work[work["step"] == step]
        cls = peers.classes.get(int(rank))
        others = mine[mine["rank"].map(peers.classes).eq(cls) & (mine["rank"] != rank)]
        median = others.pivot_table(index="name", columns="rank", values="ns", fill_value=0,
                                    aggfunc="sum").median(axis=1)
        own = mine[mine["rank"] == rank].set_index("name")["ns"]
        usual = median.reindex(own.index).fillna(0).to_numpy()
        slow = (own.to_numpy() > SLOW_RANK_FACTOR * usual) & (
            own.to_numpy() - usual >= (SLOW_OP_SHARE * own.sum() if host else 0))
        flagged |= {(int(step), int(rank), str(n)) for n in own.index[slow]}
    return flagged


def step_slow_mask(ops: Ops, flagged: set[tuple[int, int, str]], steps: pd.DataFrame,
                   start: np.ndarray) -> np.ndarray:
    """Per op (`start`: aligned): one of a step straggler's slow names (`step_slow_names`) in
    the step it starts in."""
    frame = ops.frame
    if not flagged:
        return np.zeros(len(frame), dtype=bool)
    ranks = frame["rank"].to_numpy().astype(np.int64)
    step, _ = _step_of(ranks, start, steps)
    keys = pd.MultiIndex.from_arrays([step, ranks, frame["name"].astype(object)])
    return np.asarray(keys.isin(list(flagged))) & own_work(frame)
