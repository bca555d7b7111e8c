"""The Dask path gives the same tables and the same analysis as the local process pool."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

import tracegraph
from tests.conftest import SAMPLES
from tracegraph.analysis.analyze import analyze
from tracegraph.graph.match import match
from tracegraph.graph.ops import build_ops
from tracegraph.loading.distributed import dask_executor


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
