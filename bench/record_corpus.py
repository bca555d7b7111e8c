#!/usr/bin/env python3
"""Record tests/data/corpus: real PyTorch-profiler traces of small gloo jobs with known causes.

A dev tool, not part of tracegraph (it and corpus_schedule.py are the only files that import
torch). For every case it spawns `world` processes on 127.0.0.1 (gloo), creates the case's
process groups in the case's order, runs a few steps of a tiny model (pipeline: 1F1B, GPipe or
Megatron's interleaved 1F1B, optionally with tensor-parallel layers and tied embeddings; DP;
EP; CP ring attention) with Megatron-like `record_function` annotations (`FWD mb=i`,
`BWD chunk=c mb=i`, `FWD_SEND`, `BWD_SEND`, `DP_REDUCE_GRAD`, `ring step k`, `OPT step`, ...)
under `torch.profiler.profile(activities=[CPU], record_shapes=True)` with a wait / warmup /
active schedule, injects the case's delay with `time.sleep` (inside a named annotation, or
outside any for a host stall), exports each rank with `export_chrome_trace` and gzips it to
`rankN.json.gz`.

`ground_truth.json` is written from the job itself, never from running tracegraph: what was
injected, and every wait of the profiled steps with its cause, from a replay of the job's own
schedule (corpus_schedule.py): each rank's program is run once more without torch.distributed
("plan" mode) and the programs are replayed against each other.

Noise: 4 or 8 processes share the 2 cores of the machine the corpus is recorded on, with
other work. Each rank runs one thread of torch work (intra- and inter-op threads 1); the
recording runs in a scheduling group of its own at nice -20 (root only: the kernel shares the
CPU between session groups whatever a process's nice value), so other work on the host rarely
deschedules a rank. A healthy P2P exchange then takes a few ms (up to ~40 ms without it); the
injected delays are ≥ 50 ms per occurrence (≥ 150 ms with 8 processes).

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from corpus_schedule import (
    SIDE,
    Act,
    Recorded,
    Timed,
    lanes,
    rank_of,
    replay,
    stated_waits,
    stragglers,
)
from torch import nn
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, record_function, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracegraph import causes  # noqa: E402  (category names only)
from tracegraph.schema import P2P_COMMS  # noqa: E402

NICE = -20  # the recording processes' priority (root only): other work on the host waits

# --- case description ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """Process groups created together, in this order, by every rank (`new_group` per list)."""

    key: str  # the role the job uses them for: pp | dp | ep | tp | cp | embd | metrics
    dim: str  # the parallel dimension stated in ground_truth.json: pp | dp | ep | tp | cp | world
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
    layer: int | None = None  # EP: the MoE layer; TP, CP: the layer
    chunk: int | None = None  # interleaved pipeline: the model chunk
    ring_step: int | None = None  # CP: the ring attention step
    steps: tuple[int, ...] | None = None  # None: every step, profiled or not
    category: str = "compute_straggler"  # tracegraph's root-cause category for it


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # pipeline | dp | ep | cp
    world: int
    summary: str
    families: tuple[Family, ...]
    hidden: int
    batch: int
    layers: int = 2
    microbatches: int = 1
    pp_schedule: str = "1f1b"  # 1f1b | gpipe | interleaved (Megatron's, `chunks` per rank)
    chunks: int = 1  # model chunks per pipeline rank (virtual pipeline stages)
    reduce: str = ""  # pipeline DP reduction: a key of TAILS or CHUNK_REDUCTIONS, "opt" (in
    # OPT step), "finalize" (FINALIZE_GRADS before OPT step: DP, then embedding) or ""
    work_ms: float = 0.0  # pipeline: LOCAL_WORK after the last backward (see TAILS); DP: the
    # declared compute of each FWD
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


CHUNK_REDUCTIONS = {
    # interleaved pipeline: each chunk's DP gradient all_reduce is launched async right after
    # the chunk's last backward (DP_REDUCE_GRAD chunk=c, Megatron's overlap_grad_reduce)
    "overlap": "waited for in FINALIZE_GRADS, before the optimizer",  # Megatron's own
    "overlap_wait_before_send": "waited for at once, before the backward send",  # the seed's bug
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


def _megatron(tp: int, cp: int, dp: int, pp: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Megatron's groups of each dimension for its default rank order (tp fastest, then cp,
    dp, pp): the ranks that differ only in that dimension's coordinate."""
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    world, out = tp * cp * dp * pp, {}
    for dim, size in sizes.items():
        stride = 1
        for inner in list(sizes)[:list(sizes).index(dim)]:
            stride *= sizes[inner]
        starts = [r for r in range(world) if r // stride % size == 0]
        out[dim] = tuple(tuple(s + i * stride for i in range(size)) for s in starts)
    return out


_VPP = _megatron(tp=1, cp=1, dp=2, pp=4)
_VPP_FAMILIES = (
    Family("dp", "dp", "DATA_PARALLEL_GROUP", _VPP["dp"], ("allreduce",)),
    Family("pp", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", _VPP["pp"], ("send", "recv")))
_VPP_SLEEP = Sleep(7, "grad_reduce", 200, inside="DP_REDUCE_GRAD chunk=1", chunk=1)
_VPP_NOTE = ("Megatron layout (dp fastest): stage s = ranks 2s, 2s+1; pipeline replicas A = "
             "{0,2,4,6} and B = {1,3,5,7}; DP groups {0,1}, {2,3}, {4,5}, {6,7}. Interleaved "
             "1F1B, 2 model chunks per rank, 4 microbatches: stages 0 and 1 run all their "
             "forwards first (Megatron's all-warm-up). Each chunk's DP gradient all_reduce is "
             "launched async right after the chunk's last backward (DP_REDUCE_GRAD chunk=c); "
             "rank 7 (stage 3 of replica B) sleeps 200 ms before launching chunk 1's, which "
             "holds its later backward sends, so all of replica B runs ~200 ms late.")
_VPP_ASYNC = Case(
    "pp4dp2_vpp_async_reduce", "pipeline", 8,
    "PP4 x DP2 interleaved (2 chunks per rank), each chunk's DP reduction launched async after "
    "its last backward and waited for before the optimizer; rank 7 launches chunk 1's 200 ms "
    "late",
    _VPP_FAMILIES, hidden=64, batch=8, layers=1, microbatches=4, pp_schedule="interleaved",
    chunks=2, reduce="overlap", sleeps=(_VPP_SLEEP,), prof=(0, 1, 1, 2),
    expected={"root_rank": 7, "root_category": "compute_straggler",
              "notes": _VPP_NOTE + " The reductions overlap replica A's remaining backwards; "
                       "every rank of replica A then waits in FINALIZE_GRADS / DP_GRAD_WAIT "
                       "chunk=0 (its DP peer in replica B is late, through B's pipeline: rank "
                       "0 -> 1 -> 3 -> 5 -> 7 ...), a wait on a reduction launched long "
                       "before."})
_add(_VPP_ASYNC)

_add(replace(
    _VPP_ASYNC, name="pp4dp2_vpp_async_reduce_one_replica", copy_of=_VPP_ASYNC.name,
    keep=(0, 2, 4, 6),
    summary="pp4dp2_vpp_async_reduce with only pipeline replica A (ranks 0, 2, 4, 6) in the "
            "bundle: the late DP peers (replica B, rank 7's delay) are absent",
    expected={"root_rank": 7, "root_profiled": False, "root_category": "dp_reduction",
              "notes": "ranks 0, 2, 4, 6 of pp4dp2_vpp_async_reduce, copied: every profiled "
                       "rank blocks ~200 ms in FINALIZE_GRADS / DP_GRAD_WAIT chunk=0 on its "
                       "absent DP peer (1, 3, 5, 7 in turn: the group to profile); the delay "
                       "began on rank 7"}))

_add(replace(
    _VPP_ASYNC, name="pp4dp2_vpp_wait_before_send", reduce="overlap_wait_before_send",
    summary="the interleaved PP4 x DP2 job with each chunk's reduction waited for right after "
            "its launch, before the backward send (the seed's bug); rank 7 launches chunk 1's "
            "200 ms late",
    expected={"root_rank": 7, "root_category": "compute_straggler",
              "notes": _VPP_NOTE + " Each rank now waits for a chunk's reduction (DP_GRAD_WAIT "
                       "chunk=c) before that block's batched P2P, so rank 6 (7's DP peer) holds "
                       "its sends and receives ~200 ms and replica A's pipeline stalls behind "
                       "it too. Batched calls of several halves (a send and a receive to "
                       "different peers) are held by one half: see each wait's `halves` / "
                       "`bound`."}))

_EMBD = _megatron(tp=1, cp=1, dp=2, pp=2)
_add(Case(
    "pp2dp2_embedding_groups", "pipeline", 4,
    "PP2 x DP2 as Megatron builds it: every rank in a DP group and a PP group of 2, and the "
    "tied-embedding group of the first and last stage (same members as the PP group); the DP "
    "all_reduce, then the embedding all_reduce; rank 1 straggles in its last backward",
    (Family("dp", "dp", "DATA_PARALLEL_GROUP", _EMBD["dp"], ("allreduce",)),
     Family("pp", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", _EMBD["pp"], ("send", "recv")),
     Family("embd", "pp", "EMBEDDING_GROUP", _EMBD["pp"], ("allreduce",))),
    hidden=96, batch=16, layers=2, microbatches=4, reduce="finalize",
    sleeps=(Sleep(1, "bwd", 150, inside="BWD mb={mb}", microbatches=(3,)),),
    expected={"root_rank": 1, "root_category": "compute_straggler",
              "notes": "Megatron layout: stage 0 = ranks 0,1, stage 1 = ranks 2,3; DP groups "
                       "{0,1}, {2,3}; PP groups {0,2}, {1,3}; embedding groups {0,2}, {1,3} "
                       "(first and last stage). After the schedule, FINALIZE_GRADS: "
                       "DP_GRAD_ALLREDUCE (DP group), then EMBEDDING_GRAD_ALLREDUCE (the tied "
                       "word embeddings' gradient, embedding group). Rank 1 sleeps 150 ms in "
                       "its last backward (stage 0: nothing sent after it): rank 0 waits for "
                       "it in the DP all_reduce, rank 3 in the embedding all_reduce, and rank "
                       "2 in the embedding all_reduce for rank 0 (chain 2 -> 0 -> 1). Every "
                       "rank runs collectives on two groups of 2 and gloo names neither: "
                       "each wait states its group."}))

_add(Case(
    "cp4_ring", "cp", 4,
    "CP4 ring attention: each attention layer's K/V blocks go around the 4 ranks, one "
    "batch_isend_irecv per ring step (send to the next, receive from the previous), overlapped "
    "with the step's attention; rank 2's attention of ring step 1 (layer 0, forward) takes "
    "150 ms longer",
    (Family("dp", "dp", "DATA_PARALLEL_GROUP", _megatron(1, 4, 1, 1)["dp"]),
     Family("cp", "cp", "CONTEXT_PARALLEL_GROUP", ((0, 1, 2, 3),),
            ("send", "recv", "allreduce"))),
    hidden=64, batch=32, layers=2,
    sleeps=(Sleep(2, "fwd", 150, inside="ATTENTION", layer=0, ring_step=1),),
    expected={"root_rank": 2, "root_category": "compute_straggler",
              "notes": "no pipeline: the ring is the context-parallel group (0 -> 1 -> 2 -> 3 "
                       "-> 0). Rank 2 posts its step-2 exchange 150 ms late: rank 3 waits on "
                       "its receive from 2, rank 1 on its send to 2 (its receive from 0 was "
                       "released long before), then rank 0 on both; see each wait's "
                       "`halves` / `bound`"}))

_TP = _megatron(tp=2, cp=1, dp=2, pp=2)
_add(Case(
    "tp2pp2dp2_tp_straggler", "pipeline", 8,
    "TP2 x PP2 x DP2: a tensor-parallel MLP per layer (all_reduce on the TP group in forward "
    "and backward), 1F1B P2P, the DP all_reduce in FINALIZE_GRADS; rank 5's TP-region compute "
    "of layer 0 (mb=1, forward) takes 150 ms longer",
    (Family("dp", "dp", "DATA_PARALLEL_GROUP", _TP["dp"], ("allreduce",)),
     Family("tp", "tp", "TENSOR_MODEL_PARALLEL_GROUP", _TP["tp"], ("allreduce",)),
     Family("pp", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", _TP["pp"], ("send", "recv"))),
    hidden=64, batch=16, layers=1, microbatches=4, reduce="finalize",
    sleeps=(Sleep(5, "fwd", 150, inside="TP_REGION layer=0", microbatches=(1,), layer=0),),
    expected={"root_rank": 5, "root_category": "compute_straggler",
              "notes": "Megatron layout (tp fastest, then dp, pp): TP groups {0,1}, {2,3}, "
                       "{4,5}, {6,7}; DP groups {0,2}, {1,3}, {4,6}, {5,7}; PP groups {0,4}, "
                       "{1,5}, {2,6}, {3,7} (stage 0 = ranks 0-3). Rank 5 (stage 1) sleeps in "
                       "TP_REGION layer=0 of FWD mb=1: its TP peer 4 waits in TP_ALLREDUCE "
                       "layer=0 (tp_collective), stage 0's ranks 0 and 1 wait for the backward "
                       "that follows (chain 0 -> 4 -> 5), and the other replica's ranks wait "
                       "in the DP all_reduce. Every group has 2 ranks."}))

_add(Case(
    "dp4_rotating_straggler", "dp", 4,
    "DP4 (default group), FWD declares 30 ms of compute; in each profiled step a different "
    "rank's FWD takes 120 ms longer (5x its usual), rank = step mod 4",
    (), hidden=128, batch=32, layers=2, work_ms=30, prof=(0, 1, 1, 4),
    sleeps=tuple(Sleep(step % 4, "fwd", 120, inside="FWD", steps=(step,)) for step in range(2, 6)),
    expected={"root_rank": None, "root_category": "compute_straggler",
              "notes": "each rank straggles in exactly one profiled step (rank 2 in step 2, 3 in "
                       "3, 0 in 4, 1 in 5): over the whole run no rank is slower than the "
                       "others; per step, `stragglers` names the one to look at"}))


# --- the jobs: run for real in each spawned process, or planned (no communication) -------------


def _mlp(hidden: int, layers: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.GELU()]
    return nn.Sequential(*mods)


def _flat(params: list[nn.Parameter]) -> torch.Tensor:
    """The parameters' gradients in one flat tensor (a reduction bucket)."""
    return torch.cat([p.grad.reshape(-1) for p in params])


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
        self.handles: dict[int, Act] = {}  # a communication's id -> its act

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

    def sleep(self, phase: str, step: int, mb: int | None = None, layer: int | None = None,
              chunk: int | None = None, ring_step: int | None = None) -> None:
        for index, s in enumerate(self.case.sleeps):
            if (s.rank != self.rank or s.phase != phase
                    or (s.steps is not None and step not in s.steps)
                    or (s.microbatches is not None and mb not in s.microbatches)
                    or (s.layer is not None and layer != s.layer)
                    or (s.chunk is not None and chunk != s.chunk)
                    or (s.ring_step is not None and ring_step != s.ring_step)):
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

    def work(self, name: str | None, ms: float) -> None:
        """`ms` of real compute (small matmuls until the wall clock says so), in an annotation
        of its own (`name`) or in the enclosing one (None)."""
        with self.ann(name) if name else nullcontext():
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

    def desc(self, key: str) -> str:
        """The group's desc (with its members, it names the group; the default group's:
        default_pg)."""
        for fam in self.case.families:
            for i, ranks in enumerate(fam.ranks):
                if fam.key == key and self.rank in ranks:
                    return fam.desc.format(i=i)
        return "default_pg"

    def category(self, key: str, comm: str) -> str:
        """The category its transfer is charged to, as far as a profile can tell: the group's
        stated dimension's (its desc names it; the default group names none), else the comm
        type's. gloo names no op's group, so when another group of the job has the same
        members and another dimension, no profile can tell which one ran it: `collective`.
        P2P is the non-default group's (the default group carries collectives: DDP, metrics);
        a collective on a pipeline group (the embedding's) is no P2P: `collective`."""
        p2p = comm in P2P_COMMS
        members = set(self.members(key))
        dims = {fam.dim for fam in self.case.families for ranks in fam.ranks
                if set(ranks) == members}
        dims |= {"world"} if len(members) == self.case.world and not p2p else set()
        dims |= {self.dims.get(key, "world")}
        dim = dims.pop() if len(dims) == 1 else ""
        return causes.for_collective("" if dim == "pp" and not p2p else dim, comm)

    def comm_act(self, kind: str, key: str, **fields: object) -> Act:
        """A communication on the group of `key`, noted with the group's desc and members."""
        return self.act(kind, members=self.members(key), group=self.desc(key), **fields)

    def all_reduce(self, t: torch.Tensor, key: str, async_op: bool = False, ms: float = 0.0,
                   ) -> Handle | None:
        handle = len(self.handles) + 1
        self.handles[handle] = self.comm_act(
            "collective", key, comm="allreduce", ms=ms, handle=handle, blocking=not async_op,
            category=self.category(key, "allreduce"))
        work = dist.all_reduce(t, group=self.group(key), async_op=async_op) if self.real else None
        return Handle(work, handle) if async_op else None

    def batch_p2p(self, key: str, ops: list[tuple[str, int, torch.Tensor]],
                  async_op: bool = False) -> Handle | None:
        """One `batch_isend_irecv` of `ops` (send | recv, global peer, tensor) on the group of
        `key`, in this order; blocking: each half waited for in turn; async: a Handle."""
        sends = tuple(peer for kind, peer, _ in ops if kind == "send")
        recvs = tuple(peer for kind, peer, _ in ops if kind == "recv")
        comm = "exchange" if sends and recvs else "send" if sends else "recv"
        handle = len(self.handles) + 1
        self.handles[handle] = self.comm_act(
            "p2p", key, sends=sends, recvs=recvs, comm=comm, handle=handle,
            blocking=not async_op, category=self.category(key, "send"))
        if not self.real:
            return Handle(None, handle) if async_op else None
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend if kind == "send" else dist.irecv,
                       t.contiguous() if kind == "send" else t, peer, self.group(key))
            for kind, peer, t in ops])
        if async_op:
            return Handle(works, handle)
        for work in works:
            work.wait()
        return None

    def wait(self, handle: Handle) -> None:
        launch = self.handles[handle.act]
        self.act("wait", handle=handle.act, category=launch.category, members=launch.members,
                 group=launch.group)
        for work in handle.work if isinstance(handle.work, list) else [handle.work]:
            if work is not None:
                work.wait()

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor, recv: list[int], send: list[int],
                   key: str) -> None:
        self.comm_act("collective", key, comm="alltoall", category=self.category(key, "alltoall"))
        if self.real:
            dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group(key))

    def step(self, step: int) -> None:
        raise NotImplementedError


class _FromTP(torch.autograd.Function):
    """Megatron's reduce-from-tensor-parallel-region: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, job: Job, layer: int) -> torch.Tensor:
        out = y.clone()
        with job.ann(f"TP_ALLREDUCE layer={layer}"):
            job.all_reduce(out, "tp")
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


class _ToTP(torch.autograd.Function):
    """Megatron's copy-to-tensor-parallel-region: identity forward, all_reduce backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, job: Job, layer: int) -> torch.Tensor:
        ctx.job, ctx.layer = job, layer
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        with ctx.job.ann(f"TP_ALLREDUCE layer={ctx.layer}"):
            ctx.job.all_reduce(grad, "tp")
        return grad, None, None


class Pipeline(Job):
    """One pipeline stage: Megatron-style 1F1B, GPipe or interleaved 1F1B (model chunks) with
    P2P on the PP group; with a TP group, each layer is a Megatron tensor-parallel MLP; with an
    embedding group, the first and last stages share a tied embedding."""

    VOCAB = 96  # rows of the tied embedding

    def __init__(self, rank, case, groups, real=True):
        super().__init__(rank, case, groups, real)
        pp_group, pp_ranks = groups["pp"]
        self.pp = pp_group
        self.stage, self.stages = pp_ranks.index(rank), len(pp_ranks)
        self.prev = pp_ranks[self.stage - 1] if self.stage > 0 else None
        self.next = pp_ranks[self.stage + 1] if self.stage < self.stages - 1 else None
        self.ring_prev = pp_ranks[(self.stage - 1) % self.stages]
        self.ring_next = pp_ranks[(self.stage + 1) % self.stages]
        self.dp_size = len(groups["dp"][1]) if "dp" in groups else 1
        self.tp_size = len(groups["tp"][1]) if "tp" in groups else 1
        # the first stage has one layer more (it would hold the embedding): stages' gradient
        # all_reduces differ in size, as in real pipelines, so a profile tells them apart
        self.chunks = [self._chunk(c) for c in range(case.chunks)]
        self.model = self.chunks[0]
        self.tied = None
        if "embd" in groups:  # Megatron's shared word embeddings (input and output layer)
            torch.manual_seed(99)
            self.tied = nn.Parameter(torch.randn(self.VOCAB, case.hidden) * 0.02)
        self.params = [p for m in self.chunks for p in m.parameters()]
        self.params += [self.tied] if self.tied is not None else []
        self.opt = torch.optim.SGD(self.params, lr=1e-4)
        self.loss = torch.zeros(1)

    def _chunk(self, c: int) -> nn.Module:
        layers = self.case.layers + (self.stage == 0 and c == 0)
        if self.tp_size == 1:
            return _mlp(self.case.hidden, layers, 100 + self.stage + 10 * c)
        torch.manual_seed(100 + self.stage)
        h, shard = self.case.hidden, 2 * self.case.hidden // self.tp_size
        return nn.ModuleList(nn.ModuleList([nn.Linear(h, shard, bias=False),
                                            nn.Linear(shard, h, bias=False)])
                             for _ in range(layers))

    def run(self, c: int, x: torch.Tensor, step: int, mb: int) -> torch.Tensor:
        """Model chunk c on x; tensor-parallel layers: copy to the TP region, the local GEMMs
        (TP_REGION), all_reduce of the partial outputs (TP_ALLREDUCE), residual."""
        if self.tp_size == 1:
            return self.chunks[c](x)
        for layer, (fc1, fc2) in enumerate(self.chunks[c]):
            local = _ToTP.apply(x, self, layer)
            with self.ann(f"TP_REGION layer={layer}"):
                partial = fc2(torch.nn.functional.gelu(fc1(local)))
                self.sleep("fwd", step, mb, layer=layer)
            x = x + _FromTP.apply(partial, self, layer)
        return x

    # P2P: a plain send / recv for one direction, batch_isend_irecv for a combined one
    def p2p(self, name: str, send: torch.Tensor | None = None, to: int | None = None,
            recv_from: int | None = None) -> torch.Tensor | None:
        send_to = to if send is not None else None
        if send_to is None and recv_from is None:
            return None
        buf = torch.zeros(self.case.batch, self.case.hidden) if recv_from is not None else None
        with self.ann(name):
            if send_to is not None and recv_from is not None:
                self.batch_p2p("pp", [("send", send_to, send), ("recv", recv_from, buf)])
                return buf
            sends = () if send_to is None else (send_to,)
            recvs = () if recv_from is None else (recv_from,)
            self.comm_act("p2p", "pp", sends=sends, recvs=recvs, comm="send" if sends else "recv",
                          category=self.category("pp", "send"))
            if not self.real:
                return buf
            if send_to is not None:
                dist.send(send, send_to, group=self.pp)
            else:
                dist.recv(buf, recv_from, group=self.pp)
        return buf

    def megatron_p2p(self, name: str, send_next: torch.Tensor | None = None,
                     send_prev: torch.Tensor | None = None, recv_prev: bool = False,
                     recv_next: bool = False) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Megatron's _communicate: one batch_isend_irecv of the halves that are there, in its
        order (send prev, recv prev, send next, recv next), on the ring of the PP group (the
        last stage's next is the first: interleaved chunks wrap around); (from prev, from
        next)."""
        shape = (self.case.batch, self.case.hidden)
        from_prev = torch.zeros(shape) if recv_prev else None
        from_next = torch.zeros(shape) if recv_next else None
        ops = [(kind, peer, t) for kind, peer, t in (
            ("send", self.ring_prev, send_prev), ("recv", self.ring_prev, from_prev),
            ("send", self.ring_next, send_next), ("recv", self.ring_next, from_next))
            if t is not None]
        if ops:
            with self.ann(name):
                self.batch_p2p("pp", ops)
        return from_prev, from_next

    def first(self, c: int) -> bool:
        """Whether chunk c here is the model's first (virtual) stage."""
        return self.stage == 0 and c == 0

    def last(self, c: int) -> bool:
        """Whether chunk c here is the model's last (virtual) stage: the loss."""
        return self.stage == self.stages - 1 and c == len(self.chunks) - 1

    def forward(self, step: int, mb: int, x: torch.Tensor | None, c: int = 0):
        if x is None and self.tied is not None:  # the word embedding's lookup
            tokens = torch.randint(self.VOCAB, (self.case.batch,), generator=self.gen)
            x = self.tied[tokens]
        elif x is None:
            x = torch.randn(self.case.batch, self.case.hidden, generator=self.gen)
        else:
            x.requires_grad_()
        y = self.run(c, x, step, mb)
        if self.last(c):
            y = (y @ self.tied.T).logsumexp(-1) if self.tied is not None else y
            y = y.pow(2).mean()
            self.loss += y.detach()
        self.sleep("fwd", step, mb, chunk=c)
        return x, y

    def backward(self, step: int, mb: int, x, y, grad, c: int = 0) -> torch.Tensor | None:
        y.backward() if grad is None else y.backward(grad)
        self.sleep("bwd", step, mb, chunk=c)
        return x.grad.detach() if not self.first(c) else None

    def last_backward_tail(self, step: int, gx: torch.Tensor | None) -> None:
        """After the last microbatch's backward: the DP gradient reduction, BWD_SEND and the
        local work, in the order of the case's TAILS entry."""
        handles: list[Handle] = []
        flat = _flat(self.params)

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
            self._unflatten(flat, self.params)

    def _unflatten(self, flat: torch.Tensor, params: list[nn.Parameter]) -> None:
        flat /= self.dp_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def finalize_grads(self) -> None:
        """Megatron's finalize_model_grads after the schedule: the DP all_reduce of every
        gradient, then the embedding all_reduce of the tied weights' between the first and
        the last stage (on the embedding group)."""
        with self.ann("FINALIZE_GRADS"):
            with self.ann("DP_GRAD_ALLREDUCE"):
                flat = _flat(self.params)
                self.all_reduce(flat, "dp")
                self._unflatten(flat, self.params)
            if self.tied is not None:
                with self.ann("EMBEDDING_GRAD_ALLREDUCE"):
                    self.all_reduce(self.tied.grad, "embd")

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

    def interleaved(self, step: int) -> None:
        """Megatron's forward_backward_pipelining_with_interleaving: virtual microbatch k runs
        chunk (k mod P*V) // P (reversed for the backward) of microbatch k // (P*V) * P + k mod
        P; warm-up, steady 1F1B and cool-down as Megatron counts them; each batched P2P (one
        batch_isend_irecv) sits at the end of the block whose output or input gradient it
        sends, named after Megatron's p2p function; each chunk's gradients are reduced on the
        DP group right after its last backward (CHUNK_REDUCTIONS)."""
        stages, chunks = self.stages, len(self.chunks)
        total = chunks * self.case.microbatches
        warm = min((stages - self.stage - 1) * 2 + (chunks - 1) * stages, total)
        rem, last_stage = total - warm, self.stage == stages - 1

        def chunk(k: int, forward: bool = True) -> int:
            c = k % (stages * chunks) // stages
            return c if forward else chunks - 1 - c

        def mb(k: int) -> int:
            return k // (stages * chunks) * stages + k % stages

        inputs, outputs, grads = ([[] for _ in range(chunks)] for _ in range(3))
        last_backward = {chunk(k, False): k for k in range(total)}
        pending: dict[int, tuple[torch.Tensor, Handle]] = {}

        def fwd(k: int) -> torch.Tensor | None:
            """Forward of virtual microbatch k; what it sends on (None: the loss chunk)."""
            c = chunk(k)
            if self.first(c) and len(inputs[c]) == len(outputs[c]):
                inputs[c].append(None)
            inputs[c][-1], y = self.forward(step, mb(k), inputs[c][-1], c)
            outputs[c].append(y)
            return None if self.last(c) else y.detach()

        def bwd(k: int) -> torch.Tensor | None:
            """Backward of virtual microbatch k (its chunk's DP reduction after the last);
            the input gradient it sends back (None: the first chunk)."""
            c = chunk(k, False)
            if self.last(c) and not grads[c]:
                grads[c].append(None)
            gx = self.backward(step, mb(k), inputs[c].pop(0), outputs[c].pop(0),
                               grads[c].pop(0), c)
            if k == last_backward[c] and self.case.reduce in CHUNK_REDUCTIONS:
                self.reduce_chunk(step, c, mb(k), pending)
            return gx

        def block(k: int, forward: bool = True):
            kind = "FWD" if forward else "BWD"
            return self.ann(f"{kind} chunk={chunk(k, forward)} mb={mb(k)}")

        for k in range(warm):
            with block(k):
                if k == 0:
                    inputs[0].append(self.megatron_p2p("RECV_FORWARD",
                                                       recv_prev=not self.first(0))[0])
                out = fwd(k)
                nxt = chunk(k + 1)
                recv_prev = not (self.stage == 0 and nxt == 0) and k != total - 1
                if k == warm - 1 and warm < total:
                    inp, og = self.megatron_p2p("SEND_FORWARD_BACKWARD_RECV_FORWARD_BACKWARD",
                                                send_next=out, recv_prev=recv_prev,
                                                recv_next=not last_stage)
                    grads[chunks - 1].append(og)
                else:
                    inp, _ = self.megatron_p2p("SEND_FORWARD_RECV_FORWARD", send_next=out,
                                               recv_prev=recv_prev)
                inputs[nxt].append(inp)
        for k in range(rem):
            fk = k + warm
            with block(fk):
                out = fwd(fk)
            with block(k, False):
                gx = bwd(k)
                if self.stage == 0:  # ahead of the last stage by stages - 1
                    nf = chunk(fk - (stages - 1))
                    recv_prev, nf = nf != chunks - 1 and k != rem - 1, nf + 1
                else:
                    recv_prev, nf = k != rem - 1, chunk(fk + 1)
                if last_stage:  # ahead of the first stage by stages - 1
                    nb = chunk(k - (stages - 1), False)
                    recv_next, nb = nb != 0, nb - 1
                else:
                    recv_next, nb = True, chunk(k + 1, False)
                inp, og = self.megatron_p2p("SEND_FORWARD_BACKWARD_RECV_FORWARD_BACKWARD",
                                            send_next=out, send_prev=gx, recv_prev=recv_prev,
                                            recv_next=recv_next)
                if recv_prev:
                    inputs[nf].append(inp)
                if recv_next:
                    grads[nb].append(og)
        for k in range(rem, total):
            with block(k, False):
                if k == rem and warm == total:
                    grads[chunks - 1].append(self.megatron_p2p("RECV_BACKWARD",
                                                               recv_next=True)[1])
                gx = bwd(k)
                nb = chunk(k + 1, False)
                recv_next = not (last_stage and nb == chunks - 1) and k != total - 1
                grads[nb].append(self.megatron_p2p("SEND_BACKWARD_RECV_BACKWARD", send_prev=gx,
                                                   recv_next=recv_next)[1])
        if pending:
            with self.ann("FINALIZE_GRADS"):
                for c, (flat, handle) in sorted(pending.items()):
                    with self.ann(f"DP_GRAD_WAIT chunk={c}"):
                        self.wait(handle)
                        self._unflatten(flat, list(self.chunks[c].parameters()))

    def reduce_chunk(self, step: int, c: int, mb: int, pending: dict) -> None:
        """Chunk c's DP gradient all_reduce, launched async (DP_REDUCE_GRAD chunk=c); waited
        for at once (the seed's bug) or left `pending` for FINALIZE_GRADS."""
        params = list(self.chunks[c].parameters())
        flat = _flat(params)
        with self.ann(f"DP_REDUCE_GRAD chunk={c}"):
            self.sleep("grad_reduce", step, mb, chunk=c)
            handle = self.all_reduce(flat, "dp", async_op=True)
        if self.case.reduce == "overlap":
            pending[c] = (flat, handle)
            return
        with self.ann(f"DP_GRAD_WAIT chunk={c}"):
            self.wait(handle)
            self._unflatten(flat, params)

    def step(self, step: int) -> None:
        self.loss.zero_()
        schedules = {"gpipe": self.gpipe, "interleaved": self.interleaved}
        schedules.get(self.case.pp_schedule, self.one_f_one_b)(step)
        if self.case.reduce == "finalize":
            self.finalize_grads()
        with self.ann("OPT step"):
            self.sleep("opt", step)
            if self.case.reduce == "opt":
                flat = _flat(self.params)
                self.all_reduce(flat, "dp")
                self._unflatten(flat, self.params)
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
            if self.case.work_ms:
                self.work(None, self.case.work_ms)
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


class ContextParallel(Job):
    """Ring attention: each rank holds a shard of the sequence; in every attention layer its
    K/V block travels around the CP group's ring, one batch_isend_irecv per `ring step k` (send
    to the next rank, receive from the previous) launched async before the step's ATTENTION
    and waited for after it; the backward rings K/V the same way, each block's dK/dV
    following it in a blocking exchange (`dKV exchange`), so that it is home after the last
    step. Gradients are all_reduced on the CP group (no other data parallelism)."""

    def __init__(self, rank, case, groups, real=True):
        super().__init__(rank, case, groups, real)
        ring = groups["cp"][1]
        self.size = len(ring)
        self.next = ring[(ring.index(rank) + 1) % self.size]
        self.prev = ring[(ring.index(rank) - 1) % self.size]
        torch.manual_seed(60)  # replicated weights
        h = case.hidden
        self.qkv = [torch.randn(h, 3 * h) * 0.02 for _ in range(case.layers)]

    def exchange(self, t: torch.Tensor, async_op: bool = False) -> tuple[torch.Tensor, object]:
        """Send t to the next rank, receive its like from the previous (one batch)."""
        got = torch.empty_like(t)
        handle = self.batch_p2p("cp", [("send", self.next, t), ("recv", self.prev, got)],
                                async_op)
        return got, handle

    def attention(self, step: int, layer: int, q: torch.Tensor, kv: torch.Tensor
                  ) -> torch.Tensor:
        """The forward ring: this rank's queries against every rank's K/V block."""
        h, out = q.shape[1], torch.zeros_like(q)
        for k in range(self.size):
            with self.ann(f"ring step {k}"):
                more = k + 1 < self.size
                got, handle = self.exchange(kv, async_op=True) if more else (None, None)
                with self.ann("ATTENTION"):
                    keys, values = kv.split(h, dim=1)
                    out += torch.softmax(q @ keys.T / h ** 0.5, dim=-1) @ values
                    self.sleep("fwd", step, layer=layer, ring_step=k)
                if more:
                    self.wait(handle)
                    kv = got
        return out

    def attention_grad(self, step: int, layer: int, q: torch.Tensor, kv: torch.Tensor,
                       grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The backward ring: dQ here, dK/dV of each block travelling with it; (dQ, dKV)."""
        h = q.shape[1]
        dq, dkv = torch.zeros_like(q), torch.zeros_like(kv)
        for k in range(self.size):
            with self.ann(f"ring step {k}"):
                more = k + 1 < self.size
                got, handle = self.exchange(kv, async_op=True) if more else (None, None)
                with self.ann("ATTENTION"):
                    keys, values = kv.split(h, dim=1)
                    probs = torch.softmax(q @ keys.T / h ** 0.5, dim=-1)
                    dprobs = grad @ values.T
                    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))
                    dq += dscores @ keys / h ** 0.5
                    dkv += torch.cat([dscores.T @ q / h ** 0.5, probs.T @ grad], dim=1)
                    self.sleep("bwd", step, layer=layer, ring_step=k)
                if more:
                    self.wait(handle)
                    kv = got
                with self.ann("dKV exchange"):
                    dkv = self.exchange(dkv)[0]
        return dq, dkv

    def step(self, step: int) -> None:
        c, h = self.case, self.case.hidden
        x = torch.randn(c.batch, h, generator=self.gen)
        saved = []
        with self.ann("FWD"):
            for layer in range(c.layers):
                with self.ann(f"attention layer={layer}"):
                    q, kv = (x @ self.qkv[layer]).split([h, 2 * h], dim=1)
                    saved.append((x, q, kv))
                    x = x + self.attention(step, layer, q, kv)
        grads = []
        with self.ann("BWD"):
            g = torch.randn(c.batch, h, generator=self.gen) * 1e-3
            for layer in reversed(range(c.layers)):
                with self.ann(f"attention layer={layer}"):
                    x, q, kv = saved[layer]
                    dq, dkv = self.attention_grad(step, layer, q, kv, g)
                    dqkv = torch.cat([dq, dkv], dim=1)
                    grads.append(x.T @ dqkv)
                    g = g + dqkv @ self.qkv[layer].T
        with self.ann("DP allreduce"):
            flat = torch.cat([gr.reshape(-1) for gr in grads])
            self.all_reduce(flat, "cp")
        with self.ann("OPT step"):
            offset = 0
            for layer in reversed(range(c.layers)):
                n = self.qkv[layer].numel()
                self.qkv[layer] -= 1e-4 * flat[offset:offset + n].view_as(self.qkv[layer])
                offset += n


JOBS: dict[str, Callable[..., Job]] = {
    "pipeline": Pipeline, "dp": DataParallel, "ep": ExpertParallel, "cp": ContextParallel}


_PLANS: dict[str, dict[int, list[Act]]] = {}


def plan(case: Case) -> dict[int, list[Act]]:
    """Every lane's program: each rank's job run in this process without torch.distributed
    (once per case)."""
    if case.name not in _PLANS:
        _PLANS[case.name] = _plan(case)
    return _PLANS[case.name]


def _plan(case: Case) -> dict[int, list[Act]]:
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
    programs = plan(case)
    for index, s in enumerate(case.sleeps):
        if s.annotation is None:  # host stall: the gap between two annotations
            want = [st for st in case.profiled if s.steps is None or st in s.steps]
            for rank, trace in traces.items():
                events = trace["traceEvents"]
                after, before = _spans(events, s.between[0]), _spans(events, s.between[1])
                gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(after, before, strict=True)]
                long = [g for g in gaps if g >= 0.9 * s.ms * 1e3]
                assert len(long) == (len(want) if rank == s.rank else 0), (case.name, rank, gaps)
                if rank == s.rank:
                    measured[f"rank{rank} stall ms"] = [round(g / 1e3, 1) for g in gaps]
            continue
        spans = _sleeps_of(case, traces, programs, index)
        measured[f"rank{s.rank} {s.annotation} ms"] = [round(e["dur"] / 1e3, 1) for e in spans]
    named = {s.annotation for s in case.sleeps} - {None}
    planned = sum(1 for acts in programs.values() for a in acts if a.kind == "sleep"
                  and a.step in case.profiled and case.sleeps[a.injection].annotation)
    assert sum(len(_spans(t["traceEvents"], n)) for t in traces.values() for n in named) == planned
    measured["replayed waits"] = _check_replayed_waits(case, traces)
    measured["bound halves"] = _check_bound_halves(case, traces)
    return measured


def _sleeps_of(case: Case, traces: dict[int, dict], programs: dict[int, list[Act]],
               index: int) -> list[dict]:
    """The recorded spans of injection `index`: as many in each profiled step as the plan has,
    each at least 90 % of its duration."""
    s = case.sleeps[index]
    events = traces[s.rank]["traceEvents"]
    planned = sorted(a.step for lane, acts in programs.items() for a in acts
                     if a.kind == "sleep" and a.injection == index and a.step in case.profiled)
    spans = [e for e in _spans(events, s.annotation) if _step_of(events, e["ts"]) in planned
             and e["dur"] >= 0.9 * s.ms * 1e3]
    assert len(spans) >= len(planned), (case.name, s, len(spans), planned)
    return spans


def _check_replayed_waits(case: Case, traces: dict[int, dict]) -> int:
    """Every wait the replay states (20 ms or more, in an annotation of its own) lasted at least
    half as long in the recording: the replayed schedule is the job that ran."""
    waits = expected(case, list(range(case.world)), _injections(case), traces=traces)["waits"]
    checked = 0
    for w in waits:
        if w["ms"] < 20 or w["op"] == "idle":
            continue
        real = _annotation(traces[w["rank"]]["traceEvents"], w["step"], w["where"])["dur"] / 1e3
        assert real >= 0.5 * w["ms"], (case.name, w, real)
        checked += 1
    return checked


def _check_bound_halves(case: Case, traces: dict[int, dict]) -> int:
    """Every batched call the replay says was held by one half (20 ms or more after another
    half was released) was so in the recording: the peer of the binding half entered the call
    that released it after the peers of the other halves entered theirs (one host clock)."""
    waits = expected(case, list(range(case.world)), _injections(case), traces=traces)["waits"]
    checked = 0
    for w in waits:
        if not w.get("bound"):
            continue
        last, *others = sorted(w["halves"], key=lambda h: -h["released_ms"])
        if last["released_ms"] - others[0]["released_ms"] < 20:
            continue
        posted = {id(h): _annotation(traces[h["peer"]]["traceEvents"], h["by"]["step"],
                                     h["by"]["where"])["ts"] for h in w["halves"]}
        assert all(posted[id(last)] > posted[id(h)] for h in others), (case.name, w, posted)
        checked += 1
    return checked


def _annotation(events: list[dict], step: int, where: list[str]) -> dict:
    """The annotation `where[-1]`, inside the others of `where`, in a step."""
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
            return e
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
    sizes = {"pp": 1, "dp": 1, "ep": 1, "tp": 1, "cp": 1}
    for fam in case.families:
        sizes[fam.key] = max(sizes.get(fam.key, 1), max(len(r) for r in fam.ranks))
    if case.kind == "dp" and sizes["dp"] == 1:
        sizes["dp"] = case.world
    out: dict[str, object] = {k: v for k, v in sizes.items() if k in ("pp", "dp", "ep", "tp")}
    if sizes["cp"] > 1:
        out["cp"] = sizes["cp"]
    out["microbatches"] = case.microbatches
    out["layers"] = case.layers
    out["hidden"] = case.hidden
    out["batch"] = case.batch
    out["group_order"] = [f.key for f in case.families]
    if case.kind == "pipeline":
        pp = next(f for f in case.families if f.key == "pp")
        out["schedule"] = case.pp_schedule
        if case.chunks > 1:
            out["chunks"] = case.chunks  # model chunks per rank; the first has one layer more
        out["layers_of_stage"] = [case.layers * case.chunks + (s == 0)
                                  for s in range(len(pp.ranks[0]))]
        stage = {r: ranks.index(r) for ranks in pp.ranks for r in ranks}
        out["stage_of_rank"] = {str(r): stage[r] for r in sorted(stage)}
        out["dp_reduction"] = case.reduce
        out["tail"] = list(TAILS.get(case.reduce, ()))
        if case.reduce in CHUNK_REDUCTIONS:
            out["tail"] = [CHUNK_REDUCTIONS[case.reduce]]
        out["local_work_ms"] = case.work_ms
    elif case.work_ms:
        out["fwd_work_ms"] = case.work_ms
    return out


def _injections(case: Case) -> list[dict[str, object]]:
    """ground_truth.json's injections; `places`: the annotations around each occurrence in a
    step it happens in (outermost first, on the thread that sleeps, the sleep's own last;
    from the plan: the same in every such step)."""
    programs = plan(case)
    out = []
    for index, s in enumerate(case.sleeps):
        d = asdict(s)
        d["duration_ms"] = d.pop("ms")
        d["steps"] = [st for st in case.profiled if s.steps is None or st in s.steps]
        if s.phase in ("fwd", "bwd") and s.microbatches is None and case.microbatches > 1:
            d["microbatches"] = list(range(case.microbatches))
        d["inside"] = s.inside.replace("{mb}", "i") if s.inside else None
        d["root_category"] = d.pop("category")
        d["places"] = [list(a.where) for acts in programs.values() for a in acts
                       if a.kind == "sleep" and a.injection == index and a.step == d["steps"][0]]
        out.append(d)
    return out


def truth(case: Case, ranks: list[int], groups: list[dict], traces: dict[int, dict]
          ) -> dict[str, object]:
    injections = _injections(case)
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
        "expected": expected(case, ranks, injections, groups, traces),
    }


def expected(case: Case, ranks: list[int], injections: list[dict],
             groups: list[dict] | None = None, traces: dict[int, dict] | None = None
             ) -> dict[str, object]:
    """The hand-stated root and notes, every wait of the profiled steps on the ranks in the
    folder, from the replayed schedule (with `groups`, each communication's group named; with
    the recorded `traces` of every rank, ties between a batched call's halves broken as they
    happened), and the per-step stragglers of the declared work."""
    idle = causes.PIPELINE_FILL if case.kind == "pipeline" else causes.PEER_COMPUTE
    programs = plan(case)
    names = {(g["desc"], tuple(g["ranks"])): g["name"] for g in groups or ()}

    def group_name(desc: str, members: tuple[int, ...]) -> str | None:
        return names.get((desc, tuple(sorted(members))))

    replayed = replay(programs, case.profiled)
    replayed.recorded = _recorded_posts(traces) if traces else None
    waits = stated_waits(replayed, case.profiled, injections, idle,
                         absent=set(range(case.world)) - set(ranks),
                         group_name=group_name if groups else None)
    categories = sorted({a.category for acts in programs.values() for a in acts if a.category})
    return {**{k: v for k, v in case.expected.items() if k != "notes"},
            "root_profiled": case.expected.get("root_profiled", True),
            "idle_category": idle,
            "comm_categories": categories,
            "waits": [w for w in waits if w["rank"] in ranks],
            "stragglers": [s for s in stragglers(programs, case.profiled) if s["rank"] in ranks],
            "notes": case.expected.get("notes", "")}


def _recorded_posts(traces: dict[int, dict]) -> Recorded:
    """When a P2P half was posted in the recording: the start of its c10d::send / recv_ (to
    that peer's group-local rank) in the call's annotation; None outside the profiled steps."""

    def posted(lane: int, timed: Timed, key: tuple) -> float | None:
        act, send = timed.act, key[1] == lane
        peer = rank_of(key[2] if send else key[1])
        events = traces[rank_of(lane)]["traceEvents"]
        try:
            span = _annotation(events, act.step, list(act.where))
        except (AssertionError, ValueError):
            return None
        local = str(sorted(act.members).index(peer))
        ops = [e for e in _spans(events, "c10d::send" if send else "c10d::recv_")
               if e["tid"] == span["tid"] and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]
               and e["args"]["Concrete Inputs"][2] == local]
        return ops[0]["ts"] if ops else None

    return posted


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _load(folder: Path, ranks: Iterable[int]) -> dict[int, dict]:
    """The recorded ranks' traces of a case folder."""
    return {r: json.loads(gzip.decompress((folder / f"rank{r}.json.gz").read_bytes()))
            for r in ranks}


def rewrite_truth(case: Case, out: Path) -> None:
    """Rewrite ground_truth.json of a recorded case from its files (no new recording)."""
    folder = out / case.name
    if case.copy_of:
        return record(case, out)
    traces = _load(folder, range(case.world))
    check(case, traces)
    _write_json(folder / "ground_truth.json",
                truth(case, list(range(case.world)), _groups(case, traces), traces))
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
        traces = _load(src, whole["ranks"])
        _write_json(folder / "ground_truth.json", truth(case, list(case.keep), groups, traces))
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
                truth(case, list(range(case.world)), _groups(case, traces), traces))
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
    torch.set_num_threads(1)  # the plans' small models: threads only contend
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
