"""Findings (tracegraph.analysis.findings) as terminal text and as an HTML section."""

from __future__ import annotations

from html import escape

from rich.console import Console

MARK = {"warning": "!", "info": "·"}


def print_findings(console: Console, findings: list[dict[str, object]]) -> None:
    """Each finding: its title, evidence lines and suggestion."""
    if not findings:
        return
    console.print("\nfindings:", highlight=False)
    for finding in findings:
        for line in finding_lines(finding):
            console.print(line, highlight=False, markup=False)


def finding_lines(finding: dict[str, object]) -> list[str]:
    """A finding as plain text lines."""
    lines = [f"{MARK.get(finding['severity'], '·')} {finding['title']}"]
    lines += [f"    {line}" for line in finding["lines"]]
    if finding["severity"] == "warning":
        lines.append(f"    try: {finding['suggestion']}")
    return lines


def findings_html(findings: list[dict[str, object]]) -> str:
    """The findings section of the HTML report."""
    if not findings:
        return ""
    items = []
    for f in findings:
        evidence = "".join(f"<li>{escape(line)}</li>" for line in f["lines"])
        tip = (f"<p class=\"note\">try: {escape(f['suggestion'])}</p>"
               if f["severity"] == "warning" else "")
        kind, severity = escape(f["kind"]), escape(f["severity"])
        items.append(f"<div class=\"finding {severity}\" data-kind=\"{kind}\">"
                     f"<h3>{escape(f['title'])}</h3><ul>{evidence}</ul>{tip}</div>")
    return "<h2>Findings</h2>\n" + "\n".join(items)
