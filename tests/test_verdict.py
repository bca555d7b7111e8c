"""The answer first: `analyze`'s verdict on the seed case, piped as into a CI log, names its
longest reduction waits, their origin and the fix's replayed gain in its first lines; a
64-rank bundle's output stays short; the real gloo job's straggler leads. Known answers come
from the simulated bundles' ground truth and the real traces' README."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import corpus
from tests.conftest import SAMPLES
from tests.test_checks import run_cli

SIM = SAMPLES / "simulated"
SEED = SIM / "hsdp-straggler-sync-ascend.tar.gz"
MAX_LINES = 120  # a busy engineer's screenful, whatever the ranks


def truth(bundle: Path) -> dict:
    return json.loads(bundle.with_name(bundle.name.replace(".tar.gz", ".ground_truth.json"))
                      .read_text())


def step_ms(gt: dict) -> float:
    """The slowest rank's step of the ground truth (one step)."""
    return max(s["end_ns"] - s["start_ns"] for s in gt["steps"]) / 1e6


def piped(*args: object, cache: Path) -> subprocess.CompletedProcess:
    """`tracegraph …` with stdout a pipe, as in a CI log or `less`."""
    return subprocess.run([sys.executable, "-m", "tracegraph", *map(str, args),
                           "--cache-dir", str(cache)], capture_output=True, text=True,
                          timeout=600)


def test_the_seed_answer_is_in_the_first_25_lines_unwrapped(cache_dir: Path) -> None:
    """Ground truth: the two longest waits are reduction waits (rank 0's on stream 47, rank
    12288's own), and the late members are of rank 12288's HSDP groups; the fix's gain is the
    step the async bundle measured after it, within the replay's 2 %."""
    run = piped("analyze", SEED, cache=cache_dir)
    assert run.returncode == 0, run.stderr
    head = run.stdout.splitlines()[:25]
    gt = truth(SEED)
    longest = sorted((b for b in gt["bubbles"] if b["category"] == "dp_reduction"),
                     key=lambda b: -b["dur_ms"])[:2]
    stalls = {(int(m[2]), float(m[1])): line for line in head
              if (m := re.match(r"\s+([\d.]+) ms  rank (\d+) ", line))}
    for wait in longest:  # each on one line with its origin, as long as it is
        [line] = [line for (rank, ms), line in stalls.items()
                  if rank == wait["rank"] and abs(ms - wait["dur_ms"]) <= 0.06]
        assert f"[dp_reduction] ← rank {wait['root']['rank']} " in line, line
        assert len(line) > 100 and line.endswith("medium"), line  # one line, whole
    [fix] = [x for x in head if x.startswith("fix:")]
    assert "decouple-reduction" in fix
    gain = float(re.search(r"gain ([\d.]+) ms", fix)[1])
    expected = step_ms(gt) - step_ms(truth(SIM / "hsdp-straggler-async-ascend.tar.gz"))
    assert abs(gain - expected) <= 0.02 * step_ms(gt), (gain, expected)
    assert head[0].startswith(f"step 1: {step_ms(gt):.1f} ms, slowest rank 0")


def test_width_wraps_and_detail_and_inventory_add_their_tables(cache_dir: Path) -> None:
    """--width 60 wraps every line; the per-step tables and the inventory come with their
    flags only, the one-line summary of what was read in their place."""
    narrow = piped("analyze", SEED, "--width", "60", cache=cache_dir).stdout
    assert max(map(len, narrow.splitlines())) <= 60
    plain = run_cli("analyze", SEED, "--cache-dir", cache_dir).stdout
    full = run_cli("analyze", SEED, "--cache-dir", cache_dir, "--detail", "--inventory").stdout
    assert "read 4 ranks (4 ascend; " in plain and "--inventory lists them" in plain
    for table in ("critical path 6649.687 ms", "┃ rank  ┃  step ms ┃", "┃ framework ┃", "┃ group "):
        assert table in full and table not in plain
    assert len(plain.splitlines()) < MAX_LINES < len(full.splitlines())


