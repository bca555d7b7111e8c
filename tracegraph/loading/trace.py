"""`Trace`: every rank of a bundle in three normalized tables."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from tracegraph import schema
from tracegraph.heap import hand_back


def events_frame(ranks: list[pa.Table]) -> pd.DataFrame:
    """The ranks' events tables (`schema.IN_MEMORY_EVENTS`, often memory-mapped) as one
    DataFrame, filled rank by rank into columns allocated once: each rank's table is let go (its
    pages unmapped) as soon as it is copied, so the rows never exist twice over. String columns
    become Categoricals over one set of Python strings (the ranks' dictionaries merged), whose
    values come out as shared objects at numpy speed; one block per column."""
    total = sum(t.num_rows for t in ranks)
    fields = ranks[0].schema if ranks else schema.IN_MEMORY_EVENTS
    columns = {f.name: _Column(f, total) for f in fields}
    at = 0
    while ranks:
        table = ranks.pop(0)
        for name, column in columns.items():
            column.fill(table.column(name), at)
        at += table.num_rows
        hand_back(table.nbytes)  # the table's memory, unless mapped, stays with the allocators
        del table
    return pd.DataFrame({name: column.values() for name, column in columns.items()},
                        index=pd.RangeIndex(total), copy=False)  # the arrays themselves


class _Column:
    """One column of `events_frame`, filled chunk by chunk."""

    def __init__(self, field: pa.Field, rows: int) -> None:
        self.coded = pa.types.is_dictionary(field.type)
        dtype = np.int32 if self.coded else field.type.to_pandas_dtype()
        self.data = np.empty(rows, dtype=dtype)
        self.codes: dict[object, int] = {}  # string -> its category number

    def fill(self, chunks: pa.ChunkedArray, at: int) -> None:
        for chunk in chunks.chunks:
            if self.coded:
                known = [self.codes.setdefault(v, len(self.codes))
                         for v in chunk.dictionary.to_pylist()]
                index = chunk.indices.fill_null(-1).to_numpy()
                self.data[at:at + len(chunk)] = np.append(np.array(known, dtype=np.int32),
                                                          -1)[index]
            else:
                self.data[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
            at += len(chunk)

    def values(self) -> np.ndarray | pd.Categorical:
        if not self.coded:
            return self.data
        categories = pd.Index(np.array(list(self.codes), dtype=object), dtype=object)
        return pd.Categorical.from_codes(self.data, dtype=pd.CategoricalDtype(categories))


def p2p_links(events: pd.DataFrame) -> set[tuple[int, int]]:
    """(rank, peer) of every P2P op among `events`."""
    pairs = events.loc[(events["peer"] >= 0) & events["comm"].isin(schema.P2P_COMMS),
                       ["rank", "peer"]]
    return {(int(a), int(b)) for a, b in pairs.drop_duplicates().itertuples(index=False)}


@dataclass
class Trace:
    """A loaded bundle: `events`, `groups`, `ranks` and `memory` as pandas DataFrames (schema.py
    columns; the events' strings as Categoricals; `memory` has no rows when no profile recorded
    memory). A loaded trace builds `events` from its ranks' tables when first read
    (`with_events_from`): a command served by cached analyses never does."""

    source: Path
    events: pd.DataFrame
    groups: pd.DataFrame
    ranks: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    memory: pd.DataFrame = field(default_factory=lambda: schema.empty_memory().to_pandas())
    fingerprint: str = ""
    """What identifies the bundle as loaded (its ranks' cache keys, --rank-map): analyses of it
    are cached under it; "" for a trace built otherwise, whose analyses are not."""

    @classmethod
    def with_events_from(cls, tables: list[pa.Table] | Callable[[], list[pa.Table]],
                         **fields: object) -> Trace:
        """A Trace whose `events` DataFrame is `events_frame` of its ranks' tables (or of what
        a function returns: tables that lie elsewhere), built on first use."""
        trace = cls(events=None, **fields)  # type: ignore[arg-type]
        del trace.events
        trace._events_from = tables
        return trace

    def __getattr__(self, name: str) -> object:  # only reached for attributes not set
        if name == "events" and "_events_from" in self.__dict__:
            tables = self.__dict__.pop("_events_from")
            self.events = events_frame(tables() if callable(tables) else tables)
            return self.events
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def event_count(self) -> int:
        """Events of every rank: from `ranks` when it counts them (a loaded trace: the events
        themselves are not read), else the events' rows."""
        if "events" in self.ranks:
            return int(self.ranks["events"].sum())
        return len(self.events)

    @property
    def rank_ids(self) -> list[int]:
        """The global ranks present in the bundle, sorted."""
        return sorted(int(r) for r in self.ranks["rank"])

    def incomplete_ranks(self) -> dict[int, str]:
        """rank -> why its parser knows its profile misses events (a kernel table shorter than
        the step it belongs to), for those ranks only."""
        if "incomplete" not in self.ranks:
            return {}
        flagged = self.ranks[self.ranks["incomplete"].fillna("") != ""]
        return dict(zip(flagged["rank"].astype(int), flagged["incomplete"], strict=True))

    def stated_steps(self) -> pd.DataFrame:
        """rank, step, ms, computing_ms of each step a rank's step table states (Ascend's
        step_trace_time.csv: Stage and Computing; computing_ms nan where not stated)."""
        columns = ["rank", "step", "ms", "computing_ms"]
        if "stated_steps" not in self.ranks:
            return pd.DataFrame(columns=columns)
        stated = self.ranks[self.ranks["stated_steps"].fillna("") != ""]
        rows = [(int(rank), int(step), stage / 1e3, np.nan if busy is None else busy / 1e3)
                for rank, text in zip(stated["rank"], stated["stated_steps"], strict=True)
                for step, (stage, busy) in json.loads(text).items()]
        return pd.DataFrame(rows, columns=columns)

    def p2p_links(self) -> set[tuple[int, int]]:
        """(rank, peer) of every P2P op."""
        return p2p_links(self.events)

    def group_members(self) -> dict[str, tuple[int, ...]]:
        """Group id -> member global ranks (empty when the source did not say)."""
        return {g: tuple(int(r) for r in ranks)
                for g, ranks in zip(self.groups["group"], self.groups["ranks"], strict=True)}

    def to_parquet(self, out_dir: Path) -> list[Path]:
        """Write `events.parquet`, `groups.parquet`, `ranks.parquet` and `memory.parquet` (the
        public schema)."""
        import pyarrow.parquet as pq

        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, frame, arrow_schema in (
            ("events", self.events, schema.EVENTS),
            ("groups", self.groups, schema.GROUPS),
            ("ranks", self.ranks, schema.RANKS),
            ("memory", self.memory, schema.MEMORY),
        ):
            path = out_dir / f"{name}.parquet"
            table = pa.Table.from_pandas(frame, schema=arrow_schema, preserve_index=False)
            table = table.replace_schema_metadata(None)  # the public schema, not pandas' dtypes
            with pa.OSFile(os.fsencode(path), "wb") as sink:  # a name of any bytes, as given
                pq.write_table(table, sink)
            written.append(path)
        return written
