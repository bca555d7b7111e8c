"""The normalized memory table: Ascend memory CSVs, the `.db` export's memory tables and
Kineto `[memory]` events.

Known answers for the real torch_npu PP2×DP2 profile were read by hand with awk from its
`memory_record.csv` and `operator_memory.csv` (ranks 0 and 2 recorded memory, 1 and 3 did not).
Those for the real `.db` export (torch_npu_ddp8_db_level1) come from plain SQL over its tables in
this module, written apart from the parser: per rank MEMORY_RECORD holds 381 `PTA`, 114 `GE` and
495 `PTA+GE` rows, NPU_MEM 14 / 13 `app` rows, OP_MEMORY 184 allocations of which 160 were
released, NPU_MODULE_MEM 14 samples of each of 78 modules, 4 of which ever hold memory.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from tests.test_ascend_db import DB_BUNDLE, db_path, loaded, raw
from tracegraph import schema
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.findings import stage_memory, stage_of

MIB = 1 << 20
PP2DP2 = "ascend/torch_npu_pp2dp2_level2_comm"
TEXT_DDP8 = "ascend/torch_npu_ddp8_level1"


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


# --- the `.db` export: its memory tables against a direct reading of them ------------------------


def db_memory(rank: int, source: str) -> pd.DataFrame:
    memory = loaded().memory
    return memory[(memory["rank"] == rank) & (memory["source"] == source)]


@pytest.mark.parametrize("rank", [0, 1])
def test_memory_records_are_the_raw_tables(rank: int) -> None:
    """MEMORY_RECORD per component and NPU_MEM's `app` rows as `APP` (ddr + hbm, as
    memory_record.csv's APP rows are msprof's npu_mem `memory`): the same row counts, times and
    peaks in bytes as SQL reads them; GE's active total is unknown (the database writes 0 there,
    the CSV nothing)."""
    records = db_memory(rank, "memory_record")
    expected = {c: (n, alloc, res) for c, n, alloc, res in raw(
        rank, "SELECT s.value, COUNT(*), MAX(totalAllocated), MAX(totalReserved) FROM "
              "MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component GROUP BY s.value")}
    expected |= {c: (n, -1, res) for c, n, res in raw(
        rank, "SELECT 'APP', COUNT(*), MAX(ddr + hbm) FROM NPU_MEM n "
              "JOIN STRING_IDS s ON s.id = n.type WHERE s.value = 'app'")}
    found = records.groupby("component").agg(n=("start_ns", "size"), alloc=("allocated", "max"),
                                             res=("reserved", "max"))
    assert {c: tuple(row) for c, row in found.iterrows()} == expected
    assert {c: n for c, (n, _, _) in expected.items()} == {
        "PTA": 381, "GE": 114, "PTA+GE": 495, "APP": (14, 13)[rank]}
    pta = records[records["component"] == "PTA"]
    assert sorted(pta["start_ns"]) == sorted(t for (t,) in raw(
        rank, "SELECT timestamp FROM MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component "
              "WHERE s.value = 'PTA'"))
    assert pta["active"].max() == raw(rank, "SELECT MAX(totalActive) FROM MEMORY_RECORD m JOIN "
                                            "STRING_IDS s ON s.id = m.component "
                                            "WHERE s.value = 'PTA'")[0][0]
    assert set(records.loc[records["component"] == "GE", "active"]) == {-1}
    [(device,)] = raw(rank, "SELECT deviceId FROM RANK_DEVICE_MAP")
    assert set(loaded().memory.query(f"rank == {rank}")["device"]) == {f"npu:{device}"}


@pytest.mark.parametrize("rank", [0, 1])
def test_operator_memory_is_an_allocation_and_a_release_row(rank: int) -> None:
    """Each OP_MEMORY row: +size at its allocation with the totals then, and, once released,
    −size at its release with the totals then (as operator_memory.csv's rows give them)."""
    ops = db_memory(rank, "operator_memory")
    columns = "s.value, {sign}size, {time}, COALESCE({moment}TotalAllocated, -1), " \
              "COALESCE({moment}TotalReserved, -1), COALESCE({moment}TotalActive, -1)"
    table = " FROM OP_MEMORY o JOIN STRING_IDS s ON s.id = o.name"
    allocations = raw(rank, "SELECT " + columns.format(sign="", time="allocationTime",
                                                       moment="allocation") + table)
    releases = raw(rank, "SELECT " + columns.format(sign="-", time="releaseTime",
                                                    moment="release") + table
                   + " WHERE releaseTime IS NOT NULL")
    assert (len(allocations), len(releases)) == (184, 160)
    found = ops[["name", "bytes", "start_ns", "allocated", "reserved", "active"]]
    assert sorted(found.itertuples(index=False, name=None)) == sorted(allocations + releases)


@pytest.mark.parametrize("rank", [0, 1])
def test_module_memory_keeps_the_modules_that_hold_memory(rank: int) -> None:
    modules = db_memory(rank, "npu_module_mem")
    expected = {name: (n, peak) for name, n, peak in raw(
        rank, "SELECT e.name, COUNT(*), MAX(m.totalReserved) FROM NPU_MODULE_MEM m "
              "JOIN ENUM_MODULE e ON e.id = m.moduleId GROUP BY e.name "
              "HAVING MAX(m.totalReserved) > 0")}
    found = modules.groupby("component").agg(n=("start_ns", "size"), peak=("reserved", "max"))
    assert {c: tuple(row) for c, row in found.iterrows()} == expected
    assert set(expected) == {"APP", "GE", "HCCL", "RUNTIME"}


def test_the_db_and_the_text_export_of_the_job_give_the_same_memory(real: Path,
                                                                      cache_dir: Path) -> None:
    """torch_npu_ddp8_level1 is the same AlexNet DDP job exported as text (another run of it):
    what the allocator decides comes out the same from both formats — rows per source and
    component, the PTA and GE peaks, each module's peak, the operator allocations, releases and
    the bytes they leave held; what timing decides does not (the PTA+GE sums interleave PTA and
    GE events; msprof samples APP every 20 ms: rank 1 got 13 samples in the database, 14 as
    text)."""
    text = tracegraph.load(real / TEXT_DDP8, cache_dir=cache_dir).memory
    keys = ["rank", "source", "component"]

    def shape(memory: pd.DataFrame) -> pd.DataFrame:
        stable = memory[~memory["component"].isin(["PTA+GE", "APP"])
                        | (memory["source"] == "npu_module_mem")]
        return stable.groupby(keys).agg(
            rows=("start_ns", "size"), allocated=("allocated", "max"),
            reserved=("reserved", "max"), active=("active", "max"), held=("bytes", "sum"))

    pd.testing.assert_frame_equal(shape(loaded().memory), shape(text))
    assert len(shape(text)) == 2 * 7
    for memory in (loaded().memory, text):
        sums = memory[memory["component"] == "PTA+GE"].groupby("rank").size()
        assert sums.tolist() == [495, 495]


def test_stage_memory_reads_the_database_peak_within_the_step() -> None:
    """The stage-memory finding on the `.db` bundle: each rank's PTA+GE peak, baseline and
    reserved bytes within its step, as SQL over MEMORY_RECORD and STEP_TIME reads them."""
    analysis = analyze(loaded())
    rows = stage_memory.memory_table(analysis, stage_of(analysis)).set_index("rank")
    for rank in (0, 1):
        [(peak, base, reserved)] = raw(
            rank, "SELECT MAX(totalAllocated), MIN(totalAllocated), MAX(totalReserved) FROM "
                  "MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component JOIN STEP_TIME t "
                  "WHERE s.value = 'PTA+GE' AND m.timestamp BETWEEN t.startNs AND t.endNs")
        assert rows.loc[rank, ["component", "peak", "baseline", "reserved"]].tolist() == [
            "PTA+GE", peak, base, reserved]
    assert (rows.loc[0, "peak"], rows.loc[1, "peak"]) == (1263251456, 1322295296)


def test_a_memory_table_lacking_a_column_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """Memory is not what the analysis stands on: a memory table without a column read is
    skipped with a warning naming the file and the column, the other tables still read."""
    bundle = tmp_path / "bundle"
    shutil.copytree(DB_BUNDLE, bundle)
    db = bundle / db_path(0).relative_to(DB_BUNDLE)
    with closing(sqlite3.connect(db)) as conn:  # closed: its WAL is checkpointed into the file
        conn.execute("ALTER TABLE OP_MEMORY DROP COLUMN releaseTime")
    trace = tracegraph.load(bundle, use_cache=False)
    warned = [w for w in trace.warnings if "OP_MEMORY" in w]
    assert len(warned) == 1 and "no column releaseTime" in warned[0] and db.name in warned[0]
    mine = trace.memory[trace.memory["rank"] == 0]
    assert set(mine["source"]) == {"memory_record", "npu_module_mem"}
    assert set(trace.memory.loc[trace.memory["rank"] == 1, "source"]) == {
        "memory_record", "operator_memory", "npu_module_mem"}
