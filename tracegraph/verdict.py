"""The verdict: what an engineer reads first about a bundle, in ten seconds.

The step time (the median over steps of the slowest rank's) and each step's slowest rank; the
causes that held the step back, largest first — the
slowest rank's stalls (its bubbles, decomposed as blame charges them) and, when it is a
straggler itself, its own compute's excess over its peers', grouped by origin (rank, lane, op,
or the group whose absent members it waited on), each with its share of the step and how sure
the chain is. A share is the cause's share of each step's time, averaged over the steps (each step
weighs the same, as in the median), and its ms per step that share of the headline step time: the
shares add up to the stalled share, and a warm-up step of several times the others moves them no
more than any other step does; the fix for the largest cause that is not the schedule's own and
what replaying the dependency graph says it gains (a named `whatif` fix where one applies, else
the cause's gain ceiling); the longest stalls and their origin; whom to profile when the origin
is outside the bundle; and the one finding that costs the most.

Plain data (the `verdict` of `analyze --json`); reports/verdict.py renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracegraph import causes
from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.analysis.stragglers import median_of_others, name_medians
from tracegraph.loading.groups import distinct_labels
from tracegraph.verify import metrics
from tracegraph.whatif.ceilings import NO_FIX, gain_ceilings, subject_of
from tracegraph.whatif.edits import fixes
from tracegraph.whatif.predict import predict

NS_PER_MS = 1e6
SHOWN_MS = 0.05  # origins of less per step than this round to nothing: left out
TOP_ORIGINS = 3  # origins listed per category
TOP_STALLS = 3  # longest stalls named
STRAGGLER_SHARE = 0.1  # a rank holding this share of the straggling compute is named a straggler
INHERENT = (causes.PIPELINE_FILL, causes.PEER_COMPUTE, causes.OWN_COMPUTE)
"""Categories that are the job's own work or schedule: listed, never the cause to fix."""
NAMED_FIXES = {causes.DP_REDUCTION: ("decouple-reduction", "separate-queues"),
               **dict.fromkeys((causes.EP_ALLTOALL, causes.TP_COLLECTIVE, causes.CP_COLLECTIVE,
                                causes.COLLECTIVE, causes.PP_P2P), ("separate-queues",))}
"""The `whatif --fix` edits that may remove a cause, tried in order where they apply."""
EVIDENCE = {"separate-queues": "serialized_streams"}
"""The finding a named fix needs before it is tried (a hardware queue shared by streams is
inferred by time, and such a fix moves more than the cause)."""
LEVELS = ("low", "medium", "high")
WEIGHTY = 0.25  # a category is as sure as its least sure part of this share of it at least


@dataclass(frozen=True)
class Cause:
    """Part of a bubble charged to one origin: `group` is the group whose members absent from
    the bundle it waited on ("" if none); rank, lane and name are those of its longest piece."""

    category: str
    rank: int
    lane: str
    name: str
    group: str
    ns: int
    share: float  # of the bubble


def bubble_causes(bubble: Bubble) -> list[Cause]:
    """A bubble's causes, its root first (`Bubble.causes`)."""
    return [Cause(c.category, c.rank, c.lane, c.name, c.group, c.ns, c.share)
            for c in bubble.causes()]


