"""Damaged and hostile input, one regression test per failure class of issue 16: no traceback, no
hang, no silent wrong answer. Inputs are real profiles (../shared/real_traces, read where they
lie) damaged here, under tmp_path; the answers hold by construction (N values damaged -> N
counted) or were read from the real files by hand (rank0.json of gloo_pp2_dp2 keeps 734
events: tests/test_kineto.py)."""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import tracegraph
from parsers import kineto
from parsers.archive import Limits
from parsers.base import TraceError
from parsers.bundle import open_bundle
from parsers.text import printable
from parsers.values import (
    LABEL_LIMIT,
    NAME_LIMIT,
    UNREADABLE,
    decimal_micros_to_ns,
    ints,
    micros_to_ns,
)
from tests import fuzz
from tests.conftest import REAL
from tracegraph import schema
from tracegraph.cli.app import app
from tracegraph.loading import cache as parse_cache

GLOO = REAL / "kineto" / "gloo_pp2_dp2"
DDP8 = REAL / "ascend" / "torch_npu_ddp8_level1"
RANK0_EVENTS = 734  # rank0.json's kept events (tests/test_kineto.py)
MIB = 1 << 20


@cache
def _gloo_text(rank: int) -> str:
    return (GLOO / f"rank{rank}.json").read_text()


def gloo(rank: int = 0) -> dict:
    """rank{rank}.json of the real gloo job, as a fresh document."""
    return json.loads(_gloo_text(rank))


