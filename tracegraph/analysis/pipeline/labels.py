"""Chunk and microbatch of each block from the order of a stage's blocks, checked across stages.

Every stage of a (interleaved) 1F1B pipeline runs its forwards in one order and its backwards
in the same order with the chunks reversed (`schedules.order`), however they interleave; the
k-th forward block of a rank is therefore (chunk, microbatch) = order[k]. A stage's backward of a
microbatch may be tied to its forward more directly: the autograd sequence numbers its ops
share (`link`), which then overrule the order.

The labels are only taken when they are consistent: the op names within each block tell its
phase (not the other one, as when a forward and a backward interleave), every stage of the
replica has v·m forwards and as many backwards in each step, and every block starts after the
block it needs ends (the forward of the previous virtual stage, the backward of the next, the
forward of the same chunk for the last one), allowing for clock alignment. On a ring of stages
(interleaved) the chunk count v is the one value for which that holds; when none or several do,
nothing is labelled.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from tracegraph.analysis.pipeline.blocks import B, F, Pipeline, staged, unsure
from tracegraph.analysis.pipeline.replicas import Replica
from tracegraph.analysis.schedules import order

CONTRARY = 0.05  # share of phase-telling ops in blocks of the other phase that is too many
SLACK = 0.25  # a block may start this share of the median forward before what it needs ended


def labelled(analysis, blocks: pd.DataFrame, replicas: list[Replica], source: str,
             link: pd.Series | None = None) -> Pipeline:
    """The Pipeline of `blocks` (rank, step, phase, start, end), each replica labelled on its
    own; one that does not fit is left out, and the pipeline says why."""
    found, reasons = [], []
    for replica in replicas:
        mine, why = label(blocks[blocks["rank"].isin(replica.stages)], replica.stages,
                          replica.ring, link)
        found += [mine] if mine is not None else []
        reasons += [why] if why else []
    reason = reasons[0] + (f" (and {len(reasons) - 1} more replicas alike)"
                           if len(reasons) > 1 else "") if reasons else ""
    if not found:
        return unsure(source, reason)
    order = {r: s for replica in replicas for s, r in enumerate(replica.stages)}
    return staged(analysis, pd.concat(found, ignore_index=True).drop(columns="ops",
                                                                      errors="ignore"),
                  source, order, reason)


def label(blocks: pd.DataFrame, stages: list[int], ring: bool,
          link: pd.Series | None = None) -> tuple[pd.DataFrame | None, str]:
    """`blocks` (rank, step, phase, start, end) of one replica, `stages` its ranks in stage
    order -> the blocks with chunk and microbatch, or None and why not."""
    if (why := _interleaving(blocks, stages)):
        return None, why
    p = len(stages)
    fits = []
    for v in _chunk_counts(blocks, p, ring):
        numbered = _by_order(blocks, p, v, link)
        if numbered is not None and _causal(numbered, stages):
            fits.append((v, numbered))
    if len(fits) == 1:
        return fits[0][1], ""
    counts = blocks.groupby(["rank", "step", "phase"]).size().to_dict()
    if not fits:
        return None, (f"the blocks of ranks {stages} fit no (interleaved) 1F1B order "
                      f"(forward/backward blocks per rank and step: {_counts(counts)})")
    return None, f"{len(fits)} chunk counts ({[v for v, _ in fits]}) fit ranks {stages}"


def _interleaving(blocks: pd.DataFrame, stages: list[int]) -> str:
    """Why the blocks are no forward or backward each, if their op names say so: more than
    CONTRARY of the ops whose name tells a phase sit in blocks of the other one (combined 1F1B
    interleaves a forward and a backward layer by layer)."""
    if "told" not in blocks or not blocks["told"].sum():
        return ""
    share = blocks["contrary"].sum() / blocks["told"].sum()
    return (f"forward and backward work interleave on ranks {stages} ({share:.0%} of the ops "
            f"whose name tells a phase sit in blocks of the other; combined 1F1B?)"
            if share > CONTRARY else "")


def _chunk_counts(blocks: pd.DataFrame, p: int, ring: bool) -> list[int]:
    """v = 1 on a chain of stages; on a ring each v ≥ 2 that divides every rank's forwards
    into whole groups of p microbatches."""
    if not ring:
        return [1]
    forwards = blocks[blocks["phase"] == F].groupby(["rank", "step"]).size()
    if forwards.empty or forwards.nunique() != 1:
        return []
    count = int(forwards.iloc[0])
    return [v for v in range(2, count + 1) if count % v == 0 and (count // v) % p == 0]


def _by_order(blocks: pd.DataFrame, p: int, v: int, link: pd.Series | None
              ) -> pd.DataFrame | None:
    """Chunk and microbatch by the position of each block among its rank's forwards or
    backwards of the step; None when a rank's counts do not make v·m of each."""
    blocks = blocks.sort_values(["rank", "step", "start"])
    k = blocks.groupby(["rank", "step", "phase"]).cumcount().to_numpy()
    counts = blocks.groupby(["rank", "step", "phase"]).size()
    if counts.nunique() != 1 or len(counts) != 2 * len(counts.droplevel("phase").index.unique()):
        return None
    total = int(counts.iloc[0])
    if total % v:
        return None
    runs = np.array(order(p, v, total // v))
    chunk, mb = runs[k, 0], runs[k, 1]
    backward = (blocks["phase"] == B).to_numpy()
    numbered = blocks.assign(chunk=np.where(backward, v - 1 - chunk, chunk), microbatch=mb)
    return numbered if link is None else _linked(numbered, link)


def autograd_links(blocks: pd.DataFrame, autograd: np.ndarray) -> pd.Series | None:
    """Backward block index -> the forward block of its rank and step that holds most of its
    autograd sequence numbers (the backward op carries its forward op's), where that is more
    than half of them; None when the trace records none. `blocks` has its op indices in `ops`."""
    seqs = blocks["ops"].map(lambda ops: {int(s) for s in autograd[ops] if s >= 0})
    if not seqs.map(len).any():
        return None
    keyed = list(zip(blocks.index, blocks["rank"], blocks["step"], blocks["phase"], seqs,
                     strict=True))
    owner = {(r, step, s): i for i, r, step, phase, numbers in keyed if phase == F
             for s in numbers}
    links = {}
    for i, r, step, phase, numbers in keyed:
        hits = Counter(owner[r, step, s] for s in numbers if (r, step, s) in owner)
        if phase == B and hits and 2 * hits.most_common(1)[0][1] > len(numbers):
            links[i] = hits.most_common(1)[0][0]
    return pd.Series(links, dtype="int64")


def _linked(blocks: pd.DataFrame, link: pd.Series) -> pd.DataFrame:
    """Backward blocks take the chunk and microbatch of the forward block `link` ties them to
    (block index -> forward block index, where known)."""
    known = link.reindex(blocks.index).dropna().astype(int)
    known = known[known.isin(blocks.index)]
    out = blocks.copy()
    out.loc[known.index, ["chunk", "microbatch"]] = blocks.loc[
        known.to_numpy(), ["chunk", "microbatch"]].to_numpy()
    return out


def _causal(blocks: pd.DataFrame, stages: list[int]) -> bool:
    """Whether every block starts after the block it needs has ended (within SLACK); a block
    whose need runs on a stage absent from the bundle is not judged."""
    p = len(stages)
    stage = blocks["rank"].map({r: s for s, r in enumerate(stages)})
    present = np.isin(np.arange(p), stage.unique())
    v = int(blocks["chunk"].max()) + 1
    virtual = blocks["chunk"] * p + stage  # global virtual stage
    last = p * v - 1
    key = pd.MultiIndex.from_arrays([blocks["step"], blocks["phase"], virtual,
                                     blocks["microbatch"]])
    if key.duplicated().any():
        return False
    end = pd.Series(blocks["end"].to_numpy(), index=key)
    forward = (blocks["phase"] == F).to_numpy()
    needs = pd.MultiIndex.from_arrays([
        blocks["step"], np.where(forward | (virtual == last), F, B),
        np.where(forward, virtual - 1, np.where(virtual == last, last, virtual + 1)),
        blocks["microbatch"]])
    has = ~(forward & (virtual == 0)).to_numpy() & present[needs.get_level_values(2) % p]
    ready = end.reindex(needs[has]).to_numpy()
    if np.isnan(ready).any():
        return False
    slack = SLACK * float((blocks["end"] - blocks["start"])[forward].median())
    return bool((blocks["start"].to_numpy()[has] >= ready - slack).all())


def _counts(counts: dict) -> str:
    """{(rank, step, phase): n} as "r0 12F/12B, ..." for the first step."""
    if not counts:
        return "none"
    first = min(step for _, step, _ in counts)
    ranks = sorted({r for r, step, _ in counts if step == first})
    return ", ".join(f"r{r} {counts.get((r, first, F), 0)}F/{counts.get((r, first, B), 0)}B"
                     for r in ranks)
