"""Ascend memory data -> the normalized memory table (tracegraph.schema.MEMORY).

torch_npu / MindSpore with `profile_memory=True` write, in `ASCEND_PROFILER_OUTPUT/`:
- `memory_record.csv`: the allocator's totals after every allocation and release, per component
  (`PTA`, `PTA+GE`, `GE`; MindSpore `MindSpore`, `MindSpore+GE`), and the process's device memory
  (`APP`, from msprof's npu_mem); `Timestamp(us)`, `Total Allocated`, `Total Reserved`,
  `Total Active` (MB in torch_npu, KB in older CANN; the unit is in the header);
- `operator_memory.csv`: one row per operator allocation, its size and the totals at allocation
  and at release; it becomes two rows (+size, then −size at release, when released);
- `npu_module_mem.csv`: each CANN module's reserved memory, sampled every ~20 ms.
Real files quote nothing and end timestamps with a tab (`1764246877082702.440\\t`).

The `.db` export holds the same rows in tables: MEMORY_RECORD, NPU_MEM (its `app` rows are the
`APP` ones), OP_MEMORY and NPU_MODULE_MEM, times in ns and sizes in bytes. Both readers, `memory`
(the CSVs) and `database_memory` (the tables), hand each source's rows to `memory_rows` in one
form, so a `.db` export and the text export of the same run give the same rows.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from parsers.base import RankFiles, Reader
from parsers.decimal_us import DECIMAL, us_to_ns
from tracegraph import schema
from tracegraph.schema import NO_INT

if TYPE_CHECKING:
    from parsers.ascend_db import Database

ROLES = {"memory_record.csv": "memory_record", "operator_memory.csv": "operator_memory",
         "npu_module_mem.csv": "npu_module_mem"}
"""File name -> its role in RankFiles.files (and its MEMORY source name)."""
SIZES = ("allocated", "reserved", "active", "size", "release_allocated", "release_reserved",
         "release_active")
"""The size columns of a source's rows (bytes) as `memory_rows` takes them."""
AT_RELEASE = {"release_ns": "start_ns", "release_allocated": "allocated",
              "release_reserved": "reserved", "release_active": "active"}
"""An operator's release columns -> the columns of its release row."""
NO_ACTIVE = frozenset({"GE"})  # components whose allocator keeps no active total
MIB = 1 << 20
_UNIT = re.compile(r"\((KB|MB|GB|B)\)\s*$", re.IGNORECASE)
_SUFFIX = re.compile(r"\([^)]*\)\s*$")  # "(us)", "(MB)", ...
_SCALE = {"b": 1, "kb": 1 << 10, "mb": MIB, "gb": 1 << 30}
MINDSPORE_MB = 1024 * 1000  # MindSpore's viewer writes its own rows' "MB" as bytes / 1024 / 1000


# --- one form for both readers ---------------------------------------------------------------


def memory_rows(source: str, rows: pd.DataFrame, rank: int) -> pa.Table:
    """One source's rows as MEMORY rows. `rows` has `start_ns` (int64 ns on the rank's clock),
    `device` as the profiler names it (`NPU:0`) and sizes in bytes (floats; NaN or negative:
    unknown): for memory_record `component`, `allocated`, `reserved`, `active`; npu_module_mem
    `component`, `reserved`; operator_memory `name`, `size`, the totals at allocation
    (`allocated`, `reserved`, `active`) and, where released (`release_ns` ≥ 0), at release
    (`release_allocated`, …)."""
    rows = rows.assign(**{c: _bytes(rows[c]) for c in SIZES if c in rows})
    if source == "operator_memory":
        rows = _allocations_and_releases(rows)
    if "component" in rows:
        rows["component"] = rows["component"].astype(str).str.strip()
        if "active" in rows:
            rows.loc[rows["component"].isin(NO_ACTIVE), "active"] = NO_INT
    if source == "npu_module_mem":
        rows = _moving_modules(rows)
    count = len(rows)
    columns = {c: rows[c].to_numpy() for c in ("start_ns", "allocated", "reserved", "active",
                                               "bytes") if c in rows}
    text = {c: rows[c].astype(str).tolist() for c in ("component", "name") if c in rows}
    return schema.memory_table(
        {**columns, **text, "device": rows["device"].astype(str).str.strip().str.lower().tolist(),
         "rank": np.full(count, rank, dtype=np.int32), "source": [source] * count}, count)