def kept(doc: dict) -> list[dict]:
    """The complete events the Kineto parser keeps (its categories), in file order."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in kineto._CATS]


def write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def cli(*args: object) -> tuple[int, str, str]:
    """Run the command line in this process: exit code, stdout, stderr (never an exception)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def one_error(stderr: str) -> str:
    """The one line of an exit-2 error (warnings may come before it)."""
    lines = [line for line in stderr.splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def damage_line(trace: tracegraph.Trace) -> str:
    lines = [w for w in trace.warnings if "damaged values" in w]
    assert len(lines) == 1, trace.warnings
    return lines[0]


# --- raw values ----------------------------------------------------------------------------------
def test_values_mark_what_they_cannot_read() -> None:
    raw = [7, "0x1f", "007", "12.0", 2**63, -(2**63) - 1, 1e308, "1" * 30, "nan", "abc", None,
           True, [1]]
    assert list(ints(raw)) == [7, 31, 7, 12, *[UNREADABLE] * 5, UNREADABLE, -1, 1, UNREADABLE]
    micros = [1.5, "2.25", None, "nan", float("inf"), 1e308, "abc", -3.0]
    assert list(micros_to_ns(micros)) == [1500, 2250, *[UNREADABLE] * 5, -3000]
    exact = ["1736412474757059.740", "1" * 30, "9999999999999999", "-5.5", "abc", None]
    assert list(decimal_micros_to_ns(exact)) == [1736412474757059740, UNREADABLE, UNREADABLE,
                                                 -5500, UNREADABLE, UNREADABLE]


def test_int32_columns_mark_what_they_cannot_hold() -> None:
    table = schema.events_table({"peer": np.array([3, 2**40, -1]), "step": [2**31, 5, -1]}, 3)
    assert table["peer"].to_pylist() == [3, -(2**31), -1]
    assert table["step"].to_pylist() == [-(2**31), 5, -1]


def test_printable_keeps_one_line_and_valid_utf8() -> None:
    name = os.fsdecode(b"rank\xff\n[/x]\x1b[2J.json")
    shown = printable(name)
    assert shown == "rank\\xff\\n[/x]\\x1b[2J.json"
    shown.encode("utf-8")


# --- out-of-range numbers ------------------------------------------------------------------------
def test_kineto_values_out_of_range_are_dropped_or_unknown_and_counted(tmp_path: Path) -> None:
    doc = gloo()
    events = kept(doc)
    events[10]["ts"] = 1e308
    events[11]["ts"] = "nan"
    events[12]["dur"] = 2**64
    events[13]["dur"] = "abc"
    events[14]["dur"] = -5.0
    for e in events[20:25]:
        e.setdefault("args", {})["correlation"] = 2**64
    host = [e for e in events[30:] if e["cat"] == "cpu_op"][0]
    host["tid"] = "1" * 30
    trace = tracegraph.load(write(tmp_path / "rank0.json", doc), use_cache=False)
    assert len(trace.events) == RANK0_EVENTS - 4
    assert damage_line(trace) == (
        "rank 0: rank0.json: damaged values: dropped 4 events (2 with an unreadable start, "
        "2 with an unreadable duration); 1 negative durations set to 0; 5 correlation values "
        "unreadable, left unknown; 1 host thread ids unreadable")
    assert (trace.events["dur_ns"] >= 0).all()
    assert trace.events["start_ns"].between(0, 1 << 62).all()


def test_a_rank_id_out_of_range_is_no_rank(tmp_path: Path) -> None:
    doc = gloo()
    doc["distributedInfo"]["rank"] = 2**40
    trace = tracegraph.load(write(tmp_path / "rank0.json", doc), use_cache=False)
    assert trace.rank_ids == [0]  # from the file name
    assert "distributedInfo.rank 1099511627776 (no rank id)" in damage_line(trace)
    with pytest.raises(TraceError, match=r"x\.json: no rank id"):
        tracegraph.load(write(tmp_path / "x" / "x.json", doc), use_cache=False)


@pytest.mark.parametrize("base", [2**63, -5, "abc"])
def test_a_clock_base_that_is_no_time_is_an_error(tmp_path: Path, base: object) -> None:
    doc = gloo()
    doc["baseTimeNanoseconds"] = base
    code, _, err = cli("analyze", write(tmp_path / "rank0.json", doc), "--no-cache")
    assert code == 2
    assert "rank0.json: baseTimeNanoseconds" in one_error(err)


def test_world_size_and_group_members_out_of_range(tmp_path: Path) -> None:
    doc = gloo()
    doc["distributedInfo"]["world_size"] = 2**40
    doc["distributedInfo"]["pg_config"][0]["ranks"][1] = 2**40
    trace = tracegraph.load(write(tmp_path / "rank0.json", doc), use_cache=False)
    line = damage_line(trace)
    assert "world size 1099511627776 out of range, ignored" in line
    assert "1 member ranks of group 0 unreadable" in line
    assert set(trace.ranks["world_size"]) == {-1}
    assert all(0 <= r < 2**31 for ranks in trace.groups["ranks"] for r in ranks)


def test_a_step_number_beyond_int32_is_no_step(tmp_path: Path) -> None:
    doc = gloo()
    for event in kept(doc):
        if event["name"].startswith("ProfilerStep#"):
            event["name"] = "ProfilerStep#" + "9" * 30
    path = write(tmp_path / "rank0.json", doc)
    trace = tracegraph.load(path, use_cache=False)
    assert "step values unreadable, left unknown" in damage_line(trace)
    assert set(trace.events["step"]) == {-1}
    code, out, _ = cli("analyze", path, "--json", "--no-cache")
    assert code == 0 and json.loads(out)["steps"] == []


def test_ascend_values_out_of_range_are_dropped_and_counted(tmp_path: Path) -> None:
    bundle = tmp_path / "ddp8"
    shutil.copytree(DDP8 / "rank0_ascend_pt", bundle / "rank0_ascend_pt")
    view = bundle / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(view.read_text())
    complete = [e for e in events if e.get("ph") == "X"]
    clean = tracegraph.load(DDP8 / "rank0_ascend_pt", use_cache=False)
    complete[100]["ts"] = "abc"
    complete[101]["ts"] = "1" * 30
    complete[102]["dur"] = 1e308
    complete[103]["dur"] = None
    write(view, events)
    trace = tracegraph.load(bundle, use_cache=False)
    assert len(trace.events) == len(clean.events) - 4
    assert ("dropped 4 events (2 with an unreadable start, 2 with an unreadable duration)"
            in damage_line(trace))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308"])
def test_threshold_must_be_a_finite_duration(value: str) -> None:
    code, _, err = cli("analyze", GLOO, "--threshold-ms", value, "--no-cache")
    assert code == 2 and "--threshold-ms" in err and "Traceback" not in err


# --- degenerate traces ---------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["no complete events", "only metadata", "no ph"])
def test_nothing_analysable_is_an_error_naming_the_file(tmp_path: Path, damage: str) -> None:
    doc = gloo()
    if damage == "no complete events":
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X"]
    elif damage == "only metadata":
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    else:
        for event in doc["traceEvents"]:
            event.pop("ph", None)
    path = write(tmp_path / "rank0.json", doc)
    for command in (["analyze", path], ["export", path, "--parquet", tmp_path / "out"]):
        code, _, err = cli(*command, "--no-cache")
        assert code == 2
        assert one_error(err).endswith(
            "rank0.json: no event to analyse in rank0.json: rank 0: rank0.json: no complete "
            'event ("ph": "X") of a profiler category')
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("damage", "why"), [("durations removed", "an unreadable duration"),
                                             ("times negated", "a negative time")])
