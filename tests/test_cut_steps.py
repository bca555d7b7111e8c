"""A step the profile's end cut short is no step time: HTA's MI250 trace (read by hand) holds
ProfilerStep#1 of 9288 µs and ProfilerStep#2 of 49 µs, the profiler stopped inside the latter
(no kernel after its start, the trace's last event 268 µs after it began)."""

from __future__ import annotations

from pathlib import Path

import tracegraph
from tracegraph.analysis.analyze import analyze

AMD = "kineto/hta/amd_trace"


def test_the_cut_step_is_left_out_with_a_warning(real: Path) -> None:
    analysis = analyze(tracegraph.load(real / AMD, use_cache=False))
    table = analysis.step_table()
    assert list(zip(table["rank"], table["step"], strict=True)) == [(0, 1)]
    assert round(float(table["ms"].iloc[0]), 1) == 9.3
    [said] = [w for w in analysis.warnings if "cut short by the profile's end" in w]
    assert said.startswith("rank 0: ProfilerStep#2 (0.0491 ms, against 9.29 ms")


def test_complete_last_steps_are_kept(real: Path) -> None:
    """gloo_pp2_dp2's last step (#3) ends at the profile's end too, as long as the others."""
    analysis = analyze(tracegraph.load(real / "kineto/gloo_pp2_dp2", use_cache=False))
    table = analysis.step_table()
    assert sorted(set(table["step"])) == [2, 3] and len(table) == 8
    assert not [w for w in analysis.warnings if "cut short" in w]
