"""Bundle discovery over the real profile trees, and hostile archives built here.

Known answers for the real trees were read by hand:
- kineto/gloo_pp2_dp2/rank{0..3}.json: `grep -o '"distributedInfo": {[^}]*"rank": [0-9]'` on each
  file gives rank 0, 1, 2, 3 (and real_traces/README.md says the same).
- ascend/*: `find <set> -type f | sort` lists, for every rank folder, `profiler_info_{r}.json`,
  `profiler_metadata.json` and ASCEND_PROFILER_OUTPUT/{communication.json,
  communication_matrix.json, step_trace_time.csv}; only torch_npu_ddp8_level1 also has
  ASCEND_PROFILER_OUTPUT/trace_view.json (none of the four pp2dp2 ranks has it); pp2dp2 ranks 0
  and 2 hold ASCEND_PROFILER_OUTPUT/kernel_details.csv, ranks 1 and 3 do not.
- ascend/torch_npu_2023_comm: test_rank_{0,1} hold profiler_info_{r}.json and
  ASCEND_PROFILER_OUTPUT/{communication,communication_matrix}.json + step_trace_time.csv +
  kernel_details.csv, no profiler_metadata.json; `find . -name '*.json' -not -path
  './test_rank_*'` lists 6 other JSON files (3 in cluster_analysis_output/, 2 in
  communication_group/, metadata/profiler_metadata.json).
- kineto/hta: a one-off script (gunzip, `bytes.find(b'"distributedInfo"')`) shows
  cpu_only/rank-34.*.json.gz stating `"rank": 34` at byte 56, trace_filter/sampled_rank-1 stating
  `"rank": 1` at byte 41, and distributed_info_unavailable/*.json.gz holding no distributedInfo.
Hostile archives, bombs and cut files are built here; their answers hold by construction.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from parsers.archive import Limits, TarSource
from parsers.base import TraceError
from parsers.bundle import open_bundle

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real_traces"
GLOO = REAL / "kineto" / "gloo_pp2_dp2"
ROLES_APO = {"communication", "matrix", "step_trace", "info", "metadata"}
MEMORY = {"memory_record", "operator_memory", "npu_module_mem"}  # profile_memory=True files
KINETO_HEAD = b'{"schemaVersion": 1, "traceEvents": ['
BOMB_BYTES = 200 << 20


def real(rel: str) -> Path:
    """A path under ../shared/real_traces; fails (never skips) when the tree is absent."""
    path = REAL / rel
    assert path.exists(), f"{path} is missing: ../shared must sit beside the clone"
    return path


def gloo_files() -> dict[str, bytes]:
    return {f"rank{r}.json": (real("kineto/gloo_pp2_dp2") / f"rank{r}.json").read_bytes()
            for r in range(4)}


def summary(bundle) -> list[tuple]:
    return [(p.format, p.root, p.files, p.rank) for p in bundle.profiles]


def make_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def make_zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return path


def tar_with(path: Path, info: tarfile.TarInfo) -> Path:
    """A tar.gz holding one gloo trace and then the member `info` (no data)."""
    make_tar(path, [("rank0.json", gloo_files()["rank0.json"])], "w")
    with tarfile.open(path, "a") as tar:
        tar.addfile(info)
    return path


# -- real trees ----------------------------------------------------------------------------------
def test_gloo_directory_holds_four_kineto_ranks():
    bundle = open_bundle(real("kineto/gloo_pp2_dp2"))
    assert summary(bundle) == [("kineto", f"rank{r}.json", {"trace": f"rank{r}.json"}, r)
                               for r in range(4)]
    assert bundle.warnings == [] and bundle.random_access


def test_pp2dp2_has_four_ascend_ranks_without_trace_view():
    bundle = open_bundle(real("ascend/torch_npu_pp2dp2_level2_comm"))
    assert [(p.format, p.root, p.rank) for p in bundle.profiles] == [
        ("ascend", f"rank_{r}_ascend_pt", r) for r in range(4)]
    for r, profile in enumerate(bundle.profiles):  # ranks 0 and 2 hold kernels and memory
        assert set(profile.files) == ROLES_APO | ({"kernels"} | MEMORY if r in (0, 2) else set())
        assert profile.files["info"] == f"rank_{r}_ascend_pt/profiler_info_{r}.json"
        assert profile.files["matrix"] == (f"rank_{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/"
                                           "communication_matrix.json")


def test_ddp8_has_two_ascend_ranks_with_trace_view():
    bundle = open_bundle(real("ascend/torch_npu_ddp8_level1"))
    assert [(p.root, p.rank) for p in bundle.profiles] == [("rank0_ascend_pt", 0),
                                                           ("rank1_ascend_pt", 1)]
    for profile in bundle.profiles:
        assert set(profile.files) == ROLES_APO | MEMORY | {"trace"}
        assert profile.files["trace"] == f"{profile.root}/ASCEND_PROFILER_OUTPUT/trace_view.json"
    trace = bundle.read(bundle.profiles[1].files["trace"])
    assert trace == (real("ascend/torch_npu_ddp8_level1") / bundle.profiles[1].files["trace"]
                     ).read_bytes()


def test_one_ascend_folder_as_the_bundle():
    bundle = open_bundle(real("ascend/torch_npu_ddp8_level1/rank1_ascend_pt"))
    assert summary(bundle) == [("ascend", ".", {
        "trace": "ASCEND_PROFILER_OUTPUT/trace_view.json",
        "communication": "ASCEND_PROFILER_OUTPUT/communication.json",
        "matrix": "ASCEND_PROFILER_OUTPUT/communication_matrix.json",
        "step_trace": "ASCEND_PROFILER_OUTPUT/step_trace_time.csv",
        "memory_record": "ASCEND_PROFILER_OUTPUT/memory_record.csv",
        "operator_memory": "ASCEND_PROFILER_OUTPUT/operator_memory.csv",
        "npu_module_mem": "ASCEND_PROFILER_OUTPUT/npu_module_mem.csv",
        "info": "profiler_info_1.json", "metadata": "profiler_metadata.json"}, 1)]


def test_2023_comm_folders_found_by_profiler_info_and_other_json_reported():
    bundle = open_bundle(real("ascend/torch_npu_2023_comm"))
    comm = {"communication", "matrix", "step_trace", "info"}
    assert [(p.root, p.rank, set(p.files)) for p in bundle.profiles] == [
        ("test_rank_0", 0, comm | {"kernels"} | MEMORY),
        ("test_rank_1", 1, comm | {"kernels"} | MEMORY - {"npu_module_mem"})]  # no module memory
    assert len(bundle.warnings) == 1
    assert bundle.warnings[0].startswith("ignored 6 JSON file(s) that are not profiles: ")


def test_rank_hint_from_distributed_info_then_file_name():
    hta = real("kineto/hta")
    assert open_bundle(hta / "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
                       ).profiles[0].rank == 34  # distributedInfo.rank 34, not the pid 1074
    assert open_bundle(hta / "trace_filter/sampled_rank-1.json.gz").profiles[0].rank == 1
    assert open_bundle(hta / "distributed_info_unavailable/distributed_info_not_found.json.gz"
                       ).profiles[0].rank is None


def test_rank_fallback_without_the_kineto_parser(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "parsers.kineto", None)  # import now raises ImportError
    files = gloo_files()
    (tmp_path / "a.json").write_bytes(files["rank3.json"])  # names without a rank word
    (tmp_path / "b.json").write_bytes(files["rank2.json"])
    assert {p.root: p.rank for p in open_bundle(tmp_path).profiles} == {"a.json": 3, "b.json": 2}


def test_file_name_rank_only_from_explicit_words(tmp_path):
    named = {"rank-5.host_1234.1712345678.pt.trace.json": 5, "worker3.json": 3,
             "host_1234.1712345678901.pt.trace.json": None,  # pid and timestamp are no rank
             "rank_2.json.tmp": 2}  # an interrupted export: cut inside the first event
    for name in named:
        (tmp_path / name).write_bytes(KINETO_HEAD + b'{"ph": "X", "na')
    (tmp_path / "rank9.json").write_bytes(gloo_files()["rank2.json"])  # distributedInfo wins
    ranks = {p.root: p.rank for p in open_bundle(tmp_path).profiles}
    assert ranks == named | {"rank9.json": 2}


# -- archives ------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".tar.gz", ".tar", ".zip"])
def test_archive_gives_directory_profiles_and_bytes(tmp_path, suffix):
    files = gloo_files()
    members = list(files.items())
    path = tmp_path / f"pp2_dp2{suffix}"
    if suffix == ".zip":
        make_zip(path, members)
    else:
        make_tar(path, members, "w:gz" if suffix == ".tar.gz" else "w")
    with open_bundle(path) as bundle, open_bundle(GLOO) as folder:
        assert summary(bundle) == summary(folder)
        assert bundle.random_access == (suffix == ".zip")
        assert all(bundle.read(name) == data for name, data in files.items())
        assert dict(bundle.stream(set(files))) == files


def test_stream_yields_requested_members_in_archive_order(tmp_path):
    files = gloo_files()
    path = make_tar(tmp_path / "b.tgz", sorted(files.items(), reverse=True))
    bundle = open_bundle(path)
    got = list(bundle.stream({"rank1.json", "rank3.json"}))
    assert [name for name, _ in got] == ["rank3.json", "rank1.json"]
    assert all(data == files[name] for name, data in got)
    with pytest.raises(TraceError, match=r"b\.tgz: no member 'nope\.json'"):
        bundle.read("nope.json")


def test_tar_stream_is_one_pass(tmp_path, monkeypatch):
    files = gloo_files()
    bundle = open_bundle(make_tar(tmp_path / "b.tar.gz", list(files.items())))
    passes = []
    one_pass = TarSource._pass
    monkeypatch.setattr(TarSource, "_pass", lambda self: passes.append(1) or one_pass(self))
    assert dict(bundle.stream(set(files))) == files
    assert passes == [1]


def test_gz_member_inside_archive_is_decompressed(tmp_path):
    data = gloo_files()["rank1.json"]
    path = make_tar(tmp_path / "b.tar.gz", [("job/x.pt.trace.json.gz", gzip.compress(data))])
    bundle = open_bundle(path)
    assert summary(bundle) == [("kineto", "job/x.pt.trace.json.gz",
                                {"trace": "job/x.pt.trace.json.gz"}, 1)]
    assert bundle.read("job/x.pt.trace.json.gz") == data


# -- hostile archives ----------------------------------------------------------------------------
def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(("member", "problem"), [
    (_info("../evil.json"), "'..' component"),
    (_info("job/../../evil.json"), "'..' component"),
    (_info("/etc/evil.json"), "absolute path"),
    (_info("C:/evil.json"), "drive letter"),
    (_info("link.json", tarfile.SYMTYPE, "rank0.json"), "symlink"),
    (_info("hard.json", tarfile.LNKTYPE, "rank0.json"), "hardlink"),
    (_info("pipe.json", tarfile.FIFOTYPE), "fifo"),
    (_info("dev.json", tarfile.CHRTYPE), "character device"),
])
def test_tar_with_unsafe_member_is_refused(tmp_path, member, problem):
    path = tar_with(tmp_path / "evil.tar", member)
    with pytest.raises(TraceError) as err:
        open_bundle(path)
    assert str(path) in str(err.value) and member.name in str(err.value)
    assert problem in str(err.value)


def test_duplicate_member_is_refused(tmp_path):
    data = gloo_files()["rank0.json"]
    path = make_tar(tmp_path / "dup.tar.gz", [("rank0.json", data), ("./rank0.json", data)])
    with pytest.raises(TraceError, match=r"dup\.tar\.gz: duplicate member 'rank0\.json'"):
        open_bundle(path)
    with pytest.warns(UserWarning, match="Duplicate name"):
        make_zip(tmp_path / "dup.zip", [("rank0.json", data), ("rank0.json", data)])
    with pytest.raises(TraceError, match=r"dup\.zip: duplicate member 'rank0\.json'"):
        open_bundle(tmp_path / "dup.zip")


@pytest.mark.parametrize(("name", "problem"), [("../evil.json", "'..' component"),
                                                ("/abs/evil.json", "absolute path")])
def test_zip_with_unsafe_name_is_refused(tmp_path, name, problem):
    path = make_zip(tmp_path / "evil.zip", [("rank0.json", gloo_files()["rank0.json"]),
                                            (name, b"{}")])
    with pytest.raises(TraceError) as err:
        open_bundle(path)
    assert str(path) in str(err.value) and name in str(err.value) and problem in str(err.value)


def test_zip_with_symlink_entry_is_refused(tmp_path):
    path = make_zip(tmp_path / "evil.zip", [("rank0.json", gloo_files()["rank0.json"])])
    link = zipfile.ZipInfo("link.json")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(TraceError) as err:
        open_bundle(path)
    assert str(path) in str(err.value) and "link.json" in str(err.value)
    assert "symlink" in str(err.value)


def test_member_count_is_capped(tmp_path):
    path = make_tar(tmp_path / "many.tar.gz", list(gloo_files().items()))
    with pytest.raises(TraceError, match="max_members"):
        open_bundle(path, Limits(max_members=3))
    assert len(open_bundle(path, Limits(max_members=4)).profiles) == 4


class _Spaces(io.RawIOBase):
    """`size` bytes of JSON whitespace, produced without holding them in memory."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left)
        buf[:n] = b" " * n
        self.left -= n
        return n


