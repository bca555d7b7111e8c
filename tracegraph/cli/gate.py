"""`tracegraph diff` and `tracegraph check`: verify a fix and gate a pull request.

Exit codes: 0 pass, 1 a check failed, the step time regressed beyond the threshold, or every check
was not applicable (nothing verified; 0 with --allow-not-applicable), 2 bad input or usage (one line
on stderr). A check that is not applicable alone fails nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from parsers.base import TraceError
from parsers.text import printable
from reports.markdown import (
    SPREAD,
    STATE_TITLES,
    check_status,
    checks_line,
    diff_bubble_title,
    gate_line,
    ms,
    nothing_verified_line,
    pct,
    ratio,
    root_text,
    runs_text,
    spread_cells,
    verdict_line,
    violation_line,
)
from tracegraph.cli import options
from tracegraph.cli.common import (
    Source,
    console,
    friendly_errors,
    inputs_exist,
    print_json,
    warn,
)
from tracegraph.cli.options import (
    Bundle,
    CacheDir,
    Dask,
    Jobs,
    NoCache,
    RankMap,
    ThresholdMs,
    milliseconds,
)

if TYPE_CHECKING:
    from tracegraph.analysis.analyze import Analysis
    from tracegraph.verify.runs import Run

EXIT_FAILED = 1
CONFIDENCE = 0.95  # tracegraph.verify.diff.CONFIDENCE, not imported: it loads the analysis
DEFAULT_REGRESSION = "5%"
VIOLATIONS_SHOWN = 10
TEXT_COLUMNS = {"cause", "root", "chain", "measured", "after: measured", "result", "runs",
                "interval (ms)", "p"}

Profile = Bundle
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
Markdown = Annotated[Path | None, typer.Option(
    "--markdown", help="Write a Markdown summary (pull-request comment, CI job summary).")]
Junit = Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML for CI.")]
Rules = Annotated[Path | None, typer.Option("--rules", help="TOML file of checks (docs/ci.md).")]
Preset = Annotated[list[str] | None, typer.Option(
    "--preset", help="Built-in checks, e.g. hsdp-async-reduction (repeatable).")]
AllowNotApplicable = Annotated[bool, typer.Option(
    "--allow-not-applicable",
    help="Exit 0 (with the warning) when every check is not applicable to the profile.")]
AllowDifferentJobs = Annotated[bool, typer.Option(
    "--allow-different-jobs",
    help="Compare profiles that cannot be runs of one job (another profiler, world size, ranks "
         "or groups) with a warning, instead of exit 2.")]


def diff_command(
    before: Annotated[Path | None, typer.Argument(
        help="The profile before the change (or --before, repeated).", show_default=False)
    ] = None,
    after: Annotated[Path | None, typer.Argument(
        help="The profile after the change (or --after, repeated).", show_default=False)
    ] = None,
    before_runs: Annotated[list[Path] | None, typer.Option(
        "--before", help="A run before the change (repeatable; 3-5 runs per side tell a change "
                         "from run-to-run noise).")] = None,
    after_runs: Annotated[list[Path] | None, typer.Option(
        "--after", help="A run after the change (repeatable).")] = None,
    as_json: AsJson = False,
    markdown: Markdown = None,
    junit: Junit = None,
    html: Annotated[Path | None, typer.Option(
        "--html", help="Write the HTML diff: both waterfalls and bubbles by cause.")] = None,
    rules: Rules = None,
    preset: Preset = None,
    allow_not_applicable: AllowNotApplicable = False,
    allow_different_jobs: AllowDifferentJobs = False,
    fail_on_regression: Annotated[str, typer.Option(
        help='Exit 1 when the step time is worse by more than this ("5%"; "off" never); with '
             'several runs per side, when its whole confidence interval is.')
    ] = DEFAULT_REGRESSION,
    min_regression_ms: Annotated[float, typer.Option(
        help="... and by more than this many ms (both thresholds must be passed).",
        callback=milliseconds)] = 0.0,
    confidence: Annotated[float, typer.Option(
        help="Confidence level of the intervals and of the regression gate.",
        callback=confidence_level)] = CONFIDENCE,
    top: Annotated[int, typer.Option(help="Chains shown per change (0: all).")] = 5,
    min_chain_ms: Annotated[float | None, typer.Option(
        help="Chains under this many ms per step count as absent (default: 1% of the step).",
        callback=milliseconds)] = None,
    threshold_ms: ThresholdMs = 1.0,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    predicted: Annotated[Path | None, typer.Option(
        "--predicted", help="BEFORE's prediction (`tracegraph whatif BEFORE … --json`): report "
                            "it against AFTER as measured.")] = None,
) -> None:
    """Compare profiles before and after a fix; exit 1 on a regression or a failed check.

    Step time, bubble time by root cause, critical path, communication overlap, the chains that
    disappeared, shrank, grew or appeared, and the checks of --rules / --preset (docs/ci.md).

    With several runs per side (--before, --after, repeated) each change carries a confidence
    interval and a p-value; a change inside the run-to-run noise fails nothing.

    Profiles that cannot be runs of one job (another profiler, world size, no rank or group in
    common) are refused (exit 2) unless --allow-different-jobs.
    """

    sides = {"before": [*([before] if before else []), *(before_runs or [])],
             "after": [*([after] if after else []), *(after_runs or [])]}
    for side, paths in sides.items():
        if not paths:
            raise typer.BadParameter(f"no {side} profile: give BEFORE AFTER, or --before and "
                                     "--after (repeatable)", param_hint=f"--{side}")
    gate = Gate(_percent(fail_on_regression), min_regression_ms, confidence)
    source = Source(threshold_ms, cache_dir, no_cache, jobs, rank_map, dask)
    outputs = Outputs(as_json, markdown, junit)
    friendly_errors(_diff)(sides, (rules, preset or []), gate, source, outputs,
                           html=html, top=top, min_chain_ms=min_chain_ms,
                           allow_not_applicable=allow_not_applicable, predicted=predicted,
                           allow_different_jobs=allow_different_jobs)


def check_command(
    bundle: Profile,
    rules: Rules = None,
    preset: Preset = None,
    allow_not_applicable: AllowNotApplicable = False,
    as_json: AsJson = False,
    markdown: Markdown = None,
    junit: Junit = None,
    threshold_ms: ThresholdMs = 1.0,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
) -> None:
    """Evaluate checks (--rules FILE, --preset NAME) on one profile; exit 1 if any fails.

    A check the profile gives nothing to test is not applicable, and fails nothing; when every
    check is, exit 1 all the same (nothing was verified) unless --allow-not-applicable.
    """

    if rules is None and not preset:
        raise typer.BadParameter("give --rules FILE or --preset NAME", param_hint="--rules")
    friendly_errors(_check)(bundle, (rules, preset or []),
                            Source(threshold_ms, cache_dir, no_cache, jobs, rank_map, dask),
                            Outputs(as_json, markdown, junit), allow_not_applicable)


# --- the work ----------------------------------------------------------------------------------
class Outputs(NamedTuple):
    """Where the result goes besides the terminal."""

    as_json: bool
    markdown: Path | None
    junit: Path | None

    def emit(self, report: dict[str, object], markdown: Callable[[], str],
             junit: Callable[[], str], terminal: Callable[[Console, dict], None]) -> None:
        for path, render in ((self.markdown, markdown), (self.junit, junit)):
            if path is not None:
                Path(path).write_text(render(), encoding="utf-8")
        if self.as_json:
            print_json(report)
        else:
            terminal(console(), report)


RuleSpec = tuple[Path | None, list[str]]  # --rules FILE, --preset NAMEs


def _rules(spec: RuleSpec) -> list:
    from tracegraph.verify.checks import load_rules

    return load_rules(*spec) if spec[0] or spec[1] else []


def _tally(checks: list[dict[str, object]], allow: bool) -> dict[str, object]:
    """The report keys that sum up its checks (`checks`: each check's result dict)."""
    from tracegraph.verify.checks import NOT_APPLICABLE, status_counts

    counts = status_counts(c["status"] for c in checks)
    return {"check_counts": counts, "allow_not_applicable": allow,
            "nothing_verified": bool(checks) and counts[NOT_APPLICABLE] == len(checks)}


def _checks_pass(report: dict[str, object]) -> bool:
    """No check failed, and some check applied unless --allow-not-applicable."""
    return not report["check_counts"]["fail"] and (report["allow_not_applicable"]
                                                   or not report["nothing_verified"])


def _warn_nothing_verified(report: dict[str, object]) -> None:
    if line := nothing_verified_line(report):
        warn(line)


class Gate(NamedTuple):
    """When a step-time regression fails the diff: beyond both thresholds, with `confidence`."""

    fail_pct: float | None  # None: never
    min_ms: float
    confidence: float


class Profiled:
    """One run of a diff: its bundle loaded, its numbers (cached beside the analysis) when first
    asked for, and its analysis, read only when something needs it (checks, the HTML, a
    prediction) and let go after the numbers and the checks: one run's analysis in memory at a
    time."""

    def __init__(self, path: Path, source: Source, client: object):
        from tracegraph.cli.common import load_bundle

        self.source = source
        self.trace = load_bundle(path, source.cache_dir, source.no_cache, source.jobs,
                                 source.rank_map, client)
        self._analysis: Analysis | None = None

    @cached_property
    def run(self) -> Run:
        from tracegraph.cli.common import remember
        from tracegraph.verify.runs import run_of

        source = self.source
        run = remember(self.trace, source.cache_dir, source.no_cache, "diff-run",
                       {"threshold_ms": source.threshold_ms}, lambda: run_of(self.analysis))
        self._analysis = None
        return replace(run, source=printable(str(self.trace.source)))

    def checked(self, rules: list) -> list:
        """The checks of `rules` on this run (its analysis let go after)."""
        from tracegraph.verify.checks import evaluate

        results = evaluate(rules, self.analysis)
        self._analysis = None
        return results

    @property
    def analysis(self) -> Analysis:
        if self._analysis is None:
            from tracegraph.cli.common import analysis_of

            self._analysis = analysis_of(self.trace, self.source.cache_dir,
                                         self.source.no_cache, self.source.threshold_ms)
        return self._analysis


def _diff(sides: dict[str, list[Path]], spec: RuleSpec, gate: Gate, source: Source,
          outputs: Outputs, *, html: Path | None, top: int, min_chain_ms: float | None,
          allow_not_applicable: bool, predicted: Path | None = None,
          allow_different_jobs: bool = False) -> None:
    inputs_exist(*sides["before"], *sides["after"])
    from reports.junit import diff_junit
    from reports.markdown import diff_markdown
    from tracegraph.verify.diff import representative

    rules = _rules(spec)
    with source.cluster() as client:
        runs = {side: [Profiled(path, source, client) for path in paths]
                for side, paths in sides.items()}
        different = _different_jobs([*runs["before"], *runs["after"]], allow_different_jobs)
        report = _compared(runs, rules, gate, top, min_chain_ms, allow_not_applicable,
                           predicted)
        report["warnings"] = [*different, *report["warnings"]]
        if html:
            from reports.diff_html import write_diff_html

            shown = {side: representative(report, side) for side in runs}
            write_diff_html(runs["before"][shown["before"]].analysis,
                            runs["after"][shown["after"]].analysis, report, html)
        if outputs.markdown:  # what holds the after profile back, atop the summary
            after = runs["after"][representative(report, "after")].analysis
            report["after"]["verdict"] = source.verdict(after)
    for line in report["warnings"]:
        warn(line)
    outputs.emit(report, lambda: diff_markdown(report), lambda: diff_junit(report),
                 print_diff)
    _warn_nothing_verified(report)
    if not report["passed"]:
        raise typer.Exit(EXIT_FAILED)


def _different_jobs(runs: list[Profiled], allow: bool) -> list[str]:
    """A line for each run that cannot be of the job of the first (`verify.samejob`): the
    warnings with --allow-different-jobs, else a TraceError (exit 2) on the first."""
    from tracegraph.verify.samejob import differences

    first, *others = runs
    lines = []
    for other in others:
        if found := differences(first.trace, other.trace):
            line = (f"{first.trace.source} and {other.trace.source} cannot be runs of the same "
                    f"job: {'; '.join(found)}")
            if not allow:
                raise TraceError(f"{line} (--allow-different-jobs compares them anyway)")
            lines.append(f"{line}; compared anyway (--allow-different-jobs)")
    return lines


def _compared(runs: dict[str, list[Profiled]], rules: list, gate: Gate, top: int,
              min_chain_ms: float | None, allow_not_applicable: bool, predicted: Path | None
              ) -> dict[str, object]:
    """The diff report of two sides of runs, with their checks, BEFORE's prediction
    (`predicted`) against AFTER, and the verdict."""
    from tracegraph.verify.diff import UNCHANGED_PCT, compare, regressed_beyond, representative

    band = UNCHANGED_PCT if gate.fail_pct is None else min(UNCHANGED_PCT, gate.fail_pct)
    report = compare([r.run for r in runs["before"]], [r.run for r in runs["after"]], top=top,
                     min_chain_ms=min_chain_ms, confidence=gate.confidence, unchanged_pct=band)
    report["checks"] = _checks(rules, runs)
    report |= _tally([c["after"] for c in report["checks"]], allow_not_applicable)
    report["fail_on_regression_pct"] = gate.fail_pct
    report["min_regression_ms"] = gate.min_ms
    if predicted is not None:
        measured = runs["after"][representative(report, "after")].analysis
        report["predicted"] = _checked_prediction(predicted, measured)
    regressed = gate.fail_pct is not None and regressed_beyond(report, gate.fail_pct,
                                                                 gate.min_ms)
    report["regressed_beyond_threshold"] = regressed
    report["passed"] = not regressed and _checks_pass(report)
    return report


def _checks(rules: list, runs: dict[str, list[Profiled]]) -> list[dict[str, object]]:
    """Each check on both sides, each side's runs taken together (`checks.across_runs`)."""
    if not rules:
        return []
    from tracegraph.verify.checks import across_runs

    results = {side: [r.checked(rules) for r in found] for side, found in runs.items()}
    merged = {side: [across_runs(list(per_rule)) for per_rule in zip(*found, strict=True)]
              for side, found in results.items()}
    return [{"name": b.name, "rule": b.rule, "before": b.as_dict(), "after": a.as_dict()}
            for b, a in zip(merged["before"], merged["after"], strict=True)]


def _check(bundle: Path, spec: RuleSpec, source: Source, outputs: Outputs,
           allow_not_applicable: bool) -> None:
    inputs_exist(bundle)
    from reports.junit import check_junit
    from reports.markdown import check_markdown
    from tracegraph.verify import metrics
    from tracegraph.verify.checks import evaluate

    rules = _rules(spec)
    with source.cluster() as client:
        analysis = source.analysis(bundle, client)
        results = [r.as_dict() for r in evaluate(rules, analysis)]
        report = {"source": printable(str(bundle)),
                  "step_ms": round(metrics.step_time_ms(analysis), 3),
                  "checks": results, **_tally(results, allow_not_applicable)}
        if outputs.markdown:  # what holds the profile back, atop the summary
            report["verdict"] = source.verdict(analysis)
    report["passed"] = _checks_pass(report)
    outputs.emit(report, lambda: check_markdown(report), lambda: check_junit(report),
                 print_checks)
    _warn_nothing_verified(report)
    if not report["passed"]:
        raise typer.Exit(EXIT_FAILED)


def _checked_prediction(path: Path, after) -> dict[str, object]:
    """A saved `whatif --json` prediction against the measured after-analysis."""
    from tracegraph.whatif.summary import check_prediction

    try:
        saved = json.loads(Path(path).read_text())
    except ValueError as error:
        raise TraceError(f"{path}: not a `tracegraph whatif --json` prediction ({error})"
                         ) from None
    if not isinstance(saved, dict) or "step_time" not in saved:
        raise TraceError(f"{path}: not a `tracegraph whatif --json` prediction (no step_time)")
    return check_prediction(saved, after)


def confidence_level(value: float) -> float:
    """--confidence: a level from 0.5 to 0.999."""
    if not (math.isfinite(value) and 0.5 <= value <= 0.999):
        raise typer.BadParameter(f"{value} is not a confidence level from 0.5 to 0.999")
    return value


def _percent(text: str) -> float | None:
    """"5%" or "5" → 5.0; "off" → None."""
    if text.strip().lower() in ("off", "none", "never"):
        return None
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{text!r} is not a percentage such as 5%",
                                 param_hint="--fail-on-regression")
    return value


