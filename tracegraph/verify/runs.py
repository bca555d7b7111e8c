"""One profiled run as `diff` compares it: its per-step numbers, and a side of several runs.

A `Run` holds plain tables with a row per step (and rank, category, chain, …), small enough to
keep in the cache beside the analysis it comes from: a diff of many runs run again reads these
and never the analyses. A `Side` is the runs of one side of a diff, cut to the steps every run of
the diff holds (`Side.first`), with each quantity as a runs × steps matrix for `verify.stats`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from tracegraph.analysis.analyze import Analysis
from tracegraph.verify import metrics

CHAIN_KEYS = metrics.CHAIN_KEYS
ChainKey = tuple[int, str, int, str, str]  # rank, category, root rank, root lane, root op


@dataclass
class Run:
    """The per-step numbers of one profile (ms; steps as its ProfilerStep numbers, -1 for a
    profile without step markers)."""

    source: str
    steps: pd.DataFrame  # step, ms: the slowest rank's step time
    rank_steps: pd.DataFrame  # rank, step, ms
    bubbles: pd.DataFrame  # step, rank, category, ms
    critical: pd.DataFrame  # step, kind, rank, ms
    overlap: pd.DataFrame  # rank, step, dim, comm_ms, overlap_ms
    chains: pd.DataFrame  # step, CHAIN_KEYS, ms
    examples: list[dict[str, object]] = field(default_factory=list)  # a chain's longest bubble

    @property
    def step_numbers(self) -> list[int]:
        return sorted(int(s) for s in self.steps["step"])

    def first(self, count: int) -> Run:
        """This run cut to its first `count` steps."""
        kept = set(self.step_numbers[:count])
        tables = {name: frame[frame["step"].isin(kept)].reset_index(drop=True)
                  for name, frame in self._tables().items()}
        return replace(self, **tables, examples=[e for e in self.examples if e["step"] in kept])

    def _tables(self) -> dict[str, pd.DataFrame]:
        return {"steps": self.steps, "rank_steps": self.rank_steps, "bubbles": self.bubbles,
                "critical": self.critical, "overlap": self.overlap, "chains": self.chains}


def run_of(analysis: Analysis, source: str | None = None) -> Run:
    """The numbers of `analysis` that a diff compares."""
    times = metrics.step_times(analysis)
    chains = metrics.chain_table(analysis)
    origin = analysis.origin
    examples = [{**{k: _plain(row[k]) for k in ["step", *CHAIN_KEYS]},
                 **_example(row["example"], origin)} for _, row in chains.iterrows()]
    overlap = metrics.overlap_table(analysis)
    return Run(
        source=source if source is not None else str(analysis.trace.source),
        steps=times.groupby("step", as_index=False)["ms"].max(),
        rank_steps=times[["rank", "step", "ms"]].reset_index(drop=True),
        bubbles=metrics.bubble_table(analysis),
        critical=metrics.critical_path_table(analysis),
        overlap=overlap[["rank", "step", "dim", "comm_ms", "overlap_ms"]],
        chains=chains[["step", *CHAIN_KEYS, "ms"]].astype({"ms": float}),
        examples=examples,
    )


def _example(bubble, origin: int) -> dict[str, object]:
    return {"lane": bubble.lane, "name": bubble.name, "chain": [int(r) for r in bubble.chain()],
            "start_ms": (bubble.start - origin) / metrics.NS_PER_MS,
            "dur_ms": bubble.dur / metrics.NS_PER_MS}


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


class Side:
    """The runs of one side of a diff, each cut to its first `steps` steps."""

    def __init__(self, runs: list[Run], steps: int):
        self.runs = [run.first(steps) for run in runs]
        self.steps = steps
        self._sums: dict[tuple, dict[object, np.ndarray]] = {}
        self._examples: dict[ChainKey, dict[str, object]] = {}
        for index, run in enumerate(self.runs, 1):
            for example in run.examples:
                key = tuple(example[k] for k in CHAIN_KEYS)
                if example["dur_ms"] > self._examples.get(key, {}).get("dur_ms", -1.0):
                    self._examples[key] = {**example, "run": index}

    @property
    def sources(self) -> list[str]:
        return [run.source for run in self.runs]

    def step_time(self) -> np.ndarray:
        """runs × steps of the slowest rank's step time."""
        return self.sums("steps")[None]

    def sums(self, table: str, *by: str, value: str = "ms") -> dict[object, np.ndarray]:
        """Each value of the `by` columns of a per-step table (a tuple for several columns; None
        for none) -> runs × steps of `value` summed over the other rows of its step (0 where a
        step has none)."""
        key = (table, by, value)
        if key not in self._sums:
            self._sums[key] = self._summed(table, by, value)
        return self._sums[key]

    def _summed(self, table: str, by: tuple[str, ...], value: str) -> dict[object, np.ndarray]:
        rows = pd.concat([_placed(getattr(run, table), run, i * self.steps, [*by, value])
                          for i, run in enumerate(self.runs)], ignore_index=True)
        cells = len(self.runs) * self.steps
        if not by:
            return {None: np.bincount(rows["_cell"], rows[value], cells).reshape(
                len(self.runs), self.steps)}
        codes, names = pd.MultiIndex.from_frame(rows[list(by)]).factorize()
        cube = np.zeros((len(names), cells))
        np.add.at(cube, (codes, rows["_cell"].to_numpy()), rows[value].to_numpy(dtype=float))
        keys = [k if len(by) > 1 else k[0] for k in names.tolist()]
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        return {keys[i]: cube[i].reshape(len(self.runs), self.steps) for i in order}

    def chains(self) -> dict[ChainKey, np.ndarray]:
        """Each chain -> runs × steps of its ms."""
        return self.sums("chains", *CHAIN_KEYS)  # type: ignore[return-value]

    def example(self, key: ChainKey) -> dict[str, object] | None:
        """The longest bubble of a chain over the side's runs, with the run (from 1) it is in."""
        return self._examples.get(key)


def _placed(table: pd.DataFrame, run: Run, first: int, columns: list[str]) -> pd.DataFrame:
    """`columns` of the rows of a run's per-step table whose step the run holds, with `_cell`:
    the step's position in the run, plus `first`."""
    steps, step = np.asarray(run.step_numbers, dtype=np.int64), table["step"].to_numpy()
    at = np.searchsorted(steps, step)
    held = np.isin(step, steps)
    return pd.DataFrame({**{c: table[c].to_numpy()[held] for c in columns},
                         "_cell": first + at[held]})
