"""The one check every parser's output passes (`parsers.parse_rank`), whatever its format.

Parsers read raw values through `parsers.values`, which marks what it cannot read instead of
raising (UNREADABLE in an integer column; the int32 columns' minimum once narrowed by
`schema.events_table`) and cuts over-long text. Here each profile's table is made sound:

* an event whose start or duration is unreadable, whose start lies before the epoch, past
  LATEST_NS or more than MAX_SPREAD_NS from its rank's median start, or which lasts longer than
  MAX_DUR_NS, is dropped (nothing can place it in time);
* a negative duration is set to 0 (the event keeps its place and its links);
* any other unreadable integer, and a negative rank in a rank column, becomes NO_INT (unknown);
* text is cut to NAME_LIMIT characters; events without a name are counted;
* a rank id outside int32 is an error; world sizes, clock bases and group members outside their
  range are dropped.

What was changed is said in one warning line naming the profile, with a count per kind.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parsers.base import GroupInfo, ParsedRank, TraceError
from parsers.values import CUT_MARK, LABEL_LIMIT, NAME_LIMIT, UNREADABLE, capped
from tracegraph.schema import NO_INT

MAX_DUR_NS = 86_400 * 10**9
"""One day: no profiled operation runs longer; a longer duration is damage."""
LATEST_NS = 1 << 62
"""About 2116 as epoch ns: a later start is damage (and start + duration stays within int64)."""
MAX_SPREAD_NS = MAX_DUR_NS
"""A profile spans seconds to minutes: a start a day away from the rank's median is damage."""
_INT32 = np.iinfo(np.int32)
_RANK_COLUMNS = ("peer", "src_rank", "dst_rank")  # global or group-local ranks: never < NO_INT


class _Tally:
    """What was changed in one profile, in the order found, as one line."""

    def __init__(self) -> None:
        self.dropped: dict[str, int] = {}
        self.changed: list[str] = []

    def drop(self, why: str, count: int) -> None:
        if count:
            self.dropped[why] = self.dropped.get(why, 0) + count

    def note(self, count: int, what: str) -> None:
        if count:
            self.changed.append(f"{count:,} {what}")

    def line(self, where: str) -> str | None:
        parts = []
        if self.dropped:
            total = sum(self.dropped.values())
            reasons = ", ".join(f"{n:,} {why}" for why, n in self.dropped.items())
            parts.append(f"dropped {total:,} events ({reasons})")
        parts += self.changed
        return f"{where}: damaged values: {'; '.join(parts)}" if parts else None


def checked(parsed: ParsedRank, where: str) -> ParsedRank:
    """`parsed` made sound (see the module docstring), its changes in one warning naming
    `where`; TraceError for a rank id outside int32."""
    if not 0 <= parsed.rank <= _INT32.max:
        raise TraceError(f"{where}: rank id {parsed.rank} out of range")
    tally = _Tally()
    table = parsed.events
    keep = _timed(table, tally)
    if not keep.all():
        table = table.filter(pa.array(keep))
        _renumber(parsed.meta, keep)
    parsed.events = _texts(_integers(table, tally), tally)
    if "events" in parsed.meta:
        parsed.meta["events"] = parsed.events.num_rows
    _meta(parsed.meta, tally)
    parsed.groups = [_members(g, tally) for g in parsed.groups]
    for what, count in parsed.damaged.items():
        tally.note(count, what)
    line = tally.line(where)
    if line:
        parsed.warnings.append(line)
    return parsed


def header_sound(parsed: ParsedRank) -> bool:
    """Whether a parsed rank's id, meta and groups are as `checked` leaves them: a cache entry
    read back is, unless something else wrote it."""
    tally = _Tally()
    _meta(dict(parsed.meta), tally)
    for group in parsed.groups:
        _members(replace(group), tally)
    return 0 <= parsed.rank <= _INT32.max and not tally.changed


def _timed(table: pa.Table, tally: _Tally) -> np.ndarray:
    """Which rows can be placed in time (the others are counted by why)."""
    start = table["start_ns"].to_numpy()
    dur = table["dur_ns"].to_numpy()
    bad_start = start == UNREADABLE
    bad_dur = (dur == UNREADABLE) & ~bad_start
    readable = ~(bad_start | bad_dur)
    early = readable & (start < 0)
    late = readable & (start > LATEST_NS)
    long = readable & ~early & ~late & (dur > MAX_DUR_NS)
    sound = readable & ~(early | late | long)
    stray = np.zeros(len(start), dtype=bool)
    if sound.any():
        middle = int(np.median(start[sound]))
        stray = sound & (np.abs(start - middle) > MAX_SPREAD_NS)
    for why, rows in (("with an unreadable start", bad_start),
                      ("with an unreadable duration", bad_dur),
                      ("with a negative time", early), ("starting after 2116", late),
                      ("lasting over a day", long),
                      ("starting over a day away from the rest", stray)):
        tally.drop(why, int(rows.sum()))
    return sound & ~stray


