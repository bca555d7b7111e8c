"""Stage memory: the peak device memory of each rank and pipeline stage (from the memory table),
the activations above each stage's baseline against the 1F1B expectation (stage r of p keeps
p − r microbatches in flight; interleaved with v chunks, ((p − r − 1)·2 + (v − 1)·p + 1)/v),
and the stage closest to its device's capacity."""

from __future__ import annotations

import pandas as pd

from tracegraph.analysis.findings.finding import INFO, WARNING, Finding
from tracegraph.schema import FRAMEWORK_COMPONENTS

GIB = float(1 << 30)
IMBALANCE = 0.10  # stage peaks further apart than this are worth a warning
NEAR_LIMIT = 0.90  # ... and so is a stage above this share of its device
MEMORY_COLUMNS = ["rank", "stage", "component", "peak", "baseline", "activations", "reserved",
                  "capacity"]
SUGGESTION = ("give the first stages fewer layers (uneven pipeline layout) or recompute their "
              "activations (partial recompute of the earliest microbatches); interleaving (VPP) "
              "also spreads the embedding / loss load")


def memory_table(analysis, stages: dict[int, int]) -> pd.DataFrame:
    """rank, stage, component, peak, baseline, activations, reserved, capacity (bytes) within
    the rank's steps, from its framework allocator's rows."""
    memory = analysis.trace.memory
    rows: list[tuple] = []
    if not len(memory):
        return pd.DataFrame(rows, columns=MEMORY_COLUMNS)
    capacity = dict(zip(analysis.trace.ranks["rank"], analysis.trace.ranks["device_memory"],
                        strict=True))
    windows = analysis.step_table().groupby("rank").agg(lo=("start", "min"), hi=("end", "max"))
    for rank, mine in memory.groupby("rank"):
        component = next((c for c in FRAMEWORK_COMPONENTS
                          if ((mine["component"] == c) & (mine["allocated"] >= 0)).any()), None)
        if component is None:
            continue
        mine = mine[(mine["component"] == component) & (mine["allocated"] >= 0)]
        at = mine["start_ns"] - analysis.offsets.get(int(rank), 0)
        if rank in windows.index:
            inside = (at >= windows.at[rank, "lo"]) & (at <= windows.at[rank, "hi"])
            mine = mine[inside] if inside.any() else mine
        peak, base = int(mine["allocated"].max()), int(mine["allocated"].min())
        rows.append((int(rank), stages.get(int(rank), 0), component, peak, base, peak - base,
                     int(mine["reserved"].max()), int(capacity.get(rank, -1))))
    return pd.DataFrame(rows, columns=MEMORY_COLUMNS)


def expected_in_flight(p: int, v: int = 1) -> list[float]:
    """Microbatches of activations (in whole-stage units) each stage keeps at its peak."""
    if v <= 1:
        return [float(p - r) for r in range(p)]
    return [((p - r - 1) * 2 + (v - 1) * p + 1) / v for r in range(p)]


def finding(analysis, stages: dict[int, int], pipeline=None) -> Finding | None:
    """The stage-memory finding; None when no profile recorded memory."""
    table = memory_table(analysis, stages)
    if not len(table):
        return None
    by_stage = table.groupby("stage").agg(peak=("peak", "max"), activations=("activations", "max"),
                                          ranks=("rank", list))
    imbalance = float(by_stage["peak"].max() / by_stage["peak"].min() - 1)
    p = len(by_stage)
    v = _chunks(pipeline)
    expected = expected_in_flight(p, v)
    first = by_stage["activations"].iloc[0]
    held = by_stage["activations"] / first * expected[0] if first else by_stage["activations"] * 0
    lines = [f"stage {s}: peak {r.peak / GIB:.2f} GiB (ranks {r.ranks}), activations "
             f"{r.activations / GIB:.2f} GiB = {held[s]:.2f} microbatches (scaled to stage "
             f"{by_stage.index[0]}'s {expected[0]:g}) against {expected[i]:.2f} expected"
             for i, (s, r) in enumerate(by_stage.iterrows())] if p > 1 else [
        f"peak {table['peak'].max() / GIB:.2f} GiB (ranks {by_stage['ranks'].iloc[0]}); one "
        "pipeline stage: no stage to compare it with"]
    share = (table["reserved"] / table["capacity"]).where(table["capacity"] > 0)
    closest = table.loc[share.idxmax()] if share.notna().any() else table.loc[
        table["peak"].idxmax()]
    limit = (f"rank {int(closest['rank'])} (stage {int(closest['stage'])}) is closest to its "
             f"limit: {closest['reserved'] / GIB:.2f} of {closest['capacity'] / GIB:.1f} GiB "
             f"reserved" if share.notna().any() else
             f"rank {int(closest['rank'])} (stage {int(closest['stage'])}) holds the most; the "
             "device's capacity is not in the profile")
    lines.append(limit)
    near = bool(share.notna().any() and share.max() > NEAR_LIMIT)
    warn = (p > 1 and imbalance > IMBALANCE) or near
    top, low = by_stage["peak"].idxmax(), by_stage["peak"].idxmin()
    title = (f"stage memory: stage {top} peaks {imbalance:.0%} above stage {low} "
             f"({by_stage['peak'].max() / GIB:.2f} vs {by_stage['peak'].min() / GIB:.2f} GiB)"
             if p > 1 else f"device memory: peak {by_stage['peak'].max() / GIB:.2f} GiB")
    return Finding("stage_memory", WARNING if warn else INFO, title,
                   SUGGESTION if warn else "nothing to do", lines,
                   {"imbalance": round(imbalance, 4), "stages": p, "chunks": v,
                    "expected_in_flight": [round(e, 3) for e in expected],
                    "closest_rank": int(closest["rank"]),
                    "closest_share": None if not share.notna().any() else round(
                        float(share.max()), 4),
                    "per_rank": table.to_dict("records")})


def _chunks(pipeline) -> int:
    if pipeline is None or not len(pipeline.blocks):
        return 1
    return int(max(pipeline.blocks.groupby("rank")["chunk"].nunique().max(), 1))



