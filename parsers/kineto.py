"""PyTorch profiler (Kineto) Chrome traces -> normalized events (see shared/formats/kineto.md).

Decoding uses typed msgspec Structs that declare only the fields read (the rest is skipped
without building dicts), one Struct per trace phase, so flow and instant events (a third of a
typical trace) decode to empty objects; a phase outside the Chrome trace format falls back to a
single event type. The events are decoded BATCH_EVENTS at a time (the document first split into
each event's raw JSON) and each batch turned into columns with numpy / pyarrow at once (per-event
Python work is one C-level attribute read per needed field), so a rank never holds all its
events decoded; the few whose args later passes read (comm ops, gloo annotations, comm kernels,
syncs, copies) are kept, their raw args copied out of the file's bytes, and handled row by row.
A damaged file is decoded whole, which names what is wrong and keeps a truncated file's events.

Mapping: device events (pid = device, tid = stream) go to lane "stream N"; host events to
"thread TID NAME", except gloo worker threads (lane_kind comm). `task_type` keeps the Kineto
category. gloo send/recv carry the c10d op's group-local peer in `dst_rank` (send) / `src_rank`
(recv) and its tag in `event_id`; `peer` (global) and `group` are set where the rank's own
`pg_config` settles them, the rest by the loader across ranks (`tracegraph.loading.resolve`). A
device row, and a gloo collective on a worker thread, takes `step` and `annotation` from the host
op that launched / issued it.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict, deque
from collections.abc import Iterator
from itertools import compress
from operator import attrgetter
from typing import Any, ClassVar, Union

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import (
    Format,
    GroupInfo,
    NoRankId,
    ParsedRank,
    RankFiles,
    Reader,
    Sniff,
    TraceError,
)
from parsers.classify import P2P_COMMS, comm_kind, comm_type
from parsers.groups import Members, global_peers, own_groups
from parsers.intervals import cover
from parsers.values import (
    LABEL_LIMIT,
    UNREADABLE,
    capped,
    cut,
    int64,
    ints,
    micros_to_ns,
    rank_id,
    texts,
    to_int,
)
from tracegraph import schema
from tracegraph.schema import NO_INT


# --- decoding --------------------------------------------------------------------------------
class _Args(msgspec.Struct, frozen=True, gc=False):
    """The args an event may carry that this parser reads (untyped: writers differ)."""

    correlation: Any = NO_INT
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")  # kineto#880, early 2024
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: Any = msgspec.field(default=None, name="Group size")
    seq: Any = msgspec.field(default=None, name="Seq")
    autograd_seq: Any = msgspec.field(default=None, name="Sequence number")  # not a comm seq
    dst: Any = msgspec.field(default=None, name="Dst Rank")
    src: Any = msgspec.field(default=None, name="Src Rank")
    nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = None
    nbytes: Any = msgspec.field(default=None, name="bytes")
    stream: Any = None
    wait_stream: Any = msgspec.field(default=None, name="wait_on_stream")
    wait_corr: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    name: Any = None  # thread_name / process_name metadata
    device_type: Any = msgspec.field(default=None, name="Device Type")  # [memory] events
    device_id: Any = msgspec.field(default=None, name="Device Id")
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")


_NO_ARGS = _Args()


class _Fields(msgspec.Struct, frozen=True, gc=False):
    cat: str = ""
    name: str = ""
    pid: Any = None
    tid: Any = None
    ts: float | str | None = None  # text and absence are read (and counted) by parsers.values
    dur: float | str | None = None
    args: _Args = _NO_ARGS


class _Event(_Fields):
    """An event of any phase (the fallback decoding)."""

    ph: str = ""


class _Complete(_Fields, tag_field="ph", tag="X"):
    ph: ClassVar[str] = "X"


class _Metadata(_Fields, tag_field="ph", tag="M"):
    ph: ClassVar[str] = "M"


class _Instant(_Fields, tag_field="ph", tag="i"):
    """An instant event: the profiler's `[memory]` allocator events among them."""

    ph: ClassVar[str] = "i"


def _skipped(phase: str) -> type:
    """An event of a phase the table does not use: none of its fields are decoded."""
    return msgspec.defstruct(f"_Phase{ord(phase)}", [], frozen=True, gc=False, tag_field="ph",
                             tag=phase, namespace={"ph": phase})


_PHASES = "BEICbnestfPONDVvRc()"  # the Chrome trace format's other phases
_Tagged = Union[(_Complete, _Metadata, _Instant, *map(_skipped, _PHASES))]  # noqa: UP007


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    schemaVersion: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None


class _TaggedTrace(_Trace, gc=False):
    traceEvents: list[_Tagged] | None = None


class _Envelope(_Trace, gc=False):
    """The document with its events left as raw JSON (decoded in batches, `_batches`)."""

    traceEvents: list[msgspec.Raw] | None = None  # type: ignore[assignment]


_DECODER = msgspec.json.Decoder(_Trace)
_TAGGED_DECODER = msgspec.json.Decoder(_TaggedTrace)
_ENVELOPE = msgspec.json.Decoder(_Envelope)
_EVENTS = msgspec.json.Decoder(list[_Event])
_TAGGED_EVENTS = msgspec.json.Decoder(list[_Tagged])
BATCH_EVENTS = 4096  # events decoded at once: bounds the decoded structs a rank holds


def _decode_doc(data: bytes) -> _Trace:
    """The whole document (see `_per_phase`)."""
    return _per_phase(data, _TAGGED_DECODER, _DECODER)


def _per_phase(data: bytes, tagged: msgspec.json.Decoder, plain: msgspec.json.Decoder) -> Any:
    """Decode with one type per phase, so flow / instant / ... events skip their fields; an
    event with another phase, or none, makes it fall back to the one plain event type."""
    try:
        return tagged.decode(data)
    except msgspec.ValidationError:
        return plain.decode(data)


