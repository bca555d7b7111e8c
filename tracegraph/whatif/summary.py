"""A `Prediction` as plain data: the documented JSON of `tracegraph whatif --json`
(docs/whatif.md), and its check against a measured after-bundle (`diff --predicted`)."""

from __future__ import annotations

import numpy as np

from tracegraph.verify import metrics
from tracegraph.whatif.predict import Prediction, Segment
from tracegraph.whatif.replay import MAX_ERROR, NS_PER_MS


def summarize_prediction(prediction: Prediction, *, top: int = 10) -> dict[str, object]:
    """Edits, replay error, steps and ranks predicted, the gain and its range, the bubbles that
    vanish and remain (`top` longest of each, all when top <= 0), the predicted critical path."""
    origin = prediction.analysis.origin
    errors = prediction.errors
    bubbles = prediction.bubbles().sort_values("measured_ms", ascending=False)
    gone = bubbles["state"] == "vanished"
    return {
        "source": str(prediction.analysis.trace.source),
        "edits": [{"edit": e.label, "change": c}
                  for e, c in zip(prediction.edits, prediction.changes, strict=True)],
        "replay": {"max_error_pct": _r(100 * errors["error"].max()) if len(errors) else 0.0,
                   "limit_pct": 100 * MAX_ERROR,
                   "errors": [{"rank": int(r), "step": int(s), "measured_ms": _r(m),
                               "replayed_ms": _r(p), "error_pct": _r(100 * e, 4)}
                              for r, s, m, p, e in errors.itertuples(index=False)]},
        "refused": {str(s): why for s, why in prediction.refused.items()},
        "step_time": {k: _r(v) for k, v in prediction.step_time().items()},
        "steps": [{k: (_r(v) if isinstance(v, float) else int(v)) for k, v in row.items()}
                  for row in prediction.steps().to_dict("records")],
        "ranks": [{"rank": int(r), "step": int(s), "measured_ms": _r(m), "predicted_ms": _r(p)}
                  for r, s, m, p in prediction.ranks().itertuples(index=False)],
        "bubbles": {"vanished": _bubbles(bubbles[gone], origin, top),
                    "remaining": _bubbles(bubbles[~gone], origin, top),
                    "counts": {str(k): int(v) for k, v in bubbles["state"].value_counts().items()}},
        "critical_path": {str(step): _path(prediction.critical_path(step), origin)
                          for step in prediction.predicted},
        "notes": prediction.subject.model.notes,
    }


def check_prediction(predicted: dict[str, object], after) -> dict[str, object]:
    """A saved prediction (`whatif --json`) against the measured after-analysis: step time
    and each rank's, predicted and measured, the prediction's error, and how much of the
    predicted gain the fix delivered."""
    measured = metrics.step_time_ms(after)
    time = predicted.get("step_time") or {}
    forecast = time.get("predicted_ms")
    before = time.get("measured_ms")
    ranks_after = metrics.rank_step_ms(after)
    ranks_predicted: dict[int, list[float]] = {}
    for row in predicted.get("ranks", []):
        ranks_predicted.setdefault(int(row["rank"]), []).append(float(row["predicted_ms"]))
    rows = [{"rank": rank, "predicted_ms": _r(float(np.median(values))),
             "measured_ms": _r(ranks_after.get(rank)),
             "error_pct": _pct(float(np.median(values)), ranks_after.get(rank))}
            for rank, values in sorted(ranks_predicted.items())]
    gain = (before - forecast) if before is not None and forecast is not None else None
    got = (before - measured) if before is not None else None
    return {"source": predicted.get("source"), "edits": predicted.get("edits", []),
            "before_ms": before, "predicted_ms": forecast, "measured_ms": _r(measured),
            "error_pct": _pct(forecast, measured), "predicted_gain_ms": _r(gain),
            "measured_gain_ms": _r(got),
            "delivered_pct": _r(100 * got / gain) if gain and got is not None else None,
            "ranks": rows}


def _bubbles(table, origin: int, top: int) -> list[dict[str, object]]:
    shown = table if top <= 0 else table.head(top)
    return [{"rank": int(b.rank), "lane": b.lane, "step": int(b.step), "name": b.name,
             "start_ms": _r((b.start - origin) / NS_PER_MS), "measured_ms": _r(b.measured_ms),
             "predicted_ms": _r(b.predicted_ms), "state": b.state, "category": b.category}
            for b in shown.itertuples(index=False)]


def _path(path: list[Segment], origin: int) -> dict[str, object]:
    by_kind: dict[str, float] = {}
    for seg in path:
        by_kind[seg.kind] = by_kind.get(seg.kind, 0.0) + (seg.end - seg.start) / NS_PER_MS
    return {"length_ms": _r(sum(s.end - s.start for s in path) / NS_PER_MS),
            "by_kind": {k: _r(v) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "segments": [{"rank": s.rank, "lane": s.lane, "name": s.name, "kind": s.kind,
                          **({"category": s.category} if s.category else {}),
                          "start_ms": _r((s.start - origin) / NS_PER_MS),
                          "end_ms": _r((s.end - origin) / NS_PER_MS)} for s in path]}


def _pct(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not measured:
        return None
    return _r(100 * (predicted - measured) / measured, 2)


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), digits)
