"""A change between two sides of repeated runs, told apart from run-to-run noise.

Each side of a comparison is a matrix of per-step values, one row per run (the runs of both sides
hold the same number of steps: `diff` compares them over the steps they share). A side's centre is
a statistic of its matrix: `pooled_median` (the step time: the median of every step of every run)
or `median_of_means` (bubble and chain time: each run's mean per step, their median over runs).
The change is after's centre minus before's, and with at least two runs on each side it carries
- a confidence interval from a bootstrap over runs: runs drawn with replacement, each with all its
  steps, so the interval holds the run-to-run variation (placement, clocks, the cluster's load)
  that the steps of one run do not show, and steps stay paired by position (a first step that
  differs from the later ones, in every run, does not widen it). A bootstrap over 2-5 runs is
  too narrow (at 95 %, healthy against healthy runs of the simulator excluded zero in 32 % of
  draws at 2 runs per side, 17 % at 3), so it is widened as a t interval would be: each side's
  draws by √(n/(n−1)), the change's by t(n_before + n_after − 2) over the normal quantile
  (then healthy runs are called significant in 3-5 % of draws at 2, 3 and 5 runs per side:
  bench/README.md);
- the two-sided p-value of a Mann-Whitney U test on the pooled steps of the two sides.
It is *significant* when the interval excludes zero and the p-value is below 1 - confidence; a
change that is not is inside the noise. With one run on a side there is no noise estimate: the
point change alone, and `Change.estimated` says so.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RESAMPLES = 4000  # bootstrap draws over the runs (3 runs have 10 distinct draws, 5 runs 126)
SEED = 20_251_202  # the draws are fixed: one input, one report
MIN_RUNS = 2  # per side, for a noise estimate
EXACT_PAIRS = 400  # the rank test's exact distribution up to this n1·n2 (without ties)

Statistic = Callable[[np.ndarray], np.ndarray]
"""(..., runs, steps) -> (...): a side's centre, over its two last axes."""


def pooled_median(values: np.ndarray) -> np.ndarray:
    """The median of every step of every run (nan without steps)."""
    if not values.shape[-1]:
        return np.full(values.shape[:-2], np.nan)
    return np.median(values.reshape(*values.shape[:-2], -1), axis=-1)


def median_of_means(values: np.ndarray) -> np.ndarray:
    """Each run's mean per step, their median over the runs (nan without steps)."""
    if not values.shape[-1]:
        return np.full(values.shape[:-2], np.nan)
    return np.median(values.mean(axis=-1), axis=-1)


@dataclass(frozen=True)
class Change:
    """after - before of a centre (ms), with its interval and p-value when both sides have
    MIN_RUNS runs (None otherwise)."""

    before: float
    after: float
    confidence: float
    interval: tuple[float, float] | None = None  # of after - before, ms
    interval_pct: tuple[float, float] | None = None  # of the same, % of before
    p_value: float | None = None

    @property
    def delta(self) -> float:
        return self.after - self.before

    @property
    def pct(self) -> float | None:
        """The change in % of before (None when before is not positive)."""
        return 100.0 * self.delta / self.before if self.before > 0 else None

    @property
    def estimated(self) -> bool:
        """Whether the runs gave a noise estimate (an interval and a p-value)."""
        return self.interval is not None

    @property
    def significant(self) -> bool:
        """Beyond the noise: the interval excludes zero and p < 1 - confidence."""
        if self.interval is None or self.p_value is None:
            return False
        low, high = self.interval
        return (low > 0 or high < 0) and self.p_value < 1.0 - self.confidence


