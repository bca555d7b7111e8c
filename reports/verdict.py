"""The verdict (tracegraph.verdict) as plain text lines, Markdown and an HTML block: the same
sentences everywhere, read in ten seconds."""

from __future__ import annotations

import re
from html import escape

_HCCL_LANE = re.compile(r"\bhccl (\S+)")
SHOWN_STEPS = 4  # steps named in the head line
PROFILE_NEXT = "the members outside the bundle a collective waited on (a late one, or its transfer)"
"""Whom to profile: a collective's time after its last profiled member arrived is a member
outside the bundle arriving later still, or the transfer itself; only their profiles tell."""


def verdict_lines(verdict: dict[str, object]) -> list[str]:
    """The verdict: step time and slowest rank, causes largest first (the largest one's origins
    below it), the longest stalls, the fix and its replayed gain, whom to profile, the finding
    that costs the most, and what the data could not support. HCCL lanes named by their
    group's label."""
    labels = verdict.get("group_labels") or {}
    return [named_groups(line, labels) for line in _lines(verdict)]


def named_groups(text: str, labels: dict[str, str]) -> str:
    """`text` with the group ids that name HCCL lanes ("hccl 5862276114690318097") as the
    groups' labels ("hccl group_name_5 (dp_cp)")."""
    return _HCCL_LANE.sub(lambda m: f"hccl {labels.get(m[1], m[1])}", text) if labels else text


def _lines(verdict: dict[str, object]) -> list[str]:
    if not verdict.get("steps"):
        return ["verdict: no step to judge (" + "; ".join(verdict.get("notes", [])) + ")"]
    lines = [_head(verdict)]
    lines += _cause_lines(verdict["causes"])
    lines += _stall_lines(verdict["stalls"])
    lines.append(fix_line(verdict["fix"]))
    if verdict["profile"]:
        lines.append(_profile_line(verdict["profile"]))
    if verdict.get("finding"):
        lines.append(f"finding first: {verdict['finding']['title']}")
    lines += [f"note: {note}" for note in verdict["notes"]]
    return lines


def plural(count: int, noun: str) -> str:
    """"1 step", "2 steps"."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def pct(share: float, digits: int = 1) -> str:
    """A share as a percentage: "17.4 %"."""
    return f"{100 * share:.{digits}f} %"


def _head(verdict: dict[str, object]) -> str:
    """"step 1: 6649.7 ms, slowest rank 0, which stalled 1154.8 ms (17.4 %)" or, over steps,
    the median and each step's slowest rank."""
    steps = verdict["steps"]
    stalled = verdict["stalled_ms"]
    share = (f"{stalled:.1f} ms ({pct(verdict['stalled_share'])}) in stalls of "
             f"{verdict['threshold_ms']:g} ms or more")
    if len(steps) == 1:
        s = steps[0]
        step = f"step {s['step']}" if s["step"] >= 0 else "the whole trace (no step markers)"
        return f"{step}: {s['ms']:.1f} ms, slowest rank {s['slowest_rank']}, which stalled {share}"
    shown = sorted(steps, key=lambda s: -s["ms"])[:SHOWN_STEPS]
    each = ", ".join(f"#{s['step']} {s['ms']:.1f} ms on rank {s['slowest_rank']}" for s in shown)
    more = f", … {len(steps) - len(shown)} more" if len(steps) > len(shown) else ""
    return (f"step time {verdict['step_ms']:.1f} ms (median of {len(steps)} steps: {each}{more});"
            f" the slowest ranks stalled {share}")


def _cause_lines(listed: list[dict[str, object]], top: int = 4) -> list[str]:
    if not listed:
        return ["held back by: no stall on the slowest rank's main lane reached the threshold:"
                " what the profile shows of its step is its own work"]
    lines = ["held back by, largest first (share of the step, ms per step, confidence):"]
    first = next((c for c in listed if not c["inherent"]), None)
    for cause in listed[:top]:
        head = f"  {cause['category']:<17} {pct(cause['share']):>7} {cause['ms']:9.1f} ms  "
        if cause["inherent"]:
            lines.append(head + cause["no_fix"] + _ratio(cause))
            continue
        if cause is not first:
            lines.append(f"{head}{cause['confidence']}: "
                         f"{origin_text(cause['origins'][0], cause['category'])}")
            continue
        lines.append(head + cause["confidence"] + (f" ({cause['evidence']})" if cause[
            "evidence"] and cause["confidence"] != "high" else ""))
        lines += [f"      {pct(o['share']):>7} {o['ms']:9.1f} ms  "
                  f"{origin_text(o, cause['category'])}" for o in cause["origins"]]
        if cause["more_origins"]:
            lines.append(f"      … {plural(cause['more_origins'], 'more origin')}, "
                         f"{cause['more_ms']:.1f} ms")
    if len(listed) > top:
        rest = listed[top:]
        lines.append(f"  … {len(rest)} more causes, {sum(c['ms'] for c in rest):.1f} ms: "
                     + ", ".join(c["category"] for c in rest))
    return lines


