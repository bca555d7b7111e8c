"""An `Analysis` as plain data: the documented JSON of `tracegraph analyze --json`."""

from __future__ import annotations

from typing import NamedTuple

from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble, BubbleCause, Interval
from tracegraph.analysis.critical_path import PathSegment
from tracegraph.loading.groups import distinct_labels
from tracegraph.whatif.ceilings import gain_ceilings

NS_PER_MS = 1e6


def summarize(analysis: Analysis, *, step: int | None = None, top: int = 10,
              findings: list | None = None, pipeline=None) -> dict[str, object]:
    """Steps, bubbles (the `top` longest, all when top <= 0), blame, critical path, clocks, and
    `findings` (tracegraph.analysis.findings) and the recovered `pipeline` when given."""
    origin = analysis.origin
    bubbles = [b for b in analysis.bubbles if step is None or b.step == step]
    shown = bubbles if top <= 0 else bubbles[:top]
    groups = Groups(analysis.trace.group_members(), set(analysis.trace.rank_ids),
                    distinct_labels(analysis.trace.groups))
    return {
        "origin_ns": origin,
        "clock_offsets_ns": {str(r): int(ns) for r, ns in sorted(analysis.offsets.items())},
        "steps": _steps(analysis, step),
        "bubbles": [_bubble(b, origin, groups) for b in shown],
        "bubble_count": len(bubbles),
        "threshold_ms": analysis.threshold_ms,
        "blame": {k: round(v, 3) for k, v in analysis.blame(step).items()},
        "critical_path": {str(s): _path(p, origin, analysis.caveat)
                          for s, p in analysis.critical_paths.items() if step is None or s == step},
        "slow_ranks": sorted(analysis.slow_ranks),
        "stragglers": {"peers": analysis.peers.groups(),
                       "not_judged": {str(r): why for r, why in analysis.peers.unjudged.items()},
                       "by_step": _step_stragglers(analysis, step)},
        "gain_ceilings": gain_ceilings(analysis),
        "warnings": analysis.warnings,
        **({"findings": [f.as_dict() for f in findings]} if findings is not None else {}),
        **({"pipeline": pipeline.as_dict(step)} if pipeline is not None else {}),
    }


def _ms(ns: int, origin: int = 0) -> float:
    return round((ns - origin) / NS_PER_MS, 3)


def _step_stragglers(analysis: Analysis, only: int | None) -> list[dict[str, object]]:
    """Each step's stragglers: the rank, its work and its peers' median (ms), their ratio."""
    table = analysis.step_stragglers
    return [{"step": int(s), "rank": int(r), "work_ms": round(float(w), 3),
             "peers_ms": round(float(p), 3), "ratio": round(float(x), 2)}
            for s, r, w, p, x in table[["step", "rank", "work_ms", "peers_ms", "ratio"]
                                       ].itertuples(index=False) if only is None or s == only]


def _steps(analysis: Analysis, only: int | None) -> list[dict[str, object]]:
    """Each step's time per rank: from its window, else from the rank's step table (those ranks
    listed as `from_step_table`); without step markers, each rank's whole span as step -1."""
    rows = []
    stated_ms: dict[int, dict[str, float]] = {}
    for rank, step, ms in analysis.stated_steps()[["rank", "step", "ms"]].itertuples(index=False):
        stated_ms.setdefault(int(step), {})[str(rank)] = round(float(ms), 3)
    windows = analysis.steps if len(analysis.steps) else analysis.step_table()  # whole spans
    for step, spans in windows.groupby("step"):
        if only is not None and step != only:
            continue
        times = {str(r): _ms(e - s) for r, s, e in spans[["rank", "start", "end"]].itertuples(
            index=False)}
        stated = stated_ms.get(step, {})
        times = dict(sorted((times | stated).items(), key=lambda kv: int(kv[0])))
        rows.append({"step": int(step), "time_ms": times, "max_ms": max(times.values()),
                     "bubble_ms": {k: round(v, 3) for k, v in analysis.blame(int(step)).items()},
                     **({"from_step_table": sorted(stated, key=int)} if stated else {})})
    return rows


class Groups(NamedTuple):
    """What a root's advice needs of the job's groups."""

    members: dict[str, tuple[int, ...]]
    present: set[int]  # ranks in the bundle
    labels: dict[str, str]  # group id -> how reports name it


def _bubble(bubble: Bubble, origin: int, groups: Groups) -> dict[str, object]:
    root = bubble.root
    return {
        "rank": bubble.rank, "lane": bubble.lane, "step": bubble.step, "name": bubble.name,
        "start_ms": _ms(bubble.start, origin), "dur_ms": _ms(bubble.dur),
        "category": bubble.category,
        "root": _root(root, groups) if root else None,
        "causes": [_cause(c, groups) for c in bubble.listed_causes()],
        "chain": bubble.chain(),
        "confidence": {"level": bubble.sureness, "score": round(bubble.confidence, 2),
                       **({"weakest_link": bubble.evidence} if bubble.evidence else {})},
        "intervals": [_interval(p, origin) for p in bubble.intervals],
    }


def _root(piece: Interval, groups: Groups) -> dict[str, object]:
    root: dict[str, object] = {"rank": piece.rank, "lane": piece.lane, "name": piece.name}
    if piece.note:
        root["note"] = piece.note
    group = piece.unprofiled_group
    if group:
        root["absent_group"] = groups.labels.get(group, group)
    if group in groups.members:
        absent = [r for r in groups.members[group] if r not in groups.present]
        if absent:
            root["profile_ranks"] = absent
        else:  # the profile states how many members, not which
            root["note"] += "; their global ranks are not stated: profile the whole group"
    return root


def _cause(cause: BubbleCause, groups: Groups) -> dict[str, object]:
    """A listed cause: its origin (as a root is told), time and share of the bubble."""
    return {"category": cause.category, "ms": _ms(cause.ns), "share": round(cause.share, 4),
            **_root(cause.longest, groups)}


def _interval(piece: Interval, origin: int) -> dict[str, object]:
    return {"start_ms": _ms(piece.start, origin), "end_ms": _ms(piece.end, origin),
            "dur_ms": _ms(piece.dur), "category": piece.category, "rank": piece.rank,
            "lane": piece.lane, "name": piece.name, "note": piece.note,
            **({"absent_group": piece.unprofiled_group} if piece.unprofiled_group else {})}


def _path(path: list[PathSegment], origin: int, caveat: str = "") -> dict[str, object]:
    def total(key) -> dict[str, float]:
        sums: dict[str, float] = {}
        for seg in path:
            sums[key(seg)] = sums.get(key(seg), 0.0) + (seg.end - seg.start) / NS_PER_MS
        return {k: round(v, 3) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])}

    return {
        "length_ms": round(sum((s.end - s.start) for s in path) / NS_PER_MS, 3),
        "by_category": total(lambda s: s.category), "by_kind": total(lambda s: s.kind),
        "by_rank": total(lambda s: str(s.rank)), "by_lane": total(lambda s: f"{s.rank}/{s.lane}"),
        "segments": [{"rank": s.rank, "lane": s.lane, "name": s.name, "category": s.category,
                      "kind": s.kind, "start_ms": _ms(s.start, origin),
                      "end_ms": _ms(s.end, origin), **({"note": s.note} if s.note else {})}
                     for s in path],
        **({"caveat": caveat} if caveat else {}),
    }
