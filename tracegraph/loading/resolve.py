"""Settle across ranks what one rank's gloo profile leaves open: the process group of each
collective and P2P op, the global rank of each P2P peer, and each collective's instance number.

torch 2.13's gloo names none of them (formats/kineto.md §7): a collective runs on one of its
group's two `pt_gloo_runloop` worker threads, a send / recv states only its group-local peer, and
no op has a sequence number. The Kineto parser settles what the rank's own `pg_config` decides
and leaves the rest (group "", the local peer in src_rank / dst_rank, the issuing c10d op of
each worker op in `meta["cross_rank"]`). Here each open op's candidates (the groups its rank
belongs to) are narrowed by facts that hold in every run, never by preference for one group:

* P2P: a send on group G to local peer p reaches G's p-th member, which posts the matching recv
  on G (same tag) naming the sender's index in G; and when a profiled rank receives from this
  rank exactly as many messages as this rank sends to the one local peer that can reach it,
  all of them go to it.
* Collectives: the ops of one worker thread belong to one group. Every member of a collective
  runs it at once (no member's op ends before every member's has started), so a group whose
  profiled members have no same-comm (same-size, for all-reduce-like ops) op overlapping it is
  not the op's group; and when a thread's group is known, the only thread of another member
  that can partner one of its ops serves that group too.
* Steps repeat: a thread none of those facts settle, whose every op was issued by the same
  call of its step (annotation, comm, size, n-th such call) as ops settled on one group in the
  rank's other steps, is on that group. This is the one premise beyond physics; it settles the
  last step's DP all-reduce of a pipeline's first stage, which runs after the other stage's
  profile window has closed (corpus pp2dp2_*), so no overlap can rule its other groups out.
* Instances: gloo runs a group's collectives in the order they were issued, so where every
  profiled member shows the same issued sequence on a group and each k-th op overlaps on all of
  them, k is the instance number (`seq`).

NCCL profiles read from Nsight Systems exports name a P2P peer by its place in the communicator
(NCCL's `Peer rank`); each member states its own place (`meta["cross_rank"]["comm_ranks"]`), so
the peer is the profiled rank that states that place in that communicator.

What none of these settles (two groups with the same members, say) stays open, with a warning.
Overlaps allow SAME_HOST_SLACK_NS when every rank ran on one host (one clock), else
OTHER_HOST_SLACK_NS; if the timings contradict every candidate of some op, they are not used.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import ParsedRank
from parsers.groups import Members, global_peers, own_groups, span_text
from tracegraph import schema
from tracegraph.schema import NO_INT

SAME_HOST_SLACK_NS = 1_000_000
"""Overlap tolerance between ranks of one host (one clock: only rounding)."""
OTHER_HOST_SLACK_NS = 10_000_000
"""Overlap tolerance between hosts, whose clocks are only roughly in step."""
_SAME_SHAPE = frozenset({"allreduce", "broadcast", "reduce"})  # every member passes one shape
_OTHER = {"send": "recv", "recv": "send"}
_COLUMNS = ["comm", "kind", "lane", "lane_kind", "group", "peer", "seq", "src_rank", "dst_rank",
            "event_id", "start_ns", "dur_ns", "bytes", "step", "annotation"]
_WRITTEN = ("group", "peer", "seq")

Unit = tuple[int, str]
"""(rank, worker lane): the collectives of one gloo worker thread, which serves one group."""
P2PClass = tuple[int, str, int, int]
"""(rank, send | recv, group-local peer, tag): P2P ops that have the same candidates."""


@dataclass
class _Bundle:
    """The gloo ranks' comm rows and what their profiles state."""

    comm: pd.DataFrame  # comm rows: rank, row (in its rank's table) and _COLUMNS
    own: dict[int, Members]  # rank -> the groups its profile lists it in
    spans: dict[int, tuple[int, int]]  # rank -> first start, last end of its events
    issuer: dict[tuple[int, int], int]  # (rank, worker row) -> row of the c10d op issuing it
    present: set[int]  # every rank of the bundle
    slack: int
    where: dict[tuple[int, int], int]  # (rank, row in its table) -> index in `comm`
    warnings: list[str] = field(default_factory=list)


