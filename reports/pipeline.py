"""The pipeline view of one step: a row per stage (rank), F/B/W blocks labelled by microbatch,
and the measured bubble ratio beside the theoretical (p − 1)/(v·m)."""

from __future__ import annotations

import plotly.graph_objects as go

from tracegraph.analysis.pipeline import FB, B, F, Pipeline, W

PHASE_COLORS = {F: "#4c9be8", B: "#5bb85b", W: "#a173d1", FB: "#3aa39a"}
MAX_LABELLED = 3_000  # blocks beyond this many are drawn without their microbatch label
NS_PER_MS = 1e6
SHOWN_STEPS = 4  # steps listed in the terminal


def pipeline_figure(pipeline: Pipeline, step: int, origin: int) -> go.Figure:
    """Stage × time bars for `step`, ms from `origin` (aligned ns)."""
    blocks = pipeline.blocks[pipeline.blocks["step"] == step]
    blocks = blocks.assign(row=[f"replica {p} · stage {s} · r{r}" for p, s, r in zip(
        blocks["replica"], blocks["stage"], blocks["rank"], strict=True)])
    rows = list(dict.fromkeys(blocks.sort_values(["replica", "stage", "rank"])["row"]))
    chunked = blocks.groupby("rank")["chunk"].nunique().max() > 1
    fig = go.Figure()
    for phase, part in blocks.groupby("phase", sort=False):
        label = part["microbatch"].astype(str)
        if chunked:
            label = "c" + part["chunk"].astype(str) + "·" + label
        fig.add_trace(go.Bar(
            y=part["row"], base=(part["start"] - origin) / NS_PER_MS,
            x=(part["end"] - part["start"]) / NS_PER_MS, orientation="h", name=phase,
            marker={"color": PHASE_COLORS.get(phase, "#999"), "line": {"width": 0.5,
                                                                         "color": "#fff"}},
            text=label if len(blocks) <= MAX_LABELLED else None, textposition="inside", textangle=0,
            insidetextanchor="middle",
            hovertext=[f"{phase} mb={m} chunk={c}<br>{s:.3f} ms +{d:.3f} ms, work {w:.3f} ms"
                       for m, c, s, d, w in zip(
                           part["microbatch"], part["chunk"], (part["start"] - origin) / 1e6,
                           (part["end"] - part["start"]) / 1e6, part["work"] / 1e6,
                           strict=True)],
            hoverinfo="text"))
    fig.update_layout(
        template="plotly_white", barmode="overlay", title=_title(pipeline, step),
        height=max(260, 40 * len(rows) + 140), xaxis={"title": "ms (aligned clocks)"},
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
        legend={"orientation": "h"}, margin={"l": 10, "r": 10, "t": 70, "b": 40})
    return fig


def pipeline_lines(summary: dict | None) -> list[str]:
    """The recovered pipeline (`Pipeline.as_dict`) as terminal lines: each step's bubble ratio
    against the theory of the schedule found, or why it is not drawn."""
    if not summary:
        return []
    if not summary["steps"]:
        return [f"\npipeline ({summary['source']}): not recovered: {summary['reason']}"]
    lines = [f"\npipeline ({summary['source']}):"]
    lines += [f"  step {s['step']}: p={s['stages']} v={s['chunks']} m={s['microbatches']}, "
              f"bubble ratio measured {s['measured']:.3f} vs theory (p−1)/(v·m) "
              f"{s['theory']:.3f}" for s in summary["steps"][:SHOWN_STEPS]]
    if len(summary["steps"]) > SHOWN_STEPS:
        lines.append(f"  … {len(summary['steps']) - SHOWN_STEPS} more steps")
    if summary["reason"]:
        lines.append(f"  not drawn: {summary['reason']}")
    return lines


def _title(pipeline: Pipeline, step: int) -> str:
    ratio = pipeline.bubble_ratio(step)
    text = f"pipeline, step {step} ({pipeline.source})"
    if ratio is not None:
        text += (f"<br><sub>bubble ratio measured {ratio.measured:.3f} vs theory (p−1)/(v·m) = "
                 f"{ratio.theory:.3f} (p={ratio.stages}, v={ratio.chunks}, "
                 f"m={ratio.microbatches})</sub>")
    return text
