"""The parse cache: Arrow IPC entries that load back exactly; damaged ones are misses."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import tracegraph
from parsers import parse_rank
from parsers.bundle import open_bundle
from tracegraph import schema
from tracegraph.loading import cache

GLOO = "kineto/gloo_pp2_dp2"


def _rank0(real: Path):
    with open_bundle(real / GLOO) as bundle:
        return parse_rank(bundle.profiles[0], bundle.read)


def test_entry_round_trips(real: Path, cache_dir: Path) -> None:
    parsed = _rank0(real)
    cache.store(cache_dir, "k", parsed)
    assert (cache_dir / "k" / cache.EVENTS_FILE).is_file()
    back = cache.load_cached(cache_dir, "k")
    assert back.events.schema.equals(schema.IN_MEMORY_EVENTS)
    assert back.events.equals(schema.in_memory(parsed.events))
    assert back.events.cast(schema.EVENTS).equals(parsed.events)
    assert (back.rank, back.groups, back.meta, back.warnings) == (
        parsed.rank, parsed.groups, parsed.meta, parsed.warnings)


def test_damaged_entry_is_a_miss(real: Path, cache_dir: Path) -> None:
    cache.store(cache_dir, "k", _rank0(real))
    (cache_dir / "k" / cache.EVENTS_FILE).write_bytes(b"not arrow")
    assert cache.load_cached(cache_dir, "k") is None
    assert cache.load_cached(cache_dir, "absent") is None


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
