"""The Ascend timeline read in slices: the same rows as the file decoded whole, on the real
traces; slices bounded; cuts inside strings found out; damaged files said as the whole decoding
says them; a cut name still counted; the `.db` reader's chunked fetch; big members of a
streamed archive parsed from files; parser processes counted from the memory at hand."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

import tracegraph
from parsers import ascend, ascend_db, ascend_rows, ascend_stream, ascend_timeline, parse_rank
from parsers.ascend_layout import APO
from parsers.base import ParsedRank, RankFiles, TraceError
from parsers.values import NAME_LIMIT
from tracegraph import schema
from tracegraph.loading import jobs, loader

DDP8 = "ascend/torch_npu_ddp8_level1/rank{}_ascend_pt"
SINGLE = "ascend/msprof_analyze_single/test/ut/advisor/timeline_advice/trace_view.json"
DDP8_DB = "ascend/torch_npu_ddp8_db_level1/rank0_ascend_pt"
SMALL_SLICE = 16 << 10  # bytes: the real traces come in tens of slices


def _folder(real: Path, root: str) -> RankFiles:
    base = real / root
    names = {"trace": f"{APO}/trace_view.json", "communication": f"{APO}/communication.json",
             "matrix": f"{APO}/communication_matrix.json",
             "step_trace": f"{APO}/step_trace_time.csv"}
    files = {role: f"{root}/{name}" for role, name in names.items() if (base / name).is_file()}
    files["info"] = f"{root}/{next(base.glob('profiler_info_*.json')).name}"
    return RankFiles("ascend", root, files, None)


def _profiles(real: Path) -> list[RankFiles]:
    return [_folder(real, DDP8.format(0)), _folder(real, DDP8.format(1)),
            RankFiles("ascend", SINGLE, {"trace": SINGLE}, 0)]


def _parse(real: Path, files: RankFiles) -> ParsedRank:
    return ascend.parse(files, lambda member: (real / member).read_bytes())


def _whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file decoded whole (the fallback of a damaged file) instead of in slices."""
    def refused(*args: object) -> None:
        raise ascend_stream.Whole
    monkeypatch.setattr(ascend_timeline, "event_slices", refused)


