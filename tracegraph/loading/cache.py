"""Parsed ranks stored in a cache directory outside the user's input.

Each entry is a folder holding the rank's events as an uncompressed Arrow IPC file, already in
the in-memory layout `schema.IN_MEMORY_EVENTS`, and a small `meta.json`. A warm load memory-maps
the file: nothing is decoded or decompressed, the string columns of the DataFrame are the file's
pages (page cache, shared, reclaimable) and only the integer columns are copied when the ranks
are concatenated. The price is disk: an entry is as large as the rank's table in memory (about
130 bytes per event with its strings dictionary-coded, ~0.4x the Kineto JSON it came from); zstd
would make it smaller still but costs more CPU to read than the whole rest of a warm load.

An entry's key digests the bytes of the rank's files (`parsers.archive.content_digest`: of the
archive, for an archive), never their sizes or times, so a rank rewritten in place with its size
and time kept is parsed again. Where entries lie and how they are written, shared and capped:
`tracegraph.loading.cachedir`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from parsers.base import GroupInfo, ParsedRank
from parsers.validate import header_sound
from tracegraph import schema
from tracegraph.loading.cachedir import CacheDir

CACHE_VERSION = "13"
"""Bump when a parser's output or the entry layout changes, so stale entries are not reused."""
EVENTS_FILE = "events.arrow"
MEMORY_FILE = "memory.arrow"


class _Meta(msgspec.Struct, forbid_unknown_fields=True):
    """An entry's meta.json: what a parsed rank holds besides its events."""

    rank: int
    groups: list[GroupInfo]
    meta: dict[str, Any]
    warnings: list[str]


def cache_key(fmt: str, root: str, fingerprint: str) -> str:
    """A key that changes whenever the profile's bytes or the parser's output format change."""
    text = "\0".join((CACHE_VERSION, fmt, root, fingerprint))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def bundle_key(keys: list[str], forced: dict[str, int]) -> str:
    """What identifies a loaded bundle: its ranks' keys and the ranks `--rank-map` forced."""
    text = json.dumps([sorted(keys), sorted(forced.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_cached(cache: CacheDir, key: str, notes: list[str] | None = None) -> ParsedRank | None:
    """The parsed rank stored under `key`, or None. An entry that is there but does not read
    back as one (damaged, or written by something else) is removed, said in `notes`, so that
    the rank is parsed and stored again."""
    entry = cache.entry(key)
    if entry is None:
        return None
    try:
        meta = msgspec.json.decode((entry / "meta.json").read_bytes(), type=_Meta)
        parsed = ParsedRank(rank=meta.rank, events=read_events(entry / EVENTS_FILE),
                            groups=meta.groups, meta=meta.meta, warnings=meta.warnings,
                            memory=_read_memory(entry / MEMORY_FILE))
        if not header_sound(parsed):
            raise ValueError("values out of range in meta.json")
    except FileNotFoundError:  # evicted by another run meanwhile
        return None
    except (OSError, ValueError, msgspec.DecodeError, pa.ArrowException) as error:
        if notes is not None:
            notes.append(f"cache entry {entry} unusable ({str(error)[:200]}); parsed again")
        cache.discard(key)
        return None
    return parsed


def _read_memory(path: Path) -> pa.Table | None:
    """An entry's memory table, None when the rank had none (no file)."""
    if not path.exists():
        return None
    with pa.memory_map(os.fsencode(path)) as source:
        return pa.ipc.open_file(source).read_all()


def read_events(path: Path) -> pa.Table:
    """The table of an entry, its buffers pointing into the memory-mapped file (the map lives
    as long as they do; entries are never rewritten in place)."""
    with pa.memory_map(os.fsencode(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    if table.schema.names != schema.IN_MEMORY_EVENTS.names:
        raise ValueError(f"{path.name}: not an events table")
    return schema.in_memory(table)


def store(cache: CacheDir, key: str, parsed: ParsedRank, events_file: Path | None = None
          ) -> bool:
    """Store a parsed rank as entry `key` (whole or not at all; False when not stored).
    `events_file`, when given, already holds its events as written by `write_events`: it is
    moved, not copied."""
    meta = {
        "rank": parsed.rank,
        "groups": [asdict(g) for g in parsed.groups],
        "meta": parsed.meta,
        "warnings": parsed.warnings,
    }

    def write(folder: Path) -> None:
        if events_file is None or not _moved(events_file, folder / EVENTS_FILE):
            write_events(parsed.events, folder / EVENTS_FILE)
        if parsed.memory is not None:
            _write(parsed.memory, folder / MEMORY_FILE)
        (folder / "meta.json").write_text(json.dumps(meta))

    return cache.put(key, write)


def _moved(source: Path, target: Path) -> bool:
    try:
        source.rename(target)
    except OSError:  # e.g. on another file system
        return False
    return True


def write_events(table: pa.Table, path: Path) -> None:
    """Write an events table as an entry's (uncompressed Arrow IPC file, in-memory layout)."""
    _write(schema.in_memory(table), path)


def _write(table: pa.Table, path: Path) -> None:
    with pa.OSFile(os.fsencode(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
