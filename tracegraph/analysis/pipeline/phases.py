"""Forward and backward work told apart by op names, learned from the trace itself.

Where P2P messages say which phase some work is (`boundaries.lane_work`), the names of its ops
are counted: a name in most forward stretches and few backward ones marks forward work
(`flash_fwd`, `RmsNorm`), and the other way round (`*Grad`, `MmBackward0`); names in both say
nothing. Names that never recur within a step (the optimizer's, a one-off copy) are no
pipeline work. The ops of each stretch between P2P boundaries then get the likeliest sequence
of phases (forward / backward / other, each change costly), and the blocks are its runs of one
phase: where no message separates a forward from a backward (the last stage's loss and its
backward, the first stage's last backward of a chunk and its next forward), the names split
them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracegraph.analysis.pipeline.blocks import B, F

OTHER = "O"
STATES = np.array([F, B, OTHER])
SMOOTH = 0.05  # added to each share so that a name seen in one phase only scores finitely
CLIP = 3.0  # strongest score of a single name
SHARED = 1.0  # |score| below this: a name of both phases
MISFIT = 1.0  # score of a pipeline name as "other", or of a foreign name as F or B
SWITCH = 4.0  # cost of changing phase between two ops with no P2P boundary between them
MAX_SWITCHES = 3  # within one stretch: other, forward, backward, other at most
EVIDENCE = 0.5  # weight of what the nearest P2P boundaries say, beside the names


def name_scores(work: pd.DataFrame) -> pd.Series:
    """name_id -> log odds of forward over backward among the stretches P2P evidence labels
    (share of forward stretches holding the name vs of backward ones); NaN for names that
    never occur in two stretches of one rank and step."""
    labelled = work[work["evidence"].isin([F, B])]
    stretch = ["rank", "step", "cut", "evidence"]
    present = labelled.drop_duplicates([*stretch, "name_id"])
    counts = present.groupby(["name_id", "evidence"]).size().unstack(fill_value=0).reindex(
        columns=[F, B], fill_value=0)
    stretches = labelled.drop_duplicates(stretch)["evidence"].value_counts()
    share = counts / np.maximum(stretches.reindex([F, B], fill_value=0).to_numpy(), 1)
    score = np.log((share[F] + SMOOTH) / (share[B] + SMOOTH)).clip(-CLIP, CLIP)
    recurring = present.groupby(["name_id", "rank", "step"]).size().groupby("name_id").max() >= 2
    return score.where(recurring.reindex(score.index, fill_value=False))


def phase_path(work: pd.DataFrame) -> np.ndarray:
    """The likeliest phase (F, B or O) of each op of one rank's step (ops in time order, each
    with its name's `score`), each stretch between P2P boundaries on its own."""
    emit = _emissions(work)
    cut = work["cut"].to_numpy()
    path = np.empty(len(work), dtype=np.int8)
    bounds = np.flatnonzero(np.diff(cut)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(cut)], strict=True):
        path[lo:hi] = _best_path(emit[lo:hi])
    return STATES[path]


def _best_path(emit: np.ndarray) -> np.ndarray:
    """State indices of one stretch maximizing its emissions less SWITCH per change, with at
    most MAX_SWITCHES changes: exact dynamic programming over the number of changes, each
    level vectorized over positions (the best place to switch into a state is a running max)."""
    n, states = emit.shape
    total = np.vstack([np.zeros(states), np.cumsum(emit, axis=0)])  # total[i]: ops before i
    best, levels = total, []  # best[i, t]: the ops before i, the last in state t
    diagonal = np.arange(states)
    for _ in range(MAX_SWITCHES):
        enter = best[:, :, None] - total[:, None, :] - SWITCH  # [i, from, to]: switch at i
        enter[:, diagonal, diagonal] = -np.inf
        source, value = enter.argmax(axis=1), enter.max(axis=1)
        at = _running_argmax(value)
        switched = total + np.take_along_axis(value, at, axis=0)
        levels.append((at, source, switched > best))
        best = np.maximum(best, switched)
    state, i = int(best[n].argmax()), n
    path = np.empty(n, dtype=np.int8)
    for at, source, took in reversed(levels):
        if took[i, state]:
            j = int(at[i, state])
            path[j:i] = state
            state, i = int(source[j, state]), j
    path[:i] = state
    return path


