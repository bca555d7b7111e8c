"""Cross-stream and cross-rank matching: which op released which.

Produces, for every op, at most one *cross dependency* (`dep`): the op on another stream or rank
whose progress it waited for, with how it was matched (`how`) and how sure the match is.
- wait -> producer: by the source's event id (Kineto `wait_on_cuda_event_record_corr_id`), else by
  the Ascend timing rule (a blocking EVENT_WAIT ends < 5 µs after a record on another stream).
- P2P: the two halves of a transfer, by (group, instance index) or per ordered pair in FIFO order.
- collectives: instances across the group by (group, instance index), else by order within the
  group when every member shows the same count (otherwise order matching is unsafe: say so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.ops import Ops

RECORD_WINDOW_NS = 5_000  # a blocking wait ends at most this long after the record it waited on
BLOCKING_WAIT_NS = 1_000  # shorter waits were already satisfied: no dependency to draw
ORDER_OVERLAP_SLACK_NS = 100_000  # members of an order-matched instance must overlap so nearly


@dataclass
class Matches:
    """Per-op cross dependencies plus the collective instances they came from."""

    dep: np.ndarray  # op index of the releasing op, -1 if none
    how: np.ndarray  # "event_id", "timing", "p2p", "collective", "" per op
    instances: pd.DataFrame  # group, seq, comm, ops (list), ranks (list), size, safe
    launcher: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gates: dict[int, list[int]] = field(default_factory=dict)
    """op -> the stream waits enqueued right before it on its stream (Kineto: a wait sits at its
    host call time, not where the stream stalls); the op could not start before all of them."""
    warnings: list[str] = field(default_factory=list)


def match(ops: Ops, group_members: dict[str, tuple[int, ...]]) -> Matches:
    """All cross dependencies of `ops`."""
    n = len(ops)
    result = Matches(dep=np.full(n, -1, dtype=np.int64), how=np.full(n, "", dtype=object),
                     instances=pd.DataFrame())
    result.launcher = _match_launches(ops)
    _match_waits(ops, result)
    _match_p2p(ops, result)
    result.instances = _match_collectives(ops, group_members, result)
    return result


# --- launches --------------------------------------------------------------------------------
def _match_launches(ops: Ops) -> np.ndarray:
    """For comm ops that a host thread hands to a worker thread (gloo), the host op that did."""
    frame = ops.frame
    launcher = np.full(len(frame), -1, dtype=np.int64)
    mode = ops.lanes["mode"].to_numpy()[frame["lane_id"].to_numpy()]
    worker = (mode == schema.COMM) & frame["kind"].isin([schema.COLLECTIVE, schema.P2P]).to_numpy()
    callers = frame[(mode == schema.THREAD) & (frame["comm"] != "").to_numpy()
                    & (frame["kind"] == schema.HOST).to_numpy()]
    for (rank, comm), calls in callers.groupby(["rank", "comm"]):
        calls = calls.sort_values("start")
        targets = frame.index[worker & (frame["rank"] == rank).to_numpy()
                              & (frame["comm"] == comm).to_numpy()]
        pos = np.searchsorted(calls["start"].to_numpy(), frame.loc[targets, "start"], "right") - 1
        launcher[targets[pos >= 0]] = calls.index.to_numpy()[pos[pos >= 0]]
    return launcher


# --- waits -----------------------------------------------------------------------------------
def _match_waits(ops: Ops, result: Matches) -> None:
    frame = ops.frame
    waits = frame.index[(frame["kind"] == schema.WAIT)].to_numpy()
    if not len(waits):
        return
    by_id = waits[(frame.loc[waits, "event_id"] >= 0).to_numpy()
                  & (frame.loc[waits, "wait_on_stream"] >= 0).to_numpy()]
    _match_waits_by_event_id(frame, by_id, result)
    blocking = np.setdiff1d(waits, by_id)
    blocking = blocking[(frame.loc[blocking, "end"] - frame.loc[blocking, "start"]
                         > BLOCKING_WAIT_NS).to_numpy()]
    for rank, wait_idx in pd.Series(blocking).groupby(frame.loc[blocking, "rank"].to_numpy()):
        _match_waits_by_timing(frame, int(rank), wait_idx.to_numpy(), result)


def _match_waits_by_event_id(frame: pd.DataFrame, waits: np.ndarray, result: Matches) -> None:
    """Producer = what was enqueued last on the recorded stream before the recording call
    (launch correlation ids grow in host call order): an op, or another stream wait, which then
    releases only when its own producer does. The wait gates the next op launched onto its
    stream."""
    enqueued = frame[(frame["correlation"] >= 0) & (frame["stream"] >= 0)].sort_values(
        "correlation")
    by_stream = {key: (g["correlation"].to_numpy(), g.index.to_numpy())
                 for key, g in enqueued.groupby(["rank", "stream"])}
    ops = enqueued[enqueued["kind"] != schema.WAIT]
    ops_by_stream = {key: (g["correlation"].to_numpy(), g.index.to_numpy())
                     for key, g in ops.groupby(["rank", "stream"])}
    for wait in waits:
        rank = frame.at[wait, "rank"]
        key = (rank, frame.at[wait, "wait_on_stream"])
        if key in by_stream:
            correlations, idx = by_stream[key]
            pos = np.searchsorted(correlations, frame.at[wait, "event_id"], side="left") - 1
            if pos >= 0:
                result.dep[wait], result.how[wait] = idx[pos], "event_id"
        gated = ops_by_stream.get((rank, frame.at[wait, "stream"]))
        if gated is not None and result.dep[wait] >= 0:
            pos = np.searchsorted(gated[0], frame.at[wait, "correlation"], side="right")
            if pos < len(gated[1]):
                result.gates.setdefault(int(gated[1][pos]), []).append(int(wait))


def _match_waits_by_timing(frame: pd.DataFrame, rank: int, waits: np.ndarray,
                           result: Matches) -> None:
    records = frame[(frame["rank"] == rank) & (frame["kind"] == schema.RECORD)]
    rec_start = records["start"].to_numpy()
    order = np.argsort(rec_start, kind="stable")
    rec_start, rec_idx = rec_start[order], records.index.to_numpy()[order]
    rec_lane = frame.loc[rec_idx, "lane_id"].to_numpy()
    for wait in waits:
        end, lane = frame.at[wait, "end"], frame.at[wait, "lane_id"]
        hi = np.searchsorted(rec_start, end, side="right")
        lo = np.searchsorted(rec_start, end - RECORD_WINDOW_NS, side="left")
        candidates = [i for i in range(hi - 1, lo - 1, -1) if rec_lane[i] != lane]
        if candidates:
            result.dep[wait], result.how[wait] = rec_idx[candidates[0]], "timing"


# --- P2P -------------------------------------------------------------------------------------
def _match_p2p(ops: Ops, result: Matches) -> None:
    frame = ops.frame
    p2p = frame[(frame["kind"] == schema.P2P)]
    if p2p.empty:
        return
    with_seq = p2p[(p2p["seq"] >= 0) & (p2p["group"] != "")]
    for _, pair in with_seq.groupby(["group", "seq"]):
        _link_pair(pair.index.to_numpy(), frame, result)
    rest = p2p.drop(with_seq.index)
    rest = rest[rest["peer"] >= 0]
    if rest.empty:
        return
    low = np.minimum(rest["rank"], rest["peer"])
    high = np.maximum(rest["rank"], rest["peer"])
    src = np.where(rest["comm"] == "recv", rest["peer"], rest["rank"])
    directed = rest["comm"].isin(["send", "recv"]).to_numpy()
    keyed = rest.assign(a=np.where(directed, src, low),
                        b=np.where(directed, np.where(src == rest["rank"], rest["peer"],
                                                      rest["rank"]), high),
                        directed=directed)
    keyed = keyed.sort_values("start", kind="stable")
    keyed["nth"] = keyed.groupby(["group", "a", "b", "directed", "rank"]).cumcount()
    for _, pair in keyed.groupby(["group", "a", "b", "directed", "nth"]):
        _link_pair(pair.index.to_numpy(), frame, result)


def _link_pair(idx: np.ndarray, frame: pd.DataFrame, result: Matches) -> None:
    """The two halves of one transfer: the later poster releases the earlier one."""
    if len(idx) != 2 or frame.at[idx[0], "rank"] == frame.at[idx[1], "rank"]:
        return
    first, second = sorted(idx, key=lambda i: frame.at[i, "start"])
    result.dep[first], result.how[first] = second, "p2p"
    result.dep[second], result.how[second] = first, "p2p"


# --- collectives -----------------------------------------------------------------------------
def _match_collectives(ops: Ops, group_members: dict[str, tuple[int, ...]],
                       result: Matches) -> pd.DataFrame:
    frame = ops.frame
    coll = frame[frame["kind"] == schema.COLLECTIVE]
    coll = coll.assign(group=coll["group"].where(coll["group"] != "", "stream " +
                                                  coll["stream"].astype(str)))
    rows = []
    for group, ops_of_group in coll.groupby("group"):
        keyed, safe = _instance_keys(str(group), ops_of_group, result.warnings)
        for key, members in keyed.groupby(keyed):
            idx = members.index.to_numpy()
            rows.append({"group": group, "seq": int(key), "comm": frame.at[idx[0], "comm"],
                         "ops": idx.tolist(), "ranks": frame.loc[idx, "rank"].tolist(),
                         "size": len(group_members.get(str(group), ())), "safe": safe})
    instances = pd.DataFrame(rows, columns=["group", "seq", "comm", "ops", "ranks", "size",
                                            "safe"])
    for idx in instances["ops"]:
        if len(idx) > 1:
            last = max(idx, key=lambda i: frame.at[i, "start"])
            for i in idx:
                if i != last:
                    result.dep[i], result.how[i] = last, "collective"
    return instances


def _instance_keys(group: str, ops: pd.DataFrame, warnings: list[str]) -> tuple[pd.Series, bool]:
    """Instance number of each op of one group: its recorded index, else its order on its rank."""
    if (ops["seq"] >= 0).all():
        return ops["seq"], True
    ordered = ops.sort_values("start", kind="stable")
    nth = ordered.groupby("rank").cumcount()
    counts = ordered.groupby("rank").size()
    comms = ordered.groupby("rank")["comm"].apply(tuple)
    if counts.nunique() > 1 or comms.nunique() > 1:
        warnings.append(
            f"group {group}: members show different collective sequences "
            f"({', '.join(f'rank {r}: {n}' for r, n in counts.items())} ops); "
            "matching by order is unsafe (sampled or truncated trace?), instances not matched")
        return pd.Series(-1 - np.arange(len(ordered)), index=ordered.index), False
    apart = _instances_apart(ordered, nth)
    if apart:
        warnings.append(
            f"group {group}: {apart} order-matched instances have members that never run at the "
            "same time; matching by order is unsafe (sampled trace?), instances not matched")
        return pd.Series(-1 - np.arange(len(ordered)), index=ordered.index), False
    return nth.reindex(ops.index), True


def _instances_apart(ordered: pd.DataFrame, nth: pd.Series) -> int:
    """How many order-matched instances have members whose executions do not overlap, once
    each rank is shifted by its median end difference (its clock offset). Members of one real
    instance all run until the last one finishes, so they always overlap."""
    table = ordered.assign(nth=nth)
    starts = table.pivot_table(index="nth", columns="rank", values="start", aggfunc="first")
    ends = table.pivot_table(index="nth", columns="rank", values="end", aggfunc="first")
    if ends.shape[1] < 2:
        return 0
    shift = ends.sub(ends.iloc[:, 0], axis=0).median()
    starts, ends = starts - shift, ends - shift
    return int((starts.max(axis=1) > ends.min(axis=1) + ORDER_OVERLAP_SLACK_NS).sum())
