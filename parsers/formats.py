"""The registry of trace formats: the one place that lists them.

Discovery (`parsers.bundle`) and `parsers.parse_rank` read `FORMATS` when they run, in its order:
an earlier format takes its profiles first (an Ascend folder owns the JSON files inside it). A new
format is one module defining `FORMAT = parsers.base.Format(...)` plus one line here.
"""

from __future__ import annotations

from parsers import ascend, ascend_db, ascend_prof, kineto, nsys
from parsers.base import Format

FORMATS: tuple[Format, ...] = (
    ascend_prof.FORMAT,  # before ascend: it takes the PROF_* device folders with timelines
    ascend.FORMAT,
    kineto.FORMAT,
    ascend_db.FORMAT,
    nsys.FORMAT,
)


def named(name: str) -> Format | None:
    """The registered format called `name`, else None."""
    return next((fmt for fmt in FORMATS if fmt.name == name), None)
