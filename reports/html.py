"""The HTML report: one self-contained page (plotly.js embedded, no network) per analysis.

Per step: the step time, bubble share (rank·ms summed over the ranks), the slowest rank's own
exposed bubble time by cause, the top causes, the waterfall (reports/waterfall.py) and, when stages
and microbatches can be recovered, the pipeline view (reports/pipeline.py). Then the bubble time
per category (rank·ms, summed over ranks), the clock offsets applied and the warnings.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import plotly.graph_objects as go

from reports.critical_path import path_table
from reports.findings import findings_html
from reports.markdown import rank_sum
from reports.pipeline import pipeline_figure
from reports.waterfall import MAX_SEGMENTS, waterfall
from reports.whatif import ceilings_html, whatif_sections
from tracegraph import causes
from tracegraph.analysis.analyze import PROGRESS_EVENTS
from tracegraph.analysis.summary import summarize
from tracegraph.progress import Progress
from tracegraph.verify import metrics

MAX_STEPS = 8  # steps drawn when none is chosen: the slowest ones
MAX_OFFSETS_SHOWN = 16  # clock offsets listed in the header (all of them under Totals)
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.kpi { display: inline-block; margin-right: 2em; } .kpi b { font-size: 1.3em; }
.note { color: #666; font-size: 0.9em; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em; }
"""


def render(analysis, *, step: int | None = None, top: int = 10, pipeline=None,
           prediction=None, findings: list | None = None) -> str:
    """The whole report page as a string; with a what-if `prediction`, its section too.
    `findings`: the analysis' (tracegraph.analysis.findings.find_all), found here if None."""
    steps = shown_steps(analysis, step)
    slowest = metrics.slowest_rank_bubbles(analysis)
    figures: list[str] = []
    sections = []
    with Progress("report: steps drawn", total=len(steps),
                  enabled=analysis.trace.event_count > PROGRESS_EVENTS) as bar:
        for s in steps:
            sections.append(_step_section(analysis, s, top, pipeline, figures, len(steps),
                                          slowest.get(s)))
            bar.advance()
    title = f"tracegraph report: {analysis.trace.source}"
    if findings is None:
        from tracegraph.analysis.findings import find_all

        findings = find_all(analysis, pipeline)
    found = [f.as_dict() for f in findings]
    body = [f"<h1>{escape(title)}</h1>", _overview(analysis, steps, pipeline),
            findings_html(found), *sections,
            *whatif_sections(prediction, figures, _figure_html), _totals(analysis, step)]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_report(analysis, path: Path, *, step: int | None = None, top: int = 10,
                 pipeline=None, prediction=None, findings: list | None = None) -> Path:
    """Write the report to `path` (see `render`)."""
    path = Path(path)
    path.write_text(render(analysis, step=step, top=top, pipeline=pipeline,
                           prediction=prediction, findings=findings), encoding="utf-8")
    return path


def shown_steps(analysis, step: int | None) -> list[int]:
    """`step` alone, else the MAX_STEPS slowest steps in order; [-1] for a trace without steps."""
    spans = analysis.steps
    if step is not None:
        if step not in set(spans["step"]):
            known = sorted(int(s) for s in spans["step"].unique())
            raise ValueError(f"step {step} is not in the trace (steps: {known or 'none'})")
        return [step]
    if spans.empty:
        return [-1]
    lengths = spans.assign(dur=spans["end"] - spans["start"]).groupby("step")["dur"].max()
    return sorted(int(s) for s in lengths.nlargest(MAX_STEPS).index)


def _figure_html(fig: go.Figure, figures: list[str]) -> str:
    """A figure's div; the first one of the page carries plotly.js."""
    html = fig.to_html(full_html=False, include_plotlyjs=not figures,
                       config={"displaylogo": False, "scrollZoom": True})
    figures.append(html)
    return html


