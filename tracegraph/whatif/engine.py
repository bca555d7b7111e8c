"""The replay pass: every node of a `TimingModel` timed, in topological order.

Most nodes wait for one thing only: the op before them on their lane, or their own start. A run
of such nodes, consecutive in node order, is timed by one cumulative sum once its first node (its
head) is; only heads (waits, comm ops, gated and launched ops, each lane's first op) need the
topological pass, a loop over plain Python lists. A million-op trace has a few thousand heads per
rank, so the pass is linear in ops with a small constant and needs no compiler.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from tracegraph.whatif.model import TimingModel


class CycleError(ValueError):
    """The model's edges make a cycle: an edit asked for something no schedule can do."""


@dataclass
class Timing:
    """Replayed node times and, per node, the predecessor that bound it (-1: none)."""

    times: np.ndarray
    binding: np.ndarray


def run(model: TimingModel) -> Timing:
    """Time every node: const + the latest predecessor (const alone without one)."""
    nodes = model.nodes
    extra = np.zeros(nodes, dtype=bool)
    extra[model.dst] = True
    follows = np.zeros(nodes, dtype=bool)
    follows[1:] = model.chain[1:] == np.arange(nodes - 1)
    head = ~follows | extra
    run_of = np.cumsum(head) - 1
    heads = np.flatnonzero(head)
    inner = np.where(head, 0, model.const)
    total = np.cumsum(inner)
    offset = total - total[heads][run_of]  # node time = its head's time + offset
    head_times, head_binding = _time_heads(model, heads, run_of, offset)
    times = head_times[run_of] + offset
    binding = np.where(head, -1, model.chain)
    binding[heads] = head_binding
    return Timing(times=times, binding=binding)


def _time_heads(model: TimingModel, heads: np.ndarray, run_of: np.ndarray, offset: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each head's time and binding predecessor, heads visited in topological order (Kahn)."""
    chained = model.chain[heads] >= 0
    pred = np.concatenate([model.chain[heads][chained], model.src])
    dst_head = np.concatenate([np.flatnonzero(chained), run_of[model.dst]])
    order = np.argsort(dst_head, kind="stable")
    pred, dst_head = pred[order], dst_head[order]
    pred_run = run_of[pred]
    if np.any(pred_run == dst_head):
        raise CycleError("an op waits for itself")
    count = len(heads)
    bounds = np.searchsorted(dst_head, np.arange(count + 1)).tolist()
    by_source = np.argsort(pred_run, kind="stable")
    succ_bounds = np.searchsorted(pred_run[by_source], np.arange(count + 1)).tolist()
    successors = dst_head[by_source].tolist()
    pred_list, run_list = pred.tolist(), pred_run.tolist()
    offset_list = offset[pred].tolist()
    const = model.const[heads].tolist()
    waiting = np.diff(np.asarray(bounds)).tolist()
    times: list[int] = [0] * count
    binding: list[int] = [-1] * count
    ready = deque(h for h in range(count) if waiting[h] == 0)
    done = 0
    while ready:
        h = ready.popleft()
        done += 1
        best, arg = 0, -1
        for j in range(bounds[h], bounds[h + 1]):
            t = times[run_list[j]] + offset_list[j]
            if arg < 0 or t > best:
                best, arg = t, pred_list[j]
        times[h] = const[h] + best
        binding[h] = arg
        for j in range(succ_bounds[h], succ_bounds[h + 1]):
            s = successors[j]
            waiting[s] -= 1
            if not waiting[s]:
                ready.append(s)
    if done < count:
        raise CycleError(f"{count - done} ops wait for each other in a cycle")
    return np.asarray(times, dtype=np.int64), np.asarray(binding, dtype=np.int64)
