"""What a loaded bundle holds: per rank, its lanes, comm ops, steps; and the groups found."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.loading.steps import step_markers
from tracegraph.loading.trace import Trace


def inventory(trace: Trace) -> dict[str, object]:
    """A JSON-able summary of `trace` (the `analyze --json` "ranks" and "groups" keys)."""
    events = trace.events
    return inventory_of(trace, [rank_summary(row, events[events["rank"] == row["rank"]])
                                for row in trace.ranks.to_dict("records")])


def inventory_of(trace: Trace, ranks: list[dict[str, object]]) -> dict[str, object]:
    """`inventory` of `trace` from its ranks' `rank_summary`s (computed where they lie)."""
    groups = [
        {"group": g["group"], "name": g["name"], "desc": g["desc"], "dim": g["dim"],
         "size": int(g["size"]), "ranks": [int(r) for r in g["ranks"]], "source": g["source"]}
        for g in trace.groups.to_dict("records")
    ]
    return {"source": str(trace.source), "ranks": ranks, "groups": groups,
            "warnings": list(trace.warnings)}


def step_times(events: pd.DataFrame) -> dict[int, float]:
    """Step number -> duration in ms, from the `ProfilerStep#N` markers of one rank."""
    longest = step_markers(events).groupby("step")["dur_ns"].max().sort_index()
    return {int(step): ns / 1e6 for step, ns in longest.items()}


def rank_summary(meta: dict[str, object], events: pd.DataFrame) -> dict[str, object]:
    """One rank's entry of `inventory`: its `meta` (its row of the ranks table) and events;
    its lists and maps in the order of their names (not of the strings' coding, which depends
    on what else was loaded)."""
    lanes = sorted((str(k), int(n)) for k, n in
                   events.groupby("lane_kind", observed=True)["lane"].nunique().items())
    kinds = sorted(((str(k), int(n)) for k, n in events["kind"].value_counts().items() if n),
                   key=lambda kind: (-kind[1], kind[0]))  # kinds of other ranks count 0 here
    return {
        "rank": int(meta["rank"]),
        "framework": meta["framework"],
        "format": meta["format"],
        "path": meta["path"],
        "events": int(len(events)),
        "lanes": dict(lanes),
        "streams": sorted(int(s) for s in events.loc[events["stream"] >= 0, "stream"].unique()),
        "kinds": dict(kinds),
        "comm_ops": comm_ops(events),
        "steps": {str(k): round(v, 3) for k, v in step_times(events).items()},
        **({"incomplete": meta["incomplete"]} if meta.get("incomplete") else {}),
    }


def comm_ops(events: pd.DataFrame) -> list[dict[str, object]]:
    """comm, group, count of one rank's communication: its host calls (c10d::allreduce_, ...,
    the outermost of nested ones) where its profile holds them, with `no_kernel`, how many
    launched no device op the trace kept; its device-side comm ops that no such call launched
    (the trace holds no launch of them) as `host_call: false` with their kernel's name
    (`SendRecv`: its type left open, NCCL runs all-to-all and P2P alike with it); without host
    calls, its comm ops."""
    calls = _outermost(events[(events["kind"] == schema.HOST) & (events["comm"] != "")
                              & (events["lane_kind"] == schema.THREAD)])
    device = events[events["kind"].isin([schema.COLLECTIVE, schema.P2P])
                    & (events["lane_kind"] != schema.THREAD)]
    if calls.empty:
        return _counted(device)
    device = device[device["lane_kind"] == schema.STREAM]
    launched, kept = _launches(events, calls, device)
    rows = _counted(calls.assign(no_kernel=~launched), no_kernel=bool(
        (device["correlation"] >= 0).any()))
    orphan = device[(device["correlation"] >= 0) & ~device["correlation"].isin(kept)]
    family = orphan["name"].astype(str).str.replace(_KERNEL_PREFIX, "", regex=True).str.extract(
        r"^([A-Za-z0-9]+)", expand=False).fillna("")
    orphan = orphan.assign(comm=np.where(family.str.lower() == "sendrecv", "",
                                         orphan["comm"].astype(object)))
    return rows + [{**row, "host_call": False, "kernel": kernel}
                   for kernel, ops in orphan.groupby(family.to_numpy()) for row in _counted(ops)]


_KERNEL_PREFIX = r"^(?:nccl|rccl)(?:Dev)?Kernel_"


def _counted(ops: pd.DataFrame, no_kernel: bool = False) -> list[dict[str, object]]:
    """comm, group, count (and no_kernel: how many have it set) of `ops`, sorted by name."""
    grouped = ops.assign(comm=ops["comm"].astype(object), group=ops["group"].astype(object))
    if "no_kernel" not in grouped:
        grouped = grouped.assign(no_kernel=False)
    sums = grouped.groupby(["comm", "group"])["no_kernel"].agg(["size", "sum"])
    return [{"comm": str(c), "group": str(g), "count": int(n),
             **({"no_kernel": int(k)} if no_kernel else {})}
            for (c, g), (n, k) in sorted(sums.iterrows(), key=lambda kv: (str(kv[0][0]),
                                                                          str(kv[0][1])))]


def _outermost(calls: pd.DataFrame) -> pd.DataFrame:
    """The calls not nested in an earlier call of the same thread (record_param_comms runs
    inside c10d::allreduce_)."""
    calls = calls.sort_values(["lane", "start_ns"], kind="stable")
    end = (calls["start_ns"] + calls["dur_ns"]).to_numpy()
    lane = calls["lane"].astype(object).to_numpy()
    reach = pd.Series(end).groupby(lane).cummax().shift(1).to_numpy()
    first = np.r_[True, lane[1:] != lane[:-1]]
    return calls[first | ~(calls["start_ns"].to_numpy() < reach)]


def _launches(events: pd.DataFrame, calls: pd.DataFrame, device: pd.DataFrame
              ) -> tuple[np.ndarray, set[int]]:
    """Which host calls (outermost, so disjoint on a thread) launched a device comm op of
    `device` (a runtime call with its correlation id runs inside them), and the correlation ids
    of the device ops they launched."""
    wanted = device["correlation"][device["correlation"] >= 0]
    runtime = events[(events["kind"] == schema.HOST) & events["correlation"].isin(wanted)]
    launched, kept = np.zeros(len(calls), dtype=bool), set()
    call_lanes = calls["lane"].astype(object).to_numpy()
    for lane, mine in runtime.groupby(runtime["lane"].astype(object)):
        rows = np.flatnonzero(call_lanes == lane)
        lo = calls["start_ns"].to_numpy()[rows]
        hi = lo + calls["dur_ns"].to_numpy()[rows]
        at = mine["start_ns"].to_numpy()
        k = np.searchsorted(lo, at, "right") - 1
        inside = (k >= 0) & (at <= hi[np.maximum(k, 0)])
        launched[rows[k[inside]]] = True
        kept |= set(mine["correlation"].to_numpy()[inside].tolist())
    return launched, kept
