"""Format parsers: one module per source format, registered in `parsers.formats.FORMATS`."""

from __future__ import annotations

from parsers.base import GroupInfo, ParsedRank, RankFiles, Reader, TraceError


def parse_rank(files: RankFiles, read: Reader) -> ParsedRank:
    """Parse one rank's profile with the parser of its format."""
    from parsers import formats  # the format modules load pyarrow: `import parsers` does not

    fmt = formats.named(files.format)
    if fmt is None:
        raise TraceError(f"{files.root}: unknown profile format {files.format!r}")
    return fmt.parse(files, read)


__all__ = ["GroupInfo", "ParsedRank", "RankFiles", "Reader", "TraceError", "parse_rank"]
