"""The terminal chain diagram on the real gloo_pp2_dp2 trace: rank 1's sleep reads as one line."""

from __future__ import annotations

from pathlib import Path

import tracegraph
from reports.terminal import chain_text, merged_intervals
from tests.conftest import SAMPLES
from tracegraph import causes
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.summary import summarize


def test_chain_folds_runs_on_one_lane_into_a_line(cache_dir: Path) -> None:
    summary = summarize(analyze(tracegraph.load(SAMPLES / "gloo_pp2_dp2", cache_dir=cache_dir)))
    top = summary["bubbles"][0]
    lines = merged_intervals(top["intervals"])
    assert len(lines) < len(top["intervals"])
    lanes = [(p["rank"], p["lane"]) for p in lines]
    assert all(a != b for a, b in zip(lanes[:-1], lanes[1:], strict=True))  # neighbours differ
    total = sum(p["dur_ms"] for p in top["intervals"])
    assert abs(sum(p["dur_ms"] for p in lines) - total) < 1e-6  # no time lost in the merge
    sleep = max(lines, key=lambda p: p["dur_ms"])
    assert sleep["rank"] == 1 and sleep["category"] == causes.COMPUTE_STRAGGLER
    assert sleep["name"].startswith("straggler_sleep") and sleep["dur_ms"] > 195
    text = chain_text(top)
    assert text.count("\n") == len(lines) + 1 and "straggler_sleep +" in text
