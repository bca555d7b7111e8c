"""Load a bundle: discover rank profiles, parse them in parallel (or take them from the cache),
and merge them into one `Trace`.

Each rank's table leaves its worker (and enters the cache) in the in-memory form the final
DataFrame uses: strings dictionary-coded, so the merge only concatenates chunks and the string
columns become pandas Categoricals (codes and each distinct value once). Local workers hand the
table back as an Arrow file that this process memory-maps (and that becomes the rank's cache entry
by a rename) rather than pickled through a pipe; executors such as Dask's still get it pickled."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from parsers import parse_rank
from parsers.base import (
    GroupInfo,
    ParsedRank,
    RankFiles,
    ShortOfResources,
    StopsTheRun,
    TraceError,
    local_path,
)
from parsers.bundle import Bundle, open_bundle
from parsers.text import printable
from tracegraph import schema
from tracegraph.heap import hand_back
from tracegraph.loading import cache, consistency
from tracegraph.loading.cachedir import CacheDir, default_cache_dir
from tracegraph.loading.groups import groups_frame
from tracegraph.loading.jobs import parser_count
from tracegraph.loading.resolve import settle
from tracegraph.loading.trace import Trace
from tracegraph.progress import Progress

_WORKER_BUNDLES: dict[str, Bundle] = {}
PARSE_TO_TABLE = 6  # what parsing a rank takes at its peak, in units of its table's size
_PR_SET_PDEATHSIG = 1  # prctl(2)
_STOPPING = (signal.SIGINT, signal.SIGTERM)  # the signals that end a command (cli/entry.py)
SPILL_BYTES = 64 << 20  # a streamed archive's member this big is parsed from a file, not sent


def load(
    path: str | Path,
    *,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    jobs: int | None = None,
    rank_map: dict[str, int] | None = None,
    progress: bool = False,
    executor: Executor | None = None,
    cache_folder: CacheDir | None = None,
) -> Trace:
    """Read every rank profile under `path` (directory, archive or file) into one `Trace`.

    Ranks are parsed in a local process pool, or on `executor` (e.g. a Dask cluster's, see
    tracegraph.loading.distributed) when given. The cache is `cache_folder` when given (a
    command's, shared with its analysis), else `cache_dir` (default: `default_cache_dir()`)
    unless not `use_cache`; its faults are warnings of the trace."""
    with open_bundle(path) as bundle:
        profiles, keys, forced = profiles_of(bundle, rank_map)
        notes: list[str] = []
        store = cache_folder or (CacheDir(cache_dir or default_cache_dir(), warn=notes.append)
                                 if use_cache else None)
        with Progress("reading ranks", total=len(profiles), enabled=progress) as bar:
            parsed = readable(list(_parse_all(bundle, list(zip(profiles, keys, strict=True)),
                                              store, jobs, bar.advance, executor, notes)), notes)
        for profile, rank in parsed:
            rank.rank = forced.get(profile.root, rank.rank)
        trace = _merge(Path(printable(str(path))), parsed, profiles,  # the path shown, not read
                       [*bundle.warnings, *notes])  # the bundle's: after a streamed pass
        trace.fingerprint = cache.bundle_key(keys, forced)
        return trace


def profiles_of(bundle: Bundle, rank_map: dict[str, int] | None
                ) -> tuple[list[RankFiles], list[str], dict[str, int]]:
    """The bundle's profiles with the ranks --rank-map forces, their cache keys, and what was
    forced (profile root -> rank)."""
    forced = _forced_ranks(bundle.profiles, rank_map or {})
    profiles = [replace(p, rank=forced.get(p.root, p.rank)) for p in bundle.profiles]
    keys = [cache.cache_key(p.format, p.root, bundle.fingerprint(p.files.values()))
            for p in profiles]
    return profiles, keys, forced


def _forced_ranks(profiles: list[RankFiles], rank_map: dict[str, int]) -> dict[str, int]:
    """Profile root -> the rank the user's --rank-map gives it (keyed by root or its name)."""
    forced = {}
    for profile in profiles:
        for key in (profile.root, Path(profile.root).name):
            if key in rank_map:
                forced[profile.root] = rank_map[key]
    return forced


@dataclass
class Dropped:
    """A rank's profile that did not read: the one-line error that says why."""

    why: str


Outcome = ParsedRank | Dropped


def attempt(parse: Callable[..., ParsedRank], *args: object) -> Outcome:
    """`parse(*args)`, or what its TraceError said when the profile does not read (`StopsTheRun`:
    what the machine lacked, a rank id to give, still stops the run)."""
    try:
        return parse(*args)
    except StopsTheRun:
        raise
    except TraceError as error:
        return Dropped(str(error))


def readable(outcomes: list[tuple[RankFiles, Outcome]], warnings: list[str]
             ) -> list[tuple[RankFiles, ParsedRank]]:
    """The ranks that read, each one that did not said in `warnings` (it then counts as absent);
    TraceError, the first one's, when none reads."""
    kept = [(p, r) for p, r in outcomes if isinstance(r, ParsedRank)]
    dropped = [(p, r) for p, r in outcomes if isinstance(r, Dropped)]
    if dropped and not kept:
        raise TraceError(dropped[0][1].why)
    for profile, outcome in dropped:
        rank = f"rank {profile.rank}" if profile.rank is not None else "its rank"
        warnings.append(f"{outcome.why}; {profile.root} is left out ({rank} counts as absent), "
                        "the analysis covers the other ranks")
    return kept


def _parse_all(
    bundle: Bundle,
    profiles: list[tuple[RankFiles, str]],
    store: CacheDir | None,
    jobs: int | None,
    advance: Callable[[], None],
    executor: Executor | None = None,
    notes: list[str] | None = None,
) -> Iterator[tuple[RankFiles, Outcome]]:
    """Yield (profile, parsed rank or why it did not read) for every (profile, cache key), from
    the cache where possible (a cache entry that does not read back is said in `notes` and
    parsed again); only ranks that read are stored."""
    todo: list[tuple[RankFiles, str]] = []
    for profile, key in profiles:
        hit = cache.load_cached(store, key, notes) if store else None
        if hit is not None:
            advance()
            yield profile, hit
        else:
            todo.append((profile, key))
    if not todo:  # all cached: nothing is written
        return
    workers = parser_count(jobs, [p for p, _ in todo], _member_size(bundle),
                           notes if notes is not None else [])
    if executor is not None:
        yield from _parse_on(executor, bundle, todo, store, advance)
        return
    with _handoff(store) as handoff:
        if workers <= 1:
            for n, (profile, key, read) in enumerate(sources(bundle, todo, handoff)):
                out = handoff / f"{n}.arrow"  # mapped, as a worker's: no heap holds it
                parsed = _mapped(attempt(_to_file, str(out), _parse, profile, read), out)
                _drop_spilled(read)
                yield profile, _finish(profile, parsed, store, key, out)
                advance()
            return
        gc.freeze()  # objects so far are the workers' too: a collection there would copy pages
        try:
            with parser_pool(workers) as pool:
                yield from _parse_on(pool, bundle, todo, store, advance, handoff, workers + 1)
        finally:
            gc.unfreeze()


def _member_size(bundle: Bundle) -> Callable[[str], int | None]:
    """A member's bytes where it is a file on disk, else None."""
    def size(member: str) -> int | None:
        path = local_path(bundle.read, member)
        try:
            return path.stat().st_size if path is not None else None
        except OSError:
            return None
    return size


def _handoff(store: CacheDir | None) -> AbstractContextManager[Path]:
    """Where local workers leave each rank's table for this process to map: inside the cache
    (the file then becomes the entry's by a rename), else in the system's temporary folder."""
    if store is not None:
        return store.handoff()
    return _as_path(tempfile.TemporaryDirectory(prefix="tracegraph-"))


@contextmanager
def _as_path(folder: tempfile.TemporaryDirectory) -> Iterator[Path]:
    with folder as name:
        yield Path(name)


@contextmanager
def parser_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of parser processes bound to this one (`_bound_to_parent`); stopped early (an
    error, Ctrl-C), it is killed rather than left to finish its queue."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_bound_to_parent,
                               initargs=(os.getpid() if fork else None,),
                               mp_context=multiprocessing.get_context("fork") if fork else None)
    try:
        _start_workers(pool)
        yield pool
    except BaseException:
        for process in list((pool._processes or {}).values()):  # no public way before 3.14
            process.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _start_workers(pool: ProcessPoolExecutor) -> None:
    """Fork the pool's processes now (a fork pool starts them all at its first task), Ctrl-C
    and SIGTERM held meanwhile: a handler run in the interpreter's fork callbacks would have
    its exception ignored, and the signal lost."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)
    try:
        pool.submit(os.getpid).result()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _bound_to_parent(parent: int | None) -> None:
    """A parser process's set-up: Ctrl-C is its parent's to handle, and it dies with its
    parent (Linux: PR_SET_PDEATHSIG), however the parent ends, SIGKILL included."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPPING)  # held while it was forked
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _parse_on(pool: Executor, bundle: Bundle, todo: list[tuple[RankFiles, str]],
              store: CacheDir | None, advance: Callable[[], None], handoff: Path | None = None,
              room: int | None = None) -> Iterator[tuple[RankFiles, Outcome]]:
    """Parse on `pool`: workers open a random-access bundle themselves, else get the bytes
    (big members as files spilled to `handoff`), at most `room` profiles of a streamed archive
    read ahead of the workers. With `handoff` (local workers), a worker writes the rank's table
    there as an Arrow file that this process memory-maps, instead of pickling it through a pipe
    (four copies)."""
    futures = {}
    for profile, _key, read in sources(bundle, todo, handoff):
        job = ((parse_in_worker, str(bundle.path), profile) if bundle.random_access
               else (parse_bytes, profile, read.contents))
        out = handoff / f"{len(futures)}.arrow" if handoff else None
        future = pool.submit(_to_file, str(out), *job) if out else pool.submit(*job)
        futures[profile.root] = (future, out)
        if room is not None and not bundle.random_access:
            _wait_for_room([f for f, _ in futures.values()], room)
    for profile, key in todo:
        future, out = futures[profile.root]
        parsed = attempt(future.result)
        if out is not None:
            parsed = _mapped(parsed, out)
        yield profile, _finish(profile, parsed, store, key, out)
        advance()


