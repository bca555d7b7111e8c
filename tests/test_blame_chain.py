"""Blame on a hand-built two-rank miniature of the seed case, whose answer is known by construction.

Rank 0 computes until 10 ms, then its main stream 47 waits (EVENT_WAIT) for its P2P comm stream,
whose batchSendRecv with rank 1 cannot complete until rank 1 posts its half at 90.01 ms. Rank 1
posted late because its comm stream waited for stream 47, which computed BWD until 40 ms and then
waited (EVENT_WAIT) for a 32-rank HSDP AllReduce (31 members unprofiled) that ran 40 → 89.9 ms.
So rank 0's 90 ms wait is: 10–40 pipeline (rank 1 computing), 40–89.9 HSDP reduction straggler
among unprofiled members, 90.01–99.5 the P2P transfer itself.
"""

from __future__ import annotations

from tests.builder import MS, TraceBuilder
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.blame import Bubble, Interval
from tracegraph.loading.trace import Trace

BASE = 1_700_000_000_000_000_000
P2P = {"group": "g01", "seq": 0}
BSR = "hcom_batchSendRecv__g01_0_1"


def builder() -> TraceBuilder:
    """A builder in ms from BASE, with the miniature's P2P group."""
    b = TraceBuilder(unit=MS, base_ns=BASE)
    b.group("g01", (0, 1), dim="pp", name="pp-0-1")
    return b


def mini_seed_trace(offset_ms: float = 0.0) -> Trace:
    """The miniature of the module docstring; rank 1's clock `offset_ms` ahead."""
    b = builder()
    b.group("dp1", (1, *range(100, 131)), dim="dp", name="hsdp-32")
    r0_47, r0_50 = b.stream(0, 47), b.stream(0, 50)
    r0_47.step(1, 0, 181)
    r0_47.compute(0, 10)
    r0_47.wait(10, 100)
    r0_47.compute(100.001, 181)
    r0_50.batch_send_recv(10, 99.5, peer=1, name=BSR, **P2P)
    r0_50.record(99.9995)
    r1_47, r1_50, r1_52 = b.stream(1, 47), b.stream(1, 50), b.stream(1, 52)
    r1_47.step(1, 0, 181)
    r1_47.compute(0, 40, "MatMulGrad")
    r1_47.record(40.0)
    r1_52.wait(0, 40.0005)
    r1_47.wait(40.0001, 89.999)
    r1_47.record(90.0005)
    r1_47.compute(90.1, 141)
    r1_52.collective(40.001, 89.9, "allreduce", group="dp1", seq=0,
                     name="hcom_allReduce__dp1_0_1")
    r1_52.record(89.9985)
    r1_50.wait(0, 90.001)
    r1_50.batch_send_recv(90.01, 99.5, peer=0, name=BSR, **P2P)
    b.shift(1, offset_ms)
    return b.trace("mini")


def test_wait_is_charged_along_the_chain() -> None:
    analysis = analyze(mini_seed_trace())
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "EVENT_WAIT")
    assert wait.dur == 90 * MS
    charged = wait.by_category()
    assert abs(charged[causes.PIPELINE_FILL] - 30 * MS) < 0.05 * MS
    assert abs(charged[causes.DP_REDUCTION] - 49.9 * MS) < 0.1 * MS
    assert sum(charged.values()) == wait.dur
    assert abs(charged[causes.PP_P2P] - 9.49 * MS) < 0.1 * MS
    assert wait.category == causes.DP_REDUCTION
    assert wait.chain() == [0, 1]
    assert wait.root.rank == 1 and wait.root.name.startswith("hcom_allReduce")
    # the group by its name, not its id (dp1): an HCCL id says nothing to the reader
    assert "the 31 members of group hsdp-32 absent from the bundle" in wait.root.note
    assert wait.root.unprofiled_group == "dp1"


def test_clock_offset_is_estimated_and_removed() -> None:
    analysis = analyze(mini_seed_trace(offset_ms=0.080))
    assert abs(analysis.offsets[1] - 80_000) < 1_000
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "EVENT_WAIT")
    assert abs(wait.by_category()[causes.DP_REDUCTION] - 49.9 * MS) < 0.1 * MS


def test_critical_path_runs_through_the_reduction() -> None:
    analysis = analyze(mini_seed_trace())
    path = analysis.critical_paths[1]
    names = [(s.rank, s.name) for s in path]
    assert (1, "hcom_allReduce__dp1_0_1") in names
    assert (1, "MatMulGrad") in names
    assert path[-1].end == BASE + 181 * MS


