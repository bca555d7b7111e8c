"""Load a bundle: discover rank profiles, parse them in parallel (or take them from the cache),
and merge them into one `Trace`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa

from parsers import parse_rank
from parsers.base import GroupInfo, ParsedRank, RankFiles, TraceError
from parsers.bundle import Bundle, open_bundle
from tracegraph import cache, schema
from tracegraph.groups import groups_frame
from tracegraph.progress import Progress
from tracegraph.trace import Trace

_WORKER_BUNDLES: dict[str, Bundle] = {}


def load(
    path: str | Path,
    *,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    jobs: int | None = None,
    rank_map: dict[str, int] | None = None,
    progress: bool = False,
    executor: Executor | None = None,
) -> Trace:
    """Read every rank profile under `path` (directory, archive or file) into one `Trace`.

    Ranks are parsed in a local process pool, or on `executor` (e.g. a Dask cluster's, see
    tracegraph.distributed) when given."""
    with open_bundle(path) as bundle:
        forced = _forced_ranks(bundle.profiles, rank_map or {})
        profiles = [RankFiles(p.format, p.root, p.files, forced.get(p.root, p.rank))
                    for p in bundle.profiles]
        store = (cache_dir or cache.default_cache_dir()) if use_cache else None
        with Progress("reading ranks", total=len(profiles), enabled=progress) as bar:
            parsed = list(_parse_all(bundle, profiles, store, jobs, bar.advance, executor))
        for profile, rank in parsed:
            rank.rank = forced.get(profile.root, rank.rank)
        return _merge(Path(path), parsed, profiles, list(bundle.warnings))


def _forced_ranks(profiles: list[RankFiles], rank_map: dict[str, int]) -> dict[str, int]:
    """Profile root -> the rank the user's --rank-map gives it (keyed by root or its name)."""
    forced = {}
    for profile in profiles:
        for key in (profile.root, Path(profile.root).name):
            if key in rank_map:
                forced[profile.root] = rank_map[key]
    return forced


def _parse_all(
    bundle: Bundle,
    profiles: list[RankFiles],
    store: Path | None,
    jobs: int | None,
    advance: Callable[[], None],
    executor: Executor | None = None,
) -> Iterator[tuple[RankFiles, ParsedRank]]:
    """Yield (profile, parsed rank) for every profile, from the cache where possible."""
    todo: list[tuple[RankFiles, str]] = []
    for profile in profiles:
        key = cache.cache_key(profile.format, profile.root,
                              bundle.fingerprint(profile.files.values()))
        hit = cache.load_cached(store, key) if store else None
        if hit is not None:
            advance()
            yield profile, hit
        else:
            todo.append((profile, key))
    workers = min(jobs or os.cpu_count() or 1, len(todo))
    if executor is not None:
        yield from _parse_on(executor, bundle, todo, store, advance)
        return
    if workers <= 1:
        for profile, key, read in _sources(bundle, todo):
            yield profile, _finish(profile, parse_rank(profile, read), store, key)
            advance()
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from _parse_on(pool, bundle, todo, store, advance)


def _parse_on(pool: Executor, bundle: Bundle, todo: list[tuple[RankFiles, str]],
              store: Path | None, advance: Callable[[], None]
              ) -> Iterator[tuple[RankFiles, ParsedRank]]:
    """Parse on `pool`: workers open a random-access bundle themselves, else get the bytes."""
    futures = {}
    for profile, _key, read in _sources(bundle, todo):
        futures[profile.root] = (
            pool.submit(_parse_in_worker, str(bundle.path), profile) if bundle.random_access
            else pool.submit(_parse_bytes, profile, read.contents))
    for profile, key in todo:
        yield profile, _finish(profile, futures[profile.root].result(), store, key)
        advance()


class _Streamed:
    """A reader over the members of one profile, already read from a streamed archive."""

    def __init__(self, contents: dict[str, bytes]) -> None:
        self.contents = contents

    def __call__(self, member: str) -> bytes:
        try:
            return self.contents[member]
        except KeyError:
            raise TraceError(f"{member}: missing from the archive (truncated?)") from None


