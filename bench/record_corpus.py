#!/usr/bin/env python3
"""Record tests/data/corpus: real PyTorch-profiler traces of small gloo jobs with known causes.

A dev tool, not part of tracegraph (it and corpus_schedule.py are the only files that import
torch). For every case it spawns `world` processes on 127.0.0.1 (gloo), creates the case's
process groups in the case's order, runs a few steps of a tiny model with Megatron-like
`record_function` annotations (`FWD mb=i`, `BWD mb=i`, `FWD_SEND`, `BWD_SEND`,
`DP_REDUCE_GRAD`, `OPT step`, ...) under `torch.profiler.profile(activities=[CPU],
record_shapes=True)` with a wait / warmup / active schedule, injects the case's delay with
`time.sleep` (inside a named annotation, or outside any for a host stall), exports each rank
with `export_chrome_trace` and gzips it to `rankN.json.gz`.

`ground_truth.json` is written from the job itself, never from running tracegraph: what was
injected, and every wait of the profiled steps with its cause, from a replay of the job's own
schedule (corpus_schedule.py): each rank's program is run once more without torch.distributed
("plan" mode) and the programs are replayed against each other.

Noise: 4 processes share the 2 cores of the machine the corpus is recorded on, with other work.
Each rank runs one thread of torch work (intra- and inter-op threads 1); the recording runs in a
scheduling group of its own at nice -20 (root only: the kernel shares the CPU between session
groups whatever a process's nice value), so other work on the host rarely deschedules a rank. A
healthy P2P exchange then takes a few ms (up to ~40 ms without it); the injected delays are
≥ 50 ms per occurrence.

    .venv/bin/python bench/record_corpus.py --out tests/data/corpus [--case NAME ...]

Requires torch 2.13.0 (CPU build) in the interpreter running it; see tests/data/corpus/README.md.
The structure (ops, order, groups, annotations) is deterministic; the timings are real.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from corpus_schedule import SIDE, Act, lanes, replay, stated_waits
from torch import nn
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, record_function, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracegraph import causes  # noqa: E402  (category names only)

NICE = -20  # the recording processes' priority (root only): other work on the host waits

# --- case description ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """Process groups created together, in this order, by every rank (`new_group` per list)."""

    key: str  # the role the job uses them for: pp | dp | ep | tp | metrics
    dim: str  # the parallel dimension stated in ground_truth.json: pp | dp | ep | tp | world
    desc: str  # group_desc; "{i}" is replaced by the list's index (it names the dimension)
    ranks: tuple[tuple[int, ...], ...]
    comms: tuple[str, ...] = ()  # what the job runs on them (ground_truth.json "comms")


@dataclass(frozen=True)
class Sleep:
    """One injected delay: `time.sleep(ms)` on `rank` at `phase`."""

    rank: int
    phase: str  # fwd | bwd | grad_reduce | opt | expert | host
    ms: float
    annotation: str | None = "straggler_sleep"  # None: a host stall outside any annotation
    inside: str = ""  # the annotation it runs in ("" for a host stall: see `between`)
    between: tuple[str, str] | None = None  # host stall: after this annotation, before that one
    microbatches: tuple[int, ...] | None = None  # None: every microbatch (or not per microbatch)
    layer: int | None = None  # EP: the MoE layer
    steps: tuple[int, ...] | None = None  # None: every step, profiled or not
    category: str = "compute_straggler"  # tracegraph's root-cause category for it


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # pipeline | dp | ep
    world: int
    summary: str
    families: tuple[Family, ...]
    hidden: int
    batch: int
    layers: int = 2
    microbatches: int = 1
    pp_schedule: str = "1f1b"  # 1f1b | gpipe
    reduce: str = ""  # pipeline DP reduction: a key of TAILS, "opt" (in OPT step) or ""
    work_ms: float = 0.0  # pipeline: LOCAL_WORK after the last backward (see TAILS)
    metrics: bool = False  # a [1]-element all_reduce on the WORLD group after the optimizer
    all_threads: bool = False  # profile every thread (profile_all_threads), not only main
    sleeps: tuple[Sleep, ...] = ()
    prof: tuple[int, int, int, int] = (0, 1, 1, 2)  # skip_first, wait, warmup, active
    expected: dict = field(default_factory=dict)  # root and notes, stated by hand per case
    copy_of: str = ""  # record nothing: copy these `keep` ranks of another case
    keep: tuple[int, ...] = ()

    @property
    def steps(self) -> int:
        return sum(self.prof)

    @property
    def profiled(self) -> list[int]:
        skip, wait, warm, active = self.prof
        first = skip + wait + warm
        return list(range(first, first + active))


TAILS = {
    # after the last microbatch's backward, in this order: launch the stage's DP gradient
    # all_reduce async (DP_REDUCE_GRAD), wait for it (DP_GRAD_WAIT), send the input gradient
    # upstream (BWD_SEND), the stage's remaining local work (LOCAL_WORK, work_ms); "fork" /
    # "join": DP_REDUCE_GRAD runs on a second thread of the rank, DP_GRAD_WAIT joins it first
    "before_send": ("launch", "wait", "send"),
    "after_send": ("launch", "send", "wait"),
    "stage_before_send": ("launch", "wait", "send", "work"),  # the seed's scheduler
    "stage_after_send": ("send", "fork", "work", "join"),  # its fix (hyper-parallel #390)
}


def _megatron_pp2dp2(order: str) -> tuple[Family, ...]:
    """Megatron's rank order (dp fastest): stage 0 = ranks 0,1; stage 1 = ranks 2,3."""
    dp = Family("dp", "dp", "DATA_PARALLEL_GROUP", ((0, 1), (2, 3)), ("allreduce",))
    pp = Family("pp", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", ((0, 2), (1, 3)), ("send", "recv"))
    return (dp, pp) if order == "dp_first" else (pp, dp)


_PP4 = (
    Family("dp", "dp", "DATA_PARALLEL_GROUP", ((0,), (1,), (2,), (3,))),  # dp=1: singletons
    Family("pp", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", ((0, 1, 2, 3),), ("send", "recv")),
)

_PP2DP2_SLEEP = Sleep(3, "grad_reduce", 250, inside="DP_REDUCE_GRAD", microbatches=(3,))
_PP2DP2_NOTE = ("Megatron layout: stage 0 = ranks 0,1, stage 1 = ranks 2,3; pipeline replicas "
                "{0,2} and {1,3}. After the last backward (mb=3) each stage launches its DP "
                "gradient all_reduce async (DP_REDUCE_GRAD); rank 3 sleeps 250 ms in it first.")

CASES: dict[str, Case] = {}


def _add(case: Case) -> None:
    CASES[case.name] = case


_add(Case(
    "pp4_1f1b_healthy", "pipeline", 4,
    "PP4 1F1B, 8 microbatches, no injection (control)",
    _PP4, hidden=256, batch=16, layers=2, microbatches=8,
    expected={"root_rank": None, "root_category": None,
              "notes": "only pipeline fill / drain waits (a few ms) are expected"}))

_add(Case(
    "pp4_1f1b_bwd_straggler", "pipeline", 4,
    "PP4 1F1B, 8 microbatches; stage 2 sleeps 50 ms in the backward of every microbatch",
    _PP4, hidden=256, batch=16, layers=2, microbatches=8,
    sleeps=(Sleep(2, "bwd", 50, inside="BWD mb={mb}"),),
    expected={"root_rank": 2, "root_category": "compute_straggler",
              "notes": "every other stage waits ~50 ms per microbatch (~400 ms per step in "
                       "total, less what overlaps); chains 0->1->2 and 1->2 upstream, 3->2 "
                       "downstream"}))

_BUG = Case(
    "pp2dp2_wait_before_send", "pipeline", 4,
    "PP2 x DP2 (the seed's bug): DP grad wait() before the backward send; rank 3 straggles",
    _megatron_pp2dp2("dp_first"), hidden=192, batch=16, layers=3, microbatches=4,
    reduce="before_send", sleeps=(_PP2DP2_SLEEP,), prof=(0, 2, 1, 2),
    expected={"root_rank": 3, "root_category": "compute_straggler",
              "notes": _PP2DP2_NOTE + " Rank 2 waits in DP_GRAD_WAIT for rank 3, and since "
                       "its wait() comes before its BWD_SEND, rank 0 waits on the P2P: the "
                       "seed's chain 0 -> 2 -> 3. Rank 1 waits on rank 3's own late BWD_SEND."})
_add(_BUG)

_add(replace(
    _BUG, name="pp2dp2_wait_after_send", reduce="after_send",
    summary="PP2 x DP2: DP grad wait() after the backward send; same straggler",
    expected={"root_rank": 3, "root_category": "compute_straggler",
              "notes": _PP2DP2_NOTE + " Rank 2 now sends to rank 0 before its wait(), so "
                       "rank 0's pipeline wait is gone; but the straggler's sleep comes before "
                       "its own BWD_SEND to rank 1, so rank 0 then waits in its DP reduction "
                       "with rank 1 (chain 0 -> 1 -> 3). The step does not shrink: see "
                       "hsdp_tail_wait_after_send for the reorder that gains."}))

_add(replace(
    _BUG, name="pp2dp2_one_replica", copy_of=_BUG.name, keep=(0, 2),
    summary="the bug case with only pipeline replica {0,2} in the bundle (the straggler and "
            "its replica are absent)",
    expected={"root_rank": 3, "root_profiled": False, "root_category": "dp_reduction",
              "notes": "ranks 0 and 2 of pp2dp2_wait_before_send, copied: like the seed, one "
                       "PP replica is profiled and the late DP peer (rank 3) is not, so the "
                       "chain ends in rank 2's DP reduction with an unprofiled member"}))

_SEED_SLEEP = Sleep(3, "grad_reduce", 150, inside="DP_REDUCE_GRAD", microbatches=(3,))
_SEED = Case(
    "hsdp_tail_wait_before_send", "pipeline", 4,
    "PP2 x DP2, the seed's scheduler: after the last backward each stage launches its DP "
    "reduction and waits for it before BWD_SEND, then does its remaining local work (250 ms); "
    "rank 3's reduction launch is 150 ms late",
    _megatron_pp2dp2("pp_first"), hidden=160, batch=16, layers=2, microbatches=4,
    reduce="stage_before_send", work_ms=250, sleeps=(_SEED_SLEEP,), prof=(0, 2, 1, 2),
    all_threads=True,
    expected={"root_rank": 3, "root_category": "compute_straggler",
              "notes": "the seed's shape (mindspore hyper-parallel #390) at toy scale: rank 3 "
                       "sleeps 150 ms in DP_REDUCE_GRAD before launching its all_reduce (the "
                       "HSDP reduction state machine late on one member); rank 2 waits for it in "
                       "DP_GRAD_WAIT before its BWD_SEND, so rank 0 waits in BWD_RECV (chain 0 "
                       "-> 2 -> 3) and every rank's 250 ms LOCAL_WORK starts 150 ms late"})
_add(_SEED)

_add(replace(
    _SEED, name="hsdp_tail_wait_after_send", reduce="stage_after_send",
    summary="the fix of hsdp_tail_wait_before_send: BWD_SEND first, the DP reduction launched "
            "on a second thread (DP_REDUCE_GRAD, the same 150 ms late on rank 3) while the main "
            "thread does its LOCAL_WORK, and waited for last",
    expected={"root_rank": 3, "root_category": "compute_straggler",
              "notes": "the seed's fix: the reduction no longer gates BWD_SEND and overlaps the "
                       "250 ms of local work, which hides rank 3's 150 ms late launch: no rank "
                       "waits on rank 3 any more and the step shrinks by about 150 ms"}))

_add(Case(
    "ep4_a2a_layers", "ep", 4,
    "EP4 MoE: dispatch + combine all_to_all per layer, 3 layers x 2 microbatches; rank 1's "
    "experts of layer 1 (mb=1, forward) take 150 ms longer",
    (Family("ep", "ep", "EXPERT_MODEL_PARALLEL_GROUP", ((0, 1, 2, 3),), ("alltoall",)),),
    hidden=64, batch=64, layers=3, microbatches=2,
    sleeps=(Sleep(1, "expert", 150, annotation="expert_imbalance", inside="EXPERT",
                  microbatches=(1,), layer=1),),
    expected={"root_rank": 1, "root_category": "compute_straggler",
              "notes": "all_to_all_single with uneven, deterministic splits on the EP group"}))

_add(Case(
    "dp4_healthy", "dp", 4, "DP4 (DDP-like, default group), no injection (control)",
    (), hidden=768, batch=64, layers=3, prof=(0, 1, 1, 3),
    expected={"root_rank": None, "root_category": None}))

_add(Case(
    "dp4_fwd_straggler", "dp", 4,
    "DP4 (DDP-like, default group); rank 2 sleeps 200 ms in its forward every step",
    (), hidden=256, batch=32, layers=3,
    sleeps=(Sleep(2, "fwd", 200, inside="FWD"),),
    expected={"root_rank": 2, "root_category": "compute_straggler"}))

_add(Case(
    "dp4_opt_straggler", "dp", 4,
    "DP4, explicit DP group; rank 1 sleeps 200 ms in OPT step of step 2 only: the others "
    "wait in step 3's all_reduce",
    (Family("dp", "dp", "DATA_PARALLEL_GROUP", ((0, 1, 2, 3),), ("allreduce",)),),
    hidden=160, batch=32, layers=4,
    sleeps=(Sleep(1, "opt", 200, inside="OPT step", steps=(2,)),),
    expected={"root_rank": 1, "root_category": "compute_straggler",
              "notes": "cause in step 2, waits in step 3 (the step after); step 2 itself has "
                       "no long wait"}))

_add(Case(
    "dp4_before_allreduce", "dp", 4,
    "DP4, explicit DP group created after 4 TP singletons; rank 3 sleeps 200 ms just before "
    "its gradient all_reduce",
    (Family("tp", "tp", "TENSOR_MODEL_PARALLEL_GROUP", ((0,), (1,), (2,), (3,))),
     Family("dp", "dp", "DATA_PARALLEL_GROUP", ((0, 1, 2, 3),), ("allreduce",))),
    hidden=224, batch=24, layers=3,
    sleeps=(Sleep(3, "grad_reduce", 200, inside="DP allreduce"),),
    expected={"root_rank": 3, "root_category": "compute_straggler"}))

_add(Case(
    "dp4_host_stall", "dp", 4,
    "DP4, explicit DP group; rank 0's main thread stalls 180 ms between FWD and BWD, outside "
    "any annotation (a host / data-loader stall)",
    (Family("dp", "dp", "dp", ((0, 1, 2, 3),), ("allreduce",)),),
    hidden=256, batch=32, layers=2,
    sleeps=(Sleep(0, "host", 180, annotation=None, between=("FWD", "BWD"),
                  category="host_launch"),),
    expected={"root_rank": 0, "root_category": "host_launch"}))

_add(Case(
    "world_metrics_allreduce", "pipeline", 4,
    "PP2 x DP2, GPipe 6 microbatches, DP all_reduce in OPT step, then a 1-element all_reduce "
    "of the loss on the WORLD group (metrics); healthy",
    (Family("pp", "pp", "pp_replica{i}", ((0, 1), (2, 3)), ("send", "recv")),
     Family("dp", "dp", "dp_stage{i}", ((0, 2), (1, 3)), ("allreduce",))),
    hidden=128, batch=16, layers=2, microbatches=6, pp_schedule="gpipe", reduce="opt",
    metrics=True, prof=(3, 1, 1, 2),
    expected={"root_rank": None, "root_category": None,
              "non_dp_collectives": [{"group": "0", "annotation": "METRICS allreduce",
                                      "dim": "world"}],
              "notes": "replica A = ranks 0,1 (stages 0,1), replica B = ranks 2,3. Short waits "
                       "in METRICS allreduce (world group) are pipeline drain, not a DP "
                       "reduction"}))


# --- the jobs: run for real in each spawned process, or planned (no communication) -------------


def _mlp(hidden: int, layers: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*mods)


class Handle:
    """An async collective: torch's Work when run for real, its plan id when planned."""

    def __init__(self, work: object, act: int) -> None:
        self.work, self.act = work, act


class Job:
    """One rank's job. Every communication, injected sleep and fixed-duration work goes through
    the methods below, which do it (`real`) and note it as an `Act` with the annotations around
    it, so the same code gives the recording and the schedule the ground truth replays."""

    def __init__(self, rank: int, case: Case, groups: dict[str, tuple[object, tuple[int, ...]]],
                 real: bool = True) -> None:
        self.rank, self.case, self.groups, self.real = rank, case, groups, real
        self.gen = torch.Generator().manual_seed(1234 + rank)
        self.dims = {fam.key: fam.dim for fam in case.families}
        self.acts: list[Act] = []
        self.local = threading.local()  # this thread's annotations and thread number
        self.step_no = -1
        self.handles: dict[int, str] = {}  # async collective's id -> its transfer's category

    # --- what the ground truth replays
    @property
    def where(self) -> list[str]:
        if not hasattr(self.local, "where"):
            self.local.where, self.local.thread = [], 0
        return self.local.where

    @contextmanager
    def ann(self, name: str) -> Iterator[None]:
        """A record_function annotation, also noted as where the acts inside it happen."""
        self.where.append(name)
        try:
            with record_function(name):
                yield
        finally:
            self.where.pop()

    def act(self, kind: str, **fields: object) -> Act:
        act = Act(kind, self.step_no, tuple(self.where), getattr(self.local, "thread", 0),
                  **fields)
        self.acts.append(act)
        return act

    def fork(self, run: Callable[[], None]) -> None:
        """Run `run` on a second thread of the rank (planned: in line, noted as that thread's;
        its start and `join` are rendezvous with the main thread, lane SIDE + rank)."""
        side = SIDE + self.rank
        self.act("p2p", sends=(side,), comm="fork")
        if self.real:
            self.thread = threading.Thread(target=run)
            self.thread.start()
            return
        main = self.where
        self.local.where, self.local.thread = [], 1
        self.act("p2p", recvs=(self.rank,), comm="fork")
        run()
        self.act("p2p", sends=(self.rank,), comm="join")
        self.local.where, self.local.thread = main, 0

    def join(self) -> None:
        self.act("p2p", recvs=(SIDE + self.rank,), comm="join")
        if self.real:
            self.thread.join()

    def begin(self, step: int) -> None:
        self.step_no = step
        self.act("step")

    def sleep(self, phase: str, step: int, mb: int | None = None, layer: int | None = None):
        for index, s in enumerate(self.case.sleeps):
            if (s.rank != self.rank or s.phase != phase
                    or (s.steps is not None and step not in s.steps)
                    or (s.microbatches is not None and mb not in s.microbatches)
                    or (s.layer is not None and layer != s.layer)):
                continue
            if s.annotation:
                with self.ann(s.annotation):
                    self._sleep(s, index)
            else:
                self._sleep(s, index)

    def _sleep(self, s: Sleep, index: int) -> None:
        self.act("sleep", ms=s.ms, injection=index)
        if self.real:
            time.sleep(s.ms / 1000)

    def work(self, name: str, ms: float) -> None:
        """`ms` of real compute (small matmuls until the wall clock says so)."""
        with self.ann(name):
            self.act("compute", ms=ms)
            if not self.real:
                return
            a = torch.randn(512, 512, generator=self.gen)
            until = time.perf_counter() + ms / 1000
            while time.perf_counter() < until:
                a = torch.tanh(a @ a)

    # --- communication
    def group(self, key: str):
        return self.groups[key][0] if key in self.groups else None

    def members(self, key: str) -> tuple[int, ...]:
        return self.groups[key][1] if key in self.groups else tuple(range(self.case.world))

    def category(self, key: str, comm: str) -> str:
        """The category its transfer is charged to, as far as a profile can tell: the group's
        stated dimension's (its desc names it; the default group names none), else the comm
        type's. gloo names no op's group, so when another group of the job has the same
        members and another dimension, no profile can tell which one ran it: `collective`."""
        members = set(self.members(key))
        dims = {fam.dim for fam in self.case.families for ranks in fam.ranks
                if set(ranks) == members}
        dims |= {"world"} if len(members) == self.case.world else set()
        dims |= {self.dims.get(key, "world")}
        return causes.for_collective(dims.pop() if len(dims) == 1 else "", comm)

    def all_reduce(self, t: torch.Tensor, key: str, async_op: bool = False, ms: float = 0.0,
                   ) -> Handle | None:
        handle = len(self.handles) + 1
        self.handles[handle] = self.category(key, "allreduce")
        self.act("collective", members=self.members(key), comm="allreduce", ms=ms,
                 handle=handle, blocking=not async_op, category=self.handles[handle])
        work = dist.all_reduce(t, group=self.group(key), async_op=async_op) if self.real else None
        return Handle(work, handle) if async_op else None

    def wait(self, handle: Handle) -> None:
        self.act("wait", handle=handle.act, category=self.handles[handle.act])
        if handle.work is not None:
            handle.work.wait()

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor, recv: list[int], send: list[int],
                   key: str) -> None:
        self.act("collective", members=self.members(key), comm="alltoall",
                 category=self.category(key, "alltoall"))
        if self.real:
            dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group(key))

    def step(self, step: int) -> None:
        raise NotImplementedError


