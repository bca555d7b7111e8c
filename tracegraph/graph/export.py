"""The cross-rank dependency DAG as a networkx graph, for people who want to explore it.

The analysis itself works on flat arrays (`Ops` + `Matches`); this builds the same edges as
objects only on request: stream order, cross-stream waits, P2P halves, collective last-arrivers and
host launches.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np

from tracegraph.analysis.analyze import Analysis


def dependency_graph(analysis: Analysis) -> nx.DiGraph:
    """Nodes are ops (attributes: rank, lane, name, kind, start_ns, end_ns on the aligned clock);
    an edge a -> b means b could not finish (or start) before a; `type` says why."""
    frame = analysis.ops.frame
    graph = nx.DiGraph()
    for i, row in enumerate(frame[["rank", "lane", "name", "kind", "group"]].itertuples(
            index=False)):
        graph.add_node(i, rank=int(row.rank), lane=row.lane, name=row.name, kind=row.kind,
                       group=row.group, start_ns=int(analysis.start[i]),
                       end_ns=int(analysis.end[i]))
    prev = analysis.ops.lane_prev()
    for i in np.flatnonzero(prev >= 0):
        graph.add_edge(int(prev[i]), int(i), type="stream")
    matches = analysis.matches
    for i in np.flatnonzero(matches.dep >= 0):
        graph.add_edge(int(matches.dep[i]), int(i), type=str(matches.how[i]))
    for i in np.flatnonzero(matches.launcher >= 0):
        graph.add_edge(int(matches.launcher[i]), int(i), type="launch")
    return graph


def write_graph(analysis: Analysis, path: Path) -> nx.DiGraph:
    """Write the DAG as GraphML (`.graphml`) or node-link JSON (`.json`)."""
    graph = dependency_graph(analysis)
    if path.suffix == ".json":
        path.write_text(json.dumps(nx.node_link_data(graph, edges="edges")))
    else:
        nx.write_graphml(graph, path)
    return graph
