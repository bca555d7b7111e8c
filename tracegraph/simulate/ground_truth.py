"""Ground truth of a simulated run: the injected causes, every bubble on a compute stream
decomposed along its causal chain with the model's exact knowledge, and per-kind op counts.

Decomposition (shared with the analyzer's blame pass). An interval [a, b] that ends because op D
completed is split into D's executing part [D.ready, b] (charged to D's category), D's waiting
part [D.start, D.ready] (explained by what D waited for: the record of a wait, the peer's posting
of a P2P, the last member of a collective, or an unprofiled member, which ends the chain), and
[a, D.start] (explained by why D started then: its stream or hardware-queue predecessor, or the
host launch). Records and non-blocking waits are transparent.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from tracegraph.causes import (
    COMPUTE_STRAGGLER,
    DP_REDUCTION,
    EP_ALLTOALL,
    HOST_LAUNCH,
    PIPELINE_FILL,
    for_collective,
    root_of,
)
from tracegraph.schema import COLLECTIVE, COMPUTE, MEMCPY, P2P, RECORD, WAIT

if TYPE_CHECKING:
    from tracegraph.simulate.model import Job, Op
    from tracegraph.simulate.timeline import Timeline

MS = 1_000_000
COUNTED_KINDS = (COMPUTE, WAIT, RECORD, COLLECTIVE, P2P, MEMCPY)


class Piece(NamedTuple):
    """A charged part of a bubble: [start, end) ns, category, and its root (how, op)."""

    start: int
    end: int
    category: str
    how: str  # "op" | "host" | "unprofiled"
    op: Op


def build(job: Job, timeline: Timeline) -> dict[str, object]:
    """The ground_truth dict of a run (see the module docstring for the bubble semantics)."""
    sc = job.sc
    explainer = Explainer({g: info.desc for g, info in job.groups.items()})
    names = KernelNames(timeline.ops)
    bubbles = []
    lanes = [lane for (_, stream), lane in sorted(job.eng.streams.items())
             if stream == sc.compute_stream]
    for lane in lanes:
        for item in find_bubbles(lane, int(sc.threshold_ms * MS)):
            pieces, chain = explainer.run(item)
            bubbles.append(_bubble(item, pieces, chain, job.origin_ns, names))
    return {
        "scenario": sc.name,
        "params": timeline.params,
        "origin_ns": job.origin_ns,
        "threshold_ms": sc.threshold_ms,
        "causes": causes(job),
        "bubbles": bubbles,
        "op_counts": op_counts(timeline.ops),
        "overlap": overlap(timeline, {g: info.desc for g, info in job.groups.items()}),
        "serialized": [{"rank": r, "streams": list(s)} for r, s in sorted(job.eng.serial.items())],
        "memory": memory(job, timeline),
    }


def overlap(timeline: Timeline, dims: dict[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """rank -> group kind -> comm_ms and exposed_ms (summed over the steps): the time the rank's
    communication of that kind was in flight within its steps, and the part of it during which
    its compute stream was not computing."""
    ops, out = timeline.ops, {}
    comm = ops[ops["kind"].isin((COLLECTIVE, P2P))]
    work = ops[(ops["kind"] == COMPUTE) & (ops["stream"] == timeline.compute_stream)]
    for span in timeline.steps:
        busy = _intervals(work[work["rank"] == span.rank], span)
        mine = comm[comm["rank"] == span.rank]
        for dim, part in mine.groupby(mine["group"].map(dims).fillna("")):
            flight = _intervals(part, span)
            total = sum(b - a for a, b in flight)
            hidden = _covered(flight, busy)
            entry = out.setdefault(str(span.rank), {}).setdefault(
                str(dim), {"comm_ms": 0.0, "exposed_ms": 0.0})
            entry["comm_ms"] += total / MS
            entry["exposed_ms"] += (total - hidden) / MS
    return out


def _covered(flight: list[tuple[int, int]], busy: list[tuple[int, int]]) -> int:
    """Length of the intersection of two sorted lists of disjoint intervals, in one sweep
    (all pairs took seconds on a large scenario's kernels)."""
    total, first = 0, 0
    for a, b in flight:
        while first < len(busy) and busy[first][1] <= a:
            first += 1
        k = first
        while k < len(busy) and busy[k][0] < b:
            total += min(b, busy[k][1]) - max(a, busy[k][0])
            k += 1
    return total


def _intervals(ops: pd.DataFrame, span) -> list[tuple[int, int]]:
    """The ops' [start, end) clipped to the step span and merged, sorted."""
    start = np.clip(ops["start_ns"].to_numpy(np.int64), span.start_ns, span.end_ns)
    end = np.clip((ops["start_ns"] + ops["dur_ns"]).to_numpy(np.int64), span.start_ns,
                  span.end_ns)
    keep = end > start
    if not keep.any():
        return []
    order = np.argsort(start[keep], kind="stable")
    start, end = start[keep][order], np.maximum.accumulate(end[keep][order])
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > end[:-1]  # a gap before it: a new merged interval
    last = np.append(np.flatnonzero(new)[1:] - 1, len(start) - 1)
    return list(zip(start[new].tolist(), end[last].tolist(), strict=True))


def memory(job: Job, timeline: Timeline) -> dict[str, dict[str, object]]:
    """rank -> its stage, peak and baseline allocated bytes, the activations at the peak and the
    microbatches in flight then; {} without a memory profile."""
    if timeline.memory is None:
        return {}
    out = {}
    stage = {p.rank: p.stage for p in job.places}
    for rank, rows in timeline.memory.groupby("rank"):
        allocated = rows["allocated"].to_numpy()
        in_flight = np.cumsum(np.sign(rows["bytes"].to_numpy())[1:])
        out[str(int(rank))] = {"stage": stage[int(rank)], "peak_bytes": int(allocated.max()),
                               "baseline_bytes": int(allocated[0]),
                               "activation_bytes": int(allocated.max() - allocated[0]),
                               "peak_in_flight": int(in_flight.max()) if len(in_flight) else 0,
                               "capacity_bytes": int(job.sc.device_gib * 2**30)}
    return out


def find_bubbles(lane: list[Op], threshold: int) -> list[tuple[str, Op, int, int]]:
    """Work items (mode, op, a, b) for every bubble on one compute stream longer than threshold:
    blocking waits, idle gaps before an op, waiting parts of in-line P2P / collectives."""
    out = []
    for prev, op in zip([None, *lane[:-1]], lane, strict=True):
        if prev is not None and op.start - prev.end > threshold:
            out.append(("start", op, prev.end, op.start))
        if op.kind == WAIT and op.ready_dep is not None and op.end - op.start > threshold:
            out.append(("op", op, op.start, op.end))
        elif op.kind in (P2P, COLLECTIVE) and op.ready - op.start > threshold:
            out.append(("op", op, op.start, op.ready))
    return out


class Explainer:
    """Walks a bubble backward along binding dependencies, charging every part of it."""

    def __init__(self, group_dims: dict[str, str]):
        self.group_dims = group_dims  # group -> its parallel dimension (the simulator's desc)

    def run(self, item: tuple[str, Op, int, int]) -> tuple[list[Piece], list[int]]:
        """Pieces tiling the item's interval, and the ranks met in causal (depth-first) order."""
        pieces: list[Piece] = []
        chain: list[int] = []
        stack = [item]
        while stack:
            mode, op, a, b = stack.pop()
            if b <= a:
                continue
            if op.rank not in chain:
                chain.append(op.rank)
            if mode == "op":
                self._finish(op, a, b, pieces, stack)
            else:
                self._start(op, a, b, pieces, stack)
        return _merge(pieces), chain

    def category(self, op: Op) -> str:
        """What executing `op` is charged to."""
        if op.kind in (P2P, COLLECTIVE):
            return for_collective(self.group_dims.get(op.group, ""), op.comm)
        return COMPUTE_STRAGGLER if op.slow else PIPELINE_FILL

    def _finish(self, op: Op, a: int, b: int, pieces: list, stack: list) -> None:
        """[a, b] ends when `op` completes: executing part, waiting part, then before its start."""
        if op.kind == RECORD or (op.kind == WAIT and op.ready_dep is None):
            stack.append(("start", op, a, b))
            return
        stack.append(("start", op, a, min(b, op.start)))
        if op.kind == WAIT:  # its wake-up latency goes with what the record followed
            stack.append(("op", op.ready_dep, max(a, op.start), b))
            return
        if max(a, op.ready) < b:
            pieces.append(Piece(max(a, op.ready), b, self.category(op), "op", op))
        lo, hi = max(a, op.start), min(b, op.ready)
        if lo >= hi:
            return
        if op.ready_dep is not None:
            stack.append(("start", op.ready_dep, lo, hi))
        else:
            pieces.append(Piece(lo, hi, self.category(op), "unprofiled", op))

    def _start(self, op: Op, a: int, b: int, pieces: list, stack: list) -> None:
        """[a, b] passes before `op` starts: its device predecessor, or the host launching it."""
        if op.start_dep is not None:
            stack.append(("op", op.start_dep, a, b))
            return
        lane = max((d for d in (op.prev, op.queue_pred) if d is not None),
                   key=lambda d: d.end, default=None)
        free = max(a, lane.end) if lane is not None else a
        idle = max(free, op.launch_dep.end) if op.launch_dep is not None else free
        if idle < b:
            pieces.append(Piece(idle, b, HOST_LAUNCH, "host", op))
        if lane is not None:
            stack.append(("op", lane, a, min(b, free)))
        if op.launch_dep is not None:
            stack.append(("op", op.launch_dep, free, min(b, idle)))


def _merge(pieces: list[Piece]) -> list[Piece]:
    """Sorted pieces with touching neighbours of the same category and root joined."""
    out: list[Piece] = []
    for p in sorted(pieces, key=lambda x: x.start):
        last = out[-1] if out else None
        if last and last.end == p.start and (last.category, last.how, last.op) == (
                p.category, p.how, p.op):
            out[-1] = last._replace(end=p.end)
        else:
            out.append(p)
    return out


class KernelNames:
    """The op running at a time on a lane of the (kernel-expanded) ops table."""

    def __init__(self, ops: pd.DataFrame):
        self.key = (ops["rank"].to_numpy(np.int64) << 20) | ops["stream"].to_numpy(np.int64)
        self.start = ops["start_ns"].to_numpy(np.int64)
        self.names = ops["name"]

    def at(self, rank: int, stream: int, t: int) -> str:
        key = (rank << 20) | stream
        lo, hi = np.searchsorted(self.key, key), np.searchsorted(self.key, key, side="right")
        i = lo + max(int(np.searchsorted(self.start[lo:hi], t, side="left")) - 1, 0)
        return str(self.names.iat[i])


def _root(piece: Piece, names: KernelNames) -> dict[str, object]:
    op = piece.op
    if piece.how == "host":
        return {"rank": op.rank, "lane": "host", "name": op.name}
    lane = f"stream {op.stream}"
    if piece.how == "unprofiled":
        return {"rank": op.rank, "lane": lane,
                "name": f"straggler among the unprofiled members of group {op.group}",
                "op": op.name, "group": op.group, "member": op.straggler}
    name = names.at(op.rank, op.stream, min(piece.end, op.end)) if op.kind == COMPUTE else op.name
    return {"rank": op.rank, "lane": lane, "name": name}


def _bubble(item: tuple, pieces: list[Piece], chain: list[int], origin: int,
            names: KernelNames) -> dict[str, object]:
    _, op, a, b = item
    ms = lambda t: round((t - origin) / MS, 6)  # noqa: E731
    by_origin: dict[tuple, list[Piece]] = defaultdict(list)
    for p in pieces:  # a collective's waiting and transfer are its group's: one origin
        by_origin[p.category, p.op.rank, p.op.group if p.op.kind == COLLECTIVE else ""].append(p)
    origins = sorted(by_origin.values(), key=lambda ps: -sum(p.end - p.start for p in ps))
    top = origins[root_of([(sum(p.end - p.start for p in ps), min(p.start for p in ps))
                           for ps in origins], b - a)]
    root_piece = max(top, key=lambda p: p.end - p.start)
    return {
        "rank": op.rank, "lane": f"stream {op.stream}", "step": op.step,
        "start_ms": ms(a), "end_ms": ms(b), "dur_ms": round((b - a) / MS, 6),
        "category": root_piece.category, "root": _root(root_piece, names), "chain": chain,
        "intervals": [{"start_ms": ms(p.start), "end_ms": ms(p.end), "category": p.category,
                       **_root(p, names)} for p in pieces],
    }


def op_counts(ops: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Device ops per rank and kind, as a loader counts them from the written files."""
    sizes = ops.groupby(["rank", "kind"], observed=True).size()
    out: dict[str, dict[str, int]] = {}
    for rank in sorted(ops["rank"].unique()):
        out[str(int(rank))] = {k: int(sizes.get((rank, k), 0)) for k in COUNTED_KINDS}
    return out


def causes(job: Job) -> list[dict[str, object]]:
    """The causes injected into the run, each with its category and ranks or group."""
    sc, out = job.sc, []
    seen = set()
    for chunk, tails in sc.hsdp_tails_ms:
        for place in (p for p in job.places if p.stage == chunk % sc.pp):
            for i, tail in enumerate(tails):
                group = place.dp[i]
                if tail <= 0 or (group, chunk) in seen or group not in job.stragglers:
                    continue
                seen.add((group, chunk))
                info = job.groups[group]
                out.append({"category": DP_REDUCTION, "group": group,
                            "ranks": sorted(r for r in info.ranks if r in job.profiled),
                            "member": job.stragglers[group],
                            "description": f"unprofiled rank {job.stragglers[group]} of the "
                                           f"{len(info.ranks)}-rank HSDP group {info.name} arrives "
                                           f"{tail:g} ms late to the {sc.hsdp_groups[i][0]} of "
                                           f"chunk {chunk}"})
    everyone = sorted(job.profiled)
    if sc.hsdp == "sync":
        out.append({"category": DP_REDUCTION, "ranks": everyone,
                    "description": f"sync scheduler: FSDP_REDUCE_GRAD waits on stream "
                                   f"{sc.compute_stream} between a chunk's last BWD and its "
                                   f"BWD_SEND"})
    if sc.slow_rank >= 0 and sc.slow_factor != 1.0:
        out.append({"category": COMPUTE_STRAGGLER, "ranks": [sc.slow_rank],
                    "description": f"rank {sc.slow_rank} computes {sc.slow_factor:g}x slower"})
    if sc.ep > 1 and sc.late_rank >= 0 and sc.late_factor != 1.0:
        out.append({"category": COMPUTE_STRAGGLER, "ranks": [sc.late_rank],
                    "description": f"rank {sc.late_rank}'s expert compute takes "
                                   f"{sc.late_factor:g}x (token imbalance): late to its "
                                   f"all-to-alls"})
    if sc.ep > 1 and sc.serialize:
        out.append({"category": EP_ALLTOALL, "ranks": everyone,
                    "description": "compute and EP all-to-all share one hardware queue "
                                   "(CUDA_DEVICE_MAX_CONNECTIONS=1 style)"})
    for rank, step, unit, ms in sc.host_stalls:
        out.append({"category": HOST_LAUNCH, "ranks": [rank],
                    "description": f"host of rank {rank} stalls {ms:g} ms before unit {unit} "
                                   f"of step {step}"})
    return out
