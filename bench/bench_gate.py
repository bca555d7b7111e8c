"""The gate over repeated runs: what a 3 × 3 `diff` costs against a 1 × 1 once the analyses are
cached, and how often its verdicts are right.

1. Wall and CPU seconds of `tracegraph diff` as a user runs it (`python -m tracegraph`, a fresh
   process), warm (an earlier diff of the same runs filled the cache), one run per side against
   three per side, on the simulated seed case (hsdp-straggler-sync against -async, 4 ranks, jitter
   1 %, seeds 0-2); the median of --repeat alternating runs each, and the ratio 3 × 3 / 1 × 1.
   `--kernels` scales the events per rank (the seed case has 24 kernels per chunk).
2. Calibration, on the simulator's step times alone (the diff's step time equals the Timeline's:
   tests/test_diff_runs.py): over --trials random draws of seeds, how often R healthy runs
   against R other healthy runs are called significant at 95 % (the rate of false alarms: 5 % is
   the nominal) and fail a 1 % gate, and how often a 5 % slower rank (+2.3 % step time) and the
   30 % slower one of pp-compute-straggler (+18 %) are found significant, for R = 2, 3, 5.

    .venv/bin/python bench/bench_gate.py [--repeat 3] [--kernels 24] [--trials 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_load import Step, measure_command

from tracegraph.simulate import simulate
from tracegraph.simulate.bundle_writer import write_bundle
from tracegraph.verify import stats

SEEDS = (0, 1, 2)
JITTER = 0.01


def bundles(workdir: Path, kernels: int, fmt: str) -> dict[str, list[Path]]:
    """The seed case before and after its fix, three seeds each (written once per workdir)."""
    out: dict[str, list[Path]] = {}
    for side, scenario in (("before", "hsdp-straggler-sync"), ("after", "hsdp-straggler-async")):
        for seed in SEEDS:
            path = workdir / f"{scenario}-{seed}-k{kernels}-{fmt}.tar.gz"
            if not path.exists():
                timeline = simulate(scenario, seed=seed, jitter=JITTER, kernels_per_chunk=kernels)
                write_bundle(timeline, path, fmt)
            out.setdefault(side, []).append(path)
    return out


def diff_argv(runs: dict[str, list[Path]], count: int, cache: Path) -> list[str]:
    sides = [a for side in ("before", "after") for path in runs[side][:count]
             for a in (f"--{side}", str(path))]
    command = [sys.executable, "-m", "tracegraph", "diff", *sides, "--json",
               "--fail-on-regression", "off", "--cache-dir", str(cache)]
    return ["sh", "-c", " ".join(f"'{a}'" for a in command) + " >/dev/null 2>&1"]


def timing(runs: dict[str, list[Path]], cache: Path, repeat: int) -> None:
    argv = {count: diff_argv(runs, count, cache) for count in (1, 3)}
    for command in argv.values():  # cold: fills the cache
        measure_command(command)
    steps: dict[int, list[Step]] = {1: [], 3: []}
    for _ in range(repeat):
        for count, command in argv.items():
            steps[count].append(measure_command(command))
    wall = {c: statistics.median(s.wall for s in found) for c, found in steps.items()}
    cpu = {c: statistics.median(s.cpu or 0 for s in found) for c, found in steps.items()}
    size = sum(p.stat().st_size for p in runs["before"][:1] + runs["after"][:1]) / 2**20
    print(f"warm diff, median of {repeat} (1 × 1 reads {size:.1f} MiB of archives):")
    for count in (1, 3):
        print(f"  {count} × {count}: wall {wall[count]:6.2f} s, CPU {cpu[count]:6.2f} s")
    print(f"  3 × 3 / 1 × 1: wall {wall[3] / wall[1]:.2f}×, CPU {cpu[3] / cpu[1]:.2f}×")


def step_times(scenario: str, seed: int, **overrides: object) -> list[float]:
    """The slowest rank's step time of each step of a simulated run (ms)."""
    spans: dict[int, list[float]] = {}
    for span in simulate(scenario, seed=seed, jitter=JITTER, **overrides).steps:
        spans.setdefault(span.step, []).append((span.end_ns - span.start_ns) / 1e6)
    return [max(times) for _, times in sorted(spans.items())]


def calibration(trials: int, pool: int = 40) -> None:
    healthy = np.array([step_times("pp-compute-healthy", s) for s in range(pool)])
    kinds = {"+2.3 %": np.array([step_times("pp-compute-healthy", s, slow_rank=2,
                                            slow_factor=1.05) for s in range(pool, 2 * pool)]),
             "+18 %": np.array([step_times("pp-compute-straggler", s)
                                for s in range(pool, 2 * pool)])}
    rng = np.random.default_rng(5)
    print(f"calibration at 95 %, {trials} draws of seeds (healthy: pp-compute-healthy, "
          f"jitter {JITTER:g}, 2 steps per run):")
    print(f"  {'runs per side':>13} {'healthy: significant':>21} {'fails 1 % gate':>15} "
          + " ".join(f"{'found ' + name:>14}" for name in kinds))
    for runs in (2, 3, 5):
        counts = np.zeros(2 + len(kinds))
        for _ in range(trials):
            pick = rng.permutation(pool)[:2 * runs]
            before = healthy[pick[:runs]]
            same = stats.measure(before, healthy[pick[runs:]], stats.pooled_median, 0.95)
            found = [stats.measure(before, slow[pick[runs:]], stats.pooled_median, 0.95)
                     for slow in kinds.values()]
            counts += [same.significant, same.significant and same.interval_pct[0] > 1.0,
                       *(c.significant and c.delta > 0 for c in found)]
        rates = counts / trials
        print(f"  {runs:>13} {rates[0]:>21.3f} {rates[1]:>15.3f} "
              + " ".join(f"{r:>14.3f}" for r in rates[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=24, help="kernels per F/B chunk")
    parser.add_argument("--format", default="ascend", choices=("ascend", "kineto"))
    parser.add_argument("--trials", type=int, default=400, help="0: no calibration")
    parser.add_argument("--workdir", type=Path, help="keep the bundles here and reuse them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracegraph-gate-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        runs = bundles(workdir, args.kernels, args.format)
        timing(runs, Path(tmp) / "cache", args.repeat)
    if args.trials > 0:
        calibration(args.trials)


if __name__ == "__main__":
    main()
