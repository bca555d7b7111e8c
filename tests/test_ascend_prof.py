"""Raw msprof PROF_* folders with one timeline file per iteration (MindSpore graph mode, 2023).

Known answers, read by hand from ../shared/real_traces/ascend/mindspore_graph_ddp2_prof (python's
json module over every file):
- two runs, PROF_000001_20230818142704322_COJGGGCANRMICFBC/device_0 (info.json.0 rank_id 0) and
  PROF_000001_20230818142704567_GQFAMHBKGODKJMLA/device_1 (rank_id 1), same hostname
  A2007104679; each holds info.json / start_info / end_info and 40 timeline files:
  msprof_, task_time_, hccl_, step_trace_ for iterations 1..10 (model id 2 on device 0, 0 on
  device 1).
- per device, over its ten msprof_* files: 4900 `Ascend Hardware` tasks (490 an iteration, as
  in each task_time_*: AI_CORE 1370, AI_CPU 20, EVENT_WAIT 40, EVENT_RECORD 40, EVENT_RESET 40,
  NOTIFY_WAIT 1400, NOTIFY_RECORD 1400, REDUCE_ASYNC_V2 300, MEMCPY_ASYNC 290), 3380 HCCL rows
  (338 an iteration, as in each hccl_*: one `Default/AllReduce-op534_0` on the `Communication
  Kernel` thread, 337 small tasks on Planes 0-3), 14 (device 0) / 9 (device 1) CANN host rows.
  The AllReduce's plane-0 tasks name stream 13 on device 0, stream 8 on device 1.
- every step_trace_* holds all ten iterations; `Iteration 1` on device 0 starts at
  56635864652.490005 µs and lasts 47587.81 µs, on device 1 57532.96 µs; later iterations
  15.1-18.0 ms.
- start_info.0: collectionTimeBegin 1692340024324979 µs at clockMonotonicRaw 56579931060630 ns;
  end_info.0: collectionTimeEnd 1692340082430569 µs at 56638036649460 ns.
- The AllReduce of iteration k starts on device 0 / device 1 at (µs): 1: 56635868946.30 /
  56635859015.95, 2: 56635948694.67 / 56635947332.11, 3: 56635987370.24 / 56635987055.16,
  4: 56636020521.66 / 56636020634.41, 5: 56636051521.95 / 56636051070.56, 6: 56636085211.02 /
  56636084752.68, 7: 56636116088.12 / 56636115760.48, 8: 56636147724.84 / 56636147121.67,
  9: 56636179678.07 / 56636179141.18, 10: 56636210792.31 / 56636210816.60: rank 0 reaches it
  last except in iterations 4 (by 112.75 µs) and 10 (by 24.29 µs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from parsers import parse_rank
from parsers.base import TraceError
from parsers.bundle import open_bundle
from tests.conftest import REAL
from tracegraph import schema
from tracegraph.analysis.analyze import Analysis, analyze

BUNDLE = REAL / "ascend" / "mindspore_graph_ddp2_prof"
RUN0 = "PROF_000001_20230818142704322_COJGGGCANRMICFBC"
RUN1 = "PROF_000001_20230818142704567_GQFAMHBKGODKJMLA"
ITERATION_US = {0: [47587.81, 15369.16, 15304.02, 15375.02, 17467.03, 15528.7, 15422.47,
                    16455.82, 15105.87, 16329.38],
                1: [57532.96, 16792.73, 15654.64, 15337.62, 18017.48, 16009.33, 15741.16,
                    16998.55, 15708.39, 16256.89]}
LAST_TO_ALLREDUCE = [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]  # by iteration, on the host's one clock


@cache
def loaded() -> tracegraph.Trace:
    return tracegraph.load(BUNDLE, use_cache=False, jobs=1)


@cache
def analysed() -> Analysis:
    return analyze(loaded())


def rank_events(rank: int) -> pd.DataFrame:
    events = loaded().events
    return events[events["rank"] == rank]


def test_each_device_folder_is_one_rank_with_its_iteration_files():
    with open_bundle(BUNDLE) as bundle:
        found = [(p.format, p.root, p.rank, len(p.files)) for p in bundle.profiles]
        assert bundle.warnings == []
    assert found == [("ascend_prof", f"{RUN0}/device_0", 0, 43),
                     ("ascend_prof", f"{RUN1}/device_1", 1, 43)]


@pytest.mark.parametrize("rank", [0, 1])
def test_every_iteration_merges_into_one_timeline(rank: int):
    events = rank_events(rank)
    tasks = events[(events["lane"].str.startswith("stream "))]
    assert len(tasks) == 4900
    assert tasks["step"].value_counts().sort_index().tolist() == [490] * 10
    assert (events["kind"] == schema.WAIT).sum() == 40
    assert (events["kind"] == schema.RECORD).sum() == 40
    assert len(events[events["lane"].str.contains(" plane ")]) == 3370
    assert len(events[events["lane_kind"] == schema.THREAD]) == {0: 14, 1: 9}[rank]
    ops = events[events["kind"] == schema.COLLECTIVE]
    assert ops["name"].tolist() == ["Default/AllReduce-op534_0"] * 10
    assert set(ops["comm"]) == {"allreduce"} and ops["step"].tolist() == list(range(1, 11))
    assert set(ops["stream"]) == {{0: 13, 1: 8}[rank]}  # the master plane's stream
    assert set(ops["group"]) == {"hccl_world_group"}
    own = events[(events["kind"] == schema.COMM_TASK) & events["lane"].str.startswith("stream ")]
    assert set(own["task_type"]) <= {"NOTIFY_WAIT", "NOTIFY_RECORD", "REDUCE_ASYNC_V2",
                                     "MEMCPY_ASYNC"}  # device tasks the HCCL tasks name


@pytest.mark.parametrize("rank", [0, 1])
def test_steps_are_the_step_trace_iterations(rank: int):
    events = rank_events(rank)
    steps = events[events["name"].str.startswith("ProfilerStep#")].sort_values("step")
    assert steps["name"].tolist() == [f"ProfilerStep#{i}" for i in range(1, 11)]
    assert (steps["dur_ns"] / 1e3).round(2).tolist() == ITERATION_US[rank]
    assert sorted(analysed().steps.query(f"rank == {rank}")["step"]) == list(range(1, 11))


def test_times_are_moved_onto_the_wall_clock():
    """µs of CLOCK_MONOTONIC_RAW plus the wall-minus-monotonic offset start_info / end_info
    state, drawn linearly between their two readings."""
    mono = (56579931060630, 56638036649460)
    offset = (1692340024324979 * 1000 - mono[0], 1692340082430569 * 1000 - mono[1])
    start = 56635864652490  # ns: Iteration 1 of device 0
    drift = offset[0] + (offset[1] - offset[0]) * (start - mono[0]) / (mono[1] - mono[0])
    step = rank_events(0).query("name == 'ProfilerStep#1'")
    assert abs(int(step["start_ns"].iloc[0]) - (start + round(drift))) <= 1
    assert int(loaded().ranks.set_index("rank").loc[0, "clock_base_ns"]) == offset[0]


def test_every_allreduce_is_matched_across_both_ranks():
    analysis = analysed()
    instances = analysis.matches.instances
    assert len(instances) == 10 and instances["safe"].all()
    assert all(sorted(ranks) == [0, 1] for ranks in instances["ranks"])
    frame = analysis.ops.frame
    steps = [sorted({int(frame.loc[op, "step"]) for op in ops}) for ops in instances["ops"]]
    assert steps == [[i] for i in range(1, 11)]


def test_which_rank_reached_each_allreduce_last():
    events = loaded().events
    ops = events[events["kind"] == schema.COLLECTIVE]
    starts = ops.pivot_table(index="step", columns="rank", values="start_ns", aggfunc="first")
    assert starts.idxmax(axis=1).tolist() == LAST_TO_ALLREDUCE
    analysis = analysed()
    graph, frame = analysis.graph, analysis.ops.frame
    found = {}
    for ops_of in analysis.matches.instances["ops"]:
        released = [op for op in ops_of if graph.dep[op] < 0]
        found[int(frame.loc[ops_of[0], "step"])] = int(frame.loc[released[0], "rank"])
    # iteration 10's 24 µs lead is within the clock offset the analysis estimates from the
    # collectives' ends (28 µs): the order read on the host's one clock is the one asserted
    assert [found[i] for i in range(1, 10)] == LAST_TO_ALLREDUCE[:9]


# --- how users copy them -------------------------------------------------------------------------
def copied(tmp_path: Path, *runs: tuple[str, str, str]) -> Path:
    """A bundle of device folders (run, device, the run folder to put it in) copied from the
    real one."""
    for run, device, into in runs:
        shutil.copytree(BUNDLE / run / device, tmp_path / into / device)
    return tmp_path


def test_one_run_holding_several_devices(tmp_path: Path):
    bundle = copied(tmp_path, (RUN0, "device_0", "PROF_000002_20230818142704322_AB"),
                    (RUN1, "device_1", "PROF_000002_20230818142704322_AB"))
    with open_bundle(bundle) as found:
        assert [(p.root, p.rank) for p in found.profiles] == [
            ("PROF_000002_20230818142704322_AB/device_0", 0),
            ("PROF_000002_20230818142704322_AB/device_1", 1)]


def test_two_runs_of_one_rank_keep_the_latest(tmp_path: Path):
    bundle = copied(tmp_path, (RUN0, "device_0", "PROF_000001_20230818142704322_OLD"),
                    (RUN0, "device_0", "PROF_000002_20230818150000000_NEW"))
    with open_bundle(bundle) as found:
        assert [p.root for p in found.profiles] == ["PROF_000002_20230818150000000_NEW/device_0"]
        assert any("rank 0 has 2" in w and "latest by folder timestamp" in w
                   for w in found.warnings)


def test_a_device_folder_alone_is_a_bundle():
    with open_bundle(BUNDLE / RUN1 / "device_1") as found:
        (profile,) = found.profiles
        parsed = parse_rank(profile, found.read)
    assert parsed.rank == 1 and parsed.meta["framework"] == "mindspore"


def test_a_truncated_iteration_file_falls_back_to_its_task_and_hccl_files(tmp_path: Path):
    bundle = copied(tmp_path, (RUN0, "device_0", RUN0))
    cut = bundle / RUN0 / "device_0" / "timeline" / "msprof_0_2_5.json"
    cut.write_bytes(cut.read_bytes()[:100_000])
    trace = tracegraph.load(bundle, use_cache=False, jobs=1)
    assert any("msprof_0_2_5.json: truncated" in w for w in trace.warnings)
    tasks = trace.events[trace.events["lane"].str.startswith("stream ")]
    assert len(tasks) == 4900 and (tasks["step"] == 5).sum() == 490  # from task_time_0_2_5
    assert len(trace.events[trace.events["lane_kind"] == schema.THREAD]) == 13  # its CANN row


def test_a_bad_timeline_file_is_one_line_naming_it(tmp_path: Path):
    bundle = copied(tmp_path, (RUN0, "device_0", RUN0))
    bad = bundle / RUN0 / "device_0" / "timeline" / "hccl_0_2_3.json"
    bad.write_text('{"not": "a timeline"}')
    (bundle / RUN0 / "device_0" / "timeline" / "msprof_0_2_3.json").unlink()
    with pytest.raises(TraceError, match=r"hccl_0_2_3\.json: not an msprof timeline"):
        tracegraph.load(bundle, use_cache=False, jobs=1)
    run = subprocess.run([sys.executable, "-m", "tracegraph", "analyze", str(bundle),
                          "--no-cache"], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "hccl_0_2_3.json" in run.stderr
