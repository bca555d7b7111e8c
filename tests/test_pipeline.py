"""Pipeline recovery without annotations, against known schedules: the simulated seed sample and
VPP scenarios (ground truth: the schedule the simulator ran), the framework's own ranges, and the
real gloo sample with its `FWD mb=i` / `BWD mb=i` ranges stripped (known answer: those ranges).
Where the blocks cannot be trusted, nothing is labelled and the pipeline says why."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tracegraph
from tests.conftest import REAL, SAMPLES
from tests.ground_truth_eval import labelled_right
from tracegraph import schema
from tracegraph.analysis import pipeline
from tracegraph.analysis.analyze import analyze
from tracegraph.analysis.pipeline.annotations import RANGE
from tracegraph.cli.app import app
from tracegraph.loading.trace import Trace
from tracegraph.simulate import simulate, truth_pipeline
from tracegraph.simulate.bundle_writer import write_bundle

FORMATS = ("ascend", "kineto")
CORPUS = Path(__file__).parent / "data" / "corpus"
ENOUGH = 0.95  # share of blocks labelled right (stage, chunk, microbatch, F/B)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory):
    """(scenario, format) -> (analysis, true pipeline), built once per module."""
    made = {}

    def get(name: str, fmt: str, **overrides: object):
        key = (name, fmt, *sorted(overrides.items()))
        if key not in made:
            timeline = simulate(name, **overrides)
            archive = write_bundle(timeline, tmp_path_factory.mktemp(name) / f"{fmt}.tar.gz",
                                   fmt)
            analysis = analyze(tracegraph.load(archive, use_cache=False))
            made[key] = analysis, truth_pipeline.from_timeline(analysis, timeline)
        return made[key]
    return get


def stripped(trace: Trace) -> Trace:
    """The trace without the framework's forward / backward ranges."""
    events = trace.events
    ranges = (events["kind"] == schema.MARKER) & events["name"].str.fullmatch(RANGE.pattern,
                                                                              case=False)
    inside = events["annotation"].str.fullmatch(RANGE.pattern, case=False)
    events = events[~ranges].assign(annotation=events["annotation"].where(~inside, ""))
    return Trace(trace.source, events, trace.groups, trace.ranks, trace.warnings, trace.memory)


