"""Pipeline schedules as ordered actions per stage: Megatron's (interleaved) 1F1B, and how the
actions of a stage fall into the blocks a trace shows (split only where a P2P message is received
before an action or sent after one).

Chunks are global virtual stages: chunk `c = k * p + s` is the k-th model chunk of stage `s`
(Megatron / hyper-parallel numbering).
"""

from __future__ import annotations

from typing import NamedTuple

FWD, BWD = "F", "B"


class Action(NamedTuple):
    """One scheduler step on one stage: the forward or backward of one microbatch on one chunk."""

    phase: str  # FWD | BWD
    chunk: int  # global virtual stage
    microbatch: int


def actions(p: int, v: int, m: int, stage: int, extra_warmup: int = 0) -> list[Action]:
    """Megatron's (interleaved) 1F1B order for `stage`; `extra_warmup` shifts the steady pairs."""
    if v > 1 and m % p:
        raise ValueError(f"interleaved 1F1B needs microbatches ({m}) divisible by pp ({p})")
    total = m * v
    base = (p - stage - 1) * 2 + (v - 1) * p if v > 1 else p - stage - 1
    warmup = min(base + extra_warmup, total)

    def pick(k: int, phase: str) -> Action:
        local = (k % (p * v)) // p
        local = local if phase == FWD else v - 1 - local
        return Action(phase, local * p + stage, (k // (p * v)) * p + k % p)

    seq = [pick(k, FWD) for k in range(warmup)]
    for i in range(total - warmup):
        seq += [pick(warmup + i, FWD), pick(i, BWD)]
    return seq + [pick(k, BWD) for k in range(max(total - warmup, 0), total)]


def receives(act: Action, chunks: int) -> bool:
    """Whether `act` needs a message from a neighbour chunk (another stage when p > 1)."""
    return act.chunk > 0 if act.phase == FWD else act.chunk < chunks - 1


def sends(act: Action, chunks: int) -> bool:
    """Whether `act` sends a message to a neighbour chunk."""
    return act.chunk < chunks - 1 if act.phase == FWD else act.chunk > 0


def segments(p: int, v: int, m: int, stage: int, extra_warmup: int = 0
             ) -> list[tuple[Action, ...]]:
    """The stage's actions grouped as a trace separates them: a new block where an action
    receives, or the one before it sent."""
    out: list[list[Action]] = []
    sent = True
    for act in actions(p, v, m, stage, extra_warmup):
        if sent or receives(act, p * v):
            out.append([])
        out[-1].append(act)
        sent = sends(act, p * v)
    return [tuple(seg) for seg in out]
