"""What an edit reads: the analysis, its timing model, the steps, and searches over the model.

The searches answer the questions an edit asks of the graph: what communication a wait waited
for (through the records and stream waits between them), which P2P op an op hands off to
without computing in between (a send it holds back), and which stretch of a host thread an
annotation encloses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tracegraph import schema
from tracegraph.analysis.analyze import Analysis
from tracegraph.graph.ops import comm_calls, searches
from tracegraph.verify.metrics import comm_categories
from tracegraph.whatif.model import KIND, TimingModel, build_model
from tracegraph.whatif.replay import Replay, replay
from tracegraph.whatif.steps import StepOps, step_ops

HANDOFF_DEPTH = 16  # nodes a search follows through records, waits and annotations
RELEASES = tuple(KIND[k] for k in ("event_wait", "host_release"))
"""Edges by which a waiting op is released by another lane's progress."""
WAITED_AT = (*RELEASES, KIND["p2p"], KIND["collective"])
"""Edges by which an op waits for another lane or rank."""
SENDS = ("send", "batch_send_recv")
OPTIMIZER = re.compile(r"optimi[sz]er|adam|foreach_?norm|l2norm|applymomentum", re.IGNORECASE)
"""Names of the optimizer's ops: torch's `Optimizer.step#…` / `Optimizer.zero_grad#…` ranges,
Adam / AdamW / Momentum kernels and the gradient norm computed just before them."""


