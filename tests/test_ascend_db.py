"""The `.db` export on the real torch_npu DDP profiles (../shared/real_traces/ascend/
torch_npu_ddp8_db_level1), against a direct reading of their raw tables, and bad databases built
here.

Known answers come from plain SQL over the same files in this module (`raw`), written apart from
the parser: TASK rows and their STRING_IDS task types (552 per rank, 10 EVENT_WAIT), the 4
COMMUNICATION_OP rows (`hcom_allReduce__210_{0..3}_1`, comm name
`90.91.105.46%enp189s0f0_60000_0_1736410538306028`), 296 COMMUNICATION_TASK_INFO rows, CANN_API,
PYTORCH_API and STEP_TIME (step 50). Read by hand with the sqlite3 shell: each rank's EVENT_WAITs
on stream 2 last 66.7 / 2.0 / 2.1 / 8.4 ms (rank 0) and 71.7 / 2.0 / 2.1 / 8.4 ms (rank 1), the
`work.wait()` on each all-reduce; rank 0's database was post-processed (it has `waitNs`, 693 394 ns
on the first all-reduce), rank 1's was not (no `waitNs` column).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tracegraph
from parsers import parse_rank
from parsers.base import TraceError
from parsers.bundle import open_bundle
from parsers.classify import double_hash
from tests.conftest import REAL
from tests.test_analysis_real import (
    assert_clocks_aligned,
    assert_released_by_allreduces,
    long_waits,
)
from tests.test_simulate_writers import hand_timeline
from tracegraph import schema
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.simulate.bundle_writer import write_bundle

DB_BUNDLE = REAL / "ascend" / "torch_npu_ddp8_db_level1"
COMM_NAME = "90.91.105.46%enp189s0f0_60000_0_1736410538306028"
GROUP = double_hash(COMM_NAME)


def db_path(rank: int) -> Path:
    return (DB_BUNDLE / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
            / f"ascend_pytorch_profiler_{rank}.db")


def raw(rank: int, sql: str) -> list[tuple]:
    """Rows of `sql` over rank's database, read straight from the file."""
    uri = db_path(rank).as_uri() + "?mode=ro&immutable=1"
    with sqlite3.connect(uri, uri=True) as conn:
        return conn.execute(sql).fetchall()


def raw_count(rank: int, sql: str) -> int:
    return int(raw(rank, sql)[0][0])


def typed(rank: int, task_type: str) -> int:
    return raw_count(rank, "SELECT COUNT(*) FROM TASK t JOIN STRING_IDS s ON s.id = t.taskType "
                           f"WHERE s.value = '{task_type}'")


@cache
def loaded() -> tracegraph.Trace:
    with tempfile.TemporaryDirectory() as cache_dir:
        return tracegraph.load(DB_BUNDLE, cache_dir=Path(cache_dir))


def events(rank: int) -> pd.DataFrame:
    ev = loaded().events
    return ev[ev["rank"] == rank]


# --- counts: the parser against the raw tables --------------------------------------------------


def test_the_bundle_is_two_database_profiles():
    with open_bundle(DB_BUNDLE) as bundle:
        assert [(p.format, p.root, p.rank, sorted(p.files)) for p in bundle.profiles] == [
            ("ascend_db", f"rank{r}_ascend_pt", r, ["db", "info"]) for r in (0, 1)]
    assert loaded().ranks["format"].tolist() == ["ascend_db", "ascend_db"]
    assert loaded().ranks["device"].tolist() == ["npu:0", "npu:1"]  # RANK_DEVICE_MAP


