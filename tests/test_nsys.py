"""Nsight Systems SQLite exports: the real single-GPU exports, exports built here whose answers
hold by construction, bad inputs.

Known answers, read by hand with sqlite3 from ../shared/real_traces/nsys (nsys 2022.1.1.61,
schema 2.9.1, one process `ParallelKernelsTest.exe`, a GTX 1060):
- extrap_concurrent_s4.sqlite: 12 kernels (streams 14, 15, 16, 17, 18, 25, 26, 27: one each; 24
  and 28: two each), 30 memcpys (15 HtoD Pageable -> Pinned, 15 DtoH Pinned -> Pageable), 17
  memsets, 184 runtime calls, 76 NVTX push/pop ranges (`main->test_max_par->phase->kernel0` …)
  of domain `de.tu-darmstadt.parallel.extra_prof`, 16 SYNCHRONIZATION rows: 10 whose runtime call
  (same correlation id) is cudaStreamSynchronize (streams 14-23), 5 cudaEventSynchronize (eventId
  1-5, streamId 0xFFFFFFFF; their CUDA_EVENT records: event 1 on stream 24 by call 248, 2 on 25
  by 237, 3 on 26 by 251, 4 on 27 by 242, 5 on 28 by 254), 1 cuCtxSynchronize. No call is
  cudaStreamWaitEvent: the export holds no stream wait (its syncType 2 rows are the event
  synchronizations). TARGET_INFO_SESSION_START_TIME.utcEpochNs 1653929684707566100.
  EXPORT_META_DATA's EXPORT_USER is `Alexander Gei` + byte 0xE1 (Latin-1 á), not UTF-8.
- extrap_con_kernel.sqlite: 9 kernels (stream 14: 3, 15: 2, 16: 1, 17: 1, 18: 2; two of them,
  correlation ids 1124 and 1135, duplicate others' times and have no runtime call), 5 event
  synchronizations (events 1-5 recorded on streams 14-18 by calls 137, 126, 140, 131, 143), 1
  context synchronization, no NVTX_EVENTS table.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from parsers import nsys, parse_rank, sqlite_file
from parsers.base import TraceError
from parsers.bundle import open_bundle
from tests.conftest import REAL
from tracegraph import schema
from tracegraph.simulate import simulate
from tracegraph.simulate.bundle_writer import write_bundle

S4 = REAL / "nsys" / "extrap_concurrent_s4.sqlite"
CON = REAL / "nsys" / "extrap_con_kernel.sqlite"


def events(path: Path, **load) -> pd.DataFrame:
    return tracegraph.load(path, use_cache=False, jobs=1, **load).events


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracegraph", *args, "--no-cache"],
                          capture_output=True, text=True)


# --- the real exports ----------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "per_stream"), [
    (S4, {14: 1, 15: 1, 16: 1, 17: 1, 18: 1, 24: 2, 25: 1, 26: 1, 27: 1, 28: 2}),
    (CON, {14: 3, 15: 2, 16: 1, 17: 1, 18: 2})])
def test_every_kernel_is_on_its_stream(path: Path, per_stream: dict[int, int]):
    kernels = events(path).query("task_type == 'kernel'")
    assert kernels.groupby("stream").size().to_dict() == per_stream
    assert (kernels["lane"] == "stream " + kernels["stream"].astype(str)).all()
    assert (kernels["kind"] == schema.COMPUTE).all()


def test_copies_memsets_calls_and_ranges_of_the_real_export():
    found = events(S4)
    copies = found.query("task_type == 'gpu_memcpy'")["name"].astype(str).value_counts()
    copies = copies.to_dict()
    assert copies == {"Memcpy HtoD (Pageable -> Pinned)": 15,
                      "Memcpy DtoH (Pinned -> Pageable)": 15}
    assert (found["task_type"] == "gpu_memset").sum() == 17
    calls = found.query("task_type == 'cuda_runtime'")
    assert len(calls) == 184 and (calls["lane_kind"] == schema.THREAD).all()
    assert {"cudaLaunchKernel", "cudaEventSynchronize"} <= set(calls["name"])  # no _v7000
    ranges = found.query("task_type == 'nvtx'")
    assert len(ranges) == 76 and "main->test_max_par->phase->kernel0" in set(ranges["name"])
    kernel = found.query("task_type == 'kernel' and correlation == 120")
    assert kernel["annotation"].tolist() == ["main->test_max_par->phase->kernel0"]
    first = found.query("task_type == 'kernel'")["start_ns"].min()
    assert first == 1653929684707566100 + 574055205  # the session's wall-clock start + ns


@pytest.mark.parametrize(("path", "records"), [
    (S4, {255: (248, 24), 256: (237, 25), 257: (251, 26), 258: (242, 27), 259: (254, 28)}),
    (CON, {144: (137, 14), 145: (126, 15), 146: (140, 16), 147: (131, 17), 148: (143, 18)})])
def test_synchronizations_name_their_kind_and_event_record(path: Path, records: dict):
    waits = events(path).query("kind == 'wait'")
    event_syncs = waits[waits["name"] == "Event Sync"]
    assert {c: (e, s) for c, e, s in zip(event_syncs["correlation"], event_syncs["event_id"],
                                         event_syncs["wait_on_stream"], strict=True)} == records
    assert (event_syncs["lane"] == "device sync").all()
    assert (waits["name"] == "Context Sync").sum() == 1
    assert (waits["name"] == "Stream Wait Event").sum() == 0  # none is a cudaStreamWaitEvent
    streams = waits[waits["name"] == "Stream Sync"]
    assert sorted(streams["stream"]) == (list(range(14, 24)) if path == S4 else [])
    ranks = tracegraph.load(path, use_cache=False, jobs=1).ranks
    assert "event_join=eventId+call order" in ranks["version"].iloc[0]


def test_latin1_metadata_is_read_not_refused():
    plain = sqlite3.connect(f"{S4.as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError, match="decode"):  # what a plain read does
        plain.execute("SELECT value FROM EXPORT_META_DATA").fetchall()
    plain.close()
    with open_bundle(S4) as bundle, sqlite_file.opened(S4.name, bundle.read) as db:
        assert db.values("EXPORT_META_DATA")["EXPORT_USER"] == "Alexander Gei\u00e1"


def test_nothing_is_written_beside_an_export(tmp_path: Path):
    shutil.copy(S4, tmp_path / S4.name)
    before = sorted(p.name for p in tmp_path.iterdir())
    events(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_rank_from_the_file_name_else_rank_0_said(tmp_path: Path):
    shutil.copy(CON, tmp_path / "rank3.sqlite")
    assert tracegraph.load(tmp_path / "rank3.sqlite", use_cache=False).rank_ids == [3]
    trace = tracegraph.load(CON, use_cache=False)
    assert trace.rank_ids == [0] and any("taken as rank 0" in w for w in trace.warnings)
    mapped = tracegraph.load(CON, use_cache=False, rank_map={CON.name: 5})
    assert mapped.rank_ids == [5]


# --- exports built here --------------------------------------------------------------------------
def tiny_export(path: Path, sync_ids: bool, env: dict[str, str] | None = None) -> Path:
    """Two records of event 1 on stream 7 (calls 10 and 20, eventSyncIds 100 and 200), a wait on
    stream 8 by call 25 whose eventSyncId names the first record, two kernels."""
    sync = ", eventSyncId INTEGER" if sync_ids else ""
    with sqlite3.connect(path) as conn:
        conn.executescript(f"""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
                streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
                correlationId INTEGER, nameId INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_CUDA_EVENT (streamId INTEGER, correlationId INTEGER,
                globalPid INTEGER, eventId INTEGER{sync});
            CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER, end INTEGER,
                deviceId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
                syncType INTEGER, eventId INTEGER{sync});
            CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT, name TEXT,
                nameEnum INTEGER, value TEXT);
            INSERT INTO StringIds VALUES (0, 'gemm'), (1, 'cudaLaunchKernel_v7000'),
                (2, 'cudaEventRecord_v3020'), (3, 'cudaStreamWaitEvent_v3020');
        """)
        pid, tid = 1 << 56 | 42 << 24, 1 << 56 | 42 << 24 | 42
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)", [
            (1000, 1100, tid, 5, 1), (1200, 1300, tid, 10, 2), (1400, 1500, tid, 20, 2),
            (1600, 1700, tid, 25, 3), (1800, 1900, tid, 30, 1)])
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?, 0)", [
            (2000, 9000, 7, 5, pid), (9500, 9900, 8, 30, pid)])
        conn.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_CUDA_EVENT VALUES "
                         f"(7, ?, ?, 1{', ?' if sync_ids else ''})",
                         [(10, pid, 100)[:2 + sync_ids], (20, pid, 200)[:2 + sync_ids]])
        conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES "
                     f"(1610, 1650, 0, 8, 25, ?, 2, 1{', 100' if sync_ids else ''})", (pid,))
        conn.executemany("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (1, 'Local', ?, 0, ?)",
                         list((env or {}).items()))
    return path


@pytest.mark.parametrize(("sync_ids", "record", "join"), [
    (True, 10, "eventSyncId"), (False, 20, "eventId+call order")])
def test_a_stream_wait_joins_its_record(tmp_path: Path, sync_ids: bool, record: int, join: str):
    trace = tracegraph.load(tiny_export(tmp_path / "job.sqlite", sync_ids), use_cache=False)
    (wait,) = trace.events.query("kind == 'wait'").itertuples()
    assert (wait.name, wait.lane, wait.event_id, wait.wait_on_stream) == (
        "Stream Wait Event", "stream 8", record, 7)
    assert f"event_join={join}" in trace.ranks["version"].iloc[0]


def test_rank_from_the_environment_of_a_one_process_export(tmp_path: Path):
    path = tiny_export(tmp_path / "job.sqlite", False, {"RANK": "6", "LOCAL_RANK": "2"})
    assert tracegraph.load(path, use_cache=False).rank_ids == [6]


@pytest.fixture(scope="module")
def node_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ep-a2a-overlap (ranks 0-7, one node) written as nsys: one export of 8 processes."""
    out = tmp_path_factory.mktemp("nsys") / "ep.tar.gz"
    write_bundle(simulate("ep-a2a-overlap", seed=0, steps=1), out, "nsys")
    return out