# --- terminal ----------------------------------------------------------------------------------
def print_diff(console: Console, report: dict[str, object]) -> None:
    """The diff as rich tables."""
    color = {"improved": "green", "regressed": "red"}.get(report["verdict"], "yellow")
    console.print(f"[bold {color}]{escape(verdict_line(report))}[/]", highlight=False)
    console.print(f"{report['noise']['note']}; {gate_line(report)}", highlight=False,
                  markup=False)
    for side in ("before", "after"):
        for i, run in enumerate(report[side]["runs"], 1):
            steps = ", ".join(f"#{s} {v:.3f}" for s, v in run["steps"].items() if v is not None)
            label = side if len(report[side]["runs"]) == 1 else f"{side} {i}"
            console.print(f"{label:<8} {run['source']}: steps {steps} ms", highlight=False,
                          markup=False)
    _table(console, "step time per rank (ms, median over steps)", ("rank", "before", "after",
                                                                  "change"),
           [(r["rank"], ms(r["before_ms"]), ms(r["after_ms"]), pct(r["change_pct"]))
            for r in report["ranks"]])
    estimated = report["noise"]["estimated"]
    _table(console, diff_bubble_title(report),
           ("category", "before", "after", "change", *SPREAD[:2 * estimated]),
           [(r["category"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"]),
             *spread_cells(r, estimated)) for r in report["bubbles"]])
    _table(console, "critical path by cause (ms per step)", ("kind", "before", "after", "change"),
           [(r["kind"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"]))
            for r in report["critical_path"]])
    _table(console, "communication overlapped by main-lane compute",
           ("group kind", "before", "after", "comm ms/step before", "after"),
           [(r["dim"], ratio(r["before"]), ratio(r["after"]), ms(r["before_comm_ms"]),
             ms(r["after_comm_ms"])) for r in report["overlap"]])
    repeated = max(len(report[side]["runs"]) for side in ("before", "after")) > 1
    for state, chains in report["chains"].items():  # the interval: in the JSON and Markdown
        _table(console, f"{STATE_TITLES[state].lower()} (ms per step)",
               ("waiting rank", "cause", "root", "before", "after", *["runs"][:repeated],
                *SPREAD[1:2 * estimated], "chain"),
               [(str(c["rank"]), c["category"], root_text(c), ms(c["before_ms"]),
                 ms(c["after_ms"]), *[runs_text(c, report)][:repeated],
                 *spread_cells(c, estimated)[1:], " ← ".join(map(str, c["chain"])))
                for c in chains])
    if report.get("predicted"):
        from reports.whatif import print_checked

        print_checked(console, report["predicted"])
    if report["checks"]:
        _table(console, f"checks (after: {checks_line(report['check_counts'])})",
               ("check", "before", "after", "after: measured"),
               [(c["name"], check_status(c["before"]), check_status(c["after"]),
                 c["after"]["summary"]) for c in report["checks"]])
        _print_failures(console, [c["after"] for c in report["checks"]])


def print_checks(console: Console, report: dict[str, object]) -> None:
    """`tracegraph check` as a rich table plus the places each failing check names."""
    _table(console, f"checks on {report['source']} (step time {ms(report['step_ms'])} ms)",
           ("check", "result", "measured"),
           [(c["name"], check_status(c), c["summary"]) for c in report["checks"]])
    console.print(checks_line(report["check_counts"]), highlight=False)
    _print_failures(console, report["checks"])


def _print_failures(console: Console, checks: list[dict[str, object]]) -> None:
    for check in checks:
        if check["status"] != "fail":
            continue
        places = check["violations"]
        console.print(f"[red]FAIL[/red] {escape(check['name'])}: {len(places)} places",
                      highlight=False)
        for violation in places[:VIOLATIONS_SHOWN]:
            console.print(f"  {violation_line(violation)}", highlight=False, soft_wrap=True,
                          markup=False)
        if len(places) > VIOLATIONS_SHOWN:
            console.print(f"  … {len(places) - VIOLATIONS_SHOWN} more (--json lists all)")


def _table(console: Console, title: str, headers: tuple[str, ...],
           rows: list[tuple[object, ...]]) -> None:
    if not rows:
        return
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        numeric = i > 0 and header not in TEXT_COLUMNS
        table.add_column(header, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(escape(str(v)) for v in row))
    console.print(table)

