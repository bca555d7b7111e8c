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

BLOCKS = ["step", "phase", "start", "end", "ops", "told", "contrary"]
"""A block: its op indices, how many of them have a name that tells a phase, and how many of
those tell the other phase."""
OTHER = "O"
STATES = np.array([F, B, OTHER])
AUTOGRAD = r"^autograd::engine::evaluate_function: |Backward\d*$"  # MmBackward0 and its caller
SMOOTH = 0.05  # added to each share so that a name seen in one phase only scores finitely
CLIP = 3.0  # strongest score of a single name
SHARED = 1.0  # |score| below this: a name of both phases
MISFIT = 1.0  # score of a pipeline name as "other", or of a foreign name as F or B
SWITCH = 4.0  # cost of changing phase between two ops with no P2P boundary between them
STRETCH = ((2, True), (0, True), (1, True), (0, False), (1, False), (2, False))
"""The phases one stretch between P2P boundaries may hold, as automaton states (phase index,
may start the stretch): other work first, a forward and a backward in either order, each once,
other work last. MOVES are its transitions."""
MOVES = ((0, 1), (0, 2), (1, 4), (2, 3), (1, 5), (2, 5), (3, 5), (4, 5))
EVIDENCE = 0.5  # weight of what the nearest P2P boundaries say, beside the names


def name_counts(work: pd.DataFrame, names: pd.Index) -> tuple[pd.DataFrame, pd.Series]:
    """What `name_scores` counts in some ranks' work (`names` by id): per name (the index) the
    stretches P2P evidence labels F and B holding it and the most stretches holding it in one
    rank's step (`most`); and how many stretches of each phase there are. Counts of parts of
    the ranks add up (`most`: the largest)."""
    labelled = work[work["evidence"].isin([F, B])]
    stretch = ["rank", "step", "cut", "evidence"]
    present = labelled.drop_duplicates([*stretch, "name_id"])
    counts = present.groupby(["name_id", "evidence"]).size().unstack(fill_value=0).reindex(
        columns=[F, B], fill_value=0)
    most = present.groupby(["name_id", "rank", "step"]).size().groupby("name_id").max()
    counts = counts.assign(most=most.reindex(counts.index, fill_value=0))
    counts.index = names[counts.index.to_numpy(dtype=np.int64)]
    stretches = labelled.drop_duplicates(stretch)["evidence"].value_counts()
    return counts, stretches.reindex([F, B], fill_value=0)


def name_scores(counted: list[tuple[pd.DataFrame, pd.Series]]) -> pd.Series:
    """name -> log odds of forward over backward among the stretches P2P evidence labels
    (share of forward stretches holding the name vs of backward ones), over the `name_counts`
    of every part of the ranks; NaN for names that never occur in two stretches of one rank and
    step."""
    frames = [c for c, _ in counted if len(c)]
    if not frames:
        return pd.Series(dtype=float)
    counts = pd.concat(frames).groupby(level=0).agg({F: "sum", B: "sum", "most": "max"})
    stretches = sum(s for _, s in counted)
    share = counts[[F, B]] / np.maximum(stretches.to_numpy(), 1)
    score = np.log((share[F] + SMOOTH) / (share[B] + SMOOTH)).clip(-CLIP, CLIP)
    return score.where(counts["most"] >= 2)


def scores_by_id(scores: pd.Series, names: pd.Index) -> pd.Series:
    """name_id -> its name's score (`name_scores`; NaN for none). PyTorch's autograd ops
    (`names` by id) are backward whatever the stretches say: the last stage's loss backward is
    never alone."""
    score = pd.Series(names).map(scores).astype(float)
    score[names.str.contains(AUTOGRAD, regex=True)] = -CLIP
    return score


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
    """Phase indices of one stretch: the STRETCH automaton path maximizing its emissions less
    SWITCH per change. Exact dynamic programming in the automaton's order, each transition
    vectorized over positions (the best place to enter a state is a running max)."""
    n = len(emit)
    total = np.vstack([np.zeros(len(STATES)), np.cumsum(emit, axis=0)])  # ops before i
    best, entered = {}, {}  # state -> [i]: the ops before i, the last in that state
    for state, (phase, starts) in enumerate(STRETCH):
        column = total[:, phase]
        value = column.copy() if starts else np.full(n + 1, -np.inf)
        entered[state] = []
        for before in (s for s, t in MOVES if t == state):
            enter = best[before] - SWITCH - column  # leave `before` for `state` at j
            at = _running_argmax(enter[:, None])[:, 0]
            moved = column + enter[at]
            entered[state].append((before, at, moved > value))
            value = np.maximum(value, moved)
        best[state] = value
    state, i = max(best, key=lambda s: best[s][n]), n
    path = np.empty(n, dtype=np.int8)
    while True:
        move = next(((b, at) for b, at, took in reversed(entered[state]) if took[i]), None)
        j = int(move[1][i]) if move else 0
        path[j:i] = STRETCH[state][0]
        if move is None:
            return path
        state, i = move[0], j


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
    """One rank's step (its ops with their names' `score`): BLOCKS of its forward and backward
    blocks. A block must start at a boundary that starts
    work or end at one that ends it; at an end that neither such a boundary nor a kept
    neighbour marks it loses the ops that are not typical of its phase."""
    work = work.sort_values("start", kind="stable").reset_index(drop=True)
    first_seen = work.groupby("autograd")["start"].transform("min")  # its forward's time
    work = work.assign(phase=phase_path(work), first_seen=first_seen)
    runs = _runs(work)
    out = []
    for run in runs[runs["kept"]].itertuples():
        ops = work.iloc[run.lo:run.hi]
        typical = np.flatnonzero(_typical(ops))
        lo = typical[0] if run.open_start and len(typical) else 0
        hi = typical[-1] + 1 if run.open_end and len(typical) else len(ops)
        ops = ops.iloc[lo:hi]
        told = ops["score"].fillna(0).to_numpy() * (1 if run.phase == F else -1)
        out.append((int(ops["step"].iloc[0]), run.phase, int(ops["start"].min()),
                    int(ops["end"].max()), ops["op"].to_numpy(), int((abs(told) >= SHARED).sum()),
                    int((told <= -SHARED).sum())))
    return pd.DataFrame(out, columns=BLOCKS)


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
    """Ops that are surely the block's phase: their name is typical of it and, where the
    profiler records autograd, so is their sequence number (a forward's are first seen in the
    block, a backward's were seen before it; the optimizer's and data loading's ops carry
    none, and ops after the pipeline the counter's last value)."""
    forward = ops["phase"].iloc[0] == F
    typical = ops["score"].fillna(0).to_numpy() * (1 if forward else -1) >= SHARED
    autograd = ops["autograd"].to_numpy()
    if (autograd >= 0).any():
        new = ops["first_seen"].to_numpy() >= ops["start"].iloc[0]
        typical &= (autograd >= 0) & (new if forward else ~new)
    return typical
