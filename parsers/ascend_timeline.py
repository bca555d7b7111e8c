"""An Ascend timeline (trace_view.json, msprof_*.json) as the columns its rows are built from.

The files are read and decoded a slice at a time (`parsers.ascend_stream`) into msgspec Structs
that declare only the fields used; each slice's complete events are turned at once into compact
columns (names dictionary-coded, times in ns, pid / tid, the args the layers read kept only where
an event has them) and the slice is dropped, so a rank never holds its events decoded, nor its
file's bytes. Metadata events (process and thread names) are few and kept whole, as is each
pid's first complete event (what tells the layer of a pid no metadata names). A file that is no
plain array of well-formed events is decoded whole, which names what is wrong; a file cut short
keeps its complete events, with a warning.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterable, Iterator
from itertools import compress, repeat
from operator import attrgetter, eq, ne
from typing import BinaryIO, ClassVar, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.ascend_stream import Truncated, Whole, event_slices
from parsers.base import Reader, TraceError, local_path
from parsers.values import (
    LABEL_LIMIT,
    NAME_LIMIT,
    cut,
    decimal_micros_to_ns,
    ints,
    micros_to_ns,
)
from parsers.values import texts as capped_texts
from tracegraph.schema import NO_INT

Scalar = int | float | str | None


class Args(msgspec.Struct, gc=False):
    name: Scalar = None  # process_name / thread_name metadata
    task_type: Scalar = msgspec.field(name="Task Type", default=None)
    physic_stream: Scalar = msgspec.field(name="Physic Stream Id", default=None)
    stream_id: Scalar = msgspec.field(name="Stream Id", default=None)
    connection_id: Scalar = None
    data_size: Scalar = msgspec.field(name="data size(Byte)", default=None)
    size_b: Scalar = msgspec.field(name="size(B)", default=None)
    size_byte: Scalar = msgspec.field(name="size(Byte)", default=None)
    notify_id: Scalar = None
    src_rank: Scalar = msgspec.field(name="src rank", default=None)
    dst_rank: Scalar = msgspec.field(name="dst rank", default=None)
    small_task_type: Scalar = msgspec.field(name="task type", default=None)
    data_type: Scalar = None
    count: Scalar = None
    rank_size: Scalar = None  # newer HCCL op events: the group's member count


class Fields(msgspec.Struct, gc=False):
    """What the parser reads of a complete or a metadata event."""

    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: str | int | float | None = None
    dur: float | str | None = None
    cat: str | None = None
    args: Args | None = None


class Event(Fields, gc=False):
    """An event of any phase (the plain decoding)."""

    ph: str = ""


class _Complete(Fields, tag_field="ph", tag="X", gc=False):
    ph: ClassVar[str] = "X"


class _Metadata(Fields, tag_field="ph", tag="M", gc=False):
    ph: ClassVar[str] = "M"


def _skipped(phase: str) -> type:
    """An event of a phase no row comes from: none of its fields are decoded."""
    return msgspec.defstruct(f"_Phase{ord(phase)}", [], gc=False, tag_field="ph", tag=phase,
                             namespace={"ph": phase})


_PHASES = "BEiICbnestfPONDVvRc()"  # the Chrome trace format's other phases
_Tagged = Union[(_Complete, _Metadata, *map(_skipped, _PHASES))]  # noqa: UP007


class _Wrapped(msgspec.Struct):
    traceEvents: list[Event]  # noqa: N815 - the JSON key


NO_ARGS = Args()
INT_ARGS = ("physic_stream", "stream_id", "connection_id", "data_size", "size_b", "size_byte",
            "src_rank", "dst_rank", "count", "rank_size")
TEXT_ARGS = ("task_type", "small_task_type", "data_type", "notify_id")
_DECODER = msgspec.json.Decoder(list[Event] | _Wrapped)
_EVENTS = msgspec.json.Decoder(list[Event])
_TAGGED = msgspec.json.Decoder(list[_Tagged])
_PH, _NAME, _PID, _TID, _TS, _DUR, _CAT, _ARGS = map(attrgetter, (
    "ph", "name", "pid", "tid", "ts", "dur", "cat", "args"))
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
WHOLE_BATCH = 1 << 16  # events of a file decoded whole turned into columns at once
_DECIMAL_WIDTH = 20  # "1736408883688177.930": 16 digits of µs (as DECIMAL reads), 3 of ns
_NS_LIMIT = "9" + "0" * 18  # the ns of 9e15 µs, as 19 digits: decimal_micros_to_ns's limit


# --- reading ---------------------------------------------------------------------------------


def read_timeline(members: list[str], read: Reader, warnings: list[str],
                  truncated: list[str]) -> Timeline:
    """The complete events and metadata of the trace files `members`, in order; what each
    truncated one lost is said in `warnings`, and in `truncated` too."""
    timeline = Timeline()
    said: list[str] = []
    for member in members:
        mark = timeline.mark()
        try:
            _add_file(timeline, member, read, said)
        except Whole:
            timeline.rollback(mark)
            events = decode_trace(member, read(member), said)
            for lo in range(0, len(events), WHOLE_BATCH):
                timeline.add(events[lo: lo + WHOLE_BATCH])
    warnings += said
    truncated += said
    timeline.finish()
    return timeline


def _add_file(timeline: Timeline, member: str, read: Reader, warnings: list[str]) -> None:
    """Add a file's events slice by slice (`Whole` when it must be decoded whole)."""
    decoded = 0
    with _opened(member, read) as stream:
        try:
            for events in event_slices(stream, _per_phase):
                decoded += len(events)
                timeline.add(events)
        except Truncated as cut:
            tail = _salvage(member, cut.rest)
            timeline.add(tail)
            warnings.append(f"{member}: truncated; kept the {decoded + len(tail)} complete "
                            "events before the cut")