def _bytes(values: pd.Series) -> np.ndarray:
    """Byte sizes as int64, NO_INT where unknown (NaN, negative)."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(np.float64)
    ok = np.isfinite(numbers) & (numbers >= 0)
    return np.where(ok, np.rint(np.where(ok, numbers, 0)), NO_INT).astype(np.int64)


def _allocations_and_releases(rows: pd.DataFrame) -> pd.DataFrame:
    """Operator allocations: +size with the totals at allocation, and for the released ones
    −size at release with the totals then."""
    freed = rows[rows["release_ns"].to_numpy() >= 0]
    allocations = rows[["name", "device", "start_ns", "allocated", "reserved", "active"]]
    releases = freed[["name", "device", *AT_RELEASE]].rename(columns=AT_RELEASE)
    return pd.concat([allocations.assign(bytes=rows["size"]),
                      releases.assign(bytes=np.where(freed["size"] >= 0, -freed["size"], NO_INT))],
                     ignore_index=True)


def _moving_modules(rows: pd.DataFrame) -> pd.DataFrame:
    """Only the modules that ever hold memory (most of the ~80 CANN modules report 0 always)."""
    return rows[rows.groupby("component")["reserved"].transform("max").to_numpy() > 0]


# --- the CSVs --------------------------------------------------------------------------------


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
            rows = _CSV_READERS[role](frame, lambda values, at=member: us_to_ns(values, at))
        except KeyError as missing:
            warnings.append(f"{member}: no {missing} column; its memory rows skipped")
            continue
        tables.append(memory_rows(role, rows, rank))
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


def _column(frame: pd.DataFrame, name: str) -> str:
    """The header that is `name` with any unit suffix, e.g. "Total Allocated(MB)"."""
    for column in frame.columns:
        if _SUFFIX.sub("", column).strip() == name:
            return column
    raise KeyError(name)


def _sizes(frame: pd.DataFrame, name: str, mb: float | np.ndarray = MIB) -> np.ndarray:
    """A size column in bytes (NaN where empty or absent), its unit from the header (MB if
    none); `mb`: the bytes of an "MB", row by row where they differ."""
    try:
        column = _column(frame, name)
    except KeyError:
        return np.full(len(frame), np.nan)
    unit = _UNIT.search(column)
    unit = unit[1].lower() if unit else "mb"
    scale = mb if unit == "mb" else _SCALE[unit]
    return pd.to_numeric(frame[column].str.strip(), errors="coerce").to_numpy(np.float64) * scale


def _device(frame: pd.DataFrame) -> list[str]:
    """The `Device Type` (or `Device`) column: `NPU:0`."""
    for name in ("Device Type", "Device"):
        if name in frame:
            return frame[name].tolist()
    return [""] * len(frame)


def _records(frame: pd.DataFrame, us) -> pd.DataFrame:
    """memory_record.csv: one sample per allocator event, per component (MindSpore's own rows
    in its "MB")."""
    component = frame["Component"].str.strip()
    mb = np.where(component.str.startswith("MindSpore"), MINDSPORE_MB, MIB)
    return pd.DataFrame({"start_ns": us(frame[_column(frame, "Timestamp")].tolist()),
                         **{key: _sizes(frame, f"Total {key.title()}", mb)
                            for key in ("allocated", "reserved", "active")},
                         "component": component.tolist(), "device": _device(frame)})


def _modules(frame: pd.DataFrame, us) -> pd.DataFrame:
    """npu_module_mem.csv: each CANN module's reserved memory over time."""
    return pd.DataFrame({"start_ns": us(frame[_column(frame, "Timestamp")].tolist()),
                         "reserved": _sizes(frame, "Total Reserved"),
                         "component": frame["Component"].tolist(), "device": _device(frame)})


def _operators(frame: pd.DataFrame, us) -> pd.DataFrame:
    """operator_memory.csv: each operator allocation, and its release where it has one."""
    release = frame[_column(frame, "Release Time")].str.strip()
    released = (release != "").to_numpy()
    release_ns = np.full(len(frame), NO_INT, dtype=np.int64)
    release_ns[released] = us(release[released].tolist())
    totals = {f"{at}{key}": _sizes(frame, f"{moment} Total {key.title()}")
              for at, moment in (("", "Allocation"), ("release_", "Release"))
              for key in ("allocated", "reserved", "active")}
    return pd.DataFrame({"start_ns": us(frame[_column(frame, "Allocation Time")].tolist()),
                         "release_ns": release_ns, "size": _sizes(frame, "Size"),
                         "name": frame["Name"].tolist(), "device": _device(frame), **totals})


_CSV_READERS = {"memory_record": _records, "npu_module_mem": _modules,
                "operator_memory": _operators}


# --- the `.db` tables ------------------------------------------------------------------------

