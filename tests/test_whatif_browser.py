"""The report's what-if section as a person opens it (chromium, tests/browser.py): the measured
and the predicted waterfall of each step side by side, on one time axis."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import BrowserContext

from reports.html import write_report
from tests.browser import FIGURES, assert_not_blank, open_page
from tests.conftest import SAMPLES
from tests.whatif_bundles import analysed
from tracegraph.whatif.edits import Straggler
from tracegraph.whatif.predict import predict


def test_predicted_waterfall_beside_the_measured_one(browser: BrowserContext,
                                                     tmp_path: Path) -> None:
    analysis = analysed(SAMPLES / "gloo_pp2_dp2")
    prediction = predict(analysis, [Straggler("1")])
    page, errors = open_page(browser, write_report(analysis, tmp_path / "whatif.html", top=3,
                                                   prediction=prediction))
    assert errors == []
    pairs = page.locator(".whatif .whatif-pair")
    assert pairs.count() == 2  # ProfilerStep#2 and #3
    titles = page.evaluate("""() => Array.from(document.querySelectorAll(
        '.whatif .plotly-graph-div')).map(gd => [gd.layout.title.text, gd.layout.xaxis.range,
        gd.getBoundingClientRect().top])""")
    assert [t[0] for t in titles] == ["step 2: measured", "step 2: predicted",
                                      "step 3: measured", "step 3: predicted"]
    for measured, predicted in (titles[0:2], titles[2:4]):
        assert predicted[1] == measured[1]  # one time axis
        assert abs(predicted[2] - measured[2]) < 1  # beside it, not under it
    # the predicted figure draws the same ops and its own critical path, no bubble band
    figures = page.evaluate(FIGURES)[-4:]
    names = [{t["name"] for t in f["traces"]} for f in figures]
    assert any(n.startswith("critical path ·") for n in names[1]) and "host" in names[1]
    assert not any(n in names[1] for n in ("compute_straggler", "dp_reduction"))
    text = page.locator(".whatif").inner_text()
    assert "straggler 1=median" in text and "bubbles that vanish" in text
    assert_not_blank(page.locator(".whatif .plotly-graph-div").nth(1).screenshot())
    page.close()
