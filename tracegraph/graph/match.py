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

from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracegraph import schema
from tracegraph.graph.ops import Ops, continued

RECORD_WINDOW_NS = 5_000  # a blocking wait ends at most this long after the record it waited on
BLOCKING_WAIT_NS = 1_000  # shorter waits were already satisfied: no dependency to draw
REMOTE_TASKS = 16  # chunks of ranks matched on an executor
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
    queued: dict[int, int] = field(default_factory=dict)
    """event-id stream wait -> what was enqueued on its stream just before it (an op or another
    wait): the wait passes only once its stream has reached it, whatever its event says."""
    warnings: list[str] = field(default_factory=list)


def match(ops: Ops, group_members: dict[str, tuple[int, ...]],
          executor: Executor | None = None) -> Matches:
    """All cross dependencies of `ops`. With `executor` (e.g. a Dask cluster's), the per-rank
    matching (launches, stream waits) runs there on chunks of ranks; pairs and groups here."""
    result = match_within_ranks(ops) if executor is None else _within_ranks_on(executor, ops)
    match_across_ranks(ops, group_members, result)
    return result


def match_across_ranks(ops: Ops, group_members: dict[str, tuple[int, ...]],
                       result: Matches) -> None:
    """Into `result`: P2P pairs and collective instances, which only ranks together show (they
    read the P2P and collective ops of `ops` alone)."""
    _match_p2p(ops, result)
    result.instances = _match_collectives(ops, group_members, result)


def _empty(n: int) -> Matches:
    return Matches(dep=np.full(n, -1, dtype=np.int64), how=np.full(n, "", dtype=object),
                   instances=pd.DataFrame(), launcher=np.full(n, -1, dtype=np.int64))


def _within_ranks_on(executor: Executor, ops: Ops) -> Matches:
    """`match_within_ranks` on chunks of ranks (ops renumbered per chunk), folded back."""
    rank = ops.frame["rank"].to_numpy()
    ranks = np.unique(rank)
    jobs = []
    for chunk in np.array_split(ranks, min(REMOTE_TASKS, len(ranks)) or 1):
        index = np.flatnonzero(np.isin(rank, chunk))
        part = Ops(frame=ops.frame.iloc[index].reset_index(drop=True), lanes=ops.lanes)
        jobs.append((index, executor.submit(match_within_ranks, part)))
    result = _empty(len(ops))
    for index, job in jobs:
        _fold(result, job.result(), index)
    return result


def match_within_ranks(ops: Ops) -> Matches:
    """The dependencies that never cross ranks: host launches of comm ops, stream waits."""
    result = _empty(len(ops))
    result.launcher = _match_launches(ops)
    _match_waits(ops, result)
    return result


def _fold(result: Matches, part: Matches, index: np.ndarray) -> None:
    """Fold `part`, whose ops are numbered by position in `index`, into `result`."""
    for name in ("dep", "launcher"):
        local = getattr(part, name)
        found = local >= 0
        getattr(result, name)[index[found]] = index[local[found]]
    result.how[index[part.dep >= 0]] = part.how[part.dep >= 0]
    result.gates |= {int(index[op]): [int(index[w]) for w in waits]
                     for op, waits in part.gates.items()}
    result.queued |= {int(index[w]): int(index[op]) for w, op in part.queued.items()}
    result.warnings += part.warnings


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
    _match_waits_by_timing(frame, blocking, result)


def _match_waits_by_event_id(frame: pd.DataFrame, waits: np.ndarray, result: Matches) -> None:
    """Producer = what was enqueued last on the recorded stream before the recording call
    (launch correlation ids grow in host call order): an op, or another stream wait, which then
    releases only when its own producer does. The wait gates the next op launched onto its
    stream."""
    enqueued = frame[(frame["correlation"] >= 0) & (frame["stream"] >= 0)].sort_values(
        "correlation")
    result.queued = _queued_before(enqueued, waits)
    rows = frame.loc[waits]
    producer = _enqueued_at(enqueued, rows["rank"], rows["wait_on_stream"],
                            rows["event_id"].to_numpy(), "left", -1)
    found = producer >= 0
    result.dep[waits[found]], result.how[waits[found]] = producer[found], "event_id"
    gate = _enqueued_at(enqueued[enqueued["kind"] != schema.WAIT], rows["rank"], rows["stream"],
                        rows["correlation"].to_numpy(), "right", 0)
    for wait, op in zip(waits[found & (gate >= 0)].tolist(), gate[found & (gate >= 0)].tolist(),
                        strict=True):
        result.gates.setdefault(op, []).append(wait)


