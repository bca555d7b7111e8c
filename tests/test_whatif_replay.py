"""Issue #14: the replay of the unmodified graph reproduces every rank's measured step time.

The engine is checked against a plain longest-path evaluation of random models; the replay
against the measured steps of every simulated scenario in both formats, the real corpus and every
real profile with a timeline (≤ 1 % of each rank's step); a graph the measurement contradicts is
refused, with the reason.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from tests.builder import MS, TraceBuilder
from tests.corpus import CASES, folder, truth
from tests.test_graph_bundles import BUNDLES
from tests.whatif_bundles import SIMULATED, analysed, simulated
from tracegraph.analysis.analyze import analyze
from tracegraph.whatif import engine
from tracegraph.whatif.model import KIND, TimingModel
from tracegraph.whatif.predict import predict
from tracegraph.whatif.replay import MAX_ERROR
from tracegraph.whatif.subject import Subject

REPLAY_ERROR = 0.01  # the bound on the replay of the unmodified graph


def _random_model(rng: np.random.Generator, nodes: int) -> TimingModel:
    """A random DAG in node order: chains (lanes) plus extra edges forward in node order."""
    chain = np.where(rng.random(nodes) < 0.7, np.arange(nodes) - 1, -1)
    chain[0] = -1
    skip = rng.random(nodes) < 0.1  # some chains jump back further (a lane's ops interleaved)
    chain[skip & (np.arange(nodes) > 3)] -= 2
    src = rng.integers(0, nodes, size=nodes // 2)
    dst = rng.integers(0, nodes, size=nodes // 2)
    forward = src < dst
    src, dst = src[forward], dst[forward]
    const = rng.integers(0, 1_000, size=nodes).astype(np.int64)
    zeros = np.zeros(nodes, dtype=np.int64)
    return TimingModel(ops=nodes // 2, chain=chain, src=src, dst=dst,
                       kind=np.full(len(src), KIND["gate"], dtype=np.int8), const=const,
                       measured=zeros, contradiction=zeros, virtual=np.zeros(nodes, dtype=bool))


def _longest_paths(model: TimingModel) -> np.ndarray:
    """The same times, one node at a time in topological order (networkx)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(model.nodes))
    graph.add_edges_from((int(c), v) for v, c in enumerate(model.chain) if c >= 0)
    graph.add_edges_from(zip(model.src.tolist(), model.dst.tolist(), strict=True))
    times = np.zeros(model.nodes, dtype=np.int64)
    for v in nx.topological_sort(graph):
        preds = list(graph.predecessors(v))
        times[v] = model.const[v] + (max(times[p] for p in preds) if preds else 0)
    return times


@pytest.mark.parametrize("seed", range(5))
def test_engine_is_the_longest_path(seed: int) -> None:
    model = _random_model(np.random.default_rng(seed), 4_000)
    timing = engine.run(model)
    assert np.array_equal(timing.times, _longest_paths(model))
    # every node's binding predecessor is one it waits for and bounds it exactly
    bound = timing.binding >= 0
    assert np.array_equal(timing.times[bound],
                          model.const[bound] + timing.times[timing.binding[bound]])


def test_a_cycle_is_refused() -> None:
    model = _random_model(np.random.default_rng(0), 100)
    model = model.with_edges(np.array([90]), np.array([10]), "hold")
    model = model.with_edges(np.array([10]), np.array([90]), "hold")
    with pytest.raises(engine.CycleError):
        engine.run(model)


def _assert_reproduced(subject: Subject) -> None:
    prediction = predict(subject, [])
    errors = prediction.errors
    assert len(errors) == len(subject.steps.table) > 0
    assert errors["error"].max() <= REPLAY_ERROR, errors.sort_values("error").tail(3)
    assert prediction.refused == {}


@pytest.mark.parametrize(("name", "fmt"), SIMULATED)
def test_replay_reproduces_simulated_steps(name: str, fmt: str) -> None:
    _assert_reproduced(Subject(analysed(simulated(name, fmt))))


@pytest.mark.parametrize("case", CASES)
def test_replay_reproduces_the_corpus(case: str) -> None:
    _assert_reproduced(Subject(analysed(folder(case))))


