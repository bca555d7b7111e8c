"""`tracegraph export` and `tracegraph graph`: the normalized tables and the dependency DAG."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from parsers.values import printable
from tracegraph.cli.common import friendly_errors, load_bundle, out
from tracegraph.cli.options import (
    Bundle,
    CacheDir,
    Dask,
    Jobs,
    NoCache,
    RankMap,
    milliseconds,
)


@friendly_errors
def export_command(
    bundle: Bundle,
    parquet: Annotated[Path, typer.Option(help="Folder for events/groups/ranks.parquet.")],
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
) -> None:
    """Write the normalized tables as Parquet (schema: tracegraph/schema.py, docs/schema.md)."""
    trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map, dask)
    for path in trace.to_parquet(parquet):
        out.print(f"wrote {printable(str(path))}", highlight=False)


@friendly_errors
def graph_command(
    bundle: Bundle,
    output: Annotated[Path, typer.Option("-o", "--output", help="FILE.graphml or FILE.json")],
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    jobs: Jobs = None,
    rank_map: RankMap = None,
    threshold_ms: Annotated[float, typer.Option(
        help="Shortest stall counted a bubble (ms): the edges inferred by time are those the "
             "analysis of bubbles of this size followed.", callback=milliseconds)] = 1.0,
) -> None:
    """Write the cross-rank dependency DAG (networkx GraphML or node-link JSON)."""
    from tracegraph.analysis.analyze import analyze as run_analysis
    from tracegraph.graph.export import write_graph

    trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map)
    graph = run_analysis(trace, threshold_ms=threshold_ms).graph
    written = write_graph(graph, output)
    kinds = graph.edges["kind"].value_counts()
    by_kind = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items() if n)
    out.print(f"wrote {printable(str(output))}: {written.number_of_nodes():,} ops, "
              f"{written.number_of_edges():,} dependencies ({by_kind})", highlight=False)