def _per_phase(data: memoryview | bytearray) -> list:
    """Events decoded with one type per phase, so those of a phase no row comes from (counters,
    flows: half of a trace) skip their fields; an event with another phase, or none, makes the
    slice fall back to the one plain event type."""
    try:
        return _TAGGED.decode(data)
    except msgspec.ValidationError:
        return _EVENTS.decode(data)


@contextlib.contextmanager
def _opened(member: str, read: Reader) -> Iterator[BinaryIO]:
    """The member's bytes as a stream: its file, where it lies on disk unchanged, else what
    `read` returns."""
    path = local_path(read, member)
    if path is None:
        yield io.BytesIO(read(member))
        return
    with path.open("rb") as file:
        yield file


def decode_trace(member: str, data: bytes, warnings: list[str]) -> list[Event]:
    """The events of one trace file decoded whole; a truncated JSON array yields its complete
    events."""
    if not data.strip():
        raise TraceError(f"{member}: empty file")
    try:
        doc = _DECODER.decode(data)
    except RecursionError:
        raise TraceError(f"{member}: JSON nested too deeply to read") from None
    except msgspec.ValidationError as err:
        raise TraceError(f"{member}: unexpected content: {err}") from None
    except msgspec.DecodeError as err:
        if "truncated" not in str(err):
            raise TraceError(f"{member}: invalid JSON: {err}") from None
        doc = _salvage(member, data)
        warnings.append(f"{member}: truncated; kept the {len(doc)} complete events before the cut")
    return doc.traceEvents if isinstance(doc, _Wrapped) else doc


def _salvage(member: str, data: bytes, tries: int = 8) -> list[Event]:
    """The complete events of a JSON array cut short: close it after the last whole event."""
    if not data.lstrip().startswith(b"["):
        raise TraceError(f"{member}: truncated, and not a JSON array of events")
    whole = data.rstrip()
    if whole.endswith(b"}"):  # cut right after an event
        with contextlib.suppress(msgspec.DecodeError, RecursionError):
            return msgspec.json.decode(whole + b"]", type=list[Event])
    window = 1 << 20
    while True:
        tail_start = max(0, len(data) - window)
        cuts = [tail_start + m.start() for m in _BOUNDARY.finditer(data, tail_start)]
        for end in reversed(cuts[-tries:]):
            try:
                return msgspec.json.decode(data[:end + 1] + b"]", type=list[Event])
            except (msgspec.DecodeError, RecursionError):
                continue
        if tail_start == 0:
            return []
        window *= 8


