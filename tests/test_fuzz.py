"""The fuzzer of tests/fuzz.py over the real profiles and the samples: a quick size in every run
(QUICK_FUZZ_CASES, split in chunks that xdist spreads), a long one with `--fuzz-cases N` or
TRACEGRAPH_FUZZ_CASES=N (bench/fuzz.py runs it across processes and reports counts and times).
A failure names its case number: `fuzz.case(n)` rebuilds it exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests import fuzz
from tests.conftest import QUICK_FUZZ_CASES, REAL, SAMPLES

CHUNKS = 8


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzz_cases_keep_every_property(chunk: int, fuzz_cases: int, tmp_path: Path) -> None:
    outcomes = fuzz.run_many(range(chunk, fuzz_cases, CHUNKS), tmp_path)
    failures = [f"{o.case}\n    -> {o.failure}" for o in outcomes if o.failure]
    assert not failures, f"{len(failures)} of {len(outcomes)} cases failed:\n" + "\n".join(
        failures)


def test_the_quick_size_covers_every_mutation_and_seed() -> None:
    cases = [fuzz.case(n) for n in range(QUICK_FUZZ_CASES)]
    applied = Counter(name for c in cases for name in c.mutant.mutations)
    assert set(applied) == {f.__name__ for f, _ in fuzz.MUTATIONS}, applied
    assert {c.mutant.seed.name for c in cases} == {s.name for s in fuzz.SEEDS}
    damaged = sum(c.mutant.damaged for c in cases)
    assert damaged > QUICK_FUZZ_CASES // 2, damaged  # most cases owe a warning or an error


def test_a_case_is_its_number() -> None:
    first, again = fuzz.case(1234), fuzz.case(1234)
    assert str(first) == str(again) and first.mutant.files == again.mutant.files
    assert first.mutant.files != fuzz.case(1235).mutant.files


def test_the_judge_fails_what_must_fail(tmp_path: Path) -> None:
    damaged = fuzz.case(next(n for n in range(100) if fuzz.case(n).mutant.damaged))
    bundle = tmp_path / "bundle"

    def verdict(ran: fuzz.Ran, unchanged: bool = True) -> str | None:
        return fuzz.judge(damaged, ran, bundle, unchanged)

    assert verdict(fuzz.Ran(2, "", f"error: {bundle}: bad\n")) is None
    assert verdict(fuzz.Ran(0, "", "warning: rank 0: x.json: damaged values: ...\n")) is None
    assert verdict(fuzz.Ran(0, "", "")) == "damaged input analysed without a warning"
    assert verdict(fuzz.Ran(1, "", "", KeyError("mode"))).startswith("KeyError: 'mode'")
    assert verdict(fuzz.Ran(3, "", "")) == "exit code 3"
    assert verdict(fuzz.Ran(0, "", "Traceback (most recent call last):\n")) == \
        "a traceback was printed"
    assert verdict(fuzz.Ran(2, "", "error: a.json: x\n  split\n")).startswith(
        "exit 2 without one error line")
    assert verdict(fuzz.Ran(2, "", "error: something went wrong\n")).startswith(
        "the error names no input")
    assert verdict(fuzz.Ran(0, "", "warning: x\n"), unchanged=False).startswith(
        "the input changed")


def test_fuzzing_leaves_the_real_traces_as_they_were(tmp_path: Path) -> None:
    before = fuzz.fingerprint(REAL), fuzz.fingerprint(SAMPLES)
    outcomes = fuzz.run_many(range(10_000, 10_012), tmp_path)
    assert [o.failure for o in outcomes] == [None] * len(outcomes)
    assert (fuzz.fingerprint(REAL), fuzz.fingerprint(SAMPLES)) == before
    assert not any(tmp_path.iterdir())  # each case cleans up after itself


@pytest.mark.parametrize("mutation", ["container", "folder", "bad_event_field", "odd_names",
                                      "long_names"])
def test_fuzz_cases_as_a_user_runs_them(mutation: str, tmp_path: Path) -> None:
    """The first case applying `mutation`, run as `python -m tracegraph` in a fresh process
    (real stdout / stderr encodings, real exit codes)."""
    number = next(n for n in range(5_000) if mutation in fuzz.case(n).mutant.mutations)
    outcome = fuzz.run(fuzz.case(number), tmp_path / "case", fuzz.in_subprocess)
    assert outcome.failure is None, f"{outcome.case}\n    -> {outcome.failure}"
