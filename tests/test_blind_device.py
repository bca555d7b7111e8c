"""A device timeline that holds neither host launches nor stream waits (torch_npu level 2 without
trace_view.json: kernel_details.csv and communication.json only). Read by hand in
`ascend/torch_npu_pp2dp2_level2_comm`: rank 0's compute stream 2 is idle from 154.43 to 314.95 ms
(aligned clock) before an `aclnnMatmul_MatMulV3Common_MatMulV3`, while its pipeline exchange
`hcom_batchSendRecv__128_4_1` (pp group {0, 2}) runs from 155.06 to 313.61 ms. The profile
cannot show the wait, so the time stays unexplained, but the exchange in flight is named as
what the stream likely waited for, and the verdict never presents the MatMul as the cause."""

from __future__ import annotations

import pytest

import tracegraph
from reports.verdict import verdict_lines
from tests.conftest import REAL
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.verdict import verdict

BUNDLE = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    return analyze(tracegraph.load(BUNDLE, use_cache=False))


def test_the_exchange_in_flight_through_an_unexplained_gap_is_named(analysis: Analysis) -> None:
    [gap] = [b for b in analysis.bubbles if b.rank == 0 and b.lane == "stream 2"
             and abs((b.start - analysis.origin) / 1e6 - 154.43) < 0.01]
    assert gap.category == "unknown" and gap.sureness == "low"
    [piece] = gap.intervals
    assert piece.name == "aclnnMatmul_MatMulV3Common_MatMulV3"
    assert "hcom_batchSendRecv__128_4_1" in piece.note and "in flight through 99%" in piece.note


def test_the_verdict_calls_unexplained_time_idle_before_its_op(analysis: Analysis) -> None:
    lines = verdict_lines(verdict(analysis))
    [unknown] = [i for i, x in enumerate(lines) if x.lstrip().startswith("unknown ")]
    assert "rank 0 stream 2 idle before aclnnMatmul_MatMulV3Common_MatMulV3" in lines[unknown + 1]
    stalls = [x for x in lines if "[unknown] ←" in x]
    assert stalls and all(" idle before " in x for x in stalls)
