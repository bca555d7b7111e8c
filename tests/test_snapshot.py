"""Snapshots: any tree of the project's objects, arrays and tables, stored and read back whole;
a file that does not hold one is refused, never run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from tracegraph import snapshot
from tracegraph.analysis.blame import Bubble, Interval
from tracegraph.analysis.critical_path import PathSegment
from tracegraph.snapshot import SnapshotError


def same(a: object, b: object, seen: set | None = None) -> bool:
    """Deep equality over what snapshots hold (NaN equals NaN; arrays by dtype and values;
    frames by dtypes, index and values; objects by class and attributes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and all(
            same(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)) \
            if a.dtype == object else (a.dtype == b.dtype and np.array_equal(a, b, equal_nan=
                                                                            a.dtype.kind == "f"))
    if isinstance(a, pd.DataFrame | pd.Series | pd.Index):
        return a.equals(b) and (a.dtypes == b.dtypes).all() if isinstance(a, pd.DataFrame) \
            else a.equals(b) and a.dtype == b.dtype
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set | frozenset):
        return a == b
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dict__"):
        seen = seen if seen is not None else set()
        if id(a) in seen:
            return True
        seen.add(id(a))
        return same(vars(a), vars(b))
    return a == b


def round_trip(value: object, folder: Path, outside: dict | None = None) -> object:
    snapshot.save(value, folder, outside)
    return snapshot.load(folder, outside)


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "i": np.arange(5, dtype=np.int64),
        "f": [0.5, math.nan, 1e300, -0.0, 2.0],
        "b": [True, False, True, True, False],
        "cat": pd.Categorical(["x", "y", "x", None, "y"],
                              categories=pd.Index(["y", "x"], dtype=object)),
        "arrow": pd.array(["p", None, "q", "p", ""], dtype="string[pyarrow]"),
        "obj": np.array(["s", None, "t", "s", "u"], dtype=object),
        "lists": pd.Series([[1, 2], [3], [], [4, 5, 6], [7]], dtype=object),
    }, index=pd.Index([10, 11, 12, 13, 14], name="op"))


def test_every_kind_of_value_comes_back(tmp_path: Path) -> None:
    value = {
        "scalars": [None, True, 3, -2**70, 1.5, math.inf, -math.inf, math.nan, "µs", ""],
        "numpy": [np.int32(7), np.float32(0.9), np.bool_(True), np.float64(0.25), np.int64(3)],
        "containers": (1, {2, 3}, frozenset({4}), {"k": [1, 2]}, {(1, 2, "x"): "edge"}),
        "maps": ({1: 5, 2: -1}, {7: [1, 2, 3], 8: []}, {}),
        "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.zeros(0, dtype=np.int64),
                   np.array([1.5, np.nan]), np.array(["a", None, "a", math.nan], dtype=object),
                   np.array([[1], [2, 3]] + [None], dtype=object)[:2]],
        "frame": _frame(),
        "series": pd.Series([1, 2], index=pd.RangeIndex(5, 7), name="n"),
        "path": Path("/some/where"),
    }
    assert same(round_trip(value, tmp_path / "s"), value)


def test_project_objects_and_shared_references(tmp_path: Path) -> None:
    interval = Interval(1, 5, "pp_p2p", 3, "stream 7", "send", op=9)
    bubbles = [Bubble(0, "stream 7", 0, 10, "idle", 1, [interval], op=4),
               Bubble(1, "stream 7", 2, 9, "EVENT_WAIT", 1, [], confidence=0.6,
                      evidence="inferred")]
    segment = PathSegment(3, "stream 7", "send", "transfer", "pp_p2p", 1, 5)
    shared = np.arange(4)
    tree = {"bubbles": bubbles, "again": bubbles[0], "path": [segment, segment],
            "a": shared, "b": shared, "interval": interval}
    back = round_trip(tree, tmp_path / "s")
    assert same(back, tree)
    assert back["again"] is back["bubbles"][0]  # one object, as stored
    assert back["b"] is back["a"] and back["path"][0] is back["path"][1]
    assert back["interval"] is back["bubbles"][0].intervals[0]
    assert back["bubbles"][0].root is back["interval"]  # methods work on rebuilt objects


