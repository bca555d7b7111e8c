"""Sets of time intervals as (starts, ends) arrays: union, total length, intersection, and how
much of many windows they cover."""

from __future__ import annotations

import numpy as np


def union(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to [lo, hi] and merged into sorted disjoint ones."""
    start, end = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = end > start
    start, end = start[keep], end[keep]
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    start, reach = start[order], np.maximum.accumulate(end[order])
    first = np.ones(len(start), dtype=bool)
    first[1:] = start[1:] > reach[:-1]
    last = np.append(np.flatnonzero(first)[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def length(intervals: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of disjoint intervals."""
    return int((intervals[1] - intervals[0]).sum())


def covered(intervals: tuple[np.ndarray, np.ndarray], lo: np.ndarray,
            hi: np.ndarray) -> np.ndarray:
    """How much of each window [lo, hi) disjoint sorted intervals cover, for all windows at once."""
    return _covered_before(intervals, hi) - _covered_before(intervals, lo)


def _covered_before(intervals: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
    """The intervals' length before each point."""
    starts, ends = intervals
    if not len(starts):
        return np.zeros(len(points), dtype=np.int64)
    widths = ends - starts
    before = np.concatenate([[0], np.cumsum(widths)])  # length of the intervals ahead of each
    k = np.searchsorted(starts, points, "right") - 1  # the last interval starting at or before
    inside = np.clip(points - starts[np.maximum(k, 0)], 0, widths[np.maximum(k, 0)])
    return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0)


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two sets of disjoint sorted intervals."""
    points = np.unique(np.concatenate([*a, *b]))
    if len(points) < 2:
        return 0
    left = points[:-1]
    both = _inside(a, left) & _inside(b, left)
    return int(np.diff(points)[both].sum())


def _inside(intervals: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
    starts, ends = intervals
    return np.searchsorted(starts, points, "right") > np.searchsorted(ends, points, "right")
