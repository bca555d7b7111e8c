"""The notebook API (`tracegraph.analyze`) on the seed case, against its ground truth; the
notebook of docs/ run top to bottom in a real Jupyter kernel; progress off a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

import tracegraph
from tests.conftest import REPO, SAMPLES
from tracegraph import progress
from tracegraph.api import BUBBLE_COLUMNS, ProfileWarning

SIM = SAMPLES / "simulated"
SEED = SIM / "hsdp-straggler-sync-ascend.tar.gz"


def truth(name: str) -> dict:
    return json.loads((SIM / f"{name}.ground_truth.json").read_text())


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> tracegraph.api.Result:
    with pytest.warns(ProfileWarning, match="508 rank"):  # the HSDP members not profiled
        return tracegraph.analyze(SEED, cache_dir=tmp_path_factory.mktemp("cache"))


def test_bubbles_are_a_dataframe_in_ms_on_the_aligned_clock(seed) -> None:
    """Each ground-truth bubble of 10 ms or more is a row: same rank and category, start and
    length in ms from the first step's start (the ground truth's origin); a reduction wait's
    root is the ground truth's (the pipeline fill's, a rule of blame's own, is left out)."""
    bubbles = seed.bubbles
    assert isinstance(bubbles, pd.DataFrame) and list(bubbles.columns) == BUBBLE_COLUMNS
    gt = [b for b in truth("hsdp-straggler-sync-ascend")["bubbles"] if b["dur_ms"] >= 10]
    for expected in gt:
        near = bubbles[(bubbles["rank"] == expected["rank"])
                       & ((bubbles["start_ms"] - expected["start_ms"]).abs() < 0.1)]
        assert len(near) == 1, expected
        row = near.iloc[0]
        assert abs(row["dur_ms"] - expected["dur_ms"]) < 0.1
        assert row["category"] == expected["category"]
        if expected["category"] == "dp_reduction":
            assert row["root_rank"] == expected["root"]["rank"], expected
    top = bubbles.iloc[0]
    assert top["chain"] == [0, 4096, 8192, 12288] and top["confidence"] == "medium"
    assert top["root_group"] == "hsdp-dp32-12288" and top["lane"] == "stream 47"


def test_causes_tile_each_bubble_and_name_absent_groups(seed) -> None:
    causes = seed.causes
    whole = causes.groupby("bubble")[["ms", "share"]].sum()
    lengths = seed.bubbles.set_index("bubble")["dur_ms"]
    assert (whole["share"] - 1).abs().max() < 1e-9
    assert (whole["ms"] - lengths[whole.index]).abs().max() < 1e-6
    top = causes[causes["bubble"] == 0]
    assert list(top["share"]) == sorted(top["share"], reverse=True)
    first = top.iloc[0]
    assert (first["rank"], first["group"], first["category"]) == (12288, "hsdp-dp32-12288",
                                                                  "dp_reduction")


def test_critical_path_steps_stragglers_and_findings(seed) -> None:
    gt = truth("hsdp-straggler-sync-ascend")
    steps = seed.steps
    measured = {s["rank"]: (s["end_ns"] - s["start_ns"]) / 1e6 for s in gt["steps"]}
    assert dict(zip(steps["rank"], steps["ms"], strict=True)) == pytest.approx(measured,
                                                                               abs=0.05)
    assert steps.loc[steps["slowest"], "rank"].tolist() == [0]
    path = seed.critical_path
    assert path["dur_ms"].sum() == pytest.approx(steps["ms"].max(), abs=0.01)
    assert (path["start_ms"].iloc[1:].to_numpy() >= path["end_ms"].iloc[:-1].to_numpy() - 1e-6
            ).all()
    assert not seed.stragglers["straggler"].any()  # the straggler is outside the bundle
    assert seed.findings.loc[0, "kind"] == "exposed_comm"
    assert seed.findings.loc[0, "severity"] == "warning"


def test_whatif_by_name_predicts_the_measured_fix(seed) -> None:
    """decouple-reduction on the sync bundle predicts the step the async bundle measured."""
    fixed = seed.whatif(fix="decouple-reduction")
    after = truth("hsdp-straggler-async-ascend")["steps"]
    measured = max(s["end_ns"] - s["start_ns"] for s in after) / 1e6
    assert fixed.predicted_ms == pytest.approx(measured, rel=0.01)
    assert fixed.gain_ms == pytest.approx(fixed.measured_ms - measured, rel=0.02)
    vanished = fixed.bubbles[fixed.bubbles["state"] == "vanished"]
    assert {0, 4096, 12288} <= set(vanished[vanished["measured_ms"] > 400]["rank"])
    assert seed.whatif(scale={"dp_reduction": 0}).gain_ms > 0
    with pytest.raises(ValueError, match="unknown fix"):
        seed.whatif(fix="no-such-fix")


def test_figure_and_html_summary(seed) -> None:
    figure = seed.figure()
    assert figure.layout.title.text.startswith("step 1") and len(figure.data) > 5
    html = seed._repr_html_()
    assert "<h2>Verdict</h2>" in html and "decouple-reduction" in html


def test_the_notebook_runs_in_a_jupyter_kernel(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/seed.ipynb top to bottom in a real kernel: every cell runs (its asserts hold), the
    verdict shows as HTML, the waterfall as a plotly figure, the fix's prediction printed."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TRACEGRAPH_CACHE_DIR", str(tmp_path))
    notebook = nbformat.read(REPO / "docs" / "seed.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "docs")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o.get("data", {}) for o in outputs]
    assert any("Verdict" in d.get("text/html", "") for d in shown)
    assert any("application/vnd.plotly.v1+json" in d for d in shown)
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "predicted 6104.4 ms; measured after the fix 6104.4 ms" in printed


def test_progress_is_plain_lines_at_a_pace_off_a_terminal(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """stderr not a terminal: a line every PACE_S while the work runs and a last one; none
    for work shorter than PACE_S; none at all when quiet."""
    import time

    def run(seconds: float) -> str:
        stderr = io.StringIO()
        monkeypatch.setattr("sys.stderr", stderr)
        with progress.Progress("reading ranks", total=2) as bar:
            bar.advance()
            time.sleep(seconds)
            bar.advance()
        return stderr.getvalue()

    monkeypatch.setattr(progress, "PACE_S", 0.05)
    lines = run(0.3).splitlines()
    assert len(lines) >= 3 and lines[0].startswith("reading ranks: 1/2 after ")
    assert lines[-1].startswith("reading ranks: 2/2 done in ")
    monkeypatch.setattr(progress, "PACE_S", 60)
    assert run(0.05) == ""
    monkeypatch.setattr(progress, "PACE_S", 0.05)
    progress.quiet()
    try:
        assert run(0.3) == ""
    finally:
        progress.quiet(False)
