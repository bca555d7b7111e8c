"""Scaling benchmark: load and full analysis time and memory against ranks, on simulated bundles.

Writes the `large` scenario (PP4 × VPP2 replicas, async HSDP) at several rank counts, each with
its number of kernels per F/B chunk, then times `tracegraph.load` (no cache, ranks parsed in
parallel) + `analyze` of each in a fresh process. Prints both times, the wall time and CPU seconds
of the whole process tree, its peak memory, and CPU µs per event (wall time varies with whatever
else runs on the machine; CPU time much less). Cost should grow linearly in events: CPU µs per
event should stay flat.

    .venv/bin/python bench/bench_scale.py --ranks 8 32 128 --kernels 200 --format ascend kineto
    .venv/bin/python bench/bench_scale.py --ranks 8 32 --format ascend ascend-db  # text vs .db
    .venv/bin/python bench/bench_scale.py --ranks 1024 --kernels 24 --format kineto --keep /tmp/b
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_load import measure

REPO = Path(__file__).resolve().parents[1]
TIMED = """
import time, tracegraph
from tracegraph.analysis.analyze import analyze
t0 = time.perf_counter(); trace = tracegraph.load({bundle!r}, use_cache=False)
t1 = time.perf_counter(); analysis = analyze(trace); t2 = time.perf_counter()
print(len(trace.events), len(analysis.ops), t1 - t0, t2 - t1)
"""


def simulate(out: Path, ranks: int, kernels: int, fmt: str) -> float:
    """Write the `large` bundle unless `out` exists; seconds it took (0 when reused)."""
    if out.exists():
        return 0.0
    start = time.perf_counter()
    fmt, _, layout = fmt.partition("-")  # ascend-db: the same job as the profiler's .db export
    subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "large", "-o", str(out),
                    "--format", fmt, "--layout", layout or "text", "--ranks", str(ranks),
                    "--steps", "1", "--kernels-per-chunk", str(kernels)], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def run(folder: Path, ranks: int, kernels: int, fmt: str, keep: bool) -> str:
    """One row of the table: simulate, then load + analyze in a fresh process."""
    bundle = folder / f"large-{fmt}-{ranks}r-{kernels}k.tar.gz"
    generated = simulate(bundle, ranks, kernels, fmt)
    step = measure(TIMED.format(bundle=str(bundle)))
    events, ops, load_s, analyze_s = step.out.split()[-4:]
    if not keep:
        bundle.unlink()
    return (f"{fmt:>7} {ranks:>6} {kernels:>7} {int(events):>11,} {int(ops):>10,} "
            f"{generated:>8.1f} s {float(load_s):>7.2f} s {float(analyze_s):>7.2f} s "
            f"{step.wall:>7.2f} s {step.cpu or 0:>7.1f} s {step.rss / 2**20:>7.0f} MiB "
            f"{(step.cpu or step.wall) / int(events) * 1e6:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--kernels", type=int, nargs="+", default=[200],
                        help="kernels per F/B chunk: one value, or one per --ranks value")
    parser.add_argument("--format", nargs="+", choices=["ascend", "ascend-db", "kineto"],
                        default=["ascend"])
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the bundles in this folder")
    args = parser.parse_args()
    kernels = args.kernels * len(args.ranks) if len(args.kernels) == 1 else args.kernels
    if len(kernels) != len(args.ranks):
        parser.error("--kernels takes one value or one per --ranks value")
    print(f"{'format':>7} {'ranks':>6} {'kernels':>7} {'events':>11} {'ops':>10} "
          f"{'simulate':>10} {'load':>9} {'analyze':>9} {'total':>9} {'cpu':>9} {'peak':>11} "
          f"{'cpu µs/ev':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tracegraph-scale-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for fmt in args.format:
            for ranks, k in zip(args.ranks, kernels, strict=True):
                print(run(folder, ranks, k, fmt, args.keep is not None), flush=True)


if __name__ == "__main__":
    main()