class Pipeline(Job):
    """One pipeline stage: Megatron-style 1F1B (or GPipe) with P2P on the PP group."""

    def __init__(self, rank, case, groups, real=True):
        super().__init__(rank, case, groups, real)
        pp_group, pp_ranks = groups["pp"]
        self.pp = pp_group
        self.stage, self.stages = pp_ranks.index(rank), len(pp_ranks)
        self.prev = pp_ranks[self.stage - 1] if self.stage > 0 else None
        self.next = pp_ranks[self.stage + 1] if self.stage < self.stages - 1 else None
        self.dp_size = len(groups["dp"][1]) if "dp" in groups else 1
        # the first stage has one layer more (it would hold the embedding): stages' gradient
        # all_reduces differ in size, as in real pipelines, so a profile tells them apart
        self.model = _mlp(case.hidden, case.layers + (self.stage == 0), 100 + self.stage)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.loss = torch.zeros(1)

    # P2P: a plain send / recv for one direction, batch_isend_irecv for a combined one
    def p2p(self, name: str, send: torch.Tensor | None = None, to: int | None = None,
            recv_from: int | None = None) -> torch.Tensor | None:
        send_to = to if send is not None else None
        if send_to is None and recv_from is None:
            return None
        buf = torch.zeros(self.case.batch, self.case.hidden) if recv_from is not None else None
        with self.ann(name):
            sends = () if send_to is None else (send_to,)
            recvs = () if recv_from is None else (recv_from,)
            comm = "exchange" if sends and recvs else "send" if sends else "recv"
            self.act("p2p", sends=sends, recvs=recvs, comm=comm,
                     category=self.category("pp", "send"))
            if not self.real:
                return buf
            if send_to is not None and recv_from is not None:
                ops = [dist.P2POp(dist.isend, send, send_to, self.pp),
                       dist.P2POp(dist.irecv, buf, recv_from, self.pp)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
            elif send_to is not None:
                dist.send(send, send_to, group=self.pp)
            else:
                dist.recv(buf, recv_from, group=self.pp)
        return buf

    def forward(self, step: int, mb: int, x: torch.Tensor | None):
        if x is None:
            x = torch.randn(self.case.batch, self.case.hidden, generator=self.gen)
        else:
            x.requires_grad_()
        y = self.model(x)
        if self.next is None:
            y = y.pow(2).mean()
            self.loss += y.detach()
        self.sleep("fwd", step, mb)
        return x, y

    def backward(self, step: int, mb: int, x, y, grad) -> torch.Tensor | None:
        y.backward() if grad is None else y.backward(grad)
        self.sleep("bwd", step, mb)
        return x.grad.detach() if self.prev is not None else None

    def last_backward_tail(self, step: int, gx: torch.Tensor | None) -> None:
        """After the last microbatch's backward: the DP gradient reduction, BWD_SEND and the
        local work, in the order of the case's TAILS entry."""
        handles: list[Handle] = []
        flat = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

        def launch() -> None:
            with self.ann("DP_REDUCE_GRAD"):
                self.sleep("grad_reduce", step, self.case.microbatches - 1)
                handles.append(self.all_reduce(flat, "dp", async_op=True))

        for phase in TAILS.get(self.case.reduce, ("send",)):
            if phase == "send":
                self.p2p("BWD_SEND", gx, self.prev)
            elif phase in ("launch", "fork"):
                launch() if phase == "launch" else self.fork(launch)
            elif phase in ("wait", "join"):
                with self.ann("DP_GRAD_WAIT"):
                    if phase == "join":
                        self.join()
                    for handle in handles:
                        self.wait(handle)
            elif phase == "work":
                self.work("LOCAL_WORK", self.case.work_ms)
        if handles:
            self._unflatten(flat)

    def _unflatten(self, flat: torch.Tensor) -> None:
        flat /= self.dp_size
        offset = 0
        for p in self.model.parameters():
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def one_f_one_b(self, step: int) -> None:
        m = self.case.microbatches
        warm = min(self.stages - self.stage - 1, m)
        pending: deque = deque()
        for i in range(warm):
            with self.ann(f"FWD mb={i}"):
                x = self.p2p("FWD_RECV", recv_from=self.prev)
                x, y = self.forward(step, i, x)
                self.p2p("FWD_SEND", y.detach(), self.next)
            pending.append((x, y))
        gx_prev = None
        rem = m - warm
        for k in range(rem):
            f = warm + k
            with self.ann(f"FWD mb={f}"):
                if k == 0:
                    x = self.p2p("FWD_RECV", recv_from=self.prev)
                else:  # the backward send of mb k-1 travels with this microbatch's input
                    name = "BWD_SEND_FWD_RECV" if gx_prev is not None else "FWD_RECV"
                    x = self.p2p(name, gx_prev, self.prev, self.prev)
                x, y = self.forward(step, f, x)
            pending.append((x, y))
            with self.ann(f"BWD mb={k}"):
                grad = None
                if self.next is not None:
                    grad = self.p2p("FWD_SEND_BWD_RECV", y.detach(), self.next, self.next)
                x, y = pending.popleft()
                gx = self.backward(step, k, x, y, grad)
                gx_prev = None
                if k == m - 1:
                    self.last_backward_tail(step, gx)
                elif k == rem - 1:
                    self.p2p("BWD_SEND", gx, self.prev)
                else:
                    gx_prev = gx
        for i in range(warm):
            b = rem + i
            with self.ann(f"BWD mb={b}"):
                grad = self.p2p("BWD_RECV", recv_from=self.next)
                x, y = pending.popleft()
                gx = self.backward(step, b, x, y, grad)
                if b == m - 1:
                    self.last_backward_tail(step, gx)
                else:
                    self.p2p("BWD_SEND", gx, self.prev)

    def gpipe(self, step: int) -> None:
        m = self.case.microbatches
        saved = []
        for i in range(m):
            with self.ann(f"FWD mb={i}"):
                x = self.p2p("FWD_RECV", recv_from=self.prev)
                x, y = self.forward(step, i, x)
                self.p2p("FWD_SEND", y.detach(), self.next)
            saved.append((x, y))
        for i in reversed(range(m)):
            with self.ann(f"BWD mb={i}"):
                grad = self.p2p("BWD_RECV", recv_from=self.next)
                x, y = saved[i]
                gx = self.backward(step, i, x, y, grad)
                self.p2p("BWD_SEND", gx, self.prev)

    def step(self, step: int) -> None:
        self.loss.zero_()
        (self.gpipe if self.case.pp_schedule == "gpipe" else self.one_f_one_b)(step)
        with self.ann("OPT step"):
            self.sleep("opt", step)
            if self.case.reduce == "opt":
                flat = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])
                self.all_reduce(flat, "dp")
                self._unflatten(flat)
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)
        if self.case.metrics:
            with self.ann("METRICS allreduce"):
                self.all_reduce(self.loss, "world")  # the WORLD group: metrics, not DP