def verdict(analysis: Analysis, *, findings: list[dict[str, object]] = (),
            pipeline: dict[str, object] | None = None, step: int | None = None
            ) -> dict[str, object]:
    """The verdict of `analysis` (one `step`, or all): `findings` as `Finding.as_dict` gives
    them, `pipeline` as `Pipeline.as_dict` (its bubble ratio beside the schedule's fill)."""
    steps = _slowest_ranks(analysis, step)
    if steps.empty:
        return {"steps": [], "causes": [], "stalls": [], "profile": [], "fix": {},
                "finding": _finding([], findings, {}), "notes": ["no step and no timeline"]}
    origins = _Origins(analysis)
    notes = []
    for row in steps.itertuples(index=False):
        origins.add_step(int(row.step), int(row.rank), float(row.ms))
        if row.stated_rank >= 0:
            notes.append(f"step {row.step}: rank {row.stated_rank}'s step ({row.stated_ms:.1f} "
                         f"ms) is from its step table (no timeline): causes are those of rank "
                         f"{row.rank}, the slowest with a timeline")
    step_ms = float(np.median(steps["ms"]))
    listed = origins.causes(step_ms, len(steps), pipeline)
    fix = _fix(analysis, listed, {f["kind"] for f in findings})
    stalled = origins.stalled_share(len(steps))
    return {
        "step_ms": round(step_ms, 3),
        "steps": [{"step": int(r.step), "ms": round(float(r.ms), 3), "slowest_rank": int(r.rank),
                   "stalled_ms": round(origins.stalled_ns.get(int(r.step), 0) / NS_PER_MS, 3)}
                  for r in steps.itertuples(index=False)],
        "threshold_ms": analysis.threshold_ms,
        "stalled_share": round(stalled, 4),
        "stalled_ms": round(stalled * step_ms, 3),
        "causes": listed,
        "stalls": origins.stalls(step),
        "fix": fix,
        "profile": origins.to_profile(),
        "finding": _finding(listed, findings, fix, [
            (int(s), int(r)) for s, r in analysis.step_stragglers[["step", "rank"]].itertuples(
                index=False) if step is None or s == step]),
        "notes": notes,
        "group_labels": origins.lane_labels(),
    }


def _slowest_ranks(analysis: Analysis, step: int | None) -> pd.DataFrame:
    """step, ms, rank (the slowest with a timeline), stated_rank / stated_ms (a slower rank
    whose step is from its step table, -1 if none) of each step (or `step` alone)."""
    times = metrics.step_times(analysis)
    if step is not None:
        times = times[times["step"] == step]
    rows = []
    for s, mine in times.groupby("step"):
        timed = mine[~mine["stated"]]
        if timed.empty:
            continue
        slowest, slowest_timed = mine.loc[mine["ms"].idxmax()], timed.loc[timed["ms"].idxmax()]
        stated = bool(slowest["stated"])
        rows.append((int(s), float(slowest["ms"]), int(slowest_timed["rank"]),
                     int(slowest["rank"]) if stated else -1, float(slowest["ms"])))
    return pd.DataFrame(rows, columns=["step", "ms", "rank", "stated_rank", "stated_ms"])


