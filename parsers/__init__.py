"""Format parsers: one module per source format, registered in `parsers.formats.FORMATS`."""

from __future__ import annotations

from parsers.base import GroupInfo, ParsedRank, RankFiles, Reader, TraceError


def parse_rank(files: RankFiles, read: Reader) -> ParsedRank:
    """Parse one rank's profile with the parser of its format; whatever the format, its output
    passes `parsers.validate` (damaged values dropped, clamped and counted in one warning)."""
    from parsers import formats, validate  # these load pyarrow: `import parsers` does not

    fmt = formats.named(files.format)
    if fmt is None:
        raise TraceError(f"{files.root}: unknown profile format {files.format!r}")
    return validate.checked(fmt.parse(files, read), files.root)


__all__ = ["GroupInfo", "ParsedRank", "RankFiles", "Reader", "TraceError", "parse_rank"]
