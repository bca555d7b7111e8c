"""Find the rank profiles in what the user points at: a directory, an archive or a single file.

Ascend profiles are folders (`*_ascend_pt` / `*_ascend_ms`, a folder with `profiler_info*.json` or
`ASCEND_PROFILER_OUTPUT/`, or a raw msprof `PROF_*` folder); Kineto profiles are single JSON files
whose head looks like a Chrome trace. Members are read in place through `parsers.archive`.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from parsers.archive import ARCHIVE_SUFFIXES, Limits, Source, open_source
from parsers.base import RankFiles, TraceError

APO = "ASCEND_PROFILER_OUTPUT"
_KINETO_NAME = re.compile(r"\.json(?:\.gz|\.tmp)?$", re.I)
_ASCEND_DIR = re.compile(r"_ascend_(?:pt|ms)$")
_PROFILER_INFO = re.compile(r"^profiler_info(?:_(\d+))?\.json$")
_RAW_INFO = re.compile(r"(?:^|/)device_\d+/info\.json\.\d+$")  # in a PROF_* folder
_APO_ROLES = {"trace_view.json": "trace", "communication.json": "communication",
              "communication_matrix.json": "matrix", "step_trace_time.csv": "step_trace"}
_RAW = r"^(?:PROF_[^/]*/)?"  # raw msprof files sit in the profile folder or one PROF_* below
_RAW_TRACE = re.compile(_RAW + r"mindstudio_profiler_output/msprof_[^/]*\.json$")
_RAW_SIDES = ((re.compile(_RAW + r"analyze/communication\.json$"), "communication"),
              (re.compile(_RAW + r"analyze/communication_matrix\.json$"), "matrix"),
              (re.compile(_RAW + r"device_\d+/info\.json\.\d+$"), "info"))
_DATA_ROLES = ("trace", "communication", "matrix", "step_trace")
_CHROME_KEY = re.compile(rb'"(?:traceEvents|schemaVersion)"\s*:')
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*"?(\d+)')
_RANK_ID = re.compile(rb'"rank_id"\s*:\s*"?(-?\d+)')
# Only explicit rank words: never a bare number, which in kineto names is a pid or a timestamp.
_NAME_RANK = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)", re.I)
_LOOKED_FOR = ("*_ascend_pt / *_ascend_ms folders, profiler_info*.json, ASCEND_PROFILER_OUTPUT/, "
               "PROF_*/device_*/info.json.*, Kineto *.json / *.json.gz / *.json.tmp traces")

Probe = tuple[bool, int | None]  # (looks like a Kineto trace, rank it states)


class Bundle:
    """The rank profiles of one job and guarded access to the members that hold them."""

    def __init__(self, path: Path, source: Source, profiles: list[RankFiles]) -> None:
        self.path = path
        self.profiles = profiles
        self.warnings = source.warnings  # read-time warnings (truncated members) land here too
        self.random_access = source.random_access
        self._source = source

    def read(self, member: str) -> bytes:
        """The decompressed bytes of one member (a tar is rescanned: use `stream` for many)."""
        return self._source.read(member)

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


def open_bundle(path: str | Path, limits: Limits | None = None) -> Bundle:
    """Discover the rank profiles under `path`; TraceError if it is missing, unknown or empty."""
    path = Path(path)
    _check_input(path)
    source = open_source(path, limits or Limits())
    try:
        probes = source.scan(_wanted, _probe)
        profiles, notes = discover(list(source.members), probes, path.resolve().name)
        if not profiles:
            raise TraceError(f"{path}: no Ascend or Kineto profile found "
                             f"(looked for {_LOOKED_FOR})")
    except BaseException:
        source.close()
        raise
    source.warnings.extend(notes)
    return Bundle(path, source, profiles)


def _check_input(path: Path) -> None:
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")
    if path.is_dir() or (path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)):
        return
    if not (path.is_file() and _KINETO_NAME.search(path.name)):
        raise TraceError(f"{path}: not a directory, an archive ({', '.join(ARCHIVE_SUFFIXES)}) "
                         "or a trace file (.json, .json.gz, .json.tmp)")


# -- probing (runs on the first 64 KiB of a member) ----------------------------------------------
def _wanted(name: str) -> bool:
    """Members whose head discovery may need: Kineto candidates and raw msprof info files."""
    if _RAW_INFO.search(name):
        return True
    folders = name.split("/")[:-1]
    return bool(_KINETO_NAME.search(name)) and not any(
        f == APO or _ASCEND_DIR.search(f) for f in folders)


def _probe(name: str, head: bytes) -> Probe:
    if _RAW_INFO.search(name):
        found = _RANK_ID.search(head)
        rank = int(found.group(1)) if found else -1
        return False, rank if rank >= 0 else None
    if not (head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") and _CHROME_KEY.search(head)):
        return False, None
    return True, _kineto_rank(head)


def _kineto_rank(head: bytes) -> int | None:
    """`distributedInfo.rank` from a trace's head, by the Kineto parser once it exists."""
    try:
        from parsers.kineto import sniff_rank
    except ImportError:
        return _head_rank(head)
    return sniff_rank(head)


