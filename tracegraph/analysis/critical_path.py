"""Critical path of a step by the binding-predecessor walk.

From the op that ends the step last, walk back through whatever held each moment of the step:
the op's own execution, then, before it started, its binding predecessor — the previous op on its
lane, or the cross dependency satisfied last (the record it waited on, the peer that posted late,
the member of a collective that arrived last, the stream wait that gated it, the host op that
launched it or the device op that freed the host). The walk is the blame walk (blame.py) over the
whole step, so the path and the bubble charges agree; it alternates between work and waits and
crosses streams, threads and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracegraph.analysis.blame import Blamer


@dataclass
class PathSegment:
    """A stretch of the critical path: the op holding the step then, and why (its category)."""

    rank: int
    lane: str
    name: str
    kind: str  # the blame category of the stretch: pipeline_fill, dp_reduction, pp_p2p, ...
    start: int
    end: int


def critical_path(blamer: Blamer, candidates: np.ndarray, window: tuple[int, int]
                  ) -> list[PathSegment]:
    """The binding chain ending at the latest-ending op among `candidates`, within `window`."""
    lo, hi = window
    if not len(candidates):
        return []
    last = int(candidates[np.argmax(blamer.end[candidates])])
    pieces = blamer.history(last, lo, min(int(blamer.end[last]), hi))
    return [PathSegment(rank=p.rank, lane=p.lane, name=p.name, kind=p.category, start=p.start,
                        end=p.end) for p in pieces]
