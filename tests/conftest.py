"""Shared test fixtures: where the real profiles lie (../shared beside the clone), a browser."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REAL = SHARED / "real_traces"
SAMPLES = REPO / "sample_traces"


QUICK_FUZZ_CASES = 160
"""Fuzz cases in a plain run (CI); `--fuzz-cases N` or TRACEGRAPH_FUZZ_CASES=N for a long run."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-cases", type=int, default=None,
                     help=f"fuzz cases to run (default {QUICK_FUZZ_CASES}, or "
                          "$TRACEGRAPH_FUZZ_CASES)")


@pytest.fixture(scope="session")
def fuzz_cases(request: pytest.FixtureRequest) -> int:
    """How many fuzz cases this run covers."""
    given = request.config.getoption("--fuzz-cases")
    return given if given is not None else int(os.environ.get("TRACEGRAPH_FUZZ_CASES")
                                               or QUICK_FUZZ_CASES)


@pytest.fixture(scope="session")
def real() -> Path:
    """The real profiles; the suite fails (never skips) without them."""
    assert REAL.is_dir(), f"{REAL} missing: CI must have ../shared beside the clone"
    return REAL


@pytest.fixture()
def cache_dir(tmp_path: Path) -> Path:
    """A private parse cache for one test."""
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """Debian's chromium, headless and offline, for one test module."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, FLAGS

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: CI must install Debian's chromium"
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("profile"), executable_path=CHROMIUM, headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 900}, offline=True)
        yield context
        context.close()
