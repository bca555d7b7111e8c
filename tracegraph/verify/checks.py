"""Checks a profile must pass: rules from a TOML file or a built-in preset, evaluated on an
`Analysis`. A failing check names the offending ranks, pipeline stages, ops and times.

A rules file:

    presets = ["hsdp-async-reduction"]      # optional: include a preset's rules

    [[rule]]
    type = "max_step_time"                  # one of RULES
    ms = 250
    name = "step under 250 ms"              # optional: the check's name in reports and JUnit

Rule types (times in ms on the aligned clock, per step unless said otherwise):
- max_step_time(ms): the slowest rank's step time, every step.
- max_bubble(category, ms): bubble time charged to a root-cause category (tracegraph.causes),
  per rank and step.
- max_group_wait(dim, ms): the longest single main-lane wait released directly by communication
  of a group kind (dp, pp, ep).
- no_reduction_wait_before_p2p(max_ms, within_ms): no main-lane wait longer than max_ms released
  directly by a DP reduction (or by a record right after one) with the rank's next P2P posted
  within within_ms of its end: the reduction gated the P2P.
- p2p_before_reduction_end(min_ms, within_ms): a stage reduction (a run of back-to-back DP
  reductions on one lane, at least min_ms long) is not followed by the rank's first P2P posted
  after it began (not merely queued behind an earlier transfer) only within within_ms after it
  completed: that P2P must be posted before the reduction completes.
- min_overlap(dim, ratio): on every rank, at least this share of the group kind's communication
  time overlaps main-lane compute.
- max_exposed_comm(dim, ms): on every rank, the group kind's communication not hidden behind
  main-lane compute stays under ms per step (the exposed-communication finding).
- min_reduction_overlap(ratio): every stage reduction (back-to-back DP reductions on one lane)
  overlaps main-lane compute for at least this share of its time.
- no_serialized_streams(): no rank's compute and collective streams are serialized (the
  serialized-streams finding: one hardware queue).
- max_stage_memory_imbalance(ratio): the highest stage's peak memory is at most (1 + ratio) times
  the lowest's (the stage-memory finding).

A rule whose subject the bundle lacks is *not applicable* (neither passed nor failed) and says why
in one line: a dimension's rule without communication of that dimension, a wait or overlap rule
without a compute timeline (communication summaries only), a P2P rule without P2P or DP
reductions, a rule with nothing to measure ("0 of 0").
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from parsers.base import TraceError
from tracegraph import causes, schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.analysis.overlap import stage_reductions
from tracegraph.verify import metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

NS_PER_MS = 1e6
PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not_applicable"
STATUSES = (PASS, FAIL, NOT_APPLICABLE)


@dataclass
class Violation:
    """One offending place: a rank, its pipeline stage when known, the step, and what happened."""

    rank: int
    step: int
    text: str
    stage: int = -1
    start_ms: float | None = None  # since the analysis origin
    end_ms: float | None = None


@dataclass
class CheckResult:
    """The outcome of one rule on one analysis: passed, failed, or not applicable (`reason`)."""

    name: str
    rule: str
    passed: bool  # False only when the check failed (True when not applicable)
    summary: str  # one line with the measured numbers (the reason when not applicable)
    violations: list[Violation] = field(default_factory=list)
    value: float | None = None  # the measured number the rule bounds
    reason: str = ""  # why the bundle gives the rule nothing to test; "" when it applies

    @property
    def status(self) -> str:
        """pass, fail or not_applicable."""
        return NOT_APPLICABLE if self.reason else (PASS if self.passed else FAIL)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "rule": self.rule, "passed": self.passed,
                "status": self.status, "reason": self.reason or None,
                "summary": self.summary, "value": _round(self.value),
                "violations": [{"rank": v.rank, "stage": v.stage, "step": v.step,
                                "start_ms": _round(v.start_ms), "end_ms": _round(v.end_ms),
                                "text": v.text} for v in self.violations]}


def across_runs(results: list[CheckResult]) -> CheckResult:
    """One rule's results on several runs of a profile as one: failed when it failed in any run
    (each place labelled with its run, from 1), not applicable when it was in every run, else
    passed; the summary counts the runs and quotes the first failing (else applying) one."""
    if len(results) == 1:
        return results[0]
    labelled = list(enumerate(results, 1))
    failed = [(i, r) for i, r in labelled if r.status == FAIL]
    applied = [(i, r) for i, r in labelled if r.status != NOT_APPLICABLE]
    if not applied:
        return results[0]
    index, shown = (failed or applied)[0]
    skipped = len(results) - len(applied)
    count = (f"fails in {len(failed)} of {len(results)} runs" if failed
             else f"passes in {len(applied)} of {len(results)} runs")
    count += f", not applicable in {skipped}" if skipped else ""
    return CheckResult(shown.name, shown.rule, not failed, f"{count}; run {index}: {shown.summary}",
                       [replace(v, text=f"run {i}: {v.text}") for i, r in failed
                        for v in r.violations], shown.value)


def status_counts(statuses: Iterable[str]) -> dict[str, int]:
    """How many checks passed, failed and were not applicable (every status, 0 if none)."""
    found = Counter(statuses)
    return {status: found[status] for status in STATUSES}


@dataclass
class Rule:
    """A rule type with its parameters."""

    type: str
    params: dict[str, object]
    name: str = ""

    @property
    def title(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return self.name or f"{self.type}({args})"


PRESETS: dict[str, list[Rule]] = {
    "hsdp-async-reduction": [
        Rule("no_reduction_wait_before_p2p", {"max_ms": 1.0, "within_ms": 1.0},
             "main lane never waits on a DP reduction before its P2P"),
        Rule("p2p_before_reduction_end", {"min_ms": 1.0, "within_ms": 1.0},
             "P2P posted before the stage reduction completes"),
        Rule("min_overlap", {"dim": "dp", "ratio": 0.25},
             "DP reduction overlaps main-lane compute"),
    ],
}
"""Built-in rule sets. hsdp-async-reduction encodes the acceptance list of asynchronous HSDP stage
reduction under PP/VPP: the reduction no longer blocks BWD_SEND, the P2P is posted before the
reduction completes, and the reduction overlaps later chunk compute."""


# --- loading rules -----------------------------------------------------------------------------
def load_rules(path: Path | None = None, presets: list[str] | tuple[str, ...] = ()) -> list[Rule]:
    """The rules of a TOML file plus those of the named presets; TraceError when invalid."""
    rules = [rule for name in presets for rule in preset(name)]
    if path is None:
        return rules
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as error:
        raise TraceError(f"{path}: not valid TOML ({error})") from None
    for name in _strings(data.get("presets", []), path, "presets"):
        rules += preset(name)
    entries = data.get("rule", [])
    if not isinstance(entries, list):
        raise TraceError(f"{path}: [[rule]] must be an array of tables")
    rules += [_rule(entry, path) for entry in entries]
    if not rules:
        raise TraceError(f"{path}: no rules (add [[rule]] tables or presets = [...])")
    return rules


def preset(name: str) -> list[Rule]:
    """A built-in preset's rules."""
    if name not in PRESETS:
        raise TraceError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return list(PRESETS[name])


