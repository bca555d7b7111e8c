"""Blame on a hand-built two-rank miniature of the seed case, whose answer is known by construction.

Rank 0 computes until 10 ms, then its main stream 47 waits (EVENT_WAIT) for its P2P comm stream,
whose batchSendRecv with rank 1 cannot complete until rank 1 posts its half at 90.01 ms. Rank 1
posted late because its comm stream waited for stream 47, which computed BWD until 40 ms and then
waited (EVENT_WAIT) for a 32-rank HSDP AllReduce (31 members unprofiled) that ran 40 → 89.9 ms.
So rank 0's 90 ms wait is: 10–40 pipeline (rank 1 computing), 40–89.9 HSDP reduction straggler
among unprofiled members, 90.01–99.5 the P2P transfer itself.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from parsers.base import GroupInfo
from tracegraph import schema
from tracegraph.analysis.analyze import analyze
from tracegraph.loading.groups import groups_frame
from tracegraph.loading.trace import Trace

MS = 1_000_000
BASE = 1_700_000_000_000_000_000


def op(rank, stream, name, kind, start_ms, end_ms, **extra):
    row = {"rank": rank, "lane": f"stream {stream}", "lane_kind": schema.STREAM, "stream": stream,
           "name": name, "kind": kind, "start_ns": BASE + int(start_ms * MS),
           "dur_ns": int((end_ms - start_ms) * MS)}
    return row | extra


def mini_seed_trace(offset_ms: float = 0.0) -> Trace:
    p2p = {"comm": "batch_send_recv", "group": "g01", "seq": 0}
    rows = [
        op(0, 47, "ProfilerStep#1", schema.MARKER, 0, 181),
        op(0, 47, "MatMul", schema.COMPUTE, 0, 10),
        op(0, 47, "EVENT_WAIT", schema.WAIT, 10, 100),
        op(0, 47, "MatMul", schema.COMPUTE, 100.001, 181),
        op(0, 50, "hcom_batchSendRecv__g01_0_1", schema.P2P, 10, 99.5, peer=1, **p2p),
        op(0, 50, "EVENT_RECORD", schema.RECORD, 99.9995, 99.9995),
        op(1, 47, "ProfilerStep#1", schema.MARKER, 0, 181),
        op(1, 47, "MatMulGrad", schema.COMPUTE, 0, 40),
        op(1, 47, "EVENT_RECORD", schema.RECORD, 40.0, 40.0),
        op(1, 52, "EVENT_WAIT", schema.WAIT, 0, 40.0005),
        op(1, 47, "EVENT_WAIT", schema.WAIT, 40.0001, 89.999),
        op(1, 47, "EVENT_RECORD", schema.RECORD, 90.0005, 90.0005),
        op(1, 47, "MatMul", schema.COMPUTE, 90.1, 141),
        op(1, 52, "hcom_allReduce__dp1_0_1", schema.COLLECTIVE, 40.001, 89.9, comm="allreduce",
           group="dp1", seq=0),
        op(1, 52, "EVENT_RECORD", schema.RECORD, 89.9985, 89.9985),
        op(1, 50, "EVENT_WAIT", schema.WAIT, 0, 90.001),
        op(1, 50, "hcom_batchSendRecv__g01_0_1", schema.P2P, 90.01, 99.5, peer=0, **p2p),
    ]
    for row in rows:  # rank 1's clock runs ahead
        if row["rank"] == 1:
            row["start_ns"] += int(offset_ms * MS)
    return trace(rows, [GroupInfo("g01", "pp-0-1", "pp", (0, 1)),
                        GroupInfo("dp1", "hsdp-32", "dp", (1, *range(100, 131)))])


def trace(rows: list[dict], infos: list[GroupInfo]) -> Trace:
    """A two-rank Trace of these event rows and groups."""
    frame = pd.DataFrame(rows)
    for column, default in (schema.STRING_DEFAULTS | schema.INT_DEFAULTS).items():
        frame[column] = frame[column].fillna(default) if column in frame else default
    events = schema.events_table({c: frame[c].tolist() for c in schema.EVENTS.names}, len(frame))
    groups, _ = groups_frame(infos, events)
    return Trace(Path("mini"), events.to_pandas(), groups, pd.DataFrame({"rank": [0, 1]}))


def test_wait_is_charged_along_the_chain() -> None:
    analysis = analyze(mini_seed_trace())
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "EVENT_WAIT")
    assert wait.dur == 90 * MS
    charged = wait.by_category()
    assert abs(charged[schema.PIPELINE_FILL] - 30 * MS) < 0.05 * MS
    assert abs(charged[schema.DP_REDUCTION] - 49.9 * MS) < 0.1 * MS
    assert sum(charged.values()) == wait.dur
    assert abs(charged[schema.PP_P2P] - 9.49 * MS) < 0.1 * MS
    assert wait.category == schema.DP_REDUCTION
    assert wait.chain() == [0, 1]
    assert wait.root.rank == 1 and wait.root.name.startswith("hcom_allReduce")
    assert "31 unprofiled members of group dp1" in wait.root.note


def test_clock_offset_is_estimated_and_removed() -> None:
    analysis = analyze(mini_seed_trace(offset_ms=0.080))
    assert abs(analysis.offsets[1] - 80_000) < 1_000
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "EVENT_WAIT")
    assert abs(wait.by_category()[schema.DP_REDUCTION] - 49.9 * MS) < 0.1 * MS


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
    p2p = {"comm": "batch_send_recv", "group": "g01", "seq": 0}
    rows = [
        op(0, 7, "ProfilerStep#1", schema.MARKER, 0, 20),
        op(0, 7, "MatMul", schema.COMPUTE, 0, 1, correlation=1),
        op(0, 7, "SendRecv", schema.P2P, 1, 12, peer=1, correlation=2, **p2p),
        op(0, 7, "MatMul", schema.COMPUTE, 12, 20, correlation=3),
        op(1, 7, "ProfilerStep#1", schema.MARKER, 0, 20),
        op(1, 32, "SendRecv", schema.COLLECTIVE, 1, 3, comm="alltoall", group="ep1", seq=0,
           correlation=5),
        op(1, 7, "MatMulGrad", schema.COMPUTE, 0, 10, correlation=6),
        op(1, 7, "Stream Wait Event", schema.WAIT, 0.5, 0.501, correlation=8, event_id=7,
           wait_on_stream=32),  # the all-to-all's record has correlation 7
        op(1, 20, "Stream Wait Event", schema.WAIT, 0.6, 0.601, correlation=10, event_id=9,
           wait_on_stream=7),  # stream 7's record (correlation 9) comes after the wait
        op(1, 20, "SendRecv", schema.P2P, 10, 12, peer=0, correlation=11, **p2p),
    ]
    analysis = analyze(trace(rows, [GroupInfo("g01", "pp-0-1", "pp", (0, 1)),
                                    GroupInfo("ep1", "ep-1", "ep", (1,))]))
    wait = next(b for b in analysis.bubbles if b.rank == 0 and b.name == "SendRecv")
    assert [(p.start - BASE, p.end - BASE, p.category, p.rank) for p in wait.intervals] == [
        (1 * MS, 10 * MS, schema.PIPELINE_FILL, 1), (10 * MS, 12 * MS, schema.PP_P2P, 0)]