def measure(before: np.ndarray, after: np.ndarray, statistic: Statistic,
            confidence: float) -> Change:
    """The change of `statistic` from `before` to `after` (each runs × steps)."""
    old, new = float(statistic(before)), float(statistic(after))
    if min(len(before), len(after)) < MIN_RUNS or not math.isfinite(old + new):
        return Change(old, new, confidence)
    rng = np.random.default_rng(SEED)
    drawn_old = widened(statistic(resample(before, rng)), old, len(before))
    drawn_new = widened(statistic(resample(after, rng)), new, len(after))
    scale = t_scale(len(before) + len(after) - 2, confidence)
    interval = _interval(drawn_new - drawn_old, new - old, scale, confidence)
    interval_pct = None
    if old > 0 and np.all(drawn_old > 0):
        interval_pct = _interval(100.0 * (drawn_new / drawn_old - 1.0),
                                 100.0 * (new / old - 1.0), scale, confidence)
    return Change(old, new, confidence, interval, interval_pct, rank_test(before, after))


def widened(drawn: np.ndarray, centre: float, runs: int) -> np.ndarray:
    """Bootstrap draws of a side's centre over its `runs` runs, their spread scaled by
    √(runs / (runs − 1)): the bootstrap's variance of a mean of n runs is (n − 1)/n of the
    unbiased one."""
    return centre + (drawn - centre) * math.sqrt(runs / (runs - 1))


def t_scale(freedom: int, confidence: float) -> float:
    """Student's t over the normal quantile at `confidence`, two-sided: how much wider an
    interval estimated from few runs must be (2.2 at 2 runs per side, 1.18 at 5)."""
    from scipy.special import ndtri, stdtrit

    tail = (1.0 + confidence) / 2.0
    return float(stdtrit(freedom, tail) / ndtri(tail))


def _interval(drawn: np.ndarray, centre: float, scale: float, confidence: float
              ) -> tuple[float, float]:
    """The `confidence` interval of bootstrap draws, their deviations from `centre` scaled."""
    low, high = np.quantile(centre + (drawn - centre) * scale,
                            [(1.0 - confidence) / 2, (1.0 + confidence) / 2])
    return float(low), float(high)


def resample(values: np.ndarray, rng: np.random.Generator, count: int = RESAMPLES
             ) -> np.ndarray:
    """`count` bootstrap draws of the runs (rows) of a runs × steps matrix: count × runs ×
    steps."""
    return values[rng.integers(0, len(values), (count, len(values)))]


def rank_test(before: np.ndarray, after: np.ndarray) -> float:
    """The two-sided p-value of a Mann-Whitney U test of the pooled steps of two sides: exact
    for small samples without ties, else the normal approximation with the tie and continuity
    corrections (as scipy.stats.mannwhitneyu computes it, without importing scipy.stats: 1.3 s of
    a gate that takes 3)."""
    old, new = before.ravel(), after.ravel()
    both = np.concatenate([old, new])
    values, inverse, ties = np.unique(both, return_inverse=True, return_counts=True)
    if len(values) <= 1:
        return 1.0
    ranks = (np.cumsum(ties) - (ties - 1) / 2.0)[inverse]  # average ranks
    n1, n2 = len(old), len(new)
    u = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)
    u = max(u, n1 * n2 - u)
    if len(values) == len(both) and n1 * n2 <= EXACT_PAIRS:
        counts = _u_counts(n1, n2)
        return min(1.0, 2.0 * counts[int(round(u)):].sum() / counts.sum())
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12.0 * (n + 1 - float((ties ** 3 - ties).sum()) / (n * (n - 1))))
    z = (u - n1 * n2 / 2.0 - 0.5) / sigma
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


@functools.cache
def _u_counts(n1: int, n2: int) -> np.ndarray:
    """How many of the orderings of n1 + n2 distinct values give each U from 0 to n1·n2."""
    table = {(0, b): np.ones(1) for b in range(n2 + 1)}
    for a in range(1, n1 + 1):
        table[a, 0] = np.ones(1)
        for b in range(1, n2 + 1):
            counts = np.zeros(a * b + 1)
            counts[b:] += table[a - 1, b]  # the largest value in the first sample: U grows by b
            counts[:len(table[a, b - 1])] += table[a, b - 1]
            table[a, b] = counts
    return table[n1, n2]
