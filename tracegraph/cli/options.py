"""Command-line options shared by every command that reads a bundle."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from tracegraph.cli.common import set_cache_limit

Bundle = Annotated[Path, typer.Argument(help="A profile folder, archive (.tar.gz/.zip) or file.")]
CacheDir = Annotated[Path | None, typer.Option(
    help="Where parsed ranks and analyses are cached (default: $TRACEGRAPH_CACHE_DIR, else the "
         "user's cache folder, ~/.cache/tracegraph on Linux; `tracegraph cache info` shows it).")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")]
CacheSize = Annotated[str | None, typer.Option(
    help="Most the cache folder may hold, e.g. 2G; least recently used entries go first "
         "(default: $TRACEGRAPH_CACHE_SIZE, else 5G).", callback=set_cache_limit)]
Jobs = Annotated[int | None, typer.Option(
    help="Parallel parser processes (default: one per CPU, as many as the memory holds).")]
RankMap = Annotated[Path | None, typer.Option(
    help='JSON file mapping a profile (path or file name) to its rank: {"a.json": 3}.')]
Dask = Annotated[str | None, typer.Option(
    help='Parse and analyse the ranks on a Dask cluster, where they stay: "local" or a '
         'scheduler address (tcp://host:8786).')]

MIN_WIDTH = 20


def columns(value: int | None) -> int | None:
    """A --width: at least MIN_WIDTH columns."""
    if value is not None and value < MIN_WIDTH:
        raise typer.BadParameter(f"{value} columns: give {MIN_WIDTH} or more")
    return value


Width = Annotated[int | None, typer.Option(
    callback=columns, help="Wrap the output at this many columns (default: the terminal's "
                           "width; piped or redirected: lines are never wrapped).")]
Quiet = Annotated[bool, typer.Option("-q", "--quiet", help="No progress on stderr.")]

DAY_MS = 86_400_000.0


def milliseconds(value: float | None) -> float | None:
    """A duration option's value: ms from 0 to a day (not nan, not inf)."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= DAY_MS):
        raise typer.BadParameter(f"{value} is not a duration in ms from 0 to {DAY_MS:.0f}")
    return value


ThresholdMs = Annotated[float, typer.Option(help="Shortest stall counted a bubble (ms).",
                                            callback=milliseconds)]
