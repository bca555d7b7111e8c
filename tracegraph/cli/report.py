"""`tracegraph report`: the self-contained HTML waterfall report of a bundle."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from tracegraph.cli import options
from tracegraph.cli.common import Source, friendly_errors, inputs_exist, out, remember
from tracegraph.cli.options import Bundle, CacheDir, Dask, Jobs, NoCache, RankMap, ThresholdMs


def report_command(
    bundle: Bundle,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")],
    step: Annotated[int | None, typer.Option(help="Only this ProfilerStep number.")] = None,
    top: Annotated[int, typer.Option(help="Top bubbles listed, and arrows drawn.")] = 10,
    threshold_ms: ThresholdMs = 1.0,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
) -> None:
    """Write one HTML file (works offline): waterfall per step, findings, top causes, and the
    pipeline view recovered from the trace itself (never from a simulation's ground truth)."""

    friendly_errors(_report)(bundle, output, step, top,
                             Source(threshold_ms, cache_dir, no_cache, jobs, rank_map, dask))


def _report(bundle: Path, output: Path, step: int | None, top: int, source: Source) -> None:
    inputs_exist(bundle)
    from parsers.base import TraceError
    from parsers.text import printable
    from reports.html import write_report
    from tracegraph.analysis.findings import find_all
    from tracegraph.analysis.pipeline import recover

    with source.cluster() as client:
        analysis = source.analysis(bundle, client)
        try:
            kept = partial(remember, analysis.trace, source.cache_dir, source.no_cache)
            options = {"threshold_ms": source.threshold_ms}
            pipeline = kept("pipeline", options, lambda: recover(analysis))
            findings = kept("findings", options, lambda: find_all(analysis, pipeline))
            path = write_report(analysis, output, step=step, top=top, pipeline=pipeline,
                                findings=findings)
        except ValueError as error:
            raise TraceError(f"{bundle}: {error}") from None
    size = path.stat().st_size / 2**20
    out.print(f"wrote {printable(str(path))} ({size:.1f} MB)", highlight=False)

