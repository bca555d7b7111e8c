"""Findings (tracegraph.analysis.findings) as terminal text and as an HTML section."""

from __future__ import annotations

from html import escape

from rich.console import Console

MARK = {"warning": "!", "info": "·"}
SHOWN_LINES = 6  # evidence lines of a finding in the terminal (one per rank at most grows)


def print_findings(console: Console, findings: list[dict[str, object]]) -> None:
    """Each finding: its title, evidence lines and suggestion."""
    if not findings:
        return
    console.print("\nfindings:", highlight=False)
    for finding in findings:
        for line in finding_lines(finding):
            console.print(line, highlight=False, markup=False)


def finding_lines(finding: dict[str, object], most: int = SHOWN_LINES) -> list[str]:
    """A finding as plain text lines: its title, its first `most` evidence lines (the others
    counted), what to try."""
    lines = [f"{MARK.get(finding['severity'], '·')} {finding['title']}"]
    lines += [f"    {line}" for line in finding["lines"][:most]]
    if len(finding["lines"]) > most:
        lines.append(f"    … {len(finding['lines']) - most} more (--json lists all)")
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
