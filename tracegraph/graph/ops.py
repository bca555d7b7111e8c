"""The operations that make up each rank's timelines, as flat arrays sorted by lane and time.

A rank is seen through its device streams when the profile has them (kernels, waits, records and
comm ops on the stream where they execute); a CPU-only rank (gloo) through its host threads, whose
nested events are flattened into the innermost event at each instant; a rank known only from
communication summaries through its comm ops.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from tracegraph import schema
from tracegraph.loading.steps import is_step_marker

DEVICE_KINDS = (schema.COMPUTE, schema.WAIT, schema.RECORD, schema.MEMCPY, schema.COLLECTIVE,
                schema.P2P)
COMM_KINDS = (schema.COLLECTIVE, schema.P2P)
BLOCKING_KINDS = (schema.WAIT, schema.COLLECTIVE, schema.P2P)
COLUMNS = ["event", "rank", "lane", "kind", "comm", "name", "group", "peer", "seq", "start",
           "end", "stream", "correlation", "event_id", "wait_on_stream", "step", "annotation",
           "autograd_seq"]
_SOURCE_COLUMNS = {*COLUMNS, "start_ns", "dur_ns", "lane_kind"}
STRING_COLUMNS = ("lane", "kind", "comm", "name", "group", "annotation")
STREAM_WAIT_CALLS = ("cudaStreamWaitEvent", "hipStreamWaitEvent")
"""Host calls that make a stream wait for an event recorded on another stream."""


@dataclass
class Ops:
    """Timeline operations: `frame` sorted by (lane_id, start); `lane_id` indexes `lanes`."""

    frame: pd.DataFrame
    lanes: pd.DataFrame  # lane_id -> rank, lane, mode ("stream" | "thread" | "comm"), main

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def start(self) -> np.ndarray:
        return self.frame["start"].to_numpy(np.int64)  # int64 also when there is no op

    @property
    def end(self) -> np.ndarray:
        return self.frame["end"].to_numpy(np.int64)

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
    events = events[[c for c in events.columns if c in _SOURCE_COLUMNS]]
    dtypes = events.dtypes
    on_stream, comm = _mask(_on_stream(events)), _mask(_comm_rows(events))
    rank = events["rank"].to_numpy()
    streamed = np.isin(rank, np.unique(rank[on_stream]))  # ranks seen through device streams
    calls, host_waits = _host_calls(events), _host_waits(events)
    used = (streamed & (on_stream | comm)) | ~streamed  # host-side rows of device ranks: no ops
    events, on_stream, comm, streamed = events[used], on_stream[used], comm[used], streamed[used]
    events = events.assign(**{c: shared_strings(events[c]) for c in STRING_COLUMNS})
    parts = [_stream_ops(events[streamed & on_stream], events[streamed & comm])]
    parts += [_host_ops(rank_events) for _, rank_events in events[~streamed].groupby("rank")]
    parts = [p for p in parts if len(p)]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=[*COLUMNS, "mode"])  # no op at all (a profile of markers only)
    del events, parts  # the rows were copied into the ops
    frame = frame[frame["end"] >= frame["start"]]
    lanes = _lane_table(frame)
    frame = frame.assign(lane_id=_lane_ids(frame, lanes))
    frame = frame.sort_values(["lane_id", "start", "end"], kind="stable", ignore_index=True)
    frame = frame.assign(launch=_launch_times(frame, calls),
                         host_wait=_after_host_waits(frame, host_waits), **{
        c: restore_strings(frame[c], dtypes[c]) for c in STRING_COLUMNS})
    return Ops(frame=frame, lanes=lanes)


def shared_strings(column: pd.Series) -> pd.Series:
    """`column` as object dtype holding one `str` per distinct value (None for missing):
    taking, sorting and iterating it is many times faster than Arrow strings."""
    if column.dtype == object:
        return column
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, uniques = column.cat.codes.to_numpy(), column.cat.categories
    else:
        codes, uniques = pd.factorize(column)
    values = np.append(np.asarray(uniques, dtype=object), None)[codes]
    return pd.Series(values, index=column.index, dtype=object, name=column.name)


def restore_strings(column: pd.Series, dtype: object) -> pd.Series:
    """Shared object strings back to `dtype` (the trace's: a Categorical, whose categories grow
    by values it lacks, or Arrow-backed strings), converting each distinct value once."""
    if pd.api.types.is_object_dtype(dtype):
        return column
    codes, uniques = pd.factorize(column)
    if isinstance(dtype, pd.CategoricalDtype):
        categories = dtype.categories
        new = uniques[categories.get_indexer(uniques) < 0]
        if len(new):
            categories = categories.append(pd.Index(new, dtype=categories.dtype))
        coded = np.append(categories.get_indexer(uniques), -1)[codes]
        return pd.Series(pd.Categorical.from_codes(coded, dtype=pd.CategoricalDtype(categories)),
                         index=column.index, name=column.name)
    values = pa.array(np.asarray(uniques, dtype=object), pa.large_string())
    decoded = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), values)
    return pd.Series(pd.array(decoded.cast(pa.large_string()), dtype=dtype), index=column.index,
                     name=column.name)


def first_parts(frame: pd.DataFrame) -> np.ndarray:
    """Per op, the first op of its event: a comm record nested ops split in parts (gloo's
    async `gloo:recv` around the compute it overlaps) is one transfer, posted in its first part
    and waited for in its last. Other ops are their own first part."""
    first = np.arange(len(frame))
    comm = np.flatnonzero(frame["kind"].isin([schema.P2P, schema.COLLECTIVE]).to_numpy())
    if len(comm):
        keys = [frame["rank"].to_numpy()[comm], frame["event"].to_numpy()[comm]]
        first[comm] = pd.Series(comm).groupby(keys, sort=False).transform("first").to_numpy()
    return first


def continued(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the comm ops whose event goes on in a later op (`first_parts`): matched by
    their last part only."""
    keys = frame[["rank", "event"]]
    return (keys.duplicated(keep="last").to_numpy()
            & frame["kind"].isin([schema.P2P, schema.COLLECTIVE]).to_numpy())


