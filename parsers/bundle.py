"""Find the rank profiles in what the user points at: a directory, an archive or a single file.

Which members make up a profile is the call of the registered trace formats
(`parsers.formats.FORMATS`, see `parsers.base.Format`): while the bundle is listed, each member's
first bytes go to the formats that want them; then each format in turn takes its profiles from
the members the earlier ones left. Members are read in place through `parsers.archive`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from parsers import formats
from parsers.archive import ARCHIVE_SUFFIXES, HEAD_BYTES, Limits, Source, open_source
from parsers.base import Format, Found, RankFiles, Sniff, TraceError, name_rank, require_exists
from parsers.text import printable

Sniffs = dict[str, dict[str, Sniff]]  # member -> format name -> what its first bytes said
Kinds = dict[str, str]  # member no format takes -> what its first bytes are (`json_kind`)
RANK_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")  # Kineto's own names for its traces


class Bundle:
    """The rank profiles of one job and guarded access to the members that hold them."""

    def __init__(self, path: Path, source: Source, profiles: list[RankFiles]) -> None:
        self.path = path
        self.profiles = profiles
        self.warnings = source.warnings  # read-time warnings (truncated members) land here too
        self.random_access = source.random_access
        self.read = MemberReader(source)
        """The decompressed bytes of one member (a tar is rescanned: use `stream` for many)."""
        self._source = source

    def stream(self, members: set[str]) -> Iterator[tuple[str, bytes]]:
        """(member, bytes) of the requested members, in archive order, in one pass."""
        return self._source.stream(members)

    def fingerprint(self, members: Iterable[str]) -> str:
        """A digest that changes when any of the members (or the archive holding them) changes."""
        return self._source.fingerprint(members)

    def close(self) -> None:
        """Release open files."""
        self._source.close()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemberReader:
    """`read(member) -> bytes` over a bundle's source; `local_path(member)` names the file that
    holds a member unchanged, where there is one (a directory's), for readers such as SQLite that
    need a file."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self.warnings = source.warnings
        """What reading said (a truncated member), as the source lists it."""

    def __call__(self, member: str) -> bytes:
        return self._source.read(member)

    def local_path(self, member: str) -> Path | None:
        """The file on disk that is this member byte for byte, else None."""
        return self._source.local_path(member)


def open_bundle(path: str | Path, limits: Limits | None = None) -> Bundle:
    """Discover the rank profiles under `path`; TraceError if it is missing, unknown or empty."""
    path = Path(path)
    _check_input(path)
    source = open_source(path, limits or Limits())
    try:
        probes = source.scan(_wanted, _probe)
        sniffs = {name: said for name, (said, _) in probes.items()}
        kinds = {name: kind for name, (_, kind) in probes.items() if kind}
        profiles, notes = discover(list(source.members), sniffs, path.resolve().name, kinds)
        profiles = split(profiles, MemberReader(source))
        if not profiles:
            raise _nothing_found(path, [*source.warnings, *notes], kinds)
    except BaseException:
        source.close()
        raise
    source.warnings.extend(notes)
    return Bundle(path, source, profiles)


def _nothing_found(path: Path, warnings: list[str], kinds: Kinds) -> TraceError:
    """The error of a bundle without a profile: what the file is, for one named by itself."""
    if path.is_file() and len(kinds) == 1 and not path.name.lower().endswith(ARCHIVE_SUFFIXES):
        return TraceError(f"{path}: {next(iter(kinds.values()))}")
    families = list(dict.fromkeys(fmt.family for fmt in formats.FORMATS))
    kinds = " or ".join(families) if len(families) < 3 else (
        f"{', '.join(families[:-1])} or {families[-1]}")
    looked_for = ", ".join(fmt.looked_for for fmt in formats.FORMATS if fmt.looked_for)
    why = "".join(f"; {w}" for w in warnings[:1]) + (
        f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else "")
    return TraceError(f"{path}: no {kinds} profile found (looked for {looked_for}){why}")


def _suffixes() -> tuple[str, ...]:
    """The name endings of one-file profiles, over every format."""
    return tuple(suffix for fmt in formats.FORMATS for suffix in fmt.suffixes)


def _check_input(path: Path) -> None:
    require_exists(path)
    if path.is_dir() or (path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)):
        return
    if not (path.is_file() and path.name.lower().endswith(_suffixes())):
        raise TraceError(f"{path}: not a directory, an archive ({', '.join(ARCHIVE_SUFFIXES)}) "
                         f"or a trace file ({', '.join(_suffixes())})")


# -- sniffing (runs on the first 64 KiB of a member, while the bundle is listed) -----------------
def _readers(name: str) -> list[Format]:
    """The formats that see a member's first bytes: those wanting them, up to one enclosing it."""
    readers = []
    for fmt in formats.FORMATS:
        if fmt.wants(name):
            readers.append(fmt)
        if fmt.encloses(name):
            break
    return readers


