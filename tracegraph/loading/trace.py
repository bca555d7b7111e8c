"""`Trace`: every rank of a bundle in three normalized tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tracegraph import schema


def events_frame(events: pa.Table) -> pd.DataFrame:
    """An events table (`schema.IN_MEMORY_EVENTS`) as the Trace's DataFrame: string columns
    become Categoricals of its dictionaries (unified across chunks) whose categories are Python
    strings, so a column's values come out as shared objects at numpy speed; one block per
    column (no consolidation copy), and each column's Arrow memory is freed once copied."""
    frame = events.to_pandas(split_blocks=True, self_destruct=True)
    for name, dtype in frame.dtypes.items():
        if isinstance(dtype, pd.CategoricalDtype):
            categories = pd.Index(np.asarray(dtype.categories, dtype=object), dtype=object)
            frame[name] = pd.Categorical.from_codes(frame[name].cat.codes,
                                                    dtype=pd.CategoricalDtype(categories))
    return frame


@dataclass
class Trace:
    """A loaded bundle: `events`, `groups`, `ranks` and `memory` as pandas DataFrames (schema.py
    columns; the events' strings as Categoricals; `memory` has no rows when no profile recorded
    memory)."""

    source: Path
    events: pd.DataFrame
    groups: pd.DataFrame
    ranks: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    memory: pd.DataFrame = field(default_factory=lambda: schema.empty_memory().to_pandas())

    @property
    def rank_ids(self) -> list[int]:
        """The global ranks present in the bundle, sorted."""
        return sorted(int(r) for r in self.ranks["rank"])

    def group_members(self) -> dict[str, tuple[int, ...]]:
        """Group id -> member global ranks (empty when the source did not say)."""
        return {g: tuple(int(r) for r in ranks)
                for g, ranks in zip(self.groups["group"], self.groups["ranks"], strict=True)}

    def to_parquet(self, out_dir: Path) -> list[Path]:
        """Write `events.parquet`, `groups.parquet`, `ranks.parquet` and `memory.parquet` (the
        public schema)."""
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
            pq.write_table(table, path)
            written.append(path)
        return written