def settle(ranks: list[ParsedRank]) -> list[str]:
    """Fill in, in the gloo ranks' tables, the group / peer / seq their profiles leave open;
    returns warnings about what stays open."""
    gloo = [p for p in ranks if unsettled(p)]
    comm = {p.rank: comm_rows(p.events) for p in gloo}
    warnings = settle_rows(gloo, comm, {p.rank for p in ranks})
    for parsed in gloo:
        parsed.events = write_settled(parsed.events, comm[parsed.rank])
    return warnings


def unsettled(rank: ParsedRank) -> bool:
    """Whether the rank's profile left something for `settle` (a gloo rank)."""
    return bool(rank.meta.get("cross_rank"))


@dataclass
class CommRows:
    """What settling reads of a rank's table: its comm rows (`_COLUMNS` and `row`, their
    number in the table), which it fills in, and the first start and last end of its events."""

    rows: pd.DataFrame
    span: tuple[int, int]


def comm_rows(table: pa.Table) -> CommRows:
    """The `CommRows` of one rank's table (where the table lies: a cluster's worker)."""
    rows = pc.indices_nonzero(pc.not_equal(table["comm"], "")).to_numpy()
    frame = schema.plain_strings(table.take(pa.array(rows)).select(_COLUMNS)).to_pandas()
    return CommRows(frame.assign(row=rows), _span(table))


def settle_rows(gloo: list[ParsedRank], comm: dict[int, CommRows], present: set[int]
                ) -> list[str]:
    """Settle the gloo ranks (their meta and groups; `comm` their `CommRows`, whose group /
    peer / seq it fills in); returns warnings about what stays open."""
    if not gloo:
        return []
    bundle = _bundle(gloo, comm, present)
    _place_peers(bundle, gloo)
    if any(p.meta["cross_rank"].get("open") for p in gloo):
        _settle_p2p(bundle)
        _settle_collectives(bundle)
    _number_instances(bundle)
    for parsed in gloo:
        settled = bundle.comm[bundle.comm["rank"] == parsed.rank]
        comm[parsed.rank].rows = settled.drop(columns=["rank", "end_ns"]).reset_index(drop=True)
    return bundle.warnings


def write_settled(table: pa.Table, comm: CommRows) -> pa.Table:
    """`table` with the group / peer / seq `settle_rows` filled in its `comm` rows."""
    return _written(table, comm.rows)


def _bundle(gloo: list[ParsedRank], comm: dict[int, CommRows], present: set[int]) -> _Bundle:
    frames, spans, issuer = [], {}, {}
    for parsed in gloo:
        frames.append(comm[parsed.rank].rows.assign(rank=parsed.rank))
        spans[parsed.rank] = comm[parsed.rank].span
        for worker, issued in parsed.meta["cross_rank"].get("issuers", []):
            if issued >= 0:
                issuer[(parsed.rank, worker)] = issued
    rows = pd.concat(frames, ignore_index=True)
    rows["end_ns"] = rows["start_ns"] + rows["dur_ns"]
    hosts = {str(p.meta.get("host") or "") for p in gloo}
    slack = SAME_HOST_SLACK_NS if len(hosts) == 1 and "" not in hosts else OTHER_HOST_SLACK_NS
    own = {p.rank: own_groups(p.rank, (g for g in p.groups if g.source == "pg_config"))
           for p in gloo}
    where = {(int(r), int(w)): i for i, r, w in zip(rows.index, rows["rank"], rows["row"],
                                                     strict=True)}
    return _Bundle(rows, own, spans, issuer, present, slack, where)


def _span(table: pa.Table) -> tuple[int, int]:
    if not table.num_rows:
        return 0, -1
    start = table["start_ns"]
    return int(pc.min(start).as_py()), int(pc.max(pc.add(start, table["dur_ns"])).as_py())


