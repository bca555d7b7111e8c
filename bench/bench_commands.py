"""Warm against cold, per command: what the caches save a user who runs analyze, report, check,
diff, export and graph on the same bundle.

Uses bench_load.py's inputs (a real Kineto rank replicated to N ranks of ~35 MB; `diff` compares
the bundle with a copy of itself in another folder, a second bundle to the cache). Each command
runs as a user runs it (`python -m tracegraph ...`, a fresh process): cold with an empty cache
folder, then warm with the one the cold run filled. Prints wall and CPU seconds (the process tree,
workers included), the peak RSS of the process tree against the JSON's size, and warm / cold.
The first row is the floor every run pays: the interpreter and the imports of a warm `analyze`.

    .venv/bin/python bench/bench_commands.py [--ranks 8] [--mb 35] [--workdir DIR]
        [--commands analyze report check diff export graph] [--dask]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench_load import Step, inputs, measure, measure_command

FLOOR = ("import tracegraph.cli.app, tracegraph.cli.common, tracegraph.loading.loader, "
         "tracegraph.analysis.analyze, tracegraph.analysis.summary, reports.terminal; print(0)")
"""The imports of a warm `tracegraph analyze` (pandas, pyarrow, numpy, rich and ours)."""


def command_lines(bundle: Path, other: Path, out: Path) -> dict[str, list[str]]:
    """Each command's arguments, writing its outputs under `out`."""
    return {
        "analyze": ["analyze", str(bundle), "--json"],
        "report": ["report", str(bundle), "-o", str(out / "report.html")],
        "check": ["check", str(bundle), "--preset", "hsdp-async-reduction",
                  "--allow-not-applicable"],
        "diff": ["diff", str(bundle), str(other), "--fail-on-regression", "off"],
        "export": ["export", str(bundle), "--parquet", str(out / "tables")],
        "graph": ["graph", str(bundle), "-o", str(out / "graph.json")],
    }


def second_bundle(paths: list[Path], workdir: Path) -> Path:
    """A copy of the bundle in another folder, files of a new time (other cache keys, so
    nothing is shared with the first): `diff`'s after side."""
    copy = workdir / "kineto-copy"
    if not copy.exists():
        shutil.copytree(paths[0].parent, copy, copy_function=shutil.copyfile)
    return copy


def row(label: str, cold: Step, warm: Step | None, json_bytes: int) -> str:
    def cells(step: Step) -> str:
        return (f"{step.wall:8.2f} s {step.cpu or 0:7.2f} s {step.rss / 2**20:7.0f} MiB "
                f"({step.rss / json_bytes:4.2f}×)")

    if warm is None:
        return f"{label:<12} {cells(cold)}"
    return (f"{label:<12} {cells(cold)} {cells(warm)} {warm.wall / cold.wall:7.2f}× "
            f"{(warm.cpu or 0) / (cold.cpu or 1):7.2f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=35.0, help="MiB of JSON per rank")
    parser.add_argument("--workdir", type=Path, help="keep the inputs here and reuse them")
    parser.add_argument("--commands", nargs="+", default=["analyze", "report", "check", "diff",
                                                           "export", "graph"])
    parser.add_argument("--dask", action="store_true", help="run each command with --dask local")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracegraph-commands-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        paths = inputs("kineto", args.ranks, args.mb, workdir)
        json_bytes = sum(p.stat().st_size for p in paths)
        lines = command_lines(paths[0].parent, second_bundle(paths, workdir), workdir / "out")
        (workdir / "out").mkdir(exist_ok=True)
        print(f"kineto: {args.ranks} ranks, {json_bytes / 2**20:.0f} MiB of JSON"
              f"{', --dask local' if args.dask else ''}; peak RSS of the process tree, "
              "(×) against the JSON")
        print(f"{'':<12} {'cold wall':>10} {'CPU':>9} {'peak':>18} {'warm wall':>10} "
              f"{'CPU':>9} {'peak':>18} {'warm/cold':>8} {'(CPU)':>8}")
        print(row("floor", measure(FLOOR), None, json_bytes), flush=True)
        for name in args.commands:
            cache = workdir / f"cache-{name}"
            shutil.rmtree(cache, ignore_errors=True)
            argv = [sys.executable, "-m", "tracegraph", *lines[name], "--cache-dir", str(cache)]
            argv += ["--dask", "local"] if args.dask else []
            cold = measure_command(argv, ok=(0, 1))
            warm = measure_command(argv, ok=(0, 1))
            print(row(name, cold, warm, json_bytes), flush=True)
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
