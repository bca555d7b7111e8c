"""The HTML report, its waterfall and pipeline figures, and the recovered pipeline schedule.

Known answers come from the real profiles' README (shared/real_traces/README.md), from counts made
by hand with small scripts (stated where used), or from a schedule built by construction.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import tracegraph
from parsers.base import GroupInfo
from reports.html import render
from reports.pipeline import pipeline_figure
from reports.waterfall import (
    BUBBLES,
    MAIN_LANES,
    MAX_SEGMENTS,
    OTHER_LANES,
    SIZE_BUDGET_MB,
    merge_blocks,
    waterfall,
)
from tests.conftest import REAL, SAMPLES
from tracegraph import schema
from tracegraph.analysis import pipeline
from tracegraph.analysis.analyze import analyze
from tracegraph.cli.app import app
from tracegraph.loading.trace import Trace
from tracegraph.simulate import simulate, truth_pipeline
from tracegraph.simulate.bundle_writer import EPOCH_NS, write_bundle
from tracegraph.simulate.timeline import TIMELINE_COLUMNS, StepSpan, Timeline

MS = 1_000_000
GLOO = REAL / "kineto" / "gloo_pp2_dp2"
NPU = REAL / "ascend" / "torch_npu_ddp8_level1"


@pytest.fixture(scope="module")
def gloo():
    return analyze(tracegraph.load(GLOO, use_cache=False))


def figure_rows(fig) -> list[str]:
    return list(fig.layout.yaxis.ticktext)


def hover_texts(fig, name: str) -> list[str]:
    return [t for trace in fig.data if trace.name == name and trace.mode == "markers"
            for t in trace.hovertext]


# --- merging ---------------------------------------------------------------------------------
def test_short_ops_merge_per_row_and_long_ones_stay() -> None:
    row = np.array([0, 0, 0, 0, 1, 1])
    start = np.array([0, 15, 22, 100, 0, 50])
    end = np.array([10, 20, 24, 300, 5, 55])
    kind = np.array([0, 1, 1, 0, 2, 2])
    blocks = merge_blocks(row, start, end, kind, resolution=10, limit=100)
    # row 0: [0,10] is not shorter than 10 ns, so it stands alone; 15–20 and 22–24 (gap 2) merge;
    # 100–300 is long. Row 1: two short ops 45 ns apart stay apart.
    assert blocks.start.tolist() == [0, 15, 100, 0, 50]
    assert blocks.end.tolist() == [10, 24, 300, 5, 55]
    assert blocks.count.tolist() == [1, 2, 1, 1, 1]
    assert blocks.kind.tolist() == [0, 1, 0, 2, 2]


def test_merging_coarsens_until_the_limit_and_covers_every_op() -> None:
    rng = np.random.default_rng(1)
    row = np.repeat(np.arange(10), 1000)
    dur = rng.integers(1, 50, row.size)
    start = (np.cumsum(dur + rng.integers(1, 100, row.size)) - dur).astype(np.int64)
    end = start + dur
    blocks = merge_blocks(row, start, end, np.zeros(row.size, dtype=np.int64), 1, limit=500)
    assert len(blocks.start) <= 500
    assert blocks.count.sum() == row.size
    block_of = np.cumsum(np.isin(np.arange(row.size), blocks.first)) - 1
    assert (start >= blocks.start[block_of]).all() and (end <= blocks.end[block_of]).all()
    assert (row == row[blocks.first][block_of]).all()


# --- the real gloo job -----------------------------------------------------------------------
def test_gloo_waterfall_rows_and_chain_arrows(gloo) -> None:
    fig = waterfall(gloo, 2, top=5)
    rows = figure_rows(fig)
    # README: 4 ranks; collectives on per-group pt_gloo_runloop threads, 4 of them per rank
    # (counted with: {(rank, tid) for events on threads named pt_gloo_runloop} in the JSON files).
    assert [r.split(" · ")[0] for r in rows[:4]] == ["r0", "r1", "r2", "r3"]
    assert all(r.endswith("python") for r in rows[:4])
    assert sum("pt_gloo_runloop" in r for r in rows) == 16
    # README: rank 1 sleeps 200 ms before the DP all_reduce; ranks 0, 2 and 3 wait ≈ 203–205 ms.
    # The first chain starts at the longest bubble's rank and reaches rank 1's main thread.
    chains = [a for a in fig.layout.annotations if a.name == "chain 1"]
    assert chains and chains[0].text == "#1"
    step2 = [b for b in gloo.bubbles if b.step == 2]
    first = step2[0]
    assert rows[int(chains[0].ay)].startswith(f"r{first.rank} ") and first.rank in (0, 2, 3)
    heads = {rows[int(a.y)].split(" · ")[0] for a in fig.layout.annotations}
    assert "r1" in heads
    assert 195 <= first.dur / MS <= 215
    waiting = {b.rank for b in step2[:3]}
    assert waiting == {0, 2, 3}
    for rank in (0, 2, 3):  # each waiting rank's chain of arrows reaches the sleeping rank 1
        chain = next(f"chain {n}" for n, b in enumerate(step2, start=1) if b.rank == rank)
        links = [a for a in fig.layout.annotations if a.name == chain]
        assert rows[int(links[0].ay)] == rows[rank]
        assert any(rows[int(a.y)] == rows[1] for a in links), f"rank {rank}'s chain misses rank 1"


def test_gloo_waterfall_draws_ops_bubbles_and_path(gloo) -> None:
    fig = waterfall(gloo, 2)
    p2p = [t for t in hover_texts(fig, "p2p") if t.startswith(("gloo:send", "gloo:recv"))]
    # gloo:send/recv longer than 1 ms inside ProfilerStep#2, counted in rank{0..3}.json with a
    # loop over traceEvents: 3, 3, 1, 2. Longer than a pixel, each is drawn on its own.
    long = [t for t in p2p if float(re.search(r"\+([\d.]+) ms", t)[1]) > 1]
    assert sorted(t.split("<br>")[1].split(" · ")[0] for t in long) == [
        "r0", "r0", "r0", "r1", "r1", "r1", "r2", "r3", "r3"]
    assert all("peer " in t and " B" in t for t in long)
    assert any(t.legendgroup == BUBBLES for t in fig.data)
    path = {t.name for t in fig.data if t.legendgroup == "critical path"}
    assert "rows it runs through" in path and "critical path · compute" in path
    assert all(t.type == "scattergl" for t in fig.data)


def test_gloo_report_header(gloo) -> None:
    html = render(gloo, top=3, pipeline=pipeline.recover(gloo))
    # README: ProfilerStep#2 and #3, step ≈ 225 ms.
    assert "<h2>Step 2</h2>" in html and "<h2>Step 3</h2>" in html
    times = [float(t) for t in re.findall(r"step time <b>([\d.]+) ms", html)]
    assert len(times) == 2 and all(215 <= t <= 235 for t in times)
    table = html.split('class="causes"')[1].split("</table>")[0]
    assert table.count("<tr>") == 4  # header + top 3
    assert "rank 3" in table and "clock offset applied" in html
    assert "Clock offsets applied (µs): r0 " in html
    # self-contained: plotly.js inline, nothing fetched (no src= script, no stylesheet link)
    assert "plotly.js v" in html and html.count('class="plotly-graph-div"') == 4
    assert not re.search(r"<script[^>]*\ssrc=|<link\s|@import", html)


def test_gloo_report_totals_are_rank_ms_beside_the_slowest_rank_s_own(gloo) -> None:
    html = render(gloo, top=3)
    totals = html.split("<h2>Totals</h2>")[1]
    assert ("<caption>bubble time by cause, all steps, summed over 4 ranks (rank·ms)</caption>"
            "<tr><th>category</th><th>bubble rank·ms</th>") in totals
    steps = gloo.steps.assign(ms=(gloo.steps["end"] - gloo.steps["start"]) / MS)
    for step, spans in steps.groupby("step"):
        section = html.split(f"<h2>Step {step}</h2>")[1].split("<h2>")[0]
        rank = int(spans.loc[spans["ms"].idxmax(), "rank"])
        exposed = sum(b.dur for b in gloo.bubbles if b.rank == rank and b.step == step) / MS
        assert f"(slowest: rank {rank})" in section and "summed over 4 ranks)" in section
        assert (f"<caption>rank {rank} (slowest): its own exposed bubble time, "
                f"<b>{exposed:.3f} ms</b></caption>") in section
        table = section.split('class="slowest"')[1].split("</table>")[0]
        causes_ms = [float(v) for v in re.findall(r'<td class="n">([\d.]+)</td>', table)]
        assert sum(causes_ms) == pytest.approx(exposed, abs=0.01)


def test_fixed_gloo_sample_report(cache_dir: Path) -> None:
    analysis = analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2_fixed", cache_dir=cache_dir))
    html = render(analysis)
    times = [float(t) for t in re.findall(r"step time <b>([\d.]+) ms", html)]
    assert times and all(12 <= t <= 25 for t in times)  # README: step ≈ 18 ms without the sleep


BUNDLES = sorted([p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "simulated"]
                 + [f"simulated/{p.name}" for p in (SAMPLES / "simulated").glob("*.tar.gz")])


@pytest.mark.parametrize("bundle", BUNDLES)
def test_every_sample_renders(bundle: str, tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "r.html"
    run = CliRunner().invoke(app, ["report", str(SAMPLES / bundle), "-o", str(out),
                                   "--cache-dir", str(cache_dir)])
    assert run.exit_code == 0, run.output
    html = out.read_text()
    steps = tracegraph.load(SAMPLES / bundle, cache_dir=cache_dir).events
    count = steps["name"].str.fullmatch(r"ProfilerStep#\d+").groupby(steps["rank"]).sum().max()
    assert html.count('class="plotly-graph-div"') >= count


def test_npu_report_shows_the_allreduces(cache_dir: Path) -> None:
    analysis = analyze(tracegraph.load(NPU, cache_dir=cache_dir))
    fig = waterfall(analysis, 50)
    rows = figure_rows(fig)
    # README: 4 × hcom_allReduce__… on device stream 4, on both ranks; one step (#50 in the files).
    texts = [t for trace in fig.data if trace.mode == "markers" for t in trace.hovertext
             if t.startswith("hcom_allReduce")]
    for rank in (0, 1):
        assert f"r{rank} · stream 4" in rows
        assert sum(f"r{rank} · stream 4<br>" in t for t in texts) == 4
    assert render(analysis).count("<h2>Step 50</h2>") == 1


# --- CLI -------------------------------------------------------------------------------------
def test_cli_one_step_and_bad_step(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "report.html"
    args = ["report", str(GLOO), "-o", str(out), "--cache-dir", str(cache_dir)]
    run = CliRunner().invoke(app, [*args, "--step", "3", "--top", "2"])
    assert run.exit_code == 0, run.output
    html = out.read_text()
    assert "<h2>Step 3</h2>" in html and "<h2>Step 2</h2>" not in html
    assert html.split('class="causes"')[1].split("</table>")[0].count("<tr>") == 3
    bad = CliRunner().invoke(app, [*args, "--step", "9"])
    assert bad.exit_code == 2 and "step 9 is not in the trace" in bad.output


def test_cli_missing_bundle(tmp_path: Path) -> None:
    run = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "-o", str(tmp_path / "x")])
    assert run.exit_code == 2 and "nope" in run.output


# --- pipeline --------------------------------------------------------------------------------
def test_pipeline_from_gloo_annotations(gloo) -> None:
    pipe = pipeline.from_annotations(gloo)
    blocks = pipe.blocks
    # README: PP=2 × DP=2, replica A = ranks 0,1, B = 2,3; 4 microbatches FWD/BWD per step,
    # steps #2 and #3: 4 ranks × 2 steps × 4 microbatches × 2 phases = 64 blocks.
    assert len(blocks) == 64
    stages = blocks.drop_duplicates("rank").set_index("rank")
    assert stages["stage"].to_dict() == {0: 0, 1: 1, 2: 0, 3: 1}
    assert stages.loc[0, "replica"] == stages.loc[1, "replica"] != stages.loc[2, "replica"]
    for step in (2, 3):
        ratio = pipe.bubble_ratio(step)
        assert (ratio.stages, ratio.chunks, ratio.microbatches) == (2, 1, 4)
        assert ratio.theory == pytest.approx(0.25)
        assert ratio.measured == pytest.approx(_measured_by_hand(gloo, blocks, step), rel=1e-9)


def _measured_by_hand(analysis, blocks: pd.DataFrame, step: int) -> float:
    """The measured ratio recomputed op by op, independently of busy_within."""
    frame, main = analysis.ops.frame, analysis.ops.main_lanes()
    ratios = []
    for _, replica in blocks[blocks["step"] == step].groupby("replica"):
        span = replica["end"].max() - replica["start"].min()
        work = []
        for rank, mine in replica.groupby("rank"):
            ops = frame[(frame["lane_id"] == main[rank])  # a blocking c10d::recv_ is no work
                        & frame["kind"].isin(["compute", "host", "memcpy"])
                        & (frame["comm"] == "")]
            shift = analysis.offsets.get(rank, 0)
            total = 0
            for a, b in zip(mine["start"], mine["end"], strict=True):
                for s, e in zip(ops["start"] - shift, ops["end"] - shift, strict=True):
                    total += max(0, min(b, e) - max(a, s))
            work.append(total)
        ratios.append((span - np.mean(work)) / np.mean(work))
    return float(np.mean(ratios))


def gpipe_timeline() -> Timeline:
    """2 stages, 4 microbatches, F = B = 1 ms: stage 0 runs F0-3 at 0-4 ms and B3-0 at 6-10;
    stage 1 F0-3 at 1-5 and B3-0 at 5-9. Span 10 ms, 8 ms work per stage: ratio 2/8 = 1/4."""
    rows = []
    for stage in (0, 1):
        for mb in range(4):
            rows.append((stage, "F", mb, stage + mb))
            rows.append((stage, "B", mb, 5 + (1 - stage) + (3 - mb)))
    ops = pd.DataFrame(rows, columns=["rank", "phase", "microbatch", "start_ms"])
    ops = ops.assign(start_ns=ops["start_ms"] * MS, dur_ns=MS, stream=47, name="MatMul",
                     kind="compute", comm="", group="", peer=-1, seq=-1, bytes=-1, dtype="",
                     event_id=-1, launch_ns=ops["start_ms"] * MS, step=1, chunk=ops["rank"],
                     meta_step="")
    ops = ops[list(TIMELINE_COLUMNS)].astype(TIMELINE_COLUMNS)
    return Timeline("gpipe", {}, ops, {"pp": GroupInfo("pp", "pp", "pp", (0, 1))},
                    [StepSpan(r, 1, 0, 10 * MS) for r in (0, 1)], {0: 0, 1: 250_000})


class _Aligned:
    """What from_timeline reads of an Analysis: the trace (for replicas) and the offsets."""

    def __init__(self, offsets: dict[int, int]) -> None:
        events = schema.events_table({}, 0).to_pandas()
        groups = pd.DataFrame({"group": ["pp"], "name": ["pp"], "desc": ["pp"], "dim": ["pp"],
                               "ranks": [[0, 1]], "size": [2], "source": ["test"]})
        self.trace = Trace(Path("sim"), events, groups, pd.DataFrame({"rank": [0, 1]}))
        self.offsets = offsets


def test_pipeline_from_simulated_ground_truth() -> None:
    timeline = gpipe_timeline()
    pipe = truth_pipeline.from_timeline(_Aligned({0: 0, 1: 250_000}), timeline)
    assert pipe.source == "ground truth" and len(pipe.blocks) == 16
    ratio = pipe.bubble_ratio(1)
    assert (ratio.stages, ratio.chunks, ratio.microbatches) == (2, 1, 4)
    assert ratio.measured == pytest.approx(0.25) and ratio.theory == pytest.approx(0.25)
    b3 = pipe.blocks[(pipe.blocks["rank"] == 1) & (pipe.blocks["phase"] == "B")
                     & (pipe.blocks["microbatch"] == 3)].iloc[0]
    assert b3["start"] == EPOCH_NS + 5 * MS  # the rank-1 clock offset is applied, then removed
    fig = pipeline_figure(pipe, 1, EPOCH_NS)
    assert "measured 0.250 vs theory (p−1)/(v·m) = 0.250" in fig.layout.title.text
    assert [t.name for t in fig.data] == ["F", "B"]
    assert sorted(fig.data[0].text) == ["0", "0", "1", "1", "2", "2", "3", "3"]


# --- size budget -----------------------------------------------------------------------------
def million_op_trace(ranks: int = 32, lanes: int = 8, per_lane: int = 4_000) -> Trace:
    """~1M compute ops whose widths and gaps span 1 µs–5 ms: many are wider than a pixel, so
    merging alone cannot keep the page small and the segment cap has to act."""
    rng = np.random.default_rng(0)
    shape = (ranks * lanes, per_lane)
    dur = np.exp(rng.uniform(np.log(1e3), np.log(5e6), shape)).astype(np.int64)
    gap = np.exp(rng.uniform(np.log(1e2), np.log(2e6), shape)).astype(np.int64)
    start = np.cumsum(dur + gap, axis=1) - dur
    lane = np.repeat(np.arange(ranks * lanes), per_lane)
    frame = pd.DataFrame({"rank": lane // lanes, "stream": lane % lanes,
                          "start_ns": start.ravel(), "dur_ns": dur.ravel(), "name": "MatMul",
                          "kind": schema.COMPUTE})
    steps = pd.DataFrame({"rank": np.arange(ranks), "stream": 0, "start_ns": 0,
                          "dur_ns": int((start + dur).max()), "name": "ProfilerStep#1",
                          "kind": schema.MARKER})
    frame = pd.concat([frame, steps], ignore_index=True)
    columns = {"lane": "stream " + frame["stream"].astype(str), "lane_kind": schema.STREAM,
               **{c: frame[c] for c in frame}}
    events = schema.events_table({c: np.asarray(v) if not isinstance(v, str) else
                                  np.full(len(frame), v) for c, v in columns.items()}, len(frame))
    return Trace(Path("synthetic"), events.to_pandas(), pd.DataFrame(columns=schema.GROUPS.names),
                 pd.DataFrame({"rank": np.arange(ranks)}))


def test_a_million_ops_stay_under_the_size_budget() -> None:
    analysis = analyze(million_op_trace())
    assert len(analysis.ops) == 1_024_000
    html = render(analysis)
    assert len(html.encode()) <= SIZE_BUDGET_MB * 2**20
    fig = waterfall(analysis, 1)
    texts = [t for trace in fig.data if trace.mode == "markers"
             and trace.legendgroup in (MAIN_LANES, OTHER_LANES) for t in trace.hovertext]
    assert len(texts) <= MAX_SEGMENTS
    merged = [int(t.split(" ops merged")[0]) for t in texts if " ops merged" in t]
    assert sum(merged) + len(texts) - len(merged) == 1_024_000  # each op in exactly one block


# --- simulated bundles (ground truth by construction) ----------------------------------------
@pytest.fixture(scope="module")
def pp_sim(tmp_path_factory: pytest.TempPathFactory):
    """pp-compute-straggler: PP4 1F1B, 8 microbatches, 2 steps, rank 2 computes 1.3× slower."""
    timeline = simulate("pp-compute-straggler")
    archive = write_bundle(timeline, tmp_path_factory.mktemp("sim") / "pp.tar.gz", "ascend")
    return timeline, archive, analyze(tracegraph.load(archive, use_cache=False))


def test_op_order_recovers_the_simulated_schedule(pp_sim) -> None:
    timeline, _, analysis = pp_sim
    truth = truth_pipeline.from_timeline(analysis, timeline)
    found = pipeline.from_op_order(analysis)
    for step in (1, 2):
        for pipe in (truth, found):
            ratio = pipe.bubble_ratio(step)
            assert (ratio.stages, ratio.chunks, ratio.microbatches) == (4, 1, 8)
            assert ratio.theory == pytest.approx(3 / 8)
        assert found.bubble_ratio(step).measured == pytest.approx(
            truth.bubble_ratio(step).measured, rel=0.02)
    for rank in range(4):  # the last stage's F and B, back to back, told apart by op names
        mine = [b[(b["rank"] == rank)].sort_values("start")[["step", "phase", "microbatch"]]
                .to_numpy().tolist() for b in (truth.blocks, found.blocks)]
        assert mine[0] == mine[1]
    assert found.blocks.drop_duplicates("rank").set_index("rank")["stage"].to_dict() == {
        0: 0, 1: 1, 2: 2, 3: 3}


def test_report_of_a_simulated_bundle_draws_the_pipeline_from_the_trace(pp_sim,
                                                                         tmp_path: Path) -> None:
    _, archive, _ = pp_sim  # its ground_truth.json lies beside it: the report must not read it
    assert archive.with_name("pp.ground_truth.json").is_file()
    out = tmp_path / "sim.html"
    run = CliRunner().invoke(app, ["report", str(archive), "-o", str(out), "--no-cache"])
    assert run.exit_code == 0, run.output
    html = out.read_text()
    assert "pipeline from op order" in html and "ground truth" not in html
    assert html.count("theory (p−1)\\u002f(v·m) = 0.375 (p=4, v=1, m=8)") == 2


@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_seed_sample_report_shows_the_chain(fmt: str, cache_dir: Path) -> None:
    bundle = SAMPLES / "simulated" / f"hsdp-straggler-sync-{fmt}.tar.gz"
    analysis = analyze(tracegraph.load(bundle, cache_dir=cache_dir))
    html = render(analysis)
    assert "4096 → 8192 → 12288" in html  # the seed's chain, in the top-causes table
    # its weakest link: Ascend EVENT_WAITs matched by the timing rule (no event ids); Kineto's
    # NCCL P2P kernels carry no sequence number, so their halves pair by order: medium
    weakest = {"ascend": "record &lt; 5 µs before it ended",
               "kineto": "posted last (pair by order)"}[fmt]
    assert f'<td title="{weakest}">medium</td>' in html
    # rank 4096's wait: beside its root (the 32-rank group of 12288), the other causes of 5 %
    # of it, each absent group with the ranks to profile
    (row,) = [r for r in html.split('class="causes"')[1].split("<tr>")
              if "rank 4096 · stream 47" in r and "4096 → 8192 → 12288" in r]
    also = row.split("</td>")[-4]
    assert also.count("profile ranks") == 2 and also.count("dp_reduction") == 2
    assert "pipeline_fill" in also and "(28%)" in also and "(10%)" in also
    fig = waterfall(analysis, 1)
    rows = figure_rows(fig)
    for rank in (4096, 8192, 12288):
        assert f"r{rank} · stream 47" in rows