@pytest.fixture(scope="module")
def gz_bomb(tmp_path_factory) -> Path:
    """A tar holding `rank0.json.gz`: a Kineto-looking head, then 200 MB of spaces (~200 KB)."""
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=9) as out:
        out.write(KINETO_HEAD)
        shutil.copyfileobj(_Spaces(BOMB_BYTES), out, 1 << 20)
    assert len(packed.getvalue()) < BOMB_BYTES // 500
    return make_tar(tmp_path_factory.mktemp("bomb") / "bomb.tar", [
        ("rank0.json.gz", packed.getvalue())], "w")


@pytest.fixture(scope="module")
def tar_bomb(tmp_path_factory) -> Path:
    """A tar.gz whose plain member `zeros.json` is 200 MB of spaces."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("zeros.json")
        info.size = BOMB_BYTES
        tar.addfile(info, _Spaces(BOMB_BYTES))
    return path


def test_gzip_bomb_member_stops_at_size_cap(gz_bomb):
    bundle = open_bundle(gz_bomb, Limits(max_member_bytes=16 << 20, max_ratio=1e9))
    assert [p.root for p in bundle.profiles] == ["rank0.json.gz"]  # its head looks like Kineto
    with pytest.raises(TraceError) as err:
        bundle.read("rank0.json.gz")
    assert f"{gz_bomb}: member rank0.json.gz" in str(err.value)
    assert "max_member_bytes" in str(err.value)


def test_gzip_bomb_member_stops_at_ratio_cap(gz_bomb):
    bundle = open_bundle(gz_bomb, Limits(max_ratio=100))
    with pytest.raises(TraceError) as err:
        bundle.read("rank0.json.gz")
    assert f"{gz_bomb}: member rank0.json.gz" in str(err.value) and "max_ratio" in str(err.value)


@pytest.mark.parametrize(("limits", "cap"), [
    (Limits(max_ratio=100), "max_ratio"), (Limits(max_member_bytes=1 << 20), "max_member_bytes")])
def test_tar_gz_bomb_stops_while_listing(tar_bomb, limits, cap):
    with pytest.raises(TraceError) as err:
        open_bundle(tar_bomb, limits)
    assert f"{tar_bomb}: member zeros.json" in str(err.value) and cap in str(err.value)


# -- truncated input -----------------------------------------------------------------------------
def test_truncated_tar_gz_keeps_what_is_there(tmp_path):
    files = gloo_files()
    whole = make_tar(tmp_path / "whole.tar.gz", list(files.items())).read_bytes()
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(whole[: len(whole) * 6 // 10])
    bundle = open_bundle(path)
    assert any("archive truncated" in w for w in bundle.warnings)
    got = dict(bundle.stream({p.root for p in bundle.profiles}))
    complete = [name for name, data in got.items() if data == files[name]]
    partial = [name for name, data in got.items() if data != files[name]]
    assert complete and len(partial) == 1  # the cut member comes back as a strict prefix
    assert files[partial[0]].startswith(got[partial[0]]) and got[partial[0]]
    assert any(f"member {partial[0]}: truncated" in w for w in bundle.warnings)


def test_truncated_gz_file_returns_prefix_and_warns(tmp_path):
    data = gloo_files()["rank1.json"]
    packed = gzip.compress(data)
    path = tmp_path / "rank1.json.gz"
    path.write_bytes(packed[: len(packed) // 2])
    bundle = open_bundle(path)
    assert [p.rank for p in bundle.profiles] == [1]
    got = bundle.read("rank1.json.gz")
    assert 0 < len(got) < len(data) and data.startswith(got)
    assert bundle.warnings == [f"{path}: member rank1.json.gz: truncated; kept the {len(got)} "
                               "bytes that could be read"]


def test_truncated_zip_is_an_error_naming_it(tmp_path):
    whole = make_zip(tmp_path / "b.zip", list(gloo_files().items())).read_bytes()
    (tmp_path / "b.zip").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError, match=r"b\.zip: not a readable zip archive"):
        open_bundle(tmp_path / "b.zip")


# -- directories ---------------------------------------------------------------------------------
def _gloo_copy(folder: Path) -> Path:
    folder.mkdir()
    for name, data in gloo_files().items():
        (folder / name).write_bytes(data)
    return folder


def test_non_profile_json_is_ignored_with_a_warning(tmp_path):
    folder = _gloo_copy(tmp_path / "job")
    (folder / "ground_truth.json").write_text(json.dumps({"slow_rank": 1}))
    bundle = open_bundle(folder)
    assert [p.rank for p in bundle.profiles] == [0, 1, 2, 3]
    assert bundle.warnings == ["ignored 1 JSON file(s) that are not profiles: ground_truth.json"]


def test_symlinks_are_not_followed(tmp_path):
    outside = _gloo_copy(tmp_path / "elsewhere")
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(outside / "rank0.json", folder / "rank0.json")
    (folder / "rank1.json").symlink_to(outside / "rank1.json")
    (folder / "more").symlink_to(outside, target_is_directory=True)
    (folder / "alias.json").symlink_to(folder / "rank0.json")  # inside: listed once, as rank0
    bundle = open_bundle(folder)
    assert [p.root for p in bundle.profiles] == ["rank0.json"]
    assert sorted(bundle.warnings) == [f"{folder}: skipped {name}: symlink to outside the bundle"
                                       for name in ("more", "rank1.json")]


def test_empty_missing_and_unknown_inputs_are_errors(tmp_path):
    with pytest.raises(TraceError, match="no Ascend, Kineto or Nsight Systems profile found"):
        open_bundle(tmp_path)
    with pytest.raises(TraceError, match="no such file or directory"):
        open_bundle(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(TraceError, match=r"notes\.txt: not a directory, an archive"):
        open_bundle(tmp_path / "notes.txt")


def test_files_in_an_ascend_folder_are_never_kineto(tmp_path):
    folder = tmp_path / "host_12_1700000000000_ascend_pt"
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (folder / "profiler_info_5.json").write_text('{"rank_id": 5}')
    (folder / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text("{}")
    (folder / "FRAMEWORK").mkdir()
    (folder / "FRAMEWORK" / "x.json").write_bytes(KINETO_HEAD + b"]}")
    bundle = open_bundle(tmp_path)
    assert summary(bundle) == [("ascend", folder.name, {
        "info": f"{folder.name}/profiler_info_5.json",
        "communication": f"{folder.name}/ASCEND_PROFILER_OUTPUT/communication.json"}, 5)]
    assert bundle.warnings == []


def _ascend(folder: Path, rank: int) -> None:
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (folder / f"profiler_info_{rank}.json").write_text("{}")
    (folder / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text("{}")


def test_latest_folder_wins_when_a_rank_has_several(tmp_path):
    _ascend(tmp_path / "host_12_1700000000002_ascend_pt", 0)
    _ascend(tmp_path / "host_12_1700000000010_ascend_pt", 0)
    _ascend(tmp_path / "host_13_1700000000001_ascend_ms", 1)
    bundle = open_bundle(tmp_path)
    assert [(p.root, p.rank) for p in bundle.profiles] == [
        ("host_12_1700000000010_ascend_pt", 0), ("host_13_1700000000001_ascend_ms", 1)]
    assert bundle.warnings == ["rank 0 has 2 Ascend profiles (host_12_1700000000002_ascend_pt, "
                               "host_12_1700000000010_ascend_pt); kept "
                               "host_12_1700000000010_ascend_pt, the latest by folder timestamp"]


def _prof(folder: Path, rank_id: int, traces: list[str]) -> None:
    (folder / "device_3").mkdir(parents=True)
    (folder / "device_3" / "info.json.3").write_text(json.dumps({"rank_id": rank_id}))
    (folder / "mindstudio_profiler_output").mkdir()
    for name in traces:
        (folder / "mindstudio_profiler_output" / name).write_text("[]")
    (folder / "analyze").mkdir()
    (folder / "analyze" / "communication.json").write_text("{}")


def test_raw_prof_folders(tmp_path):
    prof = "PROF_000001_20240101000000_ABC"
    _prof(tmp_path / prof, 3, ["msprof_slice_10_1.json", "msprof_slice_2_1.json",
                               "msprof_slice_0_1.json"])
    _prof(tmp_path / "x_ascend_pt" / "PROF_1_2_X", -1, ["msprof_1.json"])  # rank from the folder
    (tmp_path / "x_ascend_pt" / "profiler_info_7.json").write_text("{}")
    _ascend(tmp_path / "y_ascend_pt", 8)
    _prof(tmp_path / "y_ascend_pt" / "PROF_1_2_Y", 8, ["msprof_1.json"])  # ignored: APO wins
    _prof(tmp_path / "PROF_2_3_Z", -1, ["msprof_1.json"])  # rank_id -1: unknown
    got = {p.root: (p.rank, p.files) for p in open_bundle(tmp_path).profiles}
    out = f"{prof}/mindstudio_profiler_output/msprof_slice_"
    assert got == {
        prof: (3, {"trace": out + "0_1.json", "trace.1": out + "2_1.json",
                   "trace.2": out + "10_1.json", "info": f"{prof}/device_3/info.json.3",
                   "communication": f"{prof}/analyze/communication.json"}),
        "x_ascend_pt": (7, {"info": "x_ascend_pt/profiler_info_7.json",
                            "trace": "x_ascend_pt/PROF_1_2_X/mindstudio_profiler_output/"
                                     "msprof_1.json",
                            "communication": "x_ascend_pt/PROF_1_2_X/analyze/communication.json"}),
        "y_ascend_pt": (8, {"info": "y_ascend_pt/profiler_info_8.json",
                            "communication": "y_ascend_pt/ASCEND_PROFILER_OUTPUT/"
                                             "communication.json"}),
        "PROF_2_3_Z": (None, {"trace": "PROF_2_3_Z/mindstudio_profiler_output/msprof_1.json",
                              "info": "PROF_2_3_Z/device_3/info.json.3",
                              "communication": "PROF_2_3_Z/analyze/communication.json"}),
    }


def test_single_file_bundle(tmp_path):
    bundle = open_bundle(real("kineto/gloo_pp2_dp2/rank3.json"))
    assert summary(bundle) == [("kineto", "rank3.json", {"trace": "rank3.json"}, 3)]
    assert bundle.read("rank3.json") == (GLOO / "rank3.json").read_bytes()
    (tmp_path / "ground_truth.json").write_text("{}")
    with pytest.raises(TraceError, match="ground_truth.json: JSON, but not a Kineto trace"):
        open_bundle(tmp_path / "ground_truth.json")


@pytest.mark.parametrize(("content", "said"), [
    (b'{"a": 1}', "JSON, but not a Kineto trace (no traceEvents)"),
    (b"[1, 2, 3]", "a JSON array, but not a trace (Kineto writes an object with traceEvents, "
                   "Ascend an array of events with decimal-string ts)"),
    (b"epoch,loss\n1,0.3\n", "not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b'{"traceEvents": [{"ph": "X", "na', None),  # a cut trace: for its parser to say
])
def test_a_json_named_by_itself_says_what_it_is(tmp_path, content, said):
    for name, data in (("config.json", content), ("config.json.gz", gzip.compress(content))):
        (tmp_path / name).write_bytes(data)
        if said is None:
            assert open_bundle(tmp_path / name).profiles[0].format == "kineto"
            continue
        with pytest.raises(TraceError) as error:
            open_bundle(tmp_path / name)
        assert str(error.value) == f"{tmp_path / name}: {said}"


def test_a_rank_named_file_that_is_no_profile_is_named_as_unreadable(tmp_path):
    folder = _gloo_copy(tmp_path / "job")
    (folder / "rank3.json").write_text("not json at all")
    (folder / "worker0.1712.pt.trace.json").write_text('{"step": 3}')
    (folder / "config.json").write_text('{"a": 1}')  # not named like a profile: ignored
    bundle = open_bundle(folder)
    assert [p.rank for p in bundle.profiles] == [0, 1, 2]
    assert bundle.warnings == [
        "rank3.json: named like a rank's profile but unreadable: not JSON (Expecting value: "
        "line 1 column 1 (char 0)); left out",
        "worker0.1712.pt.trace.json: named like a rank's profile but unreadable: JSON, but not "
        "a Kineto trace (no traceEvents); left out",
        "ignored 1 JSON file(s) that are not profiles: config.json"]


# -- fingerprints --------------------------------------------------------------------------------
def test_fingerprint_follows_member_changes(tmp_path):
    folder = _gloo_copy(tmp_path / "job")
    names = [f"rank{r}.json" for r in range(4)]
    before = open_bundle(folder).fingerprint(names)
    rank0 = open_bundle(folder).fingerprint(["rank0.json"])
    assert open_bundle(folder).fingerprint(reversed(names)) == before
    (folder / "rank1.json").write_bytes(b"{}")
    os.utime(folder / "rank1.json", ns=(1, 1))
    bundle = open_bundle(folder)
    assert bundle.fingerprint(names) != before
    assert bundle.fingerprint(["rank0.json"]) == rank0


def test_zip_fingerprint_changes_with_a_member(tmp_path):
    files = gloo_files()
    path = make_zip(tmp_path / "b.zip", list(files.items()))
    before = open_bundle(path).fingerprint(files)
    files["rank2.json"] = files["rank2.json"].replace(b'"rank": 2', b'"rank": 9')
    make_zip(path, list(files.items()))
    assert open_bundle(path).fingerprint(files) != before