def comm_calls(frame: pd.DataFrame) -> np.ndarray:
    """Mask of the host ops that are communication calls (a blocking `c10d::recv_`): time in
    them is the communication's, not the rank's own work."""
    return (frame["kind"].to_numpy() == schema.HOST) & (frame["comm"].to_numpy() != "")


def startswith(column: pd.Series, prefix: str) -> np.ndarray:
    """Mask of the values of `column` that start with `prefix`, testing each distinct value once."""
    return _distinct(column, lambda value: value.startswith(prefix))


def searches(column: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Mask of the values of `column` in which `pattern` is found, testing each distinct value
    once."""
    return _distinct(column, lambda value: pattern.search(value) is not None)


def _distinct(column: pd.Series, test: Callable[[str], bool]) -> np.ndarray:
    codes, uniques = pd.factorize(column)
    hits = np.array([test(str(u)) for u in uniques] + [False], dtype=bool)
    return hits[codes]


def _mask(condition: pd.Series) -> np.ndarray:
    return condition.to_numpy(dtype=bool, na_value=False)


def _on_stream(events: pd.DataFrame) -> pd.Series:
    return (events["lane_kind"] == schema.STREAM) & events["kind"].isin(DEVICE_KINDS)


def _comm_rows(events: pd.DataFrame) -> pd.Series:
    return (events["lane_kind"] == schema.COMM) & events["kind"].isin(COMM_KINDS)


def _stream_ops(device_events: pd.DataFrame, comm_events: pd.DataFrame) -> pd.DataFrame:
    """Ranks with device streams: their device ops, comm ops placed on the stream they name
    (replacing the stream's copy of the same op, matched by correlation)."""
    comm = _frame(comm_events)
    placed = comm["stream"] >= 0
    comm.loc[placed, "lane"] = "stream " + comm.loc[placed, "stream"].astype(str)
    device = _frame(device_events)
    keys = pd.MultiIndex.from_arrays([comm.loc[placed, "rank"], comm.loc[placed, "correlation"]])
    copied = pd.MultiIndex.from_arrays([device["rank"], device["correlation"]]).isin(keys)
    device = device[~(device["kind"].isin(COMM_KINDS).to_numpy() & copied
                      & (device["correlation"] >= 0).to_numpy())]
    return pd.concat([device, comm], ignore_index=True).assign(mode=schema.STREAM)


def _host_ops(events: pd.DataFrame) -> pd.DataFrame:
    """A rank without device streams: its host threads flattened, plus its comm ops."""
    comm = _frame(events[_mask(_comm_rows(events))]).assign(mode=schema.COMM)
    threads = events[_mask(events["lane_kind"] == schema.THREAD) & ~is_step_marker(events)]
    if not len(threads):
        return comm
    flat = pd.concat([_flatten(lane) for _, lane in threads.groupby("lane")], ignore_index=True)
    return pd.concat([flat.assign(mode=schema.THREAD), comm], ignore_index=True)


def _host_calls(events: pd.DataFrame) -> pd.DataFrame:
    """rank, correlation, start_ns of the host calls that carry a correlation id."""
    return events.loc[_host_call_rows(events), ["rank", "correlation", "start_ns"]]


def _host_waits(events: pd.DataFrame) -> pd.DataFrame:
    """rank, correlation of the host's stream-wait calls (`cudaStreamWaitEvent`,
    `hipStreamWaitEvent`): a stream told to wait for an event another stream records."""
    waits = _host_call_rows(events) & _mask(events["name"].isin(STREAM_WAIT_CALLS))
    return events.loc[waits, ["rank", "correlation"]]


def _host_call_rows(events: pd.DataFrame) -> np.ndarray:
    """Mask of the host calls that carry a correlation id."""
    return _mask((events["lane_kind"] == schema.THREAD) & (events["kind"] == schema.HOST)
                 & (events["correlation"] >= 0))


def _after_host_waits(frame: pd.DataFrame, waits: pd.DataFrame) -> np.ndarray:
    """Per device op: the correlation of the host stream-wait call right before its launch
    (it is the first device op the host launched after the call: the stream it went to was the
    one told to wait), -1 for the others and where the profile holds the wait's device side.
    Launch correlations grow in host call order."""
    out = np.full(len(frame), -1, dtype=np.int64)
    seen = frame.loc[frame["kind"] == schema.WAIT, ["rank", "correlation"]]  # device-side waits
    waits = waits[~pd.MultiIndex.from_frame(waits).isin(pd.MultiIndex.from_frame(seen))]
    if not len(waits):
        return out
    device = np.flatnonzero(startswith(frame["lane"], "stream ")
                            & (frame["correlation"] >= 0).to_numpy())
    ranks, corr = frame["rank"].to_numpy()[device], frame["correlation"].to_numpy()[device]
    for rank, calls in waits.groupby("rank")["correlation"]:
        mine = device[ranks == rank]
        order = np.argsort(corr[ranks == rank], kind="stable")
        mine, launched = mine[order], corr[ranks == rank][order]
        pos = np.searchsorted(launched, calls.to_numpy(), side="right")
        ok = pos < len(mine)
        np.maximum.at(out, mine[pos[ok]], calls.to_numpy()[ok])
    return out


def _launch_times(frame: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """When the host enqueued each device op: the earliest host call sharing its correlation
    (Kineto launch calls, Ascend CANN calls with the task's connection_id); -1 if unknown.
    Sorted arrays and a binary search per rank: a group-by over the host calls (half the
    events) held four times their size."""
    rank, corr, start = (calls[c].to_numpy() for c in ("rank", "correlation", "start_ns"))
    order = np.lexsort((start, corr, rank))
    rank, corr, start = rank[order], corr[order], start[order]
    first = np.ones(len(rank), dtype=bool)  # each (rank, correlation)'s earliest call
    first[1:] = (rank[1:] != rank[:-1]) | (corr[1:] != corr[:-1])
    rank, corr, start = rank[first], corr[first], start[first]
    launch = np.full(len(frame), -1, dtype=np.int64)
    if not len(rank):  # no host call carries a correlation
        return launch
    on_device = startswith(frame["lane"], "stream ") & (frame["correlation"] >= 0).to_numpy()
    op_rank, op_corr = frame["rank"].to_numpy(), frame["correlation"].to_numpy()
    for r in np.unique(op_rank[on_device]):
        lo, hi = np.searchsorted(rank, r, "left"), np.searchsorted(rank, r, "right")
        ops = np.flatnonzero(on_device & (op_rank == r))
        pos = lo + np.searchsorted(corr[lo:hi], op_corr[ops])
        found = (pos < hi) & (corr[np.minimum(pos, len(corr) - 1)] == op_corr[ops])
        launch[ops[found]] = start[pos[found]]
    return launch


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
    waited = _resumed_after_a_comm_call(segments, np.asarray(seg_start), np.asarray(seg_end))
    return segments.assign(start=seg_start, end=seg_end,
                           kind=segments["kind"].where(~waited, schema.MARKER))


def _resumed_after_a_comm_call(segments: pd.DataFrame, seg_start: np.ndarray,
                               seg_end: np.ndarray) -> np.ndarray:
    """Mask of the segments where an enclosing host op goes on right after a communication call
    nested in it returned (an autograd function around a TP all-reduce, then `wait()`): its
    thread may be blocked on that communication there, so the stretch is an annotation's (a
    wait when a comm op's end releases it, the rank's own work otherwise), never compute."""
    after = np.zeros(len(segments), dtype=bool)
    if len(segments) < 2:
        return after
    call = comm_calls(segments)
    event, began = segments["event"].to_numpy(), segments["start"].to_numpy()
    after[1:] = (call[:-1] & (event[1:] != event[:-1]) & (began[1:] < seg_start[1:])
                 & (seg_end[:-1] == seg_start[1:]))  # the call's owner goes on as it returns
    kind = segments["kind"].to_numpy()
    return after & ((kind == schema.HOST) | (kind == schema.COMPUTE))


def _lane_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, lane) with its mode and whether it is the rank's main compute lane."""
    computing = frame["kind"].isin([schema.COMPUTE, schema.HOST, schema.MARKER])
    busy = (frame["end"] - frame["start"]).where(computing, 0).astype("int64")
    lanes = busy.groupby([frame["rank"], frame["lane"], frame["mode"]], sort=True).sum()
    lanes = lanes.rename("compute_ns").reset_index()
    lanes["main"] = False
    eligible = lanes[lanes["mode"] != schema.COMM]
    if len(eligible):
        best = eligible.sort_values("compute_ns", ascending=False).drop_duplicates("rank")
        lanes.loc[best.index, "main"] = lanes.loc[best.index, "compute_ns"] > 0
    lanes.insert(0, "lane_id", np.arange(len(lanes)))
    return lanes


def _lane_ids(frame: pd.DataFrame, lanes: pd.DataFrame) -> np.ndarray:
    """Each op's lane_id: the last row of `lanes` with its (rank, lane)."""
    keys = lanes.drop_duplicates(["rank", "lane"], keep="last")
    index = pd.MultiIndex.from_arrays([keys["rank"], keys["lane"]])
    found = index.get_indexer(pd.MultiIndex.from_arrays([frame["rank"], frame["lane"]]))
    return keys["lane_id"].to_numpy()[found]
