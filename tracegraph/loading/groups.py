"""Merge what each rank says about its communicators into one groups table."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import GroupInfo
from parsers.groups import span_text
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


def group_labels(groups: pd.DataFrame) -> dict[str, str]:
    """Group id -> how reports name it: its name unless that is the id itself (a hashed HCCL
    id, a Kineto pg number), then its description where the name does not hold it
    ("hsdp-dp32-12288", "group_name_19 (pp)", "dp_stage0"), else the id; none for a table
    without groups (not even columns)."""
    if "group" not in groups:
        return {}
    labels = {}
    for group, name, desc in zip(groups["group"], groups["name"], groups["desc"], strict=True):
        name = "" if name == group else str(name or "")
        desc = "" if not desc or desc in name else str(desc)
        labels[str(group)] = (f"{name} ({desc})" if name and desc else name or desc) or group
    return labels


def distinct_labels(groups: pd.DataFrame) -> dict[str, str]:
    """Group id -> its `group_labels` label, with the id beside a label other groups share
    ("dp (group 5)": Kineto names every DP group by its description)."""
    labels = group_labels(groups)
    shared = Counter(labels.values())
    return {g: f"{label} (group {g})" if shared[label] > 1 and label != g else label
            for g, label in labels.items()}


def groups_frame(infos: list[GroupInfo], events: pa.Table, world_size: int = -1
                 ) -> tuple[pd.DataFrame, list[str]]:
    """The GROUPS table: the members the profiles state, merged over ranks; else, for the world
    group, range(world_size) when a world size is stated; else the ranks seen using the group.
    `size` is the largest member count any rank states (at least the members named)."""
    merged: dict[str, _Merged] = {}
    for info in infos:
        merged.setdefault(info.group, _Merged(info.group)).add(info)
    warnings = []
    for group, users in _observed_members(events).items():
        row = merged.setdefault(group, _Merged(group))
        if not row.ranks:
            row.ranks, row.source = set(users), "observed"
        elif outside := users - row.ranks:
            warnings.append(f"group {group}: ranks {sorted(outside)} use it but are not members")
    rows = [row.final(world_size) for row in merged.values()]
    frame = pd.DataFrame(rows, columns=schema.GROUPS.names)
    return frame.sort_values("group", ignore_index=True), warnings


@dataclass
class _Merged:
    """What the ranks' profiles say of one group, merged."""

    group: str
    name: str = ""
    desc: str = ""
    ranks: set[int] = field(default_factory=set)
    source: str = ""  # of the members
    size: int = 0  # the largest member count stated
    size_source: str = ""

    def add(self, info: GroupInfo) -> None:
        self.name, self.desc = self.name or info.name, self.desc or info.desc
        self.ranks |= set(info.ranks)
        self.source = self.source or (info.source if info.ranks else "")
        if info.size > self.size:
            self.size, self.size_source = info.size, info.source

    def final(self, world_size: int) -> dict[str, object]:
        """The GROUPS row (dim from its description and name)."""
        dim = parallel_dim(f"{self.desc} {self.name}")
        ranks, source = self.ranks, self.source
        if dim == "world" and world_size > 0 and source in ("", "observed"):
            ranks, source = set(range(world_size)), "world_size"
        size = max(len(ranks), self.size)
        if size > len(ranks) and self.size_source != source:
            source = f"{source}; size {self.size_source}"
        return {"group": self.group, "name": self.name, "desc": self.desc, "dim": dim,
                "ranks": sorted(ranks), "size": size, "source": source}


def absent_ranks(groups: pd.DataFrame, present: set[int], world_size: int = -1,
                 peers: set[int] | None = None) -> list[str]:
    """Warnings on ranks the profiles say exist but the bundle lacks: those named by world_size,
    a group's stated members or the bundle's P2P ops (`peers`), those of its pipeline first (P2P
    peers and `pp` group members: the stages it lacks), and members whose global rank is not
    stated."""
    stated = groups[groups["source"].str.split(";").str[0] != "observed"]
    named = set(range(world_size)) if world_size > 0 else set()
    named |= {int(r) for ranks in stated["ranks"] for r in ranks}
    pipeline = set(peers or ()) | {int(r) for ranks in groups.loc[groups["dim"] == "pp", "ranks"]
                                   for r in ranks}
    warnings = []
    if absent := (named | pipeline) - present:
        why = [f"world_size {world_size}"] if world_size > 0 else []
        why += ["the groups' stated members"] if len(stated) else []
        why += ["its P2P ops"] if pipeline - named else []
        warnings.append(f"{len(absent)} rank(s) that {' and '.join(why)} name are absent from "
                        f"the bundle: {_pipeline_first(absent, pipeline)}")
    unnamed = groups[groups["size"] > groups["ranks"].map(len)]
    labels = group_labels(unnamed)
    for group, size, ranks in zip(unnamed["group"], unnamed["size"], unnamed["ranks"],
                                  strict=True):
        warnings.append(f"group {labels[str(group)]} has {size} members ({len(ranks)} in the "
                        f"bundle: {span_text(ranks)}); the other {size - len(ranks)} are not "
                        "in the bundle and their global ranks are not stated")
    return warnings


def _pipeline_first(absent: set[int], pipeline: set[int]) -> str:
    """The absent ranks as text, those of the pipeline (P2P peers, pp group members) first."""
    stages = absent & pipeline
    if not stages:
        return span_text(absent)
    rest = f"; and {span_text(absent - stages)}" if absent - stages else ""
    return (f"{span_text(stages)} (of its pipeline: peers of its P2P ops or members of its "
            f"pipeline groups){rest}")


def p2p_peers(events: pa.Table) -> set[int]:
    """The ranks the P2P ops of `events` (a table with kind and peer columns) name as peers."""
    if "peer" not in events.column_names or not events.num_rows:
        return set()
    ops = events.select(["kind", "peer"]).unify_dictionaries()
    ops = ops.filter(pc.and_(pc.equal(ops["kind"], schema.P2P), pc.greater_equal(ops["peer"], 0)))
    return set(pc.unique(ops["peer"]).to_pylist())


def _observed_members(events: pa.Table) -> dict[str, set[int]]:
    """Group id -> ranks that report communication on it."""
    if events.num_rows == 0:
        return {}
    used = events.select(["group", "rank"]).unify_dictionaries()  # one coding over ranks
    used = used.filter(pc.not_equal(used["group"], ""))
    pairs = used.group_by(["group", "rank"]).aggregate([])
    result: dict[str, set[int]] = {}
    for group, rank in zip(pairs["group"].to_pylist(), pairs["rank"].to_pylist(), strict=True):
        result.setdefault(group, set()).add(rank)
    return result