def assert_interleaved(found, truth) -> None:
    """Found like the truth: blocks labelled right, PP4 × VPP2 × 16 microbatches, and the
    bubble ratio measured as the schedule's (within the kernels' gaps) beside its theory."""
    assert found.reason == ""
    assert labelled_right(truth, found) >= ENOUGH
    for step in truth.steps:
        ratio, true = found.bubble_ratio(step), truth.bubble_ratio(step)
        assert (ratio.stages, ratio.chunks, ratio.microbatches) == (4, 2, 16)
        assert ratio.theory == pytest.approx(3 / 32)
        assert ratio.measured == pytest.approx(true.measured, rel=0.1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_seed_sample_schedule_from_op_order(fmt: str, cache_dir: Path) -> None:
    """The bundled seed case (PP4 × VPP2, 16 microbatches, sync HSDP waits on the compute
    stream): its interleaved schedule from P2P boundaries and op order alone."""
    bundle = SAMPLES / "simulated" / f"hsdp-straggler-sync-{fmt}.tar.gz"
    analysis = analyze(tracegraph.load(bundle, cache_dir=cache_dir))
    timeline = truth_pipeline.timeline_from_truth(
        bundle.with_name(f"hsdp-straggler-sync-{fmt}.ground_truth.json"))
    found = pipeline.recover(analysis)
    assert found.source == "op order"
    assert_interleaved(found, truth_pipeline.from_timeline(analysis, timeline))
    [step] = found.as_dict()["steps"]  # what analyze --json reports
    assert (step["stages"], step["chunks"], step["microbatches"]) == (4, 2, 16)
    assert step["theory"] == pytest.approx(3 / 32, abs=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_vpp_schedule_from_op_order(simulated, fmt: str) -> None:
    analysis, truth = simulated("vpp", fmt)
    found = pipeline.recover(analysis)
    assert found.source == "op order"
    assert_interleaved(found, truth)


@pytest.mark.parametrize("fmt", FORMATS)
def test_framework_ranges_and_without_them(simulated, fmt: str) -> None:
    """`vpp-annotated`: the framework's ranges (Kineto `forward_step` / `backward_step`, and
    their `gpu_user_annotation`; MindSpore mstx `forward` / `backward` on the host) carry no
    microbatch: numbered by order they match the schedule; stripped, op order does too."""
    analysis, truth = simulated("vpp-annotated", fmt)
    names = set(analysis.trace.events.loc[analysis.trace.events["kind"] == schema.MARKER,
                                          "name"])
    assert names >= ({"forward_step", "backward_step"} if fmt == "kineto"
                     else {"forward", "backward"})
    found = pipeline.recover(analysis)
    assert found.source == "annotations"
    assert_interleaved(found, truth)
    bare = analyze(stripped(analysis.trace))
    assert pipeline.from_annotations(bare) is None
    found = pipeline.recover(bare)
    assert found.source == "op order"
    assert_interleaved(found, truth)


@pytest.mark.parametrize(("fmt", "label", "first"), [
    ("kineto", "{PHASE} chunk={chunk} mb={mb}", "FWD chunk=0 mb=0"),
    ("ascend", "{PHASE} chunk={chunk} mb={mb}", "FWD chunk=0 mb=0"),
    ("kineto", "{phase} model_chunk_id={chunk} microbatch_id={mb}",
     "forward_step model_chunk_id=0 microbatch_id=0"),
    ("ascend", "{phase} vpp_rank={chunk} micro_batch={mb}", "forward vpp_rank=0 micro_batch=0"),
])
def test_interleaved_ranges_labelled_with_chunk_and_microbatch(simulated, fmt: str, label: str,
                                                                first: str) -> None:
    """`vpp-labelled`: every forward and backward range names its model chunk and microbatch,
    the chunk first (`FWD chunk=1 mb=3`, Megatron's `model_chunk_id` / `microbatch_id`, mstx
    `vpp_rank` / `micro_batch`): the interleaved schedule is read from the labels, right."""
    analysis, truth = simulated("vpp-labelled", fmt, range_label=label)
    markers = analysis.trace.events.loc[analysis.trace.events["kind"] == schema.MARKER, "name"]
    assert first in set(markers)
    found = pipeline.recover(analysis)
    assert found.source == "annotations"
    assert_interleaved(found, truth)
    assert labelled_right(truth, found) == 1.0


@pytest.mark.parametrize("case", ["pp4_1f1b_bwd_straggler", "world_metrics_allreduce"])
def test_corpus_ranges_relabelled_chunk_first(case: str, tmp_path: Path) -> None:
    """The real corpus pipelines with each `FWD mb=i` / `BWD mb=i` range renamed `FWD chunk=0
    mb=i` (the chunk first, as interleaving frameworks write it): the same blocks, from the
    labels."""
    folder = CORPUS / case
    for path in folder.glob("rank*.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("cat") == "user_annotation" and RANGE.match(e.get("name", "")):
                phase, mb = e["name"].split(" mb=")
                e["name"] = f"{phase} chunk=0 mb={mb}"
        (tmp_path / path.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    truth = pipeline.from_annotations(analyze(tracegraph.load(folder, use_cache=False)))
    found = pipeline.recover(analyze(tracegraph.load(tmp_path, use_cache=False)))
    assert found.source == "annotations" and found.reason == ""
    assert labelled_right(truth, found) == 1.0
    assert len(found.blocks) == len(truth.blocks)


def test_gloo_sample_without_its_ranges(gloo_analysis, tmp_path: Path) -> None:
    """The real PP2 × DP2 gloo job (GPipe-style: its backwards run microbatches 3, 2, 1, 0) with
    its `FWD mb=i` / `BWD mb=i` ranges removed from the files: op order finds every block as the
    ranges label it; the backwards' microbatches come from the autograd sequence numbers their
    ops share with the forward's (in forward order they would all be wrong)."""
    for r in range(4):
        doc = json.loads((REAL / "kineto" / "gloo_pp2_dp2" / f"rank{r}.json").read_bytes())
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not (e.get("cat") == "user_annotation"
                                      and RANGE.match(e.get("name", "")))]
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    bare = analyze(tracegraph.load(tmp_path, use_cache=False))
    assert pipeline.from_annotations(bare) is None
    truth = pipeline.from_annotations(gloo_analysis)
    found = pipeline.recover(bare)
    assert found.source == "op order" and found.reason == ""
    assert labelled_right(truth, found) >= ENOUGH
    backwards = found.blocks[(found.blocks["phase"] == pipeline.B) & (found.blocks["rank"] == 1)]
    assert backwards.sort_values("start")["microbatch"].tolist() == [3, 2, 1, 0] * 2
    for step in (2, 3):
        ratio = found.bubble_ratio(step)
        assert (ratio.stages, ratio.chunks, ratio.microbatches) == (2, 1, 4)
        assert ratio.measured == pytest.approx(truth.bubble_ratio(step).measured, rel=0.1)


@pytest.mark.parametrize("case", ["pp4_1f1b_healthy", "pp4_1f1b_bwd_straggler",
                                  "pp2dp2_wait_before_send", "pp2dp2_wait_after_send",
                                  "pp2dp2_one_replica", "world_metrics_allreduce"])
def test_corpus_pipelines_without_their_ranges(case: str, tmp_path: Path) -> None:
    """The real corpus jobs with a pipeline (PP4 1F1B with and without a backward straggler,
    PP2 × DP2 1F1B whose DP reduction sits between the last backward and its send, one replica
    of it profiled, GPipe with 6 microbatches), their FWD/BWD ranges removed: op order labels
    their blocks as the ranges do."""
    folder = CORPUS / case
    for path in folder.glob("rank*.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not (
            e.get("cat") == "user_annotation" and RANGE.match(e.get("name", "")))]
        (tmp_path / path.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    truth = pipeline.from_annotations(analyze(tracegraph.load(folder, use_cache=False)))
    bare = analyze(tracegraph.load(tmp_path, use_cache=False))
    assert pipeline.from_annotations(bare) is None
    found = pipeline.recover(bare)
    assert found.source == "op order" and found.reason == ""
    assert labelled_right(truth, found) >= ENOUGH


@pytest.fixture(scope="module")
def gloo_analysis():
    return analyze(tracegraph.load(REAL / "kineto" / "gloo_pp2_dp2", use_cache=False))


@pytest.mark.parametrize("fmt", FORMATS)
def test_combined_1f1b_is_not_guessed(simulated, fmt: str) -> None:
    """Combined 1F1B (EP all-to-all overlap) interleaves a forward and a backward layer by
    layer: no block is one forward or one backward, so nothing is drawn, and the pipeline says
    why (Kineto: the ops' names contradict the blocks; Ascend, whose all-to-all waits leave
    ops between P2P boundaries without a phase: the counts fit no 1F1B order)."""
    analysis, _ = simulated("ep-a2a-overlap", fmt)
    found = pipeline.recover(analysis)
    assert found.source == "op order" and found.blocks.empty
    assert ("forward and backward work interleave" in found.reason if fmt == "kineto"
            else "fit no (interleaved) 1F1B order" in found.reason)


def test_ranges_without_a_pipeline_draw_none() -> None:
    """A data-parallel job whose ranges name only the phase (`FWD`, `BWD`: corpus dp4_healthy)
    has no pipeline to draw."""
    analysis = analyze(tracegraph.load(CORPUS / "dp4_healthy", use_cache=False))
    assert pipeline.recover(analysis) is None


def test_analyze_and_the_report_say_why_nothing_is_drawn(tmp_path: Path) -> None:
    """The bundled combined-1F1B sample: `analyze --json` has the pipeline's reason and no
    steps, the terminal and the report say it is not drawn, and no pipeline figure is."""
    bundle = SAMPLES / "simulated" / "ep-a2a-overlap-kineto.tar.gz"
    run = CliRunner().invoke(app, ["analyze", str(bundle), "--json", "--no-cache"])
    assert run.exit_code == 0, run.output
    said = json.loads(run.stdout)["pipeline"]
    assert said["source"] == "op order" and said["steps"] == []
    assert said["reason"].startswith("forward and backward work interleave")
    run = CliRunner().invoke(app, ["analyze", str(bundle), "--no-cache"])
    assert "pipeline (op order): not recovered: forward and backward work interleave" in (
        " ".join(run.stdout.split()))
    out = tmp_path / "r.html"
    run = CliRunner().invoke(app, ["report", str(bundle), "-o", str(out), "--no-cache"])
    html = out.read_text()
    assert "pipeline (op order) not drawn: forward and backward work interleave" in html
    assert "pipeline, step" not in html


def test_a_missing_block_makes_recovery_unsure(simulated) -> None:
    """Rank 1 loses the ops of one forward (a sampled trace): its stage no longer has v·m
    forwards, so that replica is not labelled rather than labelled off by one."""
    analysis, truth = simulated("vpp", "ascend")
    block = truth.blocks[(truth.blocks["rank"] == 1) & (truth.blocks["phase"] == pipeline.F)]
    block = block.iloc[10]
    events = analysis.trace.events
    shift = analysis.offsets.get(1, 0)
    inside = ((events["rank"] == 1) & (events["kind"] == schema.COMPUTE)
              & (events["start_ns"] - shift >= block.start)
              & (events["start_ns"] - shift < block.end))
    trace = analysis.trace
    damaged = analyze(Trace(trace.source, events[~inside], trace.groups, trace.ranks))
    found = pipeline.recover(damaged)
    assert found.blocks.empty and "r1 31F/32B" in found.reason
