"""The waterfall of one step: a row per rank × lane, ops by kind, bubbles by blame, the critical
path (its rows shaded, its segments coloured by kind), and the causal chain of each top bubble
drawn as arrows across ranks.

Sizes stay bounded whatever the profile: ops narrower than one pixel of the overview (the step span
over OVERVIEW_PX) merge, per lane, with their short neighbours into one block, and the resolution
doubles until a figure holds at most its share of MAX_SEGMENTS blocks. Each block costs about
120 bytes of HTML (binary float32 coordinates plus one hover line), so a page with plotly.js
(4.8 MB) stays under SIZE_BUDGET_MB: measured 10.9 MB for a synthetic one-million-op trace
(tests/test_report.py), 5.0 MB for the full `large` simulated scenario, 4 M ops (bench/README.md,
"Large report"; tests/test_large_report.py renders a reduced one in chromium). Everything is
drawn with WebGL traces (`Scattergl`), never shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from reports.critical_path import KIND_COLORS as PATH_KIND_COLORS
from tracegraph import causes, schema
from tracegraph.analysis.blame import Bubble

OVERVIEW_PX = 1600  # plot width whose pixel is the merge resolution
MAX_SEGMENTS = 60_000  # op blocks over all the figures of one page
MAX_BUBBLE_PIECES = 4_000  # longest bubble intervals drawn per figure
MAX_CHAINS = 5  # top bubbles whose causal chain is drawn as arrows
MIN_PIECE = 0.02  # chain links shorter than this share of their bubble are not drawn
SIZE_BUDGET_MB = 20
NS_PER_MS = 1e6
ROW_PX = 24
KIND_COLORS = {
    schema.COMPUTE: "#3b6fb6", schema.HOST: "#7fa7d9", schema.MARKER: "#c9d4e4",
    schema.MEMCPY: "#8c6bb1", schema.COLLECTIVE: "#2ca02c", schema.P2P: "#17becf",
    schema.WAIT: "#b0b0b0", schema.RECORD: "#555555", schema.COMM_TASK: "#a1d99b",
}
CATEGORY_COLORS = causes.COLORS  # the bubble band's colours, one per root-cause category
PATH_GROUP = "critical path"
PATH_ROWS = "rows it runs through"
PATH_ROW_COLOR = "rgba(255, 196, 0, 0.22)"
MAIN_LANES = "main lanes"
OTHER_LANES = "comm planes & host threads"
BUBBLES = "bubbles, by cause"


@dataclass
class Rows:
    """The figure's rows: main lanes first (one per rank), then every other lane by rank."""

    lane_row: np.ndarray  # lane_id -> row, -1 when not shown
    labels: list[str]
    main: int  # rows 0..main-1 are main lanes
    by_lane: dict[tuple[int, str], int]
    main_of: dict[int, int]  # rank -> its main row


@dataclass
class Blocks:
    """Ops merged below the resolution: one entry per drawn block."""

    first: np.ndarray  # index (into the merged arrays' source) of the block's first op
    start: np.ndarray
    end: np.ndarray
    count: np.ndarray
    kind: np.ndarray  # dominant kind code (by time)


def step_window(analysis, step: int) -> tuple[int, int]:
    """Aligned [start, end] ns of a step over all ranks (the whole trace for step -1)."""
    steps = analysis.steps[analysis.steps["step"] == step]
    if len(steps):
        return int(steps["start"].min()), int(steps["end"].max())
    start, end = analysis.start, analysis.end
    return (int(start.min()), int(end.max())) if len(start) else (0, 1)


def waterfall(analysis, step: int, *, top: int = 5, max_segments: int = MAX_SEGMENTS
              ) -> go.Figure:
    """The waterfall figure of `step` (ProfilerStep number, -1 for a trace without steps)."""
    lo, hi = step_window(analysis, step)
    start, end = analysis.start, analysis.end
    inside = np.flatnonzero((end > lo) & (start < hi))
    rows = lane_rows(analysis.ops.lanes)
    origin = analysis.origin
    fig = go.Figure()
    path = analysis.critical_paths.get(step, [])
    _shade_path_rows(fig, path, rows, (lo, hi), origin)
    _add_ops(fig, analysis, rows, inside, start, end, (lo, hi), origin, max_segments)
    bubbles = [b for b in analysis.bubbles if b.step == step]
    _add_bubbles(fig, bubbles, rows, origin)
    _add_path(fig, path, rows, (hi - lo) / OVERVIEW_PX, origin)
    fig.update_layout(annotations=chain_arrows(bubbles[:min(top, MAX_CHAINS)], rows, origin))
    _layout(fig, rows, step, (lo - origin) / NS_PER_MS, (hi - origin) / NS_PER_MS)
    return fig


