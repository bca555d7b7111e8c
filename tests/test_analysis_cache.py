"""The analysis cache: a second run reads what the first computed, whole and equal; another
option is another entry; a damaged or stale entry is computed again, with a warning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

import tracegraph
from tests.conftest import SAMPLES
from tests.test_snapshot import same
from tracegraph import snapshot
from tracegraph.analysis import cache as analysis_cache
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.analysis.critical_path import PathSegment
from tracegraph.analysis.findings import find_all
from tracegraph.analysis.overlap import overlap_ratios
from tracegraph.analysis.pipeline import recover
from tracegraph.analysis.summary import summarize
from tracegraph.loading.cachedir import CacheDir

BUNDLES = {
    "gloo": "kineto/gloo_pp2_dp2",
    "ddp8": "ascend/torch_npu_ddp8_level1",
    "ep-kineto": SAMPLES / "simulated/ep-a2a-overlap-kineto.tar.gz",
    "seed-ascend": SAMPLES / "simulated/hsdp-straggler-sync-ascend.tar.gz",
}


def _bundle(real: Path, name: str) -> Path:
    where = BUNDLES[name]
    return where if isinstance(where, Path) else real / where


def remembered(trace, store: Path, warnings: list[str], threshold_ms: float = 1.0,
               compute=None) -> Analysis:
    return analysis_cache.remembered(
        trace, CacheDir(store, warn=warnings.append), "analysis", {"threshold_ms": threshold_ms},
        compute or (lambda: analyze(trace, threshold_ms=threshold_ms)), warnings.append)


def _entries(store: Path) -> list[Path]:
    return sorted(store.glob("analysis-*"))


def _not_again() -> Analysis:
    raise AssertionError("computed again")


@pytest.mark.parametrize("name", BUNDLES)
def test_a_cached_analysis_is_the_computed_one(real: Path, tmp_path: Path, name: str) -> None:
    """Every attribute of every object of the analysis comes back equal, shared objects stay
    shared, and what analyze prints is the same."""
    store, warnings = tmp_path / "cache", []
    trace = tracegraph.load(_bundle(real, name), cache_dir=store)
    computed = remembered(trace, store, warnings)
    again = tracegraph.load(_bundle(real, name), cache_dir=store)
    cached = remembered(again, store, warnings, compute=_not_again)
    assert not warnings and len(_entries(store)) == 1
    assert cached.trace is again and "events" not in vars(again)  # served without the events
    assert same({k: v for k, v in vars(cached).items() if k != "trace"},
                {k: v for k, v in vars(computed).items() if k != "trace"})
    assert cached.graph.ops is cached.ops and cached.start is cached.graph.start
    assert _everything(cached) == _everything(computed)
    assert len(cached.bubbles) == len(computed.bubbles) and cached.bubbles


@pytest.mark.parametrize("name", ["ep-kineto", "seed-ascend"])
def test_cached_findings_are_the_found_ones(real: Path, tmp_path: Path, name: str) -> None:
    """report keeps the findings beside the analysis: read back, they say what was found."""
    store, warnings = tmp_path / "cache", []
    trace = tracegraph.load(_bundle(real, name), cache_dir=store)
    analysis = remembered(trace, store, warnings)
    found = find_all(analysis, recover(analysis))
    assert found  # the simulated causes are findings
    keep = [trace, CacheDir(store), "findings", {"threshold_ms": 1.0}]
    analysis_cache.remembered(*keep, lambda: found, warnings.append)
    again = analysis_cache.remembered(*keep, _not_again, warnings.append)
    assert not warnings and [f.as_dict() for f in again] == [f.as_dict() for f in found]


def _everything(analysis: Analysis) -> dict[str, object]:
    """The whole summary: bubbles, blame, paths, gain ceilings, findings, pipeline schedule and
    the communication overlap per rank."""
    pipeline = recover(analysis)
    return summarize(analysis, top=0, findings=find_all(analysis, pipeline),
                     pipeline=pipeline) | {"overlap": overlap_ratios(analysis, by_rank=True)}


def test_the_cache_holds_whatever_the_analysis_holds(real: Path, tmp_path: Path) -> None:
    """Generic over fields: an attribute a later stage adds (here: objects of the project, a
    table and arrays) is stored and read back like the rest, without naming it anywhere."""
    trace = tracegraph.load(real / BUNDLES["gloo"], use_cache=False)
    analysis = analyze(trace)
    analysis.findings = {"slow": [PathSegment(1, "l", "n", "wait", "c", 0, 5)],
                         "table": analysis.steps.assign(extra=np.arange(len(analysis.steps)))}
    snapshot.save(analysis, tmp_path / "s", {"trace": trace})
    back = snapshot.load(tmp_path / "s", {"trace": trace})
    assert same(back.findings, analysis.findings)


def test_options_that_change_results_are_other_entries(real: Path, tmp_path: Path) -> None:
    store, warnings = tmp_path / "cache", []
    trace = tracegraph.load(real / BUNDLES["gloo"], cache_dir=store)
    fine = remembered(trace, store, warnings, threshold_ms=1.0)
    coarse = remembered(trace, store, warnings, threshold_ms=50.0)
    assert len(_entries(store)) == 2
    assert len(coarse.bubbles) < len(fine.bubbles)
    assert len(remembered(trace, store, warnings, 50.0, _not_again).bubbles) == len(
        coarse.bubbles)


def test_another_code_version_is_another_entry(real: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tracegraph.load(real / BUNDLES["gloo"], cache_dir=tmp_path / "cache")
    key = analysis_cache.entry_key(trace, "analysis", {"threshold_ms": 1.0})
    monkeypatch.setattr(analysis_cache, "ANALYSIS_VERSION", "changed")
    assert analysis_cache.entry_key(trace, "analysis", {"threshold_ms": 1.0}) != key
    monkeypatch.undo()
    analysis_cache.code_digest.cache_clear()
    monkeypatch.setattr(analysis_cache, "_CODE", tmp_path / "elsewhere")  # no sources there
    assert analysis_cache.entry_key(trace, "analysis", {"threshold_ms": 1.0}) != key
    analysis_cache.code_digest.cache_clear()


def _damage(entry: Path, how: str) -> None:
    skeleton = entry / snapshot.SKELETON
    if how == "truncated arrays":
        data = (entry / snapshot.ARRAYS).read_bytes()
        (entry / snapshot.ARRAYS).write_bytes(data[: len(data) // 3])
    elif how == "garbage":
        skeleton.write_bytes(b"\x00not json")
    elif how == "stale class":  # written when Analysis had no `steps` field
        tree = orjson.loads(skeleton.read_bytes())
        del tree["root"]["state"]["steps"]
        skeleton.write_bytes(orjson.dumps(tree))
    elif how == "foreign class":  # a poisoned entry naming code to run
        tree = orjson.loads(skeleton.read_bytes())
        tree["root"]["object"] = "os:system"
        skeleton.write_bytes(orjson.dumps(tree))


@pytest.mark.parametrize("how", ["truncated arrays", "garbage", "stale class", "foreign class"])
def test_a_bad_entry_is_computed_again_with_a_warning(real: Path, tmp_path: Path,
                                                      how: str) -> None:
    store, warnings = tmp_path / "cache", []
    trace = tracegraph.load(real / BUNDLES["gloo"], cache_dir=store)
    computed = remembered(trace, store, warnings)
    [entry] = _entries(store)
    _damage(entry, how)
    again = remembered(trace, store, warnings)
    assert len(warnings) == 1 and warnings[0].startswith("cached analysis unreadable")
    assert summarize(again, top=0) == summarize(computed, top=0)
    rewritten: list[str] = []
    remembered(trace, store, rewritten, compute=_not_again)
    assert not rewritten


def test_a_cache_that_cannot_be_written_only_warns(real: Path, tmp_path: Path) -> None:
    store, warnings = tmp_path / "not-a-folder", []
    store.write_text("")
    trace = tracegraph.load(real / BUNDLES["gloo"], use_cache=False)
    analysis = remembered(trace, store, warnings)
    assert analysis.bubbles and store.is_file()
    assert len(warnings) == 1 and warnings[0].startswith(f"cache {store} unusable: ")


def tracegraph_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracegraph", *args], capture_output=True,
                          text=True, timeout=300)


def test_every_analysing_command_reads_the_entry_analyze_wrote(tmp_path: Path) -> None:
    """analyze writes the entry; report, check, diff, graph, whatif and export read it (a
    damaged entry is what shows that they looked: each one warns); --no-cache neither reads
    nor writes it."""
    bundle, cache = SAMPLES / "gloo_pp2_dp2", tmp_path / "cache"
    first = tracegraph_cli("analyze", str(bundle), "--json", "--cache-dir", str(cache))
    second = tracegraph_cli("analyze", str(bundle), "--json", "--cache-dir", str(cache))
    assert first.returncode == second.returncode == 0, first.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)
    assert len(list(cache.glob("summary-*"))) == 1  # the JSON itself: read, not summarized
    for _ in range(2):  # a step the bundle lacks is an error however warm the cache
        run = tracegraph_cli("analyze", str(bundle), "--json", "--step", "999", "--cache-dir",
                             str(cache))
        assert run.returncode == 2 and "no step 999" in run.stderr, run.stderr
    [entry] = _entries(cache)
    commands = {"report": ["-o", str(tmp_path / "r.html")],
                "check": ["--preset", "hsdp-async-reduction", "--allow-not-applicable"],
                "diff": [str(SAMPLES / "gloo_pp2_dp2_fixed"), "--fail-on-regression", "off"],
                "graph": ["-o", str(tmp_path / "g.json")],
                "whatif": ["--straggler", "1"],
                "export": ["--chrome", str(tmp_path / "t.json")]}
    for command, args in commands.items():
        _damage(entry, "garbage")
        run = tracegraph_cli(command, str(bundle), *args, "--cache-dir", str(cache))
        assert run.returncode in (0, 1), run.stderr
        assert "cached analysis unreadable, computed again" in run.stderr, command
    shutil.rmtree(cache)
    run = tracegraph_cli("analyze", str(bundle), "--no-cache", "--json", "--cache-dir",
                         str(cache))
    assert run.returncode == 0 and not cache.exists()