# --- P2P -------------------------------------------------------------------------------------
def _place_peers(b: _Bundle, ranks: list[ParsedRank]) -> None:
    """The global peer of each P2P op that names its peer by its place in its communicator: the
    profiled rank stating that place there (see the module docstring)."""
    places = {(group, int(place)): p.rank for p in ranks
              for group, place in p.meta["cross_rank"].get("comm_ranks", {}).items()}
    c = b.comm
    sends = c["comm"].isin(["send", "batch_send_recv"]).to_numpy()
    local = np.where(sends, c["dst_rank"], c["src_rank"])
    open_ = ((c["kind"] == schema.P2P).to_numpy() & (c["peer"] == NO_INT).to_numpy()
             & (c["group"] != "").to_numpy() & (local >= 0) & bool(places))
    found = np.array([places.get((g, int(p)), NO_INT) for g, p in zip(
        c["group"].to_numpy()[open_], local[open_], strict=True)], dtype=c["peer"].dtype)
    c.loc[open_, "peer"] = found
    for rank, count in Counter(c["rank"].to_numpy()[open_][found == NO_INT].tolist()).items():
        b.warnings.append(f"rank {rank}: {count} P2P ops name their peer by its place in a "
                          "communicator no profiled rank states its place in: peer unknown")


def _settle_p2p(b: _Bundle) -> None:
    """Peer and group of the P2P classes that the pairing facts settle (module docstring)."""
    c = b.comm
    local = np.where(c["comm"] == "send", c["dst_rank"], c["src_rank"])
    mask = c["comm"].isin(list(_OTHER)).to_numpy() & (local >= 0)
    p2p = c[mask].assign(local=local[mask])
    classes: dict[P2PClass, set[tuple[str, int]]] = {}
    counts: dict[P2PClass, int] = {}
    members: dict[P2PClass, pd.Index] = {}
    for key, rows in p2p.groupby(["rank", "comm", "local", "event_id"], sort=True):
        k: P2PClass = (int(key[0]), str(key[1]), int(key[2]), int(key[3]))
        if not b.own.get(k[0]):
            continue  # no pg_config: the parser took the local peer as global
        classes[k] = _p2p_candidates(k, rows, b.own[k[0]])
        executed = rows["kind"] == schema.P2P
        counts[k] = int(executed.sum()) or len(rows)
        members[k] = rows.index
    _narrow_p2p(classes, counts, b)
    left: dict[tuple[int, frozenset[str], frozenset[int]], int] = defaultdict(int)
    for k, candidates in classes.items():
        if not _apply_p2p(b, candidates, members[k]):
            groups = frozenset(g for g, _ in candidates)
            left[(k[0], groups, frozenset(p for _, p in candidates))] += counts[k]
    for (rank, groups, peers), count in sorted(left.items(), key=str):
        b.warnings.append(_open_p2p(b, rank, set(groups), set(peers), count))


def _p2p_candidates(k: P2PClass, rows: pd.DataFrame, own: Members) -> set[tuple[str, int]]:
    """(group, global peer) a class may have: what the parser settled, else the rank's groups
    in which its local peer is another member."""
    group, peer = str(rows["group"].iloc[0]), int(rows["peer"].iloc[0])
    if group:
        return {(group, peer)}
    return {c for c in global_peers(k[0], k[2], own) if peer == NO_INT or c[1] == peer}


def _narrow_p2p(classes: dict[P2PClass, set[tuple[str, int]]], counts: dict[P2PClass, int],
                b: _Bundle) -> None:
    """Drop candidates the pairing facts rule out, until nothing changes."""
    by_rank: dict[int, list[P2PClass]] = defaultdict(list)
    for k in classes:
        by_rank[k[0]].append(k)
    changed = True
    while changed:
        changed = False
        for k, candidates in classes.items():
            kept = {c for c in candidates if _answered(k, c, classes, b)}
            if kept and kept != candidates:
                classes[k], changed = kept, True
        for k in classes:
            changed |= _by_count(k, classes, counts, by_rank, b.present)