class DataParallel(Job):
    """DDP-like: FWD, BWD, bucketed async gradient all_reduce, SGD step."""

    def __init__(self, rank, case, groups, real=True):
        super().__init__(rank, case, groups, real)
        self.model = _mlp(case.hidden, case.layers, 7)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def step(self, step: int) -> None:
        x = torch.randn(self.case.batch, self.case.hidden, generator=self.gen)
        with self.ann("FWD"):
            loss = self.model(x).pow(2).mean()
            self.sleep("fwd", step)
        self.sleep("host", step)  # outside any annotation
        with self.ann("BWD"):
            loss.backward()
            self.sleep("bwd", step)
        with self.ann("DP allreduce"):
            self.sleep("grad_reduce", step)
            params = list(self.model.parameters())
            half = len(params) // 2
            buckets = [torch.cat([p.grad.reshape(-1) for p in ps])
                       for ps in (params[half:], params[:half])]  # last layers first, like DDP
            # no "dp" group: the default group, as torch DDP uses
            handles = [self.all_reduce(b, "dp", async_op=True) for b in buckets]
            for handle in handles:
                self.wait(handle)
            for ps, b in zip((params[half:], params[:half]), buckets, strict=True):
                offset = 0
                for p in ps:
                    p.grad.copy_(b[offset:offset + p.numel()].view_as(p.grad) / self.case.world)
                    offset += p.numel()
        with self.ann("OPT step"):
            self.sleep("opt", step)
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)


