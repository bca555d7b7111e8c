"""Which of a set of (nested) intervals covers a time: the innermost one.

Profilers nest their ranges (a step holds annotations, an annotation holds ops): the step, the
annotation or the enclosing op of an event is the innermost interval of a kind covering its start.
"""

from __future__ import annotations

import numpy as np


def innermost(starts: list[int], ends: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Cut (nested) intervals into segments: boundary times and, from each boundary on, the
    innermost interval still open (-1 for none)."""
    times: list[int] = []
    labels: list[int] = []
    stack: list[int] = []

    def close(upto: float) -> None:
        while stack and ends[stack[-1]] <= upto:
            top = stack.pop()
            while stack and ends[stack[-1]] <= ends[top]:  # partial overlaps ended earlier
                stack.pop()
            times.append(ends[top])
            labels.append(stack[-1] if stack else -1)

    for i in sorted(range(len(starts)), key=lambda k: (starts[k], -ends[k])):
        close(starts[i])
        stack.append(i)
        times.append(starts[i])
        labels.append(i)
    close(float("inf"))
    return np.array(times, dtype=np.int64), np.array(labels, dtype=np.int64)


def cover(rows: np.ndarray, starts: np.ndarray, ends: np.ndarray, at: np.ndarray
          ) -> np.ndarray:
    """For each time in `at`, the row of the innermost interval covering it (-1 if none);
    interval k is rows[k], starts[k]..ends[k]."""
    if not len(rows):
        return np.full(len(at), -1, dtype=np.int64)
    times, labels = innermost(starts.tolist(), ends.tolist())
    pos = np.searchsorted(times, at, side="right") - 1
    label = np.where(pos >= 0, labels[pos.clip(0)], -1)
    return np.where(label >= 0, rows[label.clip(0)], -1)
