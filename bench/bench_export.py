"""Export benchmark: writing the Perfetto and Chrome timelines against the analysis they show,
measured in the same process of the same run.

Writes the `large` simulated scenario (8 ranks, PP4 × VPP2 replicas, async HSDP, one step;
`--kernels` per F/B chunk, 7,800 for the full 4 M device ops), then in a fresh process: loads it
(no cache), analyses it, lays out the timeline and writes the .pftrace, then the Chrome JSON.
For each stage: wall and CPU seconds; for each write, its ratio to the analysis, the output's
size and how much memory grew while writing (PSS of the process and its forked writers, which
share the laid-out timeline, sampled every 100 ms, against the PSS before), next to the size
of the bundle's JSON and of the Chrome JSON written: a streamed export grows by a batch per
writer, not by the trace. CPU counts the forked writers too.

    .venv/bin/python bench/bench_export.py [--kernels 7800] [--format kineto] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMED = r"""
import os, resource, sys, threading, time, psutil
import tracegraph
from tracegraph.analysis.analyze import analyze
from reports.tracks import build_timeline
from reports.perfetto_trace import write_perfetto
from reports.chrome_trace import write_chrome

me = psutil.Process()

def cpu():
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime

def pss():
    total = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            pass
    return total

def timed(work):
    peak, before, done = [0], pss(), threading.Event()
    def sample():
        while not done.wait(0.1):
            peak[0] = max(peak[0], pss())
    sampler = threading.Thread(target=sample); sampler.start()
    wall, used = time.perf_counter(), cpu()
    result = work()
    wall, used = time.perf_counter() - wall, cpu() - used
    done.set(); sampler.join()
    return result, wall, used, max(peak[0], pss()) - before

trace, *load = timed(lambda: tracegraph.load({bundle!r}, use_cache=False))
analysis, *analysed = timed(lambda: analyze(trace))
timeline, *built = timed(lambda: build_timeline(analysis))
_, *perfetto = timed(lambda: write_perfetto(timeline, {out!r} + ".pftrace"))
_, *chrome = timed(lambda: write_chrome(timeline, {out!r} + ".json"))
print(len(trace.events), len(analysis.ops), *load, *analysed, *built, *perfetto, *chrome)
"""


def simulate(out: Path, kernels: int, fmt: str) -> float:
    """Write the `large` bundle unless `out` exists; seconds it took (0 when reused)."""
    if out.exists():
        return 0.0
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "large", "-o", str(out),
                    "--format", fmt, "--steps", "1", "--kernels-per-chunk", str(kernels)],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def json_bytes(bundle: Path) -> int:
    """Uncompressed size of the bundle's JSON files (gzipped ones too)."""
    total = 0
    with tarfile.open(bundle) as archive:
        for member in archive.getmembers():
            if member.name.endswith(".json"):
                total += member.size
            elif member.name.endswith(".json.gz"):
                with gzip.open(archive.extractfile(member)) as piece:
                    while chunk := piece.read(1 << 24):
                        total += len(chunk)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=7800, help="kernels per F/B chunk")
    parser.add_argument("--format", choices=["ascend", "kineto"], default="kineto")
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the bundle in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracegraph-export-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        bundle = folder / f"large-{args.format}-8r-{args.kernels}k.tar.gz"
        generated = simulate(bundle, args.kernels, args.format)
        out = Path(tmp) / "export"
        run = subprocess.run([sys.executable, "-c", TIMED.format(bundle=str(bundle),
                                                                  out=str(out))],
                             cwd=REPO, check=True, capture_output=True, text=True)
        values = run.stdout.split()
        events, ops = int(values[0]), int(values[1])
        load, analysis, build, perfetto, chrome = (
            [float(v) for v in values[2 + 3 * i:5 + 3 * i]] for i in range(5))
        sizes = {name: (out.with_suffix(suffix)).stat().st_size
                 for name, suffix in (("perfetto", ".pftrace"), ("chrome", ".json"))}
        source = json_bytes(bundle)
        mib = 2**20
        print(f"{args.format}, 8 ranks, {args.kernels} kernels per chunk: {events:,} events, "
              f"{ops:,} timeline ops, bundle JSON {source / mib:,.0f} MiB"
              + (f" (simulated in {generated:.0f} s)" if generated else ""))
        print(f"{'stage':<18} {'wall':>9} {'CPU':>9} {'vs analysis (CPU)':>18} "
              f"{'PSS growth':>11} {'output':>10}")
        for name, (wall, cpu, grown), size in (
                ("load (no cache)", load, None), ("analysis", analysis, None),
                ("timeline layout", build, None), ("write .pftrace", perfetto,
                                                   sizes["perfetto"]),
                ("write Chrome JSON", chrome, sizes["chrome"])):
            shown = f"{size / mib:,.0f} MiB" if size else ""
            print(f"{name:<18} {wall:>8.1f}s {cpu:>8.1f}s {cpu / analysis[1]:>17.2f}× "
                  f"{grown / mib:>7.0f} MiB {shown:>10}")
        print(f"memory growth while writing vs the bundle's JSON: perfetto "
              f"{perfetto[2] / source:.3f}×, chrome {chrome[2] / source:.3f}×; vs the Chrome "
              f"JSON written: {max(perfetto[2], chrome[2]) / sizes['chrome']:.3f}×")
        if not args.keep:
            bundle.unlink()


if __name__ == "__main__":
    main()
