"""A step's critical path as the terminal and the HTML report show it: runs of consecutive
segments on one rank, lane and kind (compute, transfer, wait) with their times, the longest
MAX_RUNS kept and each stretch between them folded into one line, and its composition by kind
and by category. Reads `analyze --json`'s `critical_path.STEP` (summary.py)."""

from __future__ import annotations

from html import escape

MAX_RUNS = 8  # runs shown per path; the others are folded between them
NOTABLE = 0.01  # a wait or transfer run of this share of its path is always shown (up to MAX_RUNS)
KIND_COLORS = {"compute": "#1b1b1b", "transfer": "#6a3d9a", "wait": "#e31a1c"}
"""The critical path's colour per segment kind, in the waterfall and the run table."""


def path_runs(path: dict[str, object]) -> list[dict[str, object]]:
    """Consecutive segments on one rank, lane and kind as one run: its times, ms by category,
    the longest segment's op (+ how many more) and note."""
    runs: list[dict[str, object]] = []
    for seg in path["segments"]:
        dur = seg["end_ms"] - seg["start_ms"]
        last = runs[-1] if runs else None
        if last and (last["rank"], last["lane"], last["kind"]) == (
                seg["rank"], seg["lane"], seg["kind"]):
            last["end_ms"] = seg["end_ms"]
            last["segments"] += 1
        else:
            last = {"rank": seg["rank"], "lane": seg["lane"], "kind": seg["kind"],
                    "start_ms": seg["start_ms"], "end_ms": seg["end_ms"], "segments": 1,
                    "by_category": {}, "name": "", "note": "", "longest": -1.0}
            runs.append(last)
        last["by_category"][seg["category"]] = last["by_category"].get(seg["category"], 0) + dur
        if dur > last["longest"]:
            last["name"], last["note"], last["longest"] = seg["name"], seg.get("note", ""), dur
    for run in runs:
        run["dur_ms"] = run["end_ms"] - run["start_ms"]
        del run["longest"]
    return runs


def folded(runs: list[dict[str, object]], limit: int = MAX_RUNS) -> list[dict[str, object]]:
    """`limit` runs in time order, waits and transfers of at least NOTABLE of the path first,
    then the longest; each stretch of the others between two of them as one entry with
    `folded` (how many runs), its times, ms by category and its ranks."""
    if len(runs) <= limit:
        return runs
    total = sum(run["dur_ms"] for run in runs)

    def rank(i: int) -> tuple[bool, float]:
        run = runs[i]
        return run["kind"] == "compute" or run["dur_ms"] < NOTABLE * total, -run["dur_ms"]

    keep = set(sorted(range(len(runs)), key=rank)[:limit])
    alone = {i for i in range(len(runs)) if i not in keep and i - 1 in keep | {-1}
             and i + 1 in keep | {len(runs)}}  # a stretch of one run shows the run itself
    keep |= alone
    shown: list[dict[str, object]] = []
    for i, run in enumerate(runs):
        if i in keep:
            shown.append(run)
            continue
        if not shown or "folded" not in shown[-1]:
            shown.append({"folded": 0, "start_ms": run["start_ms"], "by_category": {},
                          "ranks": []})
        fold = shown[-1]
        fold["folded"] += 1
        fold["end_ms"] = run["end_ms"]
        fold["dur_ms"] = fold["end_ms"] - fold["start_ms"]
        for category, ms in run["by_category"].items():
            fold["by_category"][category] = fold["by_category"].get(category, 0) + ms
        if run["rank"] not in fold["ranks"]:
            fold["ranks"].append(run["rank"])
    return shown


def composition(path: dict[str, object]) -> list[str]:
    """"compute 6290.983 ms (94.6 %), …" and "pipeline_fill 6290.983, …": by kind, by
    category."""
    total = path["length_ms"] or 1.0
    kinds = ", ".join(f"{kind} {ms:.3f} ms ({ms / total:.1%})"
                      for kind, ms in path["by_kind"].items())
    categories = ", ".join(f"{c} {ms:.3f}" for c, ms in path["by_category"].items())
    return [kinds, categories]


