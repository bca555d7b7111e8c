"""The normalized memory table: Ascend memory CSVs and Kineto `[memory]` events.

Known answers for the real torch_npu PP2×DP2 profile were read by hand with awk from its
`memory_record.csv` and `operator_memory.csv` (ranks 0 and 2 recorded memory, 1 and 3 did not).
"""

from __future__ import annotations

from pathlib import Path

import tracegraph
from tracegraph import schema

MIB = 1 << 20
PP2DP2 = "ascend/torch_npu_pp2dp2_level2_comm"


def test_ascend_memory_csvs(real: Path, cache_dir: Path) -> None:
    trace = tracegraph.load(real / PP2DP2, cache_dir=cache_dir)
    memory = trace.memory
    assert list(memory.columns) == schema.MEMORY.names
    assert sorted(memory["rank"].unique()) == [0, 2]
    pta = memory[(memory["source"] == "memory_record") & (memory["component"] == "PTA")]
    # awk: 9309 / 9678 PTA rows; peak Total Allocated 10282.749023 / 10818.062988 MB
    assert pta.groupby("rank").size().to_dict() == {0: 9309, 2: 9678}
    peaks = pta.groupby("rank")["allocated"].max()
    assert abs(peaks[0] - 10282.749023 * MIB) < MIB / 1000
    assert abs(peaks[2] - 10818.062988 * MIB) < MIB / 1000
    top = pta[pta["rank"] == 0].sort_values("allocated").iloc[-1]
    assert top["start_ns"] == 1764246877390971790  # the tab after the µs is not part of it
    assert set(pta["device"]) == {"npu:0", "npu:4"}
    ops = memory[memory["source"] == "operator_memory"]
    # awk: rank 0 has 3103 allocations, 3102 released; rank 2 3226 and 3221
    assert ops.groupby("rank").size().to_dict() == {0: 3103 + 3102, 2: 3226 + 3221}
    assert (ops["bytes"] > 0).sum() == 3103 + 3226 and (ops["bytes"] < 0).sum() == 3102 + 3221
    modules = memory[memory["source"] == "npu_module_mem"]
    assert {"HCCL", "APP", "SLOG", "RUNTIME"} <= set(modules["component"])
    assert (modules.groupby("component")["reserved"].max() > 0).all()  # idle modules dropped


def test_memory_survives_the_cache(real: Path, cache_dir: Path) -> None:
    first = tracegraph.load(real / PP2DP2, cache_dir=cache_dir)
    again = tracegraph.load(real / PP2DP2, cache_dir=cache_dir)
    assert len(again.memory) == len(first.memory) > 0
    assert again.memory["allocated"].max() == first.memory["allocated"].max()


def test_spreadsheet_rounded_timestamps_are_skipped_with_a_warning(real: Path) -> None:
    """The 2023 profile's rank 1 `memory_record.csv` went through a spreadsheet: all 30 rows
    read `1.69512E+15` (rounded to ten seconds). They are skipped with a warning naming the
    file; its `operator_memory.csv` (exact: 21 allocations, 19 released, by awk) still loads."""
    trace = tracegraph.load(real / "ascend" / "torch_npu_2023_comm", use_cache=False)
    warned = [w for w in trace.warnings if "test_rank_1/ASCEND_PROFILER_OUTPUT/memory_record.csv"
              in w]
    assert len(warned) == 1 and "30 of 30 rows skipped" in warned[0] and "1.69512E+15" in warned[0]
    mine = trace.memory[trace.memory["rank"] == 1]
    assert set(mine["source"]) == {"operator_memory"} and len(mine) == 21 + 19
