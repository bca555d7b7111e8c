"""`Trace`: every rank of a bundle in three normalized tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tracegraph import schema


@dataclass
class Trace:
    """A loaded bundle: `events`, `groups`, `ranks` and `memory` as pandas DataFrames (schema.py
    columns; `memory` has no rows when no profile recorded memory)."""

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

    def incomplete_ranks(self) -> dict[int, str]:
        """rank -> why its parser knows its profile misses events (a kernel table shorter than
        the step it belongs to), for those ranks only."""
        if "incomplete" not in self.ranks:
            return {}
        flagged = self.ranks[self.ranks["incomplete"].fillna("") != ""]
        return dict(zip(flagged["rank"].astype(int), flagged["incomplete"], strict=True))

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
            pq.write_table(table, path)
            written.append(path)
        return written
