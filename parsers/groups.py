"""Group-local ranks and the process groups a rank belongs to, as one rank's profile states them.

Shared by the parsers (what one rank's profile settles) and the loader's cross-rank step
(`tracegraph.loading.resolve`, what only several ranks together settle).
"""

from __future__ import annotations

from collections.abc import Iterable

from parsers.base import GroupInfo

Members = dict[str, tuple[int, ...]]
"""Group id -> its member global ranks, sorted (a group's local rank i is its i-th member)."""


def own_groups(rank: int, infos: Iterable[GroupInfo]) -> Members:
    """The groups whose stated members include `rank` (pg_config lists only those)."""
    return {g.group: tuple(sorted(g.ranks)) for g in infos if rank in g.ranks}


def global_peers(rank: int, local: int, groups: Members) -> set[tuple[str, int]]:
    """(group, global rank) for each of `rank`'s groups in which group-local rank `local` is
    another member: the peers a P2P op naming local peer `local` may have."""
    return {(gid, ranks[local]) for gid, ranks in groups.items()
            if 0 <= local < len(ranks) and ranks[local] != rank}


def span_text(ranks: Iterable[int], limit: int = 16) -> str:
    """Sorted ranks as short text: "1, 3", "2-7", "0, 4-9"; past `limit` runs, the first ones
    and how many ranks in all."""
    values = sorted(set(ranks))
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r))
                     for r in runs[:limit])
    return text + (f", … ({len(values)} ranks in all)" if len(runs) > limit else "")
