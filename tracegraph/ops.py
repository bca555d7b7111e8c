"""The operations that make up each rank's timelines, as flat arrays sorted by lane and time.

A rank is seen through its device streams when the profile has them (kernels, waits, records and
comm ops on the stream where they execute); a CPU-only rank (gloo) through its host threads, whose
nested events are flattened into the innermost event at each instant; a rank known only from
communication summaries through its comm ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.steps import is_step_marker

DEVICE_KINDS = (schema.COMPUTE, schema.WAIT, schema.RECORD, schema.MEMCPY, schema.COLLECTIVE,
                schema.P2P)
COMM_KINDS = (schema.COLLECTIVE, schema.P2P)
BLOCKING_KINDS = (schema.WAIT, schema.COLLECTIVE, schema.P2P)
COLUMNS = ["event", "rank", "lane", "kind", "comm", "name", "group", "peer", "seq", "start",
           "end", "stream", "correlation", "event_id", "wait_on_stream", "step", "annotation"]


@dataclass
class Ops:
    """Timeline operations: `frame` sorted by (lane_id, start); `lane_id` indexes `lanes`."""

    frame: pd.DataFrame
    lanes: pd.DataFrame  # lane_id -> rank, lane, mode ("stream" | "thread" | "comm"), main

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def start(self) -> np.ndarray:
        return self.frame["start"].to_numpy()

    @property
    def end(self) -> np.ndarray:
        return self.frame["end"].to_numpy()

    def lane_prev(self) -> np.ndarray:
        """Index of the previous op on the same lane, -1 for a lane's first op."""
        lane = self.frame["lane_id"].to_numpy()
        prev = np.arange(len(lane)) - 1
        first = np.ones(len(lane), dtype=bool)
        first[1:] = lane[1:] != lane[:-1]
        prev[first] = -1
        return prev

    def main_lanes(self) -> dict[int, int]:
        """rank -> lane_id of its main compute lane (where bubbles are measured)."""
        main = self.lanes[self.lanes["main"]]
        return dict(zip(main["rank"], main["lane_id"], strict=True))


def build_ops(events: pd.DataFrame) -> Ops:
    """Select and order the timeline operations of every rank."""
    parts = []
    for rank, rank_events in events.groupby("rank", sort=True):
        parts.append(_rank_ops(int(rank), rank_events))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)
    frame = frame[frame["end"] >= frame["start"]]
    lanes = _lane_table(frame)
    lane_ids = {(r, lane): i for i, (r, lane) in enumerate(zip(lanes["rank"], lanes["lane"],
                                                                strict=True))}
    frame = frame.assign(lane_id=[lane_ids[k] for k in zip(frame["rank"], frame["lane"],
                                                           strict=True)])
    frame = frame.sort_values(["lane_id", "start", "end"], kind="stable", ignore_index=True)
    return Ops(frame=frame.assign(launch=_launch_times(frame, events)), lanes=lanes)


def _launch_times(frame: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """When the host enqueued each device op: the earliest host call sharing its correlation
    (Kineto launch calls, Ascend CANN calls with the task's connection_id); -1 if unknown."""
    host = events[(events["lane_kind"] == schema.THREAD) & (events["kind"] == schema.HOST)
                  & (events["correlation"] >= 0)]
    first = host.groupby(["rank", "correlation"])["start_ns"].min().rename("launch")
    on_device = frame["lane"].str.startswith("stream ") & (frame["correlation"] >= 0)
    keys = pd.MultiIndex.from_arrays([frame["rank"], frame["correlation"]])
    launch = first.reindex(keys).to_numpy()
    return np.where(on_device.to_numpy() & ~np.isnan(launch), np.nan_to_num(launch), -1
                    ).astype(np.int64)


def _rank_ops(rank: int, events: pd.DataFrame) -> pd.DataFrame:
    on_stream = (events["lane_kind"] == schema.STREAM) & events["kind"].isin(DEVICE_KINDS)
    comm_rows = (events["lane_kind"] == schema.COMM) & events["kind"].isin(COMM_KINDS)
    if on_stream.any():
        comm = _frame(events[comm_rows])
        placed = comm["stream"] >= 0
        comm.loc[placed, "lane"] = "stream " + comm.loc[placed, "stream"].astype(str)
        device = _frame(events[on_stream])
        device = device[~(device["kind"].isin(COMM_KINDS)
                          & device["correlation"].isin(comm.loc[placed, "correlation"])
                          & (device["correlation"] >= 0))]
        return pd.concat([device, comm], ignore_index=True).assign(mode=schema.STREAM)
    threads = events[(events["lane_kind"] == schema.THREAD) & ~is_step_marker(events)]
    if len(threads):
        flat = pd.concat([_flatten(lane) for _, lane in threads.groupby("lane")],
                         ignore_index=True)
        return pd.concat([flat.assign(mode=schema.THREAD),
                          _frame(events[comm_rows]).assign(mode=schema.COMM)], ignore_index=True)
    return _frame(events[comm_rows]).assign(mode=schema.COMM)


def _frame(events: pd.DataFrame) -> pd.DataFrame:
    """Events in the ops layout (`event` = row label in the trace's events table)."""
    frame = events.rename(columns={"start_ns": "start"})
    frame = frame.assign(event=events.index.to_numpy(), end=events["start_ns"] + events["dur_ns"])
    return frame[COLUMNS].reset_index(drop=True)


def _flatten(lane_events: pd.DataFrame) -> pd.DataFrame:
    """Nested host events -> consecutive segments, each owned by the innermost event."""
    ordered = _frame(lane_events.sort_values(["start_ns", "dur_ns"], ascending=[True, False]))
    starts, ends = ordered["start"].to_numpy(), ordered["end"].to_numpy()
    owner, seg_start, seg_end = [], [], []
    stack: list[int] = []
    cursor = starts[0] if len(starts) else 0

    def emit(upto: int) -> None:
        nonlocal cursor
        if stack and upto > cursor:
            owner.append(stack[-1])
            seg_start.append(cursor)
            seg_end.append(upto)
        cursor = max(cursor, upto)

    for i in range(len(starts)):
        while stack and ends[stack[-1]] <= starts[i]:
            emit(ends[stack[-1]])  # the segment up to its end belongs to it, then it closes
            stack.pop()
        emit(starts[i])
        stack.append(i)
    while stack:
        emit(ends[stack[-1]])
        stack.pop()
    segments = ordered.iloc[owner].reset_index(drop=True)
    return segments.assign(start=seg_start, end=seg_end)


def _lane_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, lane) with its mode and whether it is the rank's main compute lane."""
    busy = frame.assign(dur=frame["end"] - frame["start"],
                        computing=frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER]))
    per_lane = busy.groupby(["rank", "lane", "mode"], sort=True).apply(
        lambda g: int(g.loc[g["computing"], "dur"].sum()), include_groups=False)
    lanes = per_lane.rename("compute_ns").reset_index()
    lanes["main"] = False
    eligible = lanes[lanes["mode"] != schema.COMM]
    if len(eligible):
        best = eligible.sort_values("compute_ns", ascending=False).drop_duplicates("rank")
        lanes.loc[best.index, "main"] = lanes.loc[best.index, "compute_ns"] > 0
    lanes.insert(0, "lane_id", np.arange(len(lanes)))
    return lanes
