"""The training-step simulator: schedule, engine timing, scenarios and their ground truth.

Known answers come from three places, each named where used: the seed issue's table
(/work/shared/seeds/mindspore-hyper-parallel-issue-390.zh.md, numbers copied by hand), pipeline
theory ((p-1)/(v*m) bubble ratio, Megatron's schedule order), and small engine programs whose
timing is worked out by hand in the comments.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from parsers.classify import double_hash, parse_hccl_name
from tracegraph.causes import (
    COMPUTE_STRAGGLER,
    DP_REDUCTION,
    EP_ALLTOALL,
    HOST_LAUNCH,
    PIPELINE_FILL,
    PP_P2P,
)
from tracegraph.schema import COLLECTIVE, COMPUTE, P2P, RECORD, WAIT
from tracegraph.simulate import SCENARIOS, simulate
from tracegraph.simulate import schedule as sch
from tracegraph.simulate.model import Engine
from tracegraph.simulate.scenarios import SEED_LAYOUT
from tracegraph.simulate.timeline import TIMELINE_COLUMNS

SEED_TOL_MS = 3.0  # "within a few ms" of the seed table


@pytest.fixture(scope="module")
def sync():
    return simulate("hsdp-straggler-sync")


@pytest.fixture(scope="module")
def async_():
    return simulate("hsdp-straggler-async")


def step1_bubbles(tl, rank=None):
    return [b for b in tl.ground_truth["bubbles"]
            if b["step"] == 1 and (rank is None or b["rank"] == rank)]


def seconds_by_category(tl) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for bubble in tl.ground_truth["bubbles"]:
        for part in bubble["intervals"]:
            out[part["category"]] += part["end_ms"] - part["start_ms"]
    return out


def runs(intervals):
    """Consecutive intervals of one category joined: [(category, start_ms, end_ms, ranks)]."""
    out = []
    for part in intervals:
        if out and out[-1][0] == part["category"]:
            out[-1] = (part["category"], out[-1][1], part["end_ms"], out[-1][3] | {part["rank"]})
        else:
            out.append((part["category"], part["start_ms"], part["end_ms"], {part["rank"]}))
    return out


# --- schedule ------------------------------------------------------------------------------
def test_seed_layout_gives_layers_per_chunk():
    # "0-5,24-29" ...: chunk k*p+s holds stage s's k-th range; the last one is 42-44 (3 layers).
    assert sch.layer_counts(SEED_LAYOUT, 4, 2, 45) == [6, 6, 6, 6, 6, 6, 6, 3]
    with pytest.raises(ValueError, match="needs 2 ranges"):
        sch.layer_counts(("0-5", "6-11", "12-17", "18-23"), 4, 2, 24)


def test_interleaved_order_matches_the_seed_issue():
    # The issue lists rank 12288 (stage 3): BWD(micro15, Stage7) then BWD(micro12, Stage3), and
    # rank 8192 (stage 2): BWD(micro15, Stage6) then BWD(micro12, Stage2).
    s3 = sch.actions(4, 2, 16, 3)
    assert s3[-6:] == [("F", 7, 15), ("B", 7, 15)] + [("B", 3, mb) for mb in range(12, 16)]
    s2 = sch.actions(4, 2, 16, 2)
    assert s2[-6:] == [("B", 6, 14), ("B", 6, 15)] + [("B", 2, mb) for mb in range(12, 16)]


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 2, 16), (2, 3, 4)])
def test_every_microbatch_runs_once_forward_before_backward(p, v, m):
    for stage in range(p):
        seq = sch.actions(p, v, m, stage)
        chunks = [k * p + stage for k in range(v)]
        assert sorted(a for a in seq if a.phase == "F") == [
            ("F", c, mb) for c in chunks for mb in range(m)]
        assert len(seq) == 2 * v * m
        for act in seq:
            if act.phase == "B":
                assert seq.index(("F", act.chunk, act.microbatch)) < seq.index(act)
        # Megatron warmup: (p-s-1)*2 + (v-1)*p forwards (p-s-1 without VPP), then 1F1B.
        warmup = (p - stage - 1) * 2 + (v - 1) * p if v > 1 else p - stage - 1
        first_b = next(i for i, a in enumerate(seq) if a.phase == "B")
        assert first_b == min(warmup, v * m) + 1


# --- engine, on programs timed by hand ------------------------------------------------------
def test_p2p_ends_when_the_later_peer_posts_plus_transfer():
    eng = Engine()
    early = eng.add(0, 2, P2P, group="g", dur=500)  # rank 0 posts at 0
    eng.add(1, 1, COMPUTE, dur=4_000)
    late = eng.add(1, 1, P2P, group="g", dur=500)  # rank 1 posts after 4 us of compute
    after = eng.add(0, 2, COMPUTE, dur=1_000)  # behind rank 0's P2P on its stream
    eng.run()
    # Both halves end at the later posting (4 us) + 0.5 us transfer.
    assert (early.start, late.start) == (0, 4_000)
    assert early.end == late.end == 4_500
    assert early.ready_dep is late and late.ready_dep is None
    assert after.start == 4_500 and after.start_dep is early


def test_wait_lasts_until_its_record_and_a_deadlock_is_reported():
    eng = Engine()
    work = eng.add(0, 2, COMPUTE, dur=50_000)
    rec = eng.add(0, 2, RECORD, dur=20)
    wait = eng.add(0, 1, WAIT, event_id=rec.event_id, extra=500)
    again = eng.add(0, 1, WAIT, event_id=rec.event_id, extra=500)
    eng.run()
    # The wait starts at 0 and ends 0.5 us after the record executes at 50 us (+20 ns).
    assert (wait.start, wait.end, wait.ready_dep) == (0, 50_520, rec)
    # A second wait on an executed record is non-blocking: ~20 ns, no binding record.
    assert again.end - again.start == 20 and again.ready_dep is None
    assert work.end == 50_000

    stuck = Engine()
    stuck.add(0, 1, WAIT, event_id=0)
    stuck.add(0, 1, RECORD, dur=20)  # the record it waits on sits behind it on its own stream
    with pytest.raises(RuntimeError, match="deadlocks: rank 0 stream 1 wait"):
        stuck.run()


def test_collective_waits_for_its_unprofiled_straggler():
    eng = Engine()
    eng.add(0, 1, COMPUTE, dur=1_000)
    a = eng.add(0, 1, COLLECTIVE, group="dp", dur=2_000)
    b = eng.add(1, 1, COLLECTIVE, group="dp", dur=2_000)
    a.unprofiled = b.unprofiled = (77, 5_000)  # member 77 arrives 5 us after the last profiled
    eng.run()
    # Last profiled member (rank 0) posts at 1 us; member 77 at 6 us; +2 us transfer.
    assert a.end == b.end == 8_000
    assert a.ready == 6_000 and a.ready_dep is None and a.straggler == 77


# --- the seed case ---------------------------------------------------------------------------
def test_seed_rank_4096_wait_and_its_chain(sync):
    # Seed table: rank 4096 EVENT_WAIT on stream 47, 5390.004 ms, 474.035 ms long.
    waits = [b for b in step1_bubbles(sync, 4096) if b["dur_ms"] > 300]
    assert len(waits) == 1
    bubble = waits[0]
    assert bubble["lane"] == "stream 47"
    assert abs(bubble["start_ms"] - 5390.004) < SEED_TOL_MS
    assert abs(bubble["end_ms"] - 5864.039) < SEED_TOL_MS
    assert abs(bubble["dur_ms"] - 474.035) < SEED_TOL_MS
    assert bubble["chain"] == [4096, 8192, 12288]  # 12288 -> 8192 -> 4096 read causally
    assert bubble["category"] == DP_REDUCTION
    # The ops table shows the same EVENT_WAIT on stream 47.
    ops, origin = sync.ops, sync.ground_truth["origin_ns"]
    start_ns = origin + round(bubble["start_ms"] * 1e6)
    hit = ops[(ops["rank"] == 4096) & (ops["stream"] == 47) & (ops["kind"] == WAIT)
              & ((ops["start_ns"] - start_ns).abs() < 1_000)]
    assert len(hit) == 1 and hit["name"].iat[0] == "EVENT_WAIT"
    assert abs(hit["dur_ns"].iat[0] / 1e6 - bubble["dur_ms"]) < 1e-3


def test_seed_decomposition_follows_the_issue(sync):
    # DESIGN.md: 5390.0-5627.5 dp_reduction (8192 waits for 12288's AllReduce
    # tails), 5627.5-5730.7 pipeline_fill (8192 BWD), 5730.7-5863.5 dp_reduction (8192's
    # 32-rank AllReduce), last ~0.5 ms pp_p2p. Between the first two our model also shows the
    # 12288 -> 8192 transfer (~0.5 ms pp_p2p), which the issue's table folds into the wait.
    bubble = next(b for b in step1_bubbles(sync, 4096) if b["dur_ms"] > 300)
    parts = runs(bubble["intervals"])
    assert [p[0] for p in parts] == [DP_REDUCTION, PP_P2P, PIPELINE_FILL, DP_REDUCTION, PP_P2P]
    (_, a0, a1, ar), (_, _, p1, _), (_, f0, f1, fr), (_, d0, d1, dr), (_, t0, t1, _) = parts
    assert ar == {12288} and fr == {8192} and dr == {8192}
    assert abs(f0 - 5627.465) < SEED_TOL_MS and abs(f1 - 5730.712) < SEED_TOL_MS
    assert abs(d1 - 5863.529) < SEED_TOL_MS and 0.3 < t1 - t0 < 1.0
    assert p1 - a1 < 1.5
    tails = [p for p in bubble["intervals"] if p["category"] == DP_REDUCTION]
    assert all("unprofiled" in p["name"] or p["name"].startswith("hcom_allReduce") for p in tails)
    # The intervals tile the bubble exactly.
    assert sum(p["end_ms"] - p["start_ms"] for p in bubble["intervals"]) == pytest.approx(
        bubble["dur_ms"], abs=1e-5)


def test_seed_upstream_rows(sync):
    # Seed table rows for ranks 12288 and 8192.
    def one(rank, lo, hi):
        found = [b for b in step1_bubbles(sync, rank)
                 if abs(b["start_ms"] - lo) < SEED_TOL_MS and abs(b["end_ms"] - hi) < SEED_TOL_MS]
        assert len(found) == 1, (rank, lo, hi)
        return found[0]

    tails = one(12288, 5153.335, 5626.377)  # HSDP AllReduce tails on stream 47
    assert tails["chain"] == [12288] and tails["category"] == DP_REDUCTION
    waits = one(8192, 5219.773, 5627.465)  # waits for 12288's gradient
    assert waits["chain"] == [8192, 12288]
    blocked = one(8192, 5730.713, 5863.529)  # its own 32-rank HSDP AllReduce
    assert blocked["chain"] == [8192] and blocked["root"]["name"].startswith("straggler")
    group = sync.groups[blocked["root"]["group"]]
    assert group.desc == "dp" and len(group.ranks) == 32 and 8192 in group.ranks
    assert blocked["root"]["member"] in group.ranks and blocked["root"]["member"] not in sync.ranks
    # The AllReduce it waited for: 32 ranks, 50,331,648 FP32 = 192 MiB (seed table).
    ops = sync.ops
    ar = ops[(ops["rank"] == 8192) & (ops["group"] == group.group) & (ops["step"] == 1)
             & (ops["chunk"] == 6)]
    assert list(ar["bytes"]) == [50_331_648 * 4] and list(ar["dtype"]) == ["FP32"]


def test_async_variant_posts_bwd_send_before_the_reduction(sync, async_):
    def waits_before_bwd_send(tl):
        """Longest wait on stream 47 between a BWD and the BWD_SEND record after it."""
        out = []
        for _, lane in tl.ops[tl.ops["stream"] == 47].groupby("rank"):
            longest = 0
            for kind, meta, dur in zip(lane["kind"], lane["meta_step"], lane["dur_ns"],
                                       strict=True):
                if kind == COMPUTE:
                    longest = 0
                elif kind == WAIT:
                    longest = max(longest, dur)
                elif kind == RECORD and meta == "BWD_SEND":
                    out.append(longest)
        return np.array(out)

    assert waits_before_bwd_send(sync).max() > 100e6  # the bug this case exists for
    assert waits_before_bwd_send(async_).max() < 10e6
    span = lambda tl: max(s.end_ns for s in tl.steps if s.step == 1) - tl.ground_truth[  # noqa: E731
        "origin_ns"]
    assert span(async_) < span(sync) - 300e6  # the 474 ms stall is mostly gone
    assert not [b for b in step1_bubbles(async_, 4096) if b["dur_ms"] > 100]
    # Same reductions, now drained before the optimizer.
    count = lambda tl: (tl.ops["comm"] == "allreduce").sum()  # noqa: E731
    assert count(async_) == count(sync)
    drains = async_.ops[async_.ops["meta_step"] == "FSDP_WAIT_REDUCE_GRAD"]
    assert len(drains) == 4 * 2 * 2  # ranks x VPP chunks x steps


# --- pipeline theory, stragglers, EP ---------------------------------------------------------
@pytest.mark.parametrize(("v", "m"), [(2, 8), (1, 8)])
def test_pipeline_without_causes_has_the_theoretical_bubble(v, m):
    p = 4
    tl = simulate("pp-compute-straggler", slow_factor=1.0, vpp=v, microbatches=m, noise=0.0,
                  steps=1)
    theory = (p - 1) / (v * m)
    ops = tl.ops
    fb = ops[(ops["kind"] == COMPUTE) & ops["phase"].isin(["F", "B"])]
    span = (fb["start_ns"] + fb["dur_ns"]).max() - fb["start_ns"].min()
    for rank, mine in fb.groupby("rank"):
        busy = mine["dur_ns"].sum()
        assert (span - busy) / busy == pytest.approx(theory, rel=0.08), rank
    # Stage 0 runs from the first to the last op, so its listed bubbles are all its idle time.
    busy0 = fb[fb["rank"] == 0]["dur_ns"].sum() / 1e6
    listed = sum(b["dur_ms"] for b in tl.ground_truth["bubbles"] if b["rank"] == 0)
    assert listed / busy0 == pytest.approx(theory, rel=0.05)
    assert set(seconds_by_category(tl)) <= {PIPELINE_FILL, PP_P2P, HOST_LAUNCH}


def test_compute_straggler_is_charged_to_the_slow_rank():
    tl = simulate("pp-compute-straggler")
    cats = seconds_by_category(tl)
    total = sum(cats.values())
    assert (cats[COMPUTE_STRAGGLER] + cats[PIPELINE_FILL]) / total >= 0.95
    assert cats[COMPUTE_STRAGGLER] / total > 0.3
    roots = {p["rank"] for b in tl.ground_truth["bubbles"] for p in b["intervals"]
             if p["category"] == COMPUTE_STRAGGLER}
    assert roots == {2}
    assert tl.ground_truth["causes"] == [{"category": COMPUTE_STRAGGLER, "ranks": [2],
                                          "description": "rank 2 computes 1.3x slower"}]


def test_serialized_all_to_all_costs_more_than_overlapped():
    overlap, serial = simulate("ep-a2a-overlap"), simulate("ep-a2a-serialized")
    exposed = [seconds_by_category(tl)[EP_ALLTOALL] for tl in (overlap, serial)]
    assert exposed[1] > 1.5 * exposed[0]
    span = lambda tl: max(s.end_ns - s.start_ns for s in tl.steps if s.step == 1)  # noqa: E731
    assert span(serial) > span(overlap)
    # Overlap: all-to-all runs under compute; serialized: never (one hardware queue).
    for tl, low, high in ((overlap, 0.3, 1.0), (serial, 0.0, 0.0)):
        ops = tl.ops[tl.ops["rank"] == 1]
        comp = ops[ops["kind"] == COMPUTE]
        a2a = ops[ops["comm"] == "alltoall"]
        cs, ce = comp["start_ns"].to_numpy(), (comp["start_ns"] + comp["dur_ns"]).to_numpy()
        shared = sum(np.clip(np.minimum(ce, s + d) - np.maximum(cs, s), 0, None).sum()
                     for s, d in zip(a2a["start_ns"], a2a["dur_ns"], strict=True))
        assert low <= shared / a2a["dur_ns"].sum() <= high
    # The late EP rank is the compute root, inside a 4-rank EP group of profiled ranks.
    roots = {p["rank"] for b in serial.ground_truth["bubbles"] for p in b["intervals"]
             if p["category"] == COMPUTE_STRAGGLER}
    assert roots == {2}
    ep = {g.ranks for g in serial.groups.values() if g.desc == "ep"}
    assert ep == {(0, 1, 2, 3), (4, 5, 6, 7)}


def test_host_stall_shows_as_host_launch():
    # Rank 0's host stalls 30 ms before its first op of step 2: its device idles that long
    # (+ the 0.3 ms step gap) after its optimizer.
    tl = simulate("pp-compute-straggler", host_stalls=((0, 2, 0, 30.0),))
    mine = [b for b in tl.ground_truth["bubbles"] if b["rank"] == 0 and b["step"] == 2
            and b["category"] == HOST_LAUNCH]
    assert len(mine) == 1 and mine[0]["dur_ms"] == pytest.approx(30.3, abs=0.05)
    assert mine[0]["root"] == {"rank": 0, "lane": "host", "name": "MEMCPY_ASYNC"}


# --- every scenario: structure and invariants -------------------------------------------------
SMALL = {"large": dict(ranks=8, kernels_per_chunk=40, microbatches=4)}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_streams_are_sane_and_complete(name):
    tl = simulate(name, **SMALL.get(name, {}))
    ops = tl.ops
    assert list(ops.columns) == list(TIMELINE_COLUMNS)
    assert ops.dtypes.astype(str).tolist() == pd.DataFrame(
        {k: pd.Series([], dtype=object) for k in TIMELINE_COLUMNS}
    ).astype(TIMELINE_COLUMNS).dtypes.astype(str).tolist()
    # Sorted by (rank, stream, start); no two ops overlap on a stream; launched before start.
    key = ops[["rank", "stream", "start_ns"]].to_numpy()
    assert (np.lexsort(key.T[::-1]) == np.arange(len(ops))).all()
    end = ops["start_ns"] + ops["dur_ns"]
    same = (ops["rank"].diff() == 0) & (ops["stream"].diff() == 0)
    assert (ops["start_ns"][same] >= end.shift()[same]).all()
    assert (ops["launch_ns"] <= ops["start_ns"]).all() and (ops["dur_ns"] > 0).all()
    # Every wait has exactly one record on another stream of its rank, and ends after it.
    recs = ops[ops["kind"] == RECORD].set_index("event_id")
    waits = ops[ops["kind"] == WAIT]
    assert recs.index.is_unique and waits["event_id"].isin(recs.index).all()
    rec = recs.loc[waits["event_id"]]
    assert (rec["rank"].to_numpy() == waits["rank"].to_numpy()).all()
    assert (rec["stream"].to_numpy() != waits["stream"].to_numpy()).all()
    assert ((waits["start_ns"] + waits["dur_ns"]).to_numpy()
            >= (rec["start_ns"] + rec["dur_ns"]).to_numpy()).all()
    # Groups: every comm op's group is known, ids are msprof's double hash of the comm name.
    comm = ops[ops["kind"].isin([P2P, COLLECTIVE])]
    assert set(comm["group"]) <= set(tl.groups)
    assert all(double_hash(g.name) == gid for gid, g in tl.groups.items())
    # Ground truth: every bubble's intervals tile it; steps listed per rank.
    for b in tl.ground_truth["bubbles"]:
        assert b["intervals"][0]["start_ms"] == b["start_ms"]
        assert b["intervals"][-1]["end_ms"] == b["end_ms"]
        for x, y in zip(b["intervals"], b["intervals"][1:], strict=False):
            assert x["end_ms"] == y["start_ms"]
    assert {(s.rank, s.step) for s in tl.steps} == {
        (r, s) for r in tl.ranks for s in range(1, tl.params["steps"] + 1)}


def test_p2p_names_match_on_both_peers(sync):
    p2p = sync.ops[sync.ops["kind"] == P2P]
    assert (p2p.groupby(["group", "seq"])["rank"].nunique() == 2).all()
    assert (p2p.groupby(["group", "seq"])["name"].nunique() == 1).all()
    for name, group, seq, peer, rank in zip(p2p["name"], p2p["group"], p2p["seq"], p2p["peer"],
                                            p2p["rank"], strict=True):
        parsed = parse_hccl_name(name)
        assert parsed.comm == "batch_send_recv" and parsed.group_tail == group[-3:]
        assert parsed.index == seq and parsed.iteration == 1
        assert set(sync.groups[group].ranks) == {peer, rank}
    sizes = sorted({len(g.ranks) for g in sync.groups.values() if g.desc == "dp"})
    assert sizes == [32, 128]
    assert re.fullmatch(r"hcom_batchSendRecv__\d{3}_\d+_1", p2p["name"].iat[0])


def test_op_counts_follow_the_schedule():
    # pp-compute-straggler, PP4 1F1B, m=8, 2 steps, 5 kernels per chunk: per rank
    # 2 x (16 F/B chunks x 5 + optimizer 5) compute rows; rank 0 copies one input per microbatch.
    tl = simulate("pp-compute-straggler", kernels_per_chunk=5)
    counts = tl.ground_truth["op_counts"]
    assert set(counts) == {"0", "1", "2", "3"}
    assert all(c["compute"] == 2 * (16 * 5 + 5) for c in counts.values())
    assert [counts[r]["memcpy"] for r in "0123"] == [16, 0, 0, 0]
    assert all(c["collective"] == 0 and c["p2p"] > 0 for c in counts.values())
    for c in counts.values():  # every wait has its record, some records have no wait
        assert c["record"] >= c["wait"]


def test_same_seed_same_run_other_seed_other_run():
    a = simulate("ep-a2a-overlap", seed=5, microbatches=4)
    b = simulate("ep-a2a-overlap", seed=5, microbatches=4)
    c = simulate("ep-a2a-overlap", seed=6, microbatches=4)
    pd.testing.assert_frame_equal(a.ops, b.ops)
    assert a.ground_truth == b.ground_truth and a.clock_offset_ns == b.clock_offset_ns
    assert not a.ops["start_ns"].equals(c.ops["start_ns"])
    offsets = np.abs(list(a.clock_offset_ns.values()))
    assert offsets.min() >= 20_000 and offsets.max() <= 2_000_000  # tens of us to ms


def test_large_expands_kernels_quickly():
    # PP4 VPP2, m=8, 1 step, 4000 kernels per chunk: 2*8*2 = 32 F/B ops -> 128,000 kernels +
    # 16 optimizer kernels per rank, plus the P2P / sync / HSDP ops.
    began = time.perf_counter()
    tl = simulate("large", ranks=4, microbatches=8, steps=1, kernels_per_chunk=4000)
    elapsed = time.perf_counter() - began
    comp = tl.ops[tl.ops["kind"] == COMPUTE].groupby("rank").size()
    assert (comp == 32 * 4000 + 16).all()
    assert elapsed < 20  # ~0.5 M rows; seconds, not minutes, even on a busy 2-core machine
    names = set(tl.ops.loc[tl.ops["kind"] == COMPUTE, "name"])
    assert {"FlashAttentionScore", "FlashAttentionScoreGrad",
            "aclnnMatmul_MatMulV3_MatMulV3"} <= names


def test_bad_overrides_are_refused():
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        simulate("nope")
    with pytest.raises(ValueError, match=r"unknown scenario parameter\(s\) \['bogus'\]"):
        simulate("large", bogus=1)
    with pytest.raises(ValueError, match="divisible by pp"):
        simulate("pp-compute-straggler", vpp=2, microbatches=6)