def _same(one: ParsedRank, other: ParsedRank) -> None:
    assert one.events.equals(other.events)
    assert (one.groups, one.meta, one.warnings, one.damaged) == (
        other.groups, other.meta, other.warnings, other.damaged)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_slices_give_the_rows_of_the_whole_file(real: Path, index: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Real torch_npu traces (Python, CANN, Ascend Hardware, HCCL layers; 2024's older arg
    names) read in slices of 16 KiB and in 1000-row chunks make the table, groups, meta and
    warnings of the file decoded whole and built at once."""
    files = _profiles(real)[index]
    sliced = []
    decode = ascend_timeline._per_phase

    def counted(data: memoryview | bytearray) -> list:
        sliced.append(len(data))
        return decode(data)

    monkeypatch.setattr(ascend_stream, "SLICE_BYTES", SMALL_SLICE)
    monkeypatch.setattr(ascend_timeline, "_per_phase", counted)
    monkeypatch.setattr(ascend, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(ascend_rows, "CHUNK_ROWS", 1000)
    streamed = _parse(real, files)
    events = json.loads((real / files.files["trace"]).read_bytes())
    longest = max(len(json.dumps(e)) for e in events)
    assert len(sliced) > 30  # tens of slices ...
    assert max(sliced) <= 2 * SMALL_SLICE + 2 * longest  # ... none much more than its share
    monkeypatch.undo()
    _whole(monkeypatch)
    _same(streamed, _parse(real, files))
    assert streamed.events.num_rows > 1600


def test_a_cut_inside_a_string_is_found_out(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Names holding `}, {` (what a cut is made after) and nested objects in args: the slice
    that ends there does not decode and the cut before it is taken; the rows are those of the
    whole file."""
    meta = {"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
            "args": {"name": "Ascend Hardware"}}
    tasks = [{"ph": "X", "name": f'k{i} "}}, {{" x}}, {{', "pid": 7, "tid": 2,
              "ts": f"{100 + i}.5", "dur": 0.25,
              "args": {"Task Type": "AI_CORE", "Physic Stream Id": 2, "connection_id": i,
                       "nested": [{"a": 1}, {"b": 2}]}} for i in range(400)]
    (tmp_path / "trace_view.json").write_text(json.dumps([meta, *tasks]))
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    monkeypatch.setattr(ascend_stream, "SLICE_BYTES", 1000)
    sliced = ascend.parse(files, lambda m: (tmp_path / m).read_bytes())
    monkeypatch.undo()
    _whole(monkeypatch)
    whole = ascend.parse(files, lambda m: (tmp_path / m).read_bytes())
    _same(sliced, whole)
    assert sliced.events.column("name").to_pylist()[:2] == [t["name"] for t in tasks[:2]]


@pytest.mark.parametrize("cut", [0.3, 0.999])
def test_a_truncated_file_keeps_what_the_whole_decoding_keeps(
        real: Path, tmp_path: Path, cut: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real trace cut short (mid-file, and in its last event) read in slices keeps the
    complete events the whole decoding keeps, with the same warning."""
    data = (real / DDP8.format(0) / APO / "trace_view.json").read_bytes()
    (tmp_path / "trace_view.json").write_bytes(data[:int(len(data) * cut)])
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    monkeypatch.setattr(ascend_stream, "SLICE_BYTES", SMALL_SLICE)
    sliced = ascend.parse(files, lambda m: (tmp_path / m).read_bytes())
    monkeypatch.undo()
    _whole(monkeypatch)
    _same(sliced, ascend.parse(files, lambda m: (tmp_path / m).read_bytes()))
    assert any("truncated; kept the" in w for w in sliced.warnings)


def _past_middle(text: str, old: str, new: str) -> str:
    """`text` with the first `old` past its middle replaced by `new`."""
    at = text.index(old, len(text) // 2)
    return text[:at] + new + text[at + len(old):]


@pytest.mark.parametrize(("damage", "said"), [
    (lambda text: _past_middle(text, '"ph": "X"', '"ph": 5'), r"unexpected content: Expected"),
    (lambda text: _past_middle(text, '}, {"ph"', '}, oops {"ph"'), r"invalid JSON"),
    (lambda text: "\n" + text.replace("[", "{", 1), r"invalid JSON"),
])
def test_damaged_files_name_what_the_whole_decoding_names(real: Path, tmp_path: Path, damage,
                                                          said: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A wrong type deep in the file, bytes that are no JSON, an object for an array: the
    slices give way to the whole decoding, whose one-line error says where."""
    text = (real / DDP8.format(0) / APO / "trace_view.json").read_text()
    (tmp_path / "trace_view.json").write_text(damage(text))
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    monkeypatch.setattr(ascend_stream, "SLICE_BYTES", SMALL_SLICE)
    with pytest.raises(TraceError, match=r"^trace_view\.json: " + said) as sliced:
        ascend.parse(files, lambda m: (tmp_path / m).read_bytes())
    monkeypatch.undo()
    _whole(monkeypatch)
    with pytest.raises(TraceError) as whole:
        ascend.parse(files, lambda m: (tmp_path / m).read_bytes())
    assert str(sliced.value) == str(whole.value)


def test_a_file_on_disk_is_read_in_slices_not_whole(real: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace lying on disk is streamed from its file: `read` never gives its bytes."""
    data = (real / DDP8.format(0) / APO / "trace_view.json").read_bytes()
    (tmp_path / "trace_view.json").write_bytes(data)
    read_whole: list[str] = []

    class Reader:
        def __call__(self, member: str) -> bytes:
            read_whole.append(member)
            return (tmp_path / member).read_bytes()

        def local_path(self, member: str) -> Path:
            return tmp_path / member

    monkeypatch.setattr(ascend_stream, "SLICE_BYTES", SMALL_SLICE)
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    streamed = ascend.parse(files, Reader())
    assert read_whole == []
    assert streamed.events.equals(ascend.parse(files, lambda m: data).events)


def test_text_columns_come_dictionary_coded(real: Path) -> None:
    """A rank's table holds its text as codes into each column's values (what the loader keeps
    in memory), so it never exists as one string per row."""
    events = _parse(real, _profiles(real)[0]).events
    assert events.schema.equals(schema.IN_MEMORY_EVENTS)
    assert schema.in_memory(events) is events
    lanes = events.column("lane").combine_chunks()
    assert len(lanes.dictionary) < 20 < events.num_rows


def test_the_database_is_read_in_chunks(real: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The .db export fetched 100 rows at a time gives the table of one fetch of all."""
    files = RankFiles("ascend_db", DDP8_DB, {
        "db": f"{DDP8_DB}/{APO}/ascend_pytorch_profiler_0.db",
        "info": f"{DDP8_DB}/profiler_info_0.json"}, None)
    whole = ascend_db.parse(files, lambda m: (real / m).read_bytes())
    monkeypatch.setattr(ascend_db, "QUERY_ROWS", 100)
    chunked = ascend_db.parse(files, lambda m: (real / m).read_bytes())
    _same(chunked, whole)
    assert whole.events.num_rows > 4000  # 40 fetches of TASK alone


def test_parsers_are_as_many_as_the_memory_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """One parser per CPU while memory holds them; fewer, said, when it does not; --jobs
    decides alone."""
    big = RankFiles("ascend", "r0", {"trace": "r0/trace_view.json"}, 0)
    small = RankFiles("ascend", "r1", {"trace": "r1/trace_view.json"}, 1)
    sizes = {"r0/trace_view.json": 4 << 30, "r1/trace_view.json": 1 << 20}
    monkeypatch.setattr(jobs.os, "cpu_count", lambda: 4)
    need = jobs.parse_peak(big, sizes.get)
    assert need == jobs.PARSE_BASE + int(jobs.PARSE_PER_BYTE["ascend"] * (4 << 30))
    notes: list[str] = []
    monkeypatch.setattr(jobs, "available_memory", lambda: 10 * need)
    assert jobs.parser_count(None, [big, small], sizes.get, notes) == 2 and notes == []
    monkeypatch.setattr(jobs, "available_memory", lambda: need + need // 2)
    assert jobs.parser_count(None, [big, small, small], sizes.get, notes) == 1
    assert notes == [f"parsing 1 rank(s) at a time, not 3: the biggest rank's parse may take "
                     f"{need / 2**30:.1f} GiB and {1.5 * need / 2**30:.1f} GiB of memory is "
                     "available (--jobs sets the count)"]
    assert jobs.parser_count(3, [big, small, small], sizes.get, notes) == 3


def test_available_memory_is_read_from_the_system() -> None:
    """MemAvailable (or the container's room), within what the machine has."""
    free = jobs.available_memory()
    total = jobs._MEMINFO.read_text().split()[1]
    assert free is not None and 0 < free <= int(total) * 1024


@pytest.mark.parametrize("jobs", [1, 2])
def test_big_members_of_a_streamed_archive_are_parsed_from_files(
        real: Path, tmp_path: Path, jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .tar.gz's trace_view.json past SPILL_BYTES goes to a file that the parser (in this
    process, or a worker's) streams and that is removed once parsed: the same trace as the
    folder's, nothing left behind."""
    archive = tmp_path / "ddp8.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(real / "ascend/torch_npu_ddp8_level1", arcname="ddp8")
    spilled: list[Path] = []
    spill = loader._spilled

    def counted(data: bytes, folder: Path) -> Path:
        spilled.append(spill(data, folder))
        return spilled[-1]

    monkeypatch.setattr(loader, "SPILL_BYTES", 1 << 20)  # the two traces (2.2 MB), no CSV
    monkeypatch.setattr(loader, "_spilled", counted)
    from_tar = tracegraph.load(archive, use_cache=False, jobs=jobs)
    assert sorted(p.name.startswith("member-") for p in spilled) == [True, True]
    assert not any(p.exists() for p in spilled)
    from_dir = tracegraph.load(real / "ascend/torch_npu_ddp8_level1", use_cache=False, jobs=1)
    assert from_tar.events.equals(from_dir.events)


def test_a_name_cut_short_is_still_counted(tmp_path: Path) -> None:
    """A megabyte name is cut to NAME_LIMIT characters; its column stays plain text (not
    dictionary-coded) so that the one check of every parser's output counts the cut."""
    meta = {"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
            "args": {"name": "Ascend Hardware"}}
    tasks = [{"ph": "X", "name": name, "pid": 7, "tid": 2, "ts": f"{100 + i}.5", "dur": 0.25,
              "args": {"Task Type": "AI_CORE", "Physic Stream Id": 2}}
             for i, name in enumerate(["k" * (1 << 20), "short"])]
    (tmp_path / "trace_view.json").write_text(json.dumps([meta, *tasks]))
    files = RankFiles("ascend", "r", {"trace": "trace_view.json"}, 0)
    parsed = parse_rank(files, lambda m: (tmp_path / m).read_bytes())
    names = parsed.events.column("name")
    assert names.type == "string" and parsed.events.column("lane").type != "string"
    assert [len(n) for n in names.to_pylist()] == [NAME_LIMIT, 5]
    assert any("1 name values cut short (too long)" in w for w in parsed.warnings)
