"""The DepGraph on hand-built traces whose dependencies are known by construction."""

from __future__ import annotations

import networkx as nx

from tests.builder import MS, US, TraceBuilder, op_index
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.graph.depgraph import EDGE_KINDS, RELEASED_AT, build_graph
from tracegraph.graph.export import to_networkx
from tracegraph.graph.match import match
from tracegraph.graph.ops import build_ops


def edges_between(analysis, src: int, dst: int) -> list[str]:
    """Kinds of the edges from event row `src` to event row `dst`."""
    ops, edges = analysis.ops, analysis.graph.edges
    a, b = op_index(ops, src), op_index(ops, dst)
    return edges.loc[(edges["src"] == a) & (edges["dst"] == b), "kind"].astype(str).tolist()


def test_p2p_pair_is_one_edge_from_the_half_posted_last_on_the_aligned_clock() -> None:
    """True time: rank 1 posts its recv at 5 µs, rank 0 its send at 10 µs; both end at 30 µs.
    Rank 1's clock reads 20 µs late, so its raw recv start (25) looks later than the send."""
    b = TraceBuilder(unit=US)
    b.group("pp", (0, 1), dim="pp")
    send = b.stream(0, 7).send(10, 30, peer=1, group="pp", seq=0)
    recv = b.stream(1, 7).recv(5, 30, peer=0, group="pp", seq=0)
    b.shift(1, 20)
    analysis = analyze(b.trace())
    assert analysis.offsets[1] == 20 * US
    assert edges_between(analysis, send, recv) == ["p2p"]
    assert edges_between(analysis, recv, send) == []


def test_batch_send_recv_halves_are_one_edge_not_a_cycle() -> None:
    b = TraceBuilder(unit=US)
    b.group("pp", (0, 1), dim="pp")
    first = b.stream(0, 7).batch_send_recv(0, 40, peer=1, group="pp", seq=0)
    later = b.stream(1, 7).batch_send_recv(25, 40, peer=0, group="pp", seq=0)
    analysis = analyze(b.trace())
    assert edges_between(analysis, later, first) == ["p2p"]
    assert edges_between(analysis, first, later) == []
    assert nx.is_directed_acyclic_graph(to_networkx(analysis.graph))


def test_collective_is_a_star_from_the_last_arriver_on_the_aligned_clock() -> None:
    """True arrivals 10, 20, 30 µs (rank 2 last), all end at 40 µs; rank 2's clock reads 25 µs
    early, so on raw clocks rank 1 looks last."""
    b = TraceBuilder(unit=US)
    b.group("dp", (0, 1, 2), dim="dp")
    members = [b.stream(r, 7).collective(s, 40, group="dp", seq=0)
               for r, s in ((0, 10), (1, 20), (2, 30))]
    b.shift(2, -25)
    analysis = analyze(b.trace())
    assert analysis.offsets[2] == -25 * US
    assert edges_between(analysis, members[2], members[0]) == ["collective"]
    assert edges_between(analysis, members[2], members[1]) == ["collective"]
    last = op_index(analysis.ops, members[2])
    edges = analysis.graph.edges
    assert not len(edges[(edges["dst"] == last) & (edges["kind"] == "collective")])


def test_event_wait_queue_and_gate_edges_of_a_kineto_stream_wait() -> None:
    """Kineto: stream 20 waits (host call at 0.5 µs) on an event recorded after stream 7's
    kernel (correlation 6); the wait gates the kernel launched next on stream 20."""
    b = TraceBuilder(unit=US)
    s7, s20 = b.stream(0, 7), b.stream(0, 20)
    s20.step(1, 0, 60)
    before = s20.compute(0, 1, "Prologue", correlation=3)
    producer = s7.compute(0, 30, "MatMul", correlation=6)
    wait = s20.wait(0.5, 0.501, "Stream Wait Event", correlation=8, event_id=7,
                    wait_on_stream=7)
    gated = s20.compute(31, 50, "SendRecv", correlation=9)
    analysis = analyze(b.trace())
    assert edges_between(analysis, producer, wait) == ["event_wait"]
    assert edges_between(analysis, before, wait) == ["queue"]
    assert edges_between(analysis, wait, gated) == ["gate"]
    assert edges_between(analysis, before, gated) == ["stream"]  # stream order skips the wait


def test_edge_table_is_typed_and_explained() -> None:
    b = TraceBuilder(unit=US)
    b.group("dp", (0, 1), dim="dp")
    for r, s in ((0, 0), (1, 5)):
        lane = b.stream(r, 7)
        lane.compute(0, s + 1)
        lane.collective(s + 1, 20, group="dp", seq=0)
    edges = analyze(b.trace()).graph.edges
    assert set(EDGE_KINDS) == set(RELEASED_AT)
    assert list(edges["kind"].cat.categories) == list(EDGE_KINDS)
    assert edges["confidence"].between(0, 1, inclusive="right").all()
    assert (edges["reason"].astype(str) != "").all()
    assert set(edges["kind"].astype(str)) == {"stream", "collective"}