REAL = sorted(name for name, (path, _) in BUNDLES.items() if "simulated" not in str(path))


@pytest.mark.parametrize("name", REAL)
def test_replay_reproduces_real_profiles(name: str) -> None:
    path, rank_map = BUNDLES[name]
    analysis = analysed(path, tuple(rank_map.items()) if rank_map else None)
    if not len(analysis.ops):
        pytest.skip(f"{name}: no timeline")
    _assert_reproduced(Subject(analysis))


def test_buffered_sends_do_not_wait_for_their_receive() -> None:
    """pp4_1f1b_bwd_straggler: some sends complete before the `c10d::recv_` call that posts the
    matching receive begins (gloo buffered them); made to wait for it, 1715 ms of ops would
    start ahead of what they wait for."""
    subject = Subject(analysed(folder("pp4_1f1b_bwd_straggler")))
    assert any("36 P2P halves completed before their peer posted" in note
               for note in subject.model.notes)
    assert not subject.model.contradiction.any()
    _assert_reproduced(subject)


def test_a_gloo_receive_waits_for_the_call_that_posted_its_send() -> None:
    """gloo's `gloo:send` starts when the blocking `c10d::send` that posted it returns, so a
    receive waits for the call's start. In hsdp_tail_wait_after_send, rank 1's last backward
    receive of step 3 ends 0.08 ms after rank 3's `c10d::send` began, 1 ms before its
    `gloo:send` did: a rendezvous, not a buffered send (moving the send moves the receive)."""
    subject = Subject(analysed(folder("hsdp_tail_wait_after_send")))
    graph, model = subject.graph, subject.model
    p2p = model.kind == KIND["p2p"]
    recv, posting = model.dst[p2p] // 2, model.src[p2p] // 2
    mine = (graph.rank[recv] == 1) & (graph.rank[posting] == 3) & (graph.name[recv] == "gloo:recv")
    recv, posting = recv[mine], posting[mine]
    assert set(graph.name[posting].tolist()) == {"c10d::send"}
    assert np.all(graph.end[recv] >= graph.start[posting])
    before_send = graph.end[recv] < graph.start[posting + 1]  # the gloo:send after the call
    assert set(graph.name[posting[before_send] + 1].tolist()) == {"gloo:send"}
    assert before_send.sum() == 1


def test_a_contradicted_graph_is_refused() -> None:
    """Two ops overlapping on one device stream: the later one cannot start before the first
    ends (it started 90 ms ahead of it), so the replay ends the step 10 ms late (10 %): the
    step is refused, saying why."""
    b = TraceBuilder(unit=MS)
    s7 = b.stream(0, 7)
    s7.compute(0, 100, "Long")
    s7.compute(10, 20, "Inside")
    b.thread(0, 1).step(1, 0, 100)
    subject = Subject(analyze(b.trace()))
    prediction = predict(subject, [])
    assert prediction.errors["error"].max() == pytest.approx(0.10, abs=1e-6)
    assert MAX_ERROR < 0.10 and prediction.predicted == []
    assert "misses its measured step by 10.0 %" in prediction.refused[1]
    assert "90.0 ms of ops start ahead of what they wait for" in prediction.refused[1]


def test_a_batched_exchange_waits_for_every_half_in_the_replay() -> None:
    """cp4_ring: each ring step a batch_isend_irecv to rank+1 and from rank-1; rank 2 sleeps
    150 ms in its attention of step 2. Rank 1's batch is held by its send to 2 (gloo's send
    completes with its receive; its record ends when posted), so bringing rank 2 to its peers'
    speed gains the step about the sleep: every rank's step 2 shrinks by most of it."""
    from tracegraph.whatif.edits import Straggler

    injected = truth("cp4_ring")["injections"][0]
    prediction = predict(analysed(folder("cp4_ring")), [Straggler(str(injected["rank"]))])
    ranks = prediction.ranks()
    first = ranks[ranks["step"] == min(injected["steps"])]
    gained = first["measured_ms"] - first["predicted_ms"]
    assert len(first) == 4 and (gained > 0.8 * injected["duration_ms"]).all(), first