def _strings(value: object, path: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TraceError(f"{path}: {key} must be a list of strings")
    return value


def _rule(entry: object, path: Path) -> Rule:
    if not isinstance(entry, dict) or "type" not in entry:
        raise TraceError(f"{path}: every [[rule]] needs a type (one of {', '.join(RULES)})")
    params = {k: v for k, v in entry.items() if k not in ("type", "name")}
    rule = Rule(str(entry["type"]), params, str(entry.get("name", "")))
    _validate(rule, path)
    return rule


def _validate(rule: Rule, path: Path) -> None:
    if rule.type not in RULES:
        raise TraceError(f"{path}: unknown rule type {rule.type!r}; known: {', '.join(RULES)}")
    _, needed, optional = RULES[rule.type]
    missing = [k for k in needed if k not in rule.params]
    unknown = [k for k in rule.params if k not in needed and k not in optional]
    if missing or unknown:
        raise TraceError(f"{path}: rule {rule.type}: "
                         + "; ".join([f"missing {', '.join(missing)}"] * bool(missing)
                                     + [f"unknown {', '.join(unknown)}"] * bool(unknown)))
    for key, value in rule.params.items():
        if key in ("dim", "category"):
            allowed = _DIMS if key == "dim" else causes.CATEGORIES
            if value not in allowed:
                raise TraceError(f"{path}: rule {rule.type}: {key} must be one of "
                                 f"{', '.join(allowed)}, not {value!r}")
        elif not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise TraceError(f"{path}: rule {rule.type}: {key} must be a number >= 0")


# --- evaluating --------------------------------------------------------------------------------
def evaluate(rules: list[Rule], analysis: Analysis) -> list[CheckResult]:
    """Every rule on `analysis`."""
    facts = Facts(analysis)
    results = []
    for rule in rules:
        check, _, optional = RULES[rule.type]
        result = check(facts, **(optional | rule.params))
        result.name, result.rule = rule.title, rule.type
        results.append(result)
    return results


class Facts:
    """What the rules look at, computed once per analysis."""

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis
        self.origin = analysis.origin

    @cached_property
    def times(self) -> tuple[np.ndarray, np.ndarray]:
        return self.analysis.start, self.analysis.end

    @cached_property
    def steps(self) -> pd.DataFrame:
        return metrics.step_table(self.analysis)

    @cached_property
    def stages(self) -> dict[int, int]:
        return pipeline_stages(self.analysis)

    @cached_property
    def p2p_posts(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Rank -> (sorted aligned starts, op index) of the P2P ops it posted: not those that
        merely waited in line behind an earlier transfer on their stream (host calls on CPU
        ranks)."""
        frame, start = self.analysis.ops.frame, self.times[0]
        p2p = np.flatnonzero((frame["comm"].isin(schema.P2P_COMMS)
                              & frame["kind"].isin([schema.P2P, schema.HOST])).to_numpy())
        posted = p2p[~_queued(self.analysis, p2p, start, self.times[1])]
        return _by_rank(frame["rank"].to_numpy(), posted, start)

    @cached_property
    def reductions(self) -> frozenset[str]:
        return metrics.reduction_names(self.analysis)

    @cached_property
    def categories(self) -> np.ndarray:
        """Per op, the root-cause category its communication is charged to ("" if none)."""
        return metrics.comm_categories(self.analysis)

    # --- what the bundle lacks: a one-line reason, "" when it has it
    def lacks_timeline(self) -> str:
        return "" if self.analysis.ops.main_lanes() else "no compute timeline in this bundle"

    def lacks_dim(self, dim: str) -> str:
        present = set(self.categories)
        if causes.for_dim(dim) in present:
            return ""
        also = f" or {_COMM_TYPES[dim]}" if dim in _COMM_TYPES else ""
        unknown = (" (its collectives' groups have no known dimension)"
                   if causes.COLLECTIVE in present and not also else "")
        return f"no {dim} group{also} in this bundle{unknown}"

    def lacks_p2p(self) -> str:
        return "" if self.p2p_posts else "no P2P in this bundle"

    def lacks_reduction(self) -> str:
        """No all-reduce / reduce-scatter / reduce charged as a DP reduction."""
        comm = self.analysis.ops.frame["comm"].isin(metrics.REDUCTIONS).to_numpy()
        if (comm & (self.categories == causes.DP_REDUCTION)).any():
            return ""
        return "no DP reduction in this bundle"

    @cached_property
    def stage_reductions(self) -> list[tuple[int, int, int, np.ndarray]]:
        """(rank, start, end, ops) of every stage reduction (overlap.stage_reductions)."""
        return stage_reductions(self.analysis)

    def ms(self, ns: float) -> float:
        """Aligned ns as ms since the analysis origin."""
        return (ns - self.origin) / NS_PER_MS

    def step_of(self, rank: int, when: int) -> int:
        mine = self.steps[(self.steps["rank"] == rank) & (self.steps["start"] <= when)
                          & (self.steps["end"] >= when)]
        return int(mine["step"].iloc[0]) if len(mine) else -1

    def first_p2p_after(self, rank: int, when: int) -> int:
        """Index of the rank's first P2P posted at or after `when` (-1 if none)."""
        starts, idx = self.p2p_posts.get(rank, (np.zeros(0), np.zeros(0, dtype=np.int64)))
        pos = np.searchsorted(starts, when, "left")
        return int(idx[pos]) if pos < len(idx) else -1

    def violation(self, rank: int, step: int, text: str, start: int | None = None,
                  end: int | None = None) -> Violation:
        return Violation(rank, step, text, self.stages.get(rank, -1),
                         None if start is None else self.ms(start),
                         None if end is None else self.ms(end))

    def op_text(self, i: int) -> str:
        frame, (start, end) = self.analysis.ops.frame, self.times
        return (f"{frame.at[i, 'lane']} {frame.at[i, 'name']} "
                f"{self.ms(start[i]):.3f}–{self.ms(end[i]):.3f} ms")


def _by_rank(ranks: np.ndarray, idx: np.ndarray, start: np.ndarray
             ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Rank -> (sorted starts, op index) of the ops `idx`."""
    order = idx[np.lexsort((start[idx], ranks[idx]))]
    runs = np.split(order, np.flatnonzero(np.diff(ranks[order])) + 1) if len(order) else []
    return {int(ranks[run[0]]): (start[run], run) for run in runs}


def _queued(analysis: Analysis, idx: np.ndarray, start: np.ndarray, end: np.ndarray
            ) -> np.ndarray:
    """Which of the ops `idx` started the moment an earlier transfer on their lane ended (records
    in between passed over): they were queued, not posted then."""
    kind, prev = analysis.ops.frame["kind"].to_numpy(), analysis.ops.lane_prev()
    before = prev[idx]
    for _ in range(4):
        record = before >= 0
        record[record] = kind[before[record]] == schema.RECORD
        before = np.where(record, prev[np.maximum(before, 0)], before)
    known = before >= 0
    queued = np.zeros(len(idx), dtype=bool)
    queued[known] = (np.isin(kind[before[known]], [schema.P2P, schema.COLLECTIVE])
                     & (start[idx[known]] - end[before[known]] <= metrics.SETTLE_NS))
    return queued


def pipeline_stages(analysis: Analysis) -> dict[int, int]:
    """Rank -> pipeline stage: its position, in rank order, among the ranks its PP groups connect
    (the usual layout numbers stages in rank order); empty when the profile has no PP group."""
    groups = analysis.trace.groups
    parent: dict[int, int] = {}

    def find(r: int) -> int:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    for ranks in groups.loc[groups["dim"] == "pp", "ranks"] if len(groups) else []:
        members = [int(r) for r in ranks]
        for r in members[1:]:
            parent[find(r)] = find(members[0])
    pipelines: dict[int, list[int]] = {}
    for r in parent:
        pipelines.setdefault(find(r), []).append(r)
    return {r: i for members in pipelines.values() for i, r in enumerate(sorted(members))}


# --- the rules ---------------------------------------------------------------------------------
def max_step_time(facts: Facts, ms: float) -> CheckResult:
    steps = facts.steps
    if not len(steps):
        return _not_applicable("no steps in this bundle")
    worst = steps.loc[steps.groupby("step")["ms"].idxmax()]
    found = [facts.violation(int(r.rank), int(r.step), f"step time {r.ms:.3f} ms > {ms} ms",
                             int(r.start), int(r.end))
             for r in worst[worst["ms"] > ms].itertuples()]
    top = worst.loc[worst["ms"].idxmax()]
    return _result(found, f"slowest step {int(top['step'])}: {top['ms']:.3f} ms on rank "
                          f"{int(top['rank'])} (limit {ms} ms)", float(top["ms"]))


def max_bubble(facts: Facts, category: str, ms: float) -> CheckResult:
    dim = causes.get(category).dim
    if reason := facts.lacks_timeline() or (facts.lacks_dim(dim) if dim else ""):
        return _not_applicable(reason)
    mine = [b for b in facts.analysis.bubbles if category in b.by_category()]
    charged: dict[tuple[int, int], list[Bubble]] = {}
    for bubble in mine:
        charged.setdefault((bubble.rank, bubble.step), []).append(bubble)
    totals = {key: sum(b.by_category()[category] for b in bs) / NS_PER_MS
              for key, bs in charged.items()}
    found = []
    for (rank, step), total in sorted(totals.items(), key=lambda kv: -kv[1]):
        if total > ms:
            top = max(charged[(rank, step)], key=lambda b: b.by_category()[category])
            found.append(facts.violation(rank, step, f"{total:.3f} ms of {category} > {ms} ms; "
                                         f"longest: {_bubble_text(facts, top)}",
                                         top.start, top.end))
    worst = max(totals.values(), default=0.0)
    return _result(found, f"most {category} on one rank in one step: {worst:.3f} ms (limit "
                          f"{ms} ms)", worst)


def max_group_wait(facts: Facts, dim: str, ms: float) -> CheckResult:
    if reason := facts.lacks_timeline() or facts.lacks_dim(dim):
        return _not_applicable(reason)
    category = causes.for_dim(dim)
    waits = [b for b in facts.analysis.bubbles
             if (piece := metrics.releaser(b)) is not None and piece.category == category]
    found = [facts.violation(b.rank, b.step, _bubble_text(facts, b), b.start, b.end)
             for b in waits if b.dur / NS_PER_MS > ms]
    worst = max((b.dur / NS_PER_MS for b in waits), default=0.0)
    return _result(found, f"longest main-lane wait released by {dim} communication: "
                          f"{worst:.3f} ms (limit {ms} ms)", worst)


def no_reduction_wait_before_p2p(facts: Facts, max_ms: float, within_ms: float) -> CheckResult:
    if reason := facts.lacks_timeline() or facts.lacks_p2p() or facts.lacks_reduction():
        return _not_applicable(reason)
    found, longest = [], 0.0
    for bubble in facts.analysis.bubbles:
        piece = metrics.releaser(bubble)
        if (piece is None or not metrics.is_reduction(piece, facts.reductions)
                or bubble.dur / NS_PER_MS <= max_ms):
            continue
        p2p = facts.first_p2p_after(bubble.rank, bubble.end - metrics.SETTLE_NS)
        gap = (facts.times[0][p2p] - bubble.end) / NS_PER_MS if p2p >= 0 else np.inf
        if gap <= within_ms:
            longest = max(longest, bubble.dur / NS_PER_MS)
            found.append(facts.violation(
                bubble.rank, bubble.step, f"{_bubble_text(facts, bubble)}; then "
                f"{facts.op_text(p2p)} posted {gap:.3f} ms after the wait",
                bubble.start, bubble.end))
    return _result(found, f"{len(found)} main-lane waits on a DP reduction gate a P2P "
                          f"(longest {longest:.3f} ms; limit {max_ms} ms)", longest)


def p2p_before_reduction_end(facts: Facts, min_ms: float, within_ms: float) -> CheckResult:
    if reason := facts.lacks_p2p() or facts.lacks_reduction():
        return _not_applicable(reason)
    start = facts.times[0]
    found, checked = [], 0
    for rank, lo, hi, run in facts.stage_reductions:
        p2p = facts.first_p2p_after(rank, lo)
        if (hi - lo) / NS_PER_MS < min_ms or p2p < 0 or start[p2p] > hi + within_ms * NS_PER_MS:
            continue  # short, or no P2P posted while it ran or right after
        checked += 1
        if start[p2p] >= hi:
            last = run[int(np.argmax(facts.times[1][run]))]
            found.append(facts.violation(
                rank, facts.step_of(rank, start[p2p]),
                f"{facts.op_text(p2p)} posted {(start[p2p] - hi) / NS_PER_MS:.3f} ms after its "
                f"stage reduction completed ({len(run)} ops ending with {facts.op_text(last)}; "
                f"{(hi - lo) / NS_PER_MS:.3f} ms in all)", lo, hi))
    if not checked:
        return _not_applicable(f"no P2P posted during or within {within_ms} ms after a stage "
                               f"reduction of at least {min_ms} ms")
    return _result(found, f"{checked - len(found)} of {checked} P2P ops posted during or right "
                          f"after a stage reduction were posted before it completed",
                   float(len(found)))


def min_overlap(facts: Facts, dim: str, ratio: float) -> CheckResult:
    if reason := facts.lacks_timeline():
        return _not_applicable(reason)
    table = metrics.overlap_table(facts.analysis)
    sums = table[table["dim"] == dim].groupby("rank").agg(
        comm_ms=("comm_ms", "sum"), overlap_ms=("overlap_ms", "sum"), steps=("step", "nunique"))
    sums = sums[sums["comm_ms"] > 0]
    if not len(sums):
        return _not_applicable(f"no {dim} communication in this bundle's steps")
    shares = sums["overlap_ms"] / sums["comm_ms"]
    found = [facts.violation(int(rank), -1, f"{share:.1%} of {sums.at[rank, 'comm_ms']:.3f} ms "
                             f"of {dim} communication {_over_steps(sums.at[rank, 'steps'])} "
                             f"overlaps main-lane compute (< {ratio:.0%})")
             for rank, share in shares.items() if share < ratio]
    overall = float(sums["overlap_ms"].sum() / sums["comm_ms"].sum())
    return _result(found, f"{dim} communication overlapped by compute: {overall:.1%} overall, "
                          f"lowest rank {shares.min():.1%} (at least {ratio:.0%})", overall)


def _over_steps(count: int) -> str:
    """"over 2 steps": what a sum over a rank's steps spans."""
    return f"over {count} step{'s' if count != 1 else ''}"


def max_exposed_comm(facts: Facts, dim: str, ms: float) -> CheckResult:
    from tracegraph.analysis.findings import stage_of
    from tracegraph.analysis.findings.exposed import exposed_table

    if reason := facts.lacks_timeline():
        return _not_applicable(reason)
    table = exposed_table(facts.analysis, stage_of(facts.analysis))
    table = table[table["dim"] == dim]
    if not len(table):
        return _not_applicable(f"no {dim} communication in this bundle's steps")
    found = [facts.violation(int(r.rank), -1, f"{r.exposed_ms:.3f} of {r.comm_ms:.3f} ms of "
                             f"{dim} communication per step exposed (> {ms} ms)")
             for r in table.itertuples() if r.exposed_ms > ms]
    worst = float(table["exposed_ms"].max())
    return _result(found, f"most exposed {dim} communication on one rank: {worst:.3f} ms per "
                          f"step (limit {ms} ms)", worst)


def min_reduction_overlap(facts: Facts, ratio: float) -> CheckResult:
    from tracegraph.analysis.overlap import reduction_overlap

    if reason := facts.lacks_timeline() or facts.lacks_reduction():
        return _not_applicable(reason)
    table = reduction_overlap(facts.analysis)
    if not len(table):
        return _not_applicable("no stage reduction on a rank whose compute the profile times")
    found = [facts.violation(int(r.rank), facts.step_of(int(r.rank), int(r.start)),
                             f"stage reduction {facts.ms(r.start):.3f}–{facts.ms(r.end):.3f} ms "
                             f"({r.ms:.3f} ms) overlaps compute {r.ratio:.1%} (< {ratio:.0%})",
                             int(r.start), int(r.end))
             for r in table.itertuples() if r.ratio < ratio]
    overall = float(table["overlap_ms"].sum() / table["ms"].sum())
    return _result(found, f"{len(table) - len(found)} of {len(table)} stage reductions overlap "
                          f"compute at least {ratio:.0%} ({overall:.1%} of their time overall)",
                   overall)


def no_serialized_streams(facts: Facts) -> CheckResult:
    from tracegraph.analysis.findings import serialized

    if reason := facts.lacks_timeline():
        return _not_applicable(reason)
    finding = serialized.finding(facts.analysis)
    if finding is None:
        return _result([], "no compute / collective streams serialized", 0.0)
    found = [facts.violation(int(pair["rank"]), -1, line)
             for pair, line in zip(finding.evidence["pairs"], finding.lines, strict=True)]
    return _result(found, finding.title, float(finding.evidence["exposed_ms_per_step"]))


def max_stage_memory_imbalance(facts: Facts, ratio: float) -> CheckResult:
    from tracegraph.analysis.findings import stage_memory, stage_of

    finding = stage_memory.finding(facts.analysis, stage_of(facts.analysis))
    if finding is None:
        return _not_applicable("no memory recorded in this bundle (profile_memory)")
    imbalance = float(finding.evidence["imbalance"])
    rows = finding.evidence["per_rank"]
    top = max(rows, key=lambda r: r["peak"])
    found = ([facts.violation(int(top["rank"]), -1, f"{finding.title} (> {ratio:.0%})")]
             if imbalance > ratio else [])
    return _result(found, f"stage peak memory imbalance {imbalance:.1%} (at most {ratio:.0%})",
                   imbalance)


def _result(found: list[Violation], summary: str, value: float | None) -> CheckResult:
    return CheckResult(name="", rule="", passed=not found, summary=summary, violations=found,
                       value=value)


def _not_applicable(reason: str) -> CheckResult:
    return CheckResult(name="", rule="", passed=True, summary=reason, reason=reason)


def _bubble_text(facts: Facts, bubble: Bubble) -> str:
    piece = metrics.releaser(bubble)
    released = (f", released by rank {piece.rank} {piece.lane} {piece.name} [{piece.category}]"
                if piece else "")
    return (f"{bubble.lane} {bubble.name} {facts.ms(bubble.start):.3f}–{facts.ms(bubble.end):.3f}"
            f" ms ({bubble.dur / NS_PER_MS:.3f} ms){released}")


def _round(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 4)


_DIMS = ("dp", "pp", "ep")
_COMM_TYPES = {"pp": "P2P", "ep": "all-to-all"}  # comm types charged to a dimension by type
RULES: dict[str, tuple[Callable[..., CheckResult], tuple[str, ...], dict[str, object]]] = {
    "max_step_time": (max_step_time, ("ms",), {}),
    "max_bubble": (max_bubble, ("category", "ms"), {}),
    "max_group_wait": (max_group_wait, ("dim", "ms"), {}),
    "no_reduction_wait_before_p2p": (no_reduction_wait_before_p2p, (),
                                     {"max_ms": 1.0, "within_ms": 1.0}),
    "p2p_before_reduction_end": (p2p_before_reduction_end, (), {"min_ms": 1.0, "within_ms": 1.0}),
    "min_overlap": (min_overlap, ("dim",), {"ratio": 0.25}),
    "max_exposed_comm": (max_exposed_comm, ("dim", "ms"), {}),
    "min_reduction_overlap": (min_reduction_overlap, (), {"ratio": 0.25}),
    "no_serialized_streams": (no_serialized_streams, (), {}),
    "max_stage_memory_imbalance": (max_stage_memory_imbalance, ("ratio",), {}),
}
"""Rule type -> (function, required parameters, optional parameters with defaults)."""