def test_every_event_damaged_is_an_error_that_says_why(tmp_path: Path, damage: str,
                                                       why: str) -> None:
    doc = gloo()
    for event in doc["traceEvents"]:
        if damage == "durations removed":
            event.pop("dur", None)
        elif isinstance(event.get("ts"), float | int):
            event["ts"] = -event["ts"]
    code, _, err = cli("analyze", write(tmp_path / "rank0.json", doc), "--no-cache")
    assert code == 2
    assert f"dropped {RANK0_EVENTS} events ({RANK0_EVENTS} with {why})" in one_error(err)


def test_names_removed_are_analysed_with_a_warning(tmp_path: Path) -> None:
    doc = gloo()
    for event in doc["traceEvents"]:
        event.pop("name", None)
    trace = tracegraph.load(write(tmp_path / "rank0.json", doc), use_cache=False)
    assert len(trace.events) == RANK0_EVENTS
    assert f"{RANK0_EVENTS} events without a name" in damage_line(trace)


# --- deep nesting --------------------------------------------------------------------------------
DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize("where", ['"args": {', '"distributedInfo": {'])
def test_deep_nesting_is_an_error_not_a_recursion(tmp_path: Path, where: str) -> None:
    text = _gloo_text(0).replace(where, f'{where}"deep": {DEEP}, ', 1)
    path = tmp_path / "rank0.json"
    path.write_text(text)
    assert kineto.sniff_rank(text.encode()[:65536]) in (0, None)
    code, _, err = cli("analyze", path, "--no-cache")
    assert code == 2
    assert one_error(err) == "error: rank0.json: JSON nested too deeply to read"


def test_deep_nesting_in_an_ascend_side_file(tmp_path: Path) -> None:
    shutil.copytree(DDP8 / "rank0_ascend_pt", tmp_path / "rank0_ascend_pt")
    (tmp_path / "rank0_ascend_pt" / "profiler_info_0.json").write_text(f'{{"deep": {DEEP}}}')
    code, _, err = cli("analyze", tmp_path, "--no-cache")
    assert code == 2
    assert one_error(err) == ("error: rank0_ascend_pt/profiler_info_0.json: JSON nested too "
                              "deeply to read")


# --- CSV -----------------------------------------------------------------------------------------
def _ddp8_with_step_trace(tmp_path: Path, data: bytes) -> Path:
    shutil.copytree(DDP8 / "rank0_ascend_pt", tmp_path / "rank0_ascend_pt")
    (tmp_path / "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/step_trace_time.csv").write_bytes(data)
    return tmp_path


