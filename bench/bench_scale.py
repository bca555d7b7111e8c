"""Scaling benchmark: load + full analysis time and memory against ranks, on simulated bundles.

Writes the `large` scenario (PP4 × VPP2 replicas, async HSDP) at several rank counts with a
fixed number of kernels per chunk, then times `tracegraph.load` + `analyze` of each in a fresh
process. Cost should grow linearly in events: the last column (µs per event) should stay flat.

    .venv/bin/python bench/bench_scale.py [--ranks 4 8 16 32] [--kernels 200] [--format ascend]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_load import measure

REPO = Path(__file__).resolve().parents[1]


def simulate(out: Path, ranks: int, kernels: int, fmt: str) -> None:
    subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "large", "-o", str(out),
                    "--format", fmt, "--ranks", str(ranks), "--steps", "1",
                    "--kernels-per-chunk", str(kernels)], check=True, cwd=REPO,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--kernels", type=int, default=200, help="kernels per F/B chunk")
    parser.add_argument("--format", choices=["ascend", "kineto"], default="ascend")
    args = parser.parse_args()
    print(f"{'ranks':>6} {'events':>10} {'load+analyze':>13} {'peak':>10} {'µs/event':>9}")
    with tempfile.TemporaryDirectory(prefix="tracegraph-scale-") as tmp:
        for ranks in args.ranks:
            bundle = Path(tmp) / f"large-{ranks}.tar.gz"
            simulate(bundle, ranks, args.kernels, args.format)
            code = ("import tracegraph; from tracegraph.analysis import analyze; "
                    f"t = tracegraph.load({str(bundle)!r}, use_cache=False); analyze(t); "
                    "print(len(t.events))")
            wall, peak, out = measure(code)
            events = int(out)
            print(f"{ranks:>6} {events:>10,} {wall:>11.2f} s {peak / 2**20:>6.0f} MiB "
                  f"{wall / events * 1e6:>9.2f}", flush=True)
            bundle.unlink()


if __name__ == "__main__":
    main()
