"""The report as a person opens it: Debian's chromium, headless (tests/browser.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page

import tracegraph
from reports.html import write_report
from tests.browser import FIGURES, assert_not_blank, open_page
from tests.conftest import REAL, SAMPLES
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.pipeline import recover


def open_report(browser: BrowserContext, bundle: Path, out: Path) -> tuple[Page, list[str]]:
    """Write the bundle's report, open it, and collect console errors and page errors."""
    analysis = analyze(tracegraph.load(bundle, use_cache=False))
    write_report(analysis, out, top=5, pipeline=recover(analysis))
    return open_page(browser, out)


@pytest.fixture(scope="module")
def gloo_page(browser: BrowserContext, tmp_path_factory: pytest.TempPathFactory):
    page, errors = open_report(browser, REAL / "kineto" / "gloo_pp2_dp2",
                               tmp_path_factory.mktemp("gloo") / "report.html")
    yield page, errors
    page.close()


def test_gloo_page_loads_without_errors(gloo_page) -> None:
    page, errors = gloo_page
    assert errors == []
    figures = page.evaluate(FIGURES)
    # README: ProfilerStep#2 and #3, both with FWD/BWD microbatch annotations: a waterfall and a
    # pipeline view per step.
    assert len(figures) == 4
    waterfalls = [f for f in figures if f["rows"] and f["rows"][0].startswith("r0 · ")]
    assert len(waterfalls) == 2
    for figure in waterfalls:
        # 4 ranks' main threads first, then 4 pt_gloo_runloop threads per rank (counted in the
        # thread_name metadata of rank{0..3}.json).
        assert [r.split(" · ")[0] for r in figure["rows"][:4]] == ["r0", "r1", "r2", "r3"]
        assert len(figure["rows"]) == 20
        assert all(t["type"] == "scattergl" for t in figure["traces"])
        assert sum(t["points"] for t in figure["traces"] if t["name"] == "p2p") > 0


def test_chain_arrows_point_at_the_sleeping_rank(gloo_page) -> None:
    page, _ = gloo_page
    step2 = page.evaluate(FIGURES)[0]
    rows = step2["rows"]
    # README: rank 1 sleeps 200 ms; ranks 0 and 2 wait ≈203 ms in MOE a2a, rank 3 ≈205 ms in
    # its DP all_reduce: an arrow leaves each of their main rows and lands on rank 1's.
    landing = {(rows[round(a["ay"])].split(" · ")[0], rows[round(a["y"])].split(" · ")[0])
               for a in step2["arrows"]}
    assert {("r0", "r1"), ("r2", "r1"), ("r3", "r1")} <= landing
    assert {a["text"] for a in step2["arrows"]} >= {"#1", "#2", "#3"}


def test_hover_shows_the_op(gloo_page) -> None:
    page, _ = gloo_page
    point = page.evaluate("""() => {
        const gd = document.querySelector('.plotly-graph-div');
        const i = gd._fullData.findIndex(t => t.mode === 'markers' && t.name === 'p2p');
        const t = gd._fullData[i], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const top = () => gd.getBoundingClientRect().top + ya._offset + ya.l2p(t.y[0]);
        window.scrollBy(0, top() - window.innerHeight / 2);  // sections above push it down
        const box = gd.getBoundingClientRect();
        return {x: box.left + xa._offset + xa.l2p(t.x[0]), y: top(), text: t.hovertext[0]};
    }""")
    page.mouse.move(point["x"], point["y"])
    page.wait_for_selector(".hoverlayer .hovertext")
    shown = page.text_content(".hoverlayer .hovertext")
    assert point["text"].split("<br>")[0] in shown and "peer" in shown


def test_lane_toggle_collapses_to_main_lanes(gloo_page) -> None:
    page, _ = gloo_page
    page.locator(".plotly-graph-div").first.locator(".updatemenu-button",
                                                    has_text="main lanes only").click()
    span = page.evaluate("document.querySelector('.plotly-graph-div').layout.yaxis.range")
    assert span == [3.5, -0.5]  # the 4 main threads only


def test_screenshot_is_not_blank(gloo_page) -> None:
    page, _ = gloo_page
    assert_not_blank(page.locator(".plotly-graph-div").first.screenshot())