def test_a_csv_field_over_the_limit_is_a_warning(tmp_path: Path) -> None:
    data = b'Device_id,Step\n3,"' + b"x" * 200_000 + b'"\n'
    trace = tracegraph.load(_ddp8_with_step_trace(tmp_path, data), use_cache=False)
    assert any("step_trace_time.csv: unreadable CSV (field larger than field limit" in w
               for w in trace.warnings)
    assert list(trace.ranks["device"]) == ["npu:0"]  # the device from the trace's pid instead


def test_bare_carriage_returns_end_csv_lines(tmp_path: Path) -> None:
    trace = tracegraph.load(_ddp8_with_step_trace(tmp_path, b"Device_id,Step\r5,1\r"),
                            use_cache=False)
    assert list(trace.ranks["device"]) == ["npu:5"]


# --- markup in data ------------------------------------------------------------------------------
def test_markup_in_names_paths_and_warnings_prints_as_it_is(tmp_path: Path) -> None:
    doc = gloo(1)
    for event in kept(doc):
        if event["name"] == "straggler_sleep":
            event["name"] = "[/x] straggler [bold]sleep"
    bundle = tmp_path / "a[" / "x]"  # the path holds "[/x]"
    for rank in (0, 2, 3):
        write(bundle / f"rank{rank}.json", gloo(rank))
    write(bundle / "rank1.json", doc)
    (bundle / "[").mkdir()
    (bundle / "[" / "x].json").write_text("{")  # the member "[/x].json"
    code, out, err = cli("analyze", bundle, "--no-cache", "--top", "5")
    assert code == 0, err
    assert "[/x] straggler [bold]sleep" in out
    assert "warning: ignored 1 JSON file(s) that are not profiles: [/x].json" in err


def test_the_dask_extra_stays_in_the_install_hint(capsys: pytest.CaptureFixture) -> None:
    from tracegraph.cli.common import friendly_errors

    @friendly_errors
    def fails() -> None:
        raise TraceError("--dask needs the dask extra: pip install 'tracegraph[dask]'")

    with pytest.raises(Exception) as exit_info:
        fails()
    assert getattr(exit_info.value, "exit_code", None) == 2
    assert capsys.readouterr().err == (
        "error: --dask needs the dask extra: pip install 'tracegraph[dask]'\n")


