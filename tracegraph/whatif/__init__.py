"""What-if replay: re-time the dependency graph, edited, to predict what a fix gains.

    from tracegraph.whatif import DecoupleReduction, Straggler, predict
    prediction = predict(analysis, [DecoupleReduction(), Straggler("auto")])
    prediction.step_time()   # measured, predicted, gain, best and worst step

The layout: model.py (the DepGraph as a timing model), inferred.py (edges inferred by time),
engine.py (the topological pass), replay.py (steps read off a replay, replay error), subject.py
(what edits read), edits.py and reduction.py (the edits), predict.py, ceilings.py (gain ceilings
for analyze), summary.py (the JSON). docs/whatif.md describes the semantics.
"""

from tracegraph.whatif.edits import (
    EditError,
    RemoveWait,
    Scale,
    SeparateQueues,
    Straggler,
    parse_edits,
)
from tracegraph.whatif.predict import Prediction, predict
from tracegraph.whatif.reduction import CoupleReduction, DecoupleReduction

__all__ = ["CoupleReduction", "DecoupleReduction", "EditError", "Prediction", "RemoveWait",
           "Scale", "SeparateQueues", "Straggler", "parse_edits", "predict"]
