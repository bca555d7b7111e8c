"""Merge what each rank says about its communicators into one groups table."""

from __future__ import annotations

import re

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import GroupInfo
from tracegraph import schema

_DIMS = (  # first match wins; matched against the group's description / name
    ("pp", re.compile(r"(^|[^a-z])(pp|pipe|pipeline)([^a-z]|$)|stage_?\d+_\d+")),
    ("dp", re.compile(r"(^|[^a-z])(dp|hsdp|fsdp|ddp|replicate|data)")),
    ("ep", re.compile(r"(^|[^a-z])(ep|moe|expert|a2a)")),
    ("tp", re.compile(r"(^|[^a-z])(tp|tensor)([^a-z]|$)")),
    ("cp", re.compile(r"(^|[^a-z])(cp|context)([^a-z]|$)")),
    ("world", re.compile(r"default|world")),
)


def parallel_dim(desc: str) -> str:
    """The parallel dimension a group name such as "dp_stage0", "pp" or "default_pg" denotes."""
    text = desc.lower()
    return next((dim for dim, pattern in _DIMS if pattern.search(text)), "")


def groups_frame(infos: list[GroupInfo], events: pa.Table) -> tuple[pd.DataFrame, list[str]]:
    """The GROUPS table: stated members merged over ranks, else the ranks seen using the group."""
    merged: dict[str, dict[str, object]] = {}
    for info in infos:
        row = merged.setdefault(info.group, {"group": info.group, "name": "", "desc": "",
                                             "ranks": set(), "source": ""})
        row["name"] = row["name"] or info.name
        row["desc"] = row["desc"] or info.desc
        row["ranks"] |= set(info.ranks)
        row["source"] = row["source"] or (info.source if info.ranks else "")
    observed = _observed_members(events)
    warnings = []
    for group, users in observed.items():
        row = merged.setdefault(group, {"group": group, "name": "", "desc": "",
                                        "ranks": set(), "source": ""})
        if not row["ranks"]:
            row["ranks"], row["source"] = set(users), "observed"
        elif outside := users - row["ranks"]:
            warnings.append(f"group {group}: ranks {sorted(outside)} use it but are not members")
    rows = [
        {**row, "ranks": sorted(row["ranks"]), "size": len(row["ranks"]),
         "dim": parallel_dim(f"{row['desc']} {row['name']}")}
        for row in merged.values()
    ]
    frame = pd.DataFrame(rows, columns=schema.GROUPS.names)
    return frame.sort_values("group", ignore_index=True), warnings


def _observed_members(events: pa.Table) -> dict[str, set[int]]:
    """Group id -> ranks that report communication on it."""
    if events.num_rows == 0:
        return {}
    used = events.filter(pc.not_equal(events["group"], "")).select(["group", "rank"])
    pairs = used.group_by(["group", "rank"]).aggregate([])
    result: dict[str, set[int]] = {}
    for group, rank in zip(pairs["group"].to_pylist(), pairs["rank"].to_pylist(), strict=True):
        result.setdefault(group, set()).add(rank)
    return result
