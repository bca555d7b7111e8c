"""`tracegraph diff` / `check` results as Markdown for a pull-request comment or a CI job summary,
and the number formats every gate report shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

STATE_TITLES = {"disappeared": "Chains that disappeared", "shrank": "Chains that shrank",
                "grew": "Chains that grew", "appeared": "Chains that appeared"}
VERDICT_MARKS = {"improved": "✅", "unchanged": "➖", "noise": "〰️", "regressed": "❌"}
STATUS_WORDS = {"pass": "pass", "fail": "FAIL", "not_applicable": "not applicable"}
NOTHING_VERIFIED = "every check is not applicable to this profile: the gate verified nothing"


# --- shared number formats ---------------------------------------------------------------------
def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.3f}"


def pct(value: float | None, signed: bool = True) -> str:
    return "–" if value is None else (f"{value:+.1f} %" if signed else f"{value:.1f} %")


def ratio(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def verdict_line(report: dict[str, object]) -> str:
    """"improved: step time 223.528 → 21.770 ms (-90.3 %)", with several runs per side
    "noise: step time 1,083.756 → 1,077.710 ms (-0.6 %, 95 % interval -1.6 … +1.2 %,
    p = 0.48)"."""
    step = report["step_time"]
    spread = interval_text(step, report["noise"]["confidence"], "%")
    line = (f"{report['verdict']}: step time {ms(step['before_ms'])} → {ms(step['after_ms'])} ms "
            f"({pct(step['change_pct'])}{', ' + spread if spread else ''})")
    return line + (": inside the run-to-run noise" if report["verdict"] == "noise" else "")


def interval_text(change: dict[str, object], confidence: float, unit: str = "ms") -> str:
    """"95 % interval -1.6 … +1.2 %, p = 0.48" ("" without a noise estimate); `unit`: % for
    the relative interval, ms for the absolute one."""
    low_high = change["interval_pct" if unit == "%" else "interval_ms"]
    if low_high is None or change["p_value"] is None:
        return ""
    low, high = low_high
    return (f"{100 * confidence:g} % interval {low:+,.{1 if unit == '%' else 3}f} … "
            f"{high:+,.{1 if unit == '%' else 3}f} {unit}, p = {p_value(change['p_value'])}")


def p_value(value: float | None) -> str:
    """A p-value to two significant digits ("–" for none)."""
    return "–" if value is None else f"{value:.2g}"


def runs_text(chain: dict[str, object], report: dict[str, object]) -> str:
    """In how many runs of each side a chain holds: "3/3 → 0/3"."""
    held = chain["runs"]
    runs = {side: len(report[side]["runs"]) for side in held}
    return f"{held['before']}/{runs['before']} → {held['after']}/{runs['after']}"


def gate_line(report: dict[str, object]) -> str:
    """What fails the step-time gate, and whether it did."""
    limit = report.get("fail_on_regression_pct")
    if limit is None:
        return "gate: step time not gated (--fail-on-regression off)"
    floor = report.get("min_regression_ms") or 0.0
    confident = (f" with {100 * report['noise']['confidence']:g} % confidence"
                 if report["noise"]["estimated"] else " (one run per side: the point change)")
    both = f" and {floor:g} ms" if floor else ""
    result = "failed" if report.get("regressed_beyond_threshold") else "passed"
    return f"gate: fails on a step time worse by more than {limit:g} %{both}{confident}: {result}"


def root_text(chain: dict[str, object]) -> str:
    root = chain["root"]
    return f"rank {root['rank']} {root['lane']} {root['op']}"


def check_status(result: dict[str, object] | None) -> str:
    """pass, FAIL or not applicable (– for no result)."""
    return "–" if result is None else STATUS_WORDS[result["status"]]


def checks_line(counts: dict[str, int]) -> str:
    """"2 of 3 checks pass", "2 of 2 checks pass, 1 not applicable", or none applies."""
    skipped = counts["not_applicable"]
    applied = counts["pass"] + counts["fail"]
    if skipped and not applied:
        return f"no check applies: {skipped} of {skipped} not applicable"
    line = f"{counts['pass']} of {applied} checks pass"
    return line + (f", {skipped} not applicable" if skipped else "")


def rank_sum(before: int, after: int | None = None) -> str:
    """What a total sums over: "summed over 4 ranks"; a diff's two sides may differ."""
    ranks = f"{before}" if after in (None, before) else f"{before} (before) / {after} (after)"
    return f"summed over {ranks} ranks"


def diff_bubble_title(report: dict[str, object]) -> str:
    """The title of a diff's bubble table: per step, and what it sums over."""
    counts = (len(report[side]["ranks"]) for side in ("before", "after"))
    return f"bubble time by root cause per step, {rank_sum(*counts)} (rank·ms)"