def test_recorded_stream_wait_releases_when_its_stream_reaches_it() -> None:
    """Kineto: rank 1 records an event on stream 7 behind a stream wait (for an all-to-all that
    ended at 3 ms) and behind its compute (until 10 ms); its P2P stream waits on that record.
    The record fires when the compute ends, so rank 0's wait for the P2P is rank 1's compute,
    not the all-to-all. Stream waits sit at their host call (0.5 ms), not on the device."""
    b = builder()
    b.group("ep1", (1,), dim="ep", name="ep-1")
    r0, r1_7, r1_20 = b.stream(0, 7), b.stream(1, 7), b.stream(1, 20)
    r0.step(1, 0, 20)
    r0.compute(0, 1, correlation=1)
    r0.batch_send_recv(1, 12, peer=1, name="SendRecv", correlation=2, **P2P)
    r0.compute(12, 20, correlation=3)
    r1_7.step(1, 0, 20)
    b.stream(1, 32).collective(1, 3, "alltoall", group="ep1", seq=0, name="SendRecv",
                               correlation=5)
    r1_7.compute(0, 10, "MatMulGrad", correlation=6)
    r1_7.wait(0.5, 0.501, "Stream Wait Event", correlation=8, event_id=7,
              wait_on_stream=32)  # the all-to-all's record has correlation 7
    r1_20.wait(0.6, 0.601, "Stream Wait Event", correlation=10, event_id=9,
               wait_on_stream=7)  # stream 7's record (correlation 9) comes after the wait
    r1_20.batch_send_recv(10, 12, peer=0, name="SendRecv", correlation=11, **P2P)
    analysis = analyze(b.trace("mini"))
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "SendRecv")
    assert [(p.start - BASE, p.end - BASE, p.category, p.rank) for p in wait.intervals] == [
        (1 * MS, 10 * MS, causes.PIPELINE_FILL, 1), (10 * MS, 12 * MS, causes.PP_P2P, 0)]
    assert (wait.sureness, wait.evidence) == ("high", "")  # event ids and a sequenced P2P


def test_each_bubble_says_how_sure_its_chain_is() -> None:
    """The miniature's waits are matched by the Ascend timing rule (no event ids): medium. A
    collective whose members show different op counts is not matched: who arrived last is
    unknown, and the bubble says so."""
    wait = next(b for b in analyze(mini_seed_trace()).bubbles if b.rank == 0)
    assert (wait.sureness, wait.evidence) == ("medium", "record < 5 µs before it ended")
    b = builder()
    b.group("dp", (0, 1), dim="dp")
    r0, r1 = b.stream(0, 7), b.stream(1, 7)
    r0.step(1, 0, 100)
    r0.compute(0, 10)
    r0.collective(10, 60, group="dp")  # no sequence numbers; rank 1 shows two
    r1.step(1, 0, 100)
    r1.collective(0, 5, group="dp")
    r1.compute(5, 50)
    r1.collective(50, 60, group="dp")
    analysis = analyze(b.trace())
    (blocked,) = [b for b in analysis.bubbles if b.rank == 0]
    assert any("unsafe" in w for w in analysis.warnings)
    assert (blocked.sureness, blocked.evidence) == ("low", "a peer's matching op was not found")
    assert "the member that arrived last is unknown" in blocked.intervals[-1].note


def test_root_is_the_origin_of_the_chain_not_its_longest_link() -> None:
    """The seed sample's largest bubble, as its intervals read: rank 0 waits for rank 8192, whose
    reduction (132.848 ms) waited for rank 12288's (132.816 ms) through a P2P, then the pipeline
    (133.152 ms). Three causes within 1 % of the bubble of each other: the root is the origin of
    the chain, 12288's; a sliver of the same cause earlier still is neither root nor link."""
    def piece(start: float, end: float, category: str, rank: int) -> Interval:
        return Interval(round(start * MS), round(end * MS), category, rank, "stream 51", "x")

    bubble = Bubble(rank=0, lane="stream 47", start=0, end=round(400 * MS), name="EVENT_WAIT",
                    step=1, intervals=[
                        piece(0, 0.5, causes.DP_REDUCTION, 4096),  # a sliver: 0.1 %
                        piece(0.5, 133.316, causes.DP_REDUCTION, 12288),
                        piece(133.316, 134, causes.PP_P2P, 8192),
                        piece(134, 266.848, causes.DP_REDUCTION, 8192),
                        piece(266.848, 400, causes.PIPELINE_FILL, 0)])
    assert (bubble.root.rank, bubble.root.start) == (12288, round(0.5 * MS))
    assert bubble.chain() == [0, 8192, 12288]


