"""Invariants of the DepGraph, blame and the critical path on every sample and real bundle.

The graph is acyclic; the critical path tiles the step of its slowest rank (aligned clocks) within
0.5 %; each bubble's intervals add up to the bubble; and blame and the critical path only walk
edges of the graph: every op they charge is an ancestor of the op they explain.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order
from typer.testing import CliRunner

import tracegraph
from tests.conftest import REAL, SAMPLES
from tracegraph import causes
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.walk import COMPUTE, TRANSFER, WAIT
from tracegraph.cli.app import app
from tracegraph.graph.export import to_networkx

HTA = REAL / "kineto" / "hta"
BUNDLES = {
    "gloo": (SAMPLES / "gloo_pp2_dp2", None),
    "gloo-fixed": (SAMPLES / "gloo_pp2_dp2_fixed", None),
    **{p.name.removesuffix(".tar.gz"): (p, None)
       for p in sorted((SAMPLES / "simulated").glob("*.tar.gz"))},
    "npu-ddp8": (REAL / "ascend" / "torch_npu_ddp8_level1", None),
    "npu-pp2dp2-comm": (REAL / "ascend" / "torch_npu_pp2dp2_level2_comm", None),
    "npu-2023-comm": (REAL / "ascend" / "torch_npu_2023_comm", None),
    "mi300": (REAL / "kineto" / "tracelens" / "mi300", None),
    **{name: (HTA / name, None) for name in (
        "nccl_parser_config", "trace_filter", "negative_queue_length_values_check",
        "ns_resolution_trace", "cpu_only", "trace_file_list", "call_stack")},
    **{f"critical_path/{name}": (HTA / "critical_path" / name, None) for name in (
        "alexnet", "cuda_event_sync", "cuda_event_sync_multi_stream", "simple_add")},
    **{name: (HTA / name, {file: 0}) for name, file in (
        ("amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        ("triton_example", "triton_example.json.gz"),
        ("rank_unavailable", "rank_not_found.json.gz"))},
}


@pytest.fixture(scope="module", params=sorted(BUNDLES))
def analysis(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Analysis:
    path, rank_map = BUNDLES[request.param]
    assert path.exists(), f"{path} missing"
    return analyze(tracegraph.load(path, rank_map=rank_map,
                                   cache_dir=tmp_path_factory.mktemp("cache")))


def ancestors(analysis: Analysis, op: int) -> set[int]:
    """`op` and every op it depends on through the graph's edges."""
    edges, n = analysis.graph.edges, len(analysis.graph)
    reverse = csr_matrix((np.ones(len(edges)), (edges["dst"], edges["src"])), shape=(n, n))
    return set(breadth_first_order(reverse, op, directed=True, return_predecessors=False).tolist())


def test_the_graph_is_a_dag(analysis: Analysis) -> None:
    assert analysis.graph.cycles() == []
    assert nx.is_directed_acyclic_graph(to_networkx(analysis.graph))


def test_critical_path_tiles_the_slowest_rank_step(analysis: Analysis) -> None:
    steps = analysis.steps.assign(dur=analysis.steps["end"] - analysis.steps["start"])
    slowest = steps.groupby("step")["dur"].max().to_dict() if len(steps) else {
        -1: int(analysis.end.max() - analysis.start.min())}
    assert set(analysis.critical_paths) == set(slowest)
    for step, path in analysis.critical_paths.items():
        length = sum(s.end - s.start for s in path)
        assert abs(length - slowest[step]) <= 0.005 * slowest[step], f"step {step}"
        assert all(a.end <= b.start for a, b in zip(path, path[1:], strict=False))
        assert {s.kind for s in path} <= {COMPUTE, TRANSFER, WAIT}
        assert {s.category for s in path} <= set(causes.CATEGORIES)


def test_bubble_intervals_add_up_to_the_bubble(analysis: Analysis) -> None:
    for bubble in analysis.bubbles:
        assert sum(i.dur for i in bubble.intervals) == bubble.dur, bubble
        assert all(a.end <= b.start for a, b in zip(bubble.intervals, bubble.intervals[1:],
                                                      strict=False))


def test_blame_and_path_walk_only_graph_edges(analysis: Analysis) -> None:
    for path in analysis.critical_paths.values():
        walked = [s.op for s in path if s.op >= 0]
        if walked:
            assert set(walked) <= ancestors(analysis, walked[-1])
    for bubble in analysis.bubbles[:50]:
        assert {i.op for i in bubble.intervals} <= ancestors(analysis, bubble.op), bubble


def test_graph_command_writes_the_dag_blame_walked(tmp_path: Path) -> None:
    """The real gloo job: P2P between stages, DP and all-to-all collectives, gloo workers
    launched by the main thread, threads released by their workers; all across ranks."""
    out = tmp_path / "gloo.graphml"
    result = CliRunner().invoke(app, ["graph", str(SAMPLES / "gloo_pp2_dp2"), "-o", str(out),
                                      "--no-cache"])
    assert result.exit_code == 0, result.output
    graph = nx.read_graphml(out)
    assert nx.is_directed_acyclic_graph(graph)
    kinds = {d["kind"] for _, _, d in graph.edges(data=True)}
    assert {"stream", "p2p", "collective", "launch", "host_release"} <= kinds
    cross = [(a, b, d) for a, b, d in graph.edges(data=True)
             if graph.nodes[a]["rank"] != graph.nodes[b]["rank"]]
    assert {d["kind"] for _, _, d in cross} == {"p2p", "collective"}
    assert all(d["released_at"] == "start" for _, _, d in cross)
    sleep = [n for n, d in graph.nodes(data=True) if d["name"] == "straggler_sleep"]
    waiting = [b for b in analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", use_cache=False)
                                  ).bubbles if b.rank != 1][:3]
    assert sleep and all(any(nx.has_path(graph, s, str(b.op)) for s in sleep) for b in waiting)
