"""`tracegraph diff` / `check` results as JUnit XML (the Ant / Jenkins JUnit schema that CI systems
read): one test case per metric and per check; the numbers go in the suite's properties and
system-out, failures carry the offending places, a check that is not applicable is `<skipped>` with
its reason. When no check applies and the gate fails for it, a failing case says so."""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import datetime

from reports.markdown import (
    STATUS_WORDS,
    gate_line,
    interval_text,
    ms,
    nothing_verified_line,
    p_value,
    pct,
    ratio,
    runs_text,
    verdict_line,
    violation_line,
)

CLASSNAME = "tracegraph"


@dataclass
class Case:
    """One test case: passed when `failure` and `skipped` are empty."""

    name: str
    classname: str
    failure: str = ""  # one-line message
    details: str = ""  # the failure's text body
    skipped: str = ""  # why it was not run (a check that is not applicable)


def junit_xml(suite: str, cases: list[Case], properties: dict[str, str], output: str = "") -> str:
    """A `<testsuite>` document valid against the JUnit XSD (tests/data/junit.xsd)."""
    root = ET.Element("testsuite", {
        "name": suite, "timestamp": datetime.now().strftime("%Y-%m-%dT%H:%M:%S"),
        "hostname": socket.gethostname() or "localhost", "tests": str(len(cases)),
        "failures": str(sum(bool(c.failure) for c in cases)), "errors": "0",
        "skipped": str(sum(bool(c.skipped) for c in cases)), "time": "0"})
    props = ET.SubElement(root, "properties")
    for name, value in properties.items():
        ET.SubElement(props, "property", {"name": name, "value": str(value)})
    for case in cases:
        element = ET.SubElement(root, "testcase", {"name": case.name,
                                                   "classname": case.classname, "time": "0"})
        if case.failure:
            failure = ET.SubElement(element, "failure", {"message": case.failure,
                                                         "type": "CheckFailed"})
            failure.text = case.details or case.failure
        elif case.skipped:
            ET.SubElement(element, "skipped", {"message": case.skipped})
    ET.SubElement(root, "system-out").text = output
    ET.SubElement(root, "system-err").text = ""
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def diff_junit(report: dict[str, object]) -> str:
    """The diff as a suite: step time (fails when it regressed beyond the thresholds), bubble
    time per category, overlap per group kind, then each check on the after profile. With several
    runs per side, the step time's and each category's interval and p-value are properties."""
    step = report["step_time"]
    failure = ""
    if report.get("regressed_beyond_threshold"):
        failure = f"{verdict_line(report)}; {gate_line(report)}"
    confidence = report["noise"]["confidence"]
    cases = [Case("step_time", f"{CLASSNAME}.diff", failure)]
    cases += [Case(f"bubble.{r['category']}", f"{CLASSNAME}.diff") for r in report["bubbles"]]
    cases += [Case(f"overlap.{r['dim']}", f"{CLASSNAME}.diff") for r in report["overlap"]]
    cases += check_cases([c["after"] for c in report.get("checks", [])], report)
    props = {"verdict": report["verdict"], "step_ms.before": ms(step["before_ms"]),
             "step_ms.after": ms(step["after_ms"]), "step_change": pct(step["change_pct"]),
             "noise": report["noise"]["note"],
             "runs": f"{len(report['before']['runs'])} before, {len(report['after']['runs'])} "
                     "after"}
    props |= _spread("step_change", step, confidence, "%")
    for r in report["bubbles"]:
        props[f"bubble_ms.{r['category']}"] = f"{ms(r['before_ms'])} -> {ms(r['after_ms'])}"
        props |= _spread(f"bubble_ms.{r['category']}", r, confidence, "ms")
    props |= {f"overlap.{r['dim']}": f"{ratio(r['before'])} -> {ratio(r['after'])}"
              for r in report["overlap"]}
    return junit_xml("tracegraph diff", cases, props, _diff_text(report))


def _spread(name: str, change: dict[str, object], confidence: float, unit: str
            ) -> dict[str, str]:
    """The interval and p-value properties of a change (none without a noise estimate)."""
    key = "interval_pct" if unit == "%" else "interval_ms"
    if change[key] is None:
        return {}
    low, high = change[key]
    return {f"{name}.interval": f"{100 * confidence:g} % {low:+g} .. {high:+g} {unit}",
            f"{name}.p_value": p_value(change["p_value"])}


def check_junit(report: dict[str, object]) -> str:
    """`tracegraph check` as a suite, one case per check."""
    cases = check_cases(report["checks"], report)
    text = "\n".join(f"{c['name']}: {STATUS_WORDS[c['status']]}: {c['summary']}"
                     for c in report["checks"])
    return junit_xml("tracegraph check", cases, {"source": report["source"],
                                                 "step_ms": ms(report["step_ms"])}, text)


def check_cases(checks: list[dict[str, object]], report: dict[str, object]) -> list[Case]:
    """One case per check; plus a failing one when no check applies and that fails the gate."""
    cases = [Case(c["name"], f"{CLASSNAME}.check.{c['rule']}",
                  f"{c['summary']}; {len(c['violations'])} places" if c["status"] == "fail"
                  else "", "\n".join(violation_line(v) for v in c["violations"]),
                  c["reason"] or "") for c in checks]
    if report.get("nothing_verified") and not report.get("allow_not_applicable"):
        cases.append(Case("checks applicable", f"{CLASSNAME}.check",
                          nothing_verified_line(report)))
    return cases


def _diff_text(report: dict[str, object]) -> str:
    lines = [verdict_line(report), report["noise"]["note"], gate_line(report),
             *report.get("warnings", [])]
    lines += [f"rank {r['rank']}: {ms(r['before_ms'])} -> {ms(r['after_ms'])} ms"
              for r in report["ranks"]]
    confidence = report["noise"]["confidence"]
    lines += [f"{state}: rank {c['rank']} {c['category']} root rank {c['root']['rank']} "
              f"{c['root']['op']} {ms(c['before_ms'])} -> {ms(c['after_ms'])} ms/step, in runs "
              f"{runs_text(c, report)}{_comma(interval_text(c, confidence))}"
              for state, chains in report["chains"].items() for c in chains]
    return "\n".join(lines)


def _comma(text: str) -> str:
    return f", {text}" if text else ""