def _to_file(out: str, parse: Callable[..., ParsedRank], *args: object) -> ParsedRank:
    """Worker side of the file hand-off: parse, write the events to `out`, return the rest (all
    of it, the events too, when `out` cannot be written: a full disk, a file size limit)."""
    parsed = parse(*args)
    try:
        cache.write_events(parsed.events, Path(out))
    except OSError:
        Path(out).unlink(missing_ok=True)
        return parsed
    size = parsed.events.nbytes
    parsed.events = None  # type: ignore[assignment]  # the caller maps `out`
    hand_back(size * PARSE_TO_TABLE)  # what parsing the rank took, before the next one
    return parsed


def _wait_for_room(futures: list[Future], room: int) -> None:
    """Wait until fewer than `room` of `futures` are running or queued."""
    while len(pending := [f for f in futures if not f.done()]) >= room:
        wait(pending, return_when=FIRST_COMPLETED)


def _mapped(parsed: Outcome, out: Path) -> Outcome:
    """A rank handed off by `_to_file`: its events mapped from `out`, unless they came along."""
    if isinstance(parsed, ParsedRank) and parsed.events is None:
        parsed.events = cache.read_events(out)
    return parsed


class _Streamed:
    """A reader over the members of one profile, already read from a streamed archive: their
    bytes, or the file a big one was spilled to (`local_path`: parsers stream it)."""

    def __init__(self, contents: dict[str, bytes | Path]) -> None:
        self.contents = contents

    def __call__(self, member: str) -> bytes:
        try:
            data = self.contents[member]
        except KeyError:
            raise TraceError(f"{member}: missing from the archive (truncated?)") from None
        return data.read_bytes() if isinstance(data, Path) else data

    def local_path(self, member: str) -> Path | None:
        data = self.contents.get(member)
        return data if isinstance(data, Path) else None


