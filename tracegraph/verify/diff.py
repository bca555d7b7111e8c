"""Two analyses side by side: did a fix make the step faster, and why.

`compare(before, after)` returns plain data (the documented JSON of `tracegraph diff --json`):
step time (the slowest rank's step, median over steps) overall and per rank, bubble time per
root-cause category, critical-path composition, communication/compute overlap per group kind, the
chains that disappeared, shrank, grew or appeared, and a verdict. Chains are matched across the two
profiles by (waiting rank, category, root rank, root lane, root op without instance numbers).
"""

from __future__ import annotations

import math

from tracegraph.analysis.analyze import Analysis
from tracegraph.analysis.blame import Bubble
from tracegraph.verify import metrics

UNCHANGED_PCT = 2.0  # step-time changes within this are "unchanged"
CHAIN_FLOOR_SHARE = 0.01  # chains under this share of the step time count as absent
CHAIN_CHANGE_SHARE = 0.10  # a chain shrank or grew when it changed by this share (and the floor)
CHAIN_STATES = ("disappeared", "shrank", "grew", "appeared")


def profile(analysis: Analysis) -> dict[str, object]:
    """The numbers of one profile that a diff compares."""
    overlap = metrics.overlap_table(analysis)
    return {
        "source": str(analysis.trace.source),
        "step_ms": _r(metrics.step_time_ms(analysis)),
        "steps": {str(s): _r(ms) for s, ms in metrics.step_ms(analysis).items()},
        "ranks": {str(r): _r(ms) for r, ms in metrics.rank_step_ms(analysis).items()},
        "bubble_ms": _rounded(metrics.bubble_ms(analysis)),
        "rank_bubble_ms": {str(r): _rounded(c)
                           for r, c in metrics.rank_bubble_ms(analysis).items()},
        "critical_path_ms": {k: _rounded(v)
                             for k, v in metrics.critical_path_ms(analysis).items()},
        "overlap": _rounded(metrics.overlap_ratios(analysis, table=overlap), 4),
        "comm_ms": _rounded((overlap.groupby("dim")["comm_ms"].sum()
                             / metrics.step_count(analysis)).to_dict()),
    }


def compare(before: Analysis, after: Analysis, *, top: int = 5,
            min_chain_ms: float | None = None) -> dict[str, object]:
    """The diff of two analyses (see the module docstring)."""
    old, new = profile(before), profile(after)
    floor = min_chain_ms if min_chain_ms is not None else max(
        1.0, CHAIN_FLOOR_SHARE * max(_finite(old["step_ms"]), _finite(new["step_ms"])))
    return {
        "before": old,
        "after": new,
        "step_time": _change(old["step_ms"], new["step_ms"]),
        "verdict": verdict(old["step_ms"], new["step_ms"]),
        "ranks": _rows("rank", old["ranks"], new["ranks"]),
        "bubbles": _rows("category", old["bubble_ms"], new["bubble_ms"]),
        "critical_path": _rows("kind", old["critical_path_ms"]["kind"],
                               new["critical_path_ms"]["kind"]),
        "overlap": _overlap_rows(old, new),
        "min_chain_ms": _r(floor),
        "chains": chain_changes(before, after, floor, top),
    }


def verdict(before_ms: float, after_ms: float, unchanged_pct: float = UNCHANGED_PCT) -> str:
    """improved, regressed or unchanged: the step-time change against a noise band."""
    change = change_pct(before_ms, after_ms)
    if change is None:
        return "unchanged"
    if change < -unchanged_pct:
        return "improved"
    return "regressed" if change > unchanged_pct else "unchanged"


def change_pct(before_ms: float, after_ms: float) -> float | None:
    """Relative change in percent (positive: slower), None when either side is unknown."""
    if not (_ok(before_ms) and _ok(after_ms)) or before_ms <= 0:
        return None
    return 100.0 * (after_ms - before_ms) / before_ms