@pytest.mark.parametrize("rank", [0, 1])
def test_device_tasks_equal_the_task_table(rank: int):
    ev = events(rank)
    device = ev[(ev["lane_kind"] == schema.STREAM) & (ev["kind"] != schema.MARKER)]
    assert len(device) == raw_count(rank, "SELECT COUNT(*) FROM TASK") == 552
    assert (device["kind"] == schema.WAIT).sum() == typed(rank, "EVENT_WAIT") == 10
    assert (device["kind"] == schema.RECORD).sum() == typed(rank, "EVENT_RECORD") == 16
    assert (device["kind"] == schema.MEMCPY).sum() == typed(rank, "MEMCPY_ASYNC")
    streams = {s for (s,) in raw(rank, "SELECT DISTINCT streamId FROM TASK")}
    assert set(device["stream"]) == streams == {0, 2, 3, 4}
    named = dict(raw(rank, "SELECT c.globalTaskId, s.value FROM COMPUTE_TASK_INFO c "
                           "JOIN STRING_IDS s ON s.id = c.name"))
    assert set(named.values()) <= set(device["name"])  # kernels take COMPUTE_TASK_INFO's names
    starts = sorted(s for (s,) in raw(rank, "SELECT startNs FROM TASK"))
    assert sorted(device["start_ns"]) == starts  # ns, exactly as stored
    # every EVENT_WAIT shares its connection id with one AscendCL@aclrtStreamWaitEvent call
    waits = device[device["kind"] == schema.WAIT]
    calls = ev[ev["name"] == "AscendCL@aclrtStreamWaitEvent"]
    assert sorted(waits["correlation"]) == sorted(calls["correlation"])
    assert (calls["kind"] == schema.HOST).all() and calls["lane"].str.startswith("thread ").all()


@pytest.mark.parametrize("rank", [0, 1])
def test_allreduces_and_their_small_tasks(rank: int):
    ev = events(rank)
    ops = ev[ev["kind"] == schema.COLLECTIVE].sort_values("seq")
    names = [n for (n,) in raw(rank, "SELECT s.value FROM COMMUNICATION_OP o JOIN STRING_IDS s "
                                     "ON s.id = o.opName ORDER BY o.startNs")]
    assert list(ops["name"]) == names == [f"hcom_allReduce__210_{i}_1" for i in range(4)]
    assert list(ops["seq"]) == [0, 1, 2, 3] and set(ops["comm"]) == {"allreduce"}
    assert set(ops["group"]) == {GROUP} and set(ops["lane"]) == {f"hccl {GROUP}"}
    assert set(ops["stream"]) == {4} and set(ops["step"]) == {50}
    counts = [c for (c,) in raw(rank, "SELECT count FROM COMMUNICATION_OP ORDER BY startNs")]
    assert list(ops["bytes"]) == [4 * int(c) for c in counts]  # dataType 4 = FP32
    tasks = ev[(ev["kind"] == schema.COMM_TASK) & (ev["lane_kind"] == schema.COMM)]
    assert len(tasks) == raw_count(rank, "SELECT COUNT(*) FROM COMMUNICATION_TASK_INFO") == 296
    assert tasks["lane"].str.match(rf"hccl {GROUP} plane [0-7]$").all()
    assert tasks.groupby("seq").size().to_dict() == {0: 74, 1: 74, 2: 74, 3: 74}
    local = tasks[tasks["task_type"] == "Memcpy"]
    assert (local["notify_id"] == "").all()  # 9223372036854775807: not a notify task


def test_notify_ids_pair_across_ranks():
    """rank 0's Notify_Record toward rank 1 and rank 1's Notify_Wait on rank 0 name the same
    notify ids (and the other way round), as in the text export."""
    def ids(rank: int, task: str, dst: int) -> set[str]:
        ev = events(rank)
        return set(ev[(ev["task_type"] == task) & (ev["dst_rank"] == dst)]["notify_id"])

    def raw_ids(rank: int, task: str, dst: int) -> set[str]:
        return {str(n) for (n,) in raw(rank, "SELECT c.notifyId FROM COMMUNICATION_TASK_INFO c "
                                             "JOIN STRING_IDS s ON s.id = c.taskType WHERE "
                                             f"s.value = '{task}' AND c.dstRank = {dst}")}

    assert ids(0, "Notify_Record", 1) == ids(1, "Notify_Wait", 0) == raw_ids(0, "Notify_Record", 1)
    assert ids(1, "Notify_Record", 0) == ids(0, "Notify_Wait", 1) == raw_ids(1, "Notify_Record", 0)
    assert len(ids(0, "Notify_Record", 1)) >= 2


