"""The Dask path gives the same tables and the same analysis as the local process pool, and
the analysis on the cluster the same answers as the local one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tracegraph
from parsers.base import TraceError
from tests.conftest import REPO, SAMPLES
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.distributed import ON_CLUSTER, analyze_on_cluster
from tracegraph.analysis.findings import find_all
from tracegraph.analysis.overlap import overlap_ratios
from tracegraph.analysis.pipeline import recover
from tracegraph.analysis.summary import summarize
from tracegraph.graph.match import match
from tracegraph.graph.ops import build_ops
from tracegraph.loading.distributed import dask_cluster, dask_executor, load_on_cluster


@pytest.fixture(scope="module")
def executor():
    with dask_executor("local", workers=2) as pool:
        yield pool


def test_dask_parse_matches_local(real: Path, executor) -> None:
    local = tracegraph.load(real / "kineto/gloo_pp2_dp2", use_cache=False, jobs=2)
    remote = tracegraph.load(real / "kineto/gloo_pp2_dp2", use_cache=False, executor=executor)
    assert remote.events.equals(local.events)
    assert remote.groups.equals(local.groups)
    before, after = analyze(local), analyze(remote)
    assert [(b.rank, b.start, b.end, b.category) for b in after.bubbles] == [
        (b.rank, b.start, b.end, b.category) for b in before.bubbles]


def test_dask_parses_streamed_archives(real: Path, tmp_path: Path, executor) -> None:
    archive = tmp_path / "ddp8.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(real / "ascend/torch_npu_ddp8_level1", arcname="ddp8")
    local = tracegraph.load(real / "ascend/torch_npu_ddp8_level1", use_cache=False, jobs=1)
    remote = tracegraph.load(archive, use_cache=False, executor=executor)
    assert remote.rank_ids == [0, 1]
    assert len(remote.events) == len(local.events)
    assert remote.events["start_ns"].sum() == local.events["start_ns"].sum()


def test_dask_matching_matches_local(real: Path, tmp_path: Path, executor) -> None:
    """Launches and stream waits matched on the cluster, rank chunks folded back: same result."""
    seen = set()
    for bundle in (real / "ascend/torch_npu_ddp8_level1", real / "kineto/gloo_pp2_dp2",
                   SAMPLES / "simulated/ep-a2a-overlap-kineto.tar.gz"):
        trace = tracegraph.load(bundle, cache_dir=tmp_path)
        ops = build_ops(trace.events)
        local = match(ops, trace.group_members())
        remote = match(ops, trace.group_members(), executor)
        assert (remote.dep >= 0).sum() > 0
        assert np.array_equal(remote.dep, local.dep) and np.array_equal(remote.how, local.how)
        assert np.array_equal(remote.launcher, local.launcher)
        assert remote.gates == local.gates and remote.queued == local.queued
        seen |= set(local.how[local.dep >= 0]) | {name for name, present in (
            ("launch", (local.launcher >= 0).any()), ("gates", local.gates),
            ("queued", local.queued)) if present}
    assert {"timing", "event_id", "launch", "gates", "queued"} <= seen  # every kind was folded


# --- the analysis on the cluster -----------------------------------------------------------------
CLUSTER_BUNDLES = {
    "gloo": "kineto/gloo_pp2_dp2",
    "ddp8": "ascend/torch_npu_ddp8_level1",
    "hta-nccl": "kineto/hta/negative_queue_length_values_check",
    "ep-kineto": SAMPLES / "simulated/ep-a2a-overlap-kineto.tar.gz",
    "seed-ascend": SAMPLES / "simulated/hsdp-straggler-sync-ascend.tar.gz",
    "pp4-corpus": REPO / "tests/data/corpus/pp4_1f1b_bwd_straggler",
}


PIPELINED = {"gloo", "seed-ascend", "pp4-corpus"}  # a pipeline schedule is recovered
NO_CEILINGS = set()  # bundles whose local summary has no gain ceiling to refuse


def _cluster_bundle(real: Path, name: str) -> Path:
    where = CLUSTER_BUNDLES[name]
    return where if isinstance(where, Path) else real / where


@pytest.fixture(scope="module")
def client():
    with dask_cluster("local", workers=2) as held:
        yield held


def _everything(analysis) -> dict[str, object]:
    """The whole summary: bubbles, blame, paths, ceilings, findings and pipeline schedule."""
    pipeline = recover(analysis)
    return summarize(analysis, top=0, findings=find_all(analysis, pipeline), pipeline=pipeline)


@pytest.mark.parametrize("name", CLUSTER_BUNDLES)
def test_the_cluster_loads_and_analyses_as_the_local_pass(real: Path, client, name: str) -> None:
    """Same tables, and the same answers to the last digit: every bubble with its intervals,
    chain and confidence, blame, critical paths, clock offsets, steps, slow ranks, warnings,
    findings, overlap and pipeline schedule (computed rank by rank on the workers); the walks
    went on across parts, and neither the analysis nor its summary brought an event or an op
    to the client. The gain ceilings, a replay of the whole graph, are refused, saying why."""
    bundle = _cluster_bundle(real, name)
    local_trace = tracegraph.load(bundle, use_cache=False)
    trace = load_on_cluster(bundle, client, use_cache=False)
    assert trace.groups.equals(local_trace.groups) and trace.ranks.equals(local_trace.ranks)
    assert trace.warnings == local_trace.warnings
    analysis = analyze_on_cluster(trace)
    local = analyze(local_trace)
    remote_summary, local_summary = _everything(analysis), _everything(local)
    assert remote_summary.pop("gain_ceilings") == {"causes": [], "refused": [ON_CLUSTER]}
    assert local_summary.pop("gain_ceilings")["causes"] or name in NO_CEILINGS
    assert remote_summary == local_summary
    assert overlap_ratios(analysis, by_rank=True) == overlap_ratios(local, by_rank=True)
    assert bool(remote_summary.get("pipeline", {}).get("steps")) == (name in PIPELINED)
    assert remote_summary["findings"]
    held = not {"ops", "graph", "start"} & set(vars(analysis)) and "events" not in vars(trace)
    assert held and analysis.held
    assert trace.memory.equals(local_trace.memory)
    assert analysis.parts == min(4, len(trace.ranks))  # two per worker
    part = {rank: k for k, ranks in enumerate(np.array_split(trace.rank_ids, analysis.parts))
            for rank in ranks}
    crossing = any(len({part[r] for r in b.chain() if r in part}) > 1 for b in analysis.bubbles)
    if crossing:  # a chain ran through ranks of two parts: its walk went on in the other
        assert analysis.reaches > 0
    assert trace.events.equals(local_trace.events)  # gathered when asked


def test_the_cluster_checks_the_ranks_as_the_local_load(tmp_path: Path, client) -> None:
    """A copy of a rank's profile is read once with the same warning (its events compared on
    the workers); a different profile of the same rank is the same error."""
    bundle = tmp_path / "job"
    shutil.copytree(SAMPLES / "gloo_pp2_dp2", bundle)
    shutil.copy(bundle / "rank0.json", bundle / "rank0_copy.json")
    local = tracegraph.load(bundle, use_cache=False)
    remote = load_on_cluster(bundle, client, use_cache=False)
    assert "rank 0: rank0_copy.json is a copy of rank0.json; read once" in remote.warnings
    assert remote.warnings == local.warnings and remote.ranks.equals(local.ranks)
    (bundle / "rank0_copy.json").write_text((bundle / "rank1.json").read_text().replace(
        '"rank": 1', '"rank": 0'))
    with pytest.raises(TraceError, match="duplicate rank 0") as local_error:
        tracegraph.load(bundle, use_cache=False)
    with pytest.raises(TraceError, match="duplicate rank 0") as remote_error:
        load_on_cluster(bundle, client, use_cache=False)
    assert str(remote_error.value) == str(local_error.value)


def test_detail_is_gathered_from_the_parts_when_read(real: Path, client) -> None:
    """What report, check, diff and graph read (ops, matches, graph, op times) comes back from
    the parts equal to the local pass'; edges inferred by the walks included."""
    bundle = _cluster_bundle(real, "gloo")
    local = analyze(tracegraph.load(bundle, use_cache=False))
    remote = analyze_on_cluster(load_on_cluster(bundle, client, use_cache=False))
    for column in local.ops.frame:
        assert (local.ops.frame[column].astype(object).to_numpy()
                == remote.ops.frame[column].astype(object).to_numpy()).all(), column
    assert local.ops.lanes.equals(remote.ops.lanes)
    assert np.array_equal(local.start, remote.start) and np.array_equal(local.end, remote.end)
    for name in ("dep", "how", "launcher"):
        assert np.array_equal(getattr(local.matches, name), getattr(remote.matches, name))
    assert local.matches.gates == remote.matches.gates
    assert local.matches.queued == remote.matches.queued

    def edges(graph) -> set:
        e = graph.edges
        return set(zip(e["src"], e["dst"], e["kind"].astype(str), e["reason"].astype(str),
                       strict=True))

    assert edges(local.graph) == edges(remote.graph)
    assert (remote.graph.edges["kind"] == "host_release").sum() > 10  # inferred by the walks


