"""The parse cache: Arrow IPC entries that load back exactly; damaged ones are misses."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import tracegraph
from parsers import parse_rank
from parsers.bundle import open_bundle
from tracegraph import schema
from tracegraph.loading import cache
from tracegraph.loading.cachedir import CacheDir
from tracegraph.loading.trace import events_frame

GLOO = "kineto/gloo_pp2_dp2"


def _rank0(real: Path):
    with open_bundle(real / GLOO) as bundle:
        return parse_rank(bundle.profiles[0], bundle.read)


def test_entry_round_trips(real: Path, cache_dir: Path) -> None:
    parsed = _rank0(real)
    assert cache.store(CacheDir(cache_dir), "k", parsed)
    assert (cache_dir / "k" / cache.EVENTS_FILE).is_file()
    back = cache.load_cached(CacheDir(cache_dir), "k")
    assert back.events.schema.equals(schema.IN_MEMORY_EVENTS)
    assert back.events.equals(schema.in_memory(parsed.events))
    assert back.events.cast(schema.EVENTS).equals(parsed.events)
    assert (back.rank, back.groups, back.meta, back.warnings) == (
        parsed.rank, parsed.groups, parsed.meta, parsed.warnings)


def test_damaged_entry_is_a_miss(real: Path, cache_dir: Path) -> None:
    folder = CacheDir(cache_dir)
    cache.store(folder, "k", _rank0(real))
    (cache_dir / "k" / cache.EVENTS_FILE).write_bytes(b"not arrow")
    assert cache.load_cached(folder, "k") is None
    assert cache.load_cached(folder, "absent") is None


def test_warm_load_equals_cold(real: Path, cache_dir: Path) -> None:
    cold = tracegraph.load(real / GLOO, cache_dir=cache_dir, jobs=2)
    warm = tracegraph.load(real / GLOO, cache_dir=cache_dir, jobs=2)
    uncached = tracegraph.load(real / GLOO, use_cache=False, jobs=1)
    assert not any(cache_dir.glob(".handoff-*"))  # the workers' files became entries
    assert len(list(cache_dir.glob(f"*/{cache.EVENTS_FILE}"))) == len(cold.ranks)
    for other in (warm, uncached):
        assert other.events.equals(cold.events)
        assert (other.events.dtypes == cold.events.dtypes).all()
        assert other.groups.equals(cold.groups) and other.ranks.equals(cold.ranks)


def test_in_memory_layout_keeps_values() -> None:
    table = schema.events_table({"name": pa.array(["a", "b"]), "start_ns": [1, 2]}, 2)
    moved = schema.in_memory(table)
    assert moved.schema.field("name").type == schema.CODED_STRING
    assert moved.cast(schema.EVENTS).equals(table)
    assert schema.in_memory(moved) is moved


def test_events_frame_merges_ranks_one_by_one() -> None:
    """The Trace's DataFrame, filled rank by rank, holds what concatenating the ranks' tables
    holds: dictionaries that differ per rank are merged, and each rank's table is let go."""
    first = schema.events_table({"name": pa.array(["b", "a", "b"]), "start_ns": [1, 2, 3],
                                 "lane": pa.array(["s", "s", "t"])}, 3)
    second = schema.events_table({"name": pa.array(["c", "a"]), "start_ns": [4, 5]}, 2)
    ranks = [schema.in_memory(first), schema.in_memory(second)]
    expected = pa.concat_tables([first, second]).to_pandas()
    frame = events_frame(ranks)
    assert ranks == []  # each table was dropped once copied
    assert frame["name"].tolist() == ["b", "a", "b", "c", "a"]
    assert frame["lane"].tolist() == ["s", "s", "t", "", ""]
    assert list(frame["name"].cat.categories) == ["b", "a", "c"]
    for column in expected.columns:
        assert frame[column].astype(expected[column].dtype).tolist() == expected[column].tolist()
    assert (frame.dtypes[[c for c in expected if c not in schema.STRING_DEFAULTS]]
            == expected.dtypes[[c for c in expected if c not in schema.STRING_DEFAULTS]]).all()
