"""The bundles the what-if tests replay: every simulated scenario in both formats (the bundled
sample where there is one, else simulated here: one step, seed 0, as the samples were), the real
corpus and the real profiles with a timeline. Analyses are cached per test process."""

from __future__ import annotations

import functools
from pathlib import Path

import tracegraph
from tests.conftest import SAMPLES
from tests.test_checks import sim_dir
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.simulate import SCENARIOS

FORMATS = ("ascend", "kineto")
SMALL = {"large": {"ranks": 8, "microbatches": 4, "kernels_per_chunk": 8}}  # the benchmark, small
SIMULATED = [(name, fmt) for name in sorted(SCENARIOS) for fmt in FORMATS]


@functools.cache
def simulated(name: str, fmt: str) -> Path:
    """The bundle of a scenario in a format."""
    sample = SAMPLES / "simulated" / f"{name}-{fmt}.tar.gz"
    if sample.is_file():
        return sample
    from tracegraph.simulate import simulate
    from tracegraph.simulate.bundle_writer import write_bundle

    timeline = simulate(name, seed=0, steps=1, **SMALL.get(name, {}))
    return write_bundle(timeline, sim_dir() / f"{name}-{fmt}.tar.gz", fmt)


@functools.cache
def analysed(path: Path, rank_map: tuple[tuple[str, int], ...] | None = None) -> Analysis:
    """The analysis of a bundle (cached; no parse cache written)."""
    return analyze(tracegraph.load(path, use_cache=False,
                                   rank_map=dict(rank_map) if rank_map else None))
