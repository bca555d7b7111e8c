"""The HTML diff: the verdict with its interval and p-value, the before and after waterfalls of a
representative step drawn over the same time span (each from its own step start; with several
runs per side, of the run closest to the side's step time), bubble time per root cause side by
side, and a table of the changes. One self-contained page (plotly.js inlined once); the waterfalls
are `reports.waterfall`'s."""

from __future__ import annotations

from html import escape
from pathlib import Path

import plotly.graph_objects as go

from reports.markdown import (
    SPREAD,
    diff_bubble_title,
    gate_line,
    ms,
    pct,
    runs_text,
    spread_cells,
    verdict_line,
)
from reports.waterfall import MAX_SEGMENTS, step_window, waterfall
from tracegraph.analysis.analyze import Analysis
from tracegraph.verify import metrics

NS_PER_MS = 1e6
SIDE_COLORS = {"before": "#bab0ac", "after": "#3b6fb6"}


def write_diff_html(before: Analysis, after: Analysis, report: dict[str, object],
                    path: Path) -> Path:
    """Write the diff page to `path`."""
    path = Path(path)
    path.write_text(render_diff(before, after, report), encoding="utf-8")
    return path


def render_diff(before: Analysis, after: Analysis, report: dict[str, object]) -> str:
    """The diff page as HTML text."""
    figures = [*diff_waterfalls(before, after), category_bars(report)]
    body = "\n".join(fig.to_html(include_plotlyjs=i == 0, full_html=False)
                     for i, fig in enumerate(figures))
    title = escape(verdict_line(report))
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>tracegraph diff</title>"
            f"</head><body style='font-family:sans-serif'><h2>{title}</h2>"
            f"<p>before <code>{escape(report['before']['source'])}</code> · after "
            f"<code>{escape(report['after']['source'])}</code></p>"
            f"<p><i>{escape(report['noise']['note'])}; {escape(gate_line(report))}</i></p>"
            + "".join(f"<p><b>⚠️ {escape(line)}</b></p>" for line in report.get("warnings", []))
            + f"\n{body}\n{changes_table(report)}\n</body></html>\n")


def changes_table(report: dict[str, object]) -> str:
    """Step time, bubble time per cause and the chains that changed, each with its interval and
    p-value when the runs give a noise estimate."""
    estimated = report["noise"]["estimated"]
    step = report["step_time"]
    rows = [["step time", "", ms(step["before_ms"]), ms(step["after_ms"]),
             pct(step["change_pct"]), *spread_cells(step, estimated)]]
    rows += [["bubbles", r["category"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"]),
              *spread_cells(r, estimated)] for r in report["bubbles"]]
    rows += [[f"chain {state}", f"rank {c['rank']} {c['category']} ← rank {c['root']['rank']} "
              f"{c['root']['op']} (runs {runs_text(c, report)})", ms(c["before_ms"]),
              ms(c["after_ms"]), ms(c["change_ms"]), *spread_cells(c, estimated)]
             for state, chains in report["chains"].items() for c in chains]
    head = ["", "what", "before", "after", "change", *SPREAD[:2 * estimated]]
    cells = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>"
                    for row in rows)
    return ("<h3>Changes</h3><table border='1' cellspacing='0' cellpadding='3'><tr>"
            + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr>{cells}</table>")


def diff_waterfalls(before: Analysis, after: Analysis) -> list[go.Figure]:
    """The two waterfalls, each of its median step, with x ranges of equal length."""
    chosen = [(analysis, median_step(analysis)) for analysis in (before, after)]
    windows = [step_window(analysis, step) for analysis, step in chosen]
    span = max(hi - lo for lo, hi in windows) / NS_PER_MS
    figures = []
    for side, (analysis, step), (lo, _) in zip(("before", "after"), chosen, windows,
                                                strict=True):
        fig = waterfall(analysis, step, max_segments=MAX_SEGMENTS // 2)
        x0 = (lo - analysis.origin) / NS_PER_MS
        fig.update_layout(title=f"{side}: step {step} of {analysis.trace.source.name} "
                                f"({metrics.step_ms(analysis).get(step, float('nan')):.3f} ms)",
                          xaxis_range=[x0, x0 + span])
        figures.append(fig)
    return figures


def category_bars(report: dict[str, object]) -> go.Figure:
    """Bubble rank·ms per step by root-cause category (summed over ranks), before next to
    after."""
    rows = report["bubbles"]
    fig = go.Figure([go.Bar(x=[r["category"] for r in rows], y=[r[f"{side}_ms"] for r in rows],
                            name=side, marker_color=color)
                     for side, color in SIDE_COLORS.items()])
    fig.update_layout(barmode="group", template="plotly_white", height=380,
                      title=diff_bubble_title(report), yaxis_title="rank·ms per step")
    return fig


def median_step(analysis: Analysis) -> int:
    """The step whose time is closest to the median step time (-1 when there are no steps)."""
    steps = metrics.step_ms(analysis)
    target = metrics.step_time_ms(analysis)
    return min(steps, key=lambda s: abs(steps[s] - target)) if steps else -1
