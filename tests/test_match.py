"""`match` on tiny hand-built timelines (µs): each test states the dependency it must find.

Dependencies are compared as {event: (event it depends on, how)}, events being the rows the
builder returned, so the expectations read straight off the timeline.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.builder import TraceBuilder, op_index
from tracegraph.graph.match import Matches, match
from tracegraph.graph.ops import Ops, build_ops
from tracegraph.loading.trace import Trace

Deps = dict[int, tuple[int, str]]


def matched(trace: Trace) -> tuple[Deps, Matches, Ops]:
    """The cross dependencies of `trace`, keyed by event row, with the raw result."""
    ops = build_ops(trace.events)
    result = match(ops, trace.group_members())
    event = ops.frame["event"].to_numpy()
    deps = {int(event[i]): (int(event[d]), str(result.how[i]))
            for i, d in enumerate(result.dep.tolist()) if d >= 0}
    return deps, result, ops


# --- wait -> record --------------------------------------------------------------------------
def kineto_waits(b: TraceBuilder, rank: int) -> dict[str, int]:
    """Correlation ids follow host call order: 1 P (stream 32), 2 C (stream 7), 3 cudaEventRecord
    on 32, 4 W1 waits on it from stream 7, 5 cudaEventRecord on 7, 6 W2 waits on that from
    stream 20, 7 Q on stream 20, 8 R on stream 32."""
    s7, s20, s32, host = (b.stream(rank, 7), b.stream(rank, 20), b.stream(rank, 32),
                          b.thread(rank, 100))
    p = s32.compute(0, 3, "alltoall_kernel", correlation=1)
    c = s7.compute(0, 10, correlation=2)
    host.host(0.2, 0.3, "cudaEventRecord", correlation=3)
    w1 = s7.wait(1, 1.001, "Stream Wait Event", correlation=4, event_id=3, wait_on_stream=32)
    host.host(1.2, 1.3, "cudaEventRecord", correlation=5)
    w2 = s20.wait(2, 2.001, "Stream Wait Event", correlation=6, event_id=5, wait_on_stream=7)
    q = s20.compute(10, 20, correlation=7)
    s32.compute(3, 8, correlation=8)
    return {"P": p, "C": c, "W1": w1, "W2": w2, "Q": q}


def test_kineto_wait_depends_on_what_its_recorded_stream_enqueued_last() -> None:
    """W1's producer is P (R came after the record); W2's is W1, the last thing stream 7 was
    given before its record. W1 passes once stream 7 reaches it (after C); W2 gates Q."""
    b = TraceBuilder()
    e = kineto_waits(b, 0)
    deps, result, ops = matched(b.trace())
    assert deps == {e["W1"]: (e["P"], "event_id"), e["W2"]: (e["W1"], "event_id")}
    assert result.queued == {op_index(ops, e["W1"]): op_index(ops, e["C"])}
    assert result.gates == {op_index(ops, e["Q"]): [op_index(ops, e["W2"])]}


def test_matching_on_an_executor_gives_the_same_result() -> None:
    """The per-rank pass on chunks of ranks (renumbered per chunk) folds back to the same
    dependencies, gates and queue order as the local pass, beside a P2P across the chunks."""
    b = TraceBuilder()
    for rank in range(3):
        kineto_waits(b, rank)
    b.stream(0, 50).send(30, 40, peer=2, group="pp", seq=0)
    b.stream(2, 50).recv(35, 40, peer=0, group="pp", seq=0)
    trace = b.trace()
    ops = build_ops(trace.events)
    local = match(ops, trace.group_members())
    with ThreadPoolExecutor(2) as pool:
        remote = match(ops, trace.group_members(), executor=pool)
    assert (remote.dep.tolist(), remote.how.tolist()) == (local.dep.tolist(), local.how.tolist())
    assert (remote.gates, remote.queued) == (local.gates, local.queued)
    assert len(local.gates) == 3 and (local.how == "p2p").sum() == 2


@pytest.mark.parametrize(("lane", "at", "expected"), [
    (50, 47, True),  # 3 µs before the wait ends, on another stream
    (50, 45, True),  # exactly 5 µs before: still inside the window
    (50, 44.9, False),  # 5.1 µs before: outside the window
    (50, 50.5, False),  # after the wait ended: it cannot have released it
    (47, 48, False),  # inside the window but on the wait's own stream
])
def test_ascend_wait_depends_on_a_record_just_before_it_ends(lane: int, at: float,
                                                            expected: bool) -> None:
    """Stream 47 waits 10 → 50 µs (no event id); one EVENT_RECORD at `at` on stream `lane`."""
    b = TraceBuilder()
    main = b.stream(0, 47)
    main.compute(0, 10)
    wait = main.wait(10, 50)
    main.compute(50, 60)
    record = b.stream(0, lane).record(at)
    deps, _, _ = matched(b.trace())
    assert deps == ({wait: (record, "timing")} if expected else {})


def test_ascend_wait_skips_a_later_record_on_its_own_stream() -> None:
    """Records at 46 µs (stream 50) and 49 µs (the wait's own stream 47): the wait, ending at
    50 µs, was released by the one on stream 50."""
    b = TraceBuilder()
    main, other = b.stream(0, 47), b.stream(0, 50)
    wait = main.wait(10, 50)
    released_by = other.record(46)
    main.record(49)
    other.record(40)
    deps, _, _ = matched(b.trace())
    assert deps == {wait: (released_by, "timing")}


def test_a_wait_already_satisfied_has_no_producer() -> None:
    """A 1 µs wait did not block: no dependency, even with a record right before its end."""
    b = TraceBuilder()
    b.stream(0, 47).wait(10, 11)
    b.stream(0, 50).record(10.5)
    assert matched(b.trace())[0] == {}


# --- P2P -------------------------------------------------------------------------------------
def test_p2p_halves_pair_by_group_and_seq_not_by_time() -> None:
    """Rank 1 posts seq 1 (stream 51, 5 µs) before seq 0 (stream 50, 20 µs): pairing by time
    would join rank 0's seq 0 send with the seq 1 recv. Each half depends on its partner."""
    b = TraceBuilder()
    s0 = b.stream(0, 50)
    send0 = s0.send(10, 30, peer=1, group="pp", seq=0)
    send1 = s0.send(40, 60, peer=1, group="pp", seq=1)
    recv1 = b.stream(1, 51).recv(5, 60, peer=0, group="pp", seq=1)
    recv0 = b.stream(1, 50).recv(20, 30, peer=0, group="pp", seq=0)
    b.group("pp", (0, 1), dim="pp")
    deps, _, _ = matched(b.trace())
    assert deps == {send0: (recv0, "p2p"), recv0: (send0, "p2p"),
                    send1: (recv1, "p2p"), recv1: (send1, "p2p")}


def test_p2p_halves_pair_in_fifo_order_per_direction() -> None:
    """No seq: 0→1 transfers pair by order (1st send with 1st recv, 2nd with 2nd), and rank 1's
    send to rank 0, posted before either of its recvs, stays out of that queue."""
    b = TraceBuilder()
    r0, r1 = b.stream(0, 50), b.stream(1, 50)
    send_a = r0.send(10, 30, peer=1, group="pp")
    recv_c = r0.recv(32, 38, peer=1, group="pp")
    send_b = r0.send(40, 60, peer=1, group="pp")
    send_c = r1.send(5, 38, peer=0, group="pp")
    recv_a = r1.recv(20, 30, peer=0, group="pp")
    recv_b = r1.recv(39, 60, peer=0, group="pp")
    deps, _, _ = matched(b.trace())
    assert deps == {send_a: (recv_a, "p2p"), recv_a: (send_a, "p2p"),
                    send_b: (recv_b, "p2p"), recv_b: (send_b, "p2p"),
                    send_c: (recv_c, "p2p"), recv_c: (send_c, "p2p")}


def test_batch_send_recv_pairs_in_order_per_rank_pair() -> None:
    """Two batchSendRecv exchanges between ranks 0 and 1 (no seq) pair by order; a plain send
    between them, posted in between, is not one of them."""
    b = TraceBuilder()
    r0, r1 = b.stream(0, 50), b.stream(1, 50)
    first0 = r0.batch_send_recv(10, 50, peer=1, group="pp")
    send = r0.send(52, 54, peer=1, group="pp")
    second0 = r0.batch_send_recv(60, 70, peer=1, group="pp")
    first1 = r1.batch_send_recv(30, 50, peer=0, group="pp")
    recv = r1.recv(51, 54, peer=0, group="pp")
    second1 = r1.batch_send_recv(55, 70, peer=0, group="pp")
    deps, _, _ = matched(b.trace())
    assert deps == {first0: (first1, "p2p"), first1: (first0, "p2p"),
                    second0: (second1, "p2p"), second1: (second0, "p2p"),
                    send: (recv, "p2p"), recv: (send, "p2p")}


# --- collectives -----------------------------------------------------------------------------
def allreduces(b: TraceBuilder, starts: dict[int, list[float]], seq: bool) -> dict[int, list[int]]:
    """rank -> its allreduces in group "dp" (one per start, each ending 100 µs after the
    instance's first start), on stream 52."""
    members = {rank: [] for rank in starts}
    for n, firsts in enumerate(zip(*starts.values(), strict=True)):
        for rank, start in zip(starts, firsts, strict=True):
            members[rank].append(b.stream(rank, 52).collective(
                start, min(firsts) + 100, group="dp", seq=n if seq else -1))
    b.group("dp", tuple(starts), dim="dp")
    return members


@pytest.mark.parametrize("seq", [True, False], ids=["by_seq", "by_order"])
def test_collective_members_depend_on_the_member_that_started_last(seq: bool) -> None:
    """Instance 0: rank 1 starts last (30 µs); instance 1: rank 0 (250 µs)."""
    b = TraceBuilder()
    ar = allreduces(b, {0: [10, 250], 1: [30, 200], 2: [20, 210]}, seq)
    deps, result, ops = matched(b.trace())
    assert deps == {ar[0][0]: (ar[1][0], "collective"), ar[2][0]: (ar[1][0], "collective"),
                    ar[1][1]: (ar[0][1], "collective"), ar[2][1]: (ar[0][1], "collective")}
    assert result.warnings == []
    table = result.instances
    assert table[["group", "seq", "size", "safe"]].values.tolist() == [
        ["dp", 0, 3, True], ["dp", 1, 3, True]]
    assert table["ops"].tolist() == [[op_index(ops, ar[r][n]) for r in (0, 1, 2)] for n in (0, 1)]
    assert table["ranks"].tolist() == [[0, 1, 2], [0, 1, 2]]


def test_order_matching_sees_through_a_constant_clock_shift() -> None:
    """Rank 1's clock reads 5 ms late: its members start after rank 0's have ended, yet once
    shifted by the median end difference they overlap, so order matching is still safe."""
    b = TraceBuilder()
    ar = allreduces(b, {0: [0, 1000], 1: [50, 1020]}, seq=False)
    b.shift(1, 5000)
    deps, result, _ = matched(b.trace())
    assert result.warnings == []
    assert deps == {ar[0][0]: (ar[1][0], "collective"), ar[0][1]: (ar[1][1], "collective")}


def test_order_matching_refused_when_members_show_different_counts() -> None:
    """A sampled trace: rank 0 shows two allreduces of group dp, rank 1 one."""
    b = TraceBuilder()
    b.stream(0, 52).collective(10, 100, group="dp")
    b.stream(0, 52).collective(200, 300, group="dp")
    b.stream(1, 52).collective(20, 100, group="dp")
    deps, result, _ = matched(b.trace())
    assert deps == {}
    assert result.warnings == [
        "group dp: members show different collective sequences (rank 0: 2, rank 1: 1 ops; "
        "first difference at op #2: rank 0 allreduce, rank 1 none); matching by order is "
        "unsafe (sampled or truncated trace?), instances not matched"]
    assert not result.instances["safe"].any() and len(result.instances) == 3


def test_different_sequences_of_equal_counts_name_where_they_part() -> None:
    """Both ranks show two ops of group dp, but rank 1's second is a broadcast: the warning
    names the position and the two ops, not just the equal counts."""
    b = TraceBuilder()
    b.stream(0, 52).collective(10, 100, group="dp")
    b.stream(0, 52).collective(200, 300, group="dp")
    b.stream(1, 52).collective(20, 100, group="dp")
    b.stream(1, 52).collective(210, 300, "broadcast", group="dp")
    deps, result, _ = matched(b.trace())
    assert deps == {}
    assert result.warnings == [
        "group dp: members show different collective sequences (rank 0: 2, rank 1: 2 ops; "
        "first difference at op #2: rank 0 allreduce, rank 1 broadcast); matching by order "
        "is unsafe (sampled or truncated trace?), instances not matched"]


def test_order_matching_refused_when_members_never_overlap() -> None:
    """Same counts, but rank 1's profile caught other iterations: its members end 50 and 78 ms
    after rank 0's, so no constant shift lines both instances up."""
    b = TraceBuilder()
    for rank, starts in {0: [0, 2000], 1: [50_000, 80_000]}.items():
        for start in starts:
            b.stream(rank, 52).collective(start, start + 1000, group="dp")
    deps, result, _ = matched(b.trace())
    assert deps == {}
    assert result.warnings == [
        "group dp: 2 order-matched instances have members that never run at the same time; "
        "matching by order is unsafe (sampled trace?), instances not matched"]
    assert not result.instances["safe"].any()
