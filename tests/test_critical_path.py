"""The critical path on hand-built traces whose binding chain is known by construction."""

from __future__ import annotations

import tracegraph
from tests.builder import MS, TraceBuilder
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.critical_path import NO_OP
from tracegraph.analysis.walk import COMPUTE, STEP_TAIL, TRANSFER, WAIT


def late_receiver(step_end: float = 100) -> TraceBuilder:
    """Rank 0 computes 0–10 ms, then its send blocks until rank 1 posts the recv at 50 ms (rank
    1 runs the same forward in 50 ms: a straggler, as the two run the same ops); the transfer
    runs 50–60; rank 0 computes 60–100. Rank 0's step marker ends at `step_end`."""
    b = TraceBuilder(unit=MS)
    b.group("pp", (0, 1), dim="pp")
    r0, r1 = b.stream(0, 7), b.stream(1, 7)
    r0.step(1, 0, step_end)
    r0.compute(0, 10, "Fwd")
    r0.send(10, 60, peer=1, group="pp", seq=0)
    r0.compute(60, 100, "Bwd")
    r1.step(1, 0, 80)
    r1.compute(0, 50, "Fwd")
    r1.recv(50, 60, peer=0, group="pp", seq=0)
    r1.compute(60, 80, "Bwd")
    return b


def spans(path) -> list[tuple[int, str, str, str, float, float]]:
    return [(s.rank, s.name, s.kind, s.category, s.start / MS, s.end / MS) for s in path]


def test_path_follows_the_binding_predecessor_across_ranks() -> None:
    path = analyze(late_receiver().trace()).critical_paths[1]
    assert spans(path) == [
        (0, "Fwd", COMPUTE, causes.PIPELINE_FILL, 0, 10),
        (1, "Fwd", COMPUTE, causes.COMPUTE_STRAGGLER, 10, 50),  # what the send waited for
        (0, "send", TRANSFER, causes.PP_P2P, 50, 60),
        (0, "Bwd", COMPUTE, causes.PIPELINE_FILL, 60, 100),
    ]


def test_path_tiles_its_slowest_rank_step_including_a_marker_tail() -> None:
    """Rank 0's step marker runs 5 ms past its last op: the path says so instead of ending
    short, so its length is the step's."""
    analysis = analyze(late_receiver(step_end=105).trace())
    path = analysis.critical_paths[1]
    assert (path[-1].kind, path[-1].note, path[-1].start, path[-1].end) == (
        WAIT, STEP_TAIL, 100 * MS, 105 * MS)
    assert sum(s.end - s.start for s in path) == 105 * MS
    assert all(a.end == b.start for a, b in zip(path, path[1:], strict=False))


def test_a_step_with_no_op_is_one_unexplained_wait() -> None:
    b = TraceBuilder(unit=MS)
    lane = b.stream(0, 7)
    lane.step(1, 0, 10)
    lane.compute(0, 10)
    lane.step(2, 20, 30)  # nothing runs in step 2
    path = analyze(b.trace()).critical_paths[2]
    assert spans(path) == [(0, "", WAIT, causes.UNKNOWN, 20, 30)]
    assert path[0].note == NO_OP


def test_waiting_on_unprofiled_members_is_a_wait_charged_to_their_reduction() -> None:
    """Rank 0's only profiled member of a 4-rank DP group waits in its all-reduce 10–90 ms;
    the other three members are not in the bundle."""
    b = TraceBuilder(unit=MS)
    b.group("dp", (0, 1, 2, 3), dim="dp")
    lane = b.stream(0, 7)
    lane.step(1, 0, 100)
    lane.compute(0, 10)
    lane.collective(10, 90, group="dp", seq=0)
    lane.compute(90, 100)
    (reduction,) = [s for s in analyze(b.trace()).critical_paths[1] if s.start == 10 * MS]
    assert (reduction.kind, reduction.category, reduction.end) == (
        WAIT, causes.DP_REDUCTION, 90 * MS)


def test_steps_are_the_device_work_their_host_launched() -> None:
    """A GPU-bound rank: the host's ProfilerStep#1 (0–10 ms) enqueues a kernel that runs 12–30
    ms, #2 (10–20 ms) one that runs 30–40 ms; Kineto's GPU-side copies of the markers span only
    a sliver. Steps are 0–30 and 30–40 ms: the device timeline, tiled."""
    b = TraceBuilder(unit=MS)
    host, gpu = b.thread(0, 1, "python"), b.stream(0, 7)
    for n, (lo, kernel) in enumerate(((0, (12, 30)), (10, (30, 40))), start=1):
        host.step(n, lo, lo + 10)
        host.host(lo + 1, lo + 2, "cudaLaunchKernel", correlation=n)
        gpu.compute(*kernel, correlation=n)
        gpu.marker(kernel[0], kernel[0] + 0.01, f"ProfilerStep#{n}")
    steps = analyze(b.trace()).steps
    assert steps[["step", "start", "end"]].values.tolist() == [[1, 0, 30 * MS], [2, 30 * MS,
                                                                                 40 * MS]]


def test_host_step_markers_win_over_gpu_side_copies_on_a_real_rocm_trace() -> None:
    """TraceLens' MI300X trace: host ProfilerStep#15..17 last 16.8, 16.0, 15.9 ms; the GPU-side
    copies 0.016–0.018 ms. Each step covers at least its host marker, and they tile."""
    from tests.conftest import REAL

    steps = analyze(tracegraph.load(REAL / "kineto/tracelens/mi300", use_cache=False)).steps
    assert steps["step"].tolist() == [15, 16, 17]
    assert ((steps["end"] - steps["start"]) > 15 * MS).all()
    assert (steps["start"].to_numpy()[1:] >= steps["end"].to_numpy()[:-1]).all()
