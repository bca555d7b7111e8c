"""Where a bundle's Ascend profiles are and which of their files play which role.

torch_npu and MindSpore write one folder per rank (`*_ascend_pt` / `*_ascend_ms`, holding
`profiler_info*.json` and `ASCEND_PROFILER_OUTPUT/`); raw msprof output is a `PROF_*` folder with
`device_*/info.json.*`, on its own or inside such a folder (then it belongs to that folder).
A folder whose profiler wrote a `.db` export is read by the database parser (`DB_FORMAT`), the
others by the trace_view.json / msprof_*.json parser, or from kernel_details.csv /
op_summary_*.csv when they hold no trace. A trace outside any profile folder (one rank's file
handed over on its own) is a profile by itself; so is a database, found by the database format
(`sniff_db`).
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from collections.abc import Callable, Collection

from parsers.ascend_memory import ROLES as MEMORY_ROLES
from parsers.base import Found, RankFiles, Sniff, name_rank
from parsers.values import rank_id

NAME = "ascend"
DB_FORMAT = "ascend_db"  # the format of the profiles whose data is a profiler database
APO = "ASCEND_PROFILER_OUTPUT"
LOOKED_FOR = ("*_ascend_pt / *_ascend_ms folders, profiler_info*.json, ASCEND_PROFILER_OUTPUT/, "
              "PROF_*/device_*/info.json.*, a trace_view.json")
_ASCEND_DIR = re.compile(r"_ascend_(?:pt|ms)$")
_IN_PROFILE = re.compile(rf"(?:^|/)(?:{APO}|[^/]*_ascend_(?:pt|ms))/")  # a folder on the path
_PROFILER_INFO = re.compile(r"^profiler_info(?:_(\d+))?\.json$")
_RAW_INFO = re.compile(r"(?:^|/)device_\d+/info\.json\.\d+$")  # in a PROF_* folder
_RANK_ID = re.compile(rb'"rank_id"\s*:\s*"?(-?\d+)')
_APO_ROLES = {"trace_view.json": "trace", "communication.json": "communication",
              "communication_matrix.json": "matrix", "step_trace_time.csv": "step_trace",
              "kernel_details.csv": "kernels", **MEMORY_ROLES}
DB_NAME = re.compile(r"(?:^|/)(?:ascend_(?:pytorch|mindspore)_profiler(?:_(\d+))?|msprof_\d+)\.db$")
_APO_DB = re.compile(rf"^{APO}/ascend_(?:pytorch|mindspore)_profiler(?:_\d+)?\.db$")
_RAW = r"^(?:PROF_[^/]*/)?"  # raw msprof files sit in the profile folder or one PROF_* below
_RAW_TRACE = re.compile(_RAW + r"mindstudio_profiler_output/msprof_[^/]*\.json$")
_RAW_SIDES = ((re.compile(_RAW + r"analyze/communication\.json$"), "communication"),
              (re.compile(_RAW + r"analyze/communication_matrix\.json$"), "matrix"),
              (re.compile(_RAW + r"device_\d+/info\.json\.\d+$"), "info"),
              (re.compile(_RAW + r"msprof_\d+\.db$"), "db"),
              (re.compile(_RAW + r"mindstudio_profiler_output/op_summary_[^/]*\.csv$"), "kernels"))
_DATA_ROLES = ("trace", "communication", "matrix", "step_trace", "db", "kernels")
_SQLITE = b"SQLite format 3\x00"
_ASCEND_TRACE = re.compile(rb'^\s*\[\s*\{.*?(?:"ts"\s*:\s*"\d+\.\d+"|"Ascend Hardware")', re.S)


def recognizes(folder: str, items: Collection[str]) -> bool:
    """Whether a folder (its path; the bundle's name for the bundle itself) holding `items` (its
    files and `sub/` folders) is a torch_npu / MindSpore profile folder. Raw `PROF_*` folders are
    found by their `device_*/info.json.*` files instead (see `find`)."""
    return bool(_ASCEND_DIR.search(folder) or APO + "/" in items
                or any(_PROFILER_INFO.match(item) for item in items))


def wants(name: str) -> bool:
    """Raw msprof `device_*/info.json.*` files (their first bytes state the rank), and JSON
    files outside profile folders (one may be a rank's trace on its own)."""
    alone = name.lower().endswith(".json") and not _IN_PROFILE.search(name)
    return alone or bool(_RAW_INFO.search(name))


def sniff(name: str, head: bytes) -> Sniff:
    """The `rank_id` an info.json.N states (-1, msprof's "unknown", gives None); whether a JSON
    file is an Ascend trace (a JSON array of events with decimal-string `ts`, or with the
    "Ascend Hardware" layer), and the rank its name states."""
    if _RAW_INFO.search(name):
        found = _RANK_ID.search(head)
        return Sniff(False, rank_id(int(found.group(1))) if found else None)
    return Sniff(bool(_ASCEND_TRACE.match(head)), name_rank(name))


def wants_db(name: str) -> bool:
    """Databases: their first page says whether they are a profiler's."""
    return name.lower().endswith(".db")


def sniff_db(name: str, head: bytes) -> Sniff:
    """Whether a database is an Ascend profiler's (its name, even if damaged: the parser says
    what is wrong; or an SQLite file whose schema, on its first page, has a TASK table), and the
    rank its name states."""
    named = DB_NAME.search(name)
    profile = bool(named) or (head.startswith(_SQLITE) and b"CREATE TABLE TASK" in head)
    rank = named.group(1) if named else None
    return Sniff(profile, rank_id(rank) if rank else name_rank(name))


def encloses(name: str) -> bool:
    """Members that by their path lie in an Ascend profile: no other format need read them."""
    return bool(_IN_PROFILE.search(name))


def find(names: list[str], sniffs: dict[str, Sniff], label: str, notes: list[str]) -> Found:
    """The Ascend profiles among `names` (one per rank), and the members outside them."""
    roots = _profile_roots(names, label)
    owned: dict[str, list[str]] = defaultdict(list)
    loose = []
    for name in names:
        owner = _owner(name, roots)
        (loose if owner is None else owned[owner]).append(name)
    found = [p for root in sorted(owned) if (p := _profile(root, owned[root], sniffs, notes))]
    alone = [name for name in loose if name in sniffs and sniffs[name].profile]
    found += [_single(name, sniffs[name]) for name in alone]
    return latest_per_rank(found, notes), [name for name in loose if name not in alone]


def _single(name: str, said: Sniff) -> RankFiles:
    """One rank's trace handed over on its own."""
    return RankFiles(NAME, name, {"trace": name}, said.rank)


def _profile_roots(names: list[str], label: str) -> dict[str, bool]:
    """Profile folders ("" = the bundle root) -> True for recognized ones, False for raw PROF_."""
    held: dict[str, set[str]] = defaultdict(set)  # folder -> its files and "sub/" folders
    for name in names:
        folder, base = posixpath.split(name)
        held[folder].add(base)
        while folder:
            folder, sub = posixpath.split(folder)
            held[folder].add(sub + "/")
    roots = {d: True for d, items in held.items() if recognizes(d or label, items)}
    for name in filter(_RAW_INFO.search, names):
        prof = posixpath.dirname(posixpath.dirname(name))
        if posixpath.basename(prof or label).startswith("PROF_"):
            roots.setdefault(prof, False)
    return roots


def _owner(name: str, roots: dict[str, bool]) -> str | None:
    """The profile folder holding a member: the nearest recognized one, else the nearest PROF_."""
    folder, nearest = posixpath.dirname(name), None
    while True:
        if roots.get(folder):
            return folder
        if folder in roots and nearest is None:
            nearest = folder
        if not folder:
            return nearest
        folder = posixpath.dirname(folder)


def _profile(root: str, names: list[str], sniffs: dict[str, Sniff],
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
        db = next((rel[sub] for sub in sorted(rel) if _APO_DB.match(sub)), None)
        files |= {"db": db} if db else {}
    else:
        files = _raw_roles(rel) | files
    display = root or "."
    if not any(role.partition(".")[0] in _DATA_ROLES for role in files):
        notes.append(f"{display}: Ascend profile folder without trace or communication data; "
                     "skipped")
        return None
    files = _timeline(files)
    return RankFiles(DB_FORMAT if "db" in files else NAME, display, files,
                     _rank(info, names, sniffs))


def _timeline(files: dict[str, str]) -> dict[str, str]:
    """`files` less the timelines that will not be read: a database holds all a trace does, a
    trace all the kernel table does."""
    unread = ("trace", "kernels") if "db" in files else ("kernels",) if "trace" in files else ()
    return {role: member for role, member in files.items()
            if role.partition(".")[0] not in unread}


def _raw_roles(rel: dict[str, str]) -> dict[str, str]:
    """Roles of raw msprof output, in this folder or in a `PROF_*` folder below it."""
    traces = sorted((sub for sub in rel if _RAW_TRACE.match(sub)), key=_natural)
    files = {"trace" if i == 0 else f"trace.{i}": rel[sub] for i, sub in enumerate(traces)}
    for pattern, role in _RAW_SIDES:
        found = next((sub for sub in rel if pattern.match(sub)), None)
        if found:
            files[role] = rel[found]
    return files


def _rank(info: str | None, names: list[str], sniffs: dict[str, Sniff]) -> int | None:
    """The rank in the name `profiler_info_{rank}.json`, else a raw info.json.N's `rank_id`."""
    found = _PROFILER_INFO.match(info or "")
    if found and found.group(1):
        return rank_id(found.group(1))
    stated = (sniffs[name].rank for name in names
              if name in sniffs and (_RAW_INFO.search(name) or DB_NAME.search(name)))
    return next((rank for rank in stated if rank is not None), None)


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def latest_per_rank(profiles: list[RankFiles], notes: list[str],
                    stamp: Callable[[str], int] | None = None) -> list[RankFiles]:
    """One Ascend profile per rank: the latest by its folder's timestamp (`stamp` of its root,
    default `timestamp`), as msprof-analyze does."""
    stamp = stamp or timestamp
    by_rank: dict[int | None, list[RankFiles]] = defaultdict(list)
    for profile in profiles:
        by_rank[profile.rank].append(profile)
    kept = by_rank.pop(None, [])
    for rank, group in by_rank.items():
        latest = max(group, key=lambda p: (stamp(p.root), p.root))
        kept.append(latest)
        if len(group) > 1:
            why = ("the latest by folder timestamp" if stamp(latest.root) >= 0 else
                   "the last by name (no timestamp in the folder names)")
            notes.append(f"rank {rank} has {len(group)} Ascend profiles "
                         f"({', '.join(p.root for p in group)}); kept {latest.root}, {why}")
    return kept


def timestamp(root: str) -> int:
    """The timestamp in `{worker}_{timestamp}_ascend_pt` or `PROF_{n}_{timestamp}_{x}`, else -1."""
    parts = posixpath.basename(root).split("_")
    field = -3 if _ASCEND_DIR.search(root) else -2 if parts[0] == "PROF" else None
    stamp = parts[field] if field is not None and len(parts) >= -field else ""
    return int(stamp) if stamp.isdigit() and len(stamp) >= 8 else -1  # not a rank like rank_0_