# --- rows ------------------------------------------------------------------------------------
def lane_rows(lanes: pd.DataFrame) -> Rows:
    """A row per lane: main lanes by rank, then the other lanes by rank (same rows every step)."""
    ordered = lanes.sort_values(["main", "rank", "lane"], ascending=[False, True, True])
    lane_row = np.full(len(lanes), -1, dtype=np.int64)
    lane_row[ordered["lane_id"].to_numpy()] = np.arange(len(ordered))
    labels = [f"r{r} · {lane}" for r, lane in zip(ordered["rank"], ordered["lane"], strict=True)]
    by_lane = {(int(r), str(lane)): i for i, (r, lane) in enumerate(
        zip(ordered["rank"], ordered["lane"], strict=True))}
    main = ordered[ordered["main"]]
    return Rows(lane_row, labels, len(main), by_lane,
                {int(r): i for i, r in enumerate(main["rank"])})


def _row_of(rows: Rows, rank: int, lane: str) -> int:
    return rows.by_lane.get((rank, lane), rows.main_of.get(rank, -1))


# --- merging ---------------------------------------------------------------------------------
def merge_blocks(row: np.ndarray, start: np.ndarray, end: np.ndarray, kind: np.ndarray,
                 resolution: float, limit: int) -> Blocks:
    """Merge runs of ops shorter than `resolution` ns whose gaps are shorter too, per row;
    coarsen the resolution until at most `limit` blocks remain. Input sorted by (row, start)."""
    if not len(row):
        empty = np.zeros(0, dtype=np.int64)
        return Blocks(empty, empty, empty, empty, empty)
    base = int(start.min())
    s, e = start - base, end - base
    span = int(max(e.max(), s.max())) + 1
    reach = np.maximum.accumulate(e + row * span) - row * span  # running end within each row
    resolution = max(float(resolution), 1.0)
    while True:
        short = (e - s) < resolution
        new = np.ones(len(row), dtype=bool)
        new[1:] = ((row[1:] != row[:-1]) | ~short[1:] | ~short[:-1]
                   | (s[1:] - reach[:-1] > resolution))
        first = np.flatnonzero(new)
        if len(first) <= limit:
            break
        resolution *= 2
    block = np.cumsum(new) - 1
    kinds = int(kind.max()) + 1
    weight = np.bincount(block * kinds + kind, weights=(e - s).astype(float),
                         minlength=len(first) * kinds).reshape(len(first), kinds)
    return Blocks(first, start[first], np.maximum.reduceat(end, first),
                  np.diff(np.append(first, len(row))), weight.argmax(axis=1))


# --- traces ----------------------------------------------------------------------------------
def _add_ops(fig: go.Figure, analysis, rows: Rows, inside: np.ndarray, start: np.ndarray,
             end: np.ndarray, window: tuple[int, int], origin: int, max_segments: int) -> None:
    frame = analysis.ops.frame
    row = rows.lane_row[frame["lane_id"].to_numpy()[inside]]
    order = np.lexsort((start[inside], row))
    idx, row = inside[order], row[order]
    kinds = np.array(schema.KINDS)
    code = pd.Categorical(frame["kind"].to_numpy()[idx], categories=kinds).codes.astype(np.int64)
    lo, hi = window
    s, e = np.maximum(start[idx], lo), np.minimum(end[idx], hi)
    blocks = merge_blocks(row, s, e, np.maximum(code, 0), (hi - lo) / OVERVIEW_PX, max_segments)
    text = _op_text(analysis, idx[blocks.first], blocks, kinds, origin)
    block_row = row[blocks.first]
    for main, group in ((True, MAIN_LANES), (False, OTHER_LANES)):
        for k, kind in enumerate(kinds):
            pick = (blocks.kind == k) & ((block_row < rows.main) == main)
            if pick.any():
                _segments_trace(fig, blocks.start[pick], blocks.end[pick], block_row[pick],
                                text[pick], origin, name=kind, color=KIND_COLORS[kind],
                                width=_bar_px(rows), group=group)


def _op_text(analysis, first: np.ndarray, blocks: Blocks, kinds: np.ndarray, origin: int
             ) -> np.ndarray:
    """Hover text: the op itself for single-op blocks, a count and the dominant kind otherwise."""
    frame = analysis.ops.frame.iloc[first]
    nbytes = analysis.trace.events["bytes"].reindex(frame["event"]).fillna(-1).to_numpy()
    start_ms = (blocks.start - origin) / NS_PER_MS
    dur_ms = (blocks.end - blocks.start) / NS_PER_MS
    out = []
    for i, (rank, lane, name, kind, group, peer, b) in enumerate(zip(
            frame["rank"], frame["lane"], frame["name"], frame["kind"], frame["group"],
            frame["peer"], nbytes, strict=True)):
        where = f"r{rank} · {lane}<br>{start_ms[i]:.3f} ms +{dur_ms[i]:.3f} ms"
        if blocks.count[i] > 1:
            out.append(f"{blocks.count[i]} ops merged, mostly {kinds[blocks.kind[i]]}<br>{where}")
            continue
        extra = (f"<br>group {group}" if group else "") + (f"  peer {peer}" if peer >= 0 else "")
        extra += f"  {int(b):,} B" if b >= 0 else ""
        out.append(f"{name} ({kind})<br>{where}{extra}")
    return np.array(out, dtype=object)