class ExpertParallel(Job):
    """MoE layers: router, dispatch all_to_all, expert MLP, combine all_to_all (one expert per
    rank); the backward runs the same exchanges in reverse, computed by hand."""

    def __init__(self, rank, case, groups, real=True):
        super().__init__(rank, case, groups, real)
        self.size = len(groups["ep"][1])
        torch.manual_seed(50 + rank)
        h, layers = case.hidden, case.layers
        self.router = [torch.randn(h, self.size) * 0.02 for _ in range(layers)]
        self.w1 = [torch.randn(h, 2 * h) * 0.02 for _ in range(layers)]
        self.w2 = [torch.randn(2 * h, h) * 0.02 for _ in range(layers)]

    def splits(self, src: int, layer: int, mb: int) -> list[int]:
        """Rows `src` sends to each expert rank: uneven, deterministic, summing to batch."""
        base = self.case.batch // self.size
        deltas = [3, 1, -1, -3][: self.size] if self.size == 4 else [0] * self.size
        shift = (src + layer + mb) % self.size
        return [base + deltas[(j + shift) % self.size] for j in range(self.size)]

    def a2a(self, name: str, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = torch.zeros(sum(recv), x.shape[1])
        with self.ann(name):
            self.all_to_all(out, x, recv, send, "ep")
        return out

    def step(self, step: int) -> None:
        c = self.case
        saved = {}
        for mb in range(c.microbatches):
            with self.ann(f"FWD mb={mb}"):
                x = torch.randn(c.batch, c.hidden, generator=self.gen)
                for layer in range(c.layers):
                    send = self.splits(self.rank, layer, mb)
                    recv = [self.splits(j, layer, mb)[self.rank] for j in range(self.size)]
                    with self.ann(f"MoE layer={layer}"):
                        with self.ann("ROUTER"):
                            torch.softmax(x @ self.router[layer], dim=-1)
                        tokens = self.a2a("EP dispatch", x, send, recv)
                        with self.ann("EXPERT"):
                            hid = torch.nn.functional.gelu(tokens @ self.w1[layer])
                            out = hid @ self.w2[layer]
                            self.sleep("expert", step, mb, layer)
                        saved[mb, layer] = (tokens, hid)
                        x = x + self.a2a("EP combine", out, recv, send)
        for mb in reversed(range(c.microbatches)):
            with self.ann(f"BWD mb={mb}"):
                g = torch.randn(c.batch, c.hidden, generator=self.gen) * 1e-3
                for layer in reversed(range(c.layers)):
                    send = self.splits(self.rank, layer, mb)
                    recv = [self.splits(j, layer, mb)[self.rank] for j in range(self.size)]
                    with self.ann(f"MoE layer={layer}"):
                        gout = self.a2a("EP combine", g, send, recv)
                        with self.ann("EXPERT"):
                            tokens, hid = saved[mb, layer]
                            ghid = gout @ self.w2[layer].T
                            self.w2[layer] -= 1e-4 * (hid.T @ gout)
                            self.w1[layer] -= 1e-4 * (tokens.T @ ghid)
                            gtok = ghid @ self.w1[layer].T
                        g = g + self.a2a("EP dispatch", gtok, recv, send)
        with self.ann("OPT step"):
            for w in self.router:
                w.mul_(0.999)


JOBS: dict[str, Callable[..., Job]] = {
    "pipeline": Pipeline, "dp": DataParallel, "ep": ExpertParallel}


def plan(case: Case) -> dict[int, list[Act]]:
    """Every lane's program: each rank's job run in this process without torch.distributed."""
    programs = {}
    for rank in range(case.world):
        groups = {fam.key: (None, ranks) for fam in case.families for ranks in fam.ranks
                  if rank in ranks}
        job = JOBS[case.kind](rank, case, groups, real=False)
        for step in range(case.steps):
            job.begin(step)
            job.step(step)
        job.begin(case.steps)
        programs[rank] = job.acts
    return lanes(programs)


def worker(rank: int, name: str, port: int, tmp: str) -> None:
    case = CASES[name]
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    with suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=case.world)
    groups: dict[str, tuple[object, tuple[int, ...]]] = {}
    for fam in case.families:
        for i, ranks in enumerate(fam.ranks):
            group = dist.new_group(list(ranks), group_desc=fam.desc.format(i=i))
            if rank in ranks:
                groups[fam.key] = (group, ranks)
    job = JOBS[case.kind](rank, case, groups)
    skip, wait, warmup, active = case.prof
    out = os.path.join(tmp, f"rank{rank}.json")
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=False,
                 schedule=schedule(skip_first=skip, wait=wait, warmup=warmup, active=active,
                                   repeat=1),
                 experimental_config=_ExperimentalConfig(profile_all_threads=case.all_threads),
                 on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for step in range(case.steps):
            job.begin(step)
            job.step(step)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


