"""`estimate_offsets` recovers clock shifts built into hand-made traces (µs).

In true time every pair of matched device-side ops below ends together; each rank's clock is
then shifted, so the offset to find is exactly that shift (relative to its set's lowest rank).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.builder import US, TraceBuilder
from tracegraph.graph.clock import estimate_offsets
from tracegraph.graph.match import match
from tracegraph.graph.ops import build_ops


def offsets(b: TraceBuilder) -> dict[int, int]:
    trace = b.trace()
    ops = build_ops(trace.events)
    return estimate_offsets(ops, match(ops, trace.group_members()))


def allreduce(b: TraceBuilder, group: str, starts: dict[int, float], end: float, seq: int,
              lane: str = "") -> None:
    """One instance of `group`: each rank starts at its time, all end at `end`, on device
    stream 52 or, with `lane`, on a CPU worker thread of that name."""
    for rank, start in starts.items():
        where = b.comm_lane(rank, lane) if lane else b.stream(rank, 52)
        where.collective(start, end, group=group, seq=seq)


def shifted(b: TraceBuilder, shifts: dict[int, float]) -> TraceBuilder:
    for rank, by in shifts.items():
        b.shift(rank, by)
    return b


def world_collectives() -> TraceBuilder:
    """Ranks 0-2: two allreduces of the whole world."""
    b = TraceBuilder()
    allreduce(b, "world", {0: 10, 1: 30, 2: 20}, 100, seq=0)
    allreduce(b, "world", {0: 300, 1: 210, 2: 250}, 400, seq=1)
    return b


def collective_then_p2p() -> TraceBuilder:
    """Ranks 0-1 share an allreduce; rank 2 is linked to them only by P2P with rank 1."""
    b = TraceBuilder()
    allreduce(b, "dp01", {0: 10, 1: 30}, 100, seq=0)
    b.stream(1, 50).send(120, 150, peer=2, group="pp12", seq=0)
    b.stream(2, 50).recv(110, 150, peer=1, group="pp12", seq=0)
    b.stream(2, 50).send(200, 260, peer=1, group="pp12", seq=1)
    b.stream(1, 50).recv(230, 260, peer=2, group="pp12", seq=1)
    return b


@pytest.mark.parametrize("build", [world_collectives, collective_then_p2p])
def test_offsets_recover_the_clock_shifts(build: Callable[[], TraceBuilder]) -> None:
    b = shifted(build(), {1: 250, 2: -80})
    assert offsets(b) == {0: 0, 1: 250 * US, 2: -80 * US}


def test_disconnected_sets_are_each_anchored_at_their_lowest_rank() -> None:
    """Ranks {0, 1} and {2, 3} share no op: rank 2 is read as 0 and rank 3 relative to it."""
    b = TraceBuilder()
    allreduce(b, "a", {0: 10, 1: 40}, 100, seq=0)
    allreduce(b, "b", {2: 15, 3: 25}, 100, seq=0)
    shifted(b, {1: 250, 2: 1000, 3: -80})
    assert offsets(b) == {0: 0, 1: 250 * US, 2: 0, 3: -1080 * US}


def test_cpu_collectives_are_not_used() -> None:
    """gloo-like ranks: collectives and P2P on worker threads, which do not end together, so
    rank 1's 250 µs shift is not measurable: every offset stays 0."""
    b = TraceBuilder()
    allreduce(b, "gloo", {0: 10, 1: 30}, 100, seq=0, lane="thread 7 gloo")
    b.comm_lane(0, "thread 7 gloo").send(120, 150, peer=1, group="gloo", seq=1)
    b.comm_lane(1, "thread 7 gloo").recv(110, 150, peer=0, group="gloo", seq=1)
    for rank in (0, 1):
        b.thread(rank, 1, "python").host(0, 160, "forward")
    assert offsets(shifted(b, {1: 250})) == {0: 0, 1: 0}


def test_cpu_collectives_beside_device_ones_do_not_pull_the_estimate() -> None:
    """Device ranks that also run a gloo group: only the NCCL-like allreduce (ending together
    on stream 52) counts; the gloo barrier, whose ends are 3 ms apart, would skew it."""
    b = TraceBuilder()
    allreduce(b, "nccl", {0: 10, 1: 30}, 100, seq=0)
    b.comm_lane(0, "thread 7 gloo").collective(200, 300, "barrier", group="gloo", seq=0)
    b.comm_lane(1, "thread 7 gloo").collective(250, 3300, "barrier", group="gloo", seq=0)
    assert offsets(shifted(b, {1: 250})) == {0: 0, 1: 250 * US}
