"""The long fuzz run (nightly): the cases of tests/fuzz.py spread over processes, with counts
and times. The same cases as `pytest tests/test_fuzz.py --fuzz-cases N`, faster to read.

    .venv/bin/python bench/fuzz.py --cases 3000 [--first 0] [--jobs 2] [--workdir DIR]

Prints how many cases ran, their exit codes, how many damaged inputs were owed a warning or an
error and got one, the mutations applied, the wall time, each process's peak memory and the
slowest cases; then every failure with its case number (`tests.fuzz.case(n)` rebuilds it).
Exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import fuzz  # noqa: E402  (the repository root must be on the path first)


def _chunk(numbers: list[int], workdir: str) -> tuple[list[tuple], tuple[int, int, float]]:
    """Run some cases in a worker: (number, description, exit code, seconds, failure, damaged,
    mutations) each; and the worker's pid, peak RSS in bytes and CPU seconds so far."""
    rows = []
    for outcome in fuzz.run_many(numbers, Path(workdir)):
        c = outcome.case
        rows.append((c.number, str(c), outcome.exit_code, outcome.seconds, outcome.failure,
                     c.mutant.damaged, c.mutant.mutations))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return rows, (os.getpid(), usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--first", type=int, default=0, help="number of the first case")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    numbers = list(range(args.first, args.first + args.cases))
    chunks = [numbers[i:i + 25] for i in range(0, len(numbers), 25)]
    started = time.perf_counter()
    rows, workers = [], {}
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="fuzz-") as work, \
            ProcessPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(_chunk, chunk, f"{work}/{i}") for i, chunk in enumerate(chunks)]
        for job in jobs:
            done, (pid, peak, cpu) = job.result()
            rows += done
            workers[pid] = (max(peak, workers.get(pid, (0, 0))[0]), cpu)
    wall = time.perf_counter() - started
    failures = [r for r in rows if r[4]]
    damaged = [r for r in rows if r[5]]
    print(f"{len(rows)} cases (numbers {args.first}-{args.first + args.cases - 1}) in "
          f"{wall:.0f} s on {args.jobs} processes ({sum(r[3] for r in rows):.0f} s of runs, "
          f"{sum(cpu for _, cpu in workers.values()):.0f} CPU s)")
    print(f"exit codes: {dict(sorted(Counter(r[2] for r in rows).items()))}")
    print(f"damaged inputs owed a warning or an error: {len(damaged)}, of which failed: "
          f"{sum(1 for r in damaged if r[4])}")
    print("mutations applied: " + ", ".join(
        f"{name} {n}" for name, n in Counter(m for r in rows for m in r[6]).most_common()))
    print(f"peak memory of a worker process: "
          f"{max(peak for peak, _ in workers.values()) / 2**20:.0f} MiB")
    print("slowest: " + ", ".join(f"case {r[0]} {r[3]:.1f} s"
                                  for r in sorted(rows, key=lambda r: -r[3])[:5]))
    print(f"{len(failures)} failures")
    for row in failures:
        print(f"  {row[1]}\n    -> {row[4]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