@pytest.mark.parametrize("rank", [0, 1])
def test_host_calls_and_the_step(rank: int):
    ev = events(rank)
    host = ev[ev["lane_kind"] == schema.THREAD]
    cann = raw_count(rank, "SELECT COUNT(*) FROM CANN_API")
    torch = raw_count(rank, "SELECT COUNT(*) FROM PYTORCH_API")
    assert len(host) == cann + torch
    assert (host["correlation"] >= 0).sum() == cann  # CANN calls carry their connection id
    (start, end), = raw(rank, "SELECT startNs, endNs FROM STEP_TIME WHERE id = 50")
    step = ev[ev["name"] == "ProfilerStep#50"]
    assert len(step) == 1 and step["kind"].iloc[0] == schema.MARKER
    assert (step["start_ns"].iloc[0], step["dur_ns"].iloc[0]) == (start, end - start)
    device = ev[ev["lane_kind"] == schema.STREAM]
    enable = device["name"] == "PROFILING_ENABLE"  # the profiler's own task, before the step
    assert set(device[~enable]["step"]) == {50} and set(device[enable]["step"]) == {-1}
    assert (device[enable]["start_ns"] < start).all()
    assert ev["name"].str.match(r"^(AscendCL|Node|Hccl)@").sum() == cann


def test_wait_time_is_kept_where_the_database_has_it():
    waits = {t["name"]: t["wait_ms"] for t in parse(0).meta["comm_times"]}
    assert waits["hcom_allReduce__210_0_1"] == pytest.approx(693_394 / 1e6)
    assert {t["wait_ms"] for t in parse(1).meta["comm_times"]} == {None}  # no waitNs column
    assert "db_schema=1.0.0" in parse(0).meta["version"]


@cache
def parse(rank: int):
    with open_bundle(DB_BUNDLE) as bundle:
        return parse_rank(bundle.profiles[rank], bundle.read)


# --- the analysis: waits matched, clocks aligned ----------------------------------------------


@pytest.fixture(scope="module")
def ddp8_db() -> Analysis:
    return analyze(loaded())


def test_each_long_event_wait_is_matched_to_its_allreduce(ddp8_db: Analysis):
    waits = long_waits(ddp8_db)
    assert sorted(np.round((waits["end"] - waits["start"]) / 1e6, 1)) == [
        2.0, 2.0, 2.1, 2.1, 8.4, 8.4, 66.7, 71.7]
    assert_released_by_allreduces(ddp8_db, "hcom_allReduce__210_")


def test_clock_offset_between_the_two_ranks(ddp8_db: Analysis):
    assert len(ddp8_db.matches.instances) == 4
    assert_clocks_aligned(ddp8_db)


# --- the same job as text and as a database ----------------------------------------------------


def test_the_database_and_the_text_export_give_the_same_events(tmp_path):
    """The simulator's hand-built job (tests/test_simulate_writers.py) written both ways: every
    device, HCCL op and small-task row is the same; host calls too, but for the framework layer,
    which msprof's schema has no table for (the steps come from STEP_TIME instead)."""
    timeline = hand_timeline()
    text, db = (tracegraph.load(write_bundle(timeline, tmp_path / layout, "ascend", layout),
                                use_cache=False).events for layout in ("text", "db"))
    columns = ["rank", "lane", "lane_kind", "stream", "name", "kind", "comm", "start_ns",
               "dur_ns", "group", "peer", "seq", "bytes", "correlation", "notify_id",
               "src_rank", "dst_rank", "step"]

    def rows(events: pd.DataFrame, host: bool) -> pd.DataFrame:
        mask = (events["lane_kind"] == schema.THREAD) == host
        if host:
            mask &= events["correlation"] >= 0  # CANN calls (framework rows carry no id)
        return events.loc[mask, columns].sort_values(columns, ignore_index=True)

    for host in (False, True):
        assert len(rows(db, host)) > 20
        pd.testing.assert_frame_equal(rows(db, host), rows(text, host), check_dtype=False,
                                      check_categorical=False)  # values, not dictionaries
    steps = [e[e["name"].str.startswith("ProfilerStep#")][["rank", "start_ns", "dur_ns"]]
             .sort_values("rank", ignore_index=True) for e in (db, text)]
    pd.testing.assert_frame_equal(*steps)


