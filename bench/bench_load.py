"""Load benchmark: tracegraph against the JSON decode floor, measured in the same run.

Builds large inputs from the real traces in ../shared/real_traces (a real Kineto rank replicated to
N ranks of ~35 MB each with shifted times; an Ascend trace_view.json scaled up the same way), then
times, each in a fresh process: `json.load` and `orjson.loads` of the same bytes (one process, one
file after another: the decode floor), the start-up floor (interpreter + tracegraph's imports),
tracegraph's cold load (no cache, ranks parsed in parallel), its warm load (from the cache) and
what its cache keys take (a content digest of every rank's bytes, done by every load), the full
analysis, the `analyze` command as a user runs it and, given `--hta-python`, Holistic Trace
Analysis' `TraceAnalysis(trace_dir=...)` on the same Kineto files. `--format large-ascend` takes
`simulate large --format ascend` instead (8 ranks of ~1.5 GB) and times the `analyze` command on
its .tar.gz and on the folder it unpacks to. Prints wall time, CPU seconds of the process tree,
peak memory of the whole process tree (RSS summed, which counts the pages forked workers share
with their parent once per process; with --pss the PSS, which splits them; with --pages the
physical pages resident in the tree, each counted once), events/s and ratios against orjson.

    .venv/bin/python bench/bench_load.py [--ranks 8] [--mb 35]
        [--format kineto|ascend|both|large-ascend] [--hta-python /tmp/hta-venv/bin/python]
        [--workdir DIR] [--pss | --pages]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
    """N rank folders whose trace_view.json repeats a real one (times shifted) to ~`megabytes`,
    written a copy at a time (the bytes `json.dumps` of the whole list gives)."""
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
        path = folder / "ASCEND_PROFILER_OUTPUT/trace_view.json"
        with path.open("w") as file:
            for k in range(copies):
                copy = [e if k == 0 or e.get("ph") == "M" or "ts" not in e
                        else dict(e, ts=f"{float(e['ts']) + k * span * 1.01:.3f}")
                        for e in events]
                file.write(("[" if k == 0 else ", ") + json.dumps(copy)[1:-1])
            file.write("]")
        paths.append(path)
    return paths


@dataclass
class Step:
    """One measured run: wall seconds, CPU seconds (user + system) and peak RSS (bytes) of the
    process tree, summed over its processes, and, when asked, its peak with the pages they share
    counted once (`once`: PSS, or the distinct resident pages); stdout, and the peak RSS of the
    measured process alone (`own`: the client, without its workers)."""

    wall: float
    cpu: float | None
    rss: int
    once: int | None
    out: str
    own: int = 0


RSS, PSS, PAGES = "rss", "pss", "pages"  # what `measure` samples: see `_tree_memory`


def measure(code: str, python: str = sys.executable, metric: str = RSS) -> Step:
    """Run `code` in a fresh interpreter and sample its process tree's memory. RSS (summed over
    the processes) is cheap to sample; PSS and the distinct pages read each process's smaps or
    page map, which costs enough CPU on a 2-core machine to slow the run, so they are sampled
    less often and in a run of their own."""
    return measure_command([python, "-c", code], metric)


def measure_command(argv: list[str], metric: str = RSS, ok: tuple[int, ...] = (0,)) -> Step:
    """`measure` for any command line (run in the repository, stdout captured, stderr shown);
    exit codes other than `ok` stop the benchmark."""
    used = _children_cpu()
    with tempfile.TemporaryFile() as stdout:  # a pipe would block a command printing much
        process = psutil.Popen(argv, stdout=stdout, cwd=REPO)
        peak = own = 0
        start = time.perf_counter()
        while process.poll() is None:
            peak = max(peak, _tree_memory(process, metric))
            own = max(own, _own_memory(process))
            time.sleep(0.05 if metric == RSS else 0.1)
        wall, cpu = time.perf_counter() - start, _children_cpu() - used
        stdout.seek(0)
        out = stdout.read().decode().strip()
    if process.returncode not in ok:
        raise SystemExit(f"benchmark step failed ({process.returncode}): {' '.join(argv)}")
    rss, once = (peak, None) if metric == RSS else (0, peak)
    return Step(wall, cpu, rss, once, out, own)


def _own_memory(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _children_cpu() -> float:
    """CPU seconds of every waited-for descendant so far (workers a step joined included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tree_memory(process: psutil.Process, metric: str) -> int:
    """A process and its descendants' memory, 0 once it is gone: RSS or PSS summed, or
    (`PAGES`) the physical pages resident in any of them, each counted once (what the tree
    holds of the machine's memory: a forked worker's pages shared with its parent count once,
    as in PSS, and, unlike PSS, are not split with processes outside the tree)."""
    try:
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    if metric == PAGES:
        frames = [_frames(member.pid) for member in tree]
        return len(np.unique(np.concatenate(frames))) * PAGE if frames else 0
    total = 0
    for member in tree:
        try:
            total += member.memory_full_info().pss if metric == PSS else member.memory_info().rss
        except psutil.Error:
            continue
    return total


PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT, _FRAME = 1 << 63, (1 << 55) - 1  # /proc/PID/pagemap: bit 63 present, bits 0-54 PFN


def _frames(pid: int) -> np.ndarray:
    """The physical frame numbers of `pid`'s resident pages (reading them needs root: without,
    the kernel reports every frame as 0, which `pages_readable` tells)."""
    frames = []
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                pagemap.seek(lo // PAGE * 8)
                entries = np.frombuffer(pagemap.read((hi - lo) // PAGE * 8), dtype=np.uint64)
                present = entries[(entries & np.uint64(_PRESENT)) != 0]
                frames.append(present & np.uint64(_FRAME))
    except OSError:  # the process ended while read
        pass
    return np.concatenate(frames) if frames else np.zeros(0, np.uint64)


def pages_readable() -> bool:
    """Whether this process may read frame numbers from /proc/PID/pagemap (root)."""
    frames = _frames(os.getpid())
    return bool(len(frames)) and bool(frames.any())


def decode_floor(paths: list[Path], module: str) -> str:
    call = {"json": "json.loads(p.read_bytes())", "orjson": "orjson.loads(p.read_bytes())"}[module]
    return (f"import {module}, json, time; from pathlib import Path\n"
            f"t = time.perf_counter(); n = 0\n"
            f"for p in {[str(p) for p in paths]!r}:\n"
            f"    p = Path(p); d = {call}\n"
            f"    n += len(d['traceEvents'] if isinstance(d, dict) else d); del d\n"
            f"print(n)")


def tracegraph_code(bundle: Path, cache: Path, analyze: bool, use_cache: bool,
                    jobs: int | None = None) -> str:
    """Load (and analyze) `bundle` (ranks parsed in `jobs` processes: the CPUs by default, 1:
    in this process); prints the events kept and the seconds spent after the imports."""
    imports = "import tracegraph.loading.loader"
    imports += "; from tracegraph.analysis.analyze import analyze" if analyze else ""
    tail = "analyze(t); " if analyze else ""
    return (f"import time; from pathlib import Path; {imports}; s = time.perf_counter(); "
            f"t = tracegraph.loading.loader.load({str(bundle)!r}, cache_dir=Path({str(cache)!r}), "
            f"use_cache={use_cache}, jobs={jobs}); {tail}"
            f"print(len(t.events), time.perf_counter() - s)")


STARTUP = "import tracegraph.loading.loader; print(0)"


def keys_code(bundle: Path) -> str:
    """The ranks' cache keys (discovery, then a BLAKE3 digest of every rank's bytes); prints
    the seconds and CPU seconds the digests took after discovery, and the bytes digested."""
    return ("import time; from parsers.bundle import open_bundle; "
            "from tracegraph.loading.loader import profiles_of\n"
            f"bundle = open_bundle({str(bundle)!r})\n"
            "wall, cpu = time.perf_counter(), time.process_time()\n"
            "profiles_of(bundle, None)\n"
            "size = sum(bundle._source.members[m].stat().st_size for p in bundle.profiles "
            "for m in p.files.values())\n"
            "print(time.perf_counter() - wall, time.process_time() - cpu, size)")


def hta_code(bundle: Path) -> str:
    """HTA's load of every rank under `bundle` (it finds ranks by `"rank": N` in each file)."""
    return ("import logging; logging.disable(logging.CRITICAL)\n"
            "from hta.trace_analysis import TraceAnalysis\n"
            f"a = TraceAnalysis(trace_dir={str(bundle)!r})\n"
            "print(sum(len(frame) for frame in a.t.traces.values()))")


def hta_missing(python: str | None) -> str | None:
    """Why HTA cannot be measured with `python`, or None when it can."""
    if not python:
        return "no --hta-python given"
    try:
        done = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{python}: {error}"
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else f"cannot import hta: {lines[-1] if lines else '?'}"


class Table:
    """Runs and prints the steps of one format against the decode floor."""

    def __init__(self, decoded: int, once: str | None, floor: float) -> None:
        self.decoded, self.once, self.floor = decoded, once, floor

    def step(self, label: str, code: str | list[str], python: str = sys.executable,
             before: Callable[[], None] | None = None) -> Step:
        """Measure `code` (Python source, or a command line) again for its shared-once peak
        when asked (after `before`) and print the row."""
        run = self.with_once(_measured(code, python, RSS), code, python, before)
        self.row(label, run)
        return run

    def with_once(self, run: Step, code: str | list[str], python: str = sys.executable,
                  before: Callable[[], None] | None = None) -> Step:
        """`run` with the peak of a second run of `code` sampled as `self.once` (PSS or the
        distinct pages), when asked for."""
        if self.once:
            if before:
                before()
            run.once = _measured(code, python, self.once).once
        return run

    def row(self, label: str, run: Step) -> None:
        ratio = f"{run.wall / self.floor:6.2f}×" if self.floor else "      "
        once = f"{run.once / 2**20:8.0f} MiB" if run.once is not None else f"{'-':>12}"
        cpu = f"{run.cpu:7.2f} s" if run.cpu is not None else f"{'-':>9}"
        print(f"{label:<34} {run.wall:8.2f} s {cpu} {run.rss / 2**20:8.0f} MiB {once} "
              f"{self.decoded / run.wall / 1e6:8.2f} M ev/s {ratio}", flush=True)


def _measured(code: str | list[str], python: str, metric: str) -> Step:
    return measure_command(code, metric) if isinstance(code, list) else measure(code, python,
                                                                                 metric)


def analyze_command(bundle: Path) -> list[str]:
    """`tracegraph analyze --json --no-cache BUNDLE`, as a user runs it (parser processes as
    the CPUs and the memory allow)."""
    return [sys.executable, "-m", "tracegraph", "analyze", "--json", "--no-cache", str(bundle)]


def run(fmt: str, args: argparse.Namespace, workdir: Path) -> None:
    paths = inputs(fmt, args.ranks, args.mb, workdir)
    size = sum(p.stat().st_size for p in paths)
    bundle, cache = workdir / fmt, workdir / f"cache-{fmt}"
    table = against_floor(f"{fmt}: {args.ranks} ranks", paths, args.once)
    table.step("json.loads", decode_floor(paths, "json"))
    table.step("start-up (python + imports)", STARTUP)
    clear = lambda: shutil.rmtree(cache, ignore_errors=True)  # noqa: E731
    clear()
    cold = table.step("tracegraph load, cold", tracegraph_code(bundle, cache, False, True),
                      before=clear)
    warm = table.step("tracegraph load, warm (cache)", tracegraph_code(bundle, cache, False, True))
    table.row("  of which after the imports", Step(float(warm.out.split()[1]), None, warm.rss,
                                                    warm.once, warm.out))
    keys = measure(keys_code(bundle))
    key_wall, key_cpu, digested = keys.out.split()
    table.row("  of which the cache keys", Step(float(key_wall), float(key_cpu), keys.rss,
                                                  None, keys.out))
    print(f"{'':<34} (BLAKE3 of {int(digested) / 2**20:.0f} MiB: {float(key_cpu) / cold.cpu:.1%}"
          f" of the cold load's CPU, {float(key_wall) / warm.wall:.1%} of the warm load's wall)")
    table.step("tracegraph load + analyze, cold",
               tracegraph_code(bundle, workdir / f"cold-{fmt}", True, False))
    table.step("  the same, one process (--jobs 1)",
               tracegraph_code(bundle, workdir / f"cold-{fmt}", True, False, jobs=1))
    table.step("tracegraph analyze (command), cold", analyze_command(bundle))
    if fmt == "kineto":
        why = hta_missing(args.hta_python)
        if why:
            print(f"{'HTA TraceAnalysis load':<34} skipped: {why}")
        else:
            table.step("HTA TraceAnalysis load", hta_code(bundle), args.hta_python)
    print(f"(kept {cold.out.split()[0]} normalized events of {table.decoded} JSON events; "
          f"compare the peak columns with the {size / 2**20:.0f} MiB of JSON)")


def against_floor(title: str, paths: list[Path], once: str | None) -> Table:
    """The table of one input: its heading, and its first row, the decode floor of `paths`."""
    size = sum(p.stat().st_size for p in paths)
    print(f"\n{title}, {size / 2**20:.0f} MiB of JSON, {os.cpu_count()} CPUs")
    label = {None: "", PSS: "peak PSS", PAGES: "peak pages"}[once]
    print(f"{'':<34} {'wall':>10} {'CPU':>9} {'peak RSS':>12} {label:>12} {'events/s':>13} "
          f"{'vs orjson':>8}")
    floor = measure(decode_floor(paths, "orjson"))
    table = Table(int(floor.out), once, floor.wall)
    table.row("orjson.loads (decode floor)", table.with_once(floor, decode_floor(paths, "orjson")))
    return table


def run_large(args: argparse.Namespace, workdir: Path) -> None:
    """The `large` scenario in Ascend format (8 ranks of ~1.5 GB of trace_view.json): the
    decode floor of its traces, and `tracegraph analyze` of the .tar.gz `simulate` writes and
    of the folder it unpacks to."""
    archive, folder = large_inputs(workdir)
    paths = sorted(folder.rglob("trace_view.json"))
    size = sum(p.stat().st_size for p in paths)
    table = against_floor(f"large --format ascend: {len(paths)} ranks", paths, args.once)
    table.step("tracegraph analyze, the .tar.gz", analyze_command(archive))
    table.step("tracegraph analyze, the folder", analyze_command(folder))
    print(f"(compare the peak columns with the {size / 2**20:.0f} MiB of JSON)")


def large_inputs(workdir: Path) -> tuple[Path, Path]:
    """`simulate large --format ascend`'s archive and the folder it unpacks to, made unless
    `workdir` holds them."""
    archive, folder = workdir / "large-ascend.tar.gz", workdir / "large-ascend"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "large", "--format",
                        "ascend", "-o", str(archive)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
    if not folder.exists():
        partial = workdir / "large-ascend.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(folder)
    return archive, folder


def inputs(fmt: str, ranks: int, megabytes: float, workdir: Path) -> list[Path]:
    """The input files, built unless `workdir` already holds them for these settings."""
    stamp = workdir / f"{fmt}.inputs.json"
    wanted = {"ranks": ranks, "mb": megabytes}
    if stamp.exists() and json.loads(stamp.read_text()).get("settings") == wanted:
        return [Path(p) for p in json.loads(stamp.read_text())["paths"]]
    shutil.rmtree(workdir / fmt, ignore_errors=True)
    paths = (build_kineto if fmt == "kineto" else build_ascend)(workdir, ranks, megabytes)
    stamp.write_text(json.dumps({"settings": wanted, "paths": [str(p) for p in paths]}))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=35.0, help="MiB of JSON per rank")
    parser.add_argument("--format", choices=["kineto", "ascend", "both", "large-ascend"],
                        default="both", help="large-ascend: `simulate large --format ascend` "
                        "(8 ranks x ~1.5 GB), analysed from its archive and its folder")
    parser.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed "
                        "(e.g. /tmp/hta-venv/bin/python); HTA is skipped without it")
    parser.add_argument("--pss", dest="once", action="store_const", const=PSS, help="also run "
                        "each step once more to sample its tree's PSS (pages shared by forked "
                        "workers split between them)")
    parser.add_argument("--pages", dest="once", action="store_const", const=PAGES, help="also run "
                        "each step once more to sample the physical pages resident in its tree, "
                        "each counted once (needs root to read /proc/PID/pagemap)")
    parser.add_argument("--workdir", type=Path, help="keep the inputs here and reuse them "
                        "(default: a temporary folder)")
    args = parser.parse_args()
    if args.once == PAGES and not pages_readable():
        parser.error("--pages: /proc/PID/pagemap gives no frame numbers here (needs root)")
    formats = ("kineto", "ascend") if args.format == "both" else (args.format,)
    with tempfile.TemporaryDirectory(prefix="tracegraph-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for fmt in formats:
            if fmt == "large-ascend":
                run_large(args, workdir)
            else:
                run(fmt, args, workdir)


if __name__ == "__main__":
    main()