def _enqueued_at(enqueued: pd.DataFrame, rank: pd.Series, stream: pd.Series,
                 correlation: np.ndarray, side: str, shift: int) -> np.ndarray:
    """Per query: the op of `enqueued` (sorted by correlation) on the query's (rank, stream) at
    searchsorted(correlations, correlation, side) + shift, or -1 outside the stream."""
    out = np.full(len(correlation), -1, dtype=np.int64)
    lanes = enqueued.groupby(["rank", "stream"]).indices
    corr, idx = enqueued["correlation"].to_numpy(), enqueued.index.to_numpy()
    queries = pd.DataFrame({"rank": rank.to_numpy(), "stream": stream.to_numpy()})
    for key, rows in queries.groupby(["rank", "stream"]).indices.items():
        lane = lanes.get(key)
        if lane is None:
            continue
        pos = np.searchsorted(corr[lane], correlation[rows], side=side) + shift
        ok = (pos >= 0) & (pos < len(lane))
        out[rows[ok]] = idx[lane[pos[ok]]]
    return out


def _queued_before(enqueued: pd.DataFrame, waits: np.ndarray) -> dict[int, int]:
    """wait -> the op or wait enqueued just before it on its (rank, stream)."""
    order = enqueued.sort_values(["rank", "stream", "correlation"], kind="stable")
    idx = order.index.to_numpy()
    same = ((order["rank"].to_numpy()[1:] == order["rank"].to_numpy()[:-1])
            & (order["stream"].to_numpy()[1:] == order["stream"].to_numpy()[:-1]))
    keep = same & np.isin(idx[1:], waits)
    return dict(zip(idx[1:][keep].tolist(), idx[:-1][keep].tolist(), strict=True))


def _match_waits_by_timing(frame: pd.DataFrame, waits: np.ndarray, result: Matches) -> None:
    """Each blocking wait -> the latest record on another lane of its rank that executed at
    most RECORD_WINDOW_NS before the wait ended."""
    records = frame[frame["kind"] == schema.RECORD]
    by_rank = records.groupby("rank").indices
    rec_idx, rec_start = records.index.to_numpy(), records["start"].to_numpy()
    rec_lane = records["lane_id"].to_numpy()
    rows = frame.loc[waits]
    end, lane = rows["end"].to_numpy(), rows["lane_id"].to_numpy()
    for rank, mine in rows.groupby("rank").indices.items():
        recs = by_rank.get(rank)
        if recs is None:
            continue
        recs = recs[np.argsort(rec_start[recs], kind="stable")]
        pos = _latest_other_lane(rec_start[recs], rec_lane[recs], end[mine], lane[mine])
        ok = pos >= 0
        result.dep[waits[mine[ok]]] = rec_idx[recs[pos[ok]]]
        result.how[waits[mine[ok]]] = "timing"


def _latest_other_lane(start: np.ndarray, lane: np.ndarray, end: np.ndarray,
                       wait_lane: np.ndarray) -> np.ndarray:
    """Per wait: position of the last record (by start) in [end - window, end] on a lane other
    than the wait's, -1 if none."""
    lo = np.searchsorted(start, end - RECORD_WINDOW_NS, side="left")
    pos = np.searchsorted(start, end, side="right") - 1
    clash = (pos >= lo) & (lane[np.maximum(pos, 0)] == wait_lane)
    while clash.any():
        pos = np.where(clash, pos - 1, pos)
        clash = (pos >= lo) & (lane[np.maximum(pos, 0)] == wait_lane)
    return np.where(pos >= lo, pos, -1)


# --- P2P -------------------------------------------------------------------------------------
def _match_p2p(ops: Ops, result: Matches) -> None:
    frame = ops.frame
    p2p = frame[(frame["kind"] == schema.P2P).to_numpy() & ~continued(frame)]
    if p2p.empty:
        return
    with_seq = p2p[(p2p["seq"] >= 0) & (p2p["group"] != "")]
    _link_pairs(with_seq, ["group", "seq"], result)
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
    _link_pairs(keyed, ["group", "a", "b", "directed", "nth"], result)