def _head_rank(head: bytes) -> int | None:
    found = _DIST_RANK.search(head)
    return int(found.group(1)) if found else None


def name_rank(name: str) -> int | None:
    """The rank a file name states (`rank3`, `rank-3`, `rank_3`, `worker3`), else None."""
    found = _NAME_RANK.search(posixpath.basename(name))
    return int(found.group(1)) if found else None


# -- discovery -----------------------------------------------------------------------------------
def discover(names: list[str], probes: dict[str, Probe],
             label: str = "") -> tuple[list[RankFiles], list[str]]:
    """The profiles among the member `names`, and notes (`label`: the bundle's folder name)."""
    roots = _profile_roots(names, label)
    owned: dict[str, list[str]] = defaultdict(list)
    loose = []
    for name in names:
        owner = _owner(name, roots)
        (loose if owner is None else owned[owner]).append(name)
    notes: list[str] = []
    ascend = [p for root in sorted(owned) if (p := _ascend(root, owned[root], probes, notes))]
    kineto, ignored = _kineto(loose, probes)
    if ignored:
        shown = ", ".join(ignored[:5]) + (", ..." if len(ignored) > 5 else "")
        notes.append(f"ignored {len(ignored)} JSON file(s) that are not profiles: {shown}")
    profiles = _latest_per_rank(ascend, notes) + kineto
    profiles.sort(key=lambda p: (p.rank is None, p.rank or 0, p.root))
    return profiles, notes


def _profile_roots(names: list[str], label: str) -> dict[str, bool]:
    """Profile folders ("" = the bundle root) -> True for Ascend ones, False for raw PROF_ ones."""
    held: dict[str, set[str]] = defaultdict(set)  # folder -> its files and "sub/" folders
    for name in names:
        folder, base = posixpath.split(name)
        held[folder].add(base)
        while folder:
            folder, sub = posixpath.split(folder)
            held[folder].add(sub + "/")
    roots = {d: True for d, items in held.items() if _is_ascend(d or label, items)}
    for name in filter(_RAW_INFO.search, names):
        prof = posixpath.dirname(posixpath.dirname(name))
        if posixpath.basename(prof or label).startswith("PROF_"):
            roots.setdefault(prof, False)
    return roots


def _is_ascend(folder: str, items: set[str]) -> bool:
    return bool(_ASCEND_DIR.search(folder) or APO + "/" in items
                or any(_PROFILER_INFO.match(f) for f in items))


def _owner(name: str, roots: dict[str, bool]) -> str | None:
    """The profile folder holding a member: the nearest Ascend one, else the nearest PROF_ one."""
    folder, nearest = posixpath.dirname(name), None
    while True:
        if roots.get(folder):
            return folder
        if folder in roots and nearest is None:
            nearest = folder
        if not folder:
            return nearest
        folder = posixpath.dirname(folder)