# --- non-UTF-8 and odd names ---------------------------------------------------------------------
def test_a_file_name_that_is_not_utf8(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(GLOO / "rank0.json", bundle / os.fsdecode(b"rank0\xff.json"))
    code, out, err = cli("analyze", bundle, "--json", "--cache-dir", tmp_path / "cache")
    assert code == 0, err
    assert [r["path"] for r in json.loads(out)["ranks"]] == ["rank0\\xff.json"]
    assert len(list((tmp_path / "cache").glob("*/meta.json"))) == 1
    code, _, err = cli("export", bundle, "--parquet", tmp_path / "tables", "--no-cache")
    assert code == 0, err
    assert pq.read_table(tmp_path / "tables" / "ranks.parquet")["path"].to_pylist() == [
        "rank0\\xff.json"]


def test_a_newline_in_a_name_keeps_the_error_on_one_line(tmp_path: Path) -> None:
    bundle = tmp_path / "a\nb"
    bundle.mkdir()
    code, _, err = cli("analyze", bundle, "--no-cache")
    assert code == 2
    assert one_error(err).startswith(
        f"error: {tmp_path}/a\\nb: no Ascend, Kineto or Nsight Systems profile")
    (bundle / "rank0\n.json").write_text('{"traceEvents": [')
    code, _, err = cli("analyze", bundle, "--no-cache")
    assert code == 2
    assert one_error(err) == ("error: rank0\\n.json: truncated JSON, no complete event in "
                              "traceEvents")


def test_a_zip_name_flagged_utf8_that_is_not(tmp_path: Path) -> None:
    path = tmp_path / "bad.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("rankX.json", _gloo_text(0))
    raw = bytearray(path.read_bytes())
    for signature, flags, name in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        at = raw.find(signature)
        raw[at + flags + 1] |= 0x08  # bit 11: the name is UTF-8
        raw[at + name + 4] = 0xFF  # ... and it is not
    path.write_bytes(bytes(raw))
    code, _, err = cli("analyze", path, "--no-cache")
    assert code == 2
    assert "bad.zip: not a readable zip archive" in one_error(err)


# --- archives and folders ------------------------------------------------------------------------
def _zip_with_method(path: Path, method: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("rank0.json", _gloo_text(0))
        archive.writestr("rank1.json", _gloo_text(1))
    raw = bytearray(path.read_bytes())
    at = raw.find(b"PK\x03\x04")  # the first member only, in both headers
    raw[at + 8:at + 10] = method.to_bytes(2, "little")
    at = raw.find(b"PK\x01\x02")
    raw[at + 10:at + 12] = method.to_bytes(2, "little")
    path.write_bytes(bytes(raw))
    return path


def test_a_zip_member_in_an_unsupported_method_is_skipped(tmp_path: Path) -> None:
    trace = tracegraph.load(_zip_with_method(tmp_path / "m.zip", 99), use_cache=False)
    assert trace.rank_ids == [1]
    assert any(w.endswith("member rank0.json: skipped: compression method 99 is not supported")
               for w in trace.warnings)


def test_a_garbage_zip_directory_is_one_error(tmp_path: Path) -> None:
    path = _zip_with_method(tmp_path / "g.zip", 0)
    raw = bytearray(path.read_bytes())
    start, end = raw.find(b"PK\x01\x02"), len(raw) - 22
    raw[start + 4:end] = bytes(range(256)) * ((end - start - 4) // 256) + bytes(
        (end - start - 4) % 256)
    path.write_bytes(bytes(raw))
    code, _, err = cli("analyze", path, "--no-cache")
    assert code == 2 and "g.zip" in one_error(err)


def test_a_symlink_loop_is_skipped_with_a_warning(tmp_path: Path) -> None:
    shutil.copy(GLOO / "rank0.json", tmp_path / "rank0.json")
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    with open_bundle(tmp_path) as bundle:
        assert [p.root for p in bundle.profiles] == ["rank0.json"]
        assert sorted(bundle.warnings) == [f"{tmp_path}: skipped l1: symlink loop",
                                           f"{tmp_path}: skipped l2: symlink loop"]


def test_members_nested_too_deep_are_refused(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d"] * 70)
    deep.mkdir(parents=True)
    shutil.copy(GLOO / "rank0.json", deep / "rank0.json")
    with pytest.raises(TraceError, match="nested in more than 64 folders"):
        open_bundle(tmp_path)
    archive = tmp_path / "deep.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("d/" * 70 + "rank0.json")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(TraceError, match="nested in more than 64 folders"):
        open_bundle(archive)


def flood(path: Path, members: int) -> Path:
    """A tar of `members` empty members (one 512-byte header each, written directly)."""
    header = bytearray(tarfile.TarInfo("x").tobuf(format=tarfile.USTAR_FORMAT))
    with path.open("wb") as out:
        for i in range(members):
            name = f"f/{i}".encode()
            header[:100] = name.ljust(100, b"\0")
            header[148:156] = b" " * 8
            header[148:156] = b"%06o\0 " % sum(header)
            out.write(header)
        out.write(bytes(1024))
    return path


def test_a_member_flood_is_refused_at_the_limit(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"more than 1000 members \(limit max_members\)"):
        open_bundle(flood(tmp_path / "f.tar", 1001), Limits(max_members=1000))
    with pytest.raises(TraceError, match="no Ascend, Kineto or Nsight Systems profile found"):
        open_bundle(flood(tmp_path / "g.tar", 1000), Limits(max_members=1000))


# --- the cache -----------------------------------------------------------------------------------
@pytest.mark.parametrize("poison", ['{"rank": "x"}', "[]", '{"rank": 0, "groups": 5, '
                                    '"meta": {}, "warnings": []}', '{"rank": 4294967296, '
                                    '"groups": [], "meta": {}, "warnings": []}', "garbage"])
def test_a_poisoned_cache_entry_is_rebuilt_with_a_warning(tmp_path: Path, poison: str) -> None:
    store = tmp_path / "cache"
    first = tracegraph.load(GLOO / "rank0.json", cache_dir=store)
    (meta,) = store.glob("*/meta.json")
    meta.write_text(poison)
    again = tracegraph.load(GLOO / "rank0.json", cache_dir=store)
    assert [w for w in again.warnings if "cache entry" in w] == [
        f"cache entry {meta.parent} unusable ({_why(poison)}); parsed again"]
    assert again.events.equals(first.events)
    third = tracegraph.load(GLOO / "rank0.json", cache_dir=store)  # the entry was rebuilt
    assert not [w for w in third.warnings if "cache entry" in w]
    assert parse_cache.load_cached(store, meta.parent.name) is not None


def _why(poison: str) -> str:
    import msgspec

    try:
        msgspec.json.decode(poison.encode(), type=parse_cache._Meta)
    except msgspec.DecodeError as error:
        return str(error)
    return "values out of range in meta.json"


# --- size ----------------------------------------------------------------------------------------
_LAUNCHER = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "tracegraph", *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss, file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _peak_of(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run the command line in a fresh process; its result and its own peak RSS in bytes. A
    small launcher forks it: a child forked from this test process would count the test
    process's pages, which Linux keeps in a process's peak across exec."""
    run = subprocess.run([sys.executable, "-c", _LAUNCHER, *args], capture_output=True,
                         text=True, timeout=600)
    stderr, _, peak = run.stderr.rstrip("\n").rpartition("\n")
    run.stderr = stderr + "\n" if stderr else ""
    return run, int(peak) * 1024


@pytest.mark.parametrize("how", ["one 16 MiB name", "100 KB names on every event"])
def test_huge_names_stay_bounded(tmp_path: Path, how: str) -> None:
    doc = gloo()
    events = kept(doc)
    if how == "one 16 MiB name":
        annotation = max((e for e in events if e["cat"] == "user_annotation"
                          and not e["name"].startswith("ProfilerStep#")),
                         key=lambda e: e["dur"])  # the annotation of many rows
        annotation["name"] = "N" * (16 * MIB)
        thread = next(e for e in doc["traceEvents"] if e.get("name") == "thread_name")
        thread["args"]["name"] = f"thread {thread['tid']} ({'T' * (16 * MIB)})"
    else:
        for event in doc["traceEvents"]:
            event["name"] = event.get("name", "") + "x" * 100_000
    path = write(tmp_path / "rank0.json", doc)
    run, peak = _peak_of(["analyze", str(path), "--no-cache", "--json"])
    assert run.returncode == 0, run.stderr
    assert peak < 1 << 30, f"{peak / MIB:.0f} MiB"
    summary = json.loads(run.stdout)
    (cut,) = [w for w in summary["warnings"] if "damaged values" in w]
    assert "name values cut short" in cut
    if how == "one 16 MiB name":  # every row of the thread carries its name in its lane
        assert "lane values cut short" in cut
    trace = tracegraph.load(path, use_cache=False)
    assert trace.events["name"].str.len().max() <= NAME_LIMIT
    assert trace.events["annotation"].str.len().max() <= LABEL_LIMIT
    assert trace.events["lane"].str.len().max() <= LABEL_LIMIT + len("thread 1234567890 ")


def test_a_tar_of_empty_members_is_refused_with_little_memory(tmp_path: Path) -> None:
    path = flood(tmp_path / "flood.tar", Limits().max_members + 1)
    run, peak = _peak_of(["analyze", str(path), "--no-cache"])
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: {path}: more than {Limits().max_members} members "
                                  "(limit max_members)")
    assert peak < 1 << 30, f"{peak / MIB:.0f} MiB"


# --- silent wrong answers ------------------------------------------------------------------------
def test_a_start_a_day_away_from_the_rest_is_dropped(tmp_path: Path) -> None:
    doc = gloo()
    kept(doc)[5]["ts"] += 2 * 86_400e6
    trace = tracegraph.load(write(tmp_path / "rank0.json", doc), use_cache=False)
    assert len(trace.events) == RANK0_EVENTS - 1
    assert "1 starting over a day away from the rest" in damage_line(trace)


def _job(tmp_path: Path, docs: dict[str, dict]) -> Path:
    bundle = tmp_path / "job"
    for name, doc in docs.items():
        write(bundle / name, doc)
    return bundle


def test_cross_rank_problems_are_each_a_warning(tmp_path: Path) -> None:
    """A copy of rank 0, rank 2 stating world size 8, rank 3 with no events: each said."""
    docs = {f"rank{r}.json": gloo(r) for r in range(4)}
    docs["rank0_copy.json"] = copy.deepcopy(docs["rank0.json"])
    docs["rank2.json"]["distributedInfo"]["world_size"] = 8
    docs["rank3.json"]["traceEvents"] = []
    trace = tracegraph.load(_job(tmp_path, docs), use_cache=False)
    assert trace.rank_ids == [0, 1, 2, 3]
    warnings = set(trace.warnings)
    assert {"rank 0: rank0_copy.json is a copy of rank0.json; read once",
            "the ranks state different world sizes: 4 (rank(s) 0, 1, 3), 8 (rank(s) 2); using 8",
            "rank 3: rank3.json holds no event; the analysis covers the other ranks",
            "4 rank(s) that world_size 8 and the groups' stated members name are absent from "
            "the bundle: 4-7"} <= warnings


def test_a_member_silent_in_its_groups_collectives(tmp_path: Path) -> None:
    """Rank 2's gloo collectives (its worker threads' gloo:* ops) removed: it belongs to the
    all-to-all group of all 4 ranks (pg "0") and the DP group [0, 2] (pg "1"), whose other
    members ran collectives on them."""
    docs = {f"rank{r}.json": gloo(r) for r in range(4)}
    events = docs["rank2.json"]["traceEvents"]
    docs["rank2.json"]["traceEvents"] = [
        e for e in events if not (e.get("name", "").startswith("gloo:")
                                  and e.get("name") not in ("gloo:send", "gloo:recv"))]
    trace = tracegraph.load(_job(tmp_path, docs), use_cache=False)
    silent = sorted(w for w in trace.warnings if "show none of the collectives" in w)
    assert silent == [
        "group 0: member rank(s) 2 show none of the collectives that rank(s) 0, 1, 3 ran on it",
        "group 1: member rank(s) 2 show none of the collectives that rank(s) 0 ran on it"]


def test_a_complete_job_warns_of_none_of_these(tmp_path: Path) -> None:
    trace = tracegraph.load(GLOO, use_cache=False)
    assert trace.warnings == []


def test_consistency_warnings_reach_terminal_json_and_html(tmp_path: Path) -> None:
    docs = {f"rank{r}.json": gloo(r) for r in range(4)}
    docs["rank3.json"]["traceEvents"] = []
    bundle = _job(tmp_path, docs)
    said = "rank 3: rank3.json holds no event; the analysis covers the other ranks"
    code, _, err = cli("analyze", bundle, "--no-cache")
    assert code == 0 and f"warning: {said}" in err.splitlines()
    code, out, _ = cli("analyze", bundle, "--json", "--no-cache")
    assert code == 0 and said in json.loads(out)["warnings"]
    code, _, _ = cli("report", bundle, "-o", tmp_path / "r.html", "--no-cache")
    assert code == 0 and f"<li>{said}</li>" in (tmp_path / "r.html").read_text()


# --- found by the fuzzer -------------------------------------------------------------------------
def test_check_on_a_profile_without_groups(tmp_path: Path) -> None:
    """Every event's args removed: no comm op knows its group; the overlap metric must not
    fail on an all-unknown group column."""
    src = REAL / "kineto/hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for event in doc["traceEvents"]:
        event.pop("args", None)
    path = write(tmp_path / "rank0.json", doc)
    code, out, err = cli("check", path, "--preset", "hsdp-async-reduction", "--json",
                         "--no-cache")
    assert code in (0, 1), err
    assert {c["status"] for c in json.loads(out)["checks"]} <= {"pass", "fail",
                                                                "not_applicable"}


def test_unreadable_option_percentages_are_refused() -> None:
    code, _, err = cli("diff", GLOO, GLOO, "--fail-on-regression", "nan%", "--no-cache")
    assert code == 2 and "--fail-on-regression" in err


def test_input_is_never_written(tmp_path: Path) -> None:
    bundle = tmp_path / "in"
    shutil.copytree(GLOO, bundle)
    before = {p: p.read_bytes() for p in bundle.iterdir()}
    cli("export", bundle, "--parquet", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert {p: p.read_bytes() for p in bundle.iterdir()} == before
    assert pd.read_parquet(tmp_path / "out" / "ranks.parquet")["rank"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("mapping", ['{"rank0.json": 4294967296}', '{"rank0.json": "abc"}',
                                     "[1, 2]"])
def test_a_rank_map_that_maps_to_no_rank_is_an_error(tmp_path: Path, mapping: str) -> None:
    (tmp_path / "map.json").write_text(mapping)
    code, _, err = cli("analyze", GLOO / "rank0.json", "--rank-map", tmp_path / "map.json",
                       "--no-cache")
    assert code == 2 and "map.json: " in one_error(err)


@pytest.mark.parametrize("command", [
    ["analyze", "{p}"], ["analyze", "{p}", "--json"], ["report", "{p}", "-o", "{o}/r.html"],
    ["graph", "{p}", "-o", "{o}/g.json"], ["check", "{p}", "--preset", "hsdp-async-reduction"],
    ["diff", "{p}", "{p}"]])
def test_a_profile_of_one_step_marker_and_no_op(tmp_path: Path, command: list[str]) -> None:
    """A cut trace that kept only its ProfilerStep#100 marker (found by the fuzzer, case 5347:
    the lane table had no `mode` column when no op was left)."""
    src = REAL / "kineto/hta/critical_path/cuda_event_sync/event_sync_trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M"
                          or e.get("name") == "ProfilerStep#100"]
    path = write(tmp_path / "rank0.json", doc)
    code, stdout, err = cli(*(a.format(p=path, o=tmp_path) for a in command), "--no-cache")
    assert code in (0, 1), err
    if command[-1] == "--json":
        summary = json.loads(stdout)
        assert [r["events"] for r in summary["ranks"]] == [1]
        assert summary["bubbles"] == []


def test_matches_that_contradict_each_other_leave_no_gain_ceiling(tmp_path: Path) -> None:
    """Fuzz case 2873: 50 events of a simulated Kineto rank with an unreadable correlation id
    make stream waits match ops that contradict each other (a cycle in the graph). analyze
    warns about the cycle and says why no gain ceiling is computed, instead of crashing in the
    replay."""
    bundle = fuzz.write(fuzz.case(2873).mutant, tmp_path)
    code, stdout, stderr = cli("analyze", bundle, "--top", "3", "--jobs", "1", "--no-cache")
    assert code in (0, 1), stderr
    assert "dependency cycle among" in stderr
    assert "gain ceilings not computed: no replay:" in " ".join(stdout.split())