def _step_section(analysis, step: int, top: int, pipeline, figures: list[str],
                  count: int, slowest: metrics.SlowestRank | None) -> str:
    summary = summarize(analysis, step=None if step < 0 else step, top=top)
    fig = waterfall(analysis, step, top=top, max_segments=MAX_SEGMENTS // count)
    parts = [f"<h2>{'Step ' + str(step) if step >= 0 else 'Whole trace'}</h2>",
             _kpis(summary, slowest), _causes(summary["bubbles"]), _figure_html(fig, figures),
             path_table(summary["critical_path"].get(str(step)))]
    if pipeline is not None and step in pipeline.steps:
        parts.append(_figure_html(pipeline_figure(pipeline, step, analysis.origin), figures))
    return "<section>" + "\n".join(parts) + "</section>"


def _kpis(summary: dict[str, object], slowest: metrics.SlowestRank | None) -> str:
    rows = summary["steps"]
    if not rows:
        return "<p class=\"note\">No ProfilerStep markers: the whole trace is one window.</p>"
    info = rows[0]
    timed = {r: ms for r, ms in info["time_ms"].items() if r not in info.get("from_step_table", [])}
    ranks_ms = sum(timed.values())  # bubbles are measured on the ranks with a timeline only
    bubble_ms = sum(info["bubble_ms"].values())
    share = bubble_ms / ranks_ms if ranks_ms else 0.0
    rank = slowest.rank if slowest else max(info["time_ms"], key=info["time_ms"].get)
    return (f"<p><span class=\"kpi\">step time <b>{info['max_ms']:.1f} ms</b> "
            f"(slowest: rank {rank})</span><span class=\"kpi\">bubble share <b>"
            f"{share:.1%}</b> ({bubble_ms:.1f} of {ranks_ms:.1f} rank·ms, "
            f"{rank_sum(len(timed))})</span>"
            f"<span class=\"kpi\">{summary['bubble_count']} bubbles</span></p>"
            + _slowest(slowest))


def _slowest(slowest: metrics.SlowestRank | None) -> str:
    """The slowest rank's own exposed bubble time in the step, by cause."""
    if slowest is None:
        return ""
    if slowest.stated:
        return (f"<p class=\"note\">rank {slowest.rank} (slowest): its step time is from its "
                "step table; its profile holds no timeline, so its exposed bubble time is "
                "unknown.</p>")
    rows = "".join(f"<tr><td>{cause_label(k)}</td><td class=\"n\">{v:.3f}</td></tr>"
                   for k, v in slowest.by_cause.items())
    return (f"<table class=\"slowest\"><caption>rank {slowest.rank} (slowest): its own exposed "
            f"bubble time, <b>{slowest.exposed_ms:.3f} ms</b></caption>"
            f"<tr><th>category</th><th>ms</th></tr>{rows}</table>")


def _causes(bubbles: list[dict[str, object]]) -> str:
    if not bubbles:
        return "<p class=\"note\">No bubble above the threshold.</p>"
    head = ("<tr><th>#</th><th>category</th><th>ms</th><th>waiting</th><th>at ms</th>"
            "<th>root rank</th><th>root lane</th><th>root op</th><th>also (≥ 5 %)</th>"
            "<th>chain</th><th>confidence</th></tr>")
    body = []
    for number, b in enumerate(bubbles, start=1):
        root = b["root"] or {}
        note = f"<br><span class=\"note\">{escape(root['note'])}</span>" if root.get(
            "note") else ""
        body.append(
            f"<tr><td>{number}</td><td>{cause_label(b['category'])}</td><td class=\"n\">"
            f"{b['dur_ms']:.3f}</td><td>rank {b['rank']} · {escape(b['lane'])} · "
            f"{escape(b['name'])}</td><td class=\"n\">{b['start_ms']:.3f}</td>"
            f"<td>{root.get('rank', '')}</td><td>{escape(str(root.get('lane', '')))}</td>"
            f"<td>{escape(str(root.get('name', '')))}{note}{_profile(root)}</td>"
            f"<td>{_other_causes(b)}</td>"
            f"<td>{' → '.join(map(str, b['chain']))}</td>{_confidence_cell(b)}</tr>")
    return f"<table class=\"causes\">{head}{''.join(body)}</table>"


def _other_causes(bubble: dict[str, object]) -> str:
    """The bubble's causes after its root, each with its time, share and origin."""
    return "<br>".join(
        f"{cause_label(c['category'])} {c['ms']:.1f} ms ({c['share']:.0%}): rank {c['rank']} · "
        f"{escape(str(c['name']))}"
        + (f" · group {escape(str(c['absent_group']))}" if c.get("absent_group") else "")
        + _profile(c) for c in (bubble.get("causes") or [])[1:])


def _profile(cause: dict[str, object]) -> str:
    """Whom to profile for a cause waiting on ranks absent from the bundle."""
    ranks = cause.get("profile_ranks") or []
    if not ranks:
        return ""
    shown = ", ".join(map(str, ranks[:8])) + (f" … ({len(ranks)} in all)" if len(ranks) > 8
                                              else "")
    return f"<br><span class=\"note\">profile ranks {shown}</span>"


def _confidence_cell(bubble: dict[str, object]) -> str:
    """How sure the chain is; its least sure link on hover."""
    confidence = bubble.get("confidence") or {}
    link = escape(str(confidence.get("weakest_link", "every link matched by ids or sequences")))
    return f"<td title=\"{link}\">{escape(str(confidence.get('level', '')))}</td>"


def cause_label(name: str) -> str:
    """A category as HTML: its waterfall colour, its name, its meaning on hover."""
    cause = causes.get(name)
    return (f"<span title=\"{escape(cause.meaning)}\"><span class=\"swatch\" "
            f"style=\"background:{cause.color}\"></span>{escape(name)}</span>")


def _overview(analysis, steps: list[int], pipeline) -> str:
    ranks = analysis.trace.rank_ids
    shown = ", ".join(str(s) for s in steps) if steps != [-1] else "whole trace"
    source = "" if pipeline is None else (f"; pipeline from {pipeline.source}" if len(
        pipeline.blocks) else f"; pipeline ({pipeline.source}) not drawn: {pipeline.reason}")
    offsets = sorted(analysis.offsets.items())
    clocks = ", ".join(f"r{r} {ns / 1e3:+.1f}" for r, ns in offsets[:MAX_OFFSETS_SHOWN])
    clocks += " …" if len(offsets) > MAX_OFFSETS_SHOWN else ""
    return (f"<p>{len(ranks)} ranks, {len(analysis.ops):,} timeline ops; steps shown: {shown}"
            f"{escape(source)}. Clock offsets applied (µs): {clocks or 'none'}.</p>"
            "<p class=\"note\">Times are ms from the first step's start on aligned clocks. "
            "Bars: ops by kind (short ops merged below a pixel); band under a row: bubbles "
            "coloured by the cause they are charged to; shaded rows: those the critical path "
            "runs through, its segments drawn above the ops coloured by kind (legend: "
            "critical path); arrows: causal chain of the top bubbles.</p>")


def _totals(analysis, step: int | None) -> str:
    summary = summarize(analysis, step=step, top=0)
    blame = "".join(f"<tr><td>{cause_label(k)}</td><td class=\"n\">{v:.3f}</td>"
                    f"<td>{escape(causes.get(k).meaning)}</td></tr>"
                    for k, v in summary["blame"].items())
    offsets = "".join(f"<tr><td>{r}</td><td class=\"n\">{ns / 1e3:+.1f}</td></tr>"
                      for r, ns in summary["clock_offsets_ns"].items())
    warnings = analysis.trace.warnings + summary["warnings"]
    ranks = f"{rank_sum(len(analysis.trace.rank_ids))} (rank·ms)"
    parts = ["<h2>Totals</h2>", f"<table class=\"blame\"><caption>bubble time by cause, "
             f"{'all steps' if step is None else f'step {step}'}, {ranks}</caption>"
             f"<tr><th>category</th><th>bubble rank·ms</th><th>meaning</th></tr>{blame}</table>",
             ceilings_html(summary["gain_ceilings"]),
             "<table class=\"offsets\"><tr><th>rank</th><th>clock offset applied (µs)</th>"
             f"</tr>{offsets}</table>"]
    if summary["slow_ranks"]:
        parts.append(f"<p>compute stragglers: {summary['slow_ranks']}</p>")
    if warnings:
        parts.append("<ul class=\"warnings\">" + "".join(
            f"<li>{escape(w)}</li>" for w in warnings) + "</ul>")
    return "\n".join(parts)
