"""Pipeline schedules: per-stage action lists (1F1B, interleaved 1F1B / VPP), layer layouts, and
the order of the P2P messages on every pipeline edge.

Chunks are global virtual stages: chunk `c = k * p + s` is the k-th model chunk of stage `s`
(Megatron / hyper-parallel numbering). A stage's actions run on its compute stream in list order;
a *unit* is what the model issues at once: one action, or a steady-state (F, B) pair when
combined-1F1B overlap interleaves a forward with an unrelated backward.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tracegraph.analysis.schedules import BWD, FWD, Action, actions  # noqa: F401 - re-exported


class Message(NamedTuple):
    """An activation (F) or gradient (B) that chunk `chunk` sends to its neighbour chunk."""

    phase: str
    chunk: int  # producing chunk
    microbatch: int


Unit = tuple[Action, ...]


def units(seq: Sequence[Action], combine: bool) -> list[Unit]:
    """Group a stage's actions into issue units: steady (F, B) pairs when `combine`."""
    out: list[Unit] = []
    i = 0
    while i < len(seq):
        pair = seq[i:i + 2]
        independent = len(pair) == 2 and pair[0].phase == FWD and pair[1].phase == BWD and (
            pair[0].chunk, pair[0].microbatch) != (pair[1].chunk, pair[1].microbatch)
        if combine and independent:
            out.append(tuple(pair))
            i += 2
        else:
            out.append((seq[i],))
            i += 1
    return out


def layer_counts(spec: Sequence[str] | None, p: int, v: int, num_layers: int) -> list[int]:
    """Layers of every global chunk from `pipeline_parallel_layers_per_stage` (or an even split)."""
    if spec is None:
        share, extra = divmod(num_layers, p * v)
        return [share + (c < extra) for c in range(p * v)]
    if len(spec) != p:
        raise ValueError(f"layer layout has {len(spec)} stages, pp is {p}")
    counts = [0] * (p * v)
    for stage, text in enumerate(spec):
        ranges = [r.split("-") for r in text.split(",")]
        if len(ranges) != v:
            raise ValueError(f"stage {stage} layout {text!r} needs {v} ranges (vpp={v})")
        for k, (lo, hi) in enumerate(ranges):
            counts[k * p + stage] = int(hi) - int(lo) + 1
    return counts


def consumes(act: Action, chunks: int) -> Message | None:
    """The message `act` needs from a neighbour chunk, if any."""
    if act.phase == FWD:
        return Message(FWD, act.chunk - 1, act.microbatch) if act.chunk > 0 else None
    return Message(BWD, act.chunk + 1, act.microbatch) if act.chunk < chunks - 1 else None


def produces(act: Action, chunks: int) -> Message | None:
    """The message `act` sends to a neighbour chunk, if any."""
    last = act.chunk == chunks - 1 if act.phase == FWD else act.chunk == 0
    return None if last else Message(act.phase, act.chunk, act.microbatch)


def target(msg: Message) -> int:
    """The chunk that receives `msg`."""
    return msg.chunk + 1 if msg.phase == FWD else msg.chunk - 1


def edge(msg: Message, p: int) -> tuple[int, int]:
    """The pipeline edge (s, (s + 1) % p) a message travels on."""
    src, dst = msg.chunk % p, target(msg) % p
    return (src, dst) if msg.phase == FWD else (dst, src)


class P2PPlan(NamedTuple):
    """Per edge, the exchanges in issue order: each one message or an opposite-direction pair."""

    edges: dict[tuple[int, int], list[tuple[Message, ...]]]
    where: dict[Message, tuple[tuple[int, int], int]]  # message -> (edge, exchange index)


def plan_p2p(stage_units: Sequence[Sequence[Unit]], p: int, chunks: int,
             duration: Callable[[Action], float], transfer: float, batch: bool) -> P2PPlan:
    """Order the messages on each edge by their send time in an ideal run, so that every rank
    can issue them in that one order without deadlock; pair adjacent opposite messages when
    `batch` and each side produces its half before it needs the other."""
    sent, pos = _ideal_run(stage_units, p, chunks, duration, transfer)
    edges: dict[tuple[int, int], list[Message]] = {}
    for msg in sorted(sent, key=lambda x: (sent[x], x)):
        edges.setdefault(edge(msg, p), []).append(msg)
    plan: dict[tuple[int, int], list[tuple[Message, ...]]] = {}
    where: dict[Message, tuple[tuple[int, int], int]] = {}
    for key, msgs in edges.items():
        plan[key] = _pair(msgs, pos, p) if batch else [(m,) for m in msgs]
        for i, exchange in enumerate(plan[key]):
            where.update((msg, (key, i)) for msg in exchange)
    return P2PPlan(plan, where)


def _pair(msgs: list[Message], pos: dict, p: int) -> list[tuple[Message, ...]]:
    """Merge adjacent opposite-direction messages that both sides can post together."""
    out: list[tuple[Message, ...]] = []
    i = 0
    while i < len(msgs):
        a, b = msgs[i], msgs[i + 1] if i + 1 < len(msgs) else None
        if b is not None and a.phase != b.phase and _safe(a, b, pos, p) and _safe(b, a, pos, p):
            out.append((a, b))
            i += 2
        else:
            out.append((a,))
            i += 1
    return out


def _safe(send: Message, recv: Message, pos: dict, p: int) -> bool:
    """On the rank that sends `send`, it is produced before `recv` is needed."""
    return pos[("out", send)] < pos[("in", recv)] and send.chunk % p == target(recv) % p


def _ideal_run(stage_units: Sequence[Sequence[Unit]], p: int, chunks: int,
               duration: Callable[[Action], float], transfer: float
               ) -> tuple[dict[Message, float], dict[tuple[str, Message], int]]:
    """Send time of every message with unbounded links, and the unit index producing/needing it."""
    sent: dict[Message, float] = {}
    pos: dict[tuple[str, Message], int] = {}
    for s, seq in enumerate(stage_units):
        for i, unit in enumerate(seq):
            for act in unit:
                if (need := consumes(act, chunks)) and need.chunk % p != s:
                    pos[("in", need)] = i
                if (out := produces(act, chunks)) and target(out) % p != s:
                    pos[("out", out)] = i
    free, ptr = [0.0] * p, [0] * p
    ready: list[tuple[float, int]] = [(0.0, s) for s in range(p)]
    arrived: dict[Message, float] = {}
    while ready:
        _, s = heapq.heappop(ready)
        while ptr[s] < len(stage_units[s]):
            unit = stage_units[s][ptr[s]]
            needs = [n for a in unit if (n := consumes(a, chunks)) and n.chunk % p != s]
            if any(n not in arrived for n in needs):
                break
            start = max([free[s], *(arrived[n] for n in needs)])
            free[s] = start + sum(duration(a) for a in unit)
            for out in (produces(a, chunks) for a in unit):
                if out is not None and target(out) % p != s:
                    sent[out] = free[s]
                    arrived[out] = free[s] + transfer
                    heapq.heappush(ready, (free[s], target(out) % p))
            ptr[s] += 1
    stuck = [s for s in range(p) if ptr[s] < len(stage_units[s])]
    if stuck:
        raise ValueError(f"pipeline schedule deadlocks on stage {stuck[0]} "
                         f"at {stage_units[stuck[0]][ptr[stuck[0]]]}")
    return sent, pos