# --- recording, checking and ground truth (the parent process) ----------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spans(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("name") == name]


def _step_of(events: list[dict], ts: float) -> int | None:
    for e in events:
        if (e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                and e["ts"] <= ts <= e["ts"] + e["dur"]):
            return int(e["name"].split("#")[1])
    return None


def check(case: Case, traces: dict[int, dict]) -> dict[str, object]:
    """Sanity checks of a recording (raise if the injection is not where it was put); returns
    what was measured, for the log only (ground truth is what was injected)."""
    measured: dict[str, object] = {}
    for rank, trace in traces.items():
        info = trace["distributedInfo"]
        assert info["rank"] == rank and info["world_size"] == case.world, (case.name, rank)
        events = trace["traceEvents"]
        steps = sorted(int(e["name"].split("#")[1]) for e in events
                       if str(e.get("name", "")).startswith("ProfilerStep#") and e["ph"] == "X")
        assert steps == case.profiled, (case.name, rank, steps)
        longest = {s: max(e["dur"] for e in _spans(events, f"ProfilerStep#{s}")) / 1e3
                   for s in steps}
        measured[f"rank{rank} step ms"] = {s: round(v, 1) for s, v in longest.items()}
    for s in case.sleeps:
        want = [st for st in case.profiled if s.steps is None or st in s.steps]
        for rank, trace in traces.items():
            events = trace["traceEvents"]
            if s.annotation is None:  # host stall: the gap between two annotations
                after, before = _spans(events, s.between[0]), _spans(events, s.between[1])
                gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(after, before, strict=True)]
                long = [g for g in gaps if g >= 0.9 * s.ms * 1e3]
                assert len(long) == (len(want) if rank == s.rank else 0), (case.name, rank, gaps)
                if rank == s.rank:
                    measured[f"rank{rank} stall ms"] = [round(g / 1e3, 1) for g in gaps]
                continue
            spans = _spans(events, s.annotation)
            if rank != s.rank:
                assert not spans, (case.name, rank, s.annotation)
                continue
            per_step = len(s.microbatches) if s.microbatches else 1
            if s.phase in ("fwd", "bwd") and s.microbatches is None:
                per_step = case.microbatches
            assert len(spans) == per_step * len(want), (case.name, rank, len(spans))
            assert {_step_of(events, e["ts"]) for e in spans} == set(want)
            assert min(e["dur"] for e in spans) >= 0.9 * s.ms * 1e3, (case.name, rank)
            measured[f"rank{rank} {s.annotation} ms"] = [round(e["dur"] / 1e3, 1) for e in spans]
    measured["replayed waits"] = _check_replayed_waits(case, traces)
    return measured