def _decode(raw: bytes, root: str) -> tuple[_Trace, Iterator[list], str]:
    """The trace's other fields, its events in batches, and what a cut cost ("" for a whole
    file). A well-formed trace is
    decoded a batch at a time (its events first split as raw JSON: ~50 bytes each), so a rank
    never holds all its events decoded at once; anything else is decoded whole
    (`_decode_whole`: a truncated file keeps its complete events)."""
    if not raw or raw.isspace():
        raise TraceError(f"{root}: empty file")
    try:
        doc = _ENVELOPE.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # damaged: said below
        doc = None
    if doc is None or doc.traceEvents is None:
        trace, cut = _decode_whole(raw, root)
        events, trace.traceEvents = trace.traceEvents or [], None  # held by the batch alone
        return trace, iter([events]), cut
    items, doc.traceEvents = doc.traceEvents, None
    return doc, _batches(items, raw, root), ""


def _batches(items: list[msgspec.Raw], raw: bytes, root: str) -> Iterator[list]:
    """The events of `items` decoded BATCH_EVENTS at a time (per phase where all phases are
    the Chrome format's, else plain); one no event type fits is reported as the whole
    document's decoding reports it."""
    for lo in range(0, len(items), BATCH_EVENTS):
        chunk = items[lo: lo + BATCH_EVENTS]
        data = b"[" + b",".join(chunk) + b"]"
        try:
            events = _per_phase(data, _TAGGED_EVENTS, _EVENTS)
        except (msgspec.DecodeError, RecursionError):
            _decode_whole(raw, root)  # raises, naming what is wrong where in the file
            raise TraceError(f"{root}: unreadable events") from None
        yield events


_RECOVERY_TRIES = 8


