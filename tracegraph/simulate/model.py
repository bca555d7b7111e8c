"""The discrete-event model of a distributed training step.

`Engine` keeps device ops in per-(rank, stream) FIFO queues plus each rank's host launch order, and
`run()` times every op from its dependencies, remembering which one was binding: the stream (or
shared hardware queue) predecessor or the host launch for a start; the record for a wait; the
peer's posting for a P2P; the last member to arrive, profiled or not, for a collective.
`Job` turns a `Scenario` into engine ops: the PP/VPP schedule, P2P on one stream per pipeline edge,
HSDP gradient reductions (sync or async scheduler), EP all-to-all with optional combined-1F1B
overlap, then expands compute ops into kernels (vectorized) and packs a `Timeline`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from parsers.base import GroupInfo
from parsers.classify import double_hash
from tracegraph.schema import COLLECTIVE, COMPUTE, MEMCPY, P2P, RECORD, WAIT
from tracegraph.simulate import schedule as sch
from tracegraph.simulate.timeline import RANGE_COLUMNS, TIMELINE_COLUMNS, StepSpan, Timeline

if TYPE_CHECKING:
    from tracegraph.simulate.scenarios import Scenario

MS = 1_000_000
MIB = 1 << 20
SEGMENT = 2 * MIB  # the caching allocator reserves device memory in 2 MiB segments
TICK_NS = 20  # an EVENT_RECORD, or an EVENT_WAIT whose record had already executed
JITTER_STREAM = 0x7177  # seeds the jitter draws apart from every other draw of a run
WORD = {sch.FWD: "FWD", sch.BWD: "BWD"}
INT_FIELDS = {"rank": "rank", "stream": "stream", "start_ns": "start", "peer": "peer", "seq": "seq",
              "bytes": "nbytes", "event_id": "event_id", "launch_ns": "launch", "step": "step",
              "microbatch": "microbatch", "chunk": "chunk"}  # column -> Op attribute
STR_FIELDS = ("name", "kind", "comm", "group", "dtype", "phase", "meta_step")


class Op:
    """One device op. `Engine.run` fills launch/start/end/ready and the binding dependencies."""

    __slots__ = ("idx", "rank", "stream", "kind", "name", "comm", "group", "peer", "seq", "nbytes",
                 "dtype", "event_id", "dur", "extra", "host_ns", "sync", "step", "phase",
                 "microbatch", "chunk", "meta_step", "slow", "pattern", "unprofiled", "prev",
                 "queue_pred", "launch", "start", "end", "ready", "start_dep", "ready_dep",
                 "launch_dep", "straggler")

    def __init__(self, idx: int, rank: int, stream: int, kind: str, **fields: object):
        self.idx, self.rank, self.stream, self.kind = idx, rank, stream, kind
        self.name = self.comm = self.group = self.dtype = self.phase = self.meta_step = ""
        self.pattern = ""
        self.peer = self.seq = self.event_id = self.microbatch = self.chunk = self.straggler = -1
        self.nbytes = self.dur = self.extra = self.host_ns = self.step = 0
        self.sync = self.slow = False
        self.unprofiled: tuple[int, int] | None = None  # latest unprofiled member, its offset
        self.prev = self.queue_pred = self.start_dep = self.ready_dep = self.launch_dep = None
        self.launch = self.start = self.end = self.ready = None
        for key, value in fields.items():
            setattr(self, key, value)


class Engine:
    """Device streams, the host that feeds them, and the dependency-driven clock."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.host: dict[int, list[Op]] = {}
        self.streams: dict[tuple[int, int], list[Op]] = {}
        self.records: dict[int, Op] = {}
        self.instances: dict[tuple[str, int], list[Op]] = {}
        self.serial: dict[int, tuple[int, ...]] = {}  # rank -> streams sharing one hw queue
        self.origin: dict[int, int] = {}  # rank -> when its host starts
        self._seq: dict[tuple[int, str], int] = defaultdict(int)
        self._queued_last: dict[int, Op] = {}

    def add(self, rank: int, stream: int, kind: str, **fields: object) -> Op:
        """Append an op to its rank's host order and its stream; number records and comm ops."""
        op = Op(len(self.ops), rank, stream, kind, **fields)
        self.ops.append(op)
        self.host.setdefault(rank, []).append(op)
        lane = self.streams.setdefault((rank, stream), [])
        op.prev = lane[-1] if lane else None
        lane.append(op)
        if stream in self.serial.get(rank, ()):
            op.queue_pred = self._queued_last.get(rank)
            self._queued_last[rank] = op
        if kind == RECORD:
            op.event_id = len(self.records)
            self.records[op.event_id] = op
        elif kind in (P2P, COLLECTIVE):
            op.seq = self._seq[(rank, op.group)]
            self._seq[(rank, op.group)] += 1
            self.instances.setdefault((op.group, op.seq), []).append(op)
        return op

    def run(self) -> None:
        """Time every op; raise if the program deadlocks (a model bug)."""
        self._ptr = dict.fromkeys(self.streams, 0)
        self._hptr = dict.fromkeys(self.host, 0)
        self._open = dict.fromkeys(self.host, 0)
        self._idle: dict[int, tuple[int, Op | None]] = {
            r: (self.origin.get(r, 0), None) for r in self.host}
        self._last = {r: self.origin.get(r, 0) for r in self.host}
        self._anchor: dict[int, Op | None] = dict.fromkeys(self.host)  # op the host synced on
        self._waiters: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self._work: deque = deque()
        self._queued: set = set()
        for rank in self.host:
            self._push(("h", rank))
        while self._work:
            item = self._work.popleft()
            self._queued.discard(item)
            if item[0] == "h":
                self._host(item[1])
            else:
                self._stream(item[1])
        stuck = next((op for op in self.ops if op.end is None), None)
        if stuck is not None:
            raise RuntimeError(f"simulated job deadlocks: rank {stuck.rank} stream {stuck.stream} "
                               f"{stuck.kind} {stuck.name} {stuck.meta_step}")

    def _push(self, item: tuple) -> None:
        if item not in self._queued:
            self._queued.add(item)
            self._work.append(item)

    def _host(self, rank: int) -> None:
        """Launch ops in host order; a `sync` op first waits until the rank's device is idle, and
        every launch after it keeps that device op as its `launch_dep`."""
        ops, i = self.host[rank], self._hptr[rank]
        while i < len(ops):
            op, t = ops[i], self._last[rank]
            if op.sync:
                if self._open[rank]:
                    break
                idle, idle_op = self._idle[rank]
                if idle >= t:
                    t, self._anchor[rank] = idle, idle_op
            op.launch_dep = self._anchor[rank]
            op.launch = self._last[rank] = t + op.host_ns
            self._open[rank] += 1
            self._push(("s", (rank, op.stream)))
            i += 1
        self._hptr[rank] = i

    def _stream(self, key: tuple[int, int]) -> None:
        ops, i = self.streams[key], self._ptr[key]
        while i < len(ops):
            op = ops[i]
            if op.launch is None:
                break
            if op.start is None:
                if op.queue_pred is not None and op.queue_pred.end is None:
                    break
                self._start(op)
            if not self._finish(op):
                break
            self._ended(op)
            i += 1
        self._ptr[key] = i

    def _start(self, op: Op) -> None:
        """Start at the latest of launch, stream predecessor end, hardware-queue predecessor end."""
        op.start = op.launch
        for dep in (op.prev, op.queue_pred):
            if dep is not None and dep.end >= op.start:  # ties go to the device
                op.start, op.start_dep = dep.end, dep
        if op.kind in (P2P, COLLECTIVE):
            for other in self.instances[(op.group, op.seq)]:
                if other is not op:
                    self._push(("s", (other.rank, other.stream)))

    def _finish(self, op: Op) -> bool:
        """Set end/ready once every dependency is known; False while waiting for one."""
        if op.kind == WAIT:
            record = self.records[op.event_id]
            if record.end is None:
                self._waiters[record.idx].append((op.rank, op.stream))
                return False
            woken = record.end + op.extra
            blocked = woken > op.start + TICK_NS
            op.ready_dep = record if blocked else None
            op.ready = woken if blocked else op.start
            op.end = woken if blocked else op.start + TICK_NS
            return True
        if op.kind in (P2P, COLLECTIVE):
            members = self.instances[(op.group, op.seq)]
            if any(m.start is None for m in members):
                return False
            last = max(members, key=lambda m: (m.start, m is op))
            op.ready, op.ready_dep = last.start, (last if last is not op else None)
            if op.unprofiled and last.start + op.unprofiled[1] > op.ready:
                op.ready, op.ready_dep = last.start + op.unprofiled[1], None
                op.straggler = op.unprofiled[0]
            op.ready = max(op.ready, op.start)
            op.end = op.ready + op.dur + op.extra
            return True
        op.ready, op.end = op.start, op.start + op.dur
        return True

    def _ended(self, op: Op) -> None:
        rank = op.rank
        self._open[rank] -= 1
        if op.end >= self._idle[rank][0]:
            self._idle[rank] = (op.end, op)
        if not self._open[rank]:
            self._push(("h", rank))
        for key in self._waiters.pop(op.idx, ()):
            self._push(("s", key))
        for stream in self.serial.get(rank, ()):
            self._push(("s", (rank, stream)))