def _check_replayed_waits(case: Case, traces: dict[int, dict]) -> int:
    """Every wait the replay states (20 ms or more, in an annotation of its own) lasted at least
    half as long in the recording: the replayed schedule is the job that ran."""
    injections = [_injection(case, s) for s in case.sleeps]
    waits = expected(case, list(range(case.world)), injections)["waits"]
    checked = 0
    for w in waits:
        if w["ms"] < 20 or w["op"] == "idle" or w["op"] == "wait" and len(w["where"]) < 2:
            continue
        real = _annotation_ms(traces[w["rank"]]["traceEvents"], w["step"], w["where"])
        assert real >= 0.5 * w["ms"], (case.name, w, real)
        checked += 1
    return checked


def _annotation_ms(events: list[dict], step: int, where: list[str]) -> float:
    """How long the annotation `where[-1]`, inside the others of `where`, lasted in a step."""
    (marker,) = _spans(events, f"ProfilerStep#{step}")
    lo, hi = marker["ts"], marker["ts"] + marker["dur"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("tid") == marker["tid"]
             and e.get("cat") == "user_annotation" and lo <= e["ts"] <= hi]
    for e in spans:
        if e["name"] != where[-1]:
            continue
        around = {o["name"] for o in spans
                  if o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]}
        if set(where[:-1]) <= around:
            return e["dur"] / 1e3
    raise AssertionError(f"no {where} in step {step}")


