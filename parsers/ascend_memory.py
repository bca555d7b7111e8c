"""Ascend memory files -> the normalized memory table (tracegraph.schema.MEMORY).

torch_npu / MindSpore with `profile_memory=True` write, in `ASCEND_PROFILER_OUTPUT/`:
- `memory_record.csv`: the allocator's totals after every allocation and release, per component
  (`PTA`, `PTA+GE`, `APP`; MindSpore `MindSpore`, `GE`); `Timestamp(us)`, `Total Allocated`,
  `Total Reserved`, `Total Active` (MB in torch_npu, KB in older CANN; the unit is in the header);
- `operator_memory.csv`: one row per operator allocation, its size and the totals at allocation
  and at release; it becomes two rows (+size, then −size at release, when released);
- `npu_module_mem.csv`: each CANN module's reserved memory, sampled every ~20 ms.
Real files quote nothing and end timestamps with a tab (`1764246877082702.440\\t`).
"""

from __future__ import annotations

import io
import re
from functools import partial

import numpy as np
import pandas as pd
import pyarrow as pa

from parsers.base import RankFiles, Reader
from parsers.decimal_us import DECIMAL, us_to_ns
from tracegraph import schema
from tracegraph.schema import NO_INT

ROLES = {"memory_record.csv": "memory_record", "operator_memory.csv": "operator_memory",
         "npu_module_mem.csv": "npu_module_mem"}
"""File name -> its role in RankFiles.files (and its MEMORY source name)."""
_UNIT = re.compile(r"\((KB|MB|GB|B)\)\s*$", re.IGNORECASE)
_SUFFIX = re.compile(r"\([^)]*\)\s*$")  # "(us)", "(MB)", ...
_SCALE = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
MINDSPORE_MB = 1024 * 1000  # MindSpore's viewer writes its own rows' "MB" as bytes / 1024 / 1000


def memory(files: RankFiles, read: Reader, rank: int, warnings: list[str]) -> pa.Table | None:
    """The rank's memory rows from whichever memory files its profile holds; None if none."""
    tables = []
    for role in ROLES.values():
        member = files.files.get(role)
        if member is None:
            continue
        try:
            frame = pd.read_csv(io.BytesIO(read(member)), dtype=str, keep_default_na=False)
        except (ValueError, pd.errors.ParserError) as error:
            warnings.append(f"{member}: unreadable CSV ({error}); its memory rows skipped")
            continue
        frame.columns = [c.strip() for c in frame.columns]
        frame = _exact_times(frame, member, warnings)
        try:
            columns = _READERS[role](frame, partial(_at, us_to_ns, member))
        except KeyError as missing:
            warnings.append(f"{member}: no {missing} column; its memory rows skipped")
            continue
        if role == "npu_module_mem":
            columns = _moving_modules(columns)
        rows = len(columns["start_ns"])
        tables.append(schema.memory_table(
            {**columns, "rank": np.full(rows, rank, dtype=np.int32), "source": [role] * rows},
            rows))
    return pa.concat_tables(tables) if tables else None


def _exact_times(frame: pd.DataFrame, member: str, warnings: list[str]) -> pd.DataFrame:
    """The rows whose µs times (the columns headed `(us)`) are exact decimals; the others are
    dropped with a warning (a spreadsheet's `1.69512E+15` is rounded to ten seconds)."""
    bad, examples = np.zeros(len(frame), dtype=bool), []
    for column in (c for c in frame.columns if c.lower().endswith("(us)")):
        text = frame[column].str.strip()
        wrong = (text != "") & ~text.str.fullmatch(DECIMAL)
        bad |= wrong.to_numpy()
        examples += text[wrong].head(1).tolist()
    if bad.any():
        warnings.append(f"{member}: {bad.sum()} of {len(frame)} rows skipped: their timestamps "
                        f"are not exact µs ({examples[0]!r}, rounded by a spreadsheet?)")
    return frame[~bad]


def _at(reader, member: str, values: list) -> np.ndarray:
    return reader(values, member)