def _running_argmax(values: np.ndarray) -> np.ndarray:
    """Per column, the row of the largest value so far (the latest on ties)."""
    rows = np.arange(len(values))[:, None]
    hit = values == np.maximum.accumulate(values, axis=0)
    return np.maximum.accumulate(np.where(hit, rows, 0), axis=0)


def _emissions(work: pd.DataFrame) -> np.ndarray:
    """Per op, the score of F, B and O: its name's, plus a little for what P2P says."""
    score = work["score"].to_numpy(dtype=float)
    pipeline = ~np.isnan(score)
    score = np.nan_to_num(score) / 2
    said = work["evidence"].to_numpy()
    emit = np.empty((len(work), len(STATES)))
    emit[:, 0] = np.where(pipeline, score, -MISFIT) + EVIDENCE * (said == F)
    emit[:, 1] = np.where(pipeline, -score, -MISFIT) + EVIDENCE * (said == B)
    emit[:, 2] = np.where(pipeline, -MISFIT, 0.0)
    return emit


def blocks(work: pd.DataFrame) -> pd.DataFrame:
    """One rank's step (its ops with their names' `score`): step, phase, start, end, ops (op
    indices) of its forward and backward blocks. A block must start at a boundary that starts
    work or end at one that ends it; at an end that neither such a boundary nor a kept
    neighbour marks it loses the ops that are not typical of its phase."""
    work = work.sort_values("start", kind="stable").reset_index(drop=True)
    work = work.assign(phase=phase_path(work))
    runs = _runs(work)
    out = []
    for run in runs[runs["kept"]].itertuples():
        ops = work.iloc[run.lo:run.hi]
        typical = np.flatnonzero(_typical(ops))
        lo = typical[0] if run.open_start and len(typical) else 0
        hi = typical[-1] + 1 if run.open_end and len(typical) else len(ops)
        ops = ops.iloc[lo:hi]
        out.append((int(ops["step"].iloc[0]), run.phase, int(ops["start"].min()),
                    int(ops["end"].max()), ops["op"].to_numpy()))
    return pd.DataFrame(out, columns=["step", "phase", "start", "end", "ops"])


def _runs(work: pd.DataFrame) -> pd.DataFrame:
    """The runs of one phase between P2P boundaries (positions lo:hi in `work`), whether each
    is kept (it starts its stretch at a boundary that starts work, or ends it at one that ends
    work), and whether its start / end is open (marked by neither such a boundary nor a kept
    neighbour in its stretch)."""
    phase, cut = work["phase"].to_numpy(), work["cut"].to_numpy()
    new = np.ones(len(work), dtype=bool)
    new[1:] = (phase[1:] != phase[:-1]) | (cut[1:] != cut[:-1])
    lo = np.flatnonzero(new)
    hi = np.append(lo[1:], len(work))
    runs = pd.DataFrame({"lo": lo, "hi": hi, "phase": phase[lo], "cut": cut[lo]})
    first = ~runs["cut"].duplicated(keep="first")
    last = ~runs["cut"].duplicated(keep="last")
    starts = first & work["opened"].to_numpy()[lo]
    ends = last & work["closing"].to_numpy()[hi - 1]
    kept = (starts | ends) & (runs["phase"] != OTHER)
    same = runs["cut"].shift(1) == runs["cut"]
    prev_kept = kept.shift(1, fill_value=False) & same
    next_kept = kept.shift(-1, fill_value=False) & (runs["cut"].shift(-1) == runs["cut"])
    return runs.assign(kept=kept, open_start=~starts & ~prev_kept, open_end=~ends & ~next_kept)


def _typical(ops: pd.DataFrame) -> np.ndarray:
    """Ops that are surely the block's phase: those autograd ties to a forward or backward
    where the profiler records it (the optimizer's and data loading's ops have no sequence
    number), else those whose name is typical of the phase."""
    autograd = ops["autograd"].to_numpy()
    if (autograd >= 0).any():
        return autograd >= 0
    sign = 1 if ops["phase"].iloc[0] == F else -1
    return ops["score"].fillna(0).to_numpy() * sign >= SHARED