DB_TABLES = {  # table -> (source, the columns read)
    "MEMORY_RECORD": ("memory_record", ("component", "timestamp", "totalAllocated",
                                        "totalReserved", "totalActive", "deviceId")),
    "NPU_MEM": ("memory_record", ("type", "ddr", "hbm", "timestampNs", "deviceId")),
    "OP_MEMORY": ("operator_memory", (
        "name", "size", "allocationTime", "releaseTime", "allocationTotalAllocated",
        "allocationTotalReserved", "allocationTotalActive", "releaseTotalAllocated",
        "releaseTotalReserved", "releaseTotalActive", "deviceId")),
    "NPU_MODULE_MEM": ("npu_module_mem", ("moduleId", "timestampNs", "totalReserved",
                                          "deviceId")),
}
_DB_SELECT = {  # table -> its rows in `memory_rows`' form; a NULL time reads -1 (pandas would
    # read a column of ints and NULLs as floats, which cannot hold ns since the epoch)
    "MEMORY_RECORD": "SELECT COALESCE(s.value, '') AS component, {time:x.timestamp} AS start_ns, "
                     "x.totalAllocated AS allocated, x.totalReserved AS reserved, "
                     "x.totalActive AS active, x.deviceId AS device FROM MEMORY_RECORD x "
                     "LEFT JOIN STRING_IDS s ON s.id = x.component",
    "NPU_MEM": "SELECT 'APP' AS component, {time:x.timestampNs} AS start_ns, "
               "x.ddr + x.hbm AS reserved, x.deviceId AS device FROM NPU_MEM x "
               "JOIN STRING_IDS s ON s.id = x.type "
               "WHERE lower(s.value) = 'app'",  # the process's; `device` rows: the whole chip's
    "OP_MEMORY": "SELECT COALESCE(s.value, '') AS name, x.size AS size, "
                 "{time:x.allocationTime} AS start_ns, {time:x.releaseTime} AS release_ns, "
                 "x.allocationTotalAllocated AS allocated, x.allocationTotalReserved AS reserved, "
                 "x.allocationTotalActive AS active, "
                 "x.releaseTotalAllocated AS release_allocated, "
                 "x.releaseTotalReserved AS release_reserved, "
                 "x.releaseTotalActive AS release_active, x.deviceId AS device FROM OP_MEMORY x "
                 "LEFT JOIN STRING_IDS s ON s.id = x.name",
    "NPU_MODULE_MEM": "SELECT {module} AS component, {time:x.timestampNs} AS start_ns, "
                      "x.totalReserved AS reserved, x.deviceId AS device FROM NPU_MODULE_MEM x"
                      "{join}",
}
DB_READ = frozenset({*DB_TABLES, "ENUM_MODULE"})  # ENUM_MODULE: CANN module ids -> names


def database_memory(db: Database, rank: int, warnings: list[str]) -> pa.Table | None:
    """The rank's memory rows from the profiler database's memory tables; None if it has none.
    A table lacking a column read is skipped with a warning, as a CSV lacking one is."""
    tables = []
    for table, (source, columns) in DB_TABLES.items():
        if table not in db.tables:
            continue
        missing = [c for c in columns if c not in db.tables[table]]
        if missing:
            warnings.append(f"{db.where}: table {table} has no column {missing[0]}; its memory "
                            "rows skipped")
            continue
        rows = db.query(_select(db, table))
        timed = rows["start_ns"].to_numpy(np.int64) >= 0
        if not timed.all():
            warnings.append(f"{db.where}: {int((~timed).sum())} rows of {table} have no time; "
                            "skipped")
        if timed.any():
            tables.append(memory_rows(source, _db_rows(rows[timed]), rank))
    return pa.concat_tables(tables) if tables else None


def _select(db: Database, table: str) -> str:
    """The table's SELECT; NPU_MODULE_MEM's modules by name where ENUM_MODULE names them."""
    named = db.has("ENUM_MODULE", "id", "name")
    return _DB_SELECT[table].format(
        time=_Time(),
        module="COALESCE(e.name, CAST(x.moduleId AS TEXT))" if named else
        "CAST(x.moduleId AS TEXT)",
        join=" LEFT JOIN ENUM_MODULE e ON e.id = x.moduleId" if named else "")


class _Time:
    """`{time:x.column}` in a SELECT: the column as integer ns, -1 where NULL."""

    def __format__(self, column: str) -> str:
        return f"COALESCE(CAST({column} AS INTEGER), -1)"


def _db_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """SQLite values as `memory_rows` takes them: sizes as floats (NaN where NULL), the device
    as the CSVs write it (`NPU:0`)."""
    out = rows.copy()
    for column in SIZES:
        if column in out:
            out[column] = pd.to_numeric(out[column], errors="coerce").astype(np.float64)
    device = pd.to_numeric(out["device"], errors="coerce")
    out["device"] = ["" if pd.isna(d) else f"NPU:{int(d)}" for d in device]
    return out
