"""Any tree of this project's objects, arrays and tables stored in a folder, and read back.

`save(value, folder)` stores a tree made of None, bools, ints, floats, strings, lists, tuples,
sets, dicts, paths, numpy arrays and scalars, pandas DataFrames / Series / Index, and objects of
this project's classes (their attributes, whatever they are), keeping shared references shared:
what two attributes point to is one object again once read (but for plain JSON: lists and
str-keyed dicts of JSON scalars are stored as they are, shared by value only). Objects named in
`outside` are stored by name and handed back by the reader (a loaded `Trace`, say, that has a
cache of its own).

Two files: `skeleton.json` (the tree, each array a reference into the other file) and
`arrays.bin` (numeric buffers, 64-byte aligned), which `load` memory-maps copy-on-write: arrays
cost the pages read, stay writable, and a write never reaches the file. Strings are stored once per
distinct value (object arrays and Categoricals by their codes). Nothing read is code: a class is
named by module and qualified name, imported only from this project's packages, and rebuilt
without running its constructor; a file that does not describe such a tree raises
`SnapshotError`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import mmap
import os
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import orjson
import pandas as pd

SKELETON, ARRAYS = "skeleton.json", "arrays.bin"
FORMAT = 1
OURS = ("tracegraph.", "parsers.", "reports.")  # the packages whose classes may be rebuilt
_ALIGN = 64
_NUMERIC = frozenset("biufcmM")  # dtype kinds stored as raw buffers


class SnapshotError(Exception):
    """The tree cannot be stored, or the files do not hold one this code can read."""


def save(value: object, folder: Path, outside: dict[str, object] | None = None) -> None:
    """Store `value` in `folder` (created; its two files overwritten)."""
    writer = _Writer({id(v): name for name, v in (outside or {}).items()})
    root = writer.node(value)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ARRAYS, "wb") as out:
        for buffer in writer.buffers:
            out.write(buffer)
    try:
        skeleton = orjson.dumps({"format": FORMAT, "root": root})
    except TypeError as error:  # a str subclass, say, that JSON does not take
        raise SnapshotError(f"cannot store: {error}") from None
    (folder / SKELETON).write_bytes(skeleton)


def load(folder: Path, outside: dict[str, object] | None = None) -> Any:
    """The tree stored in `folder`, `outside` objects put back by name."""
    try:
        skeleton = orjson.loads((folder / SKELETON).read_bytes())
        if not isinstance(skeleton, dict) or skeleton.get("format") != FORMAT:
            raise SnapshotError(f"{folder}: not a snapshot of format {FORMAT}")
        with open(folder / ARRAYS, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
        return _Reader(data, outside or {}).node(skeleton["root"])
    except SnapshotError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            ImportError, orjson.JSONDecodeError) as error:
        raise SnapshotError(f"{folder}: {type(error).__name__}: {error}") from None


# --- writing ---------------------------------------------------------------------------------
class _Writer:
    def __init__(self, outside: dict[int, str]) -> None:
        self.outside = outside
        self.buffers: list[bytes | memoryview] = []
        self.size = 0
        self.seen: dict[int, int] = {}  # id of a stored container or object -> its number
        self.keep: list[object] = []  # what `seen` refers to stays alive while writing

    def node(self, value: object) -> object:
        """The JSON node of `value`."""
        if isinstance(value, np.generic):  # before float: np.float64 is one
            return {"scalar": [value.dtype.str, self.node(value.item())]}
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int):
            return value if -2**63 <= value < 2**63 else {"big": str(value)}
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": repr(value)}
        if id(value) in self.outside:
            return {"outside": self.outside[id(value)]}
        if id(value) in self.seen:
            return {"ref": self.seen[id(value)]}
        if isinstance(value, PurePath):
            return {"path": str(value)}
        if value is pd.NA:
            return {"pandas": "NA"}
        if isinstance(value, list | dict) and _json(value):
            return {"json": value}  # as JSON holds it: read back at orjson's speed
        number = self.seen[id(value)] = len(self.seen)
        self.keep.append(value)
        return {"id": number, **self._body(value)}

    def _body(self, value: object) -> dict[str, object]:
        if isinstance(value, list) and _one_class(value) and self._unseen(value):
            return self._objects(value)
        if isinstance(value, list | tuple | set | frozenset):
            kind = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}[type(value)]
            return {kind: [self.node(v) for v in value]}
        if isinstance(value, dict):
            return self._dict(value)
        if isinstance(value, np.ndarray):
            return {"array": self.array(value)}
        if isinstance(value, pd.DataFrame):
            return {"frame": {"columns": [self.node(c) for c in value.columns],
                              "data": [self.values(value.iloc[:, k])
                                       for k in range(value.shape[1])],
                              "index": self.index(value.index)}}
        if isinstance(value, pd.Series):
            return {"series": {"name": self.node(value.name), "values": self.values(value),
                               "index": self.index(value.index)}}
        if isinstance(value, pd.Index):
            return {"index": self.index(value)}
        return {"object": _class_name(type(value)),
                "state": {name: self.node(v) for name, v in vars(value).items()}}

    def _unseen(self, items: list) -> bool:
        """Whether no item was stored before, nor is outside, nor comes twice."""
        ids = {id(item) for item in items}
        return len(ids) == len(items) and not any(
            i in self.seen or i in self.outside for i in ids)

    def _objects(self, value: list) -> dict[str, object]:
        """A list of objects of one class (bubbles, path segments: thousands), column by column:
        each object numbered first, so what their attributes hold may point back to them."""
        cls = type(value[0])
        first = len(self.seen)
        for item in value:
            self.seen[id(item)] = len(self.seen)
            self.keep.append(item)
        names = list(vars(value[0]))
        columns = [[getattr(item, name) for item in value] for name in names]
        return {"objects": _class_name(cls), "first": first, "names": names,
                "columns": [{"plain": c} if all(_plain(v) for v in c)
                            else {"nodes": [self.node(v) for v in c]} for c in columns]}

    def _dict(self, value: dict) -> dict[str, object]:
        """A dict; int -> int and int -> list of ints (op maps, millions of entries) as arrays."""
        keys = list(value)
        if keys and all(type(k) is int for k in keys):
            items = list(value.values())
            if all(type(v) is int for v in items):
                return {"int_map": [self.array(np.array(keys, dtype=np.int64)),
                                    self.array(np.array(items, dtype=np.int64))]}
            if all(type(v) is list and all(type(x) is int for x in v) for v in items):
                flat = np.array([x for v in items for x in v], dtype=np.int64)
                return {"int_lists": [self.array(np.array(keys, dtype=np.int64)),
                                      self.array(np.array([len(v) for v in items],
                                                          dtype=np.int64)),
                                      self.array(flat)]}
        return {"dict": [[self.node(k), self.node(v)] for k, v in value.items()]}

    def array(self, value: np.ndarray) -> dict[str, object]:
        """A numpy array: numeric as a buffer, objects as codes of their distinct values."""
        if value.dtype.kind in _NUMERIC:
            return {"buffer": self._buffer(value), "dtype": value.dtype.str,
                    "shape": list(value.shape)}
        if value.dtype != object:
            raise SnapshotError(f"cannot store an array of {value.dtype}")
        flat = value.ravel()
        try:
            codes, uniques = pd.factorize(flat)
        except TypeError:  # unhashable items (lists): one by one
            return {"items": [self.node(v) for v in flat], "shape": list(value.shape)}
        uniques = list(uniques)
        missing = np.flatnonzero(codes < 0)
        if len(missing):  # None, NaN, pd.NA ... told apart: pandas counts them all one
            kinds: dict[tuple[type, bool], int] = {}
            for k in missing.tolist():
                item = flat[k]
                kind = (type(item), item is None)
                if kind not in kinds:
                    kinds[kind] = len(uniques)
                    uniques.append(item)
                codes[k] = kinds[kind]
        return {"codes": self.array(codes.astype(np.int32)),
                "uniques": [self.node(u) for u in uniques], "shape": list(value.shape)}

    def values(self, series: pd.Series) -> dict[str, object]:
        """A column: numpy-typed, Categorical (codes and categories) or another pandas type
        (rebuilt from its values and the dtype's name)."""
        dtype = series.dtype
        if isinstance(dtype, np.dtype):
            return {"numpy": self.array(series.to_numpy())}
        if isinstance(dtype, pd.CategoricalDtype):
            return {"categorical": {"codes": self.array(series.cat.codes.to_numpy()),
                                    "categories": self.index(dtype.categories),
                                    "ordered": bool(dtype.ordered)}}
        return {"extension": {"dtype": str(dtype),
                              "values": self.array(series.to_numpy(dtype=object))}}

    def index(self, index: pd.Index) -> dict[str, object]:
        if isinstance(index, pd.RangeIndex):
            return {"range": [index.start, index.stop, index.step], "name": self.node(index.name)}
        if isinstance(index, pd.MultiIndex):
            raise SnapshotError("cannot store a MultiIndex")
        values = pd.Series(index, dtype=index.dtype, copy=False)  # to_series() infers a dtype
        return {"values": self.values(values), "name": self.node(index.name)}

    def _buffer(self, value: np.ndarray) -> int:
        """Append the array's bytes (64-byte aligned); their offset."""
        pad = -self.size % _ALIGN
        if pad:
            self.buffers.append(bytes(pad))
        offset = self.size + pad
        data = np.ascontiguousarray(value).view(np.uint8).ravel()
        self.buffers.append(memoryview(data))
        self.size = offset + data.nbytes
        return offset


# --- reading ---------------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: mmap.mmap | bytes, outside: dict[str, object]) -> None:
        self.data, self.outside = data, outside
        self.made: dict[int, object] = {}

    def node(self, node: object) -> Any:
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if not isinstance(node, dict):
            raise SnapshotError(f"unexpected node {type(node).__name__}")
        if "ref" in node:
            return self.made[node["ref"]]
        if "outside" in node:
            return self.outside[node["outside"]]
        if "big" in node:
            return int(node["big"])
        if "float" in node:
            return float(node["float"])
        if "path" in node:
            return Path(node["path"])
        if node.get("pandas") == "NA":
            return pd.NA
        if "json" in node:
            return node["json"]
        if "scalar" in node:
            dtype, value = node["scalar"]
            return np.dtype(dtype).type(self.node(value))
        return self._made(node)

    def _made(self, node: dict) -> Any:
        number = node["id"]
        if "object" in node:  # made before its state: the state may point back to it
            cls = _class(node["object"])
            made = self.made[number] = cls.__new__(cls)
            made.__dict__.update({k: self.node(v) for k, v in node["state"].items()})
            _check_fields(made)
            return made
        if "list" in node:
            made = self.made[number] = []
            made.extend(self.node(v) for v in node["list"])
            return made
        if "objects" in node:
            return self._objects(number, node)
        if "dict" in node:
            made = self.made[number] = {}
            made.update((_hashable(self.node(k)), self.node(v)) for k, v in node["dict"])
            return made
        made = self.made[number] = self._value(node)
        return made

    def _objects(self, number: int, node: dict) -> list:
        made = self.made[number] = []
        first, names = int(node["first"]), node["names"]
        count = len(node["columns"][0]["plain"] if "plain" in node["columns"][0]
                    else node["columns"][0]["nodes"]) if names else 0
        cls = _class(node["objects"])
        for k in range(count):
            made.append(cls.__new__(cls))
            self.made[first + k] = made[-1]
        columns = [c["plain"] if "plain" in c else [self.node(v) for v in c["nodes"]]
                   for c in node["columns"]]
        if any(len(c) != count for c in columns):
            raise SnapshotError("columns of different lengths")
        for item, row in zip(made, zip(*columns, strict=True), strict=True):
            item.__dict__.update(zip(names, row, strict=True))
        for item in made[:1]:
            _check_fields(item)
        return made

    def _value(self, node: dict) -> Any:
        if "tuple" in node:
            return tuple(self.node(v) for v in node["tuple"])
        if "set" in node:
            return {_hashable(self.node(v)) for v in node["set"]}
        if "frozenset" in node:
            return frozenset(_hashable(self.node(v)) for v in node["frozenset"])
        if "int_map" in node:
            keys, values = (self.array(a) for a in node["int_map"])
            return dict(zip(keys.tolist(), values.tolist(), strict=True))
        if "int_lists" in node:
            keys, sizes, flat = (self.array(a) for a in node["int_lists"])
            bounds = np.cumsum(sizes).tolist()
            flat_list = flat.tolist()
            return {k: flat_list[end - size:end]
                    for k, size, end in zip(keys.tolist(), sizes.tolist(), bounds, strict=True)}
        if "array" in node:
            return self.array(node["array"])
        if "frame" in node:
            frame = node["frame"]
            columns = [self.node(c) for c in frame["columns"]]
            index = self.index(frame["index"])
            data = {k: pd.Series(values, index=index, dtype=values.dtype, copy=False)
                    for k, values in enumerate(map(self.values, frame["data"]))}
            return pd.DataFrame(data, copy=False).set_axis(columns, axis=1)
        if "series" in node:
            series = node["series"]
            values = self.values(series["values"])
            return pd.Series(values, index=self.index(series["index"]),
                             name=self.node(series["name"]), dtype=values.dtype, copy=False)
        if "index" in node:
            return self.index(node["index"])
        raise SnapshotError(f"unknown node {sorted(node)}")

    def array(self, node: dict) -> np.ndarray:
        shape = tuple(int(n) for n in node["shape"])
        if "buffer" in node:
            dtype = np.dtype(node["dtype"])
            if dtype.kind not in _NUMERIC:
                raise SnapshotError(f"a buffer of {dtype}")
            count = math.prod(shape)
            if not count:
                return np.empty(shape, dtype=dtype)
            offset = int(node["buffer"])
            if offset < 0 or offset + count * dtype.itemsize > len(self.data):
                raise SnapshotError("an array runs past the end of its file")
            return np.frombuffer(self.data, dtype, count, offset).reshape(shape)
        if "items" in node:
            out = np.empty(len(node["items"]), dtype=object)
            out[:] = [self.node(v) for v in node["items"]] or out[:0]
            return out.reshape(shape)
        uniques = np.empty(len(node["uniques"]) + 1, dtype=object)
        uniques[:-1] = [self.node(u) for u in node["uniques"]] or uniques[:0]
        codes = self.array(node["codes"])
        if len(codes) and (codes.min() < 0 or codes.max() >= len(uniques) - 1):
            raise SnapshotError("codes outside their values")
        return uniques[codes].reshape(shape)

    def values(self, node: dict) -> Any:
        if "numpy" in node:
            return self.array(node["numpy"])
        if "categorical" in node:
            coded = node["categorical"]
            dtype = pd.CategoricalDtype(self.index(coded["categories"]), coded["ordered"])
            return pd.Categorical.from_codes(self.array(coded["codes"]), dtype=dtype)
        extension = node["extension"]
        return pd.array(self.array(extension["values"]), dtype=extension["dtype"])

    def index(self, node: dict) -> pd.Index:
        name = self.node(node["name"])
        if "range" in node:
            return pd.RangeIndex(*node["range"], name=name)
        values = self.values(node["values"])
        return pd.Index(values, name=name, dtype=values.dtype)


def _class_name(cls: type) -> str:
    """`module:qualname` of one of this project's classes."""
    if not cls.__module__.startswith(OURS) or "__dict__" not in dir(cls):
        raise SnapshotError(f"cannot store a {cls.__module__}.{cls.__qualname__}")
    return f"{cls.__module__}:{cls.__qualname__}"


def _one_class(items: list) -> bool:
    """Whether `items` are objects of one of this project's classes, with the same attributes."""
    if not items:
        return False
    cls = type(items[0])
    if not cls.__module__.startswith(OURS) or not hasattr(items[0], "__dict__"):
        return False
    names = list(vars(items[0]))
    return all(type(item) is cls and list(vars(item)) == names for item in items)


def _json(value: object) -> bool:
    """Whether `value` is a tree of lists, str-keyed dicts and `_plain` values, which JSON
    gives back as they were (but for identity: such a tree is shared by value only)."""
    if type(value) is list:
        return all(_json(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _json(v) for k, v in value.items())
    return _plain(value)


def _plain(value: object) -> bool:
    """A value JSON holds as it is (and gives back as it was)."""
    return value is None or type(value) in (bool, str) or (
        type(value) is int and -2**63 <= value < 2**63) or (
        type(value) is float and math.isfinite(value))


@functools.cache
def _class(name: str) -> type:
    """The class `module:qualname`, one of this project's only (rebuilt without __init__)."""
    module, _, qualname = name.partition(":")
    if not module.startswith(OURS) or "<" in qualname:
        raise SnapshotError(f"{name}: not a class of this project")
    cls: object = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    if not isinstance(cls, type):
        raise SnapshotError(f"{name}: not a class")
    return cls


def _check_fields(made: object) -> None:
    """A dataclass instance must have every field its class declares now."""
    if dataclasses.is_dataclass(made):
        missing = [f.name for f in dataclasses.fields(made) if f.name not in made.__dict__]
        if missing:
            raise SnapshotError(f"{type(made).__qualname__} lacks {', '.join(missing)}")


def _hashable(value: object) -> object:
    """Keys come back as they went in, but a JSON list is never a key: a tuple is."""
    return tuple(value) if isinstance(value, list) else value