def _answered(k: P2PClass, candidate: tuple[str, int],
              classes: dict[P2PClass, set[tuple[str, int]]], b: _Bundle) -> bool:
    """Whether the peer (when profiled) posts the other half on that group: the opposite op,
    same tag, naming this rank's index in the group."""
    rank, comm, _, tag = k
    group, peer = candidate
    members = b.own[rank].get(group)
    if peer not in b.present or members is None:
        return True
    other = (peer, _OTHER[comm], members.index(rank), tag)
    return (group, rank) in classes.get(other, set())


def _by_count(k: P2PClass, classes: dict[P2PClass, set[tuple[str, int]]],
              counts: dict[P2PClass, int], by_rank: dict[int, list[P2PClass]],
              present: set[int]) -> bool:
    """A class whose peer is open goes to profiled rank b when it alone can answer b's ops that
    can only come from this rank, and they are exactly as many as its own."""
    rank, comm, _, tag = k
    peers = {p for _, p in classes[k]}
    if len(peers) < 2:
        return False
    for peer in sorted(peers & present):
        supply = [s for s in by_rank[rank] if s[1] == comm and s[3] == tag
                  and any(p == peer for _, p in classes[s])]
        demand = sum(counts[d] for d in by_rank[peer] if d[1] == _OTHER[comm] and d[3] == tag
                     and {p for _, p in classes[d]} == {rank})
        if supply == [k] and demand == counts[k]:
            classes[k] = {c for c in classes[k] if c[1] == peer}
            return True
    return False


def _apply_p2p(b: _Bundle, candidates: set[tuple[str, int]], index: pd.Index) -> bool:
    """Set a class's peer and group where one candidate is left; whether the group was."""
    peers, groups = {p for _, p in candidates}, {g for g, _ in candidates}
    if len(peers) == 1:
        b.comm.loc[index, "peer"] = next(iter(peers))
    if len(groups) == 1:
        b.comm.loc[index, "group"] = next(iter(groups))
    return len(groups) == 1


def _open_p2p(b: _Bundle, rank: int, groups: set[str], peers: set[int], count: int) -> str:
    what = f"rank {rank}: {count} gloo send / recv ops"
    if not groups:
        return f"{what} name a group-local peer that none of its groups has: peer unknown"
    peer = (f"peer rank {next(iter(peers))}" if len(peers) == 1
            else f"peer one of ranks {span_text(peers)} (left unknown)")
    return (f"{what}: {peer}, group one of {', '.join(sorted(groups, key=_pg_order))}"
            f"{_same_members(b, rank, groups)}; the profiles do not say which: group left empty")


def _same_members(b: _Bundle, rank: int, groups: set[str]) -> str:
    return " (same members)" if len({b.own[rank][g] for g in groups}) == 1 else ""


# --- collectives -----------------------------------------------------------------------------
@dataclass
class _Work:
    """The worker-thread collectives of the gloo ranks as arrays, one entry per op, and each
    thread's candidate groups as a (thread x group) matrix."""

    at: np.ndarray  # index of the op in b.comm
    rank: np.ndarray
    comm: np.ndarray  # comm type codes
    size: np.ndarray  # bytes, -1 unknown
    start: np.ndarray
    end: np.ndarray
    unit: np.ndarray  # the op's thread, an index into `units`
    calls: list[tuple[str, str, int, int] | None]  # the issuing call's place in its step
    units: list[Unit]
    groups: list[str]
    candidates: np.ndarray  # bool (units, groups)
    by_rank: dict[int, np.ndarray]  # rank -> its ops
    by_unit: list[np.ndarray]  # thread -> its ops
    shaped: frozenset[int]  # codes of the all-reduce-like comms

    def of(self, u: int) -> set[str]:
        return {self.groups[g] for g in np.flatnonzero(self.candidates[u])}


