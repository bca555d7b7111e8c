"""Analysis summaries as terminal text: per-step tables and bubble chains like the seed's."""

from __future__ import annotations

import re
from itertools import groupby

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracegraph import causes

CATEGORY_WIDTH = max(map(len, causes.CATEGORIES))  # category names line up in chains
_CATEGORY_WORDS = re.compile(r"\b(?:" + "|".join(map(re.escape, causes.CATEGORIES)) + r")\b")


def print_analysis(console: Console, summary: dict[str, object]) -> None:
    """Step times, bubble time per category, and the top bubbles with their causal chains."""
    for step in summary["steps"]:
        table = Table(title=f"step {step['step']}: {step['max_ms']:.1f} ms (slowest rank)")
        table.add_column("rank")
        table.add_column("step ms", justify="right")
        for rank, ms in step["time_ms"].items():
            table.add_row(rank, f"{ms:.3f}")
        console.print(table)
        if step["bubble_ms"]:
            cats = ", ".join(f"{k} {v:.1f} ms" for k, v in step["bubble_ms"].items())
            console.print(styled(f"  bubble time by cause: {cats}"), highlight=False)
    offsets = summary["clock_offsets_ns"]
    if any(offsets.values()):
        shown = ", ".join(f"rank {r}: {ns / 1e3:+.1f} µs" for r, ns in offsets.items())
        console.print(f"clock offsets applied: {shown}", highlight=False)
    if summary["slow_ranks"]:
        console.print(f"compute stragglers: {summary['slow_ranks']}", highlight=False)
    total = summary["bubble_count"]
    console.print(f"\n{len(summary['bubbles'])} of {total} bubbles, longest first:",
                  highlight=False)
    for bubble in summary["bubbles"]:
        console.print(styled(chain_text(bubble)), highlight=False, soft_wrap=True)


def styled(line: str) -> Text:
    """Text as it is (never read as rich markup: "[dp_reduction]" stays), each category name in
    its report colour."""
    text = Text(line)
    for match in _CATEGORY_WORDS.finditer(line):
        text.stylize(causes.color(match[0]), *match.span())
    return text


def chain_text(bubble: dict[str, object]) -> str:
    """One bubble as a readable diagram: the wait, its chain of ranks, each charged interval."""
    end = bubble["start_ms"] + bubble["dur_ms"]
    lines = [
        f"rank {bubble['rank']} {bubble['lane']}  {bubble['name']}  "
        f"{bubble['start_ms']:.3f} → {end:.3f} ms ({bubble['dur_ms']:.3f} ms)  "
        f"[{bubble['category']}]",
        "  chain: " + " ← ".join(f"rank {r}" for r in bubble["chain"]),
    ]
    for piece in merged_intervals(bubble["intervals"]):
        note = f"  ({piece['note']})" if piece["note"] else ""
        lines.append(
            f"    {piece['start_ms']:.3f}–{piece['end_ms']:.3f} {piece['dur_ms']:9.3f} ms  "
            f"{piece['category']:<{CATEGORY_WIDTH}} rank {piece['rank']} {piece['lane']}  "
            f"{piece['name'][:60]}{note}")
    root = bubble.get("root") or {}
    if root.get("profile_ranks"):
        ranks = root["profile_ranks"]
        lines.append(f"  to find the straggler, profile ranks {ranks[:16]}"
                     + (f" … ({len(ranks)} in all)" if len(ranks) > 16 else ""))
    return "\n".join(lines)


def merged_intervals(intervals: list[dict]) -> list[dict]:
    """Consecutive intervals on the same rank and lane as one line: its time by category in the
    note, the longest op's name (+ how many more); the JSON keeps every interval."""
    merged = []
    for _, run in groupby(intervals, key=lambda p: (p["rank"], p["lane"])):
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
