"""How many ranks to parse at once: as many as the CPUs allow and the memory holds.

Unless `--jobs` says, one parser process per CPU, but never more parsers than the memory the
system (or the container's limit) has available fits, each counted at the peak its biggest rank's
parse reaches: a fixed part plus a share of its files' bytes, per format, as measured (bench/
README.md). A rank whose files are not plain files on disk (an archive's members) is counted at
the fixed part. Holding back is said in a note.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from parsers.base import RankFiles

PARSE_BASE = 256 << 20  # a parser process's own memory and a rank's fixed costs, with margin
PARSE_PER_BYTE = {  # a rank's parse peak beyond PARSE_BASE, per byte of its files
    "kineto": 3.0,  # the file's bytes, its events as raw JSON slices, the columns: 2.4x measured
    "ascend": 0.6,  # streamed: the columns and the table (0.39-0.55x at 1.5-2 GiB measured)
    "ascend_db": 1.0,  # the queried tables as frames, then the table
}
DEFAULT_PER_BYTE = 3.0
_MEMINFO = Path("/proc/meminfo")
_CGROUP_LIMITS = ((Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
                  (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                   Path("/sys/fs/cgroup/memory/memory.usage_in_bytes")))


def parser_count(jobs: int | None, profiles: list[RankFiles],
                 size: Callable[[str], int | None], notes: list[str]) -> int:
    """Parser processes for `profiles`: `jobs` when given, else one per CPU that the available
    memory holds (at least one), said in `notes` when memory holds some back (`size`: a
    member's bytes, None when unknown)."""
    if jobs:
        return min(jobs, len(profiles))
    wanted = min(os.cpu_count() or 1, len(profiles))
    if wanted <= 1:
        return wanted
    need = max(parse_peak(p, size) for p in profiles)
    free = available_memory()
    if free is None or need * wanted <= free:
        return wanted
    fit = max(1, free // need)
    notes.append(f"parsing {fit} rank(s) at a time, not {wanted}: the biggest rank's parse may "
                 f"take {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB of memory is "
                 "available (--jobs sets the count)")
    return fit


def parse_peak(profile: RankFiles, size: Callable[[str], int | None]) -> int:
    """What parsing `profile` may take at its peak, in bytes."""
    per_byte = PARSE_PER_BYTE.get(profile.format, DEFAULT_PER_BYTE)
    known = sum(size(member) or 0 for member in profile.files.values())
    return PARSE_BASE + int(per_byte * known)


def available_memory() -> int | None:
    """Bytes this process may still take: the system's MemAvailable, or less where a cgroup
    limits the container; None where neither can be read."""
    found = [m for m in (_meminfo_available(), _cgroup_room()) if m is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """The container's memory limit less its use (cgroup v2, else v1); None without a limit."""
    for limit_file, usage_file in _CGROUP_LIMITS:
        try:
            limit, usage = limit_file.read_text().strip(), usage_file.read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and int(limit) < 1 << 60:  # v1's "no limit"
            return max(int(limit) - int(usage), 0)
        return None
    return None