class _Origins:
    """The causes of the steps' slowest ranks, summed by origin over the steps."""

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis
        self.excess = straggling_excess(analysis)
        self.step_excess = step_excess(analysis)
        self.labels = distinct_labels(analysis.trace.groups)
        self.members = analysis.trace.group_members()
        self.present = set(analysis.trace.rank_ids)
        self.ns: dict[tuple, float] = {}  # per origin: its ns over the steps
        self.shares: dict[tuple, float] = {}  # per origin: its shares of the steps, summed
        self.where: dict[tuple, Cause] = {}  # an origin's heaviest cause
        self.sureness: dict[str, list[tuple[int, str, str]]] = {}  # category -> (ns, level, why)
        self.stalled_ns: dict[int, int] = {}
        self.step_ns: dict[int, float] = {}

    def add_step(self, step: int, rank: int, ms: float) -> None:
        """The slowest `rank`'s bubbles in `step` (`ms` long), and its own straggling compute."""
        bubbles = [b for b in self.analysis.bubbles if b.step == step and b.rank == rank]
        self.stalled_ns[step] = sum(b.dur for b in bubbles)
        self.step_ns[step] = ms * NS_PER_MS
        for bubble in bubbles:
            for cause in bubble_causes(bubble):
                self._add(cause, step, bubble.sureness, bubble.evidence)
        for seg, ns in _own_straggling(self.analysis, step, rank, bubbles):
            share = max(self.excess.get((seg.name, seg.rank), 1.0),
                        self.step_excess.get((step, seg.rank), 0.0))
            excess = round(ns * share)
            self._add(Cause(causes.COMPUTE_STRAGGLER, seg.rank, seg.lane, seg.name, "", excess,
                            1.0), step, *self.analysis.straggling_sureness(seg.rank))

    def stalled_share(self, steps: int) -> float:
        """The slowest ranks' stalls' share of their step, averaged over the steps."""
        return sum(ns / self.step_ns[s] for s, ns in self.stalled_ns.items()
                   if self.step_ns[s] > 0) / steps

    def _add(self, cause: Cause, step: int, sureness: str, evidence: str) -> None:
        if cause.ns <= 0:
            return
        key = (cause.category,) if cause.category in INHERENT else (
            (cause.category, cause.group) if cause.group else
            (cause.category, cause.rank, cause.lane))
        self.ns[key] = self.ns.get(key, 0.0) + cause.ns
        if self.step_ns[step] > 0:
            self.shares[key] = self.shares.get(key, 0.0) + cause.ns / self.step_ns[step]
        if key not in self.where or cause.ns > self.where[key].ns:
            self.where[key] = cause
        self.sureness.setdefault(cause.category, []).append((cause.ns, sureness, evidence))

    def causes(self, step_ms: float, steps: int, pipeline: dict | None) -> list[dict]:
        """Per category, largest first: its share of the step (averaged over the steps), that
        share of `step_ms` (the headline step time) as ms per step, how sure, and its origins
        (the TOP_ORIGINS largest; the rest counted)."""
        share = {k: self.shares.get(k, 0.0) / steps for k in self.ns}
        by_category: dict[str, list[tuple]] = {}
        shown = [k for k in share if share[k] * step_ms >= SHOWN_MS]
        for key in sorted(shown, key=lambda k: -share[k]):
            by_category.setdefault(key[0], []).append(key)
        rows = []
        for category, keys in by_category.items():
            whole = sum(share[k] for k in keys)
            sureness, evidence = self._least_sure(category, sum(self.ns[k] for k in keys))
            row = {"category": category, "ms": round(whole * step_ms, 3),
                   "share": round(whole, 4),
                   "inherent": category in INHERENT, "confidence": sureness,
                   **({"no_fix": NO_FIX[category]} if category in INHERENT else {}),
                   "evidence": evidence,
                   "origins": [self._origin(k, share[k], step_ms) for k in keys[:TOP_ORIGINS]],
                   "more_origins": len(keys[TOP_ORIGINS:]),
                   "more_ms": round(sum(share[k] for k in keys[TOP_ORIGINS:]) * step_ms, 3)}
            if category == causes.PIPELINE_FILL and pipeline and pipeline.get("steps"):
                ratio = pipeline["steps"][0]
                row["bubble_ratio"] = {"measured": ratio["measured"], "theory": ratio["theory"]}
            rows.append(row)
        return sorted(rows, key=lambda r: -r["ms"])

    def _least_sure(self, category: str, ns: float) -> tuple[str, str]:
        """How sure a category's time is: its least sure part of WEIGHTY of it at least."""
        parts = self.sureness[category]
        weighty = [c for c in parts if c[0] >= WEIGHTY * ns] or [max(parts)]
        _, level, evidence = min(weighty, key=lambda c: LEVELS.index(c[1]))
        return level, evidence

    def _origin(self, key: tuple, share: float, step_ms: float) -> dict[str, object]:
        return {**self.described(self.where[key]), "ms": round(share * step_ms, 3),
                "share": round(share, 4)}

    def described(self, cause: Cause) -> dict[str, object]:
        """Where a cause lies: rank, lane, op, and the group with absent members it waited on
        (its label, how many of its members the bundle lacks)."""
        where = {"rank": cause.rank, "lane": cause.lane, "name": cause.name}
        if cause.group:
            where |= {"group": cause.group,
                      "group_label": self.labels.get(cause.group, cause.group),
                      "absent_count": len(self.absent(cause.group))}
        return where

    def lane_labels(self) -> dict[str, str]:
        """Group id -> label of the groups whose ids name the lanes of the causes (HCCL
        planes), for the reports to name them."""
        lanes = " ".join(c.lane for c in self.where.values())
        return {g: label for g, label in self.labels.items() if g != label and g in lanes}

    def absent(self, group: str) -> list[int]:
        """The members of `group` absent from the bundle ([] when the profile does not name
        them)."""
        return [r for r in self.members.get(group, ()) if r not in self.present]

    def stalls(self, step: int | None) -> list[dict[str, object]]:
        """The longest bubbles of any rank (of `step`), each with its largest cause."""
        bubbles = [b for b in self.analysis.bubbles if step is None or b.step == step]
        out = []
        for bubble in bubbles[:TOP_STALLS]:
            cause = next(iter(bubble_causes(bubble)), None)
            origin = {} if cause is None else {"category": cause.category,
                                               **self.described(cause),
                                               "share": round(cause.share, 4)}
            out.append({"rank": bubble.rank, "lane": bubble.lane, "name": bubble.name,
                        "step": bubble.step, "ms": round(bubble.dur / NS_PER_MS, 3),
                        "category": bubble.category, "confidence": bubble.sureness,
                        "origin": origin})
        return out

    def to_profile(self) -> list[dict[str, object]]:
        """The groups whose absent members the causes waited on, largest first (a group
        waited on by several categories of communication once, with their time together)."""
        waited: dict[str, float] = {}
        for key, ns in self.ns.items():
            if len(key) == 2 and key[1]:
                waited[key[1]] = waited.get(key[1], 0) + ns
        largest = sorted(waited.items(), key=lambda kv: -kv[1])
        return [{"group": g, "group_label": self.labels.get(g, g), "ms": round(ns / NS_PER_MS, 3),
                 "ranks": self.absent(g)} for g, ns in largest]