def _drop_spilled(read: object) -> None:
    """Remove the files a streamed profile's big members were spilled to, once parsed."""
    for data in getattr(read, "contents", {}).values():
        if isinstance(data, Path):
            data.unlink(missing_ok=True)


def _spilled(data: bytes, folder: Path) -> Path:
    """`data` in a new private file of `folder`."""
    fd, name = tempfile.mkstemp(prefix="member-", dir=folder)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return Path(name)


def sources(bundle: Bundle, todo: list[tuple[RankFiles, str]], spill: Path | None = None
            ) -> Iterator[tuple[RankFiles, str, Callable[[str], bytes]]]:
    """(profile, cache key, reader) for each profile: direct reads where the bundle allows random
    access, else one streaming pass over the archive that hands out each profile once complete
    (its members of SPILL_BYTES or more written to files in `spill`, when given)."""
    if bundle.random_access:
        for profile, key in todo:
            yield profile, key, bundle.read
        return
    owners: dict[str, list[tuple[RankFiles, str]]] = {}  # a member may hold several ranks
    for p, k in todo:
        for m in set(p.files.values()):
            owners.setdefault(m, []).append((p, k))
    contents: dict[str, dict[str, bytes | Path]] = {p.root: {} for p, _ in todo}
    for member, data in bundle.stream(set(owners)):
        alone = len(owners[member]) == 1  # a file another rank reads too is never removed
        kept = _spilled(data, spill) if spill and alone and len(data) >= SPILL_BYTES else data
        del data
        for profile, key in owners[member]:
            got = contents[profile.root]
            got[member] = kept
            if len(got) == len(set(profile.files.values())):
                yield profile, key, _Streamed(contents.pop(profile.root))
        del kept
    for profile, key in todo:  # members the archive did not deliver in full
        if profile.root in contents:
            yield profile, key, _Streamed(contents.pop(profile.root))


