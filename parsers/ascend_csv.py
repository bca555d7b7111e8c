"""Device timelines from the kernel tables Ascend profilers write beside a trace, for profiles
that lack the trace: torch_npu / MindSpore `kernel_details.csv` (level 2 folders whose
trace_view.json was dropped for size) and raw msprof `op_summary_*.csv`.

Each row is one device task: name, stream, start (µs, written with a trailing tab) and duration.
HCCL ops appear with `Accelerator Core` / `Task Type` HCCL or COMMUNICATION and no stream; they are
taken from here only when no communication.json gives them with their groups. These tables hold
no EVENT_WAIT / EVENT_RECORD task, so what a stream waited for cannot be matched.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from parsers.ascend_rows import (
    Context,
    comm_lane,
    concat,
    device_kinds,
    device_lane,
    hccl_names,
    op_group,
    peer,
)
from parsers.base import Reader, TraceError
from parsers.classify import parse_hccl_name
from parsers.values import decimal_micros_to_ns, ints, micros_to_ns
from tracegraph.schema import COMM, NO_INT, P2P

ALIASES = {  # our name -> the header each table writes it under
    "name": ("Name", "Op Name"),
    "start": ("Start Time(us)", "Task Start Time(us)", "Task Start Time"),
    "duration": ("Duration(us)", "Task Duration(us)", "Task Duration"),
    "stream": ("Stream ID",),
    "core": ("Accelerator Core", "Task Type"),
    "op_type": ("Type", "OP Type"),
    "step": ("Step Id",),
}
REQUIRED = ("name", "start", "duration")
COMM_CORES = frozenset({"HCCL", "COMMUNICATION"})
NS_FROM = 1e17  # a unitless start above this is in ns (µs since the epoch are about 1.7e15)

WAITS_LOST = ("no trace_view.json: the device timeline comes from {table}, which holds no "
              "EVENT_WAIT / EVENT_RECORD task; what a stream waited for cannot be matched, so "
              "such waits show as idle device time and no chain runs through them")


def kernel_frame(member: str, read: Reader, ctx: Context) -> pd.DataFrame:
    """The device rows of a kernel table, plus its HCCL rows when communication.json gave no
    ops (`ctx.side.ops`); the warning that event waits are lost goes to `ctx.warnings`."""
    table = _read(member, read)
    comm = table["core"].isin(COMM_CORES) | table["name"].map(_is_hccl)
    device = _device_rows(table[~comm], member)
    ctx.warnings.append(f"{member}: " + WAITS_LOST.format(table=member.rsplit("/", 1)[-1]))
    if ctx.side.ops or not comm.any():
        return device
    return concat([device, _comm_rows(table[comm], member, ctx)])


def _is_hccl(name: str) -> bool:
    return parse_hccl_name(name) is not None


def _read(member: str, read: Reader) -> pd.DataFrame:
    """The table's columns under our names (absent optional ones as "")."""
    try:
        raw = pd.read_csv(io.BytesIO(read(member)), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise TraceError(f"{member}: unreadable CSV ({err})") from None
    found = {}
    for ours, headers in ALIASES.items():
        header = next((h for h in headers if h in raw.columns), None)
        if header is None and ours in REQUIRED:
            raise TraceError(f"{member}: no column {headers[0]!r}")
        found[ours] = raw[header].str.strip() if header else pd.Series("", index=raw.index)
        if ours == "start" and header:
            found["start_unit"] = "ns" if header == "Task Start Time" else "us"
    return pd.DataFrame(found)


def _starts(table: pd.DataFrame, member: str) -> np.ndarray:
    """Start times in ns: µs decimals converted exactly; a unitless column in ns is kept."""
    values = table["start"].tolist()
    if len(table) and table["start_unit"].iloc[0] == "ns":
        numbers = pd.to_numeric(table["start"], errors="coerce")
        if numbers.notna().all() and (numbers > NS_FROM).all():
            return ints(values)
    return decimal_micros_to_ns(values)


def _device_rows(table: pd.DataFrame, member: str) -> pd.DataFrame:
    frame = pd.DataFrame({
        "name": table["name"].to_numpy(object), "start_ns": _starts(table, member),
        "dur_ns": micros_to_ns(table["duration"].tolist()),
        "stream": ints(table["stream"].tolist()),
        "task_type": table["core"].to_numpy(object), "step": ints(table["step"].tolist()),
    })
    device_lane(frame)
    frame["kind"] = device_kinds(frame["name"], frame["task_type"],
                                 np.full(len(frame), NO_INT), set())
    return frame


def _comm_rows(table: pd.DataFrame, member: str, ctx: Context) -> pd.DataFrame:
    """HCCL ops of the table, their groups resolved as for a trace's op rows."""
    frame = pd.DataFrame({
        "name": table["name"].to_numpy(object), "start_ns": _starts(table, member),
        "dur_ns": micros_to_ns(table["duration"].tolist()), "step": ints(table["step"].tolist()),
        "task_type": table["core"].to_numpy(object),
    })
    parsed = hccl_names(frame)
    frame["group"] = [op_group(ctx, name, p, step, "") for name, p, step in
                      zip(frame["name"], parsed, frame["step"], strict=True)]
    peers = [peer(ctx, g, None) if k == P2P else (NO_INT,) * 3
             for g, k in zip(frame["group"], frame["kind"], strict=True)]
    frame["peer"], frame["src_rank"], frame["dst_rank"] = np.array(peers, np.int64).reshape(-1, 3).T
    frame["lane"] = comm_lane(frame["group"])
    frame["lane_kind"] = COMM
    return frame
