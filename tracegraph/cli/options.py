"""Command-line options shared by every command that reads a bundle."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

Bundle = Annotated[Path, typer.Argument(help="A profile folder, archive (.tar.gz/.zip) or file.")]
CacheDir = Annotated[Path | None, typer.Option(help="Where parsed ranks are cached.")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")]
Jobs = Annotated[int | None, typer.Option(
    help="Parallel parser processes (default: one per CPU, as many as the memory holds).")]
RankMap = Annotated[Path | None, typer.Option(
    help='JSON file mapping a profile (path or file name) to its rank: {"a.json": 3}.')]
Dask = Annotated[str | None, typer.Option(
    help='Parse and analyse the ranks on a Dask cluster, where they stay: "local" or a '
         'scheduler address (tcp://host:8786).')]



DAY_MS = 86_400_000.0


def milliseconds(value: float | None) -> float | None:
    """A duration option's value: ms from 0 to a day (not nan, not inf)."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= DAY_MS):
        raise typer.BadParameter(f"{value} is not a duration in ms from 0 to {DAY_MS:.0f}")
    return value


ThresholdMs = Annotated[float, typer.Option(help="Shortest stall counted a bubble (ms).",
                                            callback=milliseconds)]
