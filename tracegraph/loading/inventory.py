"""What a loaded bundle holds: per rank, its lanes, comm ops, steps; and the groups found."""

from __future__ import annotations

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
    comm = events[events["kind"].isin([schema.COLLECTIVE, schema.P2P])
                  & (events["lane_kind"] != schema.THREAD)]
    by_type = sorted((str(c), str(g), int(n)) for (c, g), n in
                     comm.groupby(["comm", "group"], observed=True).size().items())
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
        "comm_ops": [{"comm": c, "group": g, "count": n} for c, g, n in by_type],
        "steps": {str(k): round(v, 3) for k, v in step_times(events).items()},
        **({"incomplete": meta["incomplete"]} if meta.get("incomplete") else {}),
    }
