"""Opening reports as a person does: Debian's chromium, headless, driven through playwright
(Python package only: no browser download). The `browser` fixture lives in conftest.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from playwright.sync_api import BrowserContext, Page

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FIGURES = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(gd => ({
    rows: gd.layout.yaxis.ticktext || [],
    traces: gd._fullData.map(t => ({name: t.name, type: t.type, mode: t.mode,
                                    points: t.x ? t.x.length : 0})),
    arrows: (gd.layout.annotations || []).map(a => ({name: a.name, text: a.text, x: a.x,
                                                     y: a.y, ax: a.ax, ay: a.ay}))}))"""


def open_page(browser: BrowserContext, html: Path) -> tuple[Page, list[str]]:
    """Open a report once every figure has drawn; the list collects console errors, page
    errors and failed requests as they happen."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"request {r.url}"))
    page.goto(html.as_uri())
    page.wait_for_function("Array.from(document.querySelectorAll('.plotly-graph-div'))"
                           ".every(gd => gd._fullLayout && gd.querySelector('.main-svg'))")
    return page, errors


def assert_not_blank(png: bytes) -> None:
    """A screenshot with contrast and many colours: something was drawn."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=float)
    assert pixels.std() > 20
    assert len({tuple(p) for p in pixels.reshape(-1, 3)[::7].astype(int)}) > 50
