"""The `tracegraph` command line.

Heavy modules (pandas, pyarrow, the analysis) are imported inside the commands that use them,
so `tracegraph --help` and commands that need none of them start fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console

from parsers.base import TraceError
from tracegraph.options import Bundle, CacheDir, Dask, Jobs, NoCache, RankMap

if TYPE_CHECKING:
    from tracegraph.trace import Trace

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find why a distributed training step is slow.")
out = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2

F = TypeVar("F", bound=Callable[..., object])


def friendly_errors(command: F) -> F:
    """Bad input ends in one line on stderr and exit code 2, never a traceback."""

    @wraps(command)
    def run(*args: object, **kwargs: object) -> object:
        try:
            return command(*args, **kwargs)
        except (TraceError, OSError) as error:
            err.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return run  # type: ignore[return-value]


def _cluster(dask: str | None, jobs: int | None) -> AbstractContextManager[Executor | None]:
    """The Dask cluster's executor for `--dask`, else None."""
    if not dask:
        return nullcontext(None)
    from tracegraph.distributed import dask_executor

    return dask_executor(dask, jobs)


def _load(bundle: Path, cache_dir: Path | None, no_cache: bool, jobs: int | None,
          rank_map: Path | None, dask: str | None = None, executor: Executor | None = None
          ) -> Trace:
    """Load for a command: ranks parse on `executor`, else on a `--dask` cluster held for the
    load, else locally; the trace's warnings go to stderr."""
    from tracegraph.loader import load

    mapping = _read_rank_map(rank_map) if rank_map else None
    options = {"cache_dir": cache_dir, "use_cache": not no_cache, "jobs": jobs,
               "rank_map": mapping, "progress": sys.stderr.isatty()}
    if executor is not None:
        trace = load(bundle, executor=executor, **options)
    else:
        with _cluster(dask, jobs) as cluster:
            trace = load(bundle, executor=cluster, **options)
    for warning in trace.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    return trace


def _read_rank_map(path: Path) -> dict[str, int]:
    try:
        mapping = json.loads(path.read_text())
        return {str(k): int(v) for k, v in mapping.items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise TraceError(f"{path}: not a JSON object of profile -> rank ({error})") from None


@app.command()
@friendly_errors
def analyze(
    bundle: Bundle,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    step: Annotated[int | None, typer.Option(help="Only this ProfilerStep number.")] = None,
    top: Annotated[int, typer.Option(help="Bubbles to show, longest first (0: all).")] = 10,
    threshold_ms: Annotated[float, typer.Option(help="Shortest stall counted a bubble.")] = 1.0,
    inventory_only: Annotated[bool, typer.Option(
        "--inventory-only", help="Only list what the bundle holds; no analysis.")] = False,
) -> None:
    """Read every rank's profile, then explain each step's bubbles down to their root causes."""
    from reports.terminal import print_analysis
    from tracegraph.analysis import analyze as run_analysis
    from tracegraph.inventory import inventory
    from tracegraph.summary import summarize

    with _cluster(dask, jobs) as executor:
        trace = _load(bundle, cache_dir, no_cache, jobs, rank_map, executor=executor)
        analysis = None if inventory_only else run_analysis(
            trace, threshold_ms=threshold_ms, executor=executor)
    summary = inventory(trace)
    if analysis is not None:
        summary |= summarize(analysis, step=step, top=top)
        summary["warnings"] = trace.warnings + analysis.warnings
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    _print_inventory(summary)
    if not inventory_only:
        for warning in analysis.warnings:
            err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
        print_analysis(out, summary)


@app.command()
@friendly_errors
def export(
    bundle: Bundle,
    parquet: Annotated[Path, typer.Option(help="Folder for events/groups/ranks.parquet.")],
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
) -> None:
    """Write the normalized tables as Parquet (schema: tracegraph/schema.py, docs/schema.md)."""
    trace = _load(bundle, cache_dir, no_cache, jobs, rank_map, dask)
    for path in trace.to_parquet(parquet):
        out.print(f"wrote {path}", highlight=False)


@app.command()
@friendly_errors
def graph(
    bundle: Bundle,
    output: Annotated[Path, typer.Option("-o", "--output", help="FILE.graphml or FILE.json")],
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    jobs: Jobs = None,
    rank_map: RankMap = None,
) -> None:
    """Write the cross-rank dependency DAG (networkx GraphML or node-link JSON)."""
    from tracegraph.analysis import analyze as run_analysis
    from tracegraph.graph import write_graph

    trace = _load(bundle, cache_dir, no_cache, jobs, rank_map)
    written = write_graph(run_analysis(trace), output)
    out.print(f"wrote {output}: {written.number_of_nodes():,} ops, "
              f"{written.number_of_edges():,} dependencies", highlight=False)


def _print_inventory(summary: dict[str, object]) -> None:
    from rich.table import Table

    ranks = Table(title=f"{len(summary['ranks'])} ranks in {summary['source']}")
    for column in ("rank", "framework", "events", "lanes", "comm ops", "steps (ms)"):
        ranks.add_column(column, overflow="fold")
    for r in summary["ranks"]:
        lanes = ", ".join(f"{n} {k}" for k, n in r["lanes"].items())
        comm = "\n".join(f"{c['comm']}×{c['count']} @{c['group'] or '?'}" for c in r["comm_ops"])
        steps = ", ".join(f"#{k}: {v:.1f}" for k, v in r["steps"].items())
        ranks.add_row(str(r["rank"]), r["framework"], f"{r['events']:,}", lanes, comm or "-",
                      steps or "-")
    out.print(ranks)
    groups = Table(title=f"{len(summary['groups'])} groups")
    for column in ("group", "name", "dim", "size", "ranks", "source"):
        groups.add_column(column, overflow="fold")
    for g in summary["groups"]:
        members = ", ".join(map(str, g["ranks"][:16])) + (" …" if len(g["ranks"]) > 16 else "")
        groups.add_row(g["group"], g["name"] or g["desc"], g["dim"] or "-", str(g["size"]),
                       members, g["source"])
    out.print(groups)


def main() -> None:
    """Entry point for `python -m tracegraph`."""
    app()


from reports.report_cli import report_command  # noqa: E402

app.command(name="report")(report_command)

from reports.gate_cli import check_command, diff_command  # noqa: E402

app.command(name="diff")(diff_command)
app.command(name="check")(check_command)

from tracegraph.simulate.simulate_cli import simulate_command  # noqa: E402

app.command(name="simulate")(simulate_command)