def test_root_is_the_cause_holding_the_most_time_not_the_earliest_piece() -> None:
    """Pieces grouped by origin: 12288's two reductions in one group (60 ms) outweigh the
    earlier, other group's (30 ms) and 8192's (45 ms, a third group); every cause of 5 % is
    listed, largest first after the root, a 1 % sliver is not (its rank, passed through between
    listed causes, is a link of the chain)."""
    def piece(start: float, end: float, rank: int, group: str) -> Interval:
        return Interval(round(start * MS), round(end * MS), causes.DP_REDUCTION, rank,
                        "stream 51", f"ar_{group}", unprofiled_group=group)

    bubble = Bubble(rank=0, lane="stream 47", start=0, end=round(140 * MS), name="EVENT_WAIT",
                    step=1, intervals=[
                        piece(0, 30, 12288, "dp128"), piece(30, 60, 12288, "dp32"),
                        piece(60, 93.6, 8192, "dp32b"), piece(93.6, 95, 4096, "dp8"),
                        piece(95, 106.4, 8192, "dp32b"), piece(106.4, 136.4, 12288, "dp32"),
                        Interval(round(136.4 * MS), round(140 * MS), causes.PP_P2P, 0,
                                 "stream 49", "p2p")])
    found = [(c.rank, c.group, round(c.ns / MS, 1)) for c in bubble.causes()]
    assert found[:3] == [(12288, "dp32", 60.0), (8192, "dp32b", 45.0), (12288, "dp128", 30.0)]
    assert (bubble.root.rank, bubble.root.unprofiled_group) == (12288, "dp32")
    assert [c.group for c in bubble.listed_causes()] == ["dp32", "dp32b", "dp128"]
    assert bubble.category == causes.DP_REDUCTION and bubble.chain() == [0, 12288, 8192, 4096]


def test_root_of_ties_go_upstream() -> None:
    """Within 1 % of the bubble the earliest cause is the root; beyond it, the largest."""
    assert causes.root_of([(100, 50), (99, 10)], 1_000) == 1  # 0.1 % apart: upstream wins
    assert causes.root_of([(100, 50), (80, 10)], 1_000) == 0  # 2 % apart: the largest
    assert causes.root_of([], 1_000) == -1


def test_waiting_for_a_tensor_parallel_peer_is_the_tp_collective() -> None:
    """TP2 inside a PP2 job: rank 0 waits 3.6 ms in the TP all-reduce for rank 1, whose layer
    ran 10 % longer (within the ranks' variation: no straggler). The wait is the TP
    collective's, its late member (rank 1) the root, not the pipeline's fill; rank 2, the next
    stage, waiting on rank 0's send, waits on rank 0's compute (the pipeline's) and then on
    the TP collective."""
    b = builder()
    b.group("tp", (0, 1), dim="tp", name="tp-0-1")
    b.group("pp", (0, 2), dim="pp", name="pp-0-2")
    r0, r1, r2 = b.stream(0, 7), b.stream(1, 7), b.stream(2, 7)
    for lane in (r0, r1, r2):
        lane.step(1, 0, 120)
    r0.compute(0, 36.4, "Attention")
    r0.collective(36.4, 41, group="tp", seq=0, name="allreduce_tp")
    r0.send(41, 42, peer=2, group="pp", seq=0)
    r1.compute(0, 40, "Attention")
    r1.collective(40, 41, group="tp", seq=0, name="allreduce_tp")
    r2.compute(0, 5, "Embedding")
    r2.recv(5, 42, peer=0, group="pp", seq=0)
    r2.compute(42, 120, "Attention")
    analysis = analyze(b.trace("tp"))
    tp_wait = next(x for x in analysis.bubbles if x.rank == 0 and x.name == "allreduce_tp")
    assert tp_wait.category == causes.TP_COLLECTIVE and tp_wait.root.rank == 1
    assert tp_wait.by_category()[causes.TP_COLLECTIVE] > 0.95 * tp_wait.dur
    recv = next(x for x in analysis.bubbles if x.rank == 2)
    assert recv.by_category().get(causes.PIPELINE_FILL, 0) >= 31 * MS  # rank 0's compute
    assert recv.by_category().get(causes.TP_COLLECTIVE, 0) >= 3.5 * MS  # then its TP wait