def test_npu_page_loads_without_errors(browser: BrowserContext, tmp_path: Path) -> None:
    page, errors = open_report(browser, REAL / "ascend" / "torch_npu_ddp8_level1",
                               tmp_path / "npu.html")
    figures = page.evaluate(FIGURES)
    page.close()
    assert errors == []
    # README: 2 of 8 ranks, one step; 4 allreduces on device stream 4 of each.
    assert len(figures) == 1
    assert {"r0 · stream 4", "r1 · stream 4"} <= set(figures[0]["rows"])


PIPELINES = """() => Array.from(document.querySelectorAll('.plotly-graph-div'))
    .filter(gd => (gd.layout.title.text || '').startsWith('pipeline'))
    .map(gd => ({title: gd.layout.title.text, rows: gd.layout.yaxis.categoryarray,
                 labels: gd._fullData.flatMap(t => Array.from(t.text || []))}))"""


@pytest.mark.parametrize("fmt", ["ascend", "kineto"])
def test_seed_sample_draws_its_pipeline_from_the_trace(browser: BrowserContext, tmp_path: Path,
                                                       fmt: str) -> None:
    """The seed sample's report: a pipeline view per step recovered from op order (its ground
    truth lies beside the bundle and is never read), 4 stages, chunk·microbatch labels."""
    page, errors = open_report(browser, SAMPLES / "simulated" /
                               f"hsdp-straggler-sync-{fmt}.tar.gz", tmp_path / "seed.html")
    pipelines = page.evaluate(PIPELINES)
    page.close()
    assert errors == [] and len(pipelines) == 1  # the sample holds one step
    seed = pipelines[0]
    assert "(op order)" in seed["title"] and "(p=4, v=2, m=16)" in seed["title"]
    assert [row.split(" · ")[1] for row in seed["rows"]] == [f"stage {s}" for s in (3, 2, 1, 0)]
    assert {f"c{c}·{mb}" for c in (0, 1) for mb in range(16)} <= set(seed["labels"])


@pytest.mark.parametrize("name", sorted(p.name for p in (SAMPLES / "simulated").glob("*.tar.gz")))
def test_simulated_sample_pages_load_without_errors(browser: BrowserContext, tmp_path: Path,
                                                    name: str) -> None:
    page, errors = open_report(browser, SAMPLES / "simulated" / name, tmp_path / "r.html")
    figures = page.evaluate(FIGURES)
    page.close()
    assert errors == []
    ranks = {row.split(" · ")[0] for fig in figures for row in fig["rows"]}
    expected = 8 if name.startswith("ep-") else 4  # the simulated job's profiled ranks
    assert len(ranks) == expected


def test_critical_path_rows_are_shaded_listed_and_in_the_legend(gloo_page) -> None:
    page, _ = gloo_page
    analysis = analyze(tracegraph.load(REAL / "kineto" / "gloo_pp2_dp2", use_cache=False))
    path = analysis.critical_paths[2]  # the first figure: ProfilerStep#2
    figure = page.evaluate(FIGURES)[0]
    shaded = page.evaluate("""() => {
        const gd = document.querySelector('.plotly-graph-div');
        const t = gd._fullData.find(t => t.name === 'rows it runs through' && t.mode === 'lines');
        return Array.from(t.y).filter(y => !Number.isNaN(y));
    }""")
    rows = figure["rows"]
    assert {rows[round(y)] for y in shaded} == {f"r{s.rank} · {s.lane}" for s in path}
    legend = set(page.locator(".plotly-graph-div").first.locator(
        ".legend text").all_text_contents())
    kinds = {s.kind for s in path}
    assert {"critical path", "rows it runs through"} <= legend
    assert {f"critical path · {kind}" for kind in kinds} <= legend
    table = page.locator("table.critical-path").first
    runs = table.locator("tr.run")
    assert runs.count() >= 3
    # README: rank 1 sleeps 200 ms; the step's path runs through that sleep on rank 1
    sleep = table.locator("tr.run", has_text="straggler_sleep")
    assert sleep.get_attribute("data-rank") == "1" and sleep.get_attribute("data-kind") == \
        "compute"
    assert "compute_straggler" in sleep.inner_text()