def regressed_beyond(report: dict[str, object], threshold_pct: float) -> bool:
    """Whether the step time got worse by more than `threshold_pct` percent."""
    change = report["step_time"]["change_pct"]
    return change is not None and change > threshold_pct


def chain_changes(before: Analysis, after: Analysis, floor_ms: float, top: int
                  ) -> dict[str, list[dict[str, object]]]:
    """The top chains per state: disappeared, shrank, grew, appeared (ms per step)."""
    keys = ["rank", "category", "root_rank", "root_lane", "root_op"]
    old = metrics.chain_table(before).set_index(keys)
    new = metrics.chain_table(after).set_index(keys)
    found: dict[str, list[dict[str, object]]] = {state: [] for state in CHAIN_STATES}
    for key in old.index.union(new.index):
        was = float(old.at[key, "ms"]) if key in old.index else 0.0
        now = float(new.at[key, "ms"]) if key in new.index else 0.0
        state = _chain_state(was, now, floor_ms)
        if state:
            later = state in ("grew", "appeared")
            example = (new if later else old).at[key, "example"]
            found[state].append(_chain(dict(zip(keys, key, strict=True)), was, now, example,
                                       (after if later else before).origin))
    for state, chains in found.items():
        chains.sort(key=lambda c: abs(c["change_ms"]), reverse=True)
        found[state] = chains[:top] if top > 0 else chains
    return found


def _chain_state(was: float, now: float, floor: float) -> str:
    if was >= floor > now:
        return "disappeared"
    if now >= floor > was:
        return "appeared"
    if min(was, now) < floor or abs(now - was) < max(floor, CHAIN_CHANGE_SHARE * was):
        return ""
    return "grew" if now > was else "shrank"


def _chain(key: dict[str, object], was: float, now: float, example: Bubble,
           origin: int) -> dict[str, object]:
    return {
        "rank": int(key["rank"]), "category": key["category"],
        "root": {"rank": int(key["root_rank"]), "lane": key["root_lane"], "op": key["root_op"]},
        "before_ms": _r(was), "after_ms": _r(now), "change_ms": _r(now - was),
        "chain": example.chain(),
        "example": {"step": example.step, "lane": example.lane, "name": example.name,
                    "start_ms": _r((example.start - origin) / metrics.NS_PER_MS),
                    "dur_ms": _r(example.dur / metrics.NS_PER_MS)},
    }


def _change(before_ms: float, after_ms: float) -> dict[str, object]:
    pct = change_pct(before_ms, after_ms)
    delta = after_ms - before_ms if _ok(before_ms) and _ok(after_ms) else None
    return {"before_ms": before_ms, "after_ms": after_ms, "change_ms": _r(delta),
            "change_pct": _r(pct, 2)}


def _rows(key: str, old: dict[str, float], new: dict[str, float]) -> list[dict[str, object]]:
    names = list(dict.fromkeys([*old, *new]))
    rows = [{key: name, **_change(old.get(name, 0.0), new.get(name, 0.0))} for name in names]
    if key == "rank":
        rows.sort(key=lambda row: int(row["rank"]))
    return rows


def _overlap_rows(old: dict[str, object], new: dict[str, object]) -> list[dict[str, object]]:
    dims = sorted(set(old["overlap"]) | set(new["overlap"]))
    return [{"dim": dim, "before": old["overlap"].get(dim), "after": new["overlap"].get(dim),
             "before_comm_ms": old["comm_ms"].get(dim, 0.0),
             "after_comm_ms": new["comm_ms"].get(dim, 0.0)} for dim in dims]


def _rounded(values: dict[str, float], digits: int = 3) -> dict[str, float]:
    return {k: _r(v, digits) for k, v in values.items()}


def _r(value: float | None, digits: int = 3) -> float | None:
    return round(float(value), digits) if _ok(value) else None


def _ok(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _finite(value: float | None) -> float:
    return float(value) if _ok(value) else 0.0