def test_cycles_are_found_when_matching_contradicts_itself() -> None:
    """Two streams whose waits point at each other's later op: a deadlock no real run has."""
    b = TraceBuilder(unit=US)
    s1, s2 = b.stream(0, 1), b.stream(0, 2)
    a1, a2 = s1.compute(0, 10), s1.wait(10, 20)
    b1, b2 = s2.compute(0, 10), s2.wait(10, 20)
    trace = b.trace()
    ops = build_ops(trace.events)
    matches = match(ops, {})
    index = {e: op_index(ops, e) for e in (a1, a2, b1, b2)}
    matches.dep[index[a2]], matches.how[index[a2]] = index[b2], "timing"
    matches.dep[index[b2]], matches.how[index[b2]] = index[a2], "timing"
    graph = build_graph(ops, matches, ops.start, ops.end)
    (cycle,) = graph.cycles()
    assert set(cycle.tolist()) == {index[a2], index[b2]}
    (warning,) = graph.cycle_warnings()
    assert warning.startswith("dependency cycle among 2 ops of ranks [0] (EVENT_WAIT)")
    assert not nx.is_directed_acyclic_graph(to_networkx(graph))


def test_unplaced_collective_is_not_called_a_dp_reduction() -> None:
    """Rank 0 waits in an all-reduce of a TP group, then of a group of unknown dimension, for
    rank 1, which arrives 30 ms late to each: the transfers are charged to their own kinds of
    collective, never to a DP reduction."""
    b = TraceBuilder(unit=MS)
    b.group("tp", (0, 1), dim="tp")
    b.group("g", (0, 1))
    for rank, late in ((0, 0), (1, 30)):
        lane = b.stream(rank, 7)
        lane.step(1, 0, 200)
        lane.compute(0, 10 + late)
        lane.collective(10 + late, 50, group="tp", seq=0)
        lane.compute(50, 60 + late)
        lane.collective(60 + late, 100, group="g", seq=0)
    analysis = analyze(b.trace())
    charged = {i.category: i.dur for bubble in analysis.bubbles if bubble.rank == 0
               for i in bubble.intervals if i.rank == 0}
    assert charged[causes.TP_COLLECTIVE] == 10 * MS  # 40 -> 50 after rank 1 arrived
    assert charged[causes.COLLECTIVE] == 10 * MS  # 90 -> 100
    assert causes.DP_REDUCTION not in {i.category for bubble in analysis.bubbles
                                       for i in bubble.intervals}


def test_a_zero_length_op_is_not_its_own_host_sync_and_self_loops_count_as_cycles() -> None:
    """A zero-length kernel launched exactly when it starts, after an idle device: the op that
    freed the host is the kernel before it, never the kernel itself."""
    b = TraceBuilder(unit=US)
    lane, host = b.stream(0, 7), b.thread(0, 1, "python")
    lane.step(1, 0, 3000)
    lane.compute(0, 10, correlation=1)
    late = lane.compute(2000, 2000, "Empty", correlation=2)
    host.host(0, 1, "cudaLaunchKernel", correlation=1)
    host.host(2000, 2001, "cudaLaunchKernel", correlation=2)
    analysis = analyze(b.trace())
    graph = analysis.graph
    n = op_index(analysis.ops, late)
    assert graph.host_sync(n) == -1  # the kernel before ended 1.99 ms earlier: no sync
    graph.record(n, n, "host_sync")
    assert [c.tolist() for c in graph.cycles()] == [[n]]


def test_export_keeps_two_reasons_between_the_same_ops() -> None:
    b = TraceBuilder(unit=US)
    lane = b.stream(0, 7)
    lane.step(1, 0, 100)
    first, second = lane.compute(0, 10), lane.compute(50, 60)
    analysis = analyze(b.trace())
    a, c = op_index(analysis.ops, first), op_index(analysis.ops, second)
    analysis.graph.record(a, c, "host_sync")
    exported = to_networkx(analysis.graph)
    assert sorted(d["kind"] for d in exported.get_edge_data(a, c).values()) == [
        "host_sync", "stream"]