def _groups(case: Case, traces: dict[int, dict]) -> list[dict]:
    """Every group as torch named it (distributedInfo.pg_config of the ranks that hold it), with
    the dimension and use the case states for it."""
    seen: dict[str, dict] = {}
    listed: dict[str, list[int]] = {}
    for rank, trace in sorted(traces.items()):
        for pg in trace["distributedInfo"]["pg_config"]:
            seen.setdefault(pg["pg_name"], pg)
            listed.setdefault(pg["pg_name"], []).append(rank)
    stated = {(tuple(sorted(r)), fam.desc.format(i=i)): fam
              for fam in case.families for i, r in enumerate(fam.ranks)}
    out = []
    for name, pg in sorted(seen.items(), key=lambda kv: int(kv[0])):
        ranks = sorted(pg["ranks"])
        fam = stated.get((tuple(ranks), pg["pg_desc"]))
        dim, comms = (fam.dim, list(fam.comms)) if fam else ("world", [])
        if name == "0":
            if case.kind == "dp" and not any(f.key == "dp" for f in case.families):
                dim, comms = "dp", ["allreduce"]  # torch DDP reduces on the default group
            elif case.metrics:
                comms = ["allreduce"]
        out.append({"name": name, "desc": pg["pg_desc"], "ranks": ranks, "dim": dim,
                    "comms": comms, "listed_by": listed[name]})
    return out


def _parallelism(case: Case) -> dict[str, object]:
    sizes = {"pp": 1, "dp": 1, "ep": 1, "tp": 1}
    for fam in case.families:
        sizes[fam.key] = max(sizes.get(fam.key, 1), max(len(r) for r in fam.ranks))
    if case.kind == "dp" and sizes["dp"] == 1:
        sizes["dp"] = case.world
    out: dict[str, object] = {k: v for k, v in sizes.items() if k in ("pp", "dp", "ep", "tp")}
    out["microbatches"] = case.microbatches
    out["layers"] = case.layers
    out["hidden"] = case.hidden
    out["batch"] = case.batch
    out["group_order"] = [f.key for f in case.families]
    if case.kind == "pipeline":
        pp = next(f for f in case.families if f.key == "pp")
        out["schedule"] = case.pp_schedule
        out["layers_of_stage"] = [case.layers + (s == 0) for s in range(len(pp.ranks[0]))]
        stage = {r: ranks.index(r) for ranks in pp.ranks for r in ranks}
        out["stage_of_rank"] = {str(r): stage[r] for r in sorted(stage)}
        out["dp_reduction"] = case.reduce
        out["tail"] = list(TAILS.get(case.reduce, ()))
        out["local_work_ms"] = case.work_ms
    return out