def test_simulate_writes_the_db_layout_from_the_command_line(tmp_path):
    out = tmp_path / "pp.tar.gz"
    run = subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "pp-compute-straggler",
                          "-o", str(out), "--layout", "db", "--steps", "1"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    with tarfile.open(out) as archive:
        names = archive.getnames()
    assert sum(n.endswith(".db") for n in names) == 4
    assert not any(n.endswith(("trace_view.json", "communication.json")) for n in names)
    bad = subprocess.run([sys.executable, "-m", "tracegraph", "simulate", "pp-compute-straggler",
                          "-o", str(out), "--layout", "db", "--format", "kineto"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--layout db" in bad.stderr


def test_mindspore_and_raw_msprof_database_layouts(tmp_path):
    """MindSpore names rank 0's database `ascend_mindspore_profiler.db` (its writer drops a rank
    id of 0: `profiler_path_manager.move_db_file`); raw msprof writes `PROF_*/msprof_{time}.db`
    with the rank in `device_*/info.json.*`."""
    with tarfile.open(write_bundle(hand_timeline(), tmp_path / "ms", "ascend", "db")) as archive:
        archive.extractall(tmp_path / "ms", filter="data")
    rank0 = next((tmp_path / "ms").rglob("ascend_mindspore_profiler_0.db"))
    rank0.rename(rank0.with_name("ascend_mindspore_profiler.db"))
    trace = tracegraph.load(tmp_path / "ms", use_cache=False)
    assert trace.rank_ids == [0, 1, 2, 3] and set(trace.ranks["framework"]) == {"mindspore"}
    prof = tmp_path / "raw" / "PROF_000001_20250109081536123_ABCDEFGHIJ"
    (prof / "device_1").mkdir(parents=True)
    (prof / "device_1" / "info.json.1").write_text('{"rank_id": 1, "devices": "1"}')
    shutil.copy(db_path(1), prof / "msprof_20250109081536.db")
    raw_trace = tracegraph.load(tmp_path / "raw", use_cache=False)
    assert raw_trace.rank_ids == [1]
    assert raw_trace.ranks[["format", "framework"]].values.tolist() == [["ascend_db", "msprof"]]
    assert len(raw_trace.events) == len(events(1))


# --- where the database lies: archives, read-only, never written beside -------------------------


@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
def test_a_database_inside_an_archive_reads_from_a_private_copy(tmp_path, monkeypatch, suffix):
    archive = tmp_path / f"job{suffix}"
    members = sorted(p for p in DB_BUNDLE.rglob("*") if p.is_file())
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for path in members:
                out.write(path, path.relative_to(DB_BUNDLE.parent).as_posix())
    else:
        with tarfile.open(archive, "w:gz") as out:
            out.add(DB_BUNDLE, DB_BUNDLE.name)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    trace = tracegraph.load(archive, use_cache=False, jobs=1)
    assert list(scratch.iterdir()) == []  # the private copies are gone
    assert trace.events.groupby("rank").size().to_dict() == loaded().events.groupby(
        "rank").size().to_dict()


def test_nothing_is_written_beside_a_database(tmp_path):
    folder = tmp_path / "rank1_ascend_pt"
    shutil.copytree(DB_BUNDLE / "rank1_ascend_pt", folder)
    db = folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db"
    with sqlite3.connect(db) as conn:  # a WAL database: its readers make -shm files
        conn.execute("PRAGMA journal_mode=WAL")
    (db.parent / (db.name + "-wal")).unlink(missing_ok=True)
    (db.parent / (db.name + "-shm")).unlink(missing_ok=True)
    before = sorted(p.name for p in db.parent.iterdir())
    trace = tracegraph.load(folder, use_cache=False, jobs=1)
    assert sorted(p.name for p in db.parent.iterdir()) == before
    assert len(trace.events) == len(events(1))


# --- bad databases: one line naming the file and what is missing -------------------------------


def _copy(tmp_path: Path, rank: int = 1) -> Path:
    db = tmp_path / f"ascend_pytorch_profiler_{rank}.db"
    shutil.copy(db_path(rank), db)
    return db


def _drop(db: Path, sql: str) -> Path:
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    return db


def _write(db: Path, data: bytes) -> Path:
    db.write_bytes(data)
    return db


BAD = {
    "empty": (lambda d: _write(d, b""), "empty file"),
    "text": (lambda d: _write(d, b"rank,step\n0,1\n"), "not an SQLite database"),
    "no TASK": (lambda d: _drop(d, "DROP TABLE TASK"), "no table TASK"),
    "no column": (lambda d: _drop(d, "ALTER TABLE COMMUNICATION_OP DROP COLUMN groupName"),
                  "table COMMUNICATION_OP has no column groupName (schema 1.0.0)"),
    "damaged": (lambda d: _write(d, d.read_bytes()[:4096] + b"\xff" * 8192), "malformed"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_database_is_one_line_exit_2(tmp_path, case):
    spoil, problem = BAD[case]
    db = spoil(_copy(tmp_path))
    run = subprocess.run([sys.executable, "-m", "tracegraph", "analyze", str(db), "--no-cache"],
                         capture_output=True, text=True, timeout=120)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2, run.stdout
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert db.name in lines[0] and problem in lines[0]


def test_a_newer_schema_is_read_with_a_warning_and_mstx_ranges_are_markers(tmp_path):
    """msprof's MSTX_EVENTS (startNs, endNs, eventType, rangeId, category, message, globalTid,
    endGlobalTid, domainId, connectionId: msprof `msprof_db.cpp`) is absent from the real files:
    one range is added here, with a schema version this reader does not know."""
    db = _copy(tmp_path)
    (start, end), = raw(1, "SELECT startNs, endNs FROM STEP_TIME")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE META_DATA SET value = '2.1.0' WHERE name = 'SCHEMA_VERSION'")
        conn.execute("CREATE TABLE MSTX_EVENTS (startNs INTEGER, endNs INTEGER, eventType "
                     "INTEGER, rangeId INTEGER, category INTEGER, message INTEGER, globalTid "
                     "INTEGER, endGlobalTid INTEGER, domainId INTEGER, connectionId INTEGER)")
        conn.execute("INSERT INTO STRING_IDS VALUES (99999999, 'forward mb=0')")
        conn.execute("INSERT INTO MSTX_EVENTS VALUES (?, ?, 2, 1, 0, 99999999, ?, ?, 0, -1)",
                     (start + 1000, end - 1000, (7 << 32) | 4242, (7 << 32) | 4242))
    trace = tracegraph.load(db, use_cache=False, jobs=1)
    assert any("schema 2.1.0 is newer than the 1.x" in w for w in trace.warnings)
    mark = trace.events[trace.events["name"] == "forward mb=0"]
    assert mark[["kind", "lane", "start_ns"]].values.tolist() == [
        [schema.MARKER, "thread 4242", start + 1000]]
    assert len(trace.events) == len(events(1)) + 1


def test_group_membership_from_meta_data(tmp_path):
    """Newer torch_npu exports write `parallel_group_info` into META_DATA (ascend.md §3.3) where
    the real 1.0.0 files have no profiler_metadata.json: the group's members come from it."""
    db = _copy(tmp_path)
    info = {COMM_NAME: {"group_name": "dp", "group_rank": 1, "global_ranks": list(range(8))}}
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO META_DATA VALUES ('parallel_group_info', ?)",
                     (json.dumps(info),))
    groups = tracegraph.load(db, use_cache=False, jobs=1).groups.set_index("group")
    assert groups.at[GROUP, "desc"] == "dp" and list(groups.at[GROUP, "ranks"]) == list(range(8))


def test_a_locked_database_is_named(tmp_path):
    db = _copy(tmp_path)
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")  # the profiler still writing it
        with pytest.raises(TraceError, match=rf"{db.name}: .*locked.*still writing"):
            tracegraph.load(db, use_cache=False, jobs=1)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