# --- Markdown ----------------------------------------------------------------------------------
def diff_markdown(report: dict[str, object], *, limit: int = 10) -> str:
    """The whole diff: verdict, step time per rank, bubbles, critical path, overlap, chains,
    checks (each failing check with up to `limit` offending places)."""
    before, after = report["before"], report["after"]
    lines = [f"## tracegraph diff {VERDICT_MARKS[report['verdict']]} {verdict_line(report)}", "",
             f"before `{before['source']}` · after `{after['source']}`", "",
             f"_{report['noise']['note']}; {gate_line(report)}_", ""]
    lines += [f"**⚠️ {line}**" for line in report.get("warnings", [])]
    lines += [""] if report.get("warnings") else []
    if max(len(before["runs"]), len(after["runs"])) > 1:
        lines += _section("Runs (ms, median over steps)", ["side", "run", "profile", "step time"],
                          runs_rows(report))
    lines += _section("Step time (ms, median over steps)", ["rank", "before", "after", "change"],
                      [[r["rank"], ms(r["before_ms"]), ms(r["after_ms"]), pct(r["change_pct"])]
                       for r in report["ranks"]])
    title = diff_bubble_title(report)
    estimated = report["noise"]["estimated"]
    lines += _section(title[0].upper() + title[1:],
                      ["category", "before", "after", "change", *SPREAD[:2 * estimated]],
                      [[r["category"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"]),
                        *spread_cells(r, estimated)] for r in report["bubbles"]])
    lines += _section("Critical path (ms per step)", ["op kind", "before", "after", "change"],
                      [[r["kind"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"])]
                       for r in report["critical_path"]])
    lines += _section("Communication overlapped by main-lane compute",
                      ["group kind", "before", "after", "comm ms/step before", "after"],
                      [[r["dim"], ratio(r["before"]), ratio(r["after"]),
                        ms(r["before_comm_ms"]), ms(r["after_comm_ms"])]
                       for r in report["overlap"]])
    repeated = max(len(before["runs"]), len(after["runs"])) > 1
    for state, chains in report["chains"].items():
        lines += _section(f"{STATE_TITLES[state]} (ms per step; floor {report['min_chain_ms']} ms)",
                          ["waiting rank", "cause", "root", "before", "after",
                           *["runs"][:repeated], *SPREAD[:2 * estimated], "chain"],
                          [[c["rank"], c["category"], root_text(c), ms(c["before_ms"]),
                            ms(c["after_ms"]), *[runs_text(c, report)][:repeated],
                            *spread_cells(c, estimated), " ← ".join(map(str, c["chain"]))]
                           for c in chains])
    if report.get("checks"):
        lines += _nothing_verified(report)
        lines += checks_section(report["checks"], report["check_counts"], limit=limit)
    return "\n".join(lines).rstrip() + "\n"


SPREAD = ("interval (ms)", "p")


def spread_cells(change: dict[str, object], estimated: bool) -> list[str]:
    """The interval and p-value cells of a change (none without a noise estimate); a change
    inside the noise says so."""
    if not estimated or change["interval_ms"] is None:
        return []
    low, high = change["interval_ms"]
    noise = "" if change["significant"] or not change["change_ms"] else " (noise)"
    return [f"{low:+,.3f} … {high:+,.3f}", f"{p_value(change['p_value'])}{noise}"]


def runs_rows(report: dict[str, object]) -> list[list[object]]:
    """Each run of each side: side, its number, its profile, its median step."""
    return [[side, i, run["source"], ms(run["step_ms"])] for side in ("before", "after")
            for i, run in enumerate(report[side]["runs"], 1)]


def check_markdown(report: dict[str, object], *, limit: int = 10) -> str:
    """The result of `tracegraph check`: one row per check, then each failure's places."""
    mark = "⚠️" if report["nothing_verified"] else ("✅" if report["passed"] else "❌")
    lines = [f"## tracegraph check {mark} {checks_line(report['check_counts'])}", "",
             f"profile `{report['source']}` · step time {ms(report['step_ms'])} ms", ""]
    lines += _nothing_verified(report)
    lines += _section("Checks", ["check", "result", "measured"],
                      [[c["name"], check_status(c), c["summary"]] for c in report["checks"]])
    lines += _failures(report["checks"], limit)
    return "\n".join(lines).rstrip() + "\n"


def nothing_verified_line(report: dict[str, object]) -> str:
    """The loud line when no check applied ("" otherwise), with what it did to the exit code."""
    if not report["nothing_verified"]:
        return ""
    then = ("exit 0 (--allow-not-applicable)" if report["allow_not_applicable"]
            else "exit 1 (--allow-not-applicable accepts it)")
    return f"{NOTHING_VERIFIED}; {then}"


def _nothing_verified(report: dict[str, object]) -> list[str]:
    line = nothing_verified_line(report)
    return [f"**⚠️ {line[0].upper()}{line[1:]}**", ""] if line else []


def checks_section(checks: list[dict[str, object]], counts: dict[str, int], *,
                   limit: int = 10) -> list[str]:
    """Checks evaluated on both profiles of a diff (the after profile decides; `counts`: its
    statuses)."""
    lines = _section(f"Checks (after: {checks_line(counts)})",
                     ["check", "before", "after", "after: measured"],
                     [[c["name"], check_status(c["before"]), check_status(c["after"]),
                       c["after"]["summary"]] for c in checks])
    return lines + _failures([c["after"] for c in checks], limit)


def _failures(checks: Iterable[dict[str, object]], limit: int) -> list[str]:
    """Each failed check's places, up to `limit` of them."""
    lines = []
    for check in (c for c in checks if c["status"] == "fail"):
        places = check["violations"]
        lines.append(f"**{check['name']}** failed at {len(places)} places:")
        lines += [f"- {violation_line(v)}" for v in places[:limit]]
        if len(places) > limit:
            lines.append(f"- … {len(places) - limit} more")
        lines.append("")
    return lines


def violation_line(violation: dict[str, object]) -> str:
    stage = f" (stage {violation['stage']})" if violation["stage"] >= 0 else ""
    step = f" step {violation['step']}" if violation["step"] >= 0 else ""
    return f"rank {violation['rank']}{stage}{step}: {violation['text']}"


def _section(title: str, headers: Sequence[str], rows: list[list[object]]) -> list[str]:
    if not rows:
        return []
    out = [f"### {title}", "", "| " + " | ".join(headers) + " |",
           "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out + [""]


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