def _injection(case: Case, s: Sleep) -> dict[str, object]:
    d = asdict(s)
    d["duration_ms"] = d.pop("ms")
    d["steps"] = [st for st in case.profiled if s.steps is None or st in s.steps]
    if s.phase in ("fwd", "bwd") and s.microbatches is None and case.microbatches > 1:
        d["microbatches"] = list(range(case.microbatches))
    d["inside"] = s.inside.replace("{mb}", "i") if s.inside else None
    d["root_category"] = d.pop("category")
    return d


def truth(case: Case, ranks: list[int], groups: list[dict]) -> dict[str, object]:
    injections = [_injection(case, s) for s in case.sleeps]
    return {
        "case": case.name,
        "summary": case.summary,
        "recorded_with": {"torch": torch.__version__, "backend": "gloo", "host": "127.0.0.1",
                          "profiler": "torch.profiler, activities=[CPU], record_shapes=True",
                          "threads_per_rank": 1, "interop_threads": 1,
                          "priority": f"own session's autogroup at nice {NICE}",
                          "script": "bench/record_corpus.py"},
        "world_size": case.world,
        "ranks": ranks,
        "absent_ranks": sorted(set(range(case.world)) - set(ranks)),
        "files": {str(r): f"rank{r}.json.gz" for r in ranks},
        "copied_from": case.copy_of or None,
        "parallelism": _parallelism(case),
        "groups": groups,
        "profiled_steps": case.profiled,
        "healthy": not case.sleeps,
        "injections": injections,
        "expected": expected(case, ranks, injections),
    }


def expected(case: Case, ranks: list[int], injections: list[dict]) -> dict[str, object]:
    """The hand-stated root and notes, and every wait of the profiled steps on the ranks in the
    folder, from the replayed schedule."""
    idle = causes.PIPELINE_FILL if case.kind == "pipeline" else causes.PEER_COMPUTE
    programs = plan(case)
    waits = stated_waits(replay(programs, case.profiled), case.profiled, injections, idle,
                         absent=set(range(case.world)) - set(ranks))
    categories = sorted({a.category for acts in programs.values() for a in acts if a.category})
    return {**{k: v for k, v in case.expected.items() if k != "notes"},
            "root_profiled": case.expected.get("root_profiled", True),
            "idle_category": idle,
            "comm_categories": categories,
            "waits": [w for w in waits if w["rank"] in ranks],
            "notes": case.expected.get("notes", "")}


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def rewrite_truth(case: Case, out: Path) -> None:
    """Rewrite ground_truth.json of a recorded case from its files (no new recording)."""
    folder = out / case.name
    if case.copy_of:
        return record(case, out)
    traces = {r: json.loads(gzip.decompress((folder / f"rank{r}.json.gz").read_bytes()))
              for r in range(case.world)}
    check(case, traces)
    _write_json(folder / "ground_truth.json",
                truth(case, list(range(case.world)), _groups(case, traces)))
    print(f"{case.name}: ground truth rewritten", flush=True)


def record(case: Case, out: Path) -> None:
    folder = out / case.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if case.copy_of:
        src = out / case.copy_of
        whole = json.loads((src / "ground_truth.json").read_text())
        for r in case.keep:
            shutil.copyfile(src / f"rank{r}.json.gz", folder / f"rank{r}.json.gz")
        groups = [{**g, "listed_by": [r for r in g["listed_by"] if r in case.keep]}
                  for g in whole["groups"]]
        _write_json(folder / "ground_truth.json", truth(case, list(case.keep), groups))
        print(f"{case.name}: copied ranks {list(case.keep)} of {case.copy_of}", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix=f"corpus-{case.name}-") as tmp:
        started = time.time()
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        mp.spawn(worker, args=(case.name, _free_port(), tmp), nprocs=case.world, join=True)
        traces = {r: json.loads(Path(tmp, f"rank{r}.json").read_text())
                  for r in range(case.world)}
        for r in range(case.world):
            raw = Path(tmp, f"rank{r}.json").read_bytes()
            with gzip.GzipFile(folder / f"rank{r}.json.gz", "wb", compresslevel=9, mtime=0) as gz:
                gz.write(raw)
    try:
        measured = check(case, traces)
    except AssertionError:  # keep it to look at, out of the corpus
        rejected = folder.with_name(folder.name + ".rejected")
        shutil.rmtree(rejected, ignore_errors=True)
        folder.rename(rejected)
        print(f"{case.name}: rejected, kept in {rejected}", file=sys.stderr)
        raise
    _write_json(folder / "ground_truth.json",
                truth(case, list(range(case.world)), _groups(case, traces)))
    print(f"{case.name}: {time.time() - started:.1f} s; {json.dumps(measured)}", flush=True)


def _prioritize() -> None:
    """Run the recording in a scheduling group of its own at NICE: the kernel's autogroups share
    the CPU between sessions whatever a process's own nice value, so the recorder starts a
    session and raises its group (root only; otherwise it records at normal priority)."""
    try:
        if os.getsid(0) != os.getpid():
            os.setsid()
        Path("/proc/self/autogroup").write_text(f"{NICE}\n")
    except OSError as error:
        print(f"warning: recording at normal priority ({error})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/corpus"))
    parser.add_argument("--case", action="append", choices=sorted(CASES),
                        help="record only this case (repeatable); default: all")
    parser.add_argument("--truth-only", action="store_true",
                        help="rewrite ground_truth.json from the recorded files, record nothing")
    args = parser.parse_args(argv)
    if not torch.__version__.startswith("2.13.0"):
        print(f"warning: torch {torch.__version__}, the corpus was recorded with 2.13.0",
              file=sys.stderr)
    names = args.case or list(CASES)
    if not args.truth_only:
        _prioritize()
    for name in [n for n in CASES if n in names]:  # sources before the cases copied from them
        case = CASES[name]
        if args.truth_only:
            rewrite_truth(case, args.out)
            continue
        if case.copy_of and not (args.out / case.copy_of / "ground_truth.json").exists():
            record(CASES[case.copy_of], args.out)
        record(case, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
