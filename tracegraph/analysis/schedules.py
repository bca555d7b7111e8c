"""Pipeline schedules: Megatron's (interleaved) 1F1B as ordered actions per stage.

Every stage runs its forwards in one order and its backwards in the same order with the model
chunks reversed: microbatches go in groups of p (Megatron's `microbatch_group_size_per_vp_stage`
default), each group through chunk 0, then chunk 1, ... (`order`). The schedule only decides how
the forwards and backwards interleave (`actions`): that is what the simulator runs, and what
the analysis relies on when it numbers the blocks of a trace in order.

Chunks are global virtual stages here: chunk `c = k * p + s` is the k-th model chunk of stage
`s` (Megatron / hyper-parallel numbering).
"""

from __future__ import annotations

from typing import NamedTuple

FWD, BWD = "F", "B"


class Action(NamedTuple):
    """One scheduler step on one stage: the forward or backward of one microbatch on one chunk."""

    phase: str  # FWD | BWD
    chunk: int  # global virtual stage
    microbatch: int


def order(p: int, v: int, m: int) -> list[tuple[int, int]]:
    """(model chunk of the stage, microbatch) of a stage's forwards in run order; its backwards
    run the same list with the chunks reversed (v − 1 − chunk)."""
    return [(k, mb) for first in range(0, m, p) for k in range(v)
            for mb in range(first, min(first + p, m))]


def actions(p: int, v: int, m: int, stage: int, extra_warmup: int = 0) -> list[Action]:
    """Megatron's (interleaved) 1F1B order for `stage`; `extra_warmup` shifts the steady pairs."""
    if v > 1 and m % p:
        raise ValueError(f"interleaved 1F1B needs microbatches ({m}) divisible by pp ({p})")
    total = m * v
    base = (p - stage - 1) * 2 + (v - 1) * p if v > 1 else p - stage - 1
    warmup = min(base + extra_warmup, total)
    runs = order(p, v, m)

    def pick(k: int, phase: str) -> Action:
        local, mb = runs[k]
        return Action(phase, (local if phase == FWD else v - 1 - local) * p + stage, mb)

    seq = [pick(k, FWD) for k in range(warmup)]
    for i in range(total - warmup):
        seq += [pick(warmup + i, FWD), pick(i, BWD)]
    return seq + [pick(k, BWD) for k in range(max(total - warmup, 0), total)]
