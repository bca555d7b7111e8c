"""`tracegraph report`: the self-contained HTML waterfall report of a bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracegraph.cli import options
from tracegraph.cli.common import (
    Source,
    fit_output,
    friendly_errors,
    inputs_exist,
    out,
    pipeline_and_findings,
)
from tracegraph.cli.options import (
    Bundle,
    CacheDir,
    Dask,
    Jobs,
    NoCache,
    Quiet,
    RankMap,
    ThresholdMs,
)


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
    quiet: Quiet = False,
) -> None:
    """Write one HTML file (works offline): the verdict, waterfall per step, findings, top
    causes, and the pipeline view recovered from the trace itself (never from a simulation's
    ground truth)."""
    fit_output(quiet=quiet)
    friendly_errors(_report)(bundle, output, step, top,
                             Source(threshold_ms, cache_dir, no_cache, jobs, rank_map, dask))


def _report(bundle: Path, output: Path, step: int | None, top: int, source: Source) -> None:
    inputs_exist(bundle)
    from parsers.base import TraceError
    from parsers.text import printable
    from reports.html import write_report

    with source.cluster() as client:
        analysis = source.analysis(bundle, client)
        try:
            pipeline, findings = pipeline_and_findings(analysis, source.cache_dir,
                                                       source.no_cache, source.threshold_ms)
            path = write_report(analysis, output, step=step, top=top, pipeline=pipeline,
                                findings=findings)
        except ValueError as error:
            raise TraceError(f"{bundle}: {error}") from None
    size = path.stat().st_size / 2**20
    out.print(f"wrote {printable(str(path))} ({size:.1f} MB)", highlight=False)

