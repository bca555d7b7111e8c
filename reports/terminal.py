"""Analysis summaries as terminal text: the verdict, what was read, bubble chains like the
seed's, and per step (`--detail`) its tables and critical path.

A step's bubble time by cause is summed over its ranks (rank·ms, and said so); beside it stands the
slowest rank's own exposed bubble time, which is what the step time holds.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from reports.critical_path import path_lines
from reports.markdown import rank_sum
from reports.verdict import named_groups, plural, verdict_lines
from tracegraph import causes
from tracegraph.analysis.analyze import Analysis
from tracegraph.loading.groups import group_labels
from tracegraph.verify import metrics

CATEGORY_WIDTH = max(map(len, causes.CATEGORIES))  # category names line up in chains
MOST_PIECES = 8  # pieces of a chain printed by default (the longest; the rest counted)
_CATEGORY_WORDS = re.compile(r"\b(?:" + "|".join(map(re.escape, causes.CATEGORIES)) + r")\b")


def print_verdict(console: Console, verdict: dict[str, object]) -> None:
    """The verdict (tracegraph.verdict), categories in their colours."""
    for line in verdict_lines(verdict):
        console.print(styled(line), highlight=False)


def read_line(summary: dict[str, object], *, detail: bool = False, inventory: bool = False
              ) -> str:
    """What was read, in one line, and the flags that list it in full."""
    ranks = summary["ranks"]
    formats = Counter(str(r.get("format") or r["framework"]) for r in ranks)
    events = sum(r["events"] for r in ranks)
    members = {m for g in summary["groups"] for m in g["ranks"]}
    absent = len(members - {r["rank"] for r in ranks})
    offsets = [abs(ns) for ns in summary.get("clock_offsets_ns", {}).values()]
    kinds = ", ".join(f"{n} {f}" for f, n in formats.items())
    parts = [f"read {plural(len(ranks), 'rank')} ({kinds}; {events:,} events) from "
             f"{summary['source']}",
             plural(len(summary["groups"]), "group")
             + (f" ({plural(absent, 'member')} absent from the bundle)" if absent else ""),
             plural(len(summary["steps"]), "step")]
    if offsets and max(offsets):
        parts.append(f"clocks aligned by up to {max(offsets) / 1e6:.3f} ms")
    more = [flag for flag, shown in (("--inventory lists them", inventory),
                                     ("--detail adds the per-step tables", detail)) if not shown]
    return "\n" + ", ".join(parts) + (f" ({'; '.join(more)})" if more else "")


def print_bubbles(console: Console, summary: dict[str, object]) -> None:
    """The top bubbles, longest first, each with its chain (its MOST_PIECES longest pieces)
    and its causes."""
    labels = group_labels(pd.DataFrame(summary.get("groups") or []))
    total = summary["bubble_count"]
    if not total:
        least = f" of {summary['threshold_ms']:g} ms" if "threshold_ms" in summary else ""
        console.print(f"\nno bubbles: no stall{least} or more on any rank's main compute lane",
                      highlight=False)
        return
    console.print(f"\n{len(summary['bubbles'])} of {plural(total, 'bubble')}, longest first:",
                  highlight=False)
    for bubble in summary["bubbles"]:
        text = chain_text(bubble, most=MOST_PIECES)
        console.print(styled(named_groups(text, labels)), highlight=False)


def print_analysis(console: Console, summary: dict[str, object],
                   analysis: Analysis | None = None) -> None:
    """Per step: step time per rank, bubble time per category (summed over ranks; with
    `analysis`, the slowest rank's own too) and the critical path; then the clock offsets and
    the compute stragglers (`analyze --detail`)."""
    slowest = metrics.slowest_rank_bubbles(analysis) if analysis is not None else {}
    labels = group_labels(pd.DataFrame(summary.get("groups") or []))
    for step in summary["steps"]:
        stated = step.get("from_step_table", [])
        name = f"step {step['step']}" if step["step"] >= 0 else "whole span (no step markers)"
        table = Table(title=f"{name}: {step['max_ms']:.1f} ms (slowest rank)")
        table.add_column("rank")
        table.add_column("step ms", justify="right")
        if stated:
            table.add_column("from")
        for rank, ms in step["time_ms"].items():
            source = ["its step table (no timeline)" if rank in stated else "its timeline"]
            table.add_row(rank, f"{ms:.3f}", *source[:bool(stated)])
        console.print(table)
        threshold = analysis.threshold_ms if analysis is not None else None
        for line in step_bubble_lines(step, slowest.get(step["step"]), threshold):
            console.print(styled(line), highlight=False)
        for line in path_lines(summary["critical_path"].get(str(step["step"])), path_rank(step)):
            console.print(styled(named_groups(line, labels)), highlight=False)
    offsets = summary["clock_offsets_ns"]
    if any(offsets.values()):
        shown = ", ".join(f"rank {r}: {ns / 1e3:+.1f} µs" for r, ns in offsets.items())
        console.print(f"clock offsets applied: {shown}", highlight=False)
    for line in straggler_lines(summary):
        console.print(line, highlight=False)


def straggler_lines(summary: dict[str, object], shown: int = 8) -> list[str]:
    """The compute stragglers named, and the ranks not judged and why (the first `shown`)."""
    judged = summary.get("stragglers") or {}
    unjudged = judged.get("not_judged") or {}
    by_step = judged.get("by_step") or []
    if not summary["slow_ranks"] and not unjudged and not by_step:
        return []
    named = summary["slow_ranks"] or ("none over the whole profile" if by_step else "none named")
    lines = [f"compute stragglers: {named}"
             + (f" (judged against peers doing the same work: "
                f"{', '.join(map(str, judged['peers']))})" if judged.get("peers") else "")]
    lines += [f"  in step {s['step']}: rank {s['rank']} worked {s['work_ms']:.1f} ms, "
              f"{s['ratio']:.1f}× its peers' median {s['peers_ms']:.1f} ms" for s in by_step]
    lines += [f"  rank {rank} not judged: {why}" for rank, why in list(unjudged.items())[:shown]]
    if len(unjudged) > shown:
        lines.append(f"  … {len(unjudged) - shown} more ranks not judged")
    return lines


def path_rank(step: dict[str, object]) -> str:
    """Whose step the critical path spans, as its head says: the slowest rank's, unless that
    rank's step is from its step table (no timeline to walk)."""
    stated = step.get("from_step_table", [])
    timed = {r: ms for r, ms in step["time_ms"].items() if r not in stated}
    slowest = max(step["time_ms"], key=step["time_ms"].get)
    if slowest not in stated or not timed:
        return "the slowest rank's step"
    return (f"rank {max(timed, key=timed.get)}'s step, the slowest with a timeline; rank "
            f"{slowest}'s step table states {step['time_ms'][slowest]:.3f} ms")


def step_bubble_lines(step: dict[str, object], slowest: metrics.SlowestRank | None,
                      threshold_ms: float | None = None) -> list[str]:
    """A step's bubble time by cause summed over its ranks with a timeline, then (given
    `slowest`) the slowest rank's own exposed bubble time: its stalls of at least
    `threshold_ms`, the shortest the analysis counted as a bubble."""
    lines = []
    stated = step.get("from_step_table", [])
    if shown := cause_list(step["bubble_ms"]):
        untimed = (f" with a timeline (ranks {', '.join(stated)}: step table only)" if stated
                   else "")
        lines.append(f"  bubble time by cause, {rank_sum(len(step['time_ms']) - len(stated))}"
                     f"{untimed} (rank·ms): {shown}")
    stalls = f" in stalls ≥ {threshold_ms:g} ms" if threshold_ms is not None else ""
    if slowest is not None and slowest.stated:
        lines.append(f"  rank {slowest.rank} (slowest) exposed bubble time: unknown (its step "
                     "time is from its step table; its profile holds no timeline)")
    elif slowest is not None:
        lines.append(f"  rank {slowest.rank} (slowest) exposed bubble time{stalls}: "
                     f"{slowest.exposed_ms:.1f} ms"
                     + (f": {shown}" if (shown := cause_list(slowest.by_cause)) else ""))
    return lines


def cause_list(by_cause: dict[str, float]) -> str:
    """"compute_straggler 604.4, dp_reduction 23.0" (ms, in the given order), leaving out the
    causes that round to 0.0 ms ("" when all do)."""
    shown = ((cause, f"{ms:.1f}") for cause, ms in by_cause.items())
    return ", ".join(f"{cause} {ms}" for cause, ms in shown if ms != "0.0")


def styled(line: str) -> Text:
    """Text as it is (never read as rich markup: "[dp_reduction]" stays), each category name in
    its report colour."""
    text = Text(line)
    for match in _CATEGORY_WORDS.finditer(line):
        text.stylize(causes.color(match[0]), *match.span())
    return text


def chain_text(bubble: dict[str, object], most: int | None = None) -> str:
    """One bubble as a readable diagram: the wait, its chain of ranks, each charged interval
    (the `most` longest, in time order, the others counted in one line)."""
    end = bubble["start_ms"] + bubble["dur_ms"]
    lines = [
        f"rank {bubble['rank']} {bubble['lane']}  {bubble['name']}  "
        f"{bubble['start_ms']:.3f} → {end:.3f} ms ({bubble['dur_ms']:.3f} ms)  "
        f"[{bubble['category']}]",
        "  chain: " + " ← ".join(f"rank {r}" for r in bubble["chain"]) + _sureness(bubble),
    ]
    pieces = merged_intervals(bubble["intervals"])
    kept = pieces if most is None or len(pieces) <= most else sorted(
        sorted(pieces, key=lambda p: -p["dur_ms"])[:most], key=lambda p: p["start_ms"])
    for piece in kept:
        note = f"  ({piece['note']})" if piece["note"] else ""
        lines.append(
            f"    {piece['start_ms']:.3f}–{piece['end_ms']:.3f} {piece['dur_ms']:9.3f} ms  "
            f"{piece['category']:<{CATEGORY_WIDTH}} rank {piece['rank']} {piece['lane']}  "
            f"{piece['name'][:60]}{note}")
    if len(kept) < len(pieces):
        rest = [p for p in pieces if p not in kept]
        lines.append(f"    … {len(rest)} shorter pieces, {sum(p['dur_ms'] for p in rest):.3f} ms")
    return "\n".join(lines + cause_lines(bubble))


def cause_lines(bubble: dict[str, object]) -> list[str]:
    """The bubble's root and its other causes of at least 5 %, each with its time, share and
    origin, then whom to profile for each group with absent late members, largest first."""
    listed = bubble.get("causes") or []
    lines = [f"  {'root' if k == 0 else 'also':<5} {c['ms']:9.3f} ms ({c['share']:4.0%})  "
             f"{c['category']:<{CATEGORY_WIDTH}} {_origin(c)}" for k, c in enumerate(listed)]
    for k, c in enumerate(c for c in listed if c.get("profile_ranks")):
        ranks = c["profile_ranks"]
        lines.append(f"  {'to find the stragglers, profile' if k == 0 else '':<31} "
                     f"group {c['absent_group']} ({c['ms']:.1f} ms of the wait): ranks {ranks[:16]}"
                     + (f" … ({len(ranks)} in all)" if len(ranks) > 16 else ""))
    return lines


def _origin(cause: dict[str, object]) -> str:
    """Where a cause comes from: a late member of a group absent from the bundle (reached
    through a rank's op), else a rank, lane and op."""
    where = f"rank {cause['rank']} {cause['lane']}  {cause['name'][:60]}"
    absent = cause.get("profile_ranks") or []
    if cause.get("absent_group") and len(absent) == 1:
        return f"rank {absent[0]}, absent (group {cause['absent_group']}), via {where}"
    if cause.get("absent_group"):
        return f"a late member of group {cause['absent_group']} (absent), via {where}"
    return where


def merged_intervals(intervals: list[dict]) -> list[dict]:
    """Consecutive intervals on the same rank and lane (waiting on the same group's absent
    members, if any) as one line: its time by category in the note, the longest op's name (+ how
    many more); the JSON keeps every interval."""
    merged = []
    for _, run in groupby(intervals, key=lambda p: (p["rank"], p["lane"],
                                                     p.get("absent_group", ""))):
        run = list(run)
        by_category: dict[str, float] = {}
        for piece in run:
            by_category[piece["category"]] = by_category.get(piece["category"], 0) + piece["dur_ms"]
        longest = max(run, key=lambda p: p["dur_ms"])
        notes = [longest["note"]] if longest["note"] else []
        if len(by_category) > 1:
            notes.append(" + ".join(f"{c} {ms:.3f} ms" for c, ms in by_category.items()))
        more = f" +{len(run) - 1} ops" if len(run) > 1 else ""
        merged.append({**longest, "start_ms": run[0]["start_ms"], "end_ms": run[-1]["end_ms"],
                       "dur_ms": sum(by_category.values()), "name": longest["name"][:60] + more,
                       "category": max(by_category, key=by_category.get),
                       "note": "; ".join(dict.fromkeys(notes))})
    return merged


def _sureness(bubble: dict[str, object]) -> str:
    """How sure the chain is, and its least sure link when it is not sure."""
    confidence = bubble.get("confidence") or {}
    if not confidence:
        return ""
    link = confidence.get("weakest_link")
    return f"   (confidence {confidence['level']}" + (f": {link})" if link else ")")

