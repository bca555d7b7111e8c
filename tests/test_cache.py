"""The parse cache: Arrow IPC entries that load back exactly; damaged ones are misses; keys
that are the ranks' bytes; the cache folder: its cap, leftovers, links, permissions, and the
`tracegraph cache` command."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

import tracegraph
from parsers import parse_rank
from parsers.bundle import open_bundle
from tests import fuzz
from tests.conftest import SAMPLES
from tracegraph import schema
from tracegraph.cli.app import app
from tracegraph.loading import cache
from tracegraph.loading.cachedir import CacheDir, clear, entries
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


# --- keys are the bytes -------------------------------------------------------------------------
def _rewritten_in_place(path: Path, old: bytes, new: bytes) -> None:
    """`path` with `old` replaced by `new` (as long), its size and times kept: what rsync -a,
    cp -p, tar x or a rewrite within one clock tick leave."""
    before = path.stat()
    data = path.read_bytes()
    assert old in data and len(old) == len(new)
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("layout", ["folder", "file", "tar member"])
def test_a_rank_rewritten_with_its_size_and_time_is_parsed_again(real: Path, tmp_path: Path,
                                                                  layout: str) -> None:
    folder = tmp_path / "job"
    shutil.copytree(real / GLOO, folder)
    bundle = {"folder": folder, "file": folder / "rank1.json",
              "tar member": tmp_path / "job.tar"}[layout]
    if layout == "tar member":
        with tarfile.open(bundle, "w") as tar:
            tar.add(folder, "job")
    store = tmp_path / "cache"
    before = tracegraph.load(bundle, cache_dir=store, jobs=1)
    _rewritten_in_place(bundle if bundle.is_file() else folder / "rank1.json",
                        b'"aten::mm"', b'"aten::MM"')
    after = tracegraph.load(bundle, cache_dir=store, jobs=1)
    assert "aten::MM" in set(after.events["name"]) - set(before.events["name"])
    assert after.events.equals(tracegraph.load(bundle, use_cache=False, jobs=1).events)


# --- the folder: cap, leftovers, no needless writes ----------------------------------------------
def _filled(folder: Path) -> None:
    (folder / "data").write_bytes(bytes(1000))


def test_the_cap_evicts_the_least_recently_used_entries(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    for age, name in enumerate(("a" * 32, "b" * 32, "c" * 32)):  # a written first, c last
        assert CacheDir(root).put(name, _filled)
        os.utime(root / name, (10_000 + age, 10_000 + age))
    run = CacheDir(root, limit=2500)
    assert run.entry("a" * 32) is not None  # read by this run: used most recently now
    assert run.put("d" * 32, _filled)  # 4000 bytes held: over the cap
    assert sorted(e.name[0] for e in entries(root)) == ["a", "d"]
    assert sum(e.size for e in entries(root)) <= 2500


def test_this_runs_entries_stay_whatever_the_cap(tmp_path: Path) -> None:
    run = CacheDir(tmp_path / "cache", limit=1500)
    for name in ("a" * 32, "b" * 32):
        assert run.put(name, _filled)
    assert sorted(e.name[0] for e in entries(tmp_path / "cache")) == ["a", "b"]


def test_leftovers_of_dead_runs_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    dead, live = root / ".handoff-dead", root / ".tmp-live"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "0.arrow").write_bytes(b"half written")
    lock = os.open(live, os.O_RDONLY)  # as its writer holds it while it lives
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (root / "notes.txt").write_text("not ours")
        assert CacheDir(root).put("e" * 32, _filled)
        assert not dead.exists() and live.exists() and (root / "notes.txt").exists()
    finally:
        os.close(lock)
    assert clear(root) == (1, 1000)
    assert sorted(p.name for p in root.iterdir()) == ["CACHEDIR.TAG", "notes.txt"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_mtime_ns)
            for p in root.rglob("*")}


def test_a_run_that_finds_everything_cached_writes_nothing(tmp_path: Path) -> None:
    store, runner = tmp_path / "cache", CliRunner()
    args = ["analyze", str(SAMPLES / "gloo_pp2_dp2"), "--json", "--cache-dir", str(store)]
    first = runner.invoke(app, args)
    tree = _tree(store)
    second = runner.invoke(app, args)
    assert first.exit_code == second.exit_code == 0 and second.stdout == first.stdout
    assert _tree(store) == tree  # nothing added, removed or rewritten; no hand-off folder


def test_entries_are_private_whatever_the_umask(real: Path, tmp_path: Path) -> None:
    store = tmp_path / "cache"
    old = os.umask(0)
    try:
        tracegraph.load(real / GLOO / "rank0.json", cache_dir=store, jobs=1)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [store, *store.rglob("*")]}
    assert len(modes) > 4 and set(modes.values()) == {0o700, 0o600}
    assert all(modes[p.name] == 0o700 for p in [store, *store.rglob("*")] if p.is_dir())


def test_links_planted_in_the_cache_are_never_followed(real: Path, tmp_path: Path) -> None:
    """A link at an entry's name (to an entry poisoned elsewhere) is a miss, and nothing is
    written through it; nor through links at the old, predictable temporary names."""
    bundle, store, elsewhere = real / GLOO / "rank0.json", tmp_path / "cache", tmp_path / "x"
    first = tracegraph.load(bundle, cache_dir=store, jobs=1)
    elsewhere.mkdir()
    for entry in [p for p in store.iterdir() if p.is_dir()]:
        shutil.move(entry, elsewhere / entry.name)
        meta = elsewhere / entry.name / "meta.json"
        meta.write_text(meta.read_text().replace('"rank": 0', '"rank": 5'))
        entry.symlink_to(elsewhere / entry.name)
        (store / f".{entry.name}.{os.getpid()}.tmp").symlink_to(tmp_path / "target")
    planted = fuzz.fingerprint(elsewhere)
    again = tracegraph.load(bundle, cache_dir=store, jobs=1)
    assert again.rank_ids == first.rank_ids == [0]
    assert again.events.equals(first.events)
    assert fuzz.fingerprint(elsewhere) == planted and not (tmp_path / "target").exists()
    assert all(p.is_symlink() for p in store.iterdir() if not p.name.startswith("CACHEDIR"))


# --- tracegraph cache, --cache-size ------------------------------------------------------------
def test_the_cache_command_tells_and_clears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    store, runner = tmp_path / "cache", CliRunner()
    monkeypatch.setenv("TRACEGRAPH_CACHE_SIZE", "3M")
    analyzed = [runner.invoke(app, ["analyze", str(SAMPLES / name), "--json", "--cache-dir",
                                    str(store)]) for name in ("gloo_pp2_dp2",)]
    assert analyzed[0].exit_code == 0
    kept = {e.name for e in entries(store)}
    later = runner.invoke(app, ["analyze", str(SAMPLES / "gloo_pp2_dp2_fixed"), "--json",
                                "--cache-dir", str(store)])
    assert later.exit_code == 0
    left = {e.name for e in entries(store)}
    assert kept - left and sum(e.size for e in entries(store)) <= 3 << 20  # LRU evicted
    info = json.loads(runner.invoke(app, ["cache", "info", "--json", "--cache-dir", str(store),
                                          "--cache-size", "2G"]).stdout)
    assert info["cap_bytes"] == 2 << 30 and info["entries"] == len(left) == (
        info["parsed_ranks"] + info["analyses"]) and info["parsed_ranks"] == 4
    cleared = runner.invoke(app, ["cache", "clear", "--cache-dir", str(store)])
    assert cleared.stdout.startswith(f"removed {len(left)} entries") and not entries(store)
    monkeypatch.setenv("TRACEGRAPH_CACHE_SIZE", "lots")
    bad = runner.invoke(app, ["analyze", str(SAMPLES / "gloo_pp2_dp2"), "--cache-dir",
                              str(store)])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: $TRACEGRAPH_CACHE_SIZE: ")
    assert runner.invoke(app, ["cache", "info", "--cache-size", "0"]).exit_code == 2