def path_lines(path: dict[str, object] | None, whose: str = "the slowest rank's step"
               ) -> list[str]:
    """The path as terminal lines, like a bubble's chain: a head with its composition (and
    `whose` step it spans), then a line per run (folded stretches as one line)."""
    if not path or not path["segments"]:
        return []
    kinds, categories = composition(path)
    lines = [f"  critical path {path['length_ms']:.3f} ms ({whose}): {kinds}",
             f"    by category (ms): {categories}"]
    if path.get("caveat"):
        lines.append(f"    unsure: {path['caveat']}")
    for run in folded(path_runs(path)):
        times = f"    {run['start_ms']:9.3f}–{run['end_ms']:9.3f} {run['dur_ms']:9.3f} ms  "
        if "folded" in run:
            ranks = ", ".join(map(str, run["ranks"][:8])) + (" …" if len(run["ranks"]) > 8
                                                              else "")
            lines.append(f"{times}… {run['folded']} shorter runs on ranks {ranks}: "
                         f"{_categories(run)}")
            continue
        more = f" +{run['segments'] - 1} more" if run["segments"] > 1 else ""
        note = f"  ({run['note']})" if run["note"] else ""
        lines.append(f"{times}{run['kind']:<8} rank {run['rank']} {run['lane']}  "
                     f"{run['name'][:60]}{more}  [{_categories(run)}]{note}")
    return lines


def _categories(run: dict[str, object]) -> str:
    return ", ".join(f"{c} {ms:.3f}" for c, ms in sorted(run["by_category"].items(),
                                                          key=lambda kv: -kv[1]))


def path_table(path: dict[str, object] | None) -> str:
    """The path's runs as an HTML table, one row per run marked with its kind's colour, the
    composition and the legend in its caption."""
    if not path or not path["segments"]:
        return ""
    kinds, categories = composition(path)
    legend = "".join(f"<span class=\"kpi\"><span class=\"swatch\" style=\"background:{color}"
                     f"\"></span>{kind}</span>" for kind, color in KIND_COLORS.items())
    rows = []
    for run in folded(path_runs(path)):
        times = (f"<td class=\"n\">{run['start_ms']:.3f}</td><td class=\"n\">"
                 f"{run['end_ms']:.3f}</td><td class=\"n\">{run['dur_ms']:.3f}</td>")
        if "folded" in run:
            rows.append(f"<tr class=\"folded\">{times}<td colspan=\"4\">… {run['folded']} "
                        f"shorter runs on ranks {escape(', '.join(map(str, run['ranks'])))}"
                        f"</td><td>{escape(_categories(run))}</td></tr>")
            continue
        color = KIND_COLORS.get(run["kind"], "#999")
        more = f" +{run['segments'] - 1} more" if run["segments"] > 1 else ""
        note = f"<br><span class=\"note\">{escape(run['note'])}</span>" if run["note"] else ""
        rows.append(
            f"<tr class=\"run\" data-kind=\"{escape(run['kind'])}\" data-rank=\"{run['rank']}\" "
            f"data-lane=\"{escape(run['lane'])}\" style=\"box-shadow: inset 4px 0 {color}\">"
            f"{times}<td>{escape(run['kind'])}</td><td>{run['rank']}</td>"
            f"<td>{escape(run['lane'])}</td><td>{escape(run['name'])}{more}{note}</td>"
            f"<td>{escape(_categories(run))}</td></tr>")
    return (f"<table class=\"critical-path\"><caption>critical path, "
            f"{path['length_ms']:.3f} ms: {escape(kinds)}<br>by category (ms): "
            f"{escape(categories)}<br>{legend}</caption><tr><th>from ms</th><th>to ms</th>"
            "<th>ms</th><th>kind</th><th>rank</th><th>lane</th><th>op</th><th>category (ms)"
            f"</th></tr>{''.join(rows)}</table>")
