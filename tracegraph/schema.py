"""The normalized tables every parser produces and every analysis consumes.

This module is the public schema of `tracegraph export --parquet`: changing a column here is an
API change. Times are integer nanoseconds on the rank's own clock (clock offsets between ranks are
estimated later and kept in the ranks table, never baked into `start_ns`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracegraph.heap import use_system_allocator

use_system_allocator()  # before any table is built (every process builds them through here)

NO_INT = -1
"""Sentinel for an unknown integer field (peer, seq, bytes, stream, correlation ...)."""

# --- event kinds -----------------------------------------------------------------------------
COMPUTE = "compute"  # kernels, AI_CORE / AI_VECTOR tasks
WAIT = "wait"  # EVENT_WAIT, cudaStreamWaitEvent's device side ("Stream Wait Event")
RECORD = "record"  # EVENT_RECORD, cudaEventRecord's device side
COLLECTIVE = "collective"  # allreduce, reducescatter, allgather, alltoall, broadcast, ...
P2P = "p2p"  # send, recv, batch_send_recv
MEMCPY = "memcpy"
COMM_TASK = "comm_task"  # HCCL small tasks (Notify_Wait, Memcpy, ...) inside a comm op
HOST = "host"  # CPU-side ops, runtime API calls
MARKER = "marker"  # user annotations, ProfilerStep#N, FWD/BWD ranges
KINDS = (COMPUTE, WAIT, RECORD, COLLECTIVE, P2P, MEMCPY, COMM_TASK, HOST, MARKER)
DEVICE_WORK = (COMPUTE, MEMCPY, COLLECTIVE, P2P)  # the kinds that run on a device

# --- lane kinds ------------------------------------------------------------------------------
STREAM = "stream"  # a device stream (Ascend "Stream N", CUDA stream N)
COMM = "comm"  # an HCCL group row or plane, a gloo worker thread
THREAD = "thread"  # a host thread
LANE_KINDS = (STREAM, COMM, THREAD)

# --- comm types ------------------------------------------------------------------------------
COMM_TYPES = (
    "allreduce",
    "reducescatter",
    "allgather",
    "alltoall",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
    "batch_send_recv",
)
P2P_COMMS = frozenset({"send", "recv", "batch_send_recv"})  # the point-to-point COMM_TYPES

EVENTS = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("lane", pa.string()),  # "stream 47", "hccl 3985310405473756128 plane 0", "thread 1234"
        ("lane_kind", pa.string()),  # one of LANE_KINDS
        ("stream", pa.int64()),  # device stream id, NO_INT for host/comm lanes
        ("name", pa.string()),
        ("kind", pa.string()),  # one of KINDS
        ("comm", pa.string()),  # one of COMM_TYPES, "" when not communication
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("group", pa.string()),  # communicator / process group id ("" when unknown)
        ("peer", pa.int32()),  # global rank of the P2P peer (NO_INT when unknown / not P2P)
        ("seq", pa.int64()),  # instance index within the group (or P2P pair), NO_INT if unknown
        ("bytes", pa.int64()),
        ("dtype", pa.string()),
        ("correlation", pa.int64()),  # Ascend connection_id / Kineto correlation
        ("event_id", pa.int64()),  # id linking a wait to its record, when the source has one
        ("wait_on_stream", pa.int64()),  # stream a wait waits on, when the source says it
        ("notify_id", pa.string()),  # HCCL notify id of Notify_Record / Notify_Wait tasks
        ("src_rank", pa.int32()),  # HCCL small task: group-local src rank
        ("dst_rank", pa.int32()),  # HCCL small task: group-local dst rank (peer of a wait)
        ("task_type", pa.string()),  # raw task type / category from the source
        ("step", pa.int32()),  # ProfilerStep number the event falls in, NO_INT if none
        ("annotation", pa.string()),  # innermost user annotation (e.g. "FWD mb=3"), "" if none
        ("autograd_seq", pa.int64()),  # autograd sequence number: a forward op's, and the same on
        # the backward op it created (Kineto `Sequence number`), NO_INT if none
    ]
)

GROUPS = pa.schema(
    [
        ("group", pa.string()),  # same id as EVENTS.group
        ("name", pa.string()),  # comm / pg name ("group_name_19", "1", ...)
        ("desc", pa.string()),  # pg_desc / parallel group name ("pp", "dp_stage0", ...)
        ("dim", pa.string()),  # inferred parallel dimension: pp, dp, tp, ep, cp, world, ""
        ("ranks", pa.list_(pa.int32())),  # member global ranks, sorted
        ("size", pa.int32()),
        ("source", pa.string()),  # where membership came from
    ]
)

RANKS = pa.schema(
    [
        ("rank", pa.int32()),
        ("framework", pa.string()),  # "pytorch", "torch_npu", "mindspore", "msprof"
        ("format", pa.string()),  # "kineto", "ascend" (text files) or "ascend_db" (.db export)
        ("path", pa.string()),  # the profile within the bundle
        ("version", pa.string()),  # framework / CANN / torch versions as "k=v;k=v"
        ("device", pa.string()),
        ("backend", pa.string()),  # nccl, gloo, hccl
        ("world_size", pa.int32()),
        ("clock_base_ns", pa.int64()),  # baseTimeNanoseconds or 0
        ("clock_offset_ns", pa.int64()),  # estimated offset to subtract to align ranks
        ("events", pa.int64()),
        ("device_memory", pa.int64()),  # the device's memory capacity in bytes, NO_INT unknown
        ("incomplete", pa.string()),  # why its parser knows the profile misses events, "" if not
        ("stated_steps", pa.string()),  # JSON step -> [µs, compute µs] its step table states, ""
    ]
)

MEMORY = pa.schema(
    [
        ("rank", pa.int32()),
        ("start_ns", pa.int64()),  # when the sample was taken, ns on the rank's own clock
        ("allocated", pa.int64()),  # bytes held by live allocations of `component`, NO_INT unknown
        ("reserved", pa.int64()),  # bytes `component` has reserved from the device, NO_INT unknown
        ("active", pa.int64()),  # bytes in active blocks (Ascend "Total Active"), NO_INT unknown
        ("bytes", pa.int64()),  # what this event changed: + allocation, − release; NO_INT: a sample
        ("component", pa.string()),  # who holds it: "PTA", "PTA+GE", "APP", "GE", "allocator", ...
        ("device", pa.string()),  # "npu:0", "cuda:0", "cpu"
        ("name", pa.string()),  # the operator that allocated (operator_memory), else ""
        ("source", pa.string()),  # one of MEMORY_SOURCES: the table / event it was read from
    ]
)
MEMORY_SOURCES = ("kineto", "memory_record", "operator_memory", "npu_module_mem")
"""Where memory rows come from: Kineto `[memory]` instant events; Ascend `memory_record.csv`,
`operator_memory.csv` and `npu_module_mem.csv` (the `.db` tables MEMORY_RECORD and NPU_MEM's `app`
rows, OP_MEMORY, NPU_MODULE_MEM hold the same rows and map onto the same sources)."""
FRAMEWORK_COMPONENTS = ("PTA+GE", "PTA", "MindSpore+GE", "MindSpore", "allocator", "GE")
"""Components that are the training framework's device allocator, best first: a rank's peak
memory is read from the first of them its rows hold."""

STRING_DEFAULTS = {f.name: "" for f in EVENTS if pa.types.is_string(f.type)}
INT_DEFAULTS = {
    f.name: NO_INT for f in EVENTS if pa.types.is_integer(f.type) and f.name not in ("start_ns",)
}


def empty_events() -> pa.Table:
    """An events table with no rows and the full schema."""
    return EVENTS.empty_table()


CODED_STRING = pa.dictionary(pa.int32(), pa.string())
IN_MEMORY_EVENTS = pa.schema(
    [pa.field(f.name, CODED_STRING) if pa.types.is_string(f.type) else f for f in EVENTS])
"""EVENTS as loaded ranks travel, are cached and become the `Trace`'s DataFrame: every string
column dictionary-coded (4 bytes a row and each distinct value once: lanes, kinds, op names and
groups repeat), which pandas holds as a Categorical. Same values; `export` writes EVENTS."""


def in_memory(table: pa.Table) -> pa.Table:
    """An EVENTS table in the IN_MEMORY_EVENTS layout."""
    return table if table.schema.equals(IN_MEMORY_EVENTS) else table.cast(IN_MEMORY_EVENTS)


def empty_memory() -> pa.Table:
    """A memory table with no rows and the full schema."""
    return MEMORY.empty_table()


def memory_table(columns: dict[str, object], rows: int) -> pa.Table:
    """Build a memory table from column arrays, filling absent columns with their defaults."""
    return _table(MEMORY, columns, rows)


def plain_strings(table: pa.Table) -> pa.Table:
    """Some columns of an IN_MEMORY_EVENTS table with their strings decoded (to edit them)."""
    return table.cast(pa.schema([EVENTS.field(name) for name in table.column_names]))


def events_table(columns: dict[str, object], rows: int) -> pa.Table:
    """Build an events table from column arrays, filling absent columns with their defaults.
    Integer columns may come as int64: a value an int32 column cannot hold becomes int32's
    minimum, which `parsers.validate` reads as unreadable (as it reads int64's minimum)."""
    return _table(EVENTS, columns, rows)


def _table(table_schema: pa.Schema, columns: dict[str, object], rows: int) -> pa.Table:
    arrays = []
    for field in table_schema:
        values = columns.get(field.name)
        if values is None:
            default = "" if pa.types.is_string(field.type) else NO_INT
            values = pa.repeat(pa.scalar(default, field.type), rows)
        elif pa.types.is_integer(field.type):
            values = _integers(values, field.type)
        arrays.append(pa.array(values, type=field.type) if not isinstance(values, pa.Array)
                      else values.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=table_schema)


def _integers(values: object, arrow_type: pa.DataType) -> pa.Array:
    """An integer column of `arrow_type`; values it cannot hold become its minimum."""
    wide = values.cast(pa.int64()) if isinstance(values, pa.Array) else pa.array(
        values, type=pa.int64())
    if arrow_type == pa.int64():
        return wide
    info = np.iinfo(arrow_type.to_pandas_dtype())
    fits = pc.and_(pc.greater(wide, info.min), pc.less_equal(wide, info.max))
    return pc.if_else(fits, wide, info.min).cast(arrow_type)
