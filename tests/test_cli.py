"""The command line as a user runs it: a real subprocess, exit codes, stdout JSON, stderr lines."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import SAMPLES
from tracegraph.cli.app import app


def tracegraph(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracegraph", *args, "--cache-dir", str(cache)],
                          capture_output=True, text=True, timeout=300)


def test_analyze_json_on_the_gloo_sample(cache_dir: Path) -> None:
    run = tracegraph("analyze", str(SAMPLES / "gloo_pp2_dp2"), "--json", cache=cache_dir)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert {"steps", "bubbles", "blame", "critical_path", "groups"} <= set(summary)
    longest = summary["bubbles"][0]
    assert longest["dur_ms"] > 190  # the ≈200 ms waits behind rank 1's sleep
    assert {"rank", "lane", "start_ms", "dur_ms", "category", "root", "chain"} <= set(longest)


def test_analyze_prints_tables_and_chains(cache_dir: Path) -> None:
    run = tracegraph("analyze", str(SAMPLES / "gloo_pp2_dp2"), "--top", "3", cache=cache_dir)
    assert run.returncode == 0, run.stderr
    assert "4 ranks" in run.stdout
    assert "chain: rank" in run.stdout


def test_export_parquet(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "tables"
    run = tracegraph("export", str(SAMPLES / "gloo_pp2_dp2"), "--parquet", str(out),
                     cache=cache_dir)
    assert run.returncode == 0, run.stderr
    ranks = pq.read_table(out / "ranks.parquet").to_pandas()
    assert sorted(ranks["rank"]) == [0, 1, 2, 3]


def test_missing_input_is_one_line_exit_2(tmp_path: Path, cache_dir: Path) -> None:
    missing = tmp_path / "nope.tar.gz"
    run = tracegraph("analyze", str(missing), cache=cache_dir)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nope.tar.gz" in lines[0]


def test_invalid_json_is_one_line_exit_2(tmp_path: Path, cache_dir: Path) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [ {"ph": "X", "name": 3, }} garbage')
    run = tracegraph("analyze", str(bad), cache=cache_dir)
    assert run.returncode == 2, run.stdout
    assert "Traceback" not in run.stderr
    assert "rank0.json" in run.stderr


def test_a_json_that_is_no_trace_says_so_in_one_line(tmp_path: Path, cache_dir: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"a": 1}')
    run = tracegraph("analyze", str(config), cache=cache_dir)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"error: {config}: JSON, but not a Kineto trace (no traceEvents)\n"


def test_a_step_the_bundle_lacks_is_bad_input(cache_dir: Path) -> None:
    run = tracegraph("analyze", str(SAMPLES / "gloo_pp2_dp2"), "--step", "99", cache=cache_dir)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith("no step 99; its steps: 2, 3")


def test_check_on_groups_of_no_known_dimension(real: Path, cache_dir: Path) -> None:
    """The real NCCL rank of HTA's negative_queue trace names groups whose dimension is not
    stated: its communication is typed `collective`, not guessed dp, so the DP overlap check
    says it has nothing to measure (the gate verified nothing: exit 1), not a crash."""
    run = tracegraph("check", str(real / "kineto/hta/negative_queue_length_values_check"),
                     "--preset", "hsdp-async-reduction", "--json", cache=cache_dir)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    overlap = next(c for c in report["checks"] if c["rule"] == "min_overlap")
    assert overlap["status"] == "not_applicable"
    assert overlap["summary"] == "no dp communication in this bundle's steps"
    assert report["nothing_verified"]


@pytest.mark.parametrize("command", ["report", "diff", "check", "export"])
def test_command_help_reads_as_paragraphs(command: str) -> None:
    """The docstrings' source line breaks are not kept: on a wide terminal each paragraph of a
    command's help is one line (it broke mid-sentence: "… and the" / "pipeline view")."""
    run = subprocess.run([sys.executable, "-m", "tracegraph", command, "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "300", "NO_COLOR": "1"})
    assert run.returncode == 0, run.stderr
    doc = next(c.callback.__doc__ for c in app.registered_commands if c.name == command)
    lines = [line.strip() for line in run.stdout.splitlines()]
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        assert " ".join(paragraph.split()) in lines, run.stdout
