"""Format parsers: one module per source format, each `parse(RankFiles, Reader) -> ParsedRank`."""

from __future__ import annotations

from importlib import import_module

from parsers.base import GroupInfo, ParsedRank, RankFiles, Reader, TraceError

FORMATS = ("kineto", "ascend")


def parse_rank(files: RankFiles, read: Reader) -> ParsedRank:
    """Parse one rank's profile with the parser of its format."""
    if files.format not in FORMATS:
        raise TraceError(f"{files.root}: unknown profile format {files.format!r}")
    return import_module(f"parsers.{files.format}").parse(files, read)


__all__ = ["FORMATS", "GroupInfo", "ParsedRank", "RankFiles", "Reader", "TraceError", "parse_rank"]