class Place(NamedTuple):
    """A profiled rank and the groups / streams it uses."""

    rank: int
    stage: int
    replica: int
    ep_index: int
    edges: dict  # pipeline edge -> (group id, peer rank, stream)
    dp: tuple[str, ...]  # HSDP group id per hsdp collective
    ep_group: str


class _Ctx:
    """What one rank's program for one step remembers while it is being issued."""

    def __init__(self, place: Place, step: int):
        self.place, self.step = place, step
        self.first = True
        self.stall_ns = 0
        self.sent: dict[sch.Message, int] = {}  # message -> send-ready event
        self.received: dict[sch.Message, int] = {}  # message -> recv-done event
        self.flushed: dict[tuple[int, int], int] = defaultdict(int)
        self.drain: list[tuple[int, int]] = []  # (chunk, reduce-done event)


class Job:
    """A scenario turned into engine ops, run, and packed as a Timeline."""

    def __init__(self, sc: Scenario, seed: int = 0):
        self.sc, self.seed = sc, seed
        self.rng = np.random.default_rng(seed)
        p, v = sc.pp, sc.vpp
        self.chunks = p * v
        self.layers = sch.layer_counts(sc.layers, p, v, sc.num_layers)
        combine = sc.ep > 1 and sc.combined_1f1b
        seqs = [sch.actions(p, v, sc.microbatches, s, int(combine)) for s in range(p)]
        self.units = [sch.units(seq, combine) for seq in seqs]
        self.plan = sch.plan_p2p(self.units, p, self.chunks, self._nominal_ms,
                                 sc.p2p_bytes / sc.p2p_gbps / 1e6, sc.batch_p2p)
        self.eng = Engine()
        self.groups: dict[str, GroupInfo] = {}
        self.stragglers: dict[str, int] = {}  # HSDP group -> its straggling unprofiled member
        self._arrivals: dict[tuple[str, int], tuple[int, int] | None] = {}
        self.allocations: list[tuple[Op, int]] = []  # (op whose launch it follows, +/- bytes)
        self.origin_ns = sc.epoch_ns
        total = sc.ranks or sc.pp * sc.ep
        if total % (sc.pp * sc.ep):
            raise ValueError(f"ranks ({total}) must be a multiple of pp*ep ({sc.pp * sc.ep})")
        self.replicas = total // (sc.pp * sc.ep)
        self.places = self._layout()

    # --- layout ---------------------------------------------------------------------------
    def rank_of(self, stage: int, replica: int, ep_index: int) -> int:
        """Global rank of (stage, profiled replica, EP index)."""
        sc = self.sc
        replica_stride = sc.replica_stride or sc.ep
        stage_stride = sc.stage_stride or self.replicas * replica_stride
        return stage * stage_stride + replica * replica_stride + ep_index

    def _layout(self) -> list[Place]:
        sc = self.sc
        grid = [(s, j, e) for j in range(self.replicas) for e in range(sc.ep) for s in range(sc.pp)]
        self.profiled = {self.rank_of(*where) for where in grid}
        places = [Place(self.rank_of(s, j, e), s, j, e, self._edges(s, j, e),
                        self._dp_groups(s, e), self._ep_group(s, j)) for s, j, e in grid]
        for place in places:
            self.eng.origin[place.rank] = self.origin_ns + int(self.rng.integers(0, 50_000))
            if sc.serialize:
                self.eng.serial[place.rank] = (sc.compute_stream, sc.ep_stream)
        return places

    def _group(self, name: str, desc: str, members: Sequence[int]) -> str:
        gid = double_hash(name)
        self.groups[gid] = GroupInfo(gid, name, desc, tuple(sorted(members)), "simulator")
        return gid

    def _edges(self, s: int, j: int, e: int) -> dict:
        out = {}
        for a, b in self.plan.edges:
            if s in (a, b):
                ra, rb = self.rank_of(a, j, e), self.rank_of(b, j, e)
                stream = self.sc.pp_streams[0 if s == a else 1]
                out[(a, b)] = (self._group(f"pp-{ra}-{rb}", "pp", (ra, rb)),
                               rb if s == a else ra, stream)
        return out

    def _dp_groups(self, s: int, e: int) -> tuple[str, ...]:
        """The HSDP replicate groups of (stage, EP index): `size` ranks `stride` apart from the
        first replica's rank (0 = all profiled replicas); they must hold every profiled replica."""
        ids = []
        for comm, size, stride, _ in self.sc.hsdp_groups:
            size = size or self.replicas
            stride = stride or self.sc.replica_stride or self.sc.ep
            first = self.rank_of(s, 0, e)
            members = [first + k * stride for k in range(size)]
            mine = {self.rank_of(s, j, e) for j in range(self.replicas)}
            if not mine <= set(members):
                raise ValueError(f"profiled replicas {sorted(mine)} are not all in the "
                                 f"{size}-rank {comm} group of stride {stride}")
            gid = self._group(f"hsdp-dp{size}-{first}", "dp", members)
            others = [r for r in members if r not in self.profiled]
            if others and gid not in self.stragglers:
                self.stragglers[gid] = int(self.rng.choice(others))
            ids.append(gid)
        return tuple(ids)

    def _ep_group(self, s: int, j: int) -> str:
        if self.sc.ep <= 1:
            return ""
        members = [self.rank_of(s, j, e) for e in range(self.sc.ep)]
        return self._group(f"ep-{members[0]}-{members[-1]}", "ep", members)

    # --- durations ------------------------------------------------------------------------
    def _tokens(self, act: sch.Action) -> list[tuple[str, str, float]]:
        """The compute segments ("c", pattern, ms) and all-to-alls ("a", tag, 0) of an action."""
        sc, layers = self.sc, self.layers[act.chunk]
        per = sc.f_ms if act.phase == sch.FWD else sc.b_ms
        scale = 1.0 if act.phase == sch.FWD else 2.0
        ends = sc.embed_ms * (act.chunk == 0) + sc.head_ms * (act.chunk == self.chunks - 1)
        extra = scale * ends
        if sc.ep <= 1:
            return [("c", act.phase, layers * per + extra)]
        attn, mlp = per * sc.attn_share, per * (1 - sc.attn_share)
        if act.phase == sch.FWD:
            seq = [("c", "F.attn", attn), ("a", "A2A_DISPATCH", 0), ("c", "F.mlp", mlp),
                   ("a", "A2A_COMBINE", 0)] * layers
        else:
            seq = [("a", "A2A_COMBINE", 0), ("c", "B.mlp", mlp), ("a", "A2A_DISPATCH", 0),
                   ("c", "B.attn", attn)] * layers
        first = next(i for i, t in enumerate(seq) if t[0] == "c")
        seq[first] = (*seq[first][:2], seq[first][2] + extra)
        return seq

    def _nominal_ms(self, act: sch.Action) -> float:
        return sum(t[2] for t in self._tokens(act))

    def _collective_ns(self, comm: str, size: int, nbytes: int, gbps: float) -> int:
        factor = 2.0 if comm == "allreduce" else 1.0
        return int(factor * (size - 1) / max(size, 1) * nbytes / gbps)

    # --- issuing ops ----------------------------------------------------------------------
    def _op(self, ctx: _Ctx, stream: int, kind: str, launches: int = 1, **fields: object) -> Op:
        host = int(self.sc.launch_us * 1000) * launches + ctx.stall_ns
        ctx.stall_ns = 0
        if ctx.first:
            host += int(self.sc.step_gap_us * 1000)
        op = self.eng.add(ctx.place.rank, stream, kind, host_ns=host, sync=ctx.first,
                          step=ctx.step, **fields)
        ctx.first = False
        if not op.name:
            op.name = op_name(op, self.sc.flavor)
        return op

    def _record(self, ctx: _Ctx, stream: int, **facts: object) -> int:
        return self._op(ctx, stream, RECORD, dur=TICK_NS, **facts).event_id

    def _wait(self, ctx: _Ctx, stream: int, event: int, **facts: object) -> Op:
        wake = int(self.rng.integers(300, 1000))
        return self._op(ctx, stream, WAIT, event_id=event, extra=wake, **facts)

    def _compute(self, ctx: _Ctx, act: sch.Action | None, pattern: str, ms: float,
                 meta: str) -> Op:
        sc, rank = self.sc, ctx.place.rank
        factor = sc.stage_scale[ctx.place.stage] if sc.stage_scale else 1.0
        slow = rank == sc.slow_rank and sc.slow_factor != 1.0
        late = rank == sc.late_rank and pattern.endswith("mlp") and sc.late_factor != 1.0
        factor *= (sc.slow_factor if slow else 1.0) * (sc.late_factor if late else 1.0)
        factor *= self._pace(rank, ctx.step)
        dur = int(ms * MS * factor * np.exp(self.rng.normal(0.0, sc.noise)))
        facts = dict(phase=act.phase, microbatch=act.microbatch, chunk=act.chunk) if act else {}
        layers = self.layers[act.chunk] if act else 1
        return self._op(ctx, sc.compute_stream, COMPUTE, dur=dur, pattern=pattern,
                        launches=kernel_count(pattern, layers, sc.kernels_per_chunk),
                        meta_step=meta, slow=slow or late, **facts)

    def _pace(self, rank: int, step: int) -> float:
        """The compute speed factor of `rank` in `step`: the run's (placement, clocks, the
        cluster's load that day) times the rank's in that step, both log-normal with sigma
        `jitter`; 1 without jitter. Drawn from (seed, rank, step) alone, so the other draws and
        the bundle of a run without jitter stay as they were."""
        sigma = self.sc.jitter
        if not sigma:
            return 1.0
        run = np.random.default_rng([self.seed, JITTER_STREAM]).normal(0.0, sigma)
        mine = np.random.default_rng([self.seed, JITTER_STREAM, rank, step]).normal(0.0, sigma)
        return float(np.exp(run + mine))

    def _comm(self, ctx: _Ctx, stream: int, kind: str, comm: str, group: str, nbytes: int,
              dur: int, dtype: str, **facts: object) -> Op:
        jitter = int(self.rng.integers(0, 3_000 if kind == P2P else 20_000))
        return self._op(ctx, stream, kind, comm=comm, group=group, nbytes=nbytes, dtype=dtype,
                        dur=dur, extra=jitter, **facts)

    # --- pipeline P2P ---------------------------------------------------------------------
    def _receive(self, ctx: _Ctx, act: sch.Action) -> None:
        need = sch.consumes(act, self.chunks)
        if need is None or need.chunk % self.sc.pp == ctx.place.stage:
            return
        if need not in ctx.received:
            self._flush(ctx, need)
        self._wait(ctx, self.sc.compute_stream, ctx.received.pop(need),
                   meta_step=f"{WORD[need.phase]}_RECV", microbatch=act.microbatch,
                   chunk=act.chunk)

    def _send(self, ctx: _Ctx, act: sch.Action) -> None:
        out = sch.produces(act, self.chunks)
        if out is None or sch.target(out) % self.sc.pp == ctx.place.stage:
            return
        ctx.sent[out] = self._record(ctx, self.sc.compute_stream,
                                     meta_step=f"{WORD[out.phase]}_SEND",
                                     microbatch=out.microbatch, chunk=out.chunk)
        self._flush(ctx, out)

    def _flush(self, ctx: _Ctx, msg: sch.Message) -> None:
        """Issue this rank's side of every exchange on msg's edge up to the one holding msg."""
        key, upto = self.plan.where[msg]
        for i in range(ctx.flushed[key], upto + 1):
            self._exchange(ctx, key, self.plan.edges[key][i])
        ctx.flushed[key] = max(ctx.flushed[key], upto + 1)

    def _exchange(self, ctx: _Ctx, key: tuple[int, int], exchange: tuple[sch.Message, ...]) -> None:
        sc, stage = self.sc, ctx.place.stage
        group, peer, stream = ctx.place.edges[key]
        sends = [m for m in exchange if m.chunk % sc.pp == stage]
        recvs = [m for m in exchange if m not in sends]
        for msg in sends:
            if msg not in ctx.sent:
                raise RuntimeError(f"P2P plan issues {msg} before rank {ctx.place.rank} made it")
            self._wait(ctx, stream, ctx.sent.pop(msg), meta_step=f"{WORD[msg.phase]}_SEND")
        halves = [f"{WORD[m.phase]}_SEND" for m in sends] + [f"{WORD[m.phase]}_RECV" for m in recvs]
        head = exchange[0]
        self._comm(ctx, stream, P2P, "batch_send_recv", group, sc.p2p_bytes * len(exchange),
                   int(sc.p2p_bytes / sc.p2p_gbps), "BFP16", peer=peer, meta_step="+".join(halves),
                   microbatch=head.microbatch, chunk=head.chunk)
        for msg in recvs:
            ctx.received[msg] = self._record(ctx, stream, meta_step=f"{WORD[msg.phase]}_RECV")

    # --- HSDP reduction -------------------------------------------------------------------
    def _reduce(self, ctx: _Ctx, chunk: int, sync: bool) -> None:
        """FSDP_REDUCE_GRAD of a chunk on the HSDP stream; sync waits for it on the compute
        stream right away, async leaves a drain for the end of the step."""
        sc, cs, hs = self.sc, self.sc.compute_stream, self.sc.hsdp_stream
        meta = dict(meta_step="FSDP_REDUCE_GRAD", chunk=chunk)
        self._wait(ctx, hs, self._record(ctx, cs, **meta), **meta)
        tails = dict(sc.hsdp_tails_ms).get(chunk, ())
        for i, (comm, _, _, per_layer) in enumerate(sc.hsdp_groups):
            group = ctx.place.dp[i]
            nbytes = per_layer * self.layers[chunk]
            members = len(self.groups[group].ranks)
            op = self._comm(ctx, hs, COLLECTIVE, comm, group, nbytes,
                            self._collective_ns(comm, members, nbytes, sc.dp_gbps), "FP32", **meta)
            tail = tails[i] if i < len(tails) else 0.0
            op.unprofiled = self._late_member(group, op.seq, tail)
        done = self._record(ctx, hs, **meta)
        if sync:
            self._wait(ctx, cs, done, **meta)
        else:
            ctx.drain.append((chunk, done))

    def _late_member(self, group: str, seq: int, tail_ms: float) -> tuple[int, int] | None:
        """The latest unprofiled member of a collective instance and its arrival offset (ns)
        after the last profiled member; the group's straggler arrives `tail_ms` late."""
        key = (group, seq)
        if key not in self._arrivals:
            others = [r for r in self.groups[group].ranks if r not in self.profiled]
            if not others:
                self._arrivals[key] = None
                return None
            offsets = self.rng.normal(0.0, self.sc.arrival_jitter_ms * MS, len(others))
            if group in self.stragglers:
                offsets[others.index(self.stragglers[group])] += tail_ms * MS
            last = int(np.argmax(offsets))
            self._arrivals[key] = (others[last], int(offsets[last]))
        return self._arrivals[key]

    # --- EP all-to-all and compute --------------------------------------------------------
    def _a2a(self, ctx: _Ctx, act: sch.Action, tag: str) -> int:
        """Launch an all-to-all on the EP stream after the compute so far; its done event."""
        sc, es = self.sc, self.sc.ep_stream
        facts = dict(microbatch=act.microbatch, chunk=act.chunk, meta_step=tag)
        self._wait(ctx, es, self._record(ctx, sc.compute_stream, **facts), **facts)
        self._comm(ctx, es, COLLECTIVE, "alltoall", ctx.place.ep_group, sc.a2a_bytes,
                   self._collective_ns("alltoall", sc.ep, sc.a2a_bytes, sc.ep_gbps), "BFP16",
                   **facts)
        return self._record(ctx, es, **facts)

    def _run_unit(self, ctx: _Ctx, unit: sch.Unit) -> None:
        """Issue the compute of a unit; with two actions, alternate their segments so that each
        all-to-all overlaps the other action's next segment (combined 1F1B)."""
        lists = [self._tokens(act) for act in unit]
        ptr = [0] * len(lists)
        ops: list[list[Op]] = [[] for _ in unit]  # each action's compute ops
        pending: list[tuple[int, str] | None] = [None] * len(lists)  # (done event, a2a tag)
        for k, act in enumerate(unit):
            self._launch_a2as(ctx, act, lists[k], ptr, pending, k)
        while any(ptr[k] < len(lists[k]) for k in range(len(lists))):
            for k, act in enumerate(unit):
                if ptr[k] >= len(lists[k]):
                    continue
                self._await(ctx, act, pending, k)
                _, pattern, ms = lists[k][ptr[k]]
                ops[k].append(self._compute(ctx, act, pattern, ms, WORD[act.phase]))
                ptr[k] += 1
                self._launch_a2as(ctx, act, lists[k], ptr, pending, k)
        for k, act in enumerate(unit):
            self._await(ctx, act, pending, k)
            self._allocate(act, ops[k])

    def _allocate(self, act: sch.Action, ops: list[Op]) -> None:
        """A forward keeps its chunk's activations (allocated as its first kernel is launched)
        until the backward of the same microbatch releases them (after its last launch)."""
        if not self.sc.memory or not ops:
            return
        size = int(self.sc.act_mib_per_layer * self.layers[act.chunk] * MIB)
        self.allocations.append((ops[0], size) if act.phase == sch.FWD else (ops[-1], -size))

    def _launch_a2as(self, ctx: _Ctx, act: sch.Action, tokens: list, ptr: list, pending: list,
                     k: int) -> None:
        while ptr[k] < len(tokens) and tokens[ptr[k]][0] == "a":
            self._await(ctx, act, pending, k)
            tag = tokens[ptr[k]][1]
            pending[k] = (self._a2a(ctx, act, tag), tag)
            ptr[k] += 1

    def _await(self, ctx: _Ctx, act: sch.Action, pending: list, k: int) -> None:
        """Make the compute stream wait for action k's outstanding all-to-all, if any."""
        if pending[k] is not None:
            event, tag = pending[k]
            self._wait(ctx, self.sc.compute_stream, event, meta_step=tag,
                       microbatch=act.microbatch, chunk=act.chunk)
            pending[k] = None

    # --- one rank, one step ---------------------------------------------------------------
    def _rank_step(self, place: Place, step: int) -> None:
        sc, ctx = self.sc, _Ctx(place, step)
        stalls = {(r, s, u): ms for r, s, u, ms in sc.host_stalls}
        for index, unit in enumerate(self.units[place.stage]):
            ctx.stall_ns = int(stalls.get((place.rank, step, index), 0.0) * MS)
            for act in unit:
                self._receive(ctx, act)
                if act.phase == sch.FWD and act.chunk == 0:
                    self._op(ctx, sc.compute_stream, MEMCPY, dur=sc.memcpy_us * 1000,
                             nbytes=sc.input_bytes, microbatch=act.microbatch, chunk=0)
            self._run_unit(ctx, unit)
            for act in unit:
                last = act.phase == sch.BWD and act.microbatch == sc.microbatches - 1
                if last and sc.hsdp == "sync":
                    self._reduce(ctx, act.chunk, sync=True)
                self._send(ctx, act)
                if last and sc.hsdp == "async":
                    self._reduce(ctx, act.chunk, sync=False)
        for chunk, event in ctx.drain:
            self._wait(ctx, sc.compute_stream, event, meta_step="FSDP_WAIT_REDUCE_GRAD",
                       chunk=chunk)
        self._compute(ctx, None, "OPT", sc.optimizer_ms, "OPTIMIZER")

    # --- output ---------------------------------------------------------------------------
    def build(self) -> Timeline:
        """Issue every rank's steps, run the engine, and pack the Timeline (its ground truth is
        `ground_truth.build(job, timeline)`'s, filled in by `tracegraph.simulate.simulate`)."""
        sc = self.sc
        for step in range(sc.first_step, sc.first_step + sc.steps):
            for place in self.places:
                self._rank_step(place, step)
        self.eng.run()
        params = {**dataclasses.asdict(sc), "seed": self.seed}
        timeline = Timeline(scenario=sc.name, params=params, ops=self._frame(),
                            groups=self.groups, steps=self._steps(), clock_offset_ns=self._clocks(),
                            compute_stream=sc.compute_stream, memory=self._memory())
        timeline.ranges = framework_ranges(timeline.ops) if sc.annotate else None
        return timeline

    def _memory(self) -> pd.DataFrame | None:
        """The allocator's totals after every allocation and release (None without memory):
        each rank holds `base_mib` plus its layers' static state from its first launch; reserved
        memory is the peak allocated so far, rounded up to the allocator's 2 MiB segments."""
        if not self.sc.memory:
            return None
        sc, rows = self.sc, []
        chunks = {p.rank: [c for c in range(self.chunks) if c % sc.pp == p.stage]
                  for p in self.places}
        for rank, ops in self.eng.host.items():
            static = sc.base_mib + sc.static_mib_per_layer * sum(
                self.layers[c] for c in chunks[rank])
            rows.append((rank, ops[0].launch - ops[0].host_ns, int(static * MIB)))
        rows += [(op.rank, op.launch, size) for op, size in self.allocations]
        frame = pd.DataFrame(rows, columns=["rank", "time_ns", "bytes"])
        frame = frame.sort_values(["rank", "time_ns"], kind="stable", ignore_index=True)
        frame["allocated"] = frame.groupby("rank")["bytes"].cumsum()
        peak = frame.groupby("rank")["allocated"].cummax()
        frame["reserved"] = -(-peak // SEGMENT) * SEGMENT
        return frame

    def _steps(self) -> list[StepSpan]:
        spans: dict[tuple[int, int], list[int]] = {}
        for op in self.eng.ops:
            span = spans.setdefault((op.rank, op.step), [op.launch - op.host_ns, op.end])
            span[1] = max(span[1], op.end)
        return [StepSpan(r, s, lo, hi) for (r, s), (lo, hi) in sorted(spans.items())]

    def _clocks(self) -> dict[int, int]:
        lo, hi = self.sc.clock_offset_us
        out = {}
        for place in sorted(self.places):
            magnitude = np.exp(self.rng.uniform(np.log(lo), np.log(hi)))
            out[place.rank] = int(magnitude * 1000) * int(self.rng.choice((-1, 1)))
        return out

    def _frame(self) -> pd.DataFrame:
        """The ops table: engine ops sorted by (rank, stream, start), compute ops as kernels."""
        ops = sorted(self.eng.ops, key=lambda o: (o.rank, o.stream, o.start, o.idx))
        ints = {col: np.fromiter((getattr(o, attr) for o in ops), np.int64, len(ops))
                for col, attr in INT_FIELDS.items()}
        ints["dur_ns"] = np.fromiter((o.end for o in ops), np.int64, len(ops)) - ints["start_ns"]
        strs = {col: [getattr(o, col) for o in ops] for col in STR_FIELDS}
        layers = np.array([self.layers[o.chunk] if o.chunk >= 0 else 1 for o in ops])
        return expand(ints, strs, [o.pattern for o in ops], layers, self.sc)


def framework_ranges(ops: pd.DataFrame) -> pd.DataFrame:
    """RANGE_COLUMNS: one range per forward / backward action (its input copy included): on
    the host from the launch before its first one in the step to its last launch (the host
    launches an op at the end of its call), on the device over its kernels."""
    ops = ops.sort_values(["rank", "launch_ns"], kind="stable")
    previous = ops.groupby(["rank", "step"])["launch_ns"].shift(1)
    ops = ops.assign(after=previous.fillna(ops["launch_ns"] - 1).astype("int64") + 1,
                     end_ns=ops["start_ns"] + ops["dur_ns"])
    work = ops[(ops["microbatch"] >= 0) & ops["kind"].isin([COMPUTE, MEMCPY])]
    work = work.assign(phase=work["phase"].where(work["kind"] == COMPUTE, sch.FWD))
    spans = work.groupby(["rank", "step", "phase", "chunk", "microbatch"], as_index=False).agg(
        host_start_ns=("after", "min"), host_end_ns=("launch_ns", "max"),
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    return spans.sort_values(["rank", "start_ns"])[list(RANGE_COLUMNS)].astype(
        RANGE_COLUMNS).reset_index(drop=True)


# --- kernel names and the vectorized kernel expansion -----------------------------------------
_ASCEND = {
    "F.attn": (("aclnnRmsNorm_RmsNorm_RmsNorm", 1), ("aclnnMatmul_MatMulV3_MatMulV3", 6),
               ("aclnnRotaryPositionEmbedding_RotaryPositionEmbedding_RotaryPositionEmbedding", 1),
               ("FlashAttentionScore", 8), ("aclnnMatmul_MatMulV3_MatMulV3", 4),
               ("aclnnAdd_AddAiCore_Add", 1)),
    "F.mlp": (("aclnnRmsNorm_RmsNorm_RmsNorm", 1),
              ("aclnnMoeGatingTopKSoftmax_MoeGatingTopKSoftmax_MoeGatingTopKSoftmax", 1),
              ("aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul", 8),
              ("aclnnSwiGlu_SwiGlu_SwiGlu", 2),
              ("aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul", 6), ("aclnnAdd_AddAiCore_Add", 1)),
    "B.mlp": (("aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul", 12),
              ("aclnnSwiGluGrad_SwiGluGrad_SwiGluGrad", 3),
              ("aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul", 12),
              ("aclnnRmsNormGrad_RmsNormGrad_RmsNormGrad", 2)),
    "B.attn": (("aclnnMatmul_MatMulV3_MatMulV3", 8), ("FlashAttentionScoreGrad", 16),
               ("aclnnRotaryPositionEmbeddingGrad_RotaryPositionEmbeddingGrad_"
                "RotaryPositionEmbeddingGrad", 1),
               ("aclnnMatmul_MatMulV3_MatMulV3", 10),
               ("aclnnRmsNormGrad_RmsNormGrad_RmsNormGrad", 2),
               ("aclnnInplaceAdd_AddAiCore_Add", 1)),
    "OPT": (("aclnnForeachNorm_ForeachNorm_ForeachNorm", 1),
            ("aclnnApplyAdamWV2_ApplyAdamWV2_ApplyAdamWV2", 8),
            ("aclnnInplaceZero_ZerosLike_ZerosLike", 1)),
}
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_cublas"
_ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::{}>"
_ADD = _ELEMENTWISE.format("CUDAFunctor_add<c10::BFloat16>")
_TENSORS = "void multi_tensor_apply_kernel<TensorListMetadata<{}>, {}Functor<float>>"
_CUDA = {
    "F.attn": (("void at::native::rms_norm_kernel<c10::BFloat16, float>", 1), (_GEMM, 6),
               ("void apply_rotary_kernel<c10::BFloat16>", 1),
               ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, bfloat16_t>>", 8),
               (_GEMM, 4), (_ADD, 1)),
    "F.mlp": (("void at::native::rms_norm_kernel<c10::BFloat16, float>", 1),
              ("void topk_gating_softmax_kernel<c10::BFloat16>", 1),
              ("cutlass_grouped_gemm_bf16_128x128x64_kernel", 8),
              ("void at::native::silu_mul_kernel<c10::BFloat16>", 2),
              ("cutlass_grouped_gemm_bf16_128x128x64_kernel", 6), (_ADD, 1)),
    "B.mlp": (("cutlass_grouped_gemm_bf16_128x128x64_kernel", 12),
              ("void at::native::silu_mul_backward_kernel<c10::BFloat16>", 3),
              ("cutlass_grouped_gemm_bf16_128x128x64_kernel", 12),
              ("void at::native::rms_norm_backward_kernel<c10::BFloat16, float>", 2)),
    "B.attn": ((_GEMM, 8),
               ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>", 16),
               ("void apply_rotary_backward_kernel<c10::BFloat16>", 1), (_GEMM, 10),
               ("void at::native::rms_norm_backward_kernel<c10::BFloat16, float>", 2), (_ADD, 1)),
    "OPT": ((_TENSORS.format(1, "L2Norm"), 1), (_TENSORS.format(4, "FusedAdamMath"), 8),
            (_ELEMENTWISE.format("FillFunctor<float>"), 1)),
}


def _with_chunks(table: dict) -> dict:
    """Add the whole-chunk patterns F = attn + mlp and B = mlp + attn."""
    return {**table, "F": table["F.attn"] + table["F.mlp"], "B": table["B.mlp"] + table["B.attn"]}


KERNELS = {"ascend": _with_chunks(_ASCEND), "cuda": _with_chunks(_CUDA)}
SYNC_NAMES = {
    "ascend": {WAIT: "EVENT_WAIT", RECORD: "EVENT_RECORD", MEMCPY: "MEMCPY_ASYNC"},
    "cuda": {WAIT: "Stream Wait Event", RECORD: "Event Record",
             MEMCPY: "Memcpy HtoD (Pageable -> Device)"},
}
HCCL_OPS = {"allreduce": "allReduce", "reducescatter": "reduceScatter", "allgather": "allGather",
            "alltoall": "alltoallv", "batch_send_recv": "batchSendRecv", "broadcast": "broadcast",
            "send": "send", "recv": "receive"}
NCCL_OPS = {"allreduce": "AllReduce_Sum_f32_RING_LL",
            "reducescatter": "ReduceScatter_Sum_f32_RING_LL", "allgather": "AllGather_RING_LL",
            "broadcast": "Broadcast_RING_LL"}
NCCL_KERNEL = "ncclDevKernel_{}(ncclDevKernelArgsStorage<4096ul>)"


def op_name(op: Op, flavor: str) -> str:
    """The name a profiler shows for an op (a compute op shows its first kernel's)."""
    if op.kind in (P2P, COLLECTIVE):
        if flavor == "ascend":
            return f"hcom_{HCCL_OPS[op.comm]}__{op.group[-3:]}_{op.seq}_1"
        return NCCL_KERNEL.format(NCCL_OPS.get(op.comm, "SendRecv"))
    if op.kind == COMPUTE:
        return KERNELS[flavor][op.pattern][0][0]
    return SYNC_NAMES[flavor][op.kind]


def kernel_count(pattern: str, layers: int, per_chunk: int) -> int:
    """How many kernels a compute op of `pattern` expands into."""
    if pattern in (sch.FWD, sch.BWD):
        return max(per_chunk, 1)
    if pattern == "OPT":
        return max(min(per_chunk, 16), 1)
    return max(per_chunk // (2 * max(layers, 1)), 1)


def expand(ints: dict[str, np.ndarray], strs: dict[str, list[str]], patterns: list[str],
           layers: np.ndarray, sc: Scenario) -> pd.DataFrame:
    """The TIMELINE_COLUMNS frame with every compute op split into kernels cycling through its
    pattern's names, durations in the pattern's proportions, `kernel_gap_ns` apart; other ops
    stay one row. Vectorized: rows are gathered by index, strings by dictionary code."""
    table = KERNELS[sc.flavor]
    keys = sorted(table)
    size = np.array([len(table[k]) for k in keys])
    first = np.cumsum(size) - size
    names = [n for k in keys for n, _ in table[k]]
    weights = np.array([w for k in keys for _, w in table[k]], dtype=float)
    code = {k: i for i, k in enumerate(keys)}
    pid = np.array([code.get(p, -1) for p in patterns])
    reps = np.array([kernel_count(p, n, sc.kernels_per_chunk) if p else 1
                     for p, n in zip(patterns, layers, strict=True)], dtype=np.int64)
    starts = np.cumsum(reps) - reps
    idx = np.repeat(np.arange(len(reps)), reps)
    j = np.arange(len(idx)) - starts[idx]
    kern = pid[idx] >= 0
    slot = np.where(kern, first[pid[idx]] + j % size[pid[idx]], 0)
    cols: dict[str, object] = {k: v[idx] for k, v in ints.items()}
    cols.update(_kernel_times(ints, reps, starts, idx, j, np.where(kern, weights[slot], 1.0), sc))
    for col, values in strs.items():
        codes, uniques = pd.factorize(np.asarray(values, dtype=object))
        rows = codes[idx]
        if col == "name":
            rows = np.where(kern, len(uniques) + slot, rows)
            uniques = [*uniques, *names]
        cols[col] = pa.array(list(uniques), pa.string()).take(pa.array(rows))
    arrow = pa.table({c: pa.array(cols[c].astype(t, copy=False))
                      if isinstance(cols[c], np.ndarray) else cols[c]
                      for c, t in TIMELINE_COLUMNS.items()})
    return arrow.to_pandas(split_blocks=True, types_mapper={pa.string(): pd.StringDtype()}.get)


def _kernel_times(ints: dict[str, np.ndarray], reps: np.ndarray, starts: np.ndarray,
                  idx: np.ndarray, j: np.ndarray, w: np.ndarray, sc: Scenario
                  ) -> dict[str, np.ndarray]:
    """start / dur / launch of every kernel row: an op's duration split by weight, the gaps
    taken from it, the last kernel ending exactly at the op's end; launches spaced by the host."""
    csum = np.cumsum(w)
    incl = csum - np.repeat(csum[starts] - w[starts], reps)
    total = incl[starts + reps - 1][idx]
    dur, k, t_op = ints["dur_ns"][idx], reps[idx], ints["start_ns"][idx]
    gap = np.where(k > 1, np.minimum(sc.kernel_gap_ns, dur // (2 * k)), 0)
    usable = (dur - (k - 1) * gap).astype(float)
    t0 = t_op + j * gap
    begin = t0 + np.floor(usable * (incl - w) / total).astype(np.int64)
    end = np.where(j == k - 1, t_op + dur, t0 + np.floor(usable * incl / total).astype(np.int64))
    launch = ints["launch_ns"][idx] - (k - 1 - j) * int(sc.launch_us * 1000)
    return {"start_ns": begin, "dur_ns": end - begin, "launch_ns": np.minimum(launch, begin)}