def test_outside_objects_are_handed_back_not_stored(tmp_path: Path) -> None:
    big = pd.DataFrame({"x": np.arange(100_000)})
    tree = {"trace": big, "kept": [1, 2]}
    snapshot.save(tree, tmp_path / "s", {"trace": big})
    assert (tmp_path / "s" / snapshot.ARRAYS).stat().st_size < 1_000  # the frame was not stored
    other = pd.DataFrame({"y": [1]})
    assert snapshot.load(tmp_path / "s", {"trace": other})["trace"] is other


def test_arrays_are_mapped_writable_and_the_file_stays(tmp_path: Path) -> None:
    snapshot.save({"a": np.arange(1000, dtype=np.int64)}, tmp_path / "s")
    first = snapshot.load(tmp_path / "s")["a"]
    first[:] = -1  # copy-on-write: this process only
    assert snapshot.load(tmp_path / "s")["a"].tolist() == list(range(1000))


def test_what_cannot_be_stored_says_so(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot store"):
        snapshot.save({"x": object()}, tmp_path / "s")
    with pytest.raises(SnapshotError, match="cannot store"):
        snapshot.save(pd.Series([1], index=pd.MultiIndex.from_tuples([(1, 2)])), tmp_path / "t")


def _stored(tmp_path: Path, value: object) -> tuple[Path, dict]:
    folder = tmp_path / "s"
    snapshot.save(value, folder)
    return folder, orjson.loads((folder / snapshot.SKELETON).read_bytes())


def _rewrite(folder: Path, skeleton: dict) -> None:
    (folder / snapshot.SKELETON).write_bytes(orjson.dumps(skeleton))


def test_a_class_outside_the_project_is_never_imported(tmp_path: Path) -> None:
    folder, skeleton = _stored(tmp_path, PathSegment(0, "l", "n", "wait", "c", 0, 1))
    for name in ("os:system", "subprocess:Popen", "builtins:eval",
                 "tracegraph.snapshot:<locals>.x", "tracegraph.snapshot:save"):
        skeleton["root"]["object"] = name
        _rewrite(folder, skeleton)
        with pytest.raises(SnapshotError):
            snapshot.load(folder)


def test_damaged_files_are_refused(tmp_path: Path) -> None:
    folder, skeleton = _stored(tmp_path, {"a": np.arange(100), "s": np.array(["x", "y"] * 5,
                                                                             dtype=object)})
    data = (folder / snapshot.ARRAYS).read_bytes()
    (folder / snapshot.ARRAYS).write_bytes(data[:100])  # truncated
    with pytest.raises(SnapshotError, match="past the end"):
        snapshot.load(folder)
    (folder / snapshot.ARRAYS).write_bytes(data)
    items = dict(skeleton["root"]["dict"][1][1]["array"])
    items["uniques"] = ["x"]  # codes now point past their values
    skeleton["root"]["dict"][1][1]["array"] = items
    _rewrite(folder, skeleton)
    with pytest.raises(SnapshotError, match="codes"):
        snapshot.load(folder)
    (folder / snapshot.SKELETON).write_bytes(b'{"format": 1, "root": {"id": 0, "lis')
    with pytest.raises(SnapshotError):
        snapshot.load(folder)
    (folder / snapshot.SKELETON).write_bytes(b'{"format": 99, "root": null}')
    with pytest.raises(SnapshotError, match="format"):
        snapshot.load(folder)


def test_an_object_missing_a_field_of_its_class_is_refused(tmp_path: Path) -> None:
    """What an older version stored for a class that has since gained a field."""
    for value in (PathSegment(0, "l", "n", "wait", "c", 0, 1),
                  [Interval(1, 5, "c", 3, "l", "n"), Interval(2, 6, "c", 3, "l", "n")]):
        folder, skeleton = _stored(tmp_path, value)
        root = skeleton["root"]
        if "state" in root:
            del root["state"]["category"]
        else:
            index = root["names"].index("category")
            del root["names"][index], root["columns"][index]
        _rewrite(folder, skeleton)
        with pytest.raises(SnapshotError, match="lacks category"):
            snapshot.load(folder)
