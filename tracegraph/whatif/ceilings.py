"""Gain ceilings: for each root cause blame charged, the most that removing it would save.

Not the bubble time summed (a bubble several ranks wait through, or one hidden behind another,
would count many times): each cause is removed from the timing model and the step replayed.
Removing a communication category makes its transfers free (absent members' lateness included,
which blame charges to it); a compute straggler runs at its peers' median; host launch delays go
to zero. Pipeline fill (the schedule's own), a peer's normal variation and unexplained time have
no fix to model. Causes overlap: one stall can need two causes removed before it goes (then
removing them together saves more than the sum of their ceilings), and a removed one can expose
another (then less), so ceilings do not add; the ceiling of removing them all together is given
beside them, with words for which of the two it is.
"""

from __future__ import annotations

import numpy as np

from tracegraph import causes
from tracegraph.analysis.analyze import PROGRESS_EVENTS, Analysis
from tracegraph.progress import Progress
from tracegraph.whatif.edits import LAUNCH, Edit, Scale, Straggler
from tracegraph.whatif.engine import CycleError
from tracegraph.whatif.predict import Prediction, predict
from tracegraph.whatif.subject import Subject

NO_FIX = {causes.PIPELINE_FILL: "the schedule's own fill and drain: no single fix removes it",
          causes.PEER_COMPUTE: ("a peer's compute that no straggler test singled out (normal "
                                "variation, or no peer in the bundle to judge it by)"),
          causes.OWN_COMPUTE: "the rank's own work: no scheduling fix removes it",
          causes.UNKNOWN: "time the walk could not explain"}
RULE = ("ceilings of overlapping causes do not add: removing every cause together saves "
        "{together:.1f} ms, not the sum {total:.1f} ms")
MORE = ("removing every cause together saves {together:.1f} ms, more than the sum {total:.1f} ms "
        "of the single ceilings: the causes stand in for each other (one removed alone, another "
        "still holds the step)")
LITTLE = ", so a fix of one gains little until the others are fixed too"
LITTLE_SHARE = 0.5  # ... when no single ceiling reaches this share of removing them together
_RECENT: list[Subject] = []  # the last analyses' subjects (a report summarizes one many times)


def subject_of(analysis: Analysis) -> Subject:
    """The analysis' Subject, built once for the last few analyses."""
    for subject in _RECENT:
        if subject.analysis is analysis:
            return subject
    subject = Subject(analysis)
    _RECENT[:] = [subject, *_RECENT[:1]]
    return subject


def remover(subject: Subject, category: str) -> list[Edit]:
    """The edits that take a root cause away ([] when none can)."""
    if category in NO_FIX:
        return []
    if category == causes.HOST_LAUNCH:
        return [Scale(LAUNCH, 0.0)]
    if category == causes.COMPUTE_STRAGGLER:
        analysis, graph = subject.analysis, subject.graph
        slow = analysis.slow_op
        ranks = sorted(set(analysis.slow_ranks) | {int(r) for r in graph.rank[slow]})
        return [Straggler(str(rank)) for rank in ranks]
    if category in set(subject.category):
        return [Scale(category, 0.0)]
    return []


def gain_ceilings(analysis: Analysis) -> dict[str, object]:
    """Per root cause of the analysis' bubbles: the step time removing it saves at most (median
    over steps, ms and % of the measured step, best and worst step), and why a cause has none."""
    if why := analysis.no_replay():  # lost events (their time would go to the gaps they
        return {"causes": [], "refused": [why]}  # left), or a graph that is not in one place
    subject = subject_of(analysis)
    if "ceilings" not in subject.memo:
        try:
            subject.memo["ceilings"] = _ceilings(subject)
        except CycleError as error:  # matches that contradict each other: analyze warned
            subject.memo["ceilings"] = {"causes": [], "refused": [
                f"no replay: {error} (the dependency graph's matches contradict each other)"]}
    return subject.memo["ceilings"]


def _ceilings(subject: Subject) -> dict[str, object]:
    analysis = subject.analysis
    found = [c for c, ms in analysis.blame().items() if ms > 0]
    if not found:
        return {"causes": [], "rule": ""}
    baseline = predict(subject, [])
    if not baseline.predicted:
        return {"causes": [], "refused": sorted(set(baseline.refused.values()))}
    rows, every = [], []
    with Progress("gain ceilings: one replay per cause", total=len(found) + 1,
                  enabled=analysis.trace.event_count > PROGRESS_EVENTS) as bar:
        for category in found:
            edits = remover(subject, category)
            if edits:
                every += edits
                rows.append({"category": category, **_ceiling(predict(subject, edits)),
                             "edit": ", ".join(e.label for e in edits)})
            else:
                rows.append({"category": category, "ceiling_ms": None,
                             "why": NO_FIX.get(category, "no edit models its removal")})
            bar.advance()
        together = _ceiling(predict(subject, every)) if every else {"ceiling_ms": 0.0}
        bar.advance()
    rows.sort(key=lambda r: -(r["ceiling_ms"] or -1.0))
    return {"causes": rows, "together": together, "rule": _rule(rows, together["ceiling_ms"])}


def _rule(rows: list[dict[str, object]], together: float) -> str:
    """Why the ceilings do not add, where there is a sum to compare (two ceilings or more that
    differ, as printed, from removing them all together); else nothing."""
    ceilings = [r["ceiling_ms"] for r in rows if r["ceiling_ms"] is not None]
    total = sum(ceilings)
    if len(ceilings) < 2 or f"{together:.1f}" == f"{total:.1f}":
        return ""
    if together <= total:
        return RULE.format(together=together, total=total)
    little = LITTLE if max(ceilings) < LITTLE_SHARE * together else ""
    return MORE.format(together=together, total=total) + little


def _ceiling(prediction: Prediction) -> dict[str, float]:
    """The gain of a prediction: median over its steps, its best and worst step, clipped at 0
    (removing a cause never costs time)."""
    time = prediction.step_time()
    steps = prediction.steps()
    gain = max(time.get("gain_ms", 0.0), 0.0)
    return {"ceiling_ms": round(gain, 3),
            "ceiling_pct": round(max(time.get("gain_pct", 0.0), 0.0), 2),
            "best_ms": round(float(np.maximum(steps["gain_ms"], 0).max()), 3) if len(steps)
            else 0.0,
            "worst_ms": round(float(np.maximum(steps["gain_ms"], 0).min()), 3) if len(steps)
            else 0.0}
