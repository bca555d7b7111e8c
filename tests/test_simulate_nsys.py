"""Every simulated scenario written as Nsight Systems exports gives the verdicts of the same
schedule written as Kineto traces: the same bubbles, roots, causal chains and critical paths
(times within 1 %).

The one difference is by design: NCCL's NVTX payloads name a communicator by its id only, never
its role, so a collective whose category comes from its process group's description in Kineto's
pg_config (DP / HSDP reduction, TP, CP) is charged to `collective` from an nsys export, the
category of communication whose parallel dimension is unknown. All-to-all and P2P keep theirs:
their comm type says it.
"""

from __future__ import annotations

import sqlite3
import tarfile
from contextlib import closing
from pathlib import Path

import pytest

import tracegraph
from tests.conftest import REAL
from tracegraph import causes
from tracegraph.analysis.analyze import Analysis, analyze
from tracegraph.simulate import simulate
from tracegraph.simulate.bundle_writer import write_bundle
from tracegraph.simulate.scenarios import SCENARIOS

NAMED_BY_THE_GROUP = {causes.DP_REDUCTION, causes.TP_COLLECTIVE, causes.CP_COLLECTIVE}
SHRUNK = {"large": {"kernels_per_chunk": 20}}  # its ~1M kernels a rank serve benchmarks


def plain(category: str) -> str:
    """A Kineto category as an nsys export can know it."""
    return causes.COLLECTIVE if category in NAMED_BY_THE_GROUP else category


def analysed(scenario: str, fmt: str, where: Path) -> Analysis:
    timeline = simulate(scenario, seed=0, steps=1, **SHRUNK.get(scenario, {}))
    bundle = write_bundle(timeline, where / f"{scenario}-{fmt}.tar.gz", fmt)
    return analyze(tracegraph.load(bundle, use_cache=False))


def near(a: int, b: int, scale: int) -> bool:
    return abs(a - b) <= 0.01 * max(scale, 1)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_nsys_gives_the_kineto_verdicts(scenario: str, tmp_path: Path):
    kineto, nsys = analysed(scenario, "kineto", tmp_path), analysed(scenario, "nsys", tmp_path)
    assert nsys.trace.rank_ids == kineto.trace.rank_ids
    ours = sorted(nsys.bubbles, key=lambda b: (b.rank, b.lane, b.start))
    theirs = sorted(kineto.bubbles, key=lambda b: (b.rank, b.lane, b.start))
    assert len(ours) == len(theirs) > 0
    for mine, want in zip(ours, theirs, strict=True):
        assert (mine.rank, mine.lane, mine.step) == (want.rank, want.lane, want.step)
        assert near(mine.start, want.start, want.dur) and near(mine.end, want.end, want.dur)
        assert mine.category == plain(want.category)
        assert (mine.root is None) == (want.root is None)
        if want.root is not None:
            assert (mine.root.rank, mine.root.lane, mine.root.name, mine.root.category) == (
                want.root.rank, want.root.lane, want.root.name, plain(want.root.category))
        assert [(p.rank, p.category) for p in mine.intervals] == [
            (p.rank, plain(p.category)) for p in want.intervals]
        assert all(near(p.dur, q.dur, want.dur) for p, q in zip(mine.intervals, want.intervals,
                                                                 strict=True))
    for step, path in kineto.critical_paths.items():
        found = nsys.critical_paths[step]
        length = sum(s.end - s.start for s in path)
        assert near(sum(s.end - s.start for s in found), length, length)
        assert [(s.rank, s.kind, plain(s.category)) for s in found] == [
            (s.rank, s.kind, plain(s.category)) for s in path]
    assert not {i.category for b in nsys.bubbles for i in b.intervals} & NAMED_BY_THE_GROUP


def test_simulated_exports_have_nothing_the_real_ones_lack(tmp_path: Path):
    """Every table and column a simulated export holds is one the real 2022.1 export has."""
    timeline = simulate("pp-compute-healthy", seed=0, steps=1)
    write_bundle(timeline, tmp_path / "pp.tar.gz", "nsys")
    with tarfile.open(tmp_path / "pp.tar.gz") as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".sqlite"))
        (tmp_path / "node.sqlite").write_bytes(archive.extractfile(member).read())
    simulated = schema_of(tmp_path / "node.sqlite")
    real = schema_of(REAL / "nsys" / "extrap_concurrent_s4.sqlite")
    assert simulated.keys() <= real.keys()
    assert {t: c - real[t] for t, c in simulated.items() if c - real[t]} == {}


def schema_of(path: Path) -> dict[str, set[str]]:
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: {c[1] for c in conn.execute(f"PRAGMA table_info('{n}')")} for n in names}


def test_times_keep_every_nanosecond_beside_a_null(tmp_path: Path):
    """NVTX_EVENTS' `end` is NULL on a domain's creation row, so the column reads as floats:
    each range's end must still be its exported ns on the wall clock, not rounded to 256 ns
    (which made NCCL's zero-length group ranges end before they began)."""
    timeline = simulate("hsdp-straggler-sync", seed=0, steps=1)
    bundle = write_bundle(timeline, tmp_path / "seed.tar.gz", "nsys")
    with tarfile.open(bundle) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("node0.sqlite"))
        (tmp_path / "node0.sqlite").write_bytes(archive.extractfile(member).read())
    with closing(sqlite3.connect(tmp_path / "node0.sqlite")) as conn:
        assert conn.execute("SELECT count(*) FROM NVTX_EVENTS WHERE end IS NULL").fetchone()[0]
        exported = conn.execute("SELECT min(end - start) FROM NVTX_EVENTS WHERE eventType = 59 "
                                "AND text = 'ncclGroupStart'").fetchone()[0]
    trace = tracegraph.load(bundle, use_cache=False)
    assert not [w for w in trace.warnings if "negative durations" in w]
    events = trace.events
    groups = events[(events["rank"] == 0) & (events["name"] == "ncclGroupStart")]
    assert len(groups) and int(groups["dur_ns"].min()) == exported
