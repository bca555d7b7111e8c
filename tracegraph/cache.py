"""Parsed ranks stored as Parquet in a cache directory outside the user's input."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
from platformdirs import user_cache_dir

from parsers.base import GroupInfo, ParsedRank

CACHE_VERSION = "2"
"""Bump when a parser's output changes, so stale cache entries are not reused."""


def default_cache_dir() -> Path:
    """`$TRACEGRAPH_CACHE_DIR`, else the user's cache directory."""
    return Path(os.environ.get("TRACEGRAPH_CACHE_DIR") or user_cache_dir("tracegraph"))


def cache_key(fmt: str, root: str, fingerprint: str) -> str:
    """A key that changes whenever the profile's bytes or the parser's output format change."""
    text = "\0".join((CACHE_VERSION, fmt, root, fingerprint))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_cached(cache_dir: Path, key: str) -> ParsedRank | None:
    """The parsed rank stored under `key`, or None."""
    entry = cache_dir / key
    try:
        meta = json.loads((entry / "meta.json").read_text())
        events = pq.read_table(entry / "events.parquet")
    except (OSError, ValueError):
        return None
    return ParsedRank(
        rank=meta["rank"],
        events=events,
        groups=[GroupInfo(**{**g, "ranks": tuple(g["ranks"])}) for g in meta["groups"]],
        meta=meta["meta"],
        warnings=meta["warnings"],
    )


def store(cache_dir: Path, key: str, parsed: ParsedRank) -> None:
    """Store a parsed rank atomically (a crash never leaves a half-written entry)."""
    entry = cache_dir / key
    tmp = cache_dir / f".{key}.{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    pq.write_table(parsed.events, tmp / "events.parquet")
    meta = {
        "rank": parsed.rank,
        "groups": [asdict(g) for g in parsed.groups],
        "meta": parsed.meta,
        "warnings": parsed.warnings,
    }
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        tmp.rename(entry)
    except OSError:  # another process stored it first
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
