"""What the ranks of one bundle must agree on, checked across them once every rank is read.

One rank's profile can be sound and the bundle still not: two profiles of one rank, ranks
stating different world sizes, a rank whose profile holds no event, a rank that belongs to a
group yet shows none of the collectives its other members ran on it, ranks the profiles name
but the bundle lacks. Each is said in one warning (the analysis then covers what is there);
two different profiles of one rank, or a bundle with no event at all, are errors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import ParsedRank, RankFiles, TraceError
from parsers.groups import span_text
from tracegraph import schema
from tracegraph.loading.groups import absent_ranks, p2p_peers

Parsed = list[tuple[RankFiles, ParsedRank]]


def distinct_ranks(parsed: Parsed, warnings: list[str],
                   same: Callable[[ParsedRank, ParsedRank], bool] | None = None) -> Parsed:
    """One profile per rank: a copy of another (same events, as `same` tells: by default the
    events compared here) is left out with a warning; two different profiles of one rank are
    an error (which one is right cannot be told)."""
    same = same or (lambda one, other: one.events.equals(other.events))
    kept: dict[int, tuple[RankFiles, ParsedRank]] = {}
    for profile, rank in parsed:
        if rank.rank not in kept:
            kept[rank.rank] = (profile, rank)
            continue
        first, other = kept[rank.rank]
        if not same(other, rank):
            raise TraceError(f"{profile.root}: duplicate rank {rank.rank} (also {first.root}); "
                             "pass --rank-map to say which is which")
        warnings.append(f"rank {rank.rank}: {profile.root} is a copy of {first.root}; "
                        "read once")
    return list(kept.values())


def world_size(parsed: Parsed, warnings: list[str]) -> int:
    """The world size the ranks state (-1 if none does); the largest, said, if they differ."""
    stating: dict[int, list[int]] = defaultdict(list)
    for _, rank in parsed:
        size = int(rank.meta.get("world_size") or -1)
        if size > 0:
            stating[size].append(rank.rank)
    if len(stating) > 1:
        said = ", ".join(f"{size} (rank(s) {span_text(ranks)})"
                         for size, ranks in sorted(stating.items()))
        warnings.append(f"the ranks state different world sizes: {said}; using {max(stating)}")
    return max(stating, default=-1)


def check(source: Path, ranks: pd.DataFrame, groups: pd.DataFrame, events: pa.Table,
          world: int, said: list[str]) -> list[str]:
    """Warnings on ranks without events, members silent in their groups' collectives and ranks
    absent from the bundle; TraceError when no rank holds an event (with what the warnings
    `said` so far tell of the first rank: why it holds none)."""
    empty = ranks[ranks["events"] == 0]
    if len(empty) == len(ranks):
        why = next((f": {w}" for w in said if w.startswith(f"rank {ranks['rank'].iloc[0]}:")),
                   "")
        raise TraceError(f"{source}: no event to analyse in {_profiles(empty)}{why}")
    warnings = [f"rank {rank}: {path} holds no event; the analysis covers the other ranks"
                for rank, path in zip(empty["rank"], empty["path"], strict=True)]
    warnings += silent_members(groups, events, set(empty["rank"]))
    warnings += absent_ranks(groups, set(ranks["rank"]), world, p2p_peers(events))
    return warnings


def silent_members(groups: pd.DataFrame, events: pa.Table, empty: set[int]) -> list[str]:
    """Every member of a collective runs it: a profiled member (with events) of a group whose
    other members ran collectives on it, but which shows none, lost them (a cut or sampled
    profile, a wrong rank id)."""
    runs = _collective_ranks(events)
    present = set(pc.unique(events["rank"]).to_pylist())
    warnings = []
    for group, members, source in zip(groups["group"], groups["ranks"], groups["source"],
                                      strict=True):
        ran = runs.get(group, set())
        if not ran or str(source).startswith("observed"):
            continue
        silent = ({int(r) for r in members} & present) - ran - empty
        if silent:
            warnings.append(f"group {group}: member rank(s) {span_text(silent)} show none of "
                            f"the collectives that rank(s) {span_text(ran)} ran on it")
    return warnings


def _collective_ranks(events: pa.Table) -> dict[str, set[int]]:
    """Group -> the ranks with a collective op on it."""
    ops = events.select(["kind", "group", "rank"]).unify_dictionaries()  # one coding over ranks
    ops = ops.filter(pc.and_(pc.equal(ops["kind"], schema.COLLECTIVE),
                             pc.not_equal(ops["group"], "")))
    pairs = ops.select(["group", "rank"]).group_by(["group", "rank"]).aggregate([])
    found: dict[str, set[int]] = defaultdict(set)
    for group, rank in zip(pairs["group"].to_pylist(), pairs["rank"].to_pylist(), strict=True):
        found[group].add(rank)
    return found


def _profiles(ranks: pd.DataFrame) -> str:
    paths = list(ranks["path"])
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