def _column(frame: pd.DataFrame, name: str) -> str:
    """The header that is `name` with any unit suffix, e.g. "Total Allocated(MB)"."""
    for column in frame.columns:
        if _SUFFIX.sub("", column).strip() == name:
            return column
    raise KeyError(name)


def _bytes(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A size column in bytes (its unit from the header, MB if none); NO_INT where empty."""
    try:
        column = _column(frame, name)
    except KeyError:
        return np.full(len(frame), NO_INT, dtype=np.int64)
    unit = _UNIT.search(column)
    scale = _SCALE[unit[1].lower()] if unit else _SCALE["mb"]
    values = pd.to_numeric(frame[column].str.strip(), errors="coerce").to_numpy(np.float64)
    ok = np.isfinite(values) & (values >= 0)
    return np.where(ok, np.rint(np.where(ok, values, 0) * scale), NO_INT).astype(np.int64)


def _device(frame: pd.DataFrame) -> list[str]:
    """`NPU:0` -> "npu:0" (the column is `Device Type` or `Device`)."""
    for name in ("Device Type", "Device"):
        if name in frame:
            return frame[name].str.strip().str.lower().tolist()
    return [""] * len(frame)


def _records(frame: pd.DataFrame, us) -> dict[str, object]:
    """memory_record.csv: one sample per allocator event, per component."""
    component = frame["Component"].str.strip()
    mindspore = component.str.startswith("MindSpore").to_numpy()
    sizes = {key: _bytes(frame, f"Total {key.title()}")
             for key in ("allocated", "reserved", "active")}
    if mindspore.any() and _UNIT.search(_column(frame, "Total Allocated"))[1].lower() == "mb":
        for values in sizes.values():
            known = mindspore & (values >= 0)
            values[known] = np.rint(values[known] / (1 << 20) * MINDSPORE_MB).astype(np.int64)
    return {"start_ns": us(frame[_column(frame, "Timestamp")].tolist()), **sizes,
            "component": component.tolist(), "device": _device(frame)}


def _modules(frame: pd.DataFrame, us) -> dict[str, object]:
    """npu_module_mem.csv: each CANN module's reserved memory over time."""
    return {"start_ns": us(frame[_column(frame, "Timestamp")].tolist()),
            "reserved": _bytes(frame, "Total Reserved"),
            "component": frame["Component"].str.strip().tolist(), "device": _device(frame)}


def _moving_modules(columns: dict[str, object]) -> dict[str, object]:
    """Only the modules that ever hold memory (most of the ~80 CANN modules report 0 always)."""
    component = np.asarray(columns["component"], dtype=object)
    held = pd.Series(columns["reserved"]).groupby(component).transform("max").to_numpy() > 0
    return {k: np.asarray(v)[held] if not isinstance(v, list) else list(np.asarray(v)[held])
            for k, v in columns.items()}


def _operators(frame: pd.DataFrame, us) -> dict[str, object]:
    """operator_memory.csv: an allocation row and, once released, a release row per operator."""
    size = _bytes(frame, "Size")
    released = frame[_column(frame, "Release Time")].str.strip() != ""
    start = np.concatenate([us(frame[_column(frame, "Allocation Time")].tolist()),
                            us(frame.loc[released, _column(frame, "Release Time")].tolist())])
    device = _device(frame)
    return {"start_ns": start,
            "allocated": np.concatenate([_bytes(frame, "Allocation Total Allocated"),
                                         _bytes(frame, "Release Total Allocated")[released]]),
            "reserved": np.concatenate([_bytes(frame, "Allocation Total Reserved"),
                                        _bytes(frame, "Release Total Reserved")[released]]),
            "active": np.concatenate([_bytes(frame, "Allocation Total Active"),
                                      _bytes(frame, "Release Total Active")[released]]),
            "bytes": np.concatenate([size, np.where(size[released] >= 0, -size[released],
                                                    NO_INT)]),
            "name": [*frame["Name"], *frame.loc[released, "Name"]],
            "device": device + [d for d, r in zip(device, released, strict=True) if r]}


_READERS = {"memory_record": _records, "npu_module_mem": _modules,
            "operator_memory": _operators}