# --- columns ---------------------------------------------------------------------------------


class Timeline:
    """Columns over a trace's complete (`ph == "X"`) events, in file order: `names` (dictionary-
    coded), `start` / `dur` (ns), `pid` / `tid` (int64, or objects where a file writes text),
    `annotation` (cat user_annotation); each arg of INT_ARGS / TEXT_ARGS where events carry it
    (`ints`, `texts`, `present`); the names metadata events give processes and threads; `first`,
    each pid's first event.

    Each column grows in one buffer (`_Growing`), text as codes into one dictionary (`_Coded`):
    no object made for a slice outlives it, so the pages a slice's decoding used go back."""

    def __init__(self) -> None:
        self.processes: dict[object, str] = {}  # pid -> its process_name, the last one stated
        self.threads: dict[tuple[object, object], str] = {}  # (pid, tid) -> thread_name, cut
        self.first: dict[object, Fields] = {}
        self.names = _Coded()
        self.start, self.dur, self.pid, self.tid = (_Growing() for _ in range(4))
        self.annotation = _Growing(bool)
        self._args = {key: (_Growing(), _Coded() if key in TEXT_ARGS else _Growing())
                      for key in INT_ARGS + TEXT_ARGS}

    @property
    def n(self) -> int:
        return len(self.start)

    def _columns(self) -> list[_Growing | _Coded]:
        return [self.names, self.start, self.dur, self.pid, self.tid, self.annotation,
                *(column for pair in self._args.values() for column in pair)]

    def mark(self) -> tuple[list[int], dict, dict, dict]:
        """Where the timeline stands (for `rollback`)."""
        return ([len(c) for c in self._columns()], dict(self.processes), dict(self.threads),
                dict(self.first))

    def rollback(self, mark: tuple[list[int], dict, dict, dict]) -> None:
        """Drop what was added since `mark`."""
        sizes, self.processes, self.threads, self.first = mark
        for column, size in zip(self._columns(), sizes, strict=True):
            column.cut(size)

    def add(self, events: list[Event]) -> None:
        """Append a slice's events to the columns (the slice can go)."""
        phases = list(map(_PH, events))
        self._names(compress(events, map(eq, repeat("M"), phases)))
        ev = list(compress(events, map(eq, repeat("X"), phases)))
        pids = list(map(_PID, ev))
        for pid in dict.fromkeys(pids).keys() - self.first.keys():
            self.first[pid] = ev[pids.index(pid)]
        offset = self.n
        self.pid.extend(_keys(pids))
        self.tid.extend(_keys(list(map(_TID, ev))))
        self.names.extend(_texts(list(map(_NAME, ev))))
        self.start.extend(decimal_ns(list(map(_TS, ev))))
        self.dur.extend(micros_to_ns(list(map(_DUR, ev))))
        cats = list(map(_CAT, ev))
        self.annotation.extend(np.fromiter(map(eq, repeat("user_annotation"), cats), bool,
                                           len(ev)) if "user_annotation" in cats
                               else np.zeros(len(ev), bool))
        args = list(map(_ARGS, ev))
        rows = list(compress(range(len(args)), map(ne, args, repeat(NO_ARGS))))  # or None
        if None in args:
            rows = [i for i in rows if args[i] is not None]
        if not rows:  # framework events: none of the args read
            return
        held = [args[i] for i in rows]
        at = np.array(rows, dtype=np.int64) + offset
        for key in INT_ARGS:
            values = fast_ints(list(map(attrgetter(key), held)))
            kept = values != NO_INT
            self._args[key][0].extend(at[kept])
            self._args[key][1].extend(values[kept])
        for key in TEXT_ARGS:
            values = _texts(list(map(attrgetter(key), held)))
            kept = values.is_valid().to_numpy(zero_copy_only=False)
            self._args[key][0].extend(at[kept])
            self._args[key][1].extend(values.filter(pa.array(kept)))

    def _names(self, meta: Iterable[Event]) -> None:
        """Process and thread names from metadata events (kept as strings alone: the events
        would hold pages of every slice they came in)."""
        for e in meta:
            if e.args is not None and e.name in ("process_name", "thread_name"):
                if e.name == "process_name":
                    self.processes[e.pid] = str(e.args.name)
                else:
                    self.threads[(e.pid, e.tid)] = cut(str(e.args.name), LABEL_LIMIT)

    def finish(self) -> None:
        """Fit each column's buffer to its rows."""
        for column in self._columns():
            column.fit()

    def split(self, parts: dict[str, np.ndarray]) -> dict[str, Timeline]:
        """A timeline of each part's rows, in the order given (names, first events and the
        dictionaries shared); the caller lets this one go, each part once it is taken."""
        return {key: self._subset(rows) for key, rows in parts.items()}

    def _subset(self, rows: np.ndarray) -> Timeline:
        part = Timeline()
        part.processes, part.threads, part.first = self.processes, self.threads, self.first
        part.names = self.names.subset(rows)
        for key in ("start", "dur", "pid", "tid", "annotation"):
            setattr(part, key, _Growing.of(getattr(self, key).values[rows]))
        for key, (where, values) in self._args.items():
            found, at = _lookup(where.values, rows)
            part._args[key] = (_Growing.of(np.flatnonzero(found)), values.subset(at[found]))
        return part

    # --- access by row -------------------------------------------------------------------

    def base(self, rows: np.ndarray) -> pd.DataFrame:
        """Name, times, pid and tid of these rows."""
        return pd.DataFrame({
            "name": self.names.take(rows).cast(pa.string()).to_pandas(),
            "start_ns": self.start.values[rows], "dur_ns": self.dur.values[rows],
            "pid": self.pid.values[rows], "tid": self.tid.values[rows]})

    def ints(self, key: str, rows: np.ndarray) -> np.ndarray:
        """An integer arg at `rows` (NO_INT where an event has none)."""
        where, values = self._args[key]
        found, at = _lookup(where.values, rows)
        out = np.full(len(rows), NO_INT, dtype=np.int64)
        out[found] = values.values[at[found]]  # type: ignore[union-attr]
        return out

    def texts(self, key: str, rows: np.ndarray) -> pd.Series:
        """A text arg at `rows` ("" where an event has none)."""
        where, values = self._args[key]
        found, at = _lookup(where.values, rows)
        picked = values.take(np.where(found, at, 0), mask=~found)  # type: ignore[call-arg]
        return pc.fill_null(picked.cast(pa.string()), "").to_pandas()

    def present(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Whether the events at `rows` carry a text arg (even an empty one)."""
        return _lookup(self._args[key][0].values, rows)[0]


class _Growing:
    """A column appended a slice at a time into one buffer, grown by half when full."""

    def __init__(self, dtype: type = np.int64) -> None:
        self._buffer = np.empty(0, dtype)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def values(self) -> np.ndarray:
        return self._buffer[:self._size]

    def extend(self, values: np.ndarray) -> None:
        end = self._size + len(values)
        if values.dtype == object and self._buffer.dtype != object:
            self._buffer = self._buffer.astype(object)  # text pids: every pid an object
        if end > len(self._buffer):
            grown = np.empty(max(end, len(self._buffer) * 3 // 2, 1 << 12), self._buffer.dtype)
            grown[:self._size] = self.values
            self._buffer = grown
        self._buffer[self._size:end] = values
        self._size = end

    @classmethod
    def of(cls, values: np.ndarray) -> _Growing:
        column = cls(values.dtype)
        column._buffer, column._size = values, len(values)
        return column

    def subset(self, rows: np.ndarray) -> _Growing:
        return _Growing.of(self.values[rows])

    def cut(self, size: int) -> None:
        self._size = size

    def fit(self) -> None:
        self._buffer = self.values.copy()


class _Coded:
    """Text appended a slice at a time, as int32 codes into one dictionary of its values."""

    def __init__(self) -> None:
        self._codes = _Growing(np.int32)
        self._index: dict[str, int] = {}
        self._dictionary: pa.Array | None = None

    def __len__(self) -> int:
        return len(self._codes)

    def extend(self, text: pa.Array) -> None:
        coded = text.dictionary_encode()
        index = self._index
        codes = np.array([index.setdefault(v, len(index)) for v in coded.dictionary.to_pylist()],
                         dtype=np.int32)
        self._codes.extend(codes[coded.indices.to_numpy(zero_copy_only=False)] if len(codes)
                           else np.zeros(0, np.int32))
        self._dictionary = None

    def cut(self, size: int) -> None:
        self._codes.cut(size)

    def fit(self) -> None:
        self._codes.fit()

    def subset(self, rows: np.ndarray) -> _Coded:
        part = _Coded()
        part._codes, part._index = self._codes.subset(rows), self._index
        return part

    @property
    def column(self) -> pa.DictionaryArray:
        """The codes as a dictionary-coded column."""
        if self._dictionary is None:
            self._dictionary = pa.array(list(self._index), pa.string())
        return pa.DictionaryArray.from_arrays(pa.array(self._codes.values), self._dictionary)

    def take(self, rows: np.ndarray, mask: np.ndarray | None = None) -> pa.DictionaryArray:
        """The values at `rows` (null where `mask`)."""
        return self.column.take(pa.array(rows, pa.int64(), mask=mask))


def _lookup(where: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of `rows` are in the sorted `where`, and their positions there."""
    if not len(where):
        return np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=np.int64)
    at = np.searchsorted(where, rows).clip(0, len(where) - 1)
    return where[at] == rows, at