@pytest.fixture(scope="module")
def sixty_four(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """pp-compute-straggler, PP4 1F1B, as 16 and as 64 ranks (4 and 16 pipeline replicas; rank
    2 the straggler in both), small kernels."""
    from tracegraph.simulate import simulate
    from tracegraph.simulate.bundle_writer import write_bundle

    out = tmp_path_factory.mktemp("ranks")
    return tuple(write_bundle(simulate("pp-compute-straggler", ranks=n, kernels_per_chunk=2,
                                       steps=1), out / f"pp{n}", "kineto")
                 for n in (16, 64))


def test_a_64_rank_bundle_stays_short(sixty_four: tuple[Path, Path], tmp_path: Path) -> None:
    """The default output does not grow with ranks: 64 ranks print under 120 lines, about as
    many as 16 do, and the verdict names the ground truth's straggler first among what is not the
    schedule's own, with its gain by replay."""
    lines = {}
    for bundle in sixty_four:
        run = run_cli("analyze", bundle, "--cache-dir", tmp_path)
        assert run.exit_code == 0, run.output
        lines[bundle] = run.stdout.splitlines()
    small, large = (lines[b] for b in sixty_four)
    growth = len(large) - len(small)  # a chain's pieces differ between the bundles, no more
    assert len(large) < MAX_LINES and growth <= 10, (len(small), len(large))
    slow = {c["ranks"][0] for c in truth(sixty_four[1])["causes"]
            if c["category"] == "compute_straggler"}
    assert slow == {2}
    verdict = large[:large.index("")]
    [straggler] = [x for x in verdict if x.lstrip().startswith("compute_straggler")]
    assert re.search(r"rank 2 stream \d+", verdict[verdict.index(straggler) + 1])
    assert [x for x in verdict if x.startswith("fix: remove compute_straggler (straggler 2")]
    assert [x for x in verdict if x.startswith("finding first: rank 2 is a compute straggler")]


def test_the_real_gloo_straggler_comes_first(cache_dir: Path) -> None:
    """The real gloo_pp2_dp2 job (README: rank 1 sleeps 200 ms in each ≈225 ms step): its
    sleep is the first cause, about 90 % of the step, the finding that comes first, and the
    fix brings rank 1 to its peers' median."""
    run = piped("analyze", SAMPLES / "gloo_pp2_dp2", cache=cache_dir)
    lines = run.stdout.splitlines()
    first = lines[2]
    assert first.split()[0] == "compute_straggler", lines[:3]
    share = float(re.search(r"([\d.]+) %", first)[1])
    assert 85 <= share <= 95
    assert "rank 1 thread" in lines[3] and "straggler_sleep" in lines[3]
    [finding] = [x for x in lines if x.startswith("finding first:")]
    assert "rank 1 is a compute straggler" in finding
    assert [x for x in lines if x.startswith("fix: remove compute_straggler (straggler 1")]


def test_the_ci_markdown_and_the_report_open_with_the_verdict(tmp_path: Path) -> None:
    """`check --markdown` and the HTML report carry the verdict: the seed's fix and its gain."""
    md, html = tmp_path / "check.md", tmp_path / "report.html"
    run_cli("check", SEED, "--preset", "hsdp-async-reduction", "--markdown", md,
            "--cache-dir", tmp_path / "cache")
    text = md.read_text()
    assert text.index("### Verdict") < text.index("### Checks")
    assert "fix: whatif --fix decouple-reduction (dp_reduction)" in text
    assert run_cli("report", SEED, "-o", html, "--cache-dir", tmp_path / "cache").exit_code == 0
    page = html.read_text()
    assert page.index("<h2>Verdict</h2>") < page.index("<h2>Findings</h2>")
    assert "whatif --fix decouple-reduction" in page


def test_help_tells_the_truth() -> None:
    """simulate lists every scenario of the registry; no flag shows a type; whatif says what
    it exits with when a fix does not apply."""
    from tracegraph.simulate import SCENARIOS

    def help_of(*command: str) -> str:
        run = subprocess.run([sys.executable, "-m", "tracegraph", *command, "--help"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"})
        assert run.returncode == 0, run.stderr
        return run.stdout

    simulate = help_of("simulate")
    assert all(f"{name}: " in simulate for name in SCENARIOS)
    for command in ("analyze", "report", "whatif", "diff", "check", "export", "graph"):
        assert "<bool>" not in help_of(command), command
    whatif = " ".join(help_of("whatif").split())
    assert "Exit codes: 0 a prediction was made, also when an edit finds nothing to change" in (
        whatif)


def test_a_rotating_straggler_is_named_step_by_step(cache_dir: Path) -> None:
    """The recorded dp4_rotating_straggler job (its ground truth: in each profiled step a
    different rank's FWD takes 120 ms longer, 5× its usual): over the profile no rank is slower
    than the others, so the verdict weighs each step's straggler in its step. The straggling
    compute leads, as most of the step, spread over the stragglers, and the finding names the
    straggler of every step, never one rank for all."""
    case = "dp4_rotating_straggler"
    run = piped("analyze", corpus.folder(case), cache=cache_dir)
    lines = run.stdout.splitlines()
    assert lines[2].split()[0] == "compute_straggler", lines[:4]
    assert float(re.search(r"([\d.]+) %", lines[2])[1]) >= 50
    named = {int(m[1]) for x in lines[3:6] if (m := re.search(r"rank (\d+) thread", x))}
    assert len(named) == 3  # the three largest of the four, the fourth "… 1 more origin"
    [finding] = [x for x in lines if x.startswith("finding first:")]
    each = ", ".join(f"rank {s['rank']} in step {s['step']}"
                     for s in corpus.truth(case)["expected"]["stragglers"])
    assert finding.startswith(f"finding first: a different rank straggles in each step ({each})")
