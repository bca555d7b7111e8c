"""What every format parser receives and returns.

A bundle is discovered into `RankFiles` (which members of the bundle make up one rank's profile);
a parser turns the bytes of those members into a `ParsedRank`. Parsers never touch the file
system themselves: they get a `read(member) -> bytes` callable, so the same code serves a
directory, a zip and a streamed tar. A `Format` ties one format's discovery hooks and parser
together; `parsers.formats.FORMATS` lists them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # kept out of the import: `TraceError` alone must not load pyarrow
    import pyarrow as pa


# Only explicit rank words: never a bare number, which in trace file names is a pid or a timestamp.
_NAME_RANK = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)", re.I)


class TraceError(Exception):
    """Bad input that stops the analysis: the message names the file and what is wrong. Raised
    while one rank's profile is parsed, it leaves that rank out when another rank reads
    (`tracegraph.loading.loader.readable`)."""


class StopsTheRun(TraceError):
    """An error in one rank's profile that stops the run even where other ranks read: the
    profile may be sound, but the run cannot go on as asked."""


class ShortOfResources(StopsTheRun):
    """The machine, not the profile, fell short (memory, temporary space)."""


class NoRankId(StopsTheRun):
    """The profile states no rank id: the user gives it (--rank-map)."""


def require_exists(path: Path) -> None:
    """TraceError unless `path` exists (cheap: the command line checks it before its imports)."""
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")


@dataclass(frozen=True)
class RankFiles:
    """The members of a bundle that hold one rank's profile."""

    format: str  # the `Format.name` of its format: "kineto", "ascend", ...
    root: str  # display path of the profile (a file or a folder) inside the bundle
    files: dict[str, str]  # role -> member path, e.g. {"trace": ".../trace_view.json"}
    rank: int | None = None  # rank id known from discovery (file name, profiler_info_N.json)
    alone: bool = False  # the bundle's only profile: a rank it does not state is 0 (warned)


@dataclass
class GroupInfo:
    """Membership of one communicator as a rank's profile states it."""

    group: str  # id used in EVENTS.group
    name: str = ""  # comm / pg name
    desc: str = ""  # parallel group name / pg_desc ("pp", "dp", "dp_stage0", ...)
    ranks: tuple[int, ...] = ()  # global ranks (may be empty when unknown)
    source: str = ""  # "parallel_group_info", "pg_config", "Process Group Ranks", ...
    size: int = 0  # member count the profile states (pg_size, Group size, HCCL group-local
    # ranks), 0 when it states none; may exceed len(ranks) when not every member is named


@dataclass
class ParsedRank:
    """One rank's profile, normalized."""

    rank: int
    events: pa.Table  # tracegraph.schema.EVENTS
    groups: list[GroupInfo] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)  # RANKS columns: framework, version, ...
    warnings: list[str] = field(default_factory=list)
    memory: pa.Table | None = None  # tracegraph.schema.MEMORY; None when the profile has none
    damaged: dict[str, int] = field(default_factory=dict)  # raw values the parser could not use
    # and no column shows, by what they were: `parsers.validate` counts them with its own


Reader = Callable[[str], bytes]
"""Returns the (decompressed) bytes of a bundle member."""


def local_path(read: Reader, member: str) -> Path | None:
    """The file on disk that is `member` byte for byte, when `read` can name one (a directory's
    member, see `parsers.bundle.MemberReader`); None for an archive's or a compressed member."""
    locate = getattr(read, "local_path", None)
    return locate(member) if locate is not None else None


class Sniff(NamedTuple):
    """What a member's first bytes told its format while the bundle was listed."""

    profile: bool  # the member is by itself one rank's profile of that format
    rank: int | None = None  # the rank id they state


Found = tuple[list[RankFiles], list[str]]
"""A format's profiles among the members offered to it, and the members it leaves to the next."""

Finder = Callable[[list[str], dict[str, Sniff], str, list[str]], Found]
"""(members, this format's sniffs of them, the bundle's own name, notes to append to) -> Found."""


def _never(name: str) -> bool:
    return False


@dataclass(frozen=True)
class Format:
    """One trace format, as discovery (`parsers.bundle`) and `parsers.parse_rank` use it.

    While a bundle is listed, each member's first bytes go to the formats (in `FORMATS` order)
    that `wants` them, up to the first format that `encloses` the member. Then each format in
    turn takes its profiles from the members the earlier formats left (`find`), and a format that
    can hold several ranks in one profile reads it to split it (`split`).
    """

    name: str  # RankFiles.format
    looked_for: str  # what discovery looks for, named when a bundle holds no profile
    parse: Callable[[RankFiles, Reader], ParsedRank]  # one rank's profile -> ParsedRank
    wants: Callable[[str], bool]  # by its name: must `sniff` see this member's first bytes?
    sniff: Callable[[str, bytes], Sniff]  # (member, its first 64 KiB) -> what they say
    suffixes: tuple[str, ...] = ()  # lower-case name endings of one-file profiles (a bundle
    # may be one such file; unclaimed members so named are reported as ignored)
    find: Finder | None = None  # None: each member `sniff` calls a profile is one rank
    encloses: Callable[[str], bool] = _never  # by its path, the member lies in one of its profiles
    split: Callable[[RankFiles, Reader], list[RankFiles]] | None = None  # a profile holding
    # several ranks (an export of a node's processes) -> one profile per rank, reading it
    profiler: str = ""  # how users name its profiles ("Nsight Systems"); "" for the name's first
    # word ("ascend_db" -> "Ascend")

    @property
    def family(self) -> str:
        """How users name this format's profiles, in messages."""
        return self.profiler or self.name.partition("_")[0].capitalize()


def name_rank(name: str) -> int | None:
    """The rank a file name states (`rank3`, `rank-3`, `rank_3`, `worker3`), else None."""
    from parsers.values import rank_id  # values sits above base

    found = _NAME_RANK.search(posixpath.basename(name))
    return rank_id(found.group(1)) if found else None
