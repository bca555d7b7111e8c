"""Past one machine: a Dask cluster parses the ranks and keeps them.

`dask_cluster("local")` starts a `distributed.LocalCluster` (one single-threaded worker process
per CPU); any other value is the address of a running scheduler (`tcp://host:8786`). Workers must
see the bundle at the same path (a shared file system): each reads its ranks' members itself (of
a tar archive, in one pass of its own), and reads and writes the rank cache where it can reach it.

`load_on_cluster` leaves each rank's table on the worker that parsed it: the client holds what
the ranks state (meta, groups, warnings), what only ranks together say (gloo groups, settled from
the ranks' comm rows) and futures of the tables; `ClusterTrace.events` gathers the tables only
when a command needs every event (export). tracegraph.analysis.distributed analyses it there.
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from parsers.base import GroupInfo, ParsedRank, RankFiles, TraceError
from parsers.bundle import open_bundle
from tracegraph import schema
from tracegraph.loading import cache
from tracegraph.loading.cachedir import CacheDir, default_cache_dir
from tracegraph.loading.consistency import distinct_ranks
from tracegraph.loading.inventory import inventory_of, rank_summary
from tracegraph.loading.loader import (
    Dropped,
    Outcome,
    assembled,
    attempt,
    in_rank_order,
    parse_bytes,
    parse_in_worker,
    profiles_of,
    readable,
    sources,
    with_rank,
)
from tracegraph.loading.resolve import CommRows, comm_rows, settle_rows, unsettled, write_settled
from tracegraph.loading.trace import Trace, events_frame, p2p_links
from tracegraph.progress import Progress


@contextmanager
def dask_cluster(address: str, workers: int | None = None) -> Iterator[Any]:
    """A `distributed.Client` of a local cluster ("local") or of a scheduler, closed on exit."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - depends on the install
        raise TraceError("--dask needs the dask extra: pip install 'tracegraph[dask]'") from None
    cluster = None
    if address == "local":
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)  # a worker whose heartbeat
        # meets the closing scheduler logs a traceback; its tasks' errors reach the client
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout=30)
        except OSError as error:
            raise TraceError(f"--dask {address}: cannot reach the scheduler ({error})") from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextmanager
def dask_executor(address: str, workers: int | None = None) -> Iterator[Executor]:
    """A concurrent.futures Executor backed by a Dask cluster (`dask_cluster`)."""
    with dask_cluster(address, workers) as client:
        yield client.get_executor()


@dataclass
class ClusterTrace(Trace):
    """A Trace whose ranks' tables stay on a Dask cluster: `held` holds a future of each
    rank's parsed profile, in rank order, on `client`."""

    client: Any = None
    held: list[Any] = field(default_factory=list)

    def p2p_links(self) -> set[tuple[int, int]]:
        """(rank, peer) of every P2P op, found on the workers (the events stay there)."""
        if "_links" not in self.__dict__:
            found = self.client.gather([self.client.submit(_p2p_links, f, pure=False)
                                        for f in self.held])
            self._links = set().union(*found)
        return self._links


@dataclass
class _Stated:
    """What a rank's profile states, sent to the client: all but the events."""

    rank: int
    groups: list[GroupInfo]
    meta: dict[str, object]
    warnings: list[str]
    rows: int
    observed: pa.Table  # kind, group, rank of its events (one row per kind and group)
    comm: CommRows | None  # its comm rows, when they have something to settle
    memory: pa.Table | None  # its memory rows (schema.MEMORY): few, they travel


def load_on_cluster(path: str | Path, client: Any, *, cache_dir: Path | None = None,
                    use_cache: bool = True, rank_map: dict[str, int] | None = None,
                    progress: bool = False) -> ClusterTrace:
    """Parse every rank profile under `path` on the cluster of `client`, and keep them there."""
    with open_bundle(path) as bundle:
        profiles, keys, forced = profiles_of(bundle, rank_map)
        store = (cache_dir or default_cache_dir()) if use_cache else None
        todo = [(p, key, forced.get(p.root)) for p, key in zip(profiles, keys, strict=True)]
        futures = (_held_in_place if bundle.random_access else _held_from_archive)(
            client, str(bundle.path), todo, store)
        stated = _gathered(client, [client.submit(_stated, futures[p.root], pure=False)
                                    for p in profiles], progress)
        warnings = list(bundle.warnings)
    parsed = readable([(p, _stated_rank(s)) for p, s in zip(profiles, stated, strict=True)],
                      warnings)
    by_root = {p.root: s for p, s in zip(profiles, stated, strict=True)}
    held_by = {id(r): futures[p.root] for p, r in parsed}
    parsed = distinct_ranks(parsed, warnings, lambda one, other: client.submit(
        _same_events, held_by[id(one)], held_by[id(other)], pure=False).result())
    in_rank_order(parsed, warnings)
    tables = [futures[p.root] for p, _ in parsed]
    gloo = [r for _, r in parsed if unsettled(r)]
    comm = {r.rank: by_root[p.root].comm for p, r in parsed if unsettled(r)}
    warnings.extend(settle_rows(gloo, comm, {r.rank for _, r in parsed}))
    tables = [client.submit(_settled, f, comm[r.rank], pure=False) if r.rank in comm else f
              for f, (_, r) in zip(tables, parsed, strict=True)]
    observed = [by_root[p.root].observed for p, _ in parsed]
    trace = assembled(ClusterTrace, Path(path), parsed, [by_root[p.root].rows for p, _ in parsed],
                      pa.concat_tables(observed or [_observed(schema.empty_events(), -1)]),
                      warnings, _fetch(client, tables), client=client, held=tables)
    trace.fingerprint = cache.bundle_key(keys, forced)
    return trace


