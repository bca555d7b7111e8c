"""A finding: what was found, its evidence, and what to try."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

INFO, WARNING = "info", "warning"


@dataclass
class Finding:
    """One finding: a title line, readable evidence lines, the numbers, and what to try."""

    kind: str  # "exposed_comm" | "serialized_streams" | "stage_memory"
    severity: str  # INFO | WARNING
    title: str
    suggestion: str
    lines: list[str] = field(default_factory=list)  # the evidence, one readable line each
    evidence: dict[str, object] = field(default_factory=dict)  # the numbers behind the lines

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
