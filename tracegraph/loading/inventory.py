"""What a loaded bundle holds: per rank, its lanes, comm ops, steps; and the groups found."""

from __future__ import annotations

import pandas as pd

from tracegraph import schema
from tracegraph.loading.steps import step_markers
from tracegraph.loading.trace import Trace


def inventory(trace: Trace) -> dict[str, object]:
    """A JSON-able summary of `trace` (the `analyze --json` "ranks" and "groups" keys)."""
    events = trace.events
    ranks = [_rank_summary(row, events[events["rank"] == row["rank"]])
             for row in trace.ranks.to_dict("records")]
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


def _rank_summary(meta: dict[str, object], events: pd.DataFrame) -> dict[str, object]:
    comm = events[events["kind"].isin([schema.COLLECTIVE, schema.P2P])
                  & (events["lane_kind"] != schema.THREAD)]
    by_type = comm.groupby(["comm", "group"], observed=True).size()
    lanes = events.groupby("lane_kind", observed=True)["lane"].nunique()
    return {
        "rank": int(meta["rank"]),
        "framework": meta["framework"],
        "format": meta["format"],
        "path": meta["path"],
        "events": int(len(events)),
        "lanes": {str(kind): int(n) for kind, n in lanes.items()},
        "streams": sorted(int(s) for s in events.loc[events["stream"] >= 0, "stream"].unique()),
        "kinds": {str(k): int(n) for k, n in events["kind"].value_counts().items()},
        "comm_ops": [{"comm": c, "group": g, "count": int(n)} for (c, g), n in by_type.items()],
        "steps": {str(k): round(v, 3) for k, v in step_times(events).items()},
        **({"incomplete": meta["incomplete"]} if meta.get("incomplete") else {}),
    }
