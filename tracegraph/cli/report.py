"""`tracegraph report`: the self-contained HTML waterfall report of a bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracegraph.cli.common import (
    analysis_of,
    friendly_errors,
    inputs_exist,
    load_bundle,
    out,
    remember,
)
from tracegraph.cli.options import ThresholdMs


def report_command(
    bundle: Annotated[Path, typer.Argument(help="A profile folder, archive or file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")],
    step: Annotated[int | None, typer.Option(help="Only this ProfilerStep number.")] = None,
    top: Annotated[int, typer.Option(help="Top bubbles listed, and arrows drawn.")] = 10,
    threshold_ms: ThresholdMs = 1.0,
    cache_dir: Annotated[Path | None, typer.Option(help="Where parsed ranks are cached.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache."
                                           )] = False,
    jobs: Annotated[int | None, typer.Option(help="Parallel parser processes.")] = None,
    rank_map: Annotated[Path | None, typer.Option(
        help='JSON file mapping a profile (path or file name) to its rank: {"a.json": 3}.')
    ] = None,
) -> None:
    """Write one HTML file (works offline): waterfall per step, findings, top causes, and the
    pipeline view recovered from the trace itself (never from a simulation's ground truth)."""

    friendly_errors(_report)(bundle, output, step, top, threshold_ms, cache_dir, no_cache, jobs,
                             rank_map)


def _report(bundle: Path, output: Path, step: int | None, top: int, threshold_ms: float,
            cache_dir: Path | None, no_cache: bool, jobs: int | None, rank_map: Path | None
            ) -> None:
    inputs_exist(bundle)
    from parsers.base import TraceError
    from parsers.text import printable
    from reports.html import write_report
    from tracegraph.analysis.pipeline import recover

    trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map)
    analysis = analysis_of(trace, cache_dir, no_cache, threshold_ms)
    try:
        pipeline = remember(trace, cache_dir, no_cache, "pipeline",
                            {"threshold_ms": threshold_ms}, lambda: recover(analysis))
        path = write_report(analysis, output, step=step, top=top, pipeline=pipeline)
    except ValueError as error:
        raise TraceError(f"{bundle}: {error}") from None
    size = path.stat().st_size / 2**20
    out.print(f"wrote {printable(str(path))} ({size:.1f} MB)", highlight=False)