def straggling_excess(analysis: Analysis) -> dict[tuple[str, int], float]:
    """(op name, rank) -> the share of that rank's median time for the name in excess of its
    peers' median (the ranks doing the same work), where the peers run it too; a name only its
    rank runs is all excess. The medians are taken rank by rank where the ranks lie."""
    medians = analysis.table_by_part(_name_medians)
    cls = medians["rank"].map(analysis.peers.classes)
    medians = medians[cls.notna().to_numpy()]
    if medians.empty:
        return {}
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([medians["name"], cls.dropna()]))
    own = medians["median"].to_numpy(dtype=float)
    others = median_of_others(own, codes)
    share = np.where(np.isnan(others), 1.0, np.clip(1 - others / np.maximum(own, 1), 0, 1))
    return dict(zip(zip(medians["name"], medians["rank"].astype(int), strict=True), share,
                    strict=True))


def step_excess(analysis: Analysis) -> dict[tuple[int, int], float]:
    """(step, rank) -> the share of a step straggler's work there in excess of its peers'
    median in that step: a straggler that rotates between ranks runs the same ops as its peers
    over the profile (none in excess by name), but not in its step."""
    table = analysis.step_stragglers
    return {(int(s), int(r)): max(1 - p / w, 0.0) if w > 0 else 0.0
            for s, r, w, p in table[["step", "rank", "work_ms", "peers_ms"]].itertuples(
                index=False)}


def _name_medians(part: Analysis) -> pd.DataFrame:
    return name_medians(part.ops)


def _own_straggling(analysis: Analysis, step: int, rank: int, bubbles: list[Bubble]
                    ) -> list[tuple[object, int]]:
    """The slowest rank's own straggling compute on the step's critical path (segments on it
    charged to compute_straggler), less what its bubbles already count."""
    path = analysis.critical_paths.get(step, [])
    spans = [(b.start, b.end) for b in bubbles]
    out = []
    for seg in path:
        if seg.rank != rank or seg.category != causes.COMPUTE_STRAGGLER:
            continue
        covered = sum(max(0, min(seg.end, hi) - max(seg.start, lo)) for lo, hi in spans)
        if seg.end - seg.start - covered > 0:
            out.append((seg, seg.end - seg.start - covered))
    return out


def _fix(analysis: Analysis, listed: list[dict], found: set[str]) -> dict[str, object]:
    """The fix for the largest cause that is not the job's own work, and its replayed gain: a
    named `whatif --fix` that applies and gains, else the cause's gain ceiling."""
    target = next((c for c in listed if c["category"] not in NO_FIX), None)
    if target is None:
        return {"why": "no stall a fix is modelled for: what held the step back is the job's "
                       "own work, or time the walk could not explain"
                       if listed else "no stall on the slowest rank to remove"}
    category = target["category"]
    if why := analysis.no_replay():
        return {"cause": category, "why": why}
    ceilings = gain_ceilings(analysis)
    if ceilings.get("refused"):  # the replay itself cannot run (lost events, a cycle)
        return {"cause": category, "why": "; ".join(ceilings["refused"])}
    row = next((r for r in ceilings.get("causes", []) if r["category"] == category), None)
    ceiling = row.get("ceiling_ms") if row else None
    named = _named_fix(analysis, category, found)
    if named is not None:
        return {"cause": category, **named, "ceiling_ms": ceiling}
    if row is None:
        return {"cause": category, "why": "no edit models its removal"}
    if ceiling is None:
        return {"cause": category, "why": row["why"]}
    return {"cause": category, "edit": row["edit"], "gain_ms": ceiling,
            "gain_pct": row["ceiling_pct"], "ceiling_ms": ceiling}