def _wanted(name: str) -> bool:
    return bool(_readers(name))


def _probe(name: str, head: bytes) -> tuple[dict[str, Sniff], str]:
    """What each format's sniff says of a member, and what a JSON one is when none takes it."""
    said = {fmt.name: fmt.sniff(name, head) for fmt in _readers(name)}
    none = not any(s.profile for s in said.values())
    return said, json_kind(head) if none and ".json" in name.lower() else ""


def json_kind(head: bytes) -> str:
    """What a JSON-named file that no format takes is, from its first bytes (all of it when
    shorter than HEAD_BYTES): not JSON, or JSON but not a trace."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        return "empty, not a trace"
    if len(head) < HEAD_BYTES:
        try:
            json.loads(text)
        except (ValueError, RecursionError) as error:
            return f"not JSON ({str(error)[:80]})"
    if text.startswith(b"{"):
        return "JSON, but not a Kineto trace (no traceEvents)"
    if text.startswith(b"["):
        return ("a JSON array, but not a trace (Kineto writes an object with traceEvents, "
                "Ascend an array of events with decimal-string ts)")
    if len(head) < HEAD_BYTES:
        return f"JSON {printable(text.rstrip()[:20].decode('utf-8', 'replace'))}, not a trace"
    return f"not JSON (it begins {printable(repr(text[:20]))})"


# -- discovery -----------------------------------------------------------------------------------
def discover(names: list[str], sniffs: Sniffs, label: str = "",
             kinds: Kinds | None = None) -> tuple[list[RankFiles], list[str]]:
    """The profiles among the member `names`, and notes (`label`: the bundle's folder name;
    `kinds`: what the JSON members no format takes are). A profile's `root` is for messages:
    printable on one line, whatever bytes name the file."""
    notes: list[str] = []
    profiles: list[RankFiles] = []
    for fmt in formats.FORMATS:
        seen = {name: said[fmt.name] for name, said in sniffs.items() if fmt.name in said}
        found, names = (fmt.find(names, seen, label, notes) if fmt.find else
                        _one_file_profiles(fmt, names, seen))
        profiles += found
    unreadable = [name for name in names if _named_like_a_rank(name)]
    notes += [f"{printable(name)}: named like a rank's profile but unreadable: "
              f"{(kinds or {}).get(name, 'not a profile of any format read')}; left out"
              for name in unreadable]
    for kind, ignored in _ignored([n for n in names if n not in unreadable]).items():
        shown = ", ".join(ignored[:5]) + (", ..." if len(ignored) > 5 else "")
        notes.append(f"ignored {len(ignored)} {kind} file(s) that are not profiles: {shown}")
    profiles.sort(key=lambda p: (p.rank is None, p.rank or 0, p.root))
    alone = len(profiles) == 1
    return [replace(p, root=printable(p.root), alone=alone) for p in profiles], notes


def split(profiles: list[RankFiles], read: MemberReader) -> list[RankFiles]:
    """`profiles` with each that holds several ranks (a format's `split`) split into them."""
    out = []
    for profile in profiles:
        fmt = formats.named(profile.format)
        parts = fmt.split(profile, read) if fmt is not None and fmt.split else [profile]
        out += [replace(p, root=printable(p.root)) for p in parts]
    return sorted(out, key=lambda p: (p.rank is None, p.rank or 0, p.root))


def _named_like_a_rank(name: str) -> bool:
    """A one-file profile's name that says it is one: a rank's (`rank3.json`), Kineto's own."""
    lower = name.lower()
    return lower.endswith(_suffixes()) and (name_rank(name) is not None
                                            or lower.endswith(RANK_SUFFIXES))


def _ignored(names: list[str]) -> dict[str, list[str]]:
    """The members left over that are named like one-file profiles, by kind (JSON, database)."""
    found: dict[str, list[str]] = {}
    for name in names:
        if name.lower().endswith(_suffixes()):
            kind = "JSON" if ".json" in name.lower() else "database"
            found.setdefault(kind, []).append(name)
    return found


def _one_file_profiles(fmt: Format, names: list[str], sniffs: dict[str, Sniff]) -> Found:
    """The members `fmt` sniffed as profiles, one rank each (the rank they state, else their
    name's), and the other members."""
    found, left = [], []
    for name in names:
        said = sniffs.get(name, Sniff(False))
        if said.profile:
            rank = said.rank if said.rank is not None else name_rank(name)
            found.append(RankFiles(fmt.name, name, {"trace": name}, rank))
        else:
            left.append(name)
    return found, left