def _segments_trace(fig: go.Figure, start: np.ndarray, end: np.ndarray, row: np.ndarray,
                    text: np.ndarray, origin: int, *, name: str, color: str, width: float,
                    group: str, offset: float = 0.0) -> None:
    """Horizontal bars as one WebGL line trace (NaN-separated) plus invisible hover points;
    the legend lists it under its group's title (a click on the title hides the group)."""
    n = len(start)
    x = np.full(3 * n, np.nan, dtype=np.float32)
    x[0::3], x[1::3] = (start - origin) / NS_PER_MS, (end - origin) / NS_PER_MS
    y = np.full(3 * n, np.nan, dtype=np.float32)
    y[0::3] = y[1::3] = row + offset
    fig.add_trace(go.Scattergl(x=x, y=y, mode="lines", name=name, legendgroup=group,
                               legendgrouptitle={"text": group}, hoverinfo="skip",
                               line={"color": color, "width": width}))
    mid = ((start + end) / 2 - origin) / NS_PER_MS
    fig.add_trace(go.Scattergl(x=mid.astype(np.float32), y=(row + offset).astype(np.float32),
                               mode="markers", name=name, legendgroup=group, showlegend=False,
                               marker={"color": color, "size": 4, "opacity": 0.01},
                               hovertext=text, hoverinfo="text"))


def _add_bubbles(fig: go.Figure, bubbles: list[Bubble], rows: Rows, origin: int) -> None:
    """Each bubble's intervals on its own row, just under the ops, coloured by category."""
    pieces = [(b, p) for b in bubbles for p in b.intervals]
    pieces = sorted(pieces, key=lambda bp: -bp[1].dur)[:MAX_BUBBLE_PIECES]
    table = pd.DataFrame({
        "category": [p.category for _, p in pieces],
        "row": [_row_of(rows, b.rank, b.lane) for b, _ in pieces],
        "start": [p.start for _, p in pieces], "end": [p.end for _, p in pieces],
        "text": [_piece_text(b, p, origin) for b, p in pieces]})
    shown = table[table["row"] >= 0]
    for category in causes.order(set(shown["category"])):
        part = shown[shown["category"] == category]
        _segments_trace(fig, part["start"].to_numpy(), part["end"].to_numpy(),
                        part["row"].to_numpy(), part["text"].to_numpy(), origin,
                        name=category, color=causes.color(category),
                        width=max(_bar_px(rows) / 2, 2), group=BUBBLES, offset=0.3)


def _piece_text(bubble: Bubble, piece, origin: int) -> str:
    note = f"<br>{piece.note}" if piece.note else ""
    return (f"bubble {bubble.name} on rank {bubble.rank} ({bubble.dur / NS_PER_MS:.3f} ms)<br>"
            f"{piece.category}: {(piece.start - origin) / NS_PER_MS:.3f} ms "
            f"+{piece.dur / NS_PER_MS:.3f} ms<br>"
            f"root: rank {piece.rank} · {piece.lane} · {piece.name}{note}")


def _shade_path_rows(fig: go.Figure, path: list, rows: Rows, window: tuple[int, int],
                     origin: int) -> None:
    """The rows the critical path runs through, shaded across the step (under the ops)."""
    ms: dict[int, float] = {}
    for seg in path:
        row = _row_of(rows, seg.rank, seg.lane)
        if row >= 0:
            ms[row] = ms.get(row, 0.0) + (seg.end - seg.start) / NS_PER_MS
    if not ms:
        return
    shaded = np.array(sorted(ms))
    text = np.array([f"critical path runs through {rows.labels[r]}: {ms[r]:.3f} ms"
                     for r in shaded], dtype=object)
    lo, hi = window
    _segments_trace(fig, np.full(len(shaded), lo), np.full(len(shaded), hi), shaded, text,
                    origin, name=PATH_ROWS, color=PATH_ROW_COLOR, width=_bar_px(rows) / 0.45,
                    group=PATH_GROUP)