@dataclass
class Subject:
    """An analysis with its unmodified timing model and steps: what every edit starts from."""

    analysis: Analysis
    model: TimingModel = field(init=False)
    steps: StepOps = field(init=False)
    memo: dict[str, object] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.steps = step_ops(self.analysis)
        self.model = build_model(self.analysis, self.steps)

    @property
    def graph(self):
        return self.analysis.graph

    @cached_property
    def baseline(self) -> Replay:
        """The unmodified model replayed: what every prediction is compared with."""
        return replay(self.model, self.steps)

    @cached_property
    def category(self) -> np.ndarray:
        """Per op: the root-cause category of its communication ("" for other ops)."""
        return comm_categories(self.analysis)

    @cached_property
    def passable(self) -> np.ndarray:
        """Per op: it hands off without computing (a record, a wait, an annotation stretch, a
        host communication call)."""
        graph = self.graph
        return np.isin(graph.kind, [schema.WAIT, schema.RECORD, schema.MARKER]) | comm_calls(
            graph.ops.frame)

    @cached_property
    def work(self) -> np.ndarray:
        """Per op: it is the rank's own work (compute, memcpy, host work, annotation time)."""
        graph = self.graph
        kinds = [schema.COMPUTE, schema.MEMCPY, schema.HOST, schema.MARKER]
        return np.isin(graph.kind, kinds) & ~comm_calls(graph.ops.frame)

    @cached_property
    def optimizer(self) -> np.ndarray:
        """Per op: the optimizer's (its name, or the annotation around it, names one)."""
        frame = self.graph.ops.frame
        return searches(frame["name"], OPTIMIZER) | searches(frame["annotation"], OPTIMIZER)

    @cached_property
    def waiting(self) -> np.ndarray:
        """Per op: it waits for another lane or rank (a release, a P2P peer, its collective's
        members)."""
        model = self.model
        into = np.isin(model.kind, WAITED_AT) & (model.dst < 2 * model.ops)
        mask = np.zeros(model.ops, dtype=bool)
        mask[model.dst[into] // 2] = True
        return mask

    @cached_property
    def sends(self) -> np.ndarray:
        """Per op: a P2P op that sends (a send, a batched send/receive)."""
        return (self.graph.kind == schema.P2P) & np.isin(self.graph.ops.frame["comm"].to_numpy(),
                                                          SENDS)

    @cached_property
    def position(self) -> np.ndarray:
        """Per op: where it stands in its lane's device order (its index; a Kineto host-side
        stream wait just before the op it gates, NaN if it gates none)."""
        graph = self.graph
        position = np.arange(len(graph), dtype=float)
        position[graph.host_side] = np.nan
        for op, waits in graph.gates.items():
            position[waits] = op - 0.5
        return position

    @cached_property
    def row(self) -> np.ndarray:
        """Per op: its row of the step table (a host-side stream wait: the op it gates'), -1."""
        row = self.steps.row.copy()
        for op, waits in self.graph.gates.items():
            row[waits] = row[op]
        return row

    @cached_property
    def next_on_lane(self) -> np.ndarray:
        """Per op: the device op after it on its lane, -1 for the last."""
        graph = self.graph
        after = np.full(len(graph), -1, dtype=np.int64)
        has = (graph.prev >= 0) & ~graph.host_side
        after[graph.prev[has]] = np.flatnonzero(has)
        return after

    def lane_ops(self, lane: int) -> np.ndarray:
        """The ops of a lane with a position, in device order."""
        graph = self.graph
        ops = np.arange(graph.lane_first[lane], graph.lane_first[lane + 1])
        ops = ops[~np.isnan(self.position[ops])]
        return ops[np.argsort(self.position[ops], kind="stable")]

    def enclosing(self, op: int) -> tuple[int, int]:
        """The first and last op of a host thread's stretch inside the innermost annotation
        around `op` (its pieces and what nests between them); (op, op) when none encloses it."""
        graph = self.graph
        frame = graph.ops.frame
        name = frame["annotation"].iat[op]
        if graph.mode[op] != schema.THREAD or not isinstance(name, str) or not name:
            return op, op
        ops = self.lane_ops(graph.lane_id[op])
        markers = ops[graph.kind[ops] == schema.MARKER]
        markers = markers[frame["name"].iloc[markers].eq(name).to_numpy(dtype=bool,
                                                                           na_value=False)]
        opened = markers[markers <= op]
        if not len(opened):
            return op, op
        event = frame["event"].to_numpy()
        pieces = markers[event[markers] == event[opened[-1]]]
        return int(pieces[0]), max(int(pieces[-1]), op)

    def completed(self, op: int) -> int:
        """The communication op whose completion `op` marks: itself, or for a record the op
        before it on its lane (through other records); -1 for the lane's own progress."""
        graph = self.graph
        for _ in range(HANDOFF_DEPTH):
            if op < 0 or graph.kind[op] != schema.RECORD:
                break
            op = int(graph.prev[op])
        return op if op >= 0 and graph.kind[op] in (schema.COLLECTIVE, schema.P2P) else -1

    def source(self, wait: int) -> int:
        """The communication op whose completion released a wait, -1 if none."""
        return self.completed(int(self.graph.dep[wait]))

    @cached_property
    def releases(self) -> list[tuple[int, int, int]]:
        """(edge, waiting op, communication op) of every release edge of the model whose source
        is communication."""
        model = self.model
        found = []
        for edge in np.flatnonzero(np.isin(model.kind, RELEASES)).tolist():
            src = int(model.src[edge])
            comm = self.completed(src // 2) if src < 2 * model.ops else -1
            if comm >= 0:
                found.append((edge, int(model.dst[edge]) // 2, comm))
        return found

    def handoff(self, op: int) -> int:
        """The first send of op's rank reached from op's start or end through its ops that do
        not compute (the send a wait or a record holds back), -1 if none."""
        successors = self._successors
        rank = self.graph.rank
        seen = {2 * op, 2 * op + 1}
        frontier = [2 * op, 2 * op + 1]
        for _ in range(HANDOFF_DEPTH):
            nxt = []
            for node in frontier:
                for succ in successors[node]:
                    other = succ // 2
                    if succ in seen or succ >= 2 * self.model.ops or rank[other] != rank[op]:
                        continue
                    if self.sends[other]:
                        return other
                    if self.passable[other]:
                        seen.add(succ)
                        nxt.append(succ)
            frontier = nxt
            if not frontier:
                break
        return -1

    @cached_property
    def _successors(self) -> _Adjacency:
        """node -> the nodes waiting on it."""
        model = self.model
        chained = np.flatnonzero(model.chain >= 0)
        return _Adjacency(np.concatenate([model.chain[chained], model.src]),
                          np.concatenate([chained, model.dst]), model.nodes)


class _Adjacency:
    """Edges src -> dst grouped by src: `adjacency[node]` lists the nodes after it."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, nodes: int) -> None:
        order = np.argsort(src, kind="stable")
        self.dst = dst[order]
        self.bounds = np.searchsorted(src[order], np.arange(nodes + 1))

    def __getitem__(self, node: int) -> list[int]:
        return self.dst[self.bounds[node]:self.bounds[node + 1]].tolist()