def _stated_rank(stated: _Stated | Dropped) -> Outcome:
    """The rank a worker's `_Stated` describes (its events stay there), or why it did not read."""
    if isinstance(stated, Dropped):
        return stated
    return ParsedRank(stated.rank, None, stated.groups, stated.meta,  # type: ignore[arg-type]
                      stated.warnings, memory=stated.memory)


def inventory_on_cluster(trace: ClusterTrace) -> dict[str, object]:
    """`inventory` of a trace on a cluster, each rank summed up where it lies."""
    rows = trace.ranks.to_dict("records")
    client = trace.client
    return inventory_of(trace, client.gather([client.submit(_rank_summary, held, row, pure=False)
                                              for held, row in zip(trace.held, rows,
                                                                   strict=True)]))


Todo = list[tuple[RankFiles, str, int | None]]  # profile, cache key, rank --rank-map forces


def _held_in_place(client: Any, path: str, todo: Todo, store: Path | None) -> dict[str, Any]:
    """Profile root -> future of its rank, each read by a worker from the bundle (folder, zip)."""
    return {p.root: client.submit(_held, store, p, key, rank, parse_in_worker, path, p,
                                  pure=False) for p, key, rank in todo}


def _held_from_archive(client: Any, path: str, todo: Todo, store: Path | None
                       ) -> dict[str, Any]:
    """Profile root -> future of its rank, from a streamed archive: a share of the ranks per
    worker, each share read in one pass over the archive by the worker (the client never
    holds a member)."""
    shares = max(len(client.scheduler_info().get("workers", {})), 1)
    futures = {}
    for k in range(shares):
        mine = todo[k::shares]
        if mine:
            share = client.submit(_held_share, store, path, mine, pure=False)
            futures |= {p.root: client.submit(operator.getitem, share, i, pure=False)
                        for i, (p, _, _) in enumerate(mine)}
    return futures


def _gathered(client: Any, futures: list[Any], progress: bool) -> list[Any]:
    """The results of `futures`, in order, with a progress bar."""
    from distributed import as_completed

    with Progress("reading ranks", total=len(futures), enabled=progress) as bar:
        for _ in as_completed(futures):
            bar.advance()
    return client.gather(futures)


def _fetch(client: Any, tables: list[Any]) -> Callable[[], list[pa.Table]]:
    """What gathers every rank's table (with its rank column) from the workers, when asked."""
    return lambda: client.gather([client.submit(_events_of, f, pure=False) for f in tables])


# --- on the workers ----------------------------------------------------------------------------
def _held(store: Path | None, profile: RankFiles, key: str, rank: int | None,
          parse: Callable[..., ParsedRank], *args: object) -> Outcome:
    """A rank as a worker keeps it: from the cache when it holds the entry, else parsed (and
    stored, when the cache can be written from here); its rank as --rank-map forces it. Why
    it did not read, where it did not."""
    parsed = cache.load_cached(CacheDir(store), key) if store is not None else None
    return _kept(store, key, rank, parsed if parsed is not None else attempt(parse, *args))


def _held_share(store: Path | None, path: str, todo: Todo) -> list[Outcome]:
    """`_held` of a share of a streamed archive's ranks, the uncached ones parsed in one pass."""
    folder = CacheDir(store) if store is not None else None
    held: dict[str, Outcome | None] = {
        p.root: cache.load_cached(folder, key) if folder is not None else None
        for p, key, _ in todo}
    missing = [(p, key) for p, key, _ in todo if held[p.root] is None]
    if missing:
        with open_bundle(path) as bundle:
            for profile, _key, read in sources(bundle, missing):
                held[profile.root] = attempt(parse_bytes, profile, read.contents)
    return [_kept(store, key, rank, held[p.root]) for p, key, rank in todo]


def _kept(store: Path | None, key: str, rank: int | None, parsed: Outcome) -> Outcome:
    if isinstance(parsed, Dropped):
        return parsed
    if store is not None and not (store / key).is_dir():  # a worker that cannot write the
        cache.store(CacheDir(store), key, parsed)  # client's cache parses again, silently
    if rank is not None:
        parsed.rank = rank
    return parsed


def _stated(parsed: Outcome) -> _Stated | Dropped:
    if isinstance(parsed, Dropped):
        return parsed
    return _Stated(parsed.rank, parsed.groups, parsed.meta, parsed.warnings,
                   parsed.events.num_rows, _observed(parsed.events, parsed.rank),
                   comm_rows(parsed.events) if unsettled(parsed) else None, parsed.memory)


def _observed(events: pa.Table, rank: int) -> pa.Table:
    """The kinds, groups and peers of a rank's events (kind, group, peer, rank), one row each:
    what the client checks the ranks' groups against (`consistency.check`)."""
    pairs = schema.plain_strings(events.select(["kind", "group", "peer"])).group_by(
        ["kind", "group", "peer"]).aggregate([])
    return pairs.append_column("rank", pa.array([rank] * len(pairs), pa.int32()))


def _same_events(one: ParsedRank, other: ParsedRank) -> bool:
    return one.events.equals(other.events)


def _settled(parsed: ParsedRank, comm: CommRows) -> ParsedRank:
    return ParsedRank(parsed.rank, write_settled(parsed.events, comm), parsed.groups,
                      parsed.meta, parsed.warnings, parsed.memory)


def _events_of(parsed: ParsedRank) -> pa.Table:
    return with_rank(parsed.events, parsed.rank)


def _p2p_links(parsed: ParsedRank) -> set[tuple[int, int]]:
    return p2p_links(events_frame([_events_of(parsed).select(["rank", "peer", "comm"])]))


def _rank_summary(parsed: ParsedRank, row: dict[str, object]) -> dict[str, object]:
    return rank_summary(row, events_frame([_events_of(parsed)]))