def test_every_process_of_a_node_export_is_a_rank(node_export: Path):
    with open_bundle(node_export) as bundle:
        profiles = bundle.profiles
        parsed = parse_rank(profiles[3], bundle.read)
    assert [p.rank for p in profiles] == list(range(8))  # the world communicator's places
    assert len({p.files["trace"] for p in profiles}) == 1
    assert all(p.root.startswith("ep/node0.sqlite#pid") for p in profiles)
    assert parsed.rank == 3 and parsed.meta["world_size"] == 8
    frame = parsed.events.to_pandas()
    comm = frame[frame["kind"].isin([schema.COLLECTIVE, schema.P2P])]
    assert set(comm["comm"]) == {"alltoall", "batch_send_recv"}
    assert (comm["group"] != "").all()  # every kernel's communicator known


def test_p2p_peers_are_placed_across_ranks(node_export: Path):
    found = events(node_export)
    p2p = found[found["kind"] == schema.P2P]
    assert len(p2p) and (p2p["peer"] >= 0).all()
    pairs = set(zip(p2p["rank"], p2p["peer"], strict=True))
    assert all((peer, rank) in pairs for rank, peer in pairs)  # each half has its partner


# --- bad inputs ----------------------------------------------------------------------------------
def test_a_report_gets_the_export_command(tmp_path: Path):
    report = tmp_path / "profile3.nsys-rep"
    report.write_bytes(b"\x00NSYS binary report")
    with pytest.raises(TraceError, match=r"nsys export --type sqlite --output profile3\.sqlite "
                                         r"profile3\.nsys-rep"):
        tracegraph.load(report, use_cache=False)
    run = cli("analyze", str(report))
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    shutil.copy(CON, tmp_path / "profile3.sqlite")  # beside its export, the report is left
    with open_bundle(tmp_path) as bundle:
        assert [p.root for p in bundle.profiles] == ["profile3.sqlite"]
        assert any("profile3.nsys-rep: read from its SQLite export" in w for w in bundle.warnings)


