"""Shared test fixtures: where the real profiles lie (../shared beside the clone)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REAL = SHARED / "real_traces"
SAMPLES = REPO / "sample_traces"


@pytest.fixture(scope="session")
def real() -> Path:
    """The real profiles; the suite fails (never skips) without them."""
    assert REAL.is_dir(), f"{REAL} missing: CI must have ../shared beside the clone"
    return REAL


@pytest.fixture()
def cache_dir(tmp_path: Path) -> Path:
    """A private parse cache for one test."""
    return tmp_path / "cache"
