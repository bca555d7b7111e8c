"""Scaling benchmark: load and full analysis time and memory against ranks and ops per rank, on
simulated bundles, locally and on a Dask cluster.

Writes the `large` scenario (PP4 × VPP2 replicas, async HSDP) at several rank counts, each with
its number of kernels per F/B chunk, then times the load (no cache, ranks parsed in parallel) and
the whole analysis of each in a fresh process: `tracegraph.load` + `analyze`, or with `--dask N`
`load_on_cluster` + `analyze_on_cluster` on a LocalCluster of N workers (what `--dask local`
runs). Modes `command` and `command-dask` run the command a user runs instead, `tracegraph
analyze --json --no-cache` (with `--dask local`): its summary adds the findings, the pipeline
schedule and the gain ceilings to the analysis (no load / analyze split: the total). Prints both
times, the wall time and CPU seconds of the whole process tree, the peak RSS
of the tree and of the client process alone (the one that holds the answers: with --dask the
workers hold the ranks), and CPU µs per event (wall time varies with whatever else runs on the
machine; CPU time much less). Cost should grow linearly in events; the client's memory under
--dask with the communication, not with the kernels of each rank.

    .venv/bin/python bench/bench_scale.py --ranks 8 32 128 --kernels 200 --format ascend kineto
    .venv/bin/python bench/bench_scale.py --ranks 8 32 --format ascend ascend-db  # text vs .db
    .venv/bin/python bench/bench_scale.py --ranks 1024 --kernels 24 --format kineto --keep /tmp/b
    .venv/bin/python bench/bench_scale.py --ranks 8 --kernels 190 950 3850 --format kineto \
        --mode local dask --keep /tmp/b
    .venv/bin/python bench/bench_scale.py --ranks 8 8 --kernels 190 3850 --format kineto \
        --mode command command-dask --keep /tmp/b
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_load import measure, measure_command

REPO = Path(__file__).resolve().parents[1]
TIMED = {"local": """
import time, tracegraph
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.summary import summarize
t0 = time.perf_counter(); trace = tracegraph.load({bundle!r}, use_cache=False)
t1 = time.perf_counter(); analysis = analyze(trace); summarize(analysis); t2 = time.perf_counter()
print(int(trace.ranks["events"].sum()), len(analysis.ops), t1 - t0, t2 - t1)
""", "dask": """
import time
from tracegraph.analysis.distributed import analyze_on_cluster
from tracegraph.analysis.summary import summarize
from tracegraph.loading.distributed import dask_cluster, load_on_cluster
if __name__ == "__main__":
    with dask_cluster("local", {workers}) as client:
        t0 = time.perf_counter(); trace = load_on_cluster({bundle!r}, client, use_cache=False)
        t1 = time.perf_counter(); analysis = analyze_on_cluster(trace); summarize(analysis)
        t2 = time.perf_counter()
        print(int(trace.ranks["events"].sum()), analysis.held_ops, t1 - t0, t2 - t1)
"""}
COMMANDS = {"command": [], "command-dask": ["--dask", "local", "--jobs", "{workers}"]}


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


def run(folder: Path, ranks: int, kernels: int, fmt: str, mode: str, workers: int) -> str:
    """One row of the table: load + analyze the bundle in a fresh process (or the command)."""
    bundle = folder / f"large-{fmt}-{ranks}r-{kernels}k.tar.gz"
    if mode in COMMANDS:
        step = measure_command([sys.executable, "-m", "tracegraph", "analyze", "--json",
                                "--no-cache", *[a.format(workers=workers) for a in COMMANDS[mode]],
                                str(bundle)])
        events, ops, times = _summed_events(step.out), "-", f"{'-':>9} {'-':>9}"
    else:
        step = measure(TIMED[mode].format(bundle=str(bundle), workers=workers))
        events, ops, load_s, analyze_s = step.out.split()[-4:]
        ops, times = f"{int(ops):,}", f"{float(load_s):>7.2f} s {float(analyze_s):>7.2f} s"
    return (f"{fmt:>7} {mode:>12} {ranks:>6} {kernels:>7} {int(events):>11,} {ops:>10} {times} "
            f"{step.wall:>7.2f} s {step.cpu or 0:>7.1f} s {step.rss / 2**20:>7.0f} MiB "
            f"{step.own / 2**20:>7.0f} MiB {(step.cpu or step.wall) / int(events) * 1e6:>8.2f}")


def _summed_events(summary: str) -> int:
    """Events of every rank, from `analyze --json`'s inventory."""
    return sum(rank["events"] for rank in json.loads(summary)["ranks"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--kernels", type=int, nargs="+", default=[200],
                        help="kernels per F/B chunk: one value, or one per --ranks value")
    parser.add_argument("--format", nargs="+", choices=["ascend", "ascend-db", "kineto"],
                        default=["ascend"])
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the bundles in this folder")
    parser.add_argument("--mode", nargs="+", choices=[*TIMED, *COMMANDS], default=["local"],
                        help="analyse locally and/or on a LocalCluster (--dask local); "
                             "command[-dask]: `tracegraph analyze --json` as a user runs it")
    parser.add_argument("--workers", type=int, default=2, help="Dask workers")
    args = parser.parse_args()
    kernels = args.kernels * len(args.ranks) if len(args.kernels) == 1 else args.kernels
    if len(kernels) != len(args.ranks):
        parser.error("--kernels takes one value or one per --ranks value")
    print(f"{'format':>7} {'mode':>12} {'ranks':>6} {'kernels':>7} {'events':>11} {'ops':>10} "
          f"{'load':>9} {'analyze':>9} {'total':>9} {'cpu':>9} {'peak':>11} {'client':>11} "
          f"{'cpu µs/ev':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tracegraph-scale-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for fmt in args.format:
            for ranks, k in zip(args.ranks, kernels, strict=True):
                bundle = folder / f"large-{fmt}-{ranks}r-{k}k.tar.gz"
                took = simulate(bundle, ranks, k, fmt)
                if took:
                    print(f"(simulated {bundle.name} in {took:.0f} s)", flush=True)
                for mode in args.mode:
                    print(run(folder, ranks, k, fmt, mode, args.workers), flush=True)
                if args.keep is None:
                    bundle.unlink()


if __name__ == "__main__":
    main()