def parse_in_worker(bundle_path: str, profile: RankFiles) -> ParsedRank:
    """Parse a profile of a random-access bundle in a worker, which opens the bundle once."""
    bundle = _WORKER_BUNDLES.get(bundle_path)
    if bundle is None:
        bundle = _WORKER_BUNDLES[bundle_path] = open_bundle(bundle_path)
    return _parse(profile, bundle.read)


def parse_bytes(profile: RankFiles, contents: dict[str, bytes | Path]) -> ParsedRank:
    """Parse a profile whose members' bytes (or spilled files) were sent along (a streamed
    archive)."""
    read = _Streamed(contents)
    try:
        return _parse(profile, read)
    finally:
        _drop_spilled(read)


def _parse(profile: RankFiles, read: Callable[[str], bytes]) -> ParsedRank:
    """Parse one rank and put its table in the in-memory form (`schema.in_memory`); what
    reading its members said (a truncated member) becomes its warnings. TraceError naming it
    when memory runs out (an address-space limit, a small container)."""
    said = getattr(read, "warnings", [])
    before = len(said)
    try:
        parsed = parse_rank(profile, read)
        parsed.events = schema.in_memory(parsed.events)
    except MemoryError:
        raise ShortOfResources(f"{profile.root}: out of memory while parsing it") from None
    parsed.warnings[:0] = said[before:]
    del said[before:]
    return parsed


def _finish(profile: RankFiles, parsed: Outcome, store: CacheDir | None, key: str,
            events_file: Path | None = None) -> Outcome:
    if store is not None and isinstance(parsed, ParsedRank):
        cache.store(store, key, parsed, events_file)
    return parsed


