"""What-if predictions and gain ceilings, as terminal text and as an HTML report section.

Renders what `tracegraph.whatif.summary` and `tracegraph.whatif.ceilings` return; the predicted
waterfall is the measured one's figure (reports/waterfall.py) drawn from the replayed times.
"""

from __future__ import annotations

import dataclasses
from html import escape

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from reports.terminal import styled
from reports.waterfall import MAX_SEGMENTS, waterfall
from tracegraph.whatif.predict import Prediction
from tracegraph.whatif.summary import summarize_prediction

SHOWN = 10  # bubbles and path segments listed per table in the terminal
SHOWN_RANKS = 16  # rank rows listed in the terminal
MAX_PAIRS = 4  # steps whose measured and predicted waterfalls the report draws
PAGE_STYLE = (".whatif-pair { display: flex; flex-wrap: wrap; gap: 1em; } "
              ".whatif-pair > div { flex: 1 1 640px; min-width: 0; }")


# --- terminal --------------------------------------------------------------------------------
def print_prediction(console: Console, summary: dict[str, object]) -> None:
    """Edits, replay error, step times and gain, bubbles gone and left, the new critical path."""
    console.print(f"what-if on {summary['source']}", highlight=False, markup=False)
    for edit in summary["edits"]:
        console.print(f"  {edit['edit']}: {edit['change']}", highlight=False, markup=False)
    replay = summary["replay"]
    console.print(f"replay of the measurement: largest error {replay['max_error_pct']:.3f} % of "
                  f"a rank's step (predictions need at most {replay['limit_pct']:.0f} %)",
                  highlight=False)
    for step, why in summary["refused"].items():
        console.print(Text.assemble((f"step {step} not predicted:", "red"), f" {why}"),
                      highlight=False)
    time = summary["step_time"]
    if not time:
        return
    steps = len(summary["steps"])
    console.print(Text.assemble(
        (f"step time {time['measured_ms']:.1f} → {time['predicted_ms']:.1f} ms predicted: gain "
         f"{time['gain_ms']:.1f} ms ({time['gain_pct']:.1f} %)", "bold"),
        f", {_gain_spread(time, steps)}"), highlight=False)
    _table(console, "per step (slowest rank)", ("step", "measured ms", "predicted ms",
                                                "gain ms", "slowest rank"),
           [(s["step"], f"{s['measured_ms']:.3f}", f"{s['predicted_ms']:.3f}",
             f"{s['gain_ms']:+.3f}", s["slowest_rank"]) for s in summary["steps"]])
    ranks = sorted(summary["ranks"], key=lambda r: -r["predicted_ms"])
    _table(console, "per rank and step" + (f" (the {SHOWN_RANKS} slowest predicted of "
                                             f"{len(ranks)}; --json lists all)"
                                             if len(ranks) > SHOWN_RANKS else ""),
           ("rank", "step", "measured ms", "predicted ms"),
           [(r["rank"], r["step"], f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}")
            for r in sorted(ranks[:SHOWN_RANKS], key=lambda r: (r["step"], r["rank"]))])
    bubbles = summary["bubbles"]
    counts = ", ".join(f"{n} {state}" for state, n in bubbles["counts"].items())
    console.print(f"bubbles: {counts or 'none'}", highlight=False)
    for title, rows in (("vanish", bubbles["vanished"]), ("remain", bubbles["remaining"])):
        _table(console, f"bubbles that {title} (longest first)",
               ("waiting", "step", "at ms", "cause", "measured ms", "predicted ms"),
               [(f"rank {b['rank']} {b['lane']} {b['name'][:30]}", b["step"],
                 f"{b['start_ms']:.3f}", b["category"], f"{b['measured_ms']:.3f}",
                 f"{b['predicted_ms']:.3f}") for b in rows[:SHOWN]])
    for step, path in summary["critical_path"].items():
        kinds = ", ".join(f"{k} {ms:.1f}" for k, ms in path["by_kind"].items())
        console.print(f"predicted critical path, step {step}: {path['length_ms']:.1f} ms "
                      f"({kinds})", highlight=False)
        longest = sorted(path["segments"], key=lambda s: s["start_ms"] - s["end_ms"])[:SHOWN]
        for seg in sorted(longest, key=lambda s: s["start_ms"]):
            console.print(styled(f"    {seg['start_ms']:.3f}–{seg['end_ms']:.3f} "
                                 f"{seg['end_ms'] - seg['start_ms']:9.3f} ms  {seg['kind']:<8} "
                                 f"rank {seg['rank']} {seg['lane']}  {seg['name'][:50]}"
                                 + (f"  [{seg['category']}]" if seg.get("category") else "")),
                          highlight=False)
    for note in summary["notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)


def print_ceilings(console: Console, ceilings: dict[str, object] | None) -> None:
    """Per root cause: what removing it saves at most, by replay; the rule that they do not
    add."""
    if not ceilings or not (ceilings.get("causes") or ceilings.get("refused")):
        return
    for why in ceilings.get("refused", []):
        console.print(f"gain ceilings not computed: {why}", highlight=False, markup=False)
    if not ceilings["causes"]:
        return
    console.print("\ngain ceilings by replay (removing each cause alone, median over steps):",
                  highlight=False)
    for row in ceilings["causes"]:
        if row["ceiling_ms"] is None:
            line = f"  {row['category']:<18} no ceiling: {row['why']}"
        else:
            line = (f"  {row['category']:<18} saves at most {row['ceiling_ms']:.1f} ms "
                    f"({row['ceiling_pct']:.1f} % of the step)   [{row['edit']}]")
        console.print(styled(line), highlight=False)
    if ceilings["rule"]:
        console.print(f"  {ceilings['rule']}", highlight=False, markup=False)


def print_checked(console: Console, checked: dict[str, object]) -> None:
    """`diff --predicted`: the prediction next to the measured after-bundle."""
    error = checked["error_pct"]
    console.print(f"predicted {_ms(checked['predicted_ms'])} ms, measured "
                  f"{_ms(checked['measured_ms'])} ms after the fix"
                  + (f" (prediction off by {error:+.1f} %)" if error is not None else "")
                  + (f"; the fix delivered {checked['delivered_pct']:.0f} % of the predicted "
                     f"gain" if checked["delivered_pct"] is not None else ""), highlight=False)
    _table(console, "predicted vs measured after, per rank (median over steps)",
           ("rank", "predicted ms", "measured ms", "error %"),
           [(r["rank"], _ms(r["predicted_ms"]), _ms(r["measured_ms"]),
             "" if r["error_pct"] is None else f"{r['error_pct']:+.2f}")
            for r in checked["ranks"]])


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def _table(console: Console, title: str, headers: tuple[str, ...], rows: list[tuple]) -> None:
    if not rows:
        return
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, justify="right" if header.endswith(("ms", "%")) else "left",
                         overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)