def test_point_to_point_is_a_pipeline_transfer_only_when_it_names_its_peer() -> None:
    """NCCL's all-to-all runs as SendRecv kernels that name no peer (the real negative_queue
    trace): waiting on one is communication of unknown dimension, not a pipeline transfer."""
    b = TraceBuilder(unit=MS)
    lane = b.stream(0, 7)
    lane.step(1, 0, 100)
    lane.compute(0, 10)
    lane.batch_send_recv(10, 40, peer=-1, name="ncclKernel_SendRecv")
    lane.compute(40, 50)
    lane.send(50, 80, peer=1)
    lane.compute(80, 100)
    b.stream(1, 7).recv(50, 80, peer=0)
    analysis = analyze(b.trace())
    charged = {(i.name, i.category) for bubble in analysis.bubbles for i in bubble.intervals}
    assert ("ncclKernel_SendRecv", causes.COLLECTIVE) in charged
    assert ("send", causes.PP_P2P) in charged


def test_a_gloo_p2p_is_posted_when_its_host_call_begins() -> None:
    """gloo: `gloo:recv` (the record) starts when `c10d::recv_` (the call) returns, and the call
    can block. Rank 0 calls recv at 0 ms (blocked in the call until 6 ms, its record then 6-9 ms);
    rank 1 calls send at 4 ms (record 4-9 ms). By the records rank 0 posted last; by the calls
    rank 1 did: rank 0 waited on rank 1 from 0 ms, and the whole 9 ms is rank 0's bubble."""
    b = TraceBuilder(unit=MS)
    b.group("pp", (0, 1), dim="pp")
    t0, t1 = b.thread(0, 100, "python"), b.thread(1, 200, "python")
    t0.host(0, 6, "c10d::recv_", comm="recv", peer=1, group="pp")
    recv = t0.recv(6, 9, peer=1, group="pp", name="gloo:recv")
    t1.compute(0, 4, "aten::mm")
    t1.host(4, 4.1, "c10d::send", comm="send", peer=0, group="pp")
    send = t1.send(4.1, 9, peer=0, group="pp", name="gloo:send")
    analysis = analyze(b.trace())
    assert edges_between(analysis, send, recv) == ["p2p"]
    assert edges_between(analysis, recv, send) == []
    (bubble,) = [x for x in analysis.bubbles if x.rank == 0]
    assert (bubble.start, bubble.end) == (0, 9 * MS)
    first = bubble.intervals[0]  # until rank 1 posted, its compute held rank 0
    assert (first.rank, first.name, first.start, first.end) == (1, "aten::mm", 0, 4 * MS)
    assert first.path == (0, 1)  # reached through rank 0's receive


def test_a_gloo_exchange_is_posted_once_for_both_halves() -> None:
    """batch_isend_irecv on gloo: each rank's send and recv calls and records follow each other
    on its main thread and were posted together when the first call began. Rank 0 posts at 0 ms
    (its isend call blocks until 1.3 ms, its irecv call begins at 1.5 ms), rank 1 at 1 ms (irecv
    call at 1.2 ms). Taken one call at a time, rank 0's recv looks posted after rank 1's send
    while rank 1's recv looks posted after rank 0's send: two crossing edges, a cycle. As one
    exchange, rank 0 (posted first) waits on rank 1, once, in the half that ends its exchange
    (its recv), and its two bubbles do not overlap."""
    b = TraceBuilder(unit=MS)
    b.group("pp", (0, 1), dim="pp")
    times = {0: (0, 1.3, 1.4, 1.5, 3.0), 1: (1.0, 1.1, 1.2, 1.2, 2.0)}
    halves = {}
    for rank, (call, record, recv_call_end, recv_call, recv_record) in times.items():
        t, other = b.thread(rank, 100 + rank, "python"), 1 - rank
        t.host(call, record, "c10d::send", comm="send", peer=other, group="pp")
        halves[rank, "send"] = t.send(record, recv_call_end, peer=other, group="pp",
                                      name="gloo:send")
        t.host(recv_call, recv_record, "c10d::recv_", comm="recv", peer=other, group="pp")
        halves[rank, "recv"] = t.recv(recv_record, 5, peer=other, group="pp", name="gloo:recv")
    analysis = analyze(b.trace())
    assert nx.is_directed_acyclic_graph(to_networkx(analysis.graph))
    assert not analysis.graph.cycles()
    into_0 = [edges_between(analysis, halves[1, h], halves[0, mine])
              for h in ("send", "recv") for mine in ("send", "recv")]
    assert sorted(into_0) == [[], [], [], ["p2p"]]  # one edge, into rank 0's recv
    assert ["p2p"] in (edges_between(analysis, halves[1, "send"], halves[0, "recv"]),
                       edges_between(analysis, halves[1, "recv"], halves[0, "recv"]))
    assert not [edges_between(analysis, halves[0, mine], halves[1, h])
                for h in ("send", "recv") for mine in ("send", "recv")
                if edges_between(analysis, halves[0, mine], halves[1, h])]
    spans = sorted((x.start, x.end) for x in analysis.bubbles if x.rank == 0)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:],
                                                                      strict=False))
    assert spans[-1][1] == 5 * MS