def _settle_collectives(b: _Bundle) -> None:
    """Groups of the worker threads that the timing facts settle (module docstring)."""
    work = _work(b)
    if work is None:
        return
    start = work.candidates.copy()
    consistent = _narrow_collectives(work, b)
    while consistent and _by_repetition(work):
        consistent = _narrow_collectives(work, b)
    if not consistent:
        b.warnings.append("gloo collectives: the ranks' timings rule out every group of some "
                          "op (clocks apart?); their groups are left as each profile states")
        work.candidates = start
    left: dict[tuple[int, frozenset[str]], list[int]] = defaultdict(list)
    for u in range(len(work.units)):
        if not _apply_unit(b, work, u):
            left[(work.units[u][0], frozenset(work.of(u)))].append(u)
    for (rank, groups), units in sorted(left.items(), key=str):
        ops = sum(len(work.by_unit[u]) for u in units)
        b.warnings.append(
            f"rank {rank}: the group of {ops} gloo collectives on {len(units)} worker thread(s) "
            f"is one of {', '.join(sorted(groups, key=_pg_order))}"
            f"{_same_members(b, rank, set(groups))}; the profiles do not say which: group left "
            "empty")


def _work(b: _Bundle) -> _Work | None:
    c = b.comm
    ops = c[(c["lane_kind"] == schema.COMM) & (c["kind"] == schema.COLLECTIVE)
            & c["rank"].map(lambda r: bool(b.own.get(r))).astype(bool)]
    if ops.empty or (ops["group"] != "").all():
        return None
    keys = list(zip(ops["rank"].tolist(), ops["lane"].tolist(), strict=True))
    units = sorted(set(keys))
    number = {k: i for i, k in enumerate(units)}
    unit = np.array([number[k] for k in keys])
    groups = sorted({g for own in b.own.values() for g in own} | set(ops["group"]) - {""},
                    key=_pg_order)
    candidates = np.zeros((len(units), len(groups)), dtype=bool)
    for u, (rank, _) in enumerate(units):
        fixed = set(ops["group"].to_numpy()[unit == u]) - {""}
        for g in fixed or b.own[rank]:
            candidates[u, groups.index(g)] = True
    comm_codes, comm_names = pd.factorize(ops["comm"])
    rank = ops["rank"].to_numpy()
    return _Work(
        at=ops.index.to_numpy(), rank=rank, comm=comm_codes, size=ops["bytes"].to_numpy(),
        start=ops["start_ns"].to_numpy(), end=ops["end_ns"].to_numpy(), unit=unit,
        calls=_calls(b, ops), units=units, groups=groups, candidates=candidates,
        by_rank={int(r): np.flatnonzero(rank == r) for r in np.unique(rank)},
        by_unit=[np.flatnonzero(unit == u) for u in range(len(units))],
        shaped=frozenset(i for i, n in enumerate(comm_names) if n in _SAME_SHAPE))


def _calls(b: _Bundle, ops: pd.DataFrame) -> list[tuple[str, str, int, int] | None]:
    """Per worker op, where its issuing c10d op stands in its rank's step: (annotation, comm,
    bytes, n-th such call of the step); None when it was issued outside the window or step."""
    issued = [_issuing(b, int(r), int(w)) for r, w in zip(ops["rank"], ops["row"], strict=True)]
    frame = ops[["rank", "step", "annotation", "comm", "bytes"]].assign(
        issued=[b.comm.at[i, "start_ns"] if i is not None else -1 for i in issued])
    known = (frame["issued"] >= 0) & (frame["step"] >= 0)
    nth = frame[known].sort_values("issued", kind="stable").groupby(
        ["rank", "step", "annotation", "comm", "bytes"]).cumcount()
    return [(str(a), str(c), int(n), int(nth[i])) if i in nth.index else None
            for i, a, c, n in zip(frame.index, frame["annotation"], frame["comm"],
                                  frame["bytes"], strict=True)]


def _by_repetition(work: _Work) -> bool:
    """An open thread whose every op is issued by the same call of its step (annotation, comm,
    size, n-th) as ops settled on one group in the rank's other steps is on that group: steps
    repeat the same code. Returns whether any thread was settled."""
    settled_units = work.candidates.sum(axis=1) == 1
    settled: dict[tuple[int, object], set[int]] = defaultdict(set)
    for i, call in enumerate(work.calls):
        if call is not None and settled_units[work.unit[i]]:
            settled[(int(work.rank[i]), call)].add(int(np.argmax(work.candidates[work.unit[i]])))
    changed = False
    for u, ops in enumerate(work.by_unit):
        if settled_units[u] or any(work.calls[i] is None for i in ops):
            continue
        found = set().union(*(settled.get((int(work.rank[i]), work.calls[i]), {-1})
                              for i in ops))
        if len(found) == 1 and (g := found.pop()) >= 0 and work.candidates[u, g]:
            work.candidates[u] = False
            work.candidates[u, g], changed = True, True
    return changed