def _add_path(fig: go.Figure, path: list, rows: Rows, resolution: float, origin: int) -> None:
    """The critical path's segments just above the ops they run through, coloured by kind
    (compute, transfer, wait): one legend entry each."""
    if not path:
        return
    row = np.array([_row_of(rows, s.rank, s.lane) for s in path])
    start = np.array([s.start for s in path], dtype=np.int64)
    end = np.array([s.end for s in path], dtype=np.int64)
    kind = np.array([s.kind for s in path], dtype=object)
    names = np.array([f"{s.name} ({s.kind}, {s.category}, rank {s.rank})" for s in path],
                     dtype=object)
    for name, color in PATH_KIND_COLORS.items():
        keep = (row >= 0) & (kind == name)
        if not keep.any():
            continue
        order = np.lexsort((start[keep], row[keep]))
        r, a, b, n = row[keep][order], start[keep][order], end[keep][order], names[keep][order]
        blocks = merge_blocks(r, a, b, np.zeros(len(r), dtype=np.int64), resolution,
                              MAX_BUBBLE_PIECES)
        text = np.array([f"critical path: {label}" + (f" +{c - 1} more" if c > 1 else "")
                         for label, c in zip(n[blocks.first], blocks.count, strict=True)],
                        dtype=object)
        _segments_trace(fig, blocks.start, blocks.end, r[blocks.first], text, origin,
                        name=f"{PATH_GROUP} · {name}", color=color,
                        width=max(_bar_px(rows) / 3, 3), group=PATH_GROUP, offset=-0.32)


def chain_arrows(bubbles: list[Bubble], rows: Rows, origin: int) -> list[dict[str, object]]:
    """Arrows from each top bubble along its chain: bubble → latest cause → earlier causes."""
    arrows = []
    for number, bubble in enumerate(bubbles, start=1):
        tail = (bubble.end, _row_of(rows, bubble.rank, bubble.lane))
        pieces = [p for p in sorted(bubble.intervals, key=lambda p: -p.start)
                  if p.dur >= MIN_PIECE * bubble.dur]
        for link, piece in enumerate(pieces):
            head = ((piece.start + piece.end) / 2, _row_of(rows, piece.rank, piece.lane))
            if head[1] < 0 or tail[1] < 0:
                continue
            arrows.append(_arrow(number, link, bubble, piece, tail, head, origin))
            tail = head
    return arrows


def _arrow(number: int, link: int, bubble: Bubble, piece, tail, head, origin: int
           ) -> dict[str, object]:
    color = causes.color(piece.category)
    return {
        "name": f"chain {number}", "x": (head[0] - origin) / NS_PER_MS, "y": head[1],
        "ax": (tail[0] - origin) / NS_PER_MS, "ay": tail[1], "xref": "x", "yref": "y",
        "axref": "x", "ayref": "y", "showarrow": True, "arrowhead": 3, "arrowwidth": 1.6,
        "arrowcolor": color, "text": f"#{number}" if link == 0 else "",
        "font": {"size": 11, "color": color}, "bgcolor": "rgba(255,255,255,0.8)",
        "hovertext": (f"#{number} {bubble.name} on rank {bubble.rank} waits "
                      f"{bubble.dur / NS_PER_MS:.1f} ms ← {piece.category} "
                      f"{piece.dur / NS_PER_MS:.1f} ms on rank {piece.rank} {piece.lane}: "
                      f"{piece.name}"),
    }


# --- layout ----------------------------------------------------------------------------------
def _height(rows: Rows) -> int:
    return int(np.clip(ROW_PX * len(rows.labels) + 170, 360, 3000))


def _bar_px(rows: Rows) -> float:
    return float(np.clip(0.45 * (_height(rows) - 170) / max(len(rows.labels), 1), 1, 12))


def _layout(fig: go.Figure, rows: Rows, step: int, x0: float, x1: float) -> None:
    n = len(rows.labels)
    fig.update_layout(
        template="plotly_white", height=_height(rows), hovermode="closest",
        title=f"step {step}" if step >= 0 else "whole trace",
        xaxis={"title": "ms (aligned clocks)", "range": [x0, x1], "showgrid": True},
        yaxis={"tickmode": "array", "tickvals": list(range(n)), "ticktext": rows.labels,
               "range": [n - 0.5, -0.5], "showgrid": False, "zeroline": False},
        legend={"orientation": "h", "y": -0.08 - 30 / _height(rows), "groupclick": "toggleitem"},
        margin={"l": 10, "r": 10, "t": 60, "b": 60})
    if rows.main < n:
        fig.update_layout(updatemenus=[{
            "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.02,
            "yanchor": "bottom", "buttons": [
                {"label": "all lanes", "method": "relayout",
                 "args": [{"yaxis.range": [n - 0.5, -0.5]}]},
                {"label": "main lanes only", "method": "relayout",
                 "args": [{"yaxis.range": [rows.main - 0.5, -0.5]}]}]}])
