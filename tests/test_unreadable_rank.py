"""A rank whose profile does not read (a malformed SQLite database, a JSON file that is no JSON)
is left out with one warning naming the file and why, and the other ranks are analysed; only
when no rank reads is it the one-line error. The same for one parser or several, a folder or an
archive, and the cache never keeps the rank that did not read. Damaged copies of the real
profiles, written under tmp_path."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

import tracegraph
from parsers.base import TraceError
from tests.conftest import REAL
from tests.test_hostile import cli, one_error

DB = REAL / "ascend" / "torch_npu_ddp8_db_level1"
GLOO = REAL / "kineto" / "gloo_pp2_dp2"
RANK0_DB = "rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db"
MALFORMED = f"{RANK0_DB}: database disk image is malformed"


def _halved(bundle: Path, member: str) -> None:
    path = bundle / member
    path.chmod(0o644)
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size // 2)


def _damaged_db(tmp_path: Path, *members: str) -> Path:
    bundle = Path(shutil.copytree(DB, tmp_path / "db", copy_function=shutil.copyfile))
    for member in members or (RANK0_DB,):
        _halved(bundle, member)
    return bundle


def _tar(folder: Path) -> Path:
    archive = folder.with_suffix(".tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, folder.name)
    return archive


def _left_out(trace: tracegraph.Trace, why: str) -> list[str]:
    return [w for w in trace.warnings if why in w and "is left out" in w]


@pytest.mark.parametrize(("jobs", "archive"), [(1, False), (2, False), (1, True), (2, True)])
def test_a_malformed_database_leaves_its_rank_out(tmp_path: Path, jobs: int,
                                                  archive: bool) -> None:
    bundle = _damaged_db(tmp_path)
    trace = tracegraph.load(_tar(bundle) if archive else bundle, use_cache=False, jobs=jobs)
    assert list(trace.ranks["rank"]) == [1]
    [warning] = _left_out(trace, MALFORMED)
    assert "rank 0 counts as absent" in warning
    assert len(trace.events) and set(trace.events["rank"]) == {1}


def test_the_cache_keeps_only_the_ranks_that_read(tmp_path: Path) -> None:
    bundle = _damaged_db(tmp_path)
    for _ in range(2):  # the second load takes rank 1 from the cache, and reads rank 0 again
        trace = tracegraph.load(bundle, cache_dir=tmp_path / "cache", jobs=1)
        assert list(trace.ranks["rank"]) == [1] and len(_left_out(trace, MALFORMED)) == 1
    entries = [p for p in (tmp_path / "cache").iterdir() if (p / "meta.json").is_file()]
    assert len(entries) == 1


def test_no_rank_that_reads_is_the_one_line_error(tmp_path: Path) -> None:
    bundle = _damaged_db(tmp_path, RANK0_DB,
                         "rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_1.db")
    with pytest.raises(TraceError, match=MALFORMED):
        tracegraph.load(bundle, use_cache=False, jobs=2)
    code, _, err = cli("analyze", bundle, "--no-cache")
    assert code == 2 and one_error(err).startswith(f"error: {MALFORMED}")


def test_a_kineto_rank_that_is_no_json_is_left_out_and_counted_absent(tmp_path: Path) -> None:
    bundle = Path(shutil.copytree(GLOO, tmp_path / "gloo", copy_function=shutil.copyfile))
    path = bundle / "rank3.json"
    data = path.read_bytes()
    half = len(data) // 2  # garbage mid-file: not a cut (whose complete events are kept)
    path.write_bytes(data[:half] + b"\x00garbage]]}" + data[half:])
    code, out, err = cli("analyze", bundle, "--no-cache", "--jobs", "2")
    assert code == 0
    assert f"warning: rank3.json: invalid JSON (JSON is malformed: invalid character (byte {half})"\
        in err and "rank3.json is left out (rank 3 counts as absent)" in err
    assert "absent from the bundle: 3" in err
    assert "read 3 ranks" in out
