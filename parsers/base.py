"""What every format parser receives and returns.

A bundle is discovered into `RankFiles` (which members of the bundle make up one rank's profile);
a parser turns the bytes of those members into a `ParsedRank`. Parsers never touch the file
system themselves: they get a `read(member) -> bytes` callable, so the same code serves a
directory, a zip and a streamed tar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept out of the import: `TraceError` alone must not load pyarrow
    import pyarrow as pa


class TraceError(Exception):
    """Bad input that stops the analysis: the message names the file and what is wrong."""


@dataclass(frozen=True)
class RankFiles:
    """The members of a bundle that hold one rank's profile."""

    format: str  # "kineto" | "ascend"
    root: str  # display path of the profile (a file or a folder) inside the bundle
    files: dict[str, str]  # role -> member path, e.g. {"trace": ".../trace_view.json"}
    rank: int | None = None  # rank id known from discovery (file name, profiler_info_N.json)


@dataclass
class GroupInfo:
    """Membership of one communicator as a rank's profile states it."""

    group: str  # id used in EVENTS.group
    name: str = ""  # comm / pg name
    desc: str = ""  # parallel group name / pg_desc ("pp", "dp", "dp_stage0", ...)
    ranks: tuple[int, ...] = ()  # global ranks (may be empty when unknown)
    source: str = ""  # "parallel_group_info", "pg_config", "Process Group Ranks", ...


@dataclass
class ParsedRank:
    """One rank's profile, normalized."""

    rank: int
    events: pa.Table  # tracegraph.schema.EVENTS
    groups: list[GroupInfo] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)  # RANKS columns: framework, version, ...
    warnings: list[str] = field(default_factory=list)


Reader = Callable[[str], bytes]
"""Returns the (decompressed) bytes of a bundle member."""