def _texts(values: list[object]) -> pa.Array:
    """`parsers.values.texts`, its cut skipped where no value has as many bytes as NAME_LIMIT
    characters (the common case)."""
    try:
        array = pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return capped_texts(values)
    longest = pc.max(pc.binary_length(array)).as_py() or 0
    return array if longest <= NAME_LIMIT else capped_texts(values)


def decimal_ns(values: list[object]) -> np.ndarray:
    """`parsers.values.decimal_micros_to_ns`, read without a regular expression where every value
    is text of one width with three decimals ("1736408883688177.930": its digits are the ns)."""
    try:
        text = pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return decimal_micros_to_ns(values)
    width = pc.min_max(pc.binary_length(text))
    size = width["min"].as_py()
    if not size or size != width["max"].as_py() or size > _DECIMAL_WIDTH or text.null_count:
        return decimal_micros_to_ns(values)
    point = pc.utf8_slice_codeunits(text, size - 4, size - 3)
    digits = pc.binary_join_element_wise(pc.utf8_slice_codeunits(text, 0, size - 4),
                                         pc.utf8_slice_codeunits(text, size - 3, size), "")
    if not (pc.all(pc.equal(point, ".")).as_py() and pc.all(pc.ascii_is_decimal(digits)).as_py()
            and (size < _DECIMAL_WIDTH or pc.all(pc.less(digits, _NS_LIMIT)).as_py())):
        return decimal_micros_to_ns(values)
    return pc.cast(digits, pa.int64()).to_numpy()


def fast_ints(values: list[object]) -> np.ndarray:
    """`parsers.values.ints` (NO_INT where missing), through Arrow when the values are plain
    ints and None (the common case, which ints' own fast path refuses for the None)."""
    try:
        return pc.fill_null(pa.array(values, pa.int64()), NO_INT).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return ints(values)


def _keys(values: list[object]) -> np.ndarray:
    """pid / tid values: int64 when all are ints (the common case), else the objects."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