def _narrow_collectives(work: _Work, b: _Bundle) -> bool:
    """Drop unsupported groups and settle the partners of settled threads until nothing
    changes; False when some op is left with no group (the timings contradict the profiles)."""
    changed = True
    while changed:
        changed = False
        for u in range(len(work.units)):
            if work.candidates[u].sum() < 2:
                continue
            for g in np.flatnonzero(work.candidates[u]):
                if not _supported(work, u, int(g), b):
                    work.candidates[u, g], changed = False, True
            if not work.candidates[u].any():
                return False
        for u in range(len(work.units)):
            if work.candidates[u].sum() == 1:
                forced = _force_partners(work, u, int(np.argmax(work.candidates[u])), b)
                if forced is None:
                    return False
                changed |= forced
    return True


def _members_seen(work: _Work, u: int, g: int, op: int, b: _Bundle) -> list[int]:
    """The other members of group `g` whose profile holds gloo collectives and covers `op`."""
    rank = work.units[u][0]
    start, end = work.start[op], work.end[op]
    return [m for m in b.own[rank].get(work.groups[g], ()) if m != rank and m in work.by_rank
            and b.spans[m][0] <= start and end <= b.spans[m][1]]


def _supported(work: _Work, u: int, g: int, b: _Bundle) -> bool:
    """Whether every op of thread `u` has, on each profiled member of group `g` whose window
    covers it, a partner on a thread that may serve `g`, all running at one moment."""
    for op in work.by_unit[u]:
        window = [(int(work.start[op]), int(work.end[op]))]
        for member in _members_seen(work, u, g, op, b):
            window = _intersect(window, work, _partners(work, member, g, op, b.slack), b.slack)
            if not window:
                return False
    return True


def _force_partners(work: _Work, u: int, g: int, b: _Bundle) -> bool | None:
    """Settle on group `g` the one thread of each profiled member that can partner an op of the
    settled thread `u`; None when some op has no possible partner at all."""
    changed = False
    for op in work.by_unit[u]:
        for member in _members_seen(work, u, g, op, b):
            units = set(work.unit[_partners(work, member, g, op, b.slack)].tolist())
            if not units:
                return None
            if len(units) == 1 and work.candidates[v := units.pop()].sum() > 1:
                work.candidates[v] = False
                work.candidates[v, g], changed = True, True
    return changed


def _partners(work: _Work, member: int, g: int, op: int, slack: int) -> np.ndarray:
    """The ops of `member` that may partner `op` on group `g`: same comm (and size, for
    all-reduce-like comms), on a thread that may serve `g`, overlapping it."""
    ops = work.by_rank[member]
    ok = ((work.comm[ops] == work.comm[op]) & (work.start[ops] <= work.end[op] + slack)
          & (work.end[ops] >= work.start[op] - slack) & work.candidates[work.unit[ops], g])
    if work.comm[op] in work.shaped and work.size[op] >= 0:
        ok &= (work.size[ops] == work.size[op]) | (work.size[ops] < 0)
    return ops[ok]


def _intersect(window: list[tuple[int, int]], work: _Work, partners: np.ndarray, slack: int
               ) -> list[tuple[int, int]]:
    """The moments of `window` at which one of `partners` (widened by `slack`) runs."""
    out = []
    for lo, hi in window:
        for start, end in zip(work.start[partners].tolist(), work.end[partners].tolist(),
                              strict=True):
            a, z = max(lo, start - slack), min(hi, end + slack)
            if a <= z:
                out.append((a, z))
    return out


