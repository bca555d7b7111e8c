"""`tracegraph export` and `tracegraph graph`: the normalized tables, the timeline for Perfetto UI
and chrome://tracing, and the dependency DAG."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from parsers.base import TraceError
from parsers.text import printable
from tracegraph.cli import options
from tracegraph.cli.common import (
    analysis_of,
    cluster,
    friendly_errors,
    inputs_exist,
    load_bundle,
    out,
)
from tracegraph.cli.options import (
    Bundle,
    CacheDir,
    Dask,
    Jobs,
    NoCache,
    RankMap,
    ThresholdMs,
    milliseconds,
)

if TYPE_CHECKING:
    from tracegraph.analysis.analyze import Analysis


@friendly_errors
def export_command(
    bundle: Bundle,
    parquet: Annotated[Path | None, typer.Option(
        help="Folder for events/groups/ranks.parquet.")] = None,
    perfetto: Annotated[Path | None, typer.Option(
        help="FILE.pftrace for Perfetto UI: every rank on the aligned clock, with tracks for "
             "the bubbles, the critical path and the top bubbles' causal chains.")] = None,
    chrome: Annotated[Path | None, typer.Option(
        help="FILE.json: the same as Chrome trace-event JSON (chrome://tracing).")] = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    top: Annotated[int, typer.Option(help="Bubbles whose causal chain is drawn as flows.")] = 10,
    threshold_ms: ThresholdMs = 1.0,
) -> None:
    """Write the normalized tables as Parquet (schema: docs/schema.md) and the timeline with the
    verdict for Perfetto UI (--perfetto) or chrome://tracing (--chrome)."""
    if not (parquet or perfetto or chrome):
        raise TraceError("export: name at least one of --parquet DIR, --perfetto FILE.pftrace, "
                         "--chrome FILE.json")
    inputs_exist(bundle)
    with cluster(dask, jobs) as client:
        trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map, client)
        if parquet:
            for path in trace.to_parquet(parquet):
                out.print(f"wrote {printable(str(path))}", highlight=False)
        if perfetto or chrome:
            analysis = analysis_of(trace, cache_dir, no_cache, threshold_ms)
            _export_timeline(analysis, perfetto, chrome, top, jobs)


def _export_timeline(analysis: Analysis, perfetto: Path | None, chrome: Path | None, top: int,
                     jobs: int | None) -> None:
    from reports.chrome_trace import write_chrome
    from reports.perfetto_trace import write_perfetto
    from reports.tracks import build_timeline

    timeline = build_timeline(analysis, top=top)
    for path, write, unit in ((perfetto, write_perfetto, "packets"),
                              (chrome, write_chrome, "trace events")):
        if path:
            count = write(timeline, path, jobs)
            out.print(f"wrote {printable(str(path))}: {count:,} {unit}, "
                      f"{timeline.events:,} profile events, "
                      f"{path.stat().st_size / 2**20:.1f} MB", highlight=False)


@friendly_errors
def graph_command(
    bundle: Bundle,
    output: Annotated[Path, typer.Option("-o", "--output", help="FILE.graphml or FILE.json")],
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    threshold_ms: Annotated[float, typer.Option(
        help="Shortest stall counted a bubble (ms): the edges inferred by time are those the "
             "analysis of bubbles of this size followed.", callback=milliseconds)] = 1.0,
) -> None:
    """Write the cross-rank dependency DAG (networkx GraphML or node-link JSON)."""
    inputs_exist(bundle)
    from tracegraph.graph.export import write_graph

    with cluster(dask, jobs) as client:
        trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map, client)
        graph = analysis_of(trace, cache_dir, no_cache, threshold_ms).graph
    written = write_graph(graph, output)
    kinds = graph.edges["kind"].value_counts()
    by_kind = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items() if n)
    out.print(f"wrote {printable(str(output))}: {written.number_of_nodes():,} ops, "
              f"{written.number_of_edges():,} dependencies ({by_kind})", highlight=False)