def test_every_reading_command_runs_on_the_cluster(tmp_path: Path) -> None:
    """`--dask local` on each command that reads a bundle; analyze and whatif print what they
    print without it, but for analyze's gain ceilings and the verdict's fix, refused on a
    cluster with the reason (in the JSON and on the terminal)."""
    bundle = str(SAMPLES / "gloo_pp2_dp2")
    for same in (["analyze", bundle, "--json"], ["whatif", bundle, "--straggler", "1", "--json"]):
        local = _cli(*same, "--no-cache")
        remote = _cli(*same, "--no-cache", "--dask", "local", "--jobs", "2")
        assert local.returncode == remote.returncode == 0, remote.stderr
        local_json, remote_json = json.loads(local.stdout), json.loads(remote.stdout)
        if same[0] == "analyze":
            assert local_json.pop("gain_ceilings")["causes"]
            assert remote_json.pop("gain_ceilings") == {"causes": [], "refused": [ON_CLUSTER]}
            assert local_json["verdict"].pop("fix")["gain_ms"] > 190  # rank 1's 200 ms sleep
            assert remote_json["verdict"].pop("fix") == {"cause": "compute_straggler",
                                                         "why": ON_CLUSTER}
            found = (side["verdict"].pop("finding")["title"] for side in (local_json,
                                                                          remote_json))
            local_title, remote_title = found  # the replayed gain said without a cluster only
            assert local_title.startswith(remote_title) and "rank 1 is a" in remote_title
        assert remote_json == local_json
    terminal = _cli("analyze", bundle, "--no-cache", "--dask", "local", "--jobs", "2")
    assert f"gain ceilings not computed: {ON_CLUSTER}" in " ".join(terminal.stdout.split())
    for command, args in {"report": ["-o", str(tmp_path / "r.html")],
                          "check": ["--preset", "hsdp-async-reduction",
                                    "--allow-not-applicable"],
                          "diff": [str(SAMPLES / "gloo_pp2_dp2_fixed"),
                                   "--fail-on-regression", "off"],
                          "graph": ["-o", str(tmp_path / "g.json")],
                          "export": ["--parquet", str(tmp_path / "tables")]}.items():
        run = _cli(command, bundle, *args, "--no-cache", "--dask", "local", "--jobs", "2")
        assert run.returncode in (0, 1) and "Traceback" not in run.stderr, (command, run.stderr)
        assert "wrote" in run.stdout or "checks" in run.stdout or "step" in run.stdout, command


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracegraph", *args], capture_output=True,
                          text=True, timeout=600)


