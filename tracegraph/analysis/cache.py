"""Analyses kept beside the parsed ranks: a command run again on a bundle reads what an earlier
run computed instead of computing it again.

An entry is a folder `WHAT-KEY` (`analysis-…`, `pipeline-…`) in the cache directory holding a
snapshot (tracegraph/snapshot.py) of whatever the computed value holds (every field of
`Analysis`, today's and those added later), the `Trace` it came from left out: the ranks' cache
holds that. The key digests the trace's fingerprint (its ranks' cache keys: their bytes, the
parsers' version, `--rank-map`), ANALYSIS_VERSION, the source of the code that computes an
analysis and the options that change its results (`--threshold-ms`): another value of any of
them is another entry. An entry that cannot be read (damaged, or written before its classes
changed shape) is computed again with a warning; a value that cannot be stored is said once,
and a cache that cannot be written once (`tracegraph.loading.cachedir`): the cache never stops
a run.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tracegraph import snapshot
from tracegraph.loading.cachedir import CacheDir
from tracegraph.loading.trace import Trace

ANALYSIS_VERSION = "1"
"""Bump when an entry's layout changes in a way the code digest does not show."""
_CODE = Path(__file__).resolve().parents[2]
_SOURCES = ("tracegraph", "parsers")  # every change to their code is another key

T = TypeVar("T")


@functools.cache
def code_digest() -> str:
    """A digest of the source of the modules that load, analyse and summarize a trace (the
    reports, which render what is cached, are not in it)."""
    digest = hashlib.sha256()
    for package in _SOURCES:
        for path in sorted((_CODE / package).rglob("*.py")):
            name = path.relative_to(_CODE).as_posix()
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def entry_key(trace: Trace, what: str, options: dict[str, object]) -> str | None:
    """The key of `what` (e.g. "analysis") computed from `trace` with `options`; None for a
    trace that does not come from cacheable ranks."""
    if not trace.fingerprint:
        return None
    text = json.dumps([ANALYSIS_VERSION, code_digest(), trace.fingerprint, what,
                       sorted((k, repr(v)) for k, v in options.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def remembered(trace: Trace, store: CacheDir | None, what: str, options: dict[str, object],
               compute: Callable[[], T], warn: Callable[[str], None]) -> T:
    """`compute()`, or what an earlier call with the same trace, `what` and `options` stored in
    `store` (None: compute, store nothing)."""
    key = entry_key(trace, what, options) if store is not None else None
    if store is None or key is None:
        return compute()
    name = f"{what}-{key}"
    entry = store.entry(name)
    if entry is not None:
        try:
            return snapshot.load(entry, {"trace": trace})
        except FileNotFoundError:  # evicted by another run meanwhile
            pass
        except (snapshot.SnapshotError, OSError) as error:
            warn(f"cached {what} unreadable, computed again ({error})")
            store.discard(name)
    value = compute()
    try:
        store.put(name, lambda folder: snapshot.save(value, folder, {"trace": trace}))
    except snapshot.SnapshotError as error:
        warn(f"{what} not cached: {error}")
    return value