def _link_pairs(halves: pd.DataFrame, keys: list[str], result: Matches) -> None:
    """The two halves of each transfer (rows sharing `keys`; ties in start keep row order): the
    later poster releases the earlier one. Keys with other than two halves on two ranks: none."""
    halves = halves.assign(row=np.arange(len(halves)))
    size = halves.groupby(keys)["row"].transform("size").to_numpy()
    pairs = halves[size == 2].sort_values([*keys, "start", "row"], kind="stable")
    first, second = pairs.iloc[0::2], pairs.iloc[1::2]
    apart = first["rank"].to_numpy() != second["rank"].to_numpy()
    first, second = first.index.to_numpy()[apart], second.index.to_numpy()[apart]
    result.dep[first], result.how[first] = second, "p2p"
    result.dep[second], result.how[second] = first, "p2p"


# --- collectives -----------------------------------------------------------------------------
def _match_collectives(ops: Ops, group_members: dict[str, tuple[int, ...]],
                       result: Matches) -> pd.DataFrame:
    frame = ops.frame
    coll = frame[(frame["kind"] == schema.COLLECTIVE).to_numpy() & ~continued(frame)]
    named = coll["group"].astype(object)  # a Categorical takes no new value
    coll = coll.assign(group=named.where(named != "", "stream " + coll["stream"].astype(str)))
    keyed = []
    for group, ops_of_group in coll.groupby("group"):
        keys, safe = _instance_keys(str(group), ops_of_group, result.warnings)
        keyed.append(pd.DataFrame({"group": group, "seq": keys.astype("int64"), "safe": safe,
                                   "op": keys.index, "size": len(group_members.get(str(group),
                                                                                   ()))}))
    if not keyed:
        return pd.DataFrame(columns=["group", "seq", "comm", "ops", "ranks", "size", "safe"])
    table = pd.concat(keyed, ignore_index=True).sort_values(["group", "seq", "op"])
    table = table.assign(rank=frame.loc[table["op"], "rank"].to_numpy(),
                         comm=frame.loc[table["op"], "comm"].to_numpy(),
                         start=frame.loc[table["op"], "start"].to_numpy())
    _link_to_last(table, result)
    instances = table.groupby(["group", "seq"], sort=True).agg(
        comm=("comm", "first"), ops=("op", list), ranks=("rank", list), size=("size", "first"),
        safe=("safe", "first")).reset_index()
    return instances[["group", "seq", "comm", "ops", "ranks", "size", "safe"]]


def _link_to_last(table: pd.DataFrame, result: Matches) -> None:
    """Every member of an instance (group, seq) depends on the member that started last."""
    latest = table.sort_values(["group", "seq", "start", "op"], ascending=[True, True, False, True])
    last = latest.drop_duplicates(["group", "seq"]).set_index(["group", "seq"])["op"]
    waiting = table.assign(last=last.reindex(pd.MultiIndex.from_frame(table[["group", "seq"]]))
                           .to_numpy())
    waiting = waiting[waiting["op"] != waiting["last"]]
    result.dep[waiting["op"].to_numpy()] = waiting["last"].to_numpy()
    result.how[waiting["op"].to_numpy()] = "collective"


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
            f"({', '.join(f'rank {r}: {n}' for r, n in counts.items())} ops; "
            f"{_first_difference(comms)}); matching by order is unsafe (sampled or truncated "
            "trace?), instances not matched")
        return pd.Series(-1 - np.arange(len(ordered)), index=ordered.index), False
    apart = _instances_apart(ordered, nth)
    if apart:
        warnings.append(
            f"group {group}: {apart} order-matched instances have members that never run at the "
            "same time; matching by order is unsafe (sampled trace?), instances not matched")
        return pd.Series(-1 - np.arange(len(ordered)), index=ordered.index), False
    return nth.reindex(ops.index), True


def _first_difference(comms: pd.Series) -> str:
    """Where the first rank whose sequence of collectives (rank -> tuple of comm names) differs
    from the first rank's parts from it: "first difference at op #3: rank 0 allreduce, rank 1
    broadcast" (a rank whose sequence ended first shows "none")."""
    (first, mine), *others = comms.items()
    for rank, theirs in others:
        if theirs != mine:
            a, b = (*mine, "none"), (*theirs, "none")
            at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            return (f"first difference at op #{at + 1}: rank {first} {a[at]}, "
                    f"rank {rank} {b[at]}")
    return ""


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
