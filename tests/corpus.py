"""The corpus of real PyTorch-profiler recordings with injected causes (tests/data/corpus).

Each case folder holds `rankN.json.gz` (torch 2.13.0 CPU, gloo, 127.0.0.1; recorded by
bench/record_corpus.py) and `ground_truth.json`, written by the recorder from what it injected;
tests/data/corpus/README.md documents the format.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from tracegraph import schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.verify.metrics import step_ms

CORPUS = Path(__file__).resolve().parent / "data" / "corpus"
CASES: tuple[str, ...] = tuple(sorted(p.name for p in CORPUS.iterdir()
                                      if (p / "ground_truth.json").is_file()))
"""The case folders' names."""


def folder(case: str) -> Path:
    """The folder of `case` (what `tracegraph.load` / `tracegraph analyze` take)."""
    return CORPUS / case


@cache
def _truth(case: str) -> str:
    return (CORPUS / case / "ground_truth.json").read_text()


def truth(case: str) -> dict:
    """The ground_truth.json of `case` (a fresh copy on every call)."""
    return json.loads(_truth(case))


@lru_cache(maxsize=16)
def _raw(case: str, rank: int) -> bytes:
    return gzip.decompress((CORPUS / case / f"rank{rank}.json.gz").read_bytes())


def raw(case: str, rank: int) -> dict:
    """The Chrome-trace JSON of one rank of `case`, as the profiler exported it (a fresh copy)."""
    return json.loads(_raw(case, rank))


def span_at(case: str, rank: int, step: int, where: list[str]) -> dict:
    """The annotation `where[-1]` of a rank's step, inside the others of `where` (on the thread
    of the step's marker): where the truth places a wait or a call."""
    events = [e for e in raw(case, rank)["traceEvents"] if e.get("ph") == "X"]
    (marker,) = [e for e in events if e["name"] == f"ProfilerStep#{step}"]
    lo, hi = marker["ts"], marker["ts"] + marker["dur"]
    spans = [e for e in events if e["tid"] == marker["tid"] and lo <= e["ts"] <= hi
             and e.get("cat") == "user_annotation"]
    for span in _named_in(spans, where[-1]):
        around = {o["name"] for o in spans
                  if o["ts"] <= span["ts"] and span["ts"] + span["dur"] <= o["ts"] + o["dur"]}
        if set(where[:-1]) <= around:
            return span
    raise LookupError(f"{case} rank {rank} step {step}: no {where}")


def _named_in(spans: list[dict], name: str) -> list[dict]:
    return [e for e in spans if e["name"] == name]


# --- judging tracegraph's bubbles against the truth ---------------------------------------------
LARGE_SHARE = 0.10  # bubbles of at least this share of their step are judged one by one
SLACK_NS = 50_000  # an annotation encloses a bubble that starts or ends this close to its edges


@dataclass
class Judged:
    """One bubble of tracegraph's and what the truth says it should be."""

    bubble: Bubble
    where: tuple[str, ...]  # the annotations around it on its rank's main thread
    wait: dict | None  # the truth's wait there (None: no wait the schedule makes)
    allowed: set[tuple[str, int | None]]  # (category, rank or None for any) charged right

    @property
    def expected(self) -> tuple[str | None, int | None]:
        """(category, root rank) the truth states; (None, None) for a wait on peers' normal
        work, which any of `allowed` may explain. A wait on a rank absent from the bundle is
        its communication's category, with that rank to profile: stated."""
        if self.wait is None:
            return None, None
        on_absent = any(c["cause"] == "absent" and c["rank"] == self.wait["root_rank"]
                        for c in self.wait["causes"])
        if self.wait["category"] in _NORMAL and not on_absent:
            return None, None
        return self.wait["category"], self.wait["root_rank"]

    def right_ns(self) -> int:
        """Bubble time charged to a cause the truth puts on this wait's chain."""
        return sum(i.dur for i in self.bubble.intervals
                   if (i.category, i.rank) in self.allowed or (i.category, None) in self.allowed)

    def text(self) -> str:
        b = self.bubble
        root = b.root.rank if b.root else None
        return (f"rank {b.rank} step {b.step} {'/'.join(self.where) or '-'} {b.name} "
                f"{b.dur / 1e6:.1f} ms: {b.category} root {root}, expected {self.expected}")


_NORMAL = {"pipeline_fill", "peer_compute", "pp_p2p", "dp_reduction", "ep_alltoall",
           "collective", "tp_collective", "cp_collective"}
"""Categories of waiting on peers' normal work or communication."""


def judge(case: str, analysis: Analysis, share: float = 0.0) -> list[Judged]:
    """Every bubble of at least `share` of its step (the slowest rank's), with its truth."""
    known = truth(case)
    steps = step_ms(analysis)
    expected = known["expected"]
    stated: dict[tuple[int, int, tuple[str, ...]], dict] = {}
    for wait in expected["waits"]:
        key = (wait["rank"], wait["step"], tuple(wait["where"]))
        if key not in stated or wait["ms"] > stated[key]["ms"]:
            stated[key] = wait
    first = min(known["profiled_steps"])
    out = []
    for bubble in analysis.bubbles:
        if bubble.dur < share * steps.get(bubble.step, 0.0) * 1e6:
            continue
        where = annotations(analysis, bubble)
        wait = stated.get((bubble.rank, bubble.step, where))
        out.append(Judged(bubble, where, wait, _allowed(expected, wait, bubble.step == first)))
    return out


def _allowed(expected: dict, wait: dict | None, first_step: bool) -> set[tuple[str, int | None]]:
    """What a piece of the bubble may be charged to and be right: the causes the truth states
    for its wait and the communication it went through; for a wait the schedule does not make
    (the peers' normal variation), their work, communication and host gaps, and, in the first
    profiled step, time before a peer's profile began (unknown)."""
    normal = {(expected["idle_category"], None), *((c, None) for c in
                                                    expected["comm_categories"])}
    if wait is None or wait["category"] in _NORMAL:
        extra = {("host_launch", None)} | ({("unknown", None)} if first_step else set())
        return normal | extra | ({(c, None) for c in wait["via"]} if wait else set())
    causes = {(c["category"], c["rank"]) for c in wait["causes"] if c["cause"] != "transfer"}
    return causes | {(c, None) for c in wait["via"]}


def annotations(analysis: Analysis, bubble: Bubble) -> tuple[str, ...]:
    """The user annotations around a bubble on its lane, outermost first (no step markers)."""
    events = analysis.trace.events
    shift = analysis.offsets.get(bubble.rank, 0)
    start = events["start_ns"] - shift
    around = events[(events["rank"] == bubble.rank) & (events["lane"] == bubble.lane)
                    & (events["kind"] == schema.MARKER)
                    & (start <= bubble.start + SLACK_NS)
                    & (start + events["dur_ns"] >= bubble.end - SLACK_NS)]
    around = around.assign(start=start).sort_values(["start", "dur_ns"], ascending=[True, False])
    return tuple(n for n in around["name"] if not str(n).startswith("ProfilerStep#"))