# --- HTML ------------------------------------------------------------------------------------
def whatif_sections(prediction: Prediction | None, figures: list[str], figure_html
                    ) -> list[str]:
    """The report's what-if section ([] without a prediction): edits, step times and gain, the
    bubbles that vanish, and per predicted step the measured waterfall beside the predicted one
    (`figure_html` embeds a figure, plotly.js with the page's first)."""
    if prediction is None:
        return []
    summary = summarize_prediction(prediction)
    time = summary["step_time"]
    parts = ["<section class=\"whatif\"><h2>What if</h2>", f"<style>{PAGE_STYLE}</style>",
             "<ul>" + "".join(f"<li><b>{escape(e['edit'])}</b>: {escape(e['change'])}</li>"
                              for e in summary["edits"]) + "</ul>"]
    parts += [f"<p class=\"note\">step {escape(s)} not predicted: {escape(why)}</p>"
              for s, why in summary["refused"].items()]
    if time:
        parts.append(f"<p><span class=\"kpi\">step time <b>{time['measured_ms']:.1f} → "
                     f"{time['predicted_ms']:.1f} ms</b></span><span class=\"kpi\">gain <b>"
                     f"{time['gain_ms']:.1f} ms ({time['gain_pct']:.1f} %)</b>, "
                     f"{_gain_spread(time, len(summary['steps']))}</span>"
                     f"<span class=\"kpi\">replay error ≤ "
                     f"{summary['replay']['max_error_pct']:.3f} %</span></p>")
        parts.append(_bubble_table(summary["bubbles"]["vanished"]))
    predicted = predicted_analysis(prediction)
    drawn = _drawn_steps(summary)
    count = max(len(drawn), 1)
    for step in drawn:
        measured = waterfall(prediction.analysis, step, top=0, max_segments=MAX_SEGMENTS // (
            4 * count))
        after = waterfall(predicted, step, top=0, max_segments=MAX_SEGMENTS // (4 * count))
        measured.update_layout(title=f"step {step}: measured")
        after.update_layout(title=f"step {step}: predicted",
                            xaxis={"range": measured.layout.xaxis.range})
        parts.append(f"<div class=\"whatif-pair\"><div>{figure_html(measured, figures)}</div>"
                     f"<div>{figure_html(after, figures)}</div></div>")
    return ["\n".join([*parts, "</section>"])]


def _drawn_steps(summary: dict[str, object]) -> list[int]:
    """The predicted steps drawn: the MAX_PAIRS slowest measured, in order."""
    steps = sorted(summary["steps"], key=lambda s: -s["measured_ms"])[:MAX_PAIRS]
    return sorted(int(s["step"]) for s in steps)


def predicted_analysis(prediction: Prediction):
    """The analysis with its ops at their predicted times (host-side stream waits at when they
    pass), its steps as replayed, no bubbles, and the predicted critical paths."""
    analysis, after = prediction.analysis, prediction.after
    graph = analysis.graph
    start, end = after.start.copy(), after.end.copy()
    start[graph.host_side] = end[graph.host_side]
    steps = after.steps[["rank", "step", "start", "end"]]
    paths = {step: prediction.critical_path(step) for step in prediction.predicted}
    return dataclasses.replace(analysis, start=np.asarray(start), end=np.asarray(end),
                               steps=steps, bubbles=[], critical_paths=paths)


def ceilings_html(ceilings: dict[str, object] | None) -> str:
    """The gain ceilings as a table with the rule under it."""
    if not ceilings or not ceilings.get("causes"):
        return ""
    rows = "".join(
        f"<tr><td>{escape(r['category'])}</td><td class=\"n\">"
        + ("–" if r["ceiling_ms"] is None else f"{r['ceiling_ms']:.3f}") + "</td><td class=\"n\">"
        + ("" if r["ceiling_ms"] is None else f"{r['ceiling_pct']:.1f}") + "</td><td>"
        + escape(r.get("edit") or r.get("why", "")) + "</td></tr>" for r in ceilings["causes"])
    return (f"<table class=\"ceilings\"><caption>gain ceilings by replay: what removing each "
            f"cause alone saves at most (median over steps)</caption><tr><th>cause</th>"
            f"<th>ms</th><th>% of step</th><th>modelled as</th></tr>{rows}</table>"
            + (f"<p class=\"note\">{escape(ceilings['rule'])}</p>" if ceilings["rule"] else ""))


def _bubble_table(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "<p class=\"note\">No bubble vanishes.</p>"
    body = "".join(f"<tr><td>rank {b['rank']} · {escape(b['lane'])} · {escape(b['name'])}</td>"
                   f"<td>{b['step']}</td><td class=\"n\">{b['start_ms']:.3f}</td>"
                   f"<td>{escape(b['category'])}</td><td class=\"n\">{b['measured_ms']:.3f}</td>"
                   f"<td class=\"n\">{b['predicted_ms']:.3f}</td></tr>" for b in rows)
    return ("<table class=\"vanished\"><caption>bubbles that vanish</caption><tr><th>waiting"
            "</th><th>step</th><th>at ms</th><th>cause</th><th>measured ms</th><th>predicted ms"
            f"</th></tr>{body}</table>")


def _gain_spread(time: dict[str, float], steps: int) -> str:
    """"median of 2 steps; gain per step: best 201.1 ms, worst 200.6 ms" ("1 step": no spread)."""
    if steps < 2:
        return "1 step"
    return (f"median of {steps} steps; gain per step: best {time['best_gain_ms']:.1f} ms, "
            f"worst {time['worst_gain_ms']:.1f} ms")