@pytest.mark.parametrize(("content", "message"), [
    (lambda: S4.read_bytes()[:60_000], "malformed"),
    (lambda: b"not a database at all", "not an SQLite database"),
    (lambda: b"", "empty file"),
])
def test_a_bad_export_is_one_line_naming_it(tmp_path: Path, content, message: str):
    bad = tmp_path / "rank1.sqlite"
    bad.write_bytes(content())
    with pytest.raises(TraceError, match=rf"rank1\.sqlite: .*{message}"):
        tracegraph.load(tmp_path, use_cache=False)
    run = cli("analyze", str(bad))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "rank1.sqlite" in run.stderr


def test_an_export_without_cuda_trace_is_refused(tmp_path: Path):
    path = tmp_path / "cpu.nsys-sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    with pytest.raises(TraceError, match="not an Nsight Systems export with CUDA trace"):
        tracegraph.load(path, use_cache=False)


def test_someone_elses_sqlite_database_is_ignored(tmp_path: Path):
    with sqlite3.connect(tmp_path / "cache.sqlite") as conn:
        conn.execute("CREATE TABLE items (key TEXT, value BLOB)")
    shutil.copy(CON, tmp_path / "rank2.sqlite")
    with open_bundle(tmp_path) as bundle:
        assert [p.root for p in bundle.profiles] == ["rank2.sqlite"]
        assert any("ignored 1 database file(s)" in w and "cache.sqlite" in w
                   for w in bundle.warnings)


def test_sniff_tells_exports_from_other_databases():
    assert nsys.sniff(S4.name, S4.read_bytes()[:65536]).profile
    assert not nsys.sniff("x.sqlite", sqlite_file.SQLITE_MAGIC + b"CREATE TABLE items").profile
    assert nsys.sniff("x.nsys-rep", b"anything").profile