def _integers(table: pa.Table, tally: _Tally) -> pa.Table:
    """Unreadable integers (and negative ranks) as NO_INT; negative durations as 0."""
    dur = table["dur_ns"]  # readable: the rows whose time is not were dropped
    negative = pc.less(dur, 0)
    tally.note(pc.sum(negative).as_py() or 0, "negative durations set to 0")
    table = _set(table, "dur_ns", pc.if_else(negative, 0, dur))
    for name in table.column_names:
        field = table.schema.field(name)
        if not pa.types.is_integer(field.type) or name in ("start_ns", "dur_ns"):
            continue
        column = table[name]
        mark = UNREADABLE if field.type == pa.int64() else int(_INT32.min)
        bad = pc.equal(column, mark)
        if name in _RANK_COLUMNS:
            bad = pc.less(column, NO_INT)
        count = pc.sum(bad).as_py() or 0
        if count:
            tally.note(count, f"{name} values unreadable, left unknown")
            table = _set(table, name, pc.if_else(bad, pa.scalar(NO_INT, field.type), column))
    return table


def _texts(table: pa.Table, tally: _Tally) -> pa.Table:
    """Text cut to NAME_LIMIT; cut values (here or by the parser) and empty names counted."""
    for name in table.column_names:
        field = table.schema.field(name)
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        longest = pc.max(pc.binary_length(table[name])).as_py() or 0  # bytes >= characters
        if longest < LABEL_LIMIT:  # nothing cut, nothing to cut: the common case
            continue
        column = pa.chunked_array([capped(chunk, NAME_LIMIT) for chunk in table[name].chunks],
                                  field.type)
        cut = pc.and_(pc.ends_with(column, CUT_MARK),
                      pc.greater_equal(pc.utf8_length(column), LABEL_LIMIT))
        tally.note(pc.sum(cut).as_py() or 0, f"{name} values cut short (too long)")
        table = _set(table, name, column)
    tally.note(_count(table["name"], ""), "events without a name")
    return table


def _count(column: pa.ChunkedArray, value: str) -> int:
    """How many rows of a text column hold `value` (a dictionary-coded one counted by its codes,
    never decoded)."""
    if not pa.types.is_dictionary(column.type):
        return pc.sum(pc.equal(column, value)).as_py() or 0
    count = 0
    for chunk in column.chunks:
        codes = np.flatnonzero(pc.fill_null(pc.equal(chunk.dictionary, value), False)
                               .to_numpy(zero_copy_only=False))
        count += pc.sum(pc.is_in(chunk.indices, pa.array(codes, chunk.indices.type))).as_py() or 0
    return count


def _set(table: pa.Table, name: str, column: pa.Array | pa.ChunkedArray) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name), column)


def _renumber(meta: dict[str, object], keep: np.ndarray) -> None:
    """Row numbers a parser keeps in meta (`cross_rank.issuers`: worker row, issuing row) follow
    the kept rows; a pair whose worker row was dropped goes, a dropped issuer becomes -1."""
    cross = meta.get("cross_rank")
    if not isinstance(cross, dict) or not cross.get("issuers"):
        return
    new = np.where(keep, np.cumsum(keep) - 1, -1)
    cross["issuers"] = [[int(new[w]), int(new[i]) if i >= 0 else -1]
                        for w, i in cross["issuers"] if keep[w]]


def _meta(meta: dict[str, object], tally: _Tally) -> None:
    """RANKS values outside their columns' range dropped: world size, clock base."""
    world = meta.get("world_size")
    if isinstance(world, int) and world != NO_INT and not 0 < world <= _INT32.max:
        meta["world_size"] = NO_INT
        tally.note(1, f"world size {world} out of range, ignored")
    base = meta.get("clock_base_ns")
    if isinstance(base, int) and not 0 <= base <= LATEST_NS:
        meta["clock_base_ns"] = 0
        tally.note(1, f"clock base {base} out of range, ignored")


def _members(group: GroupInfo, tally: _Tally) -> GroupInfo:
    """A group without member ranks outside int32, and with a size int32 holds."""
    ranks = tuple(r for r in group.ranks if 0 <= r <= _INT32.max)
    tally.note(len(group.ranks) - len(ranks), f"member ranks of group {group.group} unreadable")
    if not 0 <= group.size <= _INT32.max:
        tally.note(1, f"size of group {group.group} out of range, ignored")
        group.size = 0
    group.ranks = ranks
    return group