def _decode_whole(raw: bytes, root: str) -> tuple[_Trace, str]:
    """The decoded trace, and what a cut cost ("" for a whole file): a truncated file keeps
    its complete events."""
    try:
        trace, cut = _decode_doc(raw), ""
    except RecursionError:
        raise TraceError(f"{root}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as exc:
        raise TraceError(f"{root}: not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        if "truncated" not in str(exc):
            raise TraceError(f"{root}: invalid JSON ({exc})") from None
        trace = None
    if trace is None:
        trace, cut = _recover(raw, root)
    if trace.traceEvents is None:
        raise TraceError(f"{root}: no traceEvents array (not a Kineto trace)")
    return trace, cut


def _recover(raw: bytes, root: str) -> tuple[_Trace, str]:
    """Cut a truncated trace at its last complete event and close the array; and say so."""
    start = raw.find(b'"traceEvents"')
    end = raw.rfind(b"},", start) if start >= 0 else -1
    for _ in range(_RECOVERY_TRIES):
        if end < 0:
            break
        try:
            trace = _decode_doc(raw[: end + 1] + b"]}")
        except (msgspec.DecodeError, RecursionError):
            end = raw.rfind(b"},", start, end)
            continue
        kept = len(trace.traceEvents or ())
        return trace, (f"{root}: truncated JSON, kept the {kept} complete events "
                       f"(first {end + 1} of {len(raw)} bytes)")
    raise TraceError(f"{root}: truncated JSON, no complete event in traceEvents")


# --- discovery -------------------------------------------------------------------------------
SUFFIXES = (".json", ".json.gz", ".json.tmp")  # .tmp: an export the profiler did not finish
_CHROME_KEY = re.compile(rb'"(?:traceEvents|schemaVersion)"\s*:')
_DIST_INFO = re.compile(rb'"distributedInfo"\s*:\s*')
_RANK_KEY = re.compile(rb'"rank"\s*:\s*"?(-?\d+)')


def wants(name: str) -> bool:
    """Members named like a trace file: their first bytes tell whether they are one."""
    return name.lower().endswith(SUFFIXES)


def recognizes(name: str, head: bytes) -> bool:
    """Whether a member, by its name and first bytes, is a Kineto (Chrome JSON object) trace."""
    return (wants(name) and head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{")
            and bool(_CHROME_KEY.search(head)))


def sniff(name: str, head: bytes) -> Sniff:
    """A trace's first bytes: whether it is a Kineto trace, and the rank it states."""
    return Sniff(True, sniff_rank(head)) if recognizes(name, head) else Sniff(False)


def sniff_rank(head: bytes) -> int | None:
    """`distributedInfo.rank` from the first bytes of a trace (kineto writes it before
    traceEvents), or None when it is not there."""
    found = _DIST_INFO.search(head)
    if not found:
        return None
    try:
        info, _ = json.JSONDecoder().raw_decode(head[found.end():].decode("utf-8", "replace"))
    except (ValueError, RecursionError):  # the object runs past the head (its "rank" comes
        key = _RANK_KEY.search(head, found.end())  # before pg_config), or nests too deep
        return rank_id(int(key[1])) if key else None
    return _rank_of(info)


def _rank_of(info: object) -> int | None:
    return rank_id(info.get("rank")) if isinstance(info, dict) else None


# --- small value helpers ---------------------------------------------------------------------
def _json(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw) if len(raw) else None
    except (msgspec.DecodeError, RecursionError):
        return None


def _first_shape(dims: object) -> tuple[int, ...] | None:
    """The shape of the first tensor in an `Input Dims` value (nested for TensorLists)."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    ok = isinstance(dims, list) and all(isinstance(d, int) for d in dims)
    return tuple(dims) if ok else None


_ITEMSIZE = {  # c10 ScalarType names (record_param_comms dtype) and C++ names (Input type)
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2,
    "long": 8, "long int": 8, "int": 4, "short": 2, "short int": 2, "char": 1, "byte": 1,
    "signed char": 1, "unsigned char": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}


def _nbytes(nelems: int, dtype: str) -> int:
    size = _ITEMSIZE.get(dtype.lower())
    return int64(nelems * size) if size and nelems >= 0 else NO_INT


# --- categories ------------------------------------------------------------------------------
_CAT_NAMES = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy",
              "gpu_memset", "cuda_sync", "gpu_user_annotation")
(CPU_OP, ANNOTATION, RUNTIME, DRIVER, KERNEL, MEMCPY, MEMSET, SYNC, GPU_ANNOTATION) = range(9)
_CATS = {name: code for code, name in enumerate(_CAT_NAMES)} | {
    "Kernel": KERNEL, "Runtime": RUNTIME, "Memcpy": MEMCPY, "Memset": MEMSET}  # 2021-22 names
_DEVICE_CATS = (KERNEL, MEMCPY, MEMSET, SYNC, GPU_ANNOTATION)
_KIND_CODE = {kind: code for code, kind in enumerate(schema.KINDS)}
_CAT_KIND = np.array([_KIND_CODE[k] for k in (
    schema.HOST, schema.MARKER, schema.HOST, schema.HOST, schema.COMPUTE, schema.MEMCPY,
    schema.MEMCPY, schema.WAIT, schema.MARKER)], dtype=np.int8)
_THREAD_NAME = re.compile(r"^thread \d+ \((.*)\)$")
_GLOO_THREADS_PER_GROUP = 2  # ProcessGroupGloo's default worker count
_RELATIVE_BELOW_NS = 10**17  # ~3 years after the epoch: such ts count from baseTimeNanoseconds
_LATEST_BASE_NS = 1 << 62  # ~2116


# --- the rank's columns ----------------------------------------------------------------------
_PH, _CAT, _NAME, _TS, _DUR, _TID, _PID, _CORRELATION, _AUTOGRAD = map(attrgetter, (
    "ph", "cat", "name", "ts", "dur", "tid", "pid", "args.correlation", "args.autograd_seq"))
_COLUMNS = {"ts": (_TS, micros_to_ns), "dur": (_DUR, micros_to_ns), "tid": (_TID, ints),
            "corr": (_CORRELATION, ints), "autograd": (_AUTOGRAD, ints), "pid": (_PID, ints)}


class _Events:
    """What a rank's table needs of its events, read a batch at a time: columns over the
    complete events of a profiler category, those of them whose args a later pass reads
    (`kept`, by row: comm ops, gloo annotations, kernels with comm args, syncs and copies), the
    metadata events and the allocator's `[memory]` events. The rest is dropped batch by batch."""

    def __init__(self, batches: Iterator[list]) -> None:
        parts: dict[str, list] = defaultdict(list)
        self.kept: dict[int, Any] = {}
        self.meta: list = []
        self.memory: list = []
        self.n = 0
        for events in batches:
            phases = list(map(_PH, events))
            self.meta += compress(events, map("M".__eq__, phases))
            self.memory += [e for e, ph in zip(events, phases, strict=True)
                            if ph == "i" and e.name == "[memory]"]
            complete = list(compress(events, map("X".__eq__, phases)))
            ev = list(compress(complete, map(_CATS.__contains__, map(_CAT, complete))))
            cat = np.fromiter(map(_CATS.__getitem__, map(_CAT, ev)), np.int8, len(ev))
            names = texts(list(map(_NAME, ev)))
            masks = {prefix: _starting(names, prefix) for prefix in _PREFIXES}
            for key, value in (("cat", cat), ("names", names), *masks.items()):
                parts[key].append(value)
            for column, (read, convert) in _COLUMNS.items():
                parts[column].append(convert(list(map(read, ev))))
            for i in np.flatnonzero(_args_read(cat, names, masks, ev)).tolist():
                self.kept[self.n + i] = _detached(ev[i])
            self.n += len(ev)

        def joined(key: str, dtype: type) -> np.ndarray:
            return np.concatenate(parts[key]) if parts[key] else np.zeros(0, dtype)

        self.names = pa.concat_arrays(parts["names"]) if parts["names"] else texts([])
        self.cat = joined("cat", np.int8)
        self.columns = {column: joined(column, np.int64) for column in _COLUMNS}  # converted
        self.masks = {prefix: joined(prefix, bool) for prefix in _PREFIXES}


_PREFIXES = ("c10d::", "gloo:")  # name prefixes (any case) the passes select rows by


def _starting(names: pa.Array, prefix: str) -> np.ndarray:
    """Mask of the names that start with `prefix`, in any case."""
    return pc.starts_with(names, prefix, ignore_case=True).to_numpy(zero_copy_only=False)


def _args_read(cat: np.ndarray, names: pa.Array, masks: dict[str, np.ndarray], ev: list
               ) -> np.ndarray:
    """Mask of the events whose args a pass after decoding reads (see `_Events.kept`)."""
    comm_op = pc.equal(names, "record_param_comms").to_numpy(zero_copy_only=False)
    keep = (cat == CPU_OP) & (comm_op | masks["c10d::"])
    keep |= np.isin(cat, (ANNOTATION, GPU_ANNOTATION)) & masks["gloo:"]
    keep |= np.isin(cat, (SYNC, MEMCPY, MEMSET))
    for i in np.flatnonzero(cat == KERNEL).tolist():
        keep[i] = ev[i].args.collective is not None
    return keep


def _detached(event: Any) -> Any:
    """`event` with its raw args copied out of the bytes it was decoded from (which a batch, or
    the whole file, would otherwise stay alive for)."""
    args = event.args
    raw = {name: getattr(args, name).copy() for name in ("inputs", "dims", "types")}
    return msgspec.structs.replace(event, args=msgspec.structs.replace(args, **raw))


class _Rank:
    """Column arrays over the complete (`ph == "X"`) events of one trace that the table keeps."""

    def __init__(self, events: _Events, base_ns: int):
        self.kept, self.meta_events = events.kept, events.meta
        n = self.n = events.n
        self.cat, self.name_arr = events.cat, events.names
        column = events.columns
        ts = column["ts"]  # since the clock base, never before: a negative one is damage
        self.start = np.where((ts == UNREADABLE) | (ts < 0), ts, base_ns + ts)
        self.dur = column["dur"]
        self.end = self.start + self.dur
        self.corr = column["corr"]
        self.autograd = np.where(self.cat == CPU_OP, column["autograd"], NO_INT)
        self.device = np.isin(self.cat, _DEVICE_CATS)
        self.tid = column["tid"]  # host thread, or a device row's stream
        self.device_id = column["pid"]  # read on device rows (`_device_ids`)
        self.thread = np.where(self.device, NO_INT, self.tid)  # host tid
        self.kind = _CAT_KIND[self.cat]
        self.comm = np.full(n, "", dtype=object)
        self.group = np.full(n, "", dtype=object)
        self.dtype = np.full(n, "", dtype=object)
        (self.peer, self.seq, self.nbytes, self.event_id, self.wait_on, self.stream, self.pid,
         self.src_rank, self.dst_rank) = (np.full(n, NO_INT, dtype=np.int64) for _ in range(9))
        self.parent = np.full(n, -1, dtype=np.int64)  # launch / issuing host op of a row
        self.warnings: list[str] = []
        self.damaged: dict[str, int] = {}
        self.unreadable("host thread ids unreadable", self.thread)
        self._masks: dict[str, np.ndarray] = events.masks  # by prefix, see `prefixed`

    def unreadable(self, what: str, values: np.ndarray) -> np.ndarray:
        """`values`, its UNREADABLE ones counted as damage (`what`)."""
        if count := int((values == UNREADABLE).sum()):
            self.damaged[what] = self.damaged.get(what, 0) + count
        return values

    def release(self) -> None:
        """Drop the decoded events kept: from here on only the columns are used."""
        self.kept, self.meta_events = {}, []

    def name(self, row: int) -> str:
        return self.name_arr[row].as_py()

    def rows(self, cats: tuple[int, ...], prefix: str = "") -> np.ndarray:
        """Rows of these categories (whose name starts with `prefix`)."""
        mask = np.isin(self.cat, cats)
        if prefix:
            mask &= self.prefixed(prefix)
        return np.flatnonzero(mask)

    def prefixed(self, prefix: str) -> np.ndarray:
        """Rows whose name starts with `prefix` (any case), as a mask."""
        if prefix not in self._masks:
            self._masks[prefix] = _starting(self.name_arr, prefix)
        return self._masks[prefix]

    def named(self, cats: tuple[int, ...], name: str) -> np.ndarray:
        equal = pc.equal(self.name_arr, name).to_numpy(zero_copy_only=False)
        return np.flatnonzero(np.isin(self.cat, cats) & equal)

    def enclosing(self, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
        """For each row of `inner`, the innermost row of `outer` on its host thread that covers
        its start (-1 if none)."""
        found = np.full(len(inner), -1, dtype=np.int64)
        for thread in np.unique(self.thread[outer]):
            mine = outer[self.thread[outer] == thread]
            on = self.thread[inner] == thread
            found[on] = cover(mine, self.start[mine], self.end[mine], self.start[inner[on]])
        return found

    def set_comm(self, row: int, comm: str, group: str = "", peer: int = NO_INT,
                 seq: int = NO_INT, nbytes: int = NO_INT, dtype: str = "") -> None:
        self.comm[row], self.group[row], self.dtype[row] = comm, group, dtype
        self.peer[row], self.seq[row], self.nbytes[row] = peer, seq, nbytes

    def copy_comm(self, rows: list[int], sources: list[int]) -> None:
        for col in (self.comm, self.group, self.dtype, self.peer, self.seq, self.nbytes):
            col[rows] = col[sources]


# --- communication ---------------------------------------------------------------------------
def _args_comm(args: _Args) -> tuple[str, str, int, int, int, str]:
    """comm, group, peer, seq, bytes, dtype from record_param_comms / NCCL kernel args."""
    comm = comm_type(str(args.collective or ""))
    group = args.pg_name if args.pg_name is not None else args.pg_id
    peer = args.dst if comm == "send" else args.src if comm == "recv" else None
    dtype = str(args.dtype or "")
    return (comm, "" if group is None else str(group), to_int(peer), to_int(args.seq),
            _nbytes(to_int(args.nelems), dtype), dtype)


def _host_comm(r: _Rank) -> None:
    """record_param_comms args; comm types of c10d ops and of gloo / nccl annotations (gloo ones
    are the executed comm ops: collective / p2p, with their tensor size)."""
    for row in r.named((CPU_OP,), "record_param_comms"):
        r.set_comm(row, *_args_comm(r.kept[row].args))
    gloo = r.rows((ANNOTATION, GPU_ANNOTATION), "gloo:")
    for row in np.concatenate([r.rows((CPU_OP,), "c10d::"), gloo,
                               r.rows((ANNOTATION, GPU_ANNOTATION), "nccl:")]).tolist():
        r.comm[row] = comm_type(r.name(row))
    gloo = gloo[r.comm[gloo] != ""]
    r.kind[gloo] = [_KIND_CODE[comm_kind(c)] for c in r.comm[gloo]]
    for row in gloo.tolist():
        r.nbytes[row], r.dtype[row] = _tensor_bytes(r.kept[row].args)


def _p2p_peers(r: _Rank) -> None:
    """Group-local peer (dst_rank of a send, src_rank of a recv) and tag (event_id) of c10d
    send/recv ops and of the gloo:send/recv annotations they enclose. Concrete Inputs =
    [tensors, process_group, peer, tag]: the peer is local to a group the event does not name
    (`_p2p_groups` and the loader turn it into a global rank)."""
    calls = r.rows((CPU_OP,), "c10d::")
    calls = calls[np.isin(r.comm[calls], ("send", "recv"))]
    for row in calls.tolist():
        inputs = _json(r.kept[row].args.inputs)
        if isinstance(inputs, list) and len(inputs) >= 4:
            local = r.dst_rank if r.comm[row] == "send" else r.src_rank
            local[row], r.event_id[row] = to_int(inputs[2]), to_int(inputs[3])
    gloo = r.rows((ANNOTATION,), "gloo:")
    gloo = gloo[np.isin(r.comm[gloo], ("send", "recv"))]
    outer = r.enclosing(calls, gloo)
    gloo, outer = gloo[outer >= 0], outer[outer >= 0]
    for col in (r.src_rank, r.dst_rank, r.event_id):
        col[gloo] = col[outer]


def _p2p_groups(r: _Rank, rank: int, own: Members) -> None:
    """Global peer and group of the gloo P2P ops whose local peer this rank's own groups settle
    (one candidate peer, one group); the rest are left to the loader. Without pg_config the
    local peer is taken as global (as on the default group)."""
    local = np.where(r.comm == "send", r.dst_rank, r.src_rank)
    rows = np.flatnonzero(np.isin(r.comm, ("send", "recv")) & (local >= 0))
    if not own:
        r.peer[rows] = local[rows]
        return
    for value in np.unique(local[rows]).tolist():
        candidates = global_peers(rank, value, own)
        mine = rows[local[rows] == value]
        if len(peers := {peer for _, peer in candidates}) == 1:
            r.peer[mine] = peers.pop()
        if len(groups := {group for group, _ in candidates}) == 1:
            r.group[mine] = groups.pop()


def _tensor_bytes(args: _Args) -> tuple[int, str]:
    """Size and element type of the first tensor of an op with recorded shapes."""
    shape, types = _first_shape(_json(args.dims)), _json(args.types)
    dtype = str(types[0]) if isinstance(types, list) and types else ""
    return (_nbytes(math.prod(shape), dtype) if shape is not None else NO_INT), dtype


def _launch_parents(r: _Rank) -> None:
    """Device rows -> the runtime / driver call that launched them (same correlation id)."""
    launches = r.rows((RUNTIME, DRIVER))
    launches = launches[r.corr[launches] >= 0]
    device = np.flatnonzero(r.device & (r.corr >= 0))
    if not len(launches) or not len(device):
        return
    order = np.argsort(r.corr[launches], kind="stable")
    keys = r.corr[launches][order]
    pos = np.searchsorted(keys, r.corr[device]).clip(0, len(keys) - 1)
    hit = keys[pos] == r.corr[device]
    r.parent[device[hit]] = launches[order[pos[hit]]]


def _kernel_comm(r: _Rank) -> None:
    """NCCL/RCCL kernels: comm from their own args, else from the comm op enclosing their launch
    (old traces: `nccl:all_to_all` runs SendRecv kernels), else from the kernel name."""
    kernels = r.rows((KERNEL,))
    with_args = np.array([i in r.kept for i in kernels.tolist()], dtype=bool)  # kept: comm args
    kernels = kernels[with_args | r.prefixed("nccl")[kernels] | r.prefixed("rccl")[kernels]]
    launches = r.parent[kernels]
    context = np.full(len(kernels), -1, dtype=np.int64)
    context[launches >= 0] = r.enclosing(np.flatnonzero(~r.device & (r.comm != "")),
                                         launches[launches >= 0])
    inherit: tuple[list[int], list[int]] = ([], [])
    for row, ctx in zip(kernels.tolist(), context.tolist(), strict=True):
        if row in r.kept:  # a kernel with comm args
            r.set_comm(row, *_args_comm(r.kept[row].args))
        elif ctx >= 0:
            inherit[0].append(row)
            inherit[1].append(ctx)
        else:
            r.comm[row] = comm_type(r.name(row))
    r.copy_comm(*inherit)
    r.kind[kernels] = [_KIND_CODE[comm_kind(c)] for c in r.comm[kernels]]


def _coalesced_p2p(r: _Rank) -> None:
    """NCCL batched P2P: the fused SendRecv kernel carries no peer args (pytorch#194693). Its
    peer and group are those of the per-op send/recv `record_param_comms` issued on the
    launching thread since the previous P2P kernel launch there (one batch per peer)."""
    kernels = r.rows((KERNEL,))
    kernels = kernels[(r.kind[kernels] == _KIND_CODE[schema.P2P]) & (r.peer[kernels] == NO_INT)
                      & (r.parent[kernels] >= 0)]
    ops = r.named((CPU_OP,), "record_param_comms")
    ops = ops[np.isin(r.comm[ops], ("send", "recv")) & (r.peer[ops] != NO_INT)]
    if not len(kernels) or not len(ops):
        return
    launches = r.parent[kernels]
    for thread in np.unique(r.thread[launches]).tolist():
        mine = kernels[r.thread[launches] == thread]
        mine = mine[np.argsort(r.start[r.parent[mine]], kind="stable")]
        issued = ops[r.thread[ops] == thread]
        issued = issued[np.argsort(r.start[issued], kind="stable")]
        cut = np.searchsorted(r.start[issued], r.start[r.parent[mine]], side="right")
        for kernel, lo, hi in zip(mine.tolist(), [0, *cut[:-1].tolist()], cut.tolist(),
                                  strict=True):
            batch = issued[lo:hi]
            peers = set(r.peer[batch].tolist())
            if len(peers) != 1:
                continue
            comms = set(r.comm[batch].tolist())
            r.set_comm(kernel, comms.pop() if len(comms) == 1 else "batch_send_recv",
                       str(r.group[batch[0]]), peers.pop(), NO_INT,
                       int(r.nbytes[batch].clip(0).sum()), str(r.dtype[batch[0]]))


# --- threads, gloo workers and lanes ---------------------------------------------------------
def _thread_names(r: _Rank) -> dict[int, str]:
    """tid -> thread name; of several names for one tid, the last that is not the process name
    (a thread first shows its parent's name, e.g. "python" then "pt_gloo_runloop")."""
    process = {e.pid: e.args.name for e in r.meta_events if e.name == "process_name"}
    chosen: dict[int, str] = {}
    for e in r.meta_events:
        match = _THREAD_NAME.match(str(e.args.name)) if e.name == "thread_name" else None
        if match and (match[1] != process.get(e.pid) or to_int(e.tid) not in chosen):
            chosen[to_int(e.tid)] = cut(match[1], LABEL_LIMIT)  # on every row of the thread
    return chosen


def _gloo_workers(r: _Rank, names: dict[int, str]) -> np.ndarray:
    """Host threads that execute gloo collectives for the calling thread: named
    pt_gloo_runloop, or (older torch) running nothing but gloo collectives."""
    gloo = r.rows((ANNOTATION,), "gloo:")
    gloo = gloo[(r.comm[gloo] != "") & ~np.isin(r.comm[gloo], tuple(P2P_COMMS))]
    threads, counts = np.unique(r.thread[~r.device], return_counts=True)
    busy = dict(zip(threads.tolist(), counts.tolist(), strict=True))
    gloo_threads, gloo_counts = np.unique(r.thread[gloo], return_counts=True)
    workers = {t for t, c in zip(gloo_threads.tolist(), gloo_counts.tolist(), strict=True)
               if busy[t] == c}
    workers |= {t for t, name in names.items() if "gloo" in name}
    return np.array(sorted(workers), dtype=np.int64)


def _gloo_issuers(r: _Rank, workers: np.ndarray) -> np.ndarray:
    """Worker-thread gloo collectives -> the c10d op that issued them: per (comm type, first
    tensor shape), the earliest not yet executed c10d op started before (FIFO, as gloo runs a
    group's work in issue order). Returns the worker rows."""
    rows = r.rows((ANNOTATION,), "gloo:")
    rows = rows[np.isin(r.thread[rows], workers) & (r.comm[rows] != "")]
    calls = r.rows((CPU_OP,), "c10d::")
    calls = calls[(r.comm[calls] != "") & ~np.isin(r.thread[calls], workers)]
    queues: dict[tuple, deque[int]] = defaultdict(deque)
    for row in calls[np.argsort(r.start[calls], kind="stable")].tolist():
        queues[(r.comm[row], _first_shape(_json(r.kept[row].args.dims)))].append(row)
    for row in rows[np.argsort(r.start[rows], kind="stable")].tolist():
        queue = queues[(r.comm[row], _first_shape(_json(r.kept[row].args.dims)))]
        if queue and r.start[queue[0]] <= r.start[row]:
            r.parent[row] = queue.popleft()
    return rows


def _gloo_groups(r: _Rank, workers: np.ndarray, rows: np.ndarray, own: Members) -> None:
    """The group of the worker-thread collectives where this rank's profile settles it (the
    issuing c10d op's `record_param_comms`, else `_groups_of_own`), also set on the issuing op.
    The others stay "" for the loader to settle across ranks (it reads `_cross_rank_meta`)."""
    if not len(rows):
        return
    _stated_issuer_groups(r, rows)
    _groups_of_own(r, workers, rows[r.group[rows] == ""], own)
    issued = rows[(r.parent[rows] >= 0) & (r.group[rows] != "")]
    r.group[r.parent[issued]] = r.group[issued]


def _groups_of_own(r: _Rank, workers: np.ndarray, rows: np.ndarray, own: Members) -> None:
    """The rank's only group; or, when every group of the rank shows both its worker threads
    (each group runs on its own pair, created with it), threads in tid order map to the groups
    in creation (pg_name) order. Without pg_config nothing can tell, which is said."""
    names = list(own)
    if not len(rows):
        return
    if len(names) == 1:
        r.group[rows] = names[0]
    elif all(n.isdigit() for n in names) and len(workers) == _GLOO_THREADS_PER_GROUP * len(names):
        order = sorted(names, key=int)
        group_of = {t: order[i // _GLOO_THREADS_PER_GROUP] for i, t in enumerate(workers.tolist())}
        r.group[rows] = [group_of[t] for t in r.thread[rows].tolist()]
    elif not names:
        r.warnings.append(f"gloo: no pg_config names this rank's process groups: the group of "
                          f"its {len(rows)} collectives on {len(workers)} worker threads is "
                          f"unknown; group left empty")


def _stated_issuer_groups(r: _Rank, rows: np.ndarray) -> None:
    """Worker ops whose issuing c10d op encloses a `record_param_comms` naming a group (torch
    builds that emit it for gloo) take that group."""
    carriers = r.named((CPU_OP,), "record_param_comms")
    carriers = carriers[r.group[carriers] != ""]
    issued = rows[r.parent[rows] >= 0]
    if not len(carriers) or not len(issued):
        return
    outer = r.enclosing(np.unique(r.parent[issued]), carriers)
    stated = dict(zip(outer[outer >= 0].tolist(), r.group[carriers[outer >= 0]], strict=True))
    for row in issued.tolist():
        r.group[row] = stated.get(int(r.parent[row]), r.group[row])


def _cross_rank_meta(r: _Rank, rows: np.ndarray) -> dict[str, object]:
    """meta["cross_rank"], what the loader's cross-rank step needs beyond the table: each
    worker-thread collective with the c10d op that issued it (-1 if issued before the window),
    and how many comm rows this rank left without a group; {} for a rank with neither gloo
    worker ops nor group-local peers."""
    if not len(rows) and not (r.src_rank >= 0).any() and not (r.dst_rank >= 0).any():
        return {}
    issuers = np.stack([rows, r.parent[rows]], axis=1).tolist()
    return {"cross_rank": {"issuers": issuers,
                           "open": int(((r.group == "") & (r.comm != "")).sum())}}


def _lanes(r: _Rank, names: dict[int, str], workers: np.ndarray
           ) -> tuple[pa.Array, pa.Array]:
    """lane and lane_kind columns; also fills `stream` on device rows."""
    lane_names: list[str] = []
    lane_kinds: list[str] = []
    worker_set = set(workers.tolist())
    codes = np.zeros(r.n, dtype=np.int32)
    host = np.flatnonzero(~r.device)
    tids, inverse = np.unique(r.thread[host], return_inverse=True)
    for tid in tids.tolist():
        name = names.get(tid, "")
        lane_names.append(f"thread {tid} {name}" if name else f"thread {tid}")
        lane_kinds.append(schema.COMM if tid in worker_set else schema.THREAD)
    codes[host] = inverse
    device = np.flatnonzero(r.device)
    pids = r.pid[device]
    key_pids, key_streams, inverse = _unique_pairs(pids, r.stream[device])
    several = len(np.unique(pids)) > 1
    for pid, stream in zip(key_pids.tolist(), key_streams.tolist(), strict=True):
        lane = f"stream {stream}" if stream >= 0 else "device sync"
        lane_names.append(f"device {pid} {lane}" if several else lane)
        lane_kinds.append(schema.STREAM)
    codes[device] = len(tids) + inverse
    return _dictionary(codes, lane_names), _dictionary(codes, lane_kinds)


def _unique_pairs(first: np.ndarray, second: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (first, second) pairs in sorted order and each row's index among them (what
    np.unique(axis=0, return_inverse=True) gives, without its slow row sort)."""
    order = np.lexsort((second, first))
    a, b = first[order], second[order]
    new = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])] if len(a) else np.zeros(0, bool)
    inverse = np.empty(len(a), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return a[new], b[new], inverse


def _dictionary(codes: np.ndarray, values: list[str] | tuple[str, ...]) -> pa.Array:
    """A string column given as codes into `values`."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)),
                                          pa.array(values, pa.string()))


def _device_ids(r: _Rank) -> None:
    """`pid` (the device) and `stream` of the device rows."""
    device = np.flatnonzero(r.device)
    r.stream[device] = _device_streams(r, device)
    r.pid[device] = r.unreadable("device ids unreadable", r.device_id[device])


def _device_streams(r: _Rank, device: np.ndarray) -> np.ndarray:
    """Stream of each device row: its tid, or for cuda_sync its `stream` arg (newer kineto puts
    Stream Sync on tid = stream + offset); context / event syncs have none."""
    values = r.tid[device]
    for k in np.flatnonzero(r.cat[device] == SYNC).tolist():
        if r.kept[device[k]].args.stream is not None:
            values[k] = to_int(r.kept[device[k]].args.stream)
    return _stream_ids(r.unreadable("stream ids unreadable", values))


def _stream_ids(streams: np.ndarray) -> np.ndarray:
    """Stream ids with "none" (-1, or 4294967295 as unsigned) as NO_INT."""
    return np.where((streams < 0) | (streams >= 0xFFFFFFFF), NO_INT, streams)


def _sync_and_copies(r: _Rank) -> None:
    """cuda_sync: the stream and record an event wait is on; memcpy / memset sizes."""
    for row in r.rows((SYNC,)).tolist():
        args = r.kept[row].args
        r.wait_on[row], r.event_id[row] = to_int(args.wait_stream), to_int(args.wait_corr)
    r.wait_on[:] = _stream_ids(r.wait_on)
    copies = r.rows((MEMCPY, MEMSET))
    r.nbytes[copies] = ints([r.kept[i].args.nbytes for i in copies])


# --- step and annotation ---------------------------------------------------------------------
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _context(r: _Rank) -> tuple[np.ndarray, pa.Array]:
    """step (ProfilerStep#N covering the row by time) and annotation (innermost user annotation
    on the row's own thread, or on any thread for threads without annotations; an annotation
    is its own); device rows and gloo worker ops take their launching / issuing host op's."""
    steps = r.rows((ANNOTATION,), "ProfilerStep#")
    marks = [_STEP.match(name) for name in r.name_arr.take(pa.array(steps)).to_pylist()]
    steps = steps[[m is not None for m in marks]]
    users = r.rows((ANNOTATION,))
    users = users[~(r.prefixed("ProfilerStep#") | r.prefixed("gloo:")
                    | r.prefixed("nccl:"))[users]]
    step_no = np.full(r.n + 1, NO_INT, dtype=np.int64)
    step_no[steps] = [int64(int(m[1])) for m in marks if m]
    step = step_no[cover(steps, r.start[steps], r.end[steps], r.start)]
    label = np.full(r.n, -1, dtype=np.int64)
    host = np.flatnonzero(~r.device)
    own = np.isin(r.thread[host], r.thread[users])
    label[host[own]] = r.enclosing(users, host[own])
    label[host[~own]] = cover(users, r.start[users], r.end[users], r.start[host[~own]])
    child = np.flatnonzero(r.parent >= 0)
    step[child], label[child] = step[r.parent[child]], label[r.parent[child]]
    label[r.device & (r.parent < 0)] = -1
    labels = pa.concat_arrays([capped(r.name_arr, LABEL_LIMIT), pa.array([""], pa.string())])
    return step, labels.take(pa.array(np.where(label >= 0, label, r.n)))


# --- memory ----------------------------------------------------------------------------------
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 20: "npu"}  # c10::DeviceType (PrivateUse1 = torch_npu)


def _memory(events: list, base_ns: int, rank: int) -> pa.Table | None:
    """The allocator's `[memory]` instant events (profile_memory=True): after each allocation
    (Bytes > 0) or release (Bytes < 0), the device's Total Allocated / Total Reserved."""
    rows = [e for e in events if getattr(e, "ph", "") == "i" and e.name == "[memory]"]
    ts = micros_to_ns([e.ts for e in rows])
    rows = [e for e, t in zip(rows, ts, strict=True) if t != UNREADABLE]  # damaged: not drawn
    if not rows:
        return None
    args = [e.args for e in rows]
    kind = [to_int(a.device_type) for a in args]
    index = [to_int(a.device_id) for a in args]
    device = [_DEVICE_TYPES.get(k, f"device{k}") + (f":{i}" if i >= 0 and k else "")
              for k, i in zip(kind, index, strict=True)]
    count = len(rows)
    return schema.memory_table({
        "rank": np.full(count, rank, dtype=np.int32),
        "start_ns": base_ns + ts[ts != UNREADABLE],
        "allocated": ints([a.allocated for a in args]),
        "reserved": ints([a.reserved for a in args]),
        "bytes": ints([a.mem_bytes for a in args]), "component": ["allocator"] * count,
        "device": device, "source": ["kineto"] * count}, count)


def _device_memory(trace: _Trace, r: _Rank, memory: pa.Table | None) -> int:
    """totalGlobalMem of the rank's device (the one its kernels, else its memory events, name);
    NO_INT when the trace does not say."""
    devices = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []
    used = r.pid[r.device & (r.pid >= 0)]
    index = int(used[0]) if len(used) else NO_INT
    if index < 0 and memory is not None:
        named = [d for d in memory.column("device").to_pylist() if ":" in d]
        index = int(named[0].rsplit(":", 1)[1]) if named else NO_INT
    for device in devices:
        if isinstance(device, dict) and to_int(device.get("id")) == max(index, 0):
            return to_int(device.get("totalGlobalMem"))
    return NO_INT


# --- groups and meta -------------------------------------------------------------------------
def _group_ranks(value: object, size: object) -> tuple[int, ...]:
    """Member ranks from a list or its JSON string; () when unreadable or truncated."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return ()
    if not isinstance(value, list) or (to_int(size) > 0 and len(value) != to_int(size)):
        return ()
    return tuple(sorted(to_int(v) for v in value))


def _pg_config_groups(pg_config: list) -> dict[str, GroupInfo]:
    """The groups distributedInfo.pg_config lists (this rank's own), with their stated size."""
    groups = {}
    for pg in pg_config:
        if isinstance(pg, dict) and "pg_name" in pg:
            gid = str(pg["pg_name"])
            groups[gid] = GroupInfo(gid, gid, str(pg.get("pg_desc", "") or ""),
                                    _group_ranks(pg.get("ranks"), pg.get("pg_size")), "pg_config",
                                    max(to_int(pg.get("pg_size")), 0))
    return groups


def _groups(r: _Rank, stated: dict[str, GroupInfo]) -> list[GroupInfo]:
    """Groups from distributedInfo.pg_config, then from comm args for groups it lacks
    (`Process Group Ranks` is cut past 30 ranks; `Group size` still says how many)."""
    groups = dict(stated)
    carriers = np.flatnonzero((r.group != "") & np.isin(r.cat, (CPU_OP, KERNEL)))
    for row in carriers.tolist():
        gid, event = r.group[row], r.kept.get(row)  # not kept: no comm args
        if gid not in groups and event is not None and event.args.collective is not None:
            args = event.args
            groups[gid] = GroupInfo(gid, gid, str(args.pg_desc or ""),
                                    _group_ranks(args.pg_ranks, args.group_size),
                                    "Process Group Ranks", max(to_int(args.group_size), 0))
    return list(groups.values())


_VERSION_KEYS = (("schema", "schemaVersion"), ("cupti", "cupti_version"),
                 ("cuda_runtime", "cuda_runtime_version"), ("cuda_driver", "cuda_driver_version"),
                 ("hip_runtime", "hip_runtime_version"), ("roctracer", "roctracer_version"))


def _meta(trace: _Trace, info: dict, root: str, base_ns: int, rows: int) -> dict[str, object]:
    versions = [(k, getattr(trace, attr)) for k, attr in _VERSION_KEYS]
    versions.append(("nccl", info.get("nccl_version")))
    devices = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []
    device = devices[0].get("name", "") if devices and isinstance(devices[0], dict) else ""
    return {
        "framework": "pytorch", "format": "kineto", "path": root,
        "version": ";".join(f"{k}={v}" for k, v in versions if v is not None),
        "device": str(device), "backend": str(info.get("backend", "") or ""),
        "world_size": to_int(info.get("world_size")), "clock_base_ns": base_ns, "events": rows,
        "host": str(trace.host_name or ""),
    }


# --- entry point -----------------------------------------------------------------------------
def parse(files: RankFiles, read: Reader) -> ParsedRank:
    """One rank's Kineto trace -> normalized events, groups and meta."""
    trace, batches, cut = _decode(read(files.files["trace"]), files.root)
    warnings = [cut] if cut else []
    info = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    rank = _rank_of(info)
    damaged = {f"distributedInfo.rank {info['rank']!r:.40} (no rank id)": 1} if (
        rank is None and info.get("rank") is not None) else {}
    rank = files.rank if rank is None else rank
    if rank is None and files.alone:
        warnings.append(f"{files.root}: no rank stated (no distributedInfo.rank, none in its "
                        "name); taken as rank 0 (--rank-map sets it)")
        rank = 0
    if rank is None:
        raise NoRankId(f"{files.root}: no rank id (no distributedInfo.rank, none in the file "
                         f"name); pass --rank-map")
    base_ns = _clock_base(trace.baseTimeNanoseconds, files.root)
    pg_config = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    stated = _pg_config_groups(pg_config)
    own = own_groups(rank, stated.values())
    events = _Events(batches)  # the file's bytes go once its last batch is read
    memory = _memory(events.memory, base_ns, rank)
    r = _Rank(events, base_ns)
    del events
    if not r.n:
        warnings.append(f"{files.root}: no complete event (\"ph\": \"X\") of a profiler "
                        "category")
    timed = r.start[r.start != UNREADABLE]
    if trace.baseTimeNanoseconds is None and len(timed) and timed.min() < _RELATIVE_BELOW_NS:
        # kineto builds of 2024-25 write the base after traceEvents: a cut file loses it
        r.warnings.append(f"{files.root}: ts are relative but baseTimeNanoseconds is missing: "
                          f"the clock base is unknown")
    _host_comm(r)
    _p2p_peers(r)
    _p2p_groups(r, rank, own)
    _launch_parents(r)
    _kernel_comm(r)
    _coalesced_p2p(r)
    names = _thread_names(r)
    workers = _gloo_workers(r, names)
    executed = _gloo_issuers(r, workers)
    _gloo_groups(r, workers, executed, own)
    _sync_and_copies(r)
    _device_ids(r)
    groups = _groups(r, stated)
    r.release()
    meta = _meta(trace, info, files.root, base_ns, r.n) | _cross_rank_meta(r, executed)
    meta["device_memory"] = _device_memory(trace, r, memory)
    if cut:  # the events after the cut are lost: its waits' releasers among them
        meta["incomplete"] = cut
    return ParsedRank(rank=rank, events=_table(r, rank, names, workers), groups=groups,
                      meta=meta, warnings=warnings + r.warnings, memory=memory,
                      damaged=damaged | r.damaged)


def _clock_base(value: object, root: str) -> int:
    """baseTimeNanoseconds (0 when absent); TraceError when it is no epoch time in ns."""
    base = to_int(value, missing=0)
    if not 0 <= base <= _LATEST_BASE_NS:
        raise TraceError(f"{root}: baseTimeNanoseconds {value!r:.40} is no time since the epoch")
    return base


def _table(r: _Rank, rank: int, names: dict[int, str], workers: np.ndarray) -> pa.Table:
    lane, lane_kind = _lanes(r, names, workers)
    step, annotation = _context(r)
    return schema.events_table({
        "rank": np.full(r.n, rank, dtype=np.int32), "lane": lane, "lane_kind": lane_kind,
        "stream": r.stream, "name": r.name_arr, "kind": _dictionary(r.kind, schema.KINDS),
        "comm": r.comm, "start_ns": r.start, "dur_ns": r.dur, "group": r.group,
        "peer": r.peer, "seq": r.seq, "bytes": r.nbytes, "dtype": r.dtype,
        "src_rank": r.src_rank, "dst_rank": r.dst_rank,
        "correlation": r.corr, "event_id": r.event_id, "wait_on_stream": r.wait_on,
        "autograd_seq": np.maximum(r.autograd, NO_INT),
        "task_type": _dictionary(r.cat, _CAT_NAMES), "step": step, "annotation": annotation,
    }, r.n)


# --- registration (parsers.formats) ----------------------------------------------------------
FORMAT = Format(name="kineto", looked_for=f"Kineto {' / '.join('*' + s for s in SUFFIXES)} traces",
                parse=parse, wants=wants, sniff=sniff, suffixes=SUFFIXES)
