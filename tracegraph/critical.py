"""Critical path of a step by the binding-predecessor walk.

From the op that ends the step last, step back to whichever predecessor was satisfied last: the
previous op on its lane, or its cross dependency (the record it waited on, the peer that posted
late, the last member of a collective, the host op that launched it). The chain alternates between
work and waits and crosses streams and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracegraph.blame import Blamer


@dataclass
class PathSegment:
    """One op on the critical path and the part of its time that lies on the path."""

    op: int
    rank: int
    lane: str
    name: str
    kind: str
    start: int
    end: int


def critical_path(blamer: Blamer, candidates: np.ndarray, window: tuple[int, int]
                  ) -> list[PathSegment]:
    """The binding chain ending at the latest-ending op among `candidates`, within `window`."""
    lo, hi = window
    if not len(candidates):
        return []
    start, end, prev = blamer.start, blamer.end, blamer.prev
    matches = blamer.matches
    i = int(candidates[np.argmax(end[candidates])])
    path: list[PathSegment] = []
    until = min(end[i], hi)
    visited: set[int] = set()
    while until > lo and i not in visited:
        visited.add(i)
        p = prev[i]
        d = matches.dep[i] if matches.dep[i] >= 0 else matches.launcher[i]
        release = blamer._release(i, d) if matches.dep[i] >= 0 else (start[d] if d >= 0 else -1)
        lane_ready = end[p] if p >= 0 else -1
        begin = max(min(start[i], until), lo)
        path.append(_segment(blamer, i, begin, until))
        if d >= 0 and release > max(lane_ready, start[i]) and release > lo:  # i really waited
            path[-1].start = max(min(release, until), lo)
            following = min(release, until)
            if matches.how[i] == "event_id":
                following = min(end[d], following)
            i, until = int(d), following
        elif p >= 0:
            i, until = int(p), min(end[p], begin)
        else:
            break
    path.reverse()
    return [s for s in path if s.end > s.start]


def _segment(blamer: Blamer, i: int, start: int, end: int) -> PathSegment:
    return PathSegment(op=i, rank=int(blamer.rank[i]), lane=str(blamer.lane[i]),
                       name=str(blamer.name[i]), kind=str(blamer.kind[i]), start=int(start),
                       end=int(end))
