"""Ascend profiles as users hand them over, beyond a folder with its trace_view.json: a level-2
folder whose trace was dropped (kernel_details.csv instead), one rank's trace_view.json on its
own, raw msprof output with op_summary_*.csv only.

Known answers, read by hand from the real files (../shared/real_traces/ascend):
- torch_npu_pp2dp2_level2_comm: kernel_details.csv of rank 0 has 2463 rows, 15 of them
  `Accelerator Core` COMMUNICATION; rank 2's 2587 rows, 23 COMMUNICATION; every other row on
  `Stream ID` 2, `Step Id` 13. Ranks 1 and 3 have no kernel_details.csv. communication.json holds
  15 / 15 / 23 / 23 ops; step_trace_time.csv gives step 13 a `Stage` of 810022.25 µs (rank 0)
  and 809803.25 µs (rank 2). profiler_metadata.json: pp groups group_name_19 = [0, 2] and
  group_name_22 = [1, 3], dp group_name_5 = [0, 1], world group_name_0 = [0, 1, 2, 3].
- msprof_analyze_single/.../timeline_advice/trace_view.json: 2212 `X` events, layers Python,
  Ascend Hardware, CANN and Overlap Analysis; no rank anywhere in it or its name.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from parsers.classify import double_hash
from reports.html import _kpis
from tests.conftest import REAL
from tracegraph import schema
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.summary import summarize
from tracegraph.verify import metrics

PP2DP2 = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
BARE = REAL / "ascend" / "msprof_analyze_single" / "test/ut/advisor/timeline_advice/trace_view.json"
PP = {0: double_hash("group_name_19"), 2: double_hash("group_name_19"),
      1: double_hash("group_name_22"), 3: double_hash("group_name_22")}


@cache
def level2() -> Analysis:
    return analyze(tracegraph.load(PP2DP2, use_cache=False))


def kernel_rows(rank: int) -> list[dict[str, str]]:
    path = PP2DP2 / f"rank_{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


# --- a level-2 folder without trace_view.json ---------------------------------------------------


@pytest.mark.parametrize(("rank", "rows", "comm"), [(0, 2463, 15), (2, 2587, 23)])
def test_kernel_details_give_the_device_timeline(rank: int, rows: int, comm: int):
    table = kernel_rows(rank)
    assert len(table) == rows
    events = level2().trace.events
    device = events[(events["rank"] == rank) & (events["lane_kind"] == schema.STREAM)
                    & (events["kind"] != schema.MARKER)]
    assert len(device) == rows - comm
    assert set(device["lane"]) == {"stream 2"} and set(device["step"]) == {13}
    first = min(table, key=lambda r: r["Start Time(us)"].strip())
    assert device["start_ns"].min() == int(first["Start Time(us)"].strip().replace(".", ""))
    assert set(device["kind"]) == {schema.COMPUTE}  # no EVENT_WAIT / EVENT_RECORD in the table
    warnings = [w for w in level2().trace.warnings if w.startswith(f"rank {rank}: ")]
    assert any("cannot be matched" in w and "kernel_details.csv" in w for w in warnings)


@pytest.mark.parametrize(("rank", "stage_us"), [(0, 810022.25), (2, 809803.25)])
def test_the_step_spans_its_device_tasks_as_step_trace_time_says(rank: int, stage_us: float):
    steps = level2().trace.events
    marker = steps[(steps["rank"] == rank) & (steps["name"] == "ProfilerStep#13")]
    assert len(marker) == 1 and marker["kind"].iloc[0] == schema.MARKER
    # msprof sums float µs; the span here is exact ns: equal within a µs
    assert abs(marker["dur_ns"].iloc[0] - stage_us * 1000) < 1000


def test_every_rank_keeps_what_its_step_table_states():
    """step_trace_time.csv of each rank, by hand: step 13, Stage 810022.25 / 809431.75 /
    809803.25 / 810150.25 µs and Computing 231290.1 / 230903.72 / 400448.26 / 401131.7 µs
    (ranks 1 and 3 hold no timeline, so this is all that times their step)."""
    stated = level2().trace.stated_steps().set_index("rank")
    assert list(stated.index) == [0, 1, 2, 3] and set(stated["step"]) == {13}
    assert stated["ms"].round(5).tolist() == [810.02225, 809.43175, 809.80325, 810.15025]
    assert stated["computing_ms"].round(5).tolist() == [231.2901, 230.90372, 400.44826, 401.1317]


def test_an_incomplete_kernel_table_is_said_to_be_one():
    """torch_npu_2023_comm's kernel_details.csv files are 21- and 22-row excerpts (by hand: `wc
    -l`); their step 2 spans 267.850 / 16.420 ms where step_trace_time.csv's Stage says
    291.698 / 294.587 ms. pp2dp2's complete tables agree with their Stage (above): no warning."""
    trace = tracegraph.load(REAL / "ascend" / "torch_npu_2023_comm", use_cache=False)
    incomplete = [w for w in trace.warnings if "the table is incomplete" in w]
    assert [w.split(":")[0] for w in incomplete] == ["rank 0", "rank 1"]
    assert "span 16.420 ms, step_trace_time.csv's Stage 294.587 ms" in incomplete[1]
    assert not any("the table is incomplete" in w for w in level2().trace.warnings)


def test_collectives_and_p2p_match_across_the_four_ranks():
    analysis = level2()
    frame, matches = analysis.ops.frame, analysis.matches
    comm = frame[frame["kind"].isin([schema.COLLECTIVE, schema.P2P])]
    assert comm.groupby("rank").size().to_dict() == {0: 15, 1: 15, 2: 23, 3: 23}
    instances = matches.instances
    world = instances[instances["group"] == double_hash("group_name_0")]
    assert len(world) == 4 and all(r == [0, 1, 2, 3] for r in world["ranks"])
    dp = instances[instances["group"] == double_hash("group_name_5")]  # dp [0, 1]
    assert len(dp) == 4 and all(r == [0, 1] for r in dp["ranks"])
    p2p = frame[frame["kind"] == schema.P2P]
    assert len(p2p) == 12  # batchSendRecv _3, _4, _5 on each rank
    for i, row in p2p.iterrows():
        peer = matches.dep[i]
        assert matches.how[i] == "p2p" and row["group"] == PP[int(row["rank"])]
        assert frame.at[peer, "name"] == row["name"] and frame.at[peer, "rank"] == row["peer"]
    assert set(zip(p2p["rank"], p2p["peer"], strict=True)) == {(0, 2), (2, 0), (1, 3), (3, 1)}


def test_idle_device_time_is_never_blamed_on_a_launch_the_profile_does_not_show():
    """Without a trace nothing says when an op was launched nor what a stream waited for: the
    long idle stretches of stream 2 (rank 0 waits ≈158 ms in hcom_batchSendRecv__128_4_1 for
    rank 2, communication.json) stay unexplained, and say how unsure that is."""
    bubbles = [b for b in level2().bubbles if b.dur > 100e6]
    assert bubbles
    for bubble in bubbles:
        assert bubble.category == "unknown" and bubble.sureness == "low"
        assert "no host launch" in bubble.evidence


# --- one rank's file on its own -----------------------------------------------------------------


def test_a_bare_trace_view_is_a_one_rank_bundle(tmp_path: Path):
    trace = tracegraph.load(BARE, use_cache=False)
    assert trace.rank_ids == [0]
    assert trace.ranks["framework"].tolist() == ["torch_npu"]  # its framework layer: Python
    assert any("no rank stated" in w and "rank 0" in w for w in trace.warnings)
    device = trace.events[trace.events["lane_kind"] == schema.STREAM]
    assert len(device) > 0 and set(trace.events["name"]) >= {"ProfilerStep#1"}
    assert analyze(trace).steps["step"].tolist() == [1]
    rank_map = tmp_path / "ranks.json"
    rank_map.write_text('{"trace_view.json": 5}')
    run = subprocess.run([sys.executable, "-m", "tracegraph", "analyze", str(BARE), "--json",
                          "--rank-map", str(rank_map), "--no-cache"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert '"rank": 5' in run.stdout


def test_a_bare_trace_is_one_of_a_folder_of_them(tmp_path: Path):
    for rank in (3, 7):
        shutil.copy(BARE, tmp_path / f"rank{rank}_trace_view.json")
    assert tracegraph.load(tmp_path, use_cache=False).rank_ids == [3, 7]


# --- raw msprof output with only op_summary -----------------------------------------------------


OP_SUMMARY_HEADER = ("Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type,OP State,Task Type,"
                     "Task Start Time(us),Task Duration(us),Task Wait Time(us),Block Dim")


def test_raw_msprof_op_summary_gives_the_device_timeline(tmp_path: Path):
    """msprof's op_summary columns (CANN docs, atlasprofiling_16_0067): the kernels of
    kernel_details.csv rank 0 rewritten under them, and one HCCL row with N/A stream."""
    prof = tmp_path / "PROF_000001_20251127000000_ABCDEFG"
    (prof / "device_0").mkdir(parents=True)
    (prof / "device_0" / "info.json.0").write_text('{"rank_id": 4}')
    out = prof / "mindstudio_profiler_output"
    out.mkdir()
    rows = [r for r in kernel_rows(0) if r["Accelerator Core"] != "COMMUNICATION"][:50]
    lines = [OP_SUMMARY_HEADER] + [
        f"0,4294967295,{r['Task ID']},{r['Stream ID']},{r['Name']},{r['Type']},dynamic,"
        f"{r['Accelerator Core']},{r['Start Time(us)']},{r['Duration(us)']},0,1" for r in rows]
    lines.append("0,4294967295,N/A,N/A,hcom_allReduce__612_4_1,hcom_allReduce_,N/A,HCCL,"
                 f"{rows[-1]['Start Time(us)'].strip()},5.0,0,0")
    (out / "op_summary_20251127000000.csv").write_text("\n".join(lines) + "\n")
    trace = tracegraph.load(tmp_path, use_cache=False)
    assert trace.rank_ids == [4] and trace.ranks["framework"].tolist() == ["msprof"]
    events = trace.events
    device = events[events["lane_kind"] == schema.STREAM]
    assert len(device) == 50 and set(device["stream"]) == {2}
    assert pd.Series(sorted(device["name"])).tolist() == sorted(r["Name"] for r in rows)
    hccl = events[events["kind"] == schema.COLLECTIVE]
    assert hccl["name"].tolist() == ["hcom_allReduce__612_4_1"] and hccl["seq"].tolist() == [4]
    assert any("op_summary" in w and "cannot be matched" in w for w in trace.warnings)


def test_the_slowest_rank_is_the_one_its_step_table_times_slowest():
    """Rank 3 has no timeline; its step_trace_time.csv's Stage of step 13, 810150.25 µs, beats
    rank 0's 810022.25 µs (the slowest with a timeline): the step time and its slowest rank are
    rank 3's, and no exposed bubble time is claimed for it."""
    analysis = level2()
    assert analysis.stated_steps()[["rank", "step"]].values.tolist() == [[1, 13], [3, 13]]
    assert round(metrics.step_ms(analysis)[13], 5) == 810.15025
    slowest = metrics.slowest_rank_bubbles(analysis)[13]
    assert slowest.rank == 3 and slowest.stated
    assert round(metrics.rank_step_ms(analysis)[1], 5) == 809.43175
    kpis = _kpis(summarize(analysis, step=13), slowest)  # the report's step head
    assert "810.1 ms</b> (slowest: rank 3)" in kpis and "summed over 2 ranks" in kpis
    assert "its exposed bubble time is unknown" in kpis
