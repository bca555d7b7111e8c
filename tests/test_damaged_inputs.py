"""The damaged inputs a long fuzz run found analysed without a word (or with a traceback): each
now gets its warning or its one-line error. Mutants of the real profiles, written under
tmp_path; tests/fuzz.py draws the same classes at random."""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tracegraph
from parsers.base import TraceError
from tests.conftest import REAL
from tests.fuzz import _end_cut, _huge_claim

GLOO = REAL / "kineto" / "gloo_pp2_dp2"
PP2DP2 = REAL / "ascend" / "torch_npu_pp2dp2_level2_comm"
DDP8 = REAL / "ascend" / "torch_npu_ddp8_level1"


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / source.name))


def _load(bundle: Path) -> tracegraph.Trace:
    return tracegraph.load(bundle, use_cache=False, jobs=1)


def _edit_metadata(folder: Path, edit) -> None:
    for path in sorted(folder.rglob("profiler_metadata.json")):
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))


def test_a_group_member_beyond_int64_is_no_peer(tmp_path: Path) -> None:
    """Every 2-member group's other member stated as 2**64: P2P peers come from those groups."""
    bundle = _copy(PP2DP2, tmp_path)

    def huge(doc: dict) -> None:
        for group in doc["parallel_group_info"].values():
            if len(group["global_ranks"]) == 2:
                group["global_ranks"] = [min(group["global_ranks"]), 2**64]

    _edit_metadata(bundle, huge)
    trace = _load(bundle)
    peers = trace.events["peer"].to_numpy()
    assert len(peers) and (peers <= np.iinfo(np.int32).max).all()
    assert any("member ranks of group" in w and "unreadable" in w for w in trace.warnings)


def test_two_profiler_info_files_in_one_folder(tmp_path: Path) -> None:
    bundle = _copy(PP2DP2, tmp_path)
    folder = bundle / "rank_0_ascend_pt"
    shutil.copy(folder / "profiler_info_0.json", folder / "profiler_info_7.json")
    assert ("rank_0_ascend_pt: 2 profiler_info files (profiler_info_0.json, "
            "profiler_info_7.json) in one profile folder; its rank and settings are read from "
            "profiler_info_0.json") in _load(bundle).warnings


def _tar(tmp_path: Path, compression: str) -> Path:
    path = tmp_path / f"gloo.tar{'.' + compression if compression else ''}"
    with tarfile.open(path, f"w:{compression}") as tar:
        tar.add(GLOO, "gloo")
    return path


@pytest.mark.parametrize("compression", ["", "gz", "xz", "bz2"])
def test_an_archive_cut_after_its_last_member(tmp_path: Path, compression: str) -> None:
    """Every member whole, the archive's end missing: the end-of-archive blocks of a plain tar,
    the last bytes (end marker, checksum) of a compressed stream."""
    archive = _tar(tmp_path, compression)
    _end_cut(archive, tail=8)
    trace = _load(archive)
    assert len(trace.ranks) == 4
    assert [w for w in trace.warnings if w.startswith(f"{archive}: archive truncated")]


def test_a_member_claiming_8_gib_with_short_data(tmp_path: Path) -> None:
    archive = _tar(tmp_path, "")
    _huge_claim(archive)
    trace = _load(archive)
    assert len(trace.ranks) == 4
    assert (f"{archive}: archive truncated inside member huge.bin; members after the cut are "
            "missing") in trace.warnings


def test_ascend_ranks_stating_different_world_sizes(tmp_path: Path) -> None:
    bundle = _copy(PP2DP2, tmp_path)
    meta = bundle / "rank_1_ascend_pt" / "profiler_metadata.json"
    doc = json.loads(meta.read_text())
    doc["distributed_args"]["world_size"] = 8
    meta.write_text(json.dumps(doc))
    warnings = _load(bundle).warnings
    assert any(w.startswith("the ranks state different world sizes: 4 (rank(s) 0, 2, 3), 8 "
                            "(rank(s) 1)") for w in warnings), warnings


@pytest.mark.parametrize("prefix", [b"garbage", b"\xef\xbb\xbf", b"\x00\x01"])
def test_bytes_before_communication_json(tmp_path: Path, prefix: bytes) -> None:
    bundle = _copy(DDP8, tmp_path)
    comm = bundle / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "communication.json"
    comm.write_bytes(prefix + comm.read_bytes())
    trace = _load(bundle)  # rank 0 left out, said; rank 1 read (tests/test_unreadable_rank.py)
    assert list(trace.ranks["rank"]) == [1]
    assert any(w.startswith("rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/communication.json: invalid "
                            "JSON") and "rank0_ascend_pt is left out" in w for w in trace.warnings)
    shutil.rmtree(bundle / "rank1_ascend_pt")  # no other rank: the error
    with pytest.raises(TraceError, match=r"^rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/"
                                         r"communication\.json: invalid JSON"):
        _load(bundle)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("dur", -0.3, "1 negative durations set to 0"),
    ("dur", -1e-9, "1 negative durations set to 0"),  # rounds to 0 ns: negative all the same
    ("ts", "1.2.3", "dropped 1 events (1 with an unreadable start)")])
@pytest.mark.parametrize("fmt", ["kineto", "ascend"])
def test_one_event_with_a_negative_or_unreadable_time(tmp_path: Path, key: str, value: object,
                                                      said: str, fmt: str) -> None:
    bundle = _copy(GLOO if fmt == "kineto" else DDP8, tmp_path)
    path = bundle / "rank1.json" if fmt == "kineto" else next(bundle.rglob("trace_view.json"))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"] if fmt == "kineto" else doc
    [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"][5][key] = value
    path.write_text(json.dumps(doc))
    rank = "rank 1: rank1.json" if fmt == "kineto" else "rank 0: rank0_ascend_pt"
    assert f"{rank}: damaged values: {said}" in _load(bundle).warnings


def test_a_gzip_stream_without_its_trailer(tmp_path: Path) -> None:
    bundle = tmp_path / "gz"
    bundle.mkdir()
    for path in sorted(GLOO.iterdir()):
        data = gzip.compress(path.read_bytes())
        (bundle / f"{path.name}.gz").write_bytes(data[:-8] if path.name == "rank1.json" else data)
    trace = _load(bundle)
    size = len((GLOO / "rank1.json").read_bytes())
    assert (f"rank 1: {bundle}: member rank1.json.gz: truncated; kept the {size} bytes that "
            "could be read") in trace.warnings
    assert len(trace.ranks) == 4


def _zip(tmp_path: Path, extra: str, data: bytes) -> Path:
    path = tmp_path / "gloo.zip"
    with zipfile.ZipFile(path, "w") as out:
        for member in sorted(GLOO.iterdir()):
            out.write(member, f"gloo/{member.name}")
        out.writestr(zipfile.ZipInfo(extra), data)
    return path


def test_a_zip_folder_entry_holding_data(tmp_path: Path) -> None:
    archive = _zip(tmp_path, "gloo/extra/", b"bytes a folder cannot hold")
    trace = _load(archive)
    assert f"{archive}: member gloo/extra/: a folder entry holding 26 bytes; ignored" in (
        trace.warnings)
    assert len(trace.ranks) == 4


def test_a_zip_member_named_from_the_home_folder(tmp_path: Path) -> None:
    archive = _zip(tmp_path, "~/.bashrc", b"alias ls=rm")
    with pytest.raises(TraceError, match=r"unsafe member '~/.bashrc' \(home-relative path\)"):
        _load(archive)
