"""Edits of the timing model: what a fix would change, as the CLI flags and the Python API name it.

Each edit takes the `Subject` (the unmodified analysis and model) and a model (possibly already
edited by the edits before it) and returns the edited model with one line saying what it changed.
An edit that finds nothing to change says so; one that is asked for something the bundle does not
have (a rank it does not hold, a pattern no op matches) raises `EditError`.

- `--fix decouple-reduction`, `--fix couple-reduction`: `reduction.DecoupleReduction`,
  `reduction.CoupleReduction`;
- `--fix separate-queues`: `SeparateQueues`, streams sharing one hardware queue get their own;
- `--straggler RANK|absent|auto[=median]`: `Straggler`, that rank's own work at its peers'
  median, absent members arriving with the others;
- `--scale SELECTOR=FACTOR`: `Scale`, durations (transfers of communication) times FACTOR;
- `--remove-wait SELECTOR`: `RemoveWait`, those waits no longer wait.

A SELECTOR is a root-cause category (`ep_alltoall`, `dp_reduction`, `compute_straggler` …), an op
kind (`compute`, `collective`, `p2p`, `memcpy`, `host`, `marker`, `wait`), `launch` (the host
launch delays before ops), or a shell pattern on op names (`'aclnnGroupedMatmul*'`), tried in
that order (`collective` is the category of collectives whose dimension is unknown); the prefixes
`category:`, `kind:` and `name:` choose.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from tracegraph import causes, schema
from tracegraph.analysis.walk import MIN_PIECE_NS
from tracegraph.whatif.model import KIND, TimingModel, end, start
from tracegraph.whatif.subject import RELEASES, WAITED_AT, Subject

LAUNCH = "launch"
MEDIAN = "median"
ABSENT, AUTO = "absent", "auto"


class EditError(ValueError):
    """An edit asks for something the bundle does not hold."""


class Edit(Protocol):
    """One change to the timing model."""

    @property
    def label(self) -> str: ...

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]: ...


@dataclass(frozen=True)
class Scale:
    """Ops of `selector` take `factor` times as long (communication: its transfer); `launch`
    scales the launch delays before ops instead (those of MIN_PIECE_NS at least: shorter gaps
    are the device's own spacing between kernels)."""

    selector: str
    factor: float

    @property
    def label(self) -> str:
        return f"scale {self.selector}={self.factor:g}"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        const = model.const.copy()
        if self.selector == LAUNCH:
            delayed = np.flatnonzero(model.has_predecessor()[0:2 * model.ops:2]
                                     & (model.const[0:2 * model.ops:2] >= MIN_PIECE_NS))
            const[start(delayed)] = np.round(const[start(delayed)] * self.factor)
            return model.replace(const=const), (f"launch delays before {len(delayed):,} ops "
                                                f"× {self.factor:g}")
        ops = np.flatnonzero(select(subject, self.selector) & ~model.virtual[1:2 * model.ops:2])
        const[end(ops)] = np.round(const[end(ops)] * self.factor)
        ms = (const[end(ops)].sum() - model.const[end(ops)].sum()) / 1e6
        return model.replace(const=const), (f"{len(ops):,} {self.selector} ops × "
                                            f"{self.factor:g} ({ms:+.1f} ms of their own time, "
                                            "all ranks and steps)")


@dataclass(frozen=True)
class RemoveWait:
    """Ops of `selector` (or, for a communication category, the waits on it) no longer wait
    for another lane or rank: they take their own time only."""

    selector: str

    @property
    def label(self) -> str:
        return f"remove-wait {self.selector}"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        waiting = np.isin(model.kind, WAITED_AT) & (model.dst < 2 * model.ops)
        waiter = np.minimum(model.dst // 2, model.ops - 1)  # instance nodes: masked by waiting
        category = _category(self.selector)
        if category and category in set(subject.category):
            on = [edge for edge, _, comm in subject.releases
                  if subject.category[comm] == category]
            base = subject.model
            drop = model.edges_between(base.src[on], base.dst[on])
            drop |= waiting & (model.dst % 2 == 1) & (subject.category[waiter] == category)
        else:
            ops = select(subject, self.selector)
            drop = waiting & ops[waiter] & (model.dst % 2 == 1)
        if not drop.any():
            return model, f"{self.selector}: no op of it waits for another lane or rank"
        ops = len(np.unique(model.dst[drop]))
        return model.without_edges(drop), f"{ops:,} ops no longer wait ({self.selector})"


@dataclass(frozen=True)
class SeparateQueues:
    """Streams that shared one hardware queue each get their own: the ops no longer wait for
    the op ahead of them on another stream (`CUDA_DEVICE_MAX_CONNECTIONS` > 1, overlap back)."""

    @property
    def label(self) -> str:
        return "fix separate-queues"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        shared = model.kind == KIND["shared_queue"]
        if not shared.any():
            return model, "no op waited in a hardware queue shared with another stream"
        ranks = sorted({int(r) for r in subject.graph.rank[model.dst[shared] // 2]})
        return model.without_edges(shared), (f"{int(shared.sum()):,} ops of ranks "
                                             f"{_ranks(ranks)} no longer queue behind another "
                                             "stream")


@dataclass(frozen=True)
class Straggler:
    """`target` (a rank, `absent` or `auto`) brought to the median of its peers: a rank's own
    work op by op at the median of the same op on the other ranks (an annotation stretch only it
    spends: none); absent members of a group arriving with the profiled ones (the collective
    then takes its transfer only). `auto`: the ranks the analysis found slow, and absent ones."""

    target: str

    @property
    def label(self) -> str:
        return f"straggler {self.target}={MEDIAN}"

    def apply(self, subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
        said = []
        if self.target in (ABSENT, AUTO):
            model, line = _absent_on_time(subject, model)
            said.append(line)
        ranks = _target_ranks(subject, self.target)
        if ranks:
            model, line = _ranks_at_median(subject, model, ranks)
            said.append(line)
        elif self.target == AUTO:
            said.append("the analysis found no slow rank")
        return model, "; ".join(said)


def select(subject: Subject, selector: str) -> np.ndarray:
    """Mask of the ops a selector names: `category:NAME`, `kind:KIND`, `name:PATTERN`, or
    unprefixed the first that fits of a category, an op kind, a pattern on op names."""
    how, _, what = selector.partition(":") if selector.split(":", 1)[0] in _PREFIXES else (
        "", "", selector)
    graph = subject.graph
    if what == causes.COMPUTE_STRAGGLER and how in ("", "category"):
        analysis = subject.analysis
        mask = analysis.slow_op
    elif what in causes.CATEGORIES and how in ("", "category"):
        mask = subject.category == what
    elif what in schema.KINDS and how in ("", "kind"):
        mask = graph.kind == what
    elif how in ("", "name"):
        codes, uniques = pd.factorize(pd.Series(graph.name).fillna(""))
        hits = np.array([fnmatch.fnmatchcase(str(u), what) for u in uniques] + [False])
        mask = hits[codes]
    else:
        mask = np.zeros(len(graph), dtype=bool)
    if not mask.any():
        raise EditError(f"{selector!r} matches no op (a category, an op kind such as compute or "
                        "collective, launch, or a shell pattern on op names; prefix category:, "
                        "kind: or name: to choose)")
    return mask


_PREFIXES = ("category", "kind", "name")


def _category(selector: str) -> str:
    """The root-cause category a selector names, "" if it names none."""
    name = selector.removeprefix("category:")
    return name if name in causes.CATEGORIES and not selector.startswith(("kind:", "name:")) \
        else ""


def _target_ranks(subject: Subject, target: str) -> list[int]:
    if target == ABSENT:
        return []
    if target == AUTO:
        return sorted(subject.analysis.slow_ranks)
    try:
        rank = int(target)
    except ValueError:
        raise EditError(f"--straggler {target}: give a rank, absent or auto") from None
    if rank not in set(subject.graph.rank.tolist()):
        raise EditError(f"--straggler {rank}: no such rank in the bundle")
    return [rank]


def _ranks_at_median(subject: Subject, model: TimingModel, ranks: list[int]
                     ) -> tuple[TimingModel, str]:
    """Each own-work op of `ranks` at the median own time of the same op (name, occurrence in
    the step) on the other ranks; annotation stretches no other rank has: none."""
    graph, steps = subject.graph, subject.steps
    released = np.zeros(model.ops, dtype=bool)
    into_end = np.isin(model.kind, RELEASES) & (model.dst % 2 == 1) & (model.dst < 2 * model.ops)
    released[model.dst[into_end] // 2] = True
    work = np.flatnonzero(subject.work & ~released & (steps.row >= 0))
    step = steps.table["step"].to_numpy()[steps.row[work]]
    table = pd.DataFrame({"op": work, "rank": graph.rank[work], "step": step,
                          "name": pd.Series(graph.name[work]).fillna("").to_numpy(),
                          "own": model.const[end(work)]})
    table["nth"] = table.groupby(["rank", "step", "name"]).cumcount()
    mine = table["rank"].isin(ranks).to_numpy()
    peers = table[~mine].groupby(["step", "name", "nth"])["own"].median()
    target = table[mine]
    median = peers.reindex(pd.MultiIndex.from_frame(target[["step", "name", "nth"]])).to_numpy()
    alone = np.isnan(median)
    marker = graph.kind[target["op"].to_numpy()] == schema.MARKER
    new = np.where(alone, np.where(marker, 0, target["own"]), median).astype(np.int64)
    const = model.const.copy()
    const[end(target["op"].to_numpy())] = new
    saved = (target["own"].sum() - new.sum()) / 1e6 / max(len(set(step)), 1)
    return model.replace(const=const), (f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}: "
                                        f"{len(target):,} own-work ops at their peers' median "
                                        f"({saved:.1f} ms of work per step removed)")


def _absent_on_time(subject: Subject, model: TimingModel) -> tuple[TimingModel, str]:
    """Collectives waiting on members absent from the bundle take their transfer only: the
    bytes at the best rate the same rank reached in the group (the fastest instance's)."""
    graph = subject.graph
    ops = np.flatnonzero(graph.unprofiled > 0)
    if not len(ops):
        return model, "no group has members absent from the bundle"
    frame = subject.analysis.ops.frame
    events = subject.analysis.trace.events
    nbytes = events["bytes"].reindex(frame["event"].to_numpy()[ops]).fillna(-1).to_numpy()
    own = model.const[end(ops)].astype(float)
    table = pd.DataFrame({"rank": graph.rank[ops], "group": graph.group[ops],
                          "comm": frame["comm"].to_numpy()[ops],
                          "rate": np.where(nbytes > 0, own / np.maximum(nbytes, 1), np.nan),
                          "own": own})
    keys = ["rank", "group", "comm"]
    best_rate = table.groupby(keys)["rate"].transform("min").to_numpy()
    fastest = table.groupby(keys)["own"].transform("min").to_numpy()
    transfer = np.where(np.isnan(best_rate), fastest, best_rate * np.maximum(nbytes, 1))
    new = np.minimum(own, transfer).astype(np.int64)
    const = model.const.copy()
    const[end(ops)] = new
    saved = (own.sum() - new.sum()) / 1e6
    groups = len(set(table["group"]))
    return model.replace(const=const), (f"{len(ops):,} collectives of {groups} groups with "
                                        f"absent members take their transfer only ("
                                        f"{saved:.1f} ms of waiting removed, all ranks)")


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" … ({len(ranks)})" if len(ranks) > 8 else "")


def fixes() -> dict[str, Edit]:
    """The named fixes of `--fix`."""
    from tracegraph.whatif.reduction import CoupleReduction, DecoupleReduction

    return {"decouple-reduction": DecoupleReduction(), "couple-reduction": CoupleReduction(),
            "separate-queues": SeparateQueues()}


def parse_edits(fix: list[str] = (), straggler: list[str] = (), scale: list[str] = (),
                remove_wait: list[str] = ()) -> list[Edit]:
    """The edits the CLI flags name, in the order fix, straggler, scale, remove-wait."""
    named = fixes()
    out: list[Edit] = []
    for name in fix:
        if name not in named:
            raise EditError(f"--fix {name}: unknown fix; known: {', '.join(named)}")
        out.append(named[name])
    for target in straggler:
        rank, _, level = target.partition("=")
        if level not in ("", MEDIAN):
            raise EditError(f"--straggler {target}: only ={MEDIAN} is modelled")
        out.append(Straggler(rank))
    for spec in scale:
        selector, _, factor = spec.rpartition("=")
        try:
            value = float(factor)
        except ValueError:
            value = -1.0
        if not selector or value < 0:
            raise EditError(f"--scale {spec}: give SELECTOR=FACTOR with a factor >= 0")
        out.append(Scale(selector, value))
    out += [RemoveWait(selector) for selector in remove_wait]
    return out