def _ascend(root: str, names: list[str], probes: dict[str, Probe],
            notes: list[str]) -> RankFiles | None:
    """One Ascend profile folder's roles and rank; None (with a note) when it holds no data."""
    rel = {name[len(root) + 1:] if root else name: name for name in sorted(names)}
    info = next((sub for sub in rel if _PROFILER_INFO.match(sub)), None)
    files = {"info": rel[info]} if info else {}
    if "profiler_metadata.json" in rel:
        files["metadata"] = rel["profiler_metadata.json"]
    if any(sub.startswith(APO + "/") for sub in rel):
        files |= {role: rel[f"{APO}/{base}"] for base, role in _APO_ROLES.items()
                  if f"{APO}/{base}" in rel}
    else:
        files = _raw_roles(rel) | files
    display = root or "."
    if not any(role.partition(".")[0] in _DATA_ROLES for role in files):
        notes.append(f"{display}: Ascend profile folder without trace or communication data; "
                     "skipped")
        return None
    return RankFiles("ascend", display, files, _ascend_rank(info, names, probes))


def _raw_roles(rel: dict[str, str]) -> dict[str, str]:
    """Roles of raw msprof output, in this folder or in a `PROF_*` folder below it."""
    traces = sorted((sub for sub in rel if _RAW_TRACE.match(sub)), key=_natural)
    files = {"trace" if i == 0 else f"trace.{i}": rel[sub] for i, sub in enumerate(traces)}
    for pattern, role in _RAW_SIDES:
        found = next((sub for sub in rel if pattern.match(sub)), None)
        if found:
            files[role] = rel[found]
    return files


def _ascend_rank(info: str | None, names: list[str], probes: dict[str, Probe]) -> int | None:
    """The rank in the name `profiler_info_{rank}.json`, else a raw info.json.N's `rank_id`."""
    found = _PROFILER_INFO.match(info or "")
    if found and found.group(1):
        return int(found.group(1))
    stated = (probes[name][1] for name in names if _RAW_INFO.search(name))
    return next((rank for rank in stated if rank is not None), None)


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _kineto(loose: list[str], probes: dict[str, Probe]) -> tuple[list[RankFiles], list[str]]:
    """Kineto traces among the members outside profile folders, and the other JSON files."""
    found, ignored = [], []
    for name in filter(_KINETO_NAME.search, loose):
        kineto, rank = probes[name]
        if kineto:
            found.append(RankFiles("kineto", name, {"trace": name},
                                   rank if rank is not None else name_rank(name)))
        else:
            ignored.append(name)
    return found, ignored


def _latest_per_rank(profiles: list[RankFiles], notes: list[str]) -> list[RankFiles]:
    """One Ascend profile per rank: the latest by its folder's timestamp, as msprof-analyze does."""
    by_rank: dict[int | None, list[RankFiles]] = defaultdict(list)
    for profile in profiles:
        by_rank[profile.rank].append(profile)
    kept = by_rank.pop(None, [])
    for rank, group in by_rank.items():
        latest = max(group, key=lambda p: (_timestamp(p.root), p.root))
        kept.append(latest)
        if len(group) > 1:
            why = ("the latest by folder timestamp" if _timestamp(latest.root) >= 0 else
                   "the last by name (no timestamp in the folder names)")
            notes.append(f"rank {rank} has {len(group)} Ascend profiles "
                         f"({', '.join(p.root for p in group)}); kept {latest.root}, {why}")
    return kept


def _timestamp(root: str) -> int:
    """The timestamp in `{worker}_{timestamp}_ascend_pt` or `PROF_{n}_{timestamp}_{x}`, else -1."""
    parts = posixpath.basename(root).split("_")
    field = -3 if _ASCEND_DIR.search(root) else -2 if parts[0] == "PROF" else None
    stamp = parts[field] if field is not None and len(parts) >= -field else ""
    return int(stamp) if stamp.isdigit() and len(stamp) >= 8 else -1  # not a rank like rank_0_
