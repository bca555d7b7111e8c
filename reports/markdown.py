"""`tracegraph diff` / `check` results as Markdown for a pull-request comment or a CI job summary,
and the number formats every gate report shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

STATE_TITLES = {"disappeared": "Chains that disappeared", "shrank": "Chains that shrank",
                "grew": "Chains that grew", "appeared": "Chains that appeared"}
VERDICT_MARKS = {"improved": "✅", "unchanged": "➖", "regressed": "❌"}


# --- shared number formats ---------------------------------------------------------------------
def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.3f}"


def pct(value: float | None, signed: bool = True) -> str:
    return "–" if value is None else (f"{value:+.1f} %" if signed else f"{value:.1f} %")


def ratio(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def verdict_line(report: dict[str, object]) -> str:
    """"improved: step time 223.528 → 21.770 ms (-90.3 %)"."""
    step = report["step_time"]
    return (f"{report['verdict']}: step time {ms(step['before_ms'])} → {ms(step['after_ms'])} ms "
            f"({pct(step['change_pct'])})")


def root_text(chain: dict[str, object]) -> str:
    root = chain["root"]
    return f"rank {root['rank']} {root['lane']} {root['op']}"


def check_status(result: dict[str, object] | None) -> str:
    return "–" if result is None else ("pass" if result["passed"] else "FAIL")


# --- Markdown ----------------------------------------------------------------------------------
def diff_markdown(report: dict[str, object], *, limit: int = 10) -> str:
    """The whole diff: verdict, step time per rank, bubbles, critical path, overlap, chains,
    checks (each failing check with up to `limit` offending places)."""
    before, after = report["before"], report["after"]
    lines = [f"## tracegraph diff {VERDICT_MARKS[report['verdict']]} {verdict_line(report)}", "",
             f"before `{before['source']}` · after `{after['source']}`", ""]
    lines += _section("Step time (ms, median over steps)", ["rank", "before", "after", "change"],
                      [[r["rank"], ms(r["before_ms"]), ms(r["after_ms"]), pct(r["change_pct"])]
                       for r in report["ranks"]])
    lines += _section("Bubble time by root cause (ms per step, all ranks)",
                      ["category", "before", "after", "change"],
                      [[r["category"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"])]
                       for r in report["bubbles"]])
    lines += _section("Critical path (ms per step)", ["op kind", "before", "after", "change"],
                      [[r["kind"], ms(r["before_ms"]), ms(r["after_ms"]), ms(r["change_ms"])]
                       for r in report["critical_path"]])
    lines += _section("Communication overlapped by main-lane compute",
                      ["group kind", "before", "after", "comm ms/step before", "after"],
                      [[r["dim"], ratio(r["before"]), ratio(r["after"]),
                        ms(r["before_comm_ms"]), ms(r["after_comm_ms"])]
                       for r in report["overlap"]])
    for state, chains in report["chains"].items():
        lines += _section(f"{STATE_TITLES[state]} (ms per step; floor {report['min_chain_ms']} ms)",
                          ["waiting rank", "cause", "root", "before", "after", "chain"],
                          [[c["rank"], c["category"], root_text(c), ms(c["before_ms"]),
                            ms(c["after_ms"]), " ← ".join(map(str, c["chain"]))]
                           for c in chains])
    if report.get("checks"):
        lines += checks_section(report["checks"], limit=limit)
    return "\n".join(lines).rstrip() + "\n"


def check_markdown(report: dict[str, object], *, limit: int = 10) -> str:
    """The result of `tracegraph check`: one row per check, then each failure's places."""
    passed = sum(c["passed"] for c in report["checks"])
    mark = "✅" if report["passed"] else "❌"
    lines = [f"## tracegraph check {mark} {passed} of {len(report['checks'])} checks pass", "",
             f"profile `{report['source']}` · step time {ms(report['step_ms'])} ms", ""]
    lines += _section("Checks", ["check", "result", "measured"],
                      [[c["name"], check_status(c), c["summary"]] for c in report["checks"]])
    lines += _failures([c for c in report["checks"] if not c["passed"]], limit)
    return "\n".join(lines).rstrip() + "\n"


def checks_section(checks: list[dict[str, object]], *, limit: int = 10) -> list[str]:
    """Checks evaluated on both profiles of a diff (the after profile decides)."""
    lines = _section("Checks", ["check", "before", "after", "after: measured"],
                     [[c["name"], check_status(c["before"]), check_status(c["after"]),
                       c["after"]["summary"]] for c in checks])
    return lines + _failures([c["after"] for c in checks if not c["after"]["passed"]], limit)


def _failures(failed: Iterable[dict[str, object]], limit: int) -> list[str]:
    lines = []
    for check in failed:
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