def _sources(bundle: Bundle, todo: list[tuple[RankFiles, str]]
             ) -> Iterator[tuple[RankFiles, str, Callable[[str], bytes]]]:
    """(profile, cache key, reader) for each profile: direct reads where the bundle allows random
    access, else one streaming pass over the archive that hands out each profile once complete."""
    if bundle.random_access:
        for profile, key in todo:
            yield profile, key, bundle.read
        return
    owner = {m: (p, k) for p, k in todo for m in p.files.values()}
    contents: dict[str, dict[str, bytes]] = {p.root: {} for p, _ in todo}
    for member, data in bundle.stream(set(owner)):
        profile, key = owner[member]
        got = contents[profile.root]
        got[member] = data
        if len(got) == len(profile.files):
            yield profile, key, _Streamed(contents.pop(profile.root))
    for profile, key in todo:  # members the archive did not deliver in full
        if profile.root in contents:
            yield profile, key, _Streamed(contents.pop(profile.root))


def _parse_in_worker(bundle_path: str, profile: RankFiles) -> ParsedRank:
    bundle = _WORKER_BUNDLES.get(bundle_path)
    if bundle is None:
        bundle = _WORKER_BUNDLES[bundle_path] = open_bundle(bundle_path)
    return parse_rank(profile, bundle.read)


def _parse_bytes(profile: RankFiles, contents: dict[str, bytes]) -> ParsedRank:
    return parse_rank(profile, _Streamed(contents))


def _finish(profile: RankFiles, parsed: ParsedRank, store: Path | None, key: str) -> ParsedRank:
    if store is not None:
        cache.store(store, key, parsed)
    return parsed


def _merge(source: Path, parsed: list[tuple[RankFiles, ParsedRank]],
           profiles: list[RankFiles], warnings: list[str]) -> Trace:
    """One Trace from the per-rank results; duplicate ranks are an error."""
    seen: dict[int, str] = {}
    for profile, rank in parsed:
        if rank.rank in seen:
            raise TraceError(
                f"{profile.root}: duplicate rank {rank.rank} (also {seen[rank.rank]}); "
                "pass --rank-map to say which is which")
        seen[rank.rank] = profile.root
        warnings.extend(f"rank {rank.rank}: {w}" for w in rank.warnings)
    parsed.sort(key=lambda item: item[1].rank)
    tables = [_rank_column(r.events, r.rank) for _, r in parsed]
    events = pa.concat_tables(tables) if tables else schema.empty_events()
    groups: list[GroupInfo] = [g for _, r in parsed for g in r.groups]
    group_frame, group_warnings = groups_frame(groups, events)
    warnings.extend(group_warnings)
    ranks = pd.DataFrame([_rank_row(p, r) for p, r in parsed], columns=schema.RANKS.names)
    return Trace(source=source, events=events.to_pandas(types_mapper=_arrow_strings),
                 groups=group_frame,
                 ranks=ranks.astype({"rank": "int32", "world_size": "int32", "events": "int64",
                                     "clock_base_ns": "int64", "clock_offset_ns": "int64"}),
                 warnings=warnings)


def _rank_column(events: pa.Table, rank: int) -> pa.Table:
    """The events with `rank` set to the profile's (mapped) rank."""
    column = pa.array([rank] * events.num_rows, type=pa.int32())
    return events.set_column(events.schema.get_field_index("rank"), "rank", column)


def _rank_row(profile: RankFiles, parsed: ParsedRank) -> dict[str, object]:
    meta = parsed.meta
    return {
        "rank": parsed.rank,
        "framework": str(meta.get("framework", "")),
        "format": profile.format,
        "path": profile.root,
        "version": str(meta.get("version", "")),
        "device": str(meta.get("device", "")),
        "backend": str(meta.get("backend", "")),
        "world_size": int(meta.get("world_size") or -1),
        "clock_base_ns": int(meta.get("clock_base_ns") or 0),
        "clock_offset_ns": 0,
        "events": parsed.events.num_rows,
    }


def _arrow_strings(arrow_type: pa.DataType) -> object:
    """String columns stay Arrow-backed in pandas: a fraction of the memory of Python objects."""
    return pd.StringDtype("pyarrow") if pa.types.is_string(arrow_type) else None
