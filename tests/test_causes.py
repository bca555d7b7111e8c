"""The root-cause vocabulary (tracegraph/causes.py) and the reports that draw from it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from rich.console import Console

from parsers.base import TraceError
from reports import html, terminal, waterfall
from tracegraph import causes, schema
from tracegraph.analysis.blame import Bubble, Interval
from tracegraph.verify import checks

PUBLIC = {"DP_REDUCTION": "dp_reduction", "PP_P2P": "pp_p2p", "EP_ALLTOALL": "ep_alltoall",
          "TP_COLLECTIVE": "tp_collective", "CP_COLLECTIVE": "cp_collective",
          "COLLECTIVE": "collective", "COMPUTE_STRAGGLER": "compute_straggler",
          "HOST_LAUNCH": "host_launch", "PIPELINE_FILL": "pipeline_fill",
          "PEER_COMPUTE": "peer_compute", "OWN_COMPUTE": "own_compute", "UNKNOWN": "unknown"}


def test_the_public_names_are_declared_once_each() -> None:
    assert {name: getattr(causes, name) for name in PUBLIC} == PUBLIC  # JSON output: never rename
    assert tuple(c.name for c in causes.REGISTRY) == causes.CATEGORIES
    assert sorted(causes.CATEGORIES) == sorted(PUBLIC.values())


def test_every_category_has_its_own_colour_and_a_meaning() -> None:
    colours = [c.color.lower() for c in causes.REGISTRY]
    assert len(set(colours)) == len(colours)
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colours)
    assert all(len(c.meaning) > 20 and "\n" not in c.meaning for c in causes.REGISTRY)


def test_each_parallel_dimension_has_one_category() -> None:
    assert causes.DIMS == ("dp", "pp", "ep", "tp", "cp")
    assert [causes.for_dim(d) for d in causes.DIMS] == [
        causes.DP_REDUCTION, causes.PP_P2P, causes.EP_ALLTOALL, causes.TP_COLLECTIVE,
        causes.CP_COLLECTIVE]
    assert causes.for_dim("") == causes.for_dim("world") == ""


@pytest.mark.parametrize(("dim", "comm", "category"), [
    ("dp", "allreduce", causes.DP_REDUCTION), ("pp", "batch_send_recv", causes.PP_P2P),
    ("ep", "alltoall", causes.EP_ALLTOALL), ("tp", "allreduce", causes.TP_COLLECTIVE),
    ("cp", "allgather", causes.CP_COLLECTIVE),
    ("dp", "send", causes.DP_REDUCTION),  # the group's dimension wins over the comm type
    ("", "alltoall", causes.EP_ALLTOALL), ("", "send", causes.PP_P2P),
    ("", "recv", causes.PP_P2P), ("world", "batch_send_recv", causes.PP_P2P),
    ("", "allreduce", causes.COLLECTIVE), ("world", "reducescatter", causes.COLLECTIVE),
])
def test_for_collective(dim: str, comm: str, category: str) -> None:
    assert causes.for_collective(dim, comm) == category


def test_a_collective_of_unknown_dimension_is_never_called_a_dp_reduction() -> None:
    for comm in schema.COMM_TYPES:
        assert causes.for_collective("", comm) != causes.DP_REDUCTION
        assert causes.for_collective("tp", comm) == causes.TP_COLLECTIVE


def test_order_and_lookup_fall_back_for_names_not_in_the_registry() -> None:
    assert causes.order({"zz", causes.UNKNOWN, "aa", causes.DP_REDUCTION}) == [
        causes.DP_REDUCTION, causes.UNKNOWN, "aa", "zz"]
    assert causes.color("no such cause") == causes.BY_NAME[causes.UNKNOWN].color


def _every_category_bubble() -> Bubble:
    pieces = [Interval(10 * i, 10 * i + 10, name, 0, "stream 1", f"op{i}")
              for i, name in enumerate(reversed(causes.CATEGORIES))]
    return Bubble(0, "stream 1", 0, 10 * len(pieces), "wait", 0, pieces)


def test_the_waterfall_legend_draws_every_category_in_its_colour() -> None:
    rows = waterfall.Rows(np.array([0]), ["r0 · stream 1"], 1, {(0, "stream 1"): 0}, {0: 0})
    fig = go.Figure()
    waterfall._add_bubbles(fig, [_every_category_bubble()], rows, origin=0)
    legend = [(t.name, t.line.color) for t in fig.data if t.showlegend is not False]
    assert legend == [(c.name, c.color) for c in causes.REGISTRY]  # registry order
    assert waterfall.CATEGORY_COLORS == causes.COLORS


def test_the_html_totals_show_each_category_with_its_colour_and_meaning() -> None:
    for cause in causes.REGISTRY:
        label = html.cause_label(cause.name)
        assert f"background:{cause.color}" in label and cause.name in label
        assert html.escape(cause.meaning) in label


def test_the_terminal_keeps_and_colours_bracketed_categories() -> None:
    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    line = f"rank 1 stream 7  wait  [{causes.TP_COLLECTIVE}]  {causes.COLLECTIVE} 1.0 ms"
    console.print(terminal.styled(line), highlight=False)
    assert console.export_text(styles=False).rstrip() == line  # "[tp_collective]" is no markup
    spans = {line[s.start:s.end]: str(s.style) for s in terminal.styled(line).spans}
    assert spans == {causes.TP_COLLECTIVE: causes.color(causes.TP_COLLECTIVE),
                     causes.COLLECTIVE: causes.color(causes.COLLECTIVE)}


def test_max_bubble_rules_accept_every_category_and_nothing_else() -> None:
    for name in causes.CATEGORIES:
        checks._validate(checks.Rule("max_bubble", {"category": name, "ms": 1}), Path("r.toml"))
    with pytest.raises(TraceError, match="category must be one of"):
        checks._validate(checks.Rule("max_bubble", {"category": "slowness", "ms": 1}),
                         Path("r.toml"))
