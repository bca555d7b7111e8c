"""Interval sets: how much of many windows a set covers at once agrees with clipping and merging
the set window by window."""

from __future__ import annotations

import numpy as np

from tracegraph.analysis import intervals


def _one_by_one(busy: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> list[int]:
    return [intervals.length(intervals.union(*busy, a, b)) for a, b in zip(lo, hi, strict=True)]


def test_windows_covered_at_once_as_one_by_one() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        start = rng.integers(0, 10_000, rng.integers(0, 40))
        busy = intervals.union(start, start + rng.integers(1, 800, len(start)), -1, 20_000)
        lo = rng.integers(-500, 11_000, 200)
        hi = lo + rng.integers(0, 3_000, 200)  # windows before, across, inside and after the set
        assert intervals.covered(busy, lo, hi).tolist() == _one_by_one(busy, lo, hi)


def test_a_window_inside_a_gap_or_an_interval() -> None:
    busy = (np.array([10, 50]), np.array([20, 60]))
    lo, hi = np.array([0, 12, 25, 15, 55, 70]), np.array([5, 18, 45, 55, 80, 90])
    assert intervals.covered(busy, lo, hi).tolist() == [0, 6, 0, 10, 5, 0]
