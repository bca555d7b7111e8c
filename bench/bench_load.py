"""Load benchmark: tracegraph against the JSON decode floor, measured in the same run.

Builds large inputs from the real traces in ../shared/real_traces (a real Kineto rank replicated to
N ranks of ~35 MB each with shifted times; an Ascend trace_view.json scaled up the same way), then
times, each in a fresh process: `json.load` and `orjson.loads` of the same bytes (one process, one
file after another: the decode floor), tracegraph's cold load (no cache, ranks parsed in
parallel), its warm load (from the Parquet cache) and the full analysis. Prints wall time, peak
memory (the whole process tree), events/s, and ratios against orjson.

    .venv/bin/python bench/bench_load.py [--ranks 8] [--mb 35] [--format kineto|ascend|both]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "real_traces"
KINETO_SOURCE = REAL / "kineto/hta/negative_queue_length_values_check/rank0.json.gz"
ASCEND_SOURCE = REAL / "ascend/torch_npu_ddp8_level1/rank0_ascend_pt"


def build_kineto(out: Path, ranks: int, megabytes: float) -> list[Path]:
    """N copies of a real Kineto rank, each its events repeated (shifted) to ~`megabytes` MB."""
    trace = json.loads(gzip.decompress(KINETO_SOURCE.read_bytes()))
    events = trace["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(
        e["ts"] for e in events if "ts" in e)
    copies = max(1, round(megabytes * 2**20 / len(json.dumps(events))))
    paths = []
    for rank in range(ranks):
        repeated = [_shifted(e, k * span * 1.01) for k in range(copies) for e in events]
        doc = dict(trace, traceEvents=repeated)
        doc["distributedInfo"] = dict(trace.get("distributedInfo", {}), rank=rank,
                                      world_size=ranks)
        path = out / f"kineto/rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def _shifted(event: dict, by: float) -> dict:
    if "ts" not in event or event.get("ph") == "M":
        return event
    return dict(event, ts=round(event["ts"] + by, 3))


def build_ascend(out: Path, ranks: int, megabytes: float) -> list[Path]:
    """N rank folders whose trace_view.json repeats a real one (times shifted) to ~`megabytes`."""
    events = json.loads((ASCEND_SOURCE / "ASCEND_PROFILER_OUTPUT/trace_view.json").read_bytes())
    timed = [float(e["ts"]) for e in events if "ts" in e and e.get("ph") != "M"]
    span = max(timed) - min(timed)
    copies = max(1, round(megabytes * 2**20 / len(json.dumps(events))))
    paths = []
    for rank in range(ranks):
        folder = out / f"ascend/rank{rank}_ascend_pt"
        (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True, exist_ok=True)
        info = json.loads((ASCEND_SOURCE / "profiler_info_0.json").read_text())
        (folder / f"profiler_info_{rank}.json").write_text(json.dumps(dict(info, rank_id=rank)))
        repeated = [e if k == 0 or e.get("ph") == "M" or "ts" not in e
                    else dict(e, ts=f"{float(e['ts']) + k * span * 1.01:.3f}")
                    for k in range(copies) for e in events]
        path = folder / "ASCEND_PROFILER_OUTPUT/trace_view.json"
        path.write_text(json.dumps(repeated))
        paths.append(path)
    return paths


def measure(code: str) -> tuple[float, int, str]:
    """Run `code` in a fresh interpreter; wall seconds, peak RSS of its process tree, stdout."""
    process = psutil.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    peak, start = 0, time.perf_counter()
    while process.poll() is None:
        try:
            tree = [process, *process.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - start
    if process.returncode:
        raise SystemExit(f"benchmark step failed: {code}")
    return wall, peak, process.stdout.read().decode().strip()


def decode_floor(paths: list[Path], module: str) -> str:
    call = {"json": "json.loads(p.read_bytes())", "orjson": "orjson.loads(p.read_bytes())"}[module]
    return (f"import {module}, json, time; from pathlib import Path\n"
            f"t = time.perf_counter(); n = 0\n"
            f"for p in {[str(p) for p in paths]!r}:\n"
            f"    p = Path(p); d = {call}\n"
            f"    n += len(d['traceEvents'] if isinstance(d, dict) else d); del d\n"
            f"print(n)")


def tracegraph_code(bundle: Path, cache: Path, analyze: bool, use_cache: bool) -> str:
    tail = "analyze(t); " if analyze else ""
    return ("import tracegraph; from tracegraph.analysis import analyze; "
            f"t = tracegraph.load({str(bundle)!r}, cache_dir=__import__('pathlib').Path("
            f"{str(cache)!r}), use_cache={use_cache}); {tail}print(len(t.events))")


def report(label: str, wall: float, peak: int, events: int, floor: float | None) -> None:
    ratio = f"{wall / floor:6.2f}×" if floor else "      "
    print(f"{label:<34} {wall:8.2f} s {peak / 2**20:9.0f} MiB {events / wall / 1e6:8.2f} M ev/s "
          f"{ratio}", flush=True)


def run(fmt: str, ranks: int, megabytes: float, workdir: Path) -> None:
    build = build_kineto if fmt == "kineto" else build_ascend
    paths = build(workdir, ranks, megabytes)
    size = sum(p.stat().st_size for p in paths)
    bundle = workdir / fmt
    print(f"\n{fmt}: {ranks} ranks, {size / 2**20:.0f} MiB of JSON, {os.cpu_count()} CPUs")
    print(f"{'':<34} {'wall':>10} {'peak':>13} {'events/s':>13} {'vs orjson':>8}")
    cache = workdir / f"cache-{fmt}"
    wall, peak, out = measure(decode_floor(paths, "orjson"))
    floor, decoded = wall, int(out)
    report("orjson.loads (decode floor)", wall, peak, decoded, floor)
    wall, peak, _ = measure(decode_floor(paths, "json"))
    report("json.loads", wall, peak, decoded, floor)
    wall, peak, out = measure(tracegraph_code(bundle, cache, False, True))
    report("tracegraph load, cold", wall, peak, decoded, floor)
    wall, peak, _ = measure(tracegraph_code(bundle, cache, False, True))
    report("tracegraph load, warm (cache)", wall, peak, decoded, floor)
    wall, peak, _ = measure(tracegraph_code(bundle, workdir / f"cold-{fmt}", True, False))
    report("tracegraph load + analyze, cold", wall, peak, decoded, floor)
    print(f"(kept {out} normalized events of {decoded} JSON events; peak memory vs JSON size: "
          f"see the peak column against {size / 2**20:.0f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=35.0, help="MiB of JSON per rank")
    parser.add_argument("--format", choices=["kineto", "ascend", "both"], default="both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracegraph-bench-") as tmp:
        for fmt in ("kineto", "ascend") if args.format == "both" else (args.format,):
            run(fmt, args.ranks, args.mb, Path(tmp))


if __name__ == "__main__":
    main()