def test_a_batched_exchange_waits_for_the_half_whose_peer_posted_last() -> None:
    """batch_isend_irecv with two peers on gloo (a ring: rank 1 sends to 2, receives from 0).
    Rank 0 posts its send to 1 at once; rank 2 computes 80 ms before posting its receive from 1.
    Rank 1's batch is held by its send, whose peer posted last, although its `gloo:recv` record
    (ending when rank 1 waits on it, after the send) spans the wait: the bubble is rank 2's
    compute, never rank 1's own transfer."""
    b = TraceBuilder(unit=MS)
    b.group("ring", (0, 1, 2))
    t0, t1, t2 = (b.thread(r, 100 + r, "python") for r in range(3))
    t0.host(0, 0.1, "c10d::send", comm="send", peer=1, group="ring")
    t0.send(0.1, 0.3, peer=1, group="ring", name="gloo:send")
    t1.host(0, 0.1, "c10d::send", comm="send", peer=2, group="ring")
    t1.send(0.1, 0.2, peer=2, group="ring", name="gloo:send")
    t1.host(0.2, 0.3, "c10d::recv_", comm="recv", peer=0, group="ring")
    held = t1.recv(0.3, 81, peer=0, group="ring", name="gloo:recv")
    t2.compute(0, 80, "attention")
    t2.host(80, 80.1, "c10d::recv_", comm="recv", peer=1, group="ring")
    t2.recv(80.1, 80.5, peer=1, group="ring", name="gloo:recv")
    analysis = analyze(b.trace())
    assert not analysis.graph.cycles()
    bubble = next(x for x in analysis.bubbles if x.rank == 1 and x.dur > 50 * MS)
    assert bubble.root.rank == 2 and bubble.root.name == "attention"
    assert bubble.chain() == [1, 2] and bubble.op == op_index(analysis.ops, held)
    assert sum(p.dur for p in bubble.intervals if p.rank == 2) >= 79 * MS


def test_a_collective_kernel_without_a_comm_type_is_still_a_collective() -> None:
    """A collective kernel whose profile names no comm type (RCCL kernels on MI300X, say) and
    no known group is charged to `collective`, never to nothing."""
    b = TraceBuilder(unit=MS)
    s0, s1 = b.stream(0, 7), b.stream(1, 7)
    s0.compute(0, 10)
    s0.add("collective", 10, 50, "ncclDevKernel_Generic", group="g", seq=0)
    s1.compute(0, 40)
    s1.add("collective", 40, 50, "ncclDevKernel_Generic", group="g", seq=0)
    b.group("g", (0, 1))
    analysis = analyze(b.trace())
    (bubble,) = [x for x in analysis.bubbles if x.rank == 0]
    charged = bubble.by_category()  # rank 1's compute, then the transfer after it arrived
    assert charged.get(causes.COLLECTIVE) == 10 * MS and "" not in charged


def test_a_wait_on_reductions_launched_long_before_is_a_bubble() -> None:
    """Overlapped gradient reduction (DDP buckets, Megatron overlap_grad_reduce): two
    all-reduces launched during the backward run one after the other on the gloo thread, the
    first waiting 170 ms for the DP peer absent from the bundle, the second (more bytes) 20 ms;
    the main thread then blocks in `wait()` inside `OPT step` until both are done. The stretch
    is a bubble of the DP reduction's late absent member, whether or not an annotation encloses
    it, never the rank's own work."""
    for annotated in (True, False):
        b = TraceBuilder(unit=MS)
        b.group("dp", (0, 1), dim="dp", name="dp-0-1")
        main, loop = b.thread(0, 100, "python"), b.comm_lane(0, "thread 300 pt_gloo_runloop")
        main.step(1, 0, 230)
        main.compute(0, 8, "backward chunk 1")
        main.host(8, 8.5, "c10d::allreduce_", comm="allreduce", group="dp")
        loop.collective(9, 180, group="dp", name="gloo:all_reduce")
        main.compute(8.5, 9.5, "backward chunk 0")
        main.host(9.5, 10, "c10d::allreduce_", comm="allreduce", group="dp")
        loop.collective(180, 200, group="dp", name="gloo:all_reduce")
        if annotated:
            main.marker(10, 201, "OPT step")
        main.compute(201, 230, "optimizer")
        analysis = analyze(b.trace())
        bubble = max((x for x in analysis.bubbles if x.rank == 0), key=lambda x: x.dur)
        assert bubble.start <= 10.5 * MS and bubble.end >= 200 * MS, annotated
        assert bubble.category == causes.DP_REDUCTION, (annotated, bubble.intervals)
        assert bubble.by_category()[causes.DP_REDUCTION] >= 189 * MS
        assert bubble.root.unprofiled_group == "dp"