def test_workers_keep_the_rank_cache(real: Path, client, tmp_path: Path) -> None:
    """Workers store each rank they parse in the cache and read it back next time (the same
    entries a local load makes and reads)."""
    bundle = real / CLUSTER_BUNDLES["gloo"]
    first = load_on_cluster(bundle, client, cache_dir=tmp_path)
    entries = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(entries) == 4
    local = tracegraph.load(bundle, cache_dir=tmp_path)  # hits: nothing new written
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == entries
    again = load_on_cluster(bundle, client, cache_dir=tmp_path)
    assert again.events.equals(first.events) and again.events.equals(local.events)
    assert again.fingerprint == first.fingerprint == local.fingerprint


@pytest.mark.parametrize("archive", [False, True])
def test_a_rank_that_does_not_read_is_left_out_on_the_cluster(tmp_path: Path, client,
                                                              archive: bool) -> None:
    """As in a local load (tests/test_unreadable_rank.py): the malformed database's rank is
    left out with its warning, the other rank held on the cluster."""
    from tests.test_unreadable_rank import MALFORMED, _damaged_db, _tar

    bundle = _damaged_db(tmp_path)
    trace = load_on_cluster(_tar(bundle) if archive else bundle, client, use_cache=False)
    assert list(trace.ranks["rank"]) == [1] and len(trace.held) == 1
    assert any(MALFORMED in w and "is left out" in w for w in trace.warnings)


def test_the_cluster_leaves_out_the_step_the_profile_cut(real: Path, client) -> None:
    """HTA's MI250 trace, whose ProfilerStep#2 the profile's end cut (tests/test_cut_steps.py):
    the same steps and warning as the local pass."""
    bundle = real / "kineto/hta/amd_trace"
    remote = analyze_on_cluster(load_on_cluster(bundle, client, use_cache=False))
    local = analyze(tracegraph.load(bundle, use_cache=False))
    assert list(remote.step_table()["step"]) == [1]
    assert remote.step_table().equals(local.step_table())
    assert [w for w in remote.warnings if "cut short" in w] == [
        w for w in local.warnings if "cut short" in w] != []
