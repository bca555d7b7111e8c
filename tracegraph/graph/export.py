"""The `DepGraph` as a networkx graph, for people who want to explore it (GraphML, node-link JSON).

Nodes are ops (rank, lane, name, kind, group, start_ns/end_ns on the aligned clock); edges are the
graph's edge table, each with its `kind`, `confidence`, `reason` and `released_at` (which point of
the source op the destination waited for): the same edges blame and the critical path walked.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np

from tracegraph.graph.depgraph import RELEASED_AT, DepGraph


def to_networkx(graph: DepGraph) -> nx.MultiDiGraph:
    """Nodes are ops; an edge a -> b means b could not go on before a (see depgraph.py). Two
    ops may be linked for two reasons (lane order and a host sync): one edge each, keyed by
    kind."""
    frame = graph.ops.frame
    out = nx.MultiDiGraph()
    columns = frame[["rank", "lane", "name", "kind", "group"]].astype(
        {"rank": "int64", "lane": str, "name": str, "kind": str, "group": str})
    out.add_nodes_from(
        (i, {"rank": int(rank), "lane": lane, "name": name, "kind": kind, "group": group,
             "start_ns": int(start), "end_ns": int(end)})
        for i, rank, lane, name, kind, group, start, end in zip(
            range(len(frame)), *(columns[c].tolist() for c in columns), graph.start.tolist(),
            graph.end.tolist(), strict=True))
    edges = graph.edges
    kinds = edges["kind"].astype(str).tolist()
    out.add_edges_from(
        (src, dst, kind, {"kind": kind, "confidence": round(float(confidence), 3),
                    "reason": str(reason), "released_at": RELEASED_AT[kind]})
        for src, dst, kind, confidence, reason in zip(
            edges["src"].tolist(), edges["dst"].tolist(), kinds,
            np.asarray(edges["confidence"]).tolist(), edges["reason"].tolist(), strict=True))
    return out


def write_graph(graph: DepGraph, path: Path) -> nx.MultiDiGraph:
    """Write the DAG as GraphML (`.graphml`) or node-link JSON (`.json`)."""
    exported = to_networkx(graph)
    if path.suffix == ".json":
        path.write_text(json.dumps(nx.node_link_data(exported, edges="edges")))
    else:
        nx.write_graphml(exported, path)
    return exported