def _named_fix(analysis: Analysis, category: str, found: set[str]) -> dict[str, object] | None:
    """The first named fix for `category` whose evidence was `found`, that changes the model
    and gains time by replay."""
    subject = subject_of(analysis)
    named = fixes()
    for name in NAMED_FIXES.get(category, ()):
        if name in EVIDENCE and EVIDENCE[name] not in found:
            continue
        edit = named[name]
        edited, change = edit.apply(subject, subject.model)
        if edited is subject.model:
            continue
        time = predict(subject, [edit], threshold_ms=analysis.threshold_ms).step_time()
        if time and time["gain_ms"] > 0:
            return {"fix": name, "edit": edit.label, "change": change,
                    "measured_ms": round(time["measured_ms"], 3),
                    "predicted_ms": round(time["predicted_ms"], 3),
                    "gain_ms": round(time["gain_ms"], 3), "gain_pct": round(time["gain_pct"], 2)}
    return None


def _finding(listed: list[dict], findings: list[dict], fix: dict,
             by_step: list[tuple[int, int]] = ()) -> dict | None:
    """The finding that costs the most per step: a compute straggler (the time the step spent
    on it) or a warning finding (its exposed ms); None when nothing warns. `by_step`: each
    step's stragglers (step, rank)."""
    candidates = []
    straggler = next((c for c in listed if c["category"] == causes.COMPUTE_STRAGGLER), None)
    if straggler is not None:
        origin = straggler["origins"][0]
        gain = (f"; at the peers' speed the step would be {fix['gain_ms']:.1f} ms shorter by "
                "replay" if fix.get("cause") == causes.COMPUTE_STRAGGLER and "gain_ms" in fix
                else "")
        candidates.append((straggler["ms"], {
            "kind": "compute_straggler", "severity": "warning",
            "title": f"{_who_straggles(straggler, by_step)}: the step spends "
                     f"{100 * straggler['share']:.0f} % of its time on slow compute (most "
                     f"in {origin['name'][:60]}){gain}",
            "impact_ms": straggler["ms"]}))
    for found in findings:
        if found["severity"] == "warning":
            impact = _impact_ms(found)
            candidates.append((impact, {"kind": found["kind"], "severity": "warning",
                                        "title": found["title"], "impact_ms": impact}))
    if not candidates:
        return None
    return max(candidates, key=lambda c: c[0])[1]


def _who_straggles(straggler: dict, by_step: list[tuple[int, int]]) -> str:
    """Which ranks the straggling compute is on: one, several, or a different one per step."""
    ranks = list(dict.fromkeys(o["rank"] for o in straggler["origins"]
                               if o["ms"] >= STRAGGLER_SHARE * straggler["ms"])) or [
        straggler["origins"][0]["rank"]]
    if len({r for _, r in by_step}) > 1:
        steps = ", ".join(f"rank {r} in step {s}" for s, r in by_step[:TOP_ORIGINS + 1])
        more = f", … {len(by_step) - TOP_ORIGINS - 1} more" if len(by_step) > TOP_ORIGINS + 1 \
            else ""
        return f"a different rank straggles in each step ({steps}{more})"
    if len(ranks) > 1:
        return f"ranks {', '.join(map(str, ranks))} are compute stragglers"
    return f"rank {ranks[0]} is a compute straggler"


def _impact_ms(finding: dict[str, object]) -> float:
    """What a warning finding costs per step, as its evidence states it (0 if it does not)."""
    evidence = finding.get("evidence") or {}
    if "exposed_ms_per_step" in evidence:
        return float(evidence["exposed_ms_per_step"])
    worst = [d.get("worst_exposed_ms", 0.0) for d in (evidence.get("by_dim") or {}).values()]
    return float(max(worst, default=0.0))