def _merge(source: Path, parsed: list[tuple[RankFiles, ParsedRank]],
           profiles: list[RankFiles], warnings: list[str]) -> Trace:
    """One Trace from the per-rank results. What only several ranks together say (gloo groups
    and peers) is settled first; then what they must agree on is checked
    (`tracegraph.loading.consistency`). Warnings come out printable, one line each."""
    parsed = consistency.distinct_ranks(parsed, warnings)
    in_rank_order(parsed, warnings)
    warnings.extend(settle([r for _, r in parsed]))
    rows = [r.events.num_rows for _, r in parsed]
    events = _rank_tables(parsed)
    observed = pa.concat_tables(events or [schema.in_memory(schema.empty_events())])  # no copy
    return assembled(Trace, source, parsed, rows, observed, warnings, events)


def in_rank_order(parsed: list[tuple[RankFiles, ParsedRank]], warnings: list[str]) -> None:
    """Collect the ranks' warnings and sort them by rank (one profile each: see
    `consistency.distinct_ranks`)."""
    for _, rank in parsed:
        warnings.extend(f"rank {rank.rank}: {w}" for w in rank.warnings)
    parsed.sort(key=lambda item: item[1].rank)


def assembled(cls: type[Trace], source: Path, parsed: list[tuple[RankFiles, ParsedRank]],
              rows: list[int], observed: pa.Table, warnings: list[str], events: object,
              **fields: object) -> Trace:
    """The `cls` Trace of checked and settled ranks (`rows` events each; `observed` a table with
    the kind, group and rank columns of their events at least), what they must agree on checked
    (`consistency.check`); its events DataFrame is built from `events` on first use
    (`Trace.with_events_from`)."""
    ranks = pd.DataFrame([_rank_row(p, r, n) for (p, r), n in zip(parsed, rows, strict=True)],
                         columns=schema.RANKS.names)
    world = consistency.world_size(parsed, warnings)
    groups: list[GroupInfo] = [g for _, r in parsed for g in r.groups]
    group_frame, group_warnings = groups_frame(groups, observed, world)
    warnings.extend(group_warnings)
    warnings.extend(consistency.check(source, ranks, group_frame, observed, world, warnings))
    return cls.with_events_from(
        events, source=source, groups=group_frame, memory=_concat_memory(parsed),
        warnings=[printable(w) for w in warnings], **fields,
        ranks=ranks.astype({"rank": "int32", "world_size": "int32", "events": "int64",
                            "clock_base_ns": "int64", "clock_offset_ns": "int64",
                            "device_memory": "int64"}))


def _rank_tables(parsed: list[tuple[RankFiles, ParsedRank]]) -> list[pa.Table]:
    """Each rank's events, its `rank` column set; the parsed ranks let them go, so the Trace
    holds the only reference and can drop each once copied into its DataFrame."""
    tables = [with_rank(r.events, r.rank) for _, r in parsed]
    for _, rank in parsed:
        rank.events = None  # type: ignore[assignment]  # merged: the Trace holds the rows
    return tables


def _concat_memory(parsed: list[tuple[RankFiles, ParsedRank]]) -> pd.DataFrame:
    """Every rank's memory rows (schema.MEMORY), the rank set to the profile's (mapped) one."""
    tables = [with_rank(r.memory, r.rank) for _, r in parsed
              if r.memory is not None and r.memory.num_rows]
    table = pa.concat_tables(tables) if tables else schema.empty_memory()
    return table.to_pandas(types_mapper=_arrow_strings)


def with_rank(events: pa.Table, rank: int) -> pa.Table:
    """The events with `rank` set to the profile's (mapped) rank."""
    column = pa.array(np.full(events.num_rows, rank, dtype=np.int32))
    return events.set_column(events.schema.get_field_index("rank"), "rank", column)


def _rank_row(profile: RankFiles, parsed: ParsedRank, rows: int) -> dict[str, object]:
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
        "events": rows,
        "device_memory": int(meta.get("device_memory") or schema.NO_INT),
        "incomplete": str(meta.get("incomplete", "")),
        "stated_steps": str(meta.get("stated_steps", "")),
    }



def _arrow_strings(arrow_type: pa.DataType) -> object:
    """The memory table's strings stay Arrow-backed in pandas (few rows, no Categorical needed)."""
    text = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    return pd.StringDtype("pyarrow") if text else None
