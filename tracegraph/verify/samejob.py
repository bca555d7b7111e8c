"""Whether two profiles can be runs of the same job: what a diff's before and after must share.

A fix changes timings, op counts, step counts and step numbers, a library version, even the
communication backend or the parallel layout that leaves some group as it was; it keeps the
hardware and its profiler, the world size, and the ranks. So two profiles cannot be the same job
when they come from different profiler families (Kineto, Ascend, Nsight Systems; Ascend's text
export, its .db and its PROF_ folders are one family), when their world sizes differ (as stated,
or a rank or a group beyond what the other states), when they profile no rank in common, or when
each states whole communication groups and no group's members are the same on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parsers.groups import span_text

if TYPE_CHECKING:
    from tracegraph.loading.trace import Trace

def differences(before: Trace, after: Trace) -> list[str]:
    """What shows that `before` and `after` are not the same job ([] when nothing does)."""
    found = [_families(before, after), _world_sizes(before, after), _ranks(before, after),
             _groups(before, after)]
    return [line for line in found if line]


def families(trace: Trace) -> list[str]:
    """The profiler families of a trace's ranks, sorted: each format's first word ("ascend_db",
    "ascend_prof": "ascend")."""
    return sorted({str(f).split("_")[0] for f in trace.ranks["format"]})


def _families(before: Trace, after: Trace) -> str:
    old, new = families(before), families(after)
    return "" if old == new else f"profiler {'+'.join(old)} vs {'+'.join(new)}"


def stated_world_size(trace: Trace) -> int | None:
    """The world size the profiles state, else the size of a world group, else None."""
    stated = [int(w) for w in trace.ranks["world_size"] if int(w) > 0]
    if stated:
        return max(stated)
    world = trace.groups[trace.groups["dim"] == "world"]
    return int(world["size"].max()) if len(world) else None


def least_world_size(trace: Trace) -> int:
    """The fewest ranks the job can have: its highest rank plus one, its largest group."""
    groups = [int(s) for s in trace.groups["size"]]
    return max([max(trace.rank_ids, default=-1) + 1, *groups, stated_world_size(trace) or 0])


def _world_sizes(before: Trace, after: Trace) -> str:
    old, new = stated_world_size(before), stated_world_size(after)
    if old is not None and new is not None:
        return "" if old == new else f"world size {old} vs {new}"
    if old is not None and (least := least_world_size(after)) > old:
        return f"world size {old} vs at least {least}"
    if new is not None and (least := least_world_size(before)) > new:
        return f"world size at least {least} vs {new}"
    return ""


def _ranks(before: Trace, after: Trace) -> str:
    old, new = before.rank_ids, after.rank_ids
    if set(old) & set(new):
        return ""
    return f"no rank in common (ranks {span_text(old)} vs {span_text(new)})"


def whole_groups(trace: Trace) -> set[tuple[int, ...]]:
    """The member sets of the groups whose every member the profiles state."""
    groups = trace.groups
    stated = groups[(groups["source"].str.split(";").str[0] != "observed")
                    & (groups["ranks"].map(len) == groups["size"])]
    return {tuple(int(r) for r in ranks) for ranks in stated["ranks"]}


def _groups(before: Trace, after: Trace) -> str:
    old, new = whole_groups(before), whole_groups(after)
    if not old or not new or old & new:
        return ""
    return (f"no communication group in common ({len(old)} vs {len(new)} groups, none with the "
            "same members)")
