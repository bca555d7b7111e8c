"""Issue #5: a report of the `large` simulated scenario stays under the size budget and renders.

The full scenario (8 ranks × ~0.5 M device ops) is measured in bench/README.md ("Large report");
here a reduced one — 8 ranks, 200 kernels per F/B chunk, one step: ~100 k device ops, more than
the page's MAX_SEGMENTS blocks, so merging below a pixel must coarsen — is written in both
formats, reported, and opened in Debian's chromium, headless.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext

import tracegraph
from reports.html import write_report
from reports.waterfall import MAIN_LANES, MAX_SEGMENTS, SIZE_BUDGET_MB
from tests.browser import FIGURES, assert_not_blank, open_page
from tracegraph.analysis.analyze import analyze
from tracegraph.simulate import simulate
from tracegraph.simulate.bundle_writer import write_bundle
from tracegraph.simulate.truth_pipeline import from_timeline, timeline_from_truth

RANKS = 8  # two PP4 replicas
KERNELS = 200  # kernels per F/B chunk: 16 microbatches × 2 chunks × (F + B) × 200 per rank
DEVICE_OPS = RANKS * 16 * 2 * 2 * KERNELS  # compute kernels alone, before comm / waits / copies
OP_TRACES = """group => Array.from(document.querySelectorAll('.plotly-graph-div'))[0]._fullData
    .filter(t => t.legendgroup === group && t.mode === 'markers')
    .map(t => ({n: t.x.length, text: Array.from(t.hovertext)}))"""


@pytest.fixture(scope="module", params=["kineto", "ascend"])
def large_report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, int]:
    """The reduced `large` bundle of one format, its report (ground-truth pipeline), op count."""
    out = tmp_path_factory.mktemp(f"large-{request.param}")
    timeline = simulate("large", ranks=RANKS, kernels_per_chunk=KERNELS, steps=1)
    bundle = write_bundle(timeline, out / "large.tar.gz", request.param)
    analysis = analyze(tracegraph.load(bundle, use_cache=False))
    pipeline = from_timeline(analysis, timeline_from_truth(out / "large.ground_truth.json"))
    report = write_report(analysis, out / "report.html", top=5, pipeline=pipeline)
    return report, len(analysis.ops)


def test_large_report_is_under_the_size_budget(large_report: tuple[Path, int]) -> None:
    report, ops = large_report
    assert ops > DEVICE_OPS > MAX_SEGMENTS  # enough ops that the page cannot draw each one
    assert report.stat().st_size <= SIZE_BUDGET_MB * 2**20


def test_large_report_renders_merged_in_chromium(browser: BrowserContext,
                                                 large_report: tuple[Path, int]) -> None:
    report, ops = large_report
    page, errors = open_page(browser, report)
    figures = page.evaluate(FIGURES)
    blocks = page.evaluate(OP_TRACES, MAIN_LANES)
    shot = page.locator(".plotly-graph-div").first.screenshot()
    page.close()
    assert errors == []
    # One step: its waterfall, then the pipeline view from the ground truth.
    assert len(figures) == 2
    rows = figures[0]["rows"]
    assert [r.split(" · ")[0] for r in rows[:RANKS]] == [f"r{r}" for r in range(RANKS)]
    assert {r.split(" · ")[0] for r in rows} == {f"r{r}" for r in range(RANKS)}
    drawn = sum(b["n"] for b in blocks)
    assert 0 < drawn <= MAX_SEGMENTS < ops
    assert any(t.split(" ops merged")[0].isdigit() for b in blocks for t in b["text"])
    assert len(figures[0]["arrows"]) > 0
    assert_not_blank(shot)