def _apply_unit(b: _Bundle, work: _Work, u: int) -> bool:
    """Set a settled thread's group on its ops and their c10d ops; whether it is settled."""
    at = work.at[work.by_unit[u]]
    candidates = work.of(u)
    if len(candidates) != 1:
        return False
    rank = work.units[u][0]
    issued = [_issuing(b, rank, int(row)) for row in b.comm.loc[at, "row"]]
    b.comm.loc[[*at, *(i for i in issued if i is not None)], "group"] = candidates.pop()
    return True


def _pg_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


# --- instance numbers ------------------------------------------------------------------------
def _number_instances(b: _Bundle) -> None:
    """`seq` of the worker collectives of each group whose profiled members agree on its
    issued sequence (module docstring); groups an open op may be on are skipped."""
    c = b.comm
    ops = c[(c["lane_kind"] == schema.COMM) & (c["kind"] == schema.COLLECTIVE)]
    open_ranks = set(ops.loc[ops["group"] == "", "rank"].tolist())
    unsure = {g for r in open_ranks for g in b.own.get(int(r), {})}
    for group, rows in ops[ops["group"] != ""].groupby("group"):
        users = {r for r, groups in b.own.items() if group in groups}
        if group in unsure or not users <= set(rows["rank"].tolist()):
            continue
        order = _issue_order(b, rows)
        if order is not None and _agree(order, b.slack):
            for part in order.values():
                c.loc[part.index, "seq"] = np.arange(len(part))


def _issue_order(b: _Bundle, rows: pd.DataFrame) -> dict[int, pd.DataFrame] | None:
    """Per rank, the group's ops in the order their c10d ops were issued; None when one was
    issued before its rank's window (its place in the sequence is unknown)."""
    calls = [_issuing(b, int(r), int(w)) for r, w in zip(rows["rank"], rows["row"], strict=True)]
    if any(at is None for at in calls):
        return None
    issued = b.comm.loc[calls, "start_ns"].to_numpy()
    ordered = rows.assign(issued=issued).sort_values(["rank", "issued"], kind="stable")
    return {int(r): part for r, part in ordered.groupby("rank")}


def _issuing(b: _Bundle, rank: int, row: int) -> int | None:
    """Index in b.comm of the c10d op that issued worker row `row` of `rank`, if in the window."""
    issued = b.issuer.get((rank, row))
    return None if issued is None else b.where.get((rank, issued))


def _agree(order: dict[int, pd.DataFrame], slack: int) -> bool:
    """Same length and comm (and size, for all-reduce-like ops) sequence on every member, and
    every k-th op overlapping on all of them."""
    parts = list(order.values())
    if len({len(p) for p in parts}) != 1:
        return False
    comms = np.stack([p["comm"].to_numpy() for p in parts])
    sizes = np.stack([p["bytes"].to_numpy() for p in parts])
    shaped = np.isin(comms[0], list(_SAME_SHAPE))
    if (comms != comms[0]).any() or (shaped & (sizes != sizes[0]).any(axis=0)).any():
        return False
    starts = np.stack([p["start_ns"].to_numpy() for p in parts])
    ends = np.stack([p["end_ns"].to_numpy() for p in parts])
    return bool((starts.max(axis=0) <= ends.min(axis=0) + slack).all())


# --- write back ------------------------------------------------------------------------------
def _written(table: pa.Table, rows: pd.DataFrame) -> pa.Table:
    """`table` with the group / peer / seq values of `rows` (its comm rows) where they changed."""
    for column in _WRITTEN:
        old = table.column(column).combine_chunks()
        coded = pa.types.is_dictionary(old.type)  # strings: decoded to write, coded again
        plain = old.dictionary_decode() if coded else old
        values = rows[column].to_numpy()
        before = plain.take(pa.array(rows["row"].to_numpy())).to_numpy(zero_copy_only=False)
        changed = values != before
        if not changed.any():
            continue
        mask = np.zeros(table.num_rows, dtype=bool)
        mask[rows["row"].to_numpy()[changed]] = True
        new = pc.replace_with_mask(plain, pa.array(mask), pa.array(values[changed], plain.type))
        new = new.dictionary_encode() if coded else new
        table = table.set_column(table.schema.get_field_index(column), column, new)
    return table