def origin_text(origin: dict[str, object], category: str = "") -> str:
    """"rank 12288 stream 51 hcom_allReduce__321_0_1, waiting on hsdp-dp32-12288's 31 absent
    members"; time the walk could not explain is the idle time before its op, never the op's."""
    from tracegraph.causes import UNKNOWN  # the schema's pyarrow: not at the command's start

    if origin.get("category", category) == UNKNOWN:
        return f"rank {origin['rank']} {origin['lane']} idle before {origin['name'][:60]}"
    text = f"rank {origin['rank']} {origin['lane']} {origin['name'][:60]}"
    if origin.get("group_label"):
        count = origin.get("absent_count")
        members = f"{count} absent members" if count else "members absent from the bundle"
        text += f", waiting on {origin['group_label']}'s {members}"
    return text


def _ratio(cause: dict[str, object]) -> str:
    ratio = cause.get("bubble_ratio")
    return (f" (pipeline bubble ratio {ratio['measured']:.3f} measured, {ratio['theory']:.3f} in "
            "theory)" if ratio else "")


def _stall_lines(stalls: list[dict[str, object]]) -> list[str]:
    if not stalls:
        return []
    lines = ["longest stalls, and the origin of most of each:"]
    for stall in stalls:
        origin = stall["origin"]
        where = f" ← {origin_text(origin)} ({pct(origin['share'], 0)})" if origin else ""
        lines.append(f"  {stall['ms']:9.1f} ms  rank {stall['rank']} {stall['lane']} "
                     f"{stall['name'][:40]} [{stall['category']}]{where}  {stall['confidence']}")
    return lines


def fix_line(fix: dict[str, object]) -> str:
    """The fix and its replayed gain, or why there is none."""
    if not fix:
        return "fix: nothing to judge"
    if "why" in fix:
        cause = f" for {fix['cause']}" if fix.get("cause") else ""
        return f"fix{cause}: none by replay: {fix['why']}"
    if "fix" in fix:
        ceiling = (f"; removing {fix['cause']} altogether saves at most "
                   f"{fix['ceiling_ms']:.1f} ms" if fix.get("ceiling_ms") is not None else "")
        return (f"fix: whatif --fix {fix['fix']} ({fix['cause']}): replay {fix['measured_ms']:.1f}"
                f" → {fix['predicted_ms']:.1f} ms, gain {fix['gain_ms']:.1f} ms "
                f"({fix['gain_pct']:.1f} %){ceiling}")
    return (f"fix: remove {fix['cause']} ({fix['edit']}): gain at most {fix['gain_ms']:.1f} ms "
            f"({fix['gain_pct']:.1f} %) by replay (its gain ceiling)")


def _profile_line(groups: list[dict[str, object]], top: int = 3, ranks: int = 3) -> str:
    """Whom to profile next: the groups whose absent members the causes waited on."""
    shown = []
    for group in groups[:top]:
        named = group["ranks"]
        listed = ", ".join(map(str, named[:ranks])) + (", …" if len(named) > ranks else "")
        shown.append(f"{group['group_label']} ({len(named)} absent: {listed})" if named
                     else f"{group['group_label']} (members not named: the whole group)")
    more = f", … {len(groups) - top} more groups" if len(groups) > top else ""
    return f"profile next, {PROFILE_NEXT}: " + ", ".join(shown) + more


# --- Markdown and HTML -----------------------------------------------------------------------
def verdict_markdown(verdict: dict[str, object], title: str = "Verdict") -> list[str]:
    """The verdict as a Markdown section: its lines in a text block, aligned as in a terminal."""
    return [f"### {title}", "", "```text", *verdict_lines(verdict), "```", ""]


def verdict_html(verdict: dict[str, object]) -> str:
    """The verdict as an HTML block at the top of the report: its lines as they are aligned in
    the terminal, wrapped by the page."""
    text = escape("\n".join(verdict_lines(verdict)))
    return ("<section class=\"verdict\"><h2>Verdict</h2><pre style=\"white-space: pre-wrap; "
            f"font-size: 0.9em\">{text}</pre></section>")
