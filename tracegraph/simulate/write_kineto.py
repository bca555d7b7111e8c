"""Write a simulated `Timeline` as PyTorch 2.13 Kineto traces of an NCCL job (one file per rank).

Shapes follow `formats/kineto.md` and the real traces: `{host}_{pid}.{time_ns}.pt.trace.json.gz`
with `distributedInfo` (rank, this rank's `pg_config`), `baseTimeNanoseconds` and relative µs `ts`;
CPU ops on the main thread (`ProfilerStep#N`, `c10d::*` > `record_param_comms` > `nccl:*`),
`cudaLaunchKernel*` calls linked to kernels by correlation and `ac2g` flows, NCCL kernels on their
PG's stream carrying the copied comm args, `cudaEventRecord` / `cudaStreamWaitEvent` calls and
`cuda_sync` "Stream Wait Event" activities. Batched P2P is drawn as NCCL does it: per-op send /
recv `record_param_comms`, an `nccl:coalesced` annotation and one fused `SendRecv` kernel that
carries no per-peer args.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import orjson
import pandas as pd

from tracegraph.schema import COLLECTIVE, COMPUTE, MEMCPY, P2P, RECORD, WAIT
from tracegraph.simulate.bundle_writer import (
    Data,
    clock_shift,
    comm_instances,
    gzip_bytes,
    host_room,
    json_array,
    json_strings,
    micros,
    plain_strings,
    rank_frames,
    render,
    time_bounds,
)
from tracegraph.simulate.timeline import StepSpan, Timeline

BASE_PERIOD_NS = 7_889_238 * 10**9  # kineto floors baseTimeNanoseconds to this (~3 months)
NCCL_VERSION = "2.27.5"
TRUNCATE_RANKS = 30  # "Process Group Ranks" lists at most this many ranks
DTYPES = {"FP32": ("Float", "f32", 4), "FP16": ("Half", "f16", 2), "BFP16": ("BFloat16", "bf16", 2),
          "INT32": ("Int", "i32", 4), "INT64": ("Long", "i64", 8), "INT8": ("Char", "i8", 1),
          "UINT8": ("Byte", "u8", 1)}
"""Ascend dtype spelling -> (torch dtype name, NCCL kernel suffix, bytes)."""
_NCCL_ARGS = "ncclDevKernelArgsStorage<4096ul>"
COMMS = {  # comm -> (dispatcher op, Collective name, annotation, kernel (with {dt}))
    "allreduce": ("c10d::allreduce_", "allreduce", "nccl:all_reduce", "AllReduce_Sum_{dt}_RING_LL"),
    "reducescatter": ("c10d::_reduce_scatter_base_", "_reduce_scatter_base",
                      "nccl:_reduce_scatter_base", "ReduceScatter_Sum_{dt}_RING_LL"),
    "allgather": ("c10d::_allgather_base_", "_allgather_base", "nccl:_all_gather_base",
                  "AllGather_RING_LL"),
    "alltoall": ("c10d::alltoall_base_", "all_to_all", "nccl:all_to_all", "SendRecv"),
    "broadcast": ("c10d::broadcast_", "broadcast", "nccl:broadcast", "Broadcast_RING_LL"),
    "reduce": ("c10d::reduce_", "reduce", "nccl:reduce", "Reduce_Sum_{dt}_RING_LL"),
    "gather": ("c10d::gather_", "gather", "nccl:gather", "SendRecv"),
    "scatter": ("c10d::scatter_", "scatter", "nccl:scatter", "SendRecv"),
    "barrier": ("c10d::barrier", "barrier", "nccl:all_reduce_barrier", "AllReduce_Sum_u8_RING_LL"),
    "send": ("c10d::send", "send", "nccl:send", "SendRecv"),
    "recv": ("c10d::recv_", "recv", "nccl:recv", "SendRecv"),
}
KERNELS = (  # (words in the op name, aten op, CUDA kernel); the first that matches wins
    (("matmul", "gemm", "linear", "aclnnmm", "bmm"), "aten::mm",
     "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
     "segment_k_off_kernel__5x_cublas"),
    (("attentionscoregrad", "attentiongrad", "flash_bwd"),
     "aten::_scaled_dot_product_flash_attention_backward",
     "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<"
     "128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, "
     "128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, false>"
     "(pytorch_flash::Flash_bwd_params)"),
    (("attention", "flash"), "aten::_scaled_dot_product_flash_attention",
     "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, "
     "true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)"),
    (("norm",), "aten::native_layer_norm",
     "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
     "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
     "float*, c10::BFloat16*)"),
    (("softmax",), "aten::_softmax",
     "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, "
     "c10::BFloat16, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, "
     "c10::BFloat16 const*, int)"),
    ((), "aten::add",
     "void at::native::vectorized_elementwise_kernel<4, "
     "at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, "
     "at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"),
)
_LAUNCH = {  # kind -> (runtime call, cbid)
    COMPUTE: ("cudaLaunchKernel", 211), MEMCPY: ("cudaMemcpyAsync", 41),
    RECORD: ("cudaEventRecord", 135), WAIT: ("cudaStreamWaitEvent", 147),
    COLLECTIVE: ("cudaLaunchKernelExC", 430), P2P: ("cudaLaunchKernelExC", 430),
}
_GPU = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85017755648, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
        "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
        "sharedMemPerMultiprocessor": 233472}
_X = '{"ph":"X","cat":"%s","name":%s,"pid":%d,"tid":%d,"ts":%d.%03d,"dur":%d.%03d,"args":%s}'
_IDS = ('{"ph":"X","cat":"%s","name":%s,"pid":%d,"tid":%d,"ts":%d.%03d,"dur":%d.%03d,'
        '"args":{"External id":%d,"Record function id":0,"Ev Idx":%d}}')
"""A cpu_op or user_annotation without recorded shapes: ids only."""
_KERNEL_COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
                     "In split size", "Out split size", "Process Group Name",
                     "Process Group Description", "Process Group Ranks", "Dst Rank", "Src Rank",
                     "Seq", "Comms Id")
"""The `record_param_comms` args kineto copies onto an NCCL kernel."""


def files(timeline: Timeline) -> dict[str, bytes]:
    """Every rank's `.pt.trace.json.gz` as `{file name: bytes}`."""
    return dict(iter_files(timeline))


def iter_files(timeline: Timeline) -> Iterator[tuple[str, Data]]:
    """Every rank's `.pt.trace.json.gz` as (file name, bytes), in name order, one at a time."""
    job = Job(timeline)
    for rank in sorted(timeline.ranks, key=lambda r: RankTrace(job, r).file_name):
        trace = RankTrace(job, rank)
        yield trace.file_name, gzip_bytes(trace.trace())


def group_ids(timeline: Timeline) -> dict[str, str]:
    """Timeline group id -> the process group name ("1", "2", … in creation order; "0" is world)."""
    return {gid: pg.name for gid, pg in _pgs(timeline).items()}


def rank_roots(timeline: Timeline) -> dict[int, str]:
    """Rank -> its trace file."""
    job = Job(timeline)
    return {r: RankTrace(job, r).file_name for r in timeline.ranks}


@dataclass(frozen=True)
class _PG:
    name: str
    desc: str
    ranks: tuple[int, ...]

    @property
    def rank_text(self) -> str:
        """`Process Group Ranks` as PyTorch formats it (a string, truncated past 30 ranks)."""
        shown = ", ".join(map(str, self.ranks[:TRUNCATE_RANKS]))
        return f"[{shown}, ...]" if len(self.ranks) > TRUNCATE_RANKS else f"[{shown}]"

    @property
    def stride(self) -> tuple[int, int] | None:
        """(Global rank start, Global rank stride) when the members are evenly spaced."""
        steps = set(np.diff(self.ranks).tolist()) or {1}
        return (self.ranks[0], steps.pop()) if len(steps) == 1 and min(steps) > 0 else None


def _pgs(timeline: Timeline) -> dict[str, _PG]:
    """Group id -> its process group; PG names count from 1 in sorted group order."""
    return {gid: _PG(str(i), info.desc or "undefined", tuple(sorted(int(r) for r in info.ranks)))
            for i, (gid, info) in enumerate(sorted(timeline.groups.items()), start=1)}


class Job:
    """Job-wide facts: process groups, world size, clocks, comm sequence numbers."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.pgs = _pgs(timeline)
        members = {r for pg in self.pgs.values() for r in pg.ranks} | set(timeline.ranks)
        self.world = int(timeline.params.get("world_size", max(members) + 1))
        self.default = _PG("0", "default_pg", tuple(range(self.world)))
        self.shift = clock_shift(timeline)
        self.bounds = time_bounds(timeline)
        self.cuda = timeline.params.get("flavor") == "cuda"  # compute names are CUDA kernels
        self.steps: dict[int, list[StepSpan]] = {}
        for span in sorted(timeline.steps, key=lambda s: (s.rank, s.step)):
            self.steps.setdefault(span.rank, []).append(span)

    @cached_property
    def frames(self) -> dict[int, pd.DataFrame]:
        return rank_frames(self.timeline)

    @cached_property
    def seq(self) -> pd.Series:
        return comm_instances(self.frames)


class RankTrace:
    """One rank's Chrome trace."""

    def __init__(self, job: Job, rank: int):
        self.job, self.rank = job, rank
        self.pid = 200_000 + (rank * 7919) % 4_000_000
        self.device = rank % 8
        self.shift = job.shift[rank]
        self.steps = job.steps.get(rank, [])
        self.start, self.end = (t + self.shift for t in job.bounds[rank])
        self.base = self.start // BASE_PERIOD_NS * BASE_PERIOD_NS

    @cached_property
    def file_name(self) -> str:
        return f"node{self.rank // 8}_{self.pid}.{self.end + 1_000_000}.pt.trace.json.gz"

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The rank's ops in launch order on its local clock, with correlation and External ids."""
        ops = plain_strings(self.job.frames[self.rank]).sort_values(["launch_ns", "start_ns"],
                                                                     kind="stable")
        ops = ops.assign(t0=ops["start_ns"] + self.shift, lt=ops["launch_ns"] + self.shift)
        ops["corr"] = 1000 + np.arange(len(ops))
        batched = (ops["comm"] == "batch_send_recv").to_numpy()
        is_sync, is_comm = ops["kind"].isin((RECORD, WAIT)), ops["kind"].isin((COLLECTIVE, P2P))
        n_ext = np.select([is_sync, batched, is_comm], [0, 7, 3], 1)
        # External ids 1..len(steps) are the ProfilerStep annotations'; each op's block follows
        ops["ext"] = 1 + len(self.steps) + np.cumsum(n_ext) - n_ext
        # the External id its runtime call and GPU activity carry: the innermost cpu op's
        ops["launch_ext"] = np.select([is_sync, batched, is_comm],
                                      [0, ops["ext"] + 6, ops["ext"] + 1], ops["ext"])
        ops["seq"] = self.job.seq.reindex(ops.index).fillna(-1).astype("int64")
        ops["before"], ops["after"] = host_room(ops["lt"].to_numpy(np.int64))
        return ops

    def trace(self) -> list[bytes]:
        sections = [self._metadata(), self._steps(), self._host(), self._comm_host(),
                    self._device(), self._syncs(), self._flows(), self._memory(),
                    self._ranges(), self._instants()]
        gpu = _GPU | ({"totalGlobalMem": int(self.job.timeline.params["device_gib"] * 2**30)}
                      if self.job.timeline.params.get("memory") else {})
        head = {"schemaVersion": 1,
                "deviceProperties": [{"id": d, **gpu} for d in range(8)],
                "trace_id": hashlib.md5(self.file_name.encode()).hexdigest().upper(),
                "distributedInfo": self._distributed_info(),
                "host_name": f"node{self.rank // 8}", "displayTimeUnit": "ms",
                "baseTimeNanoseconds": self.base}
        tail = orjson.dumps({"traceName": f"/tmp/{self.file_name.removesuffix('.gz')}"})
        return [orjson.dumps(head)[:-1] + b',"traceEvents":', *json_array(sections),
                b"," + tail[1:]]

    def _distributed_info(self) -> dict[str, object]:
        mine = [self.job.default, *(pg for pg in self.job.pgs.values() if self.rank in pg.ranks)]
        return {"backend": "nccl", "rank": self.rank, "world_size": self.job.world,
                "pg_count": len(self.job.pgs) + 1,
                "pg_config": [{"pg_name": pg.name, "pg_desc": pg.desc,
                               "backend_config": "cuda:nccl", "pg_size": len(pg.ranks),
                               "ranks": list(pg.ranks)} for pg in mine],
                "nccl_version": NCCL_VERSION}

    def _times(self, ts, dur) -> list[np.ndarray]:
        """The four columns of `"ts":%d.%03d,"dur":%d.%03d`: µs after the base, exact to the ns."""
        return [*micros(np.asarray(ts, dtype=np.int64) - self.base),
                *micros(np.maximum(np.asarray(dur, dtype=np.int64), 0))]

    # --- host side ---------------------------------------------------------------------------

    def _steps(self) -> list[bytes]:
        start = np.array([s.start_ns for s in self.steps], dtype=np.int64) + self.shift
        end = np.array([s.end_ns for s in self.steps], dtype=np.int64) + self.shift
        index = np.arange(len(self.steps))
        return render(_IDS, ["user_annotation",
                             json_strings(f"ProfilerStep#{s.step}" for s in self.steps),
                             self.pid, self.pid, *self._times(start, end - start), index + 1,
                             index], len(self.steps))

    def _host(self) -> list[bytes]:
        """The aten op around each kernel / copy launch, and every op's runtime call."""
        ops = self.ops
        plain = ops[ops["kind"].isin((COMPUTE, MEMCPY))]
        aten = np.where(plain["kind"] == MEMCPY, "aten::copy_",
                        plain["name"].map({n: cuda_kernel(n)[0] for n in plain["name"].unique()}))
        lt, before, after = (plain[c].to_numpy(np.int64) for c in ("lt", "before", "after"))
        rows = render(_IDS, ["cpu_op", json_strings(aten), self.pid, self.pid,
                             *self._times(lt - before * 4 // 5, before * 4 // 5 + after * 9 // 10),
                             plain["ext"].to_numpy(), plain["ext"].to_numpy()], len(plain))
        call, cbid = zip(*map(_LAUNCH.get, ops["kind"]), strict=True) if len(ops) else ((), ())
        return rows + render(
            '{"ph":"X","cat":"cuda_runtime","name":"%s","pid":%d,"tid":%d,"ts":%d.%03d,'
            '"dur":%d.%03d,"args":{"External id":%d,"cbid":%d,"correlation":%d}}',
            [np.array(call, dtype=object), self.pid, self.pid,
             *self._times(ops["lt"], ops["after"] // 2), ops["launch_ext"].to_numpy(),
             np.array(cbid), ops["corr"].to_numpy()], len(ops))

    def _comm_host(self) -> list[bytes]:
        """`c10d::*` > `record_param_comms` > `nccl:*` around each comm launch."""
        comm = self.ops[self.ops["kind"].isin((COLLECTIVE, P2P))]
        single = comm[comm["comm"] != "batch_send_recv"]
        lt, b, a = (single[c].to_numpy(np.int64) for c in ("lt", "before", "after"))
        spec = [COMMS[c] for c in single["comm"]]
        notes = [self._p2p_note(s[2], c, r) if c in ("send", "recv") else s[2]
                 for s, c, r in zip(spec, single["comm"], single.itertuples(), strict=True)]
        ext, n = single["ext"].to_numpy(), len(single)
        rows = [
            *self._ids("cpu_op", [s[0] for s in spec], lt - b * 9 // 10,
                       b * 9 // 10 + a * 19 // 20, ext),
            *self._comms("cpu_op", ["record_param_comms"] * n, lt - b * 4 // 5,
                         b * 4 // 5 + a * 9 // 10,
                         [self._comm_args(r, r.comm, r.ext + 1) for r in single.itertuples()]),
            *self._ids("user_annotation", notes, lt - b // 2, b // 2 + a * 7 // 10, ext + 2),
        ]
        batch = comm[comm["comm"] == "batch_send_recv"]
        lt, b, a = (batch[c].to_numpy(np.int64) for c in ("lt", "before", "after"))
        for half, (comm_type, start, end) in enumerate((("send", 9, 6), ("recv", 5, 2))):
            ext = batch["ext"].to_numpy() + 3 * half
            rows += [
                *self._ids("cpu_op", [COMMS[comm_type][0]] * len(batch), lt - b * start // 10,
                           b * (start - end) // 10, ext),
                *self._comms("cpu_op", ["record_param_comms"] * len(batch),
                             lt - b * (2 * start - 1) // 20, b * (start - end - 1) // 10,
                             [self._comm_args(r, comm_type, e)
                              for r, e in zip(batch.itertuples(), ext + 1, strict=True)]),
                *self._ids("user_annotation",
                           [self._p2p_note("nccl:" + comm_type, comm_type, r)
                            for r in batch.itertuples()],
                           lt - b * (start - 1) // 10, b * (start - end - 2) // 10, ext + 2),
            ]
        return rows + self._ids("user_annotation", ["nccl:coalesced"] * len(batch),
                                lt - b // 10, b // 10 + a * 9 // 10, batch["ext"].to_numpy() + 6)

    def _ids(self, cat: str, names, ts, dur, ext) -> list[bytes]:
        """cpu_op / user_annotation rows on the main thread carrying only their ids."""
        ext = np.asarray(ext, dtype=np.int64)
        return render(_IDS, [cat, json_strings(names), self.pid, self.pid,
                             *self._times(ts, dur), ext, ext], len(ext))

    def _comms(self, cat: str, names, ts, dur, args: list[dict]) -> list[bytes]:
        """Rows with arbitrary args (the few comm and sync events), on the main thread."""
        return self._x(cat, names, self.pid, self.pid, ts, dur, args)

    def _x(self, cat: str, names, pid, tid, ts, dur, args: list[dict]) -> list[bytes]:
        encoded = np.array([orjson.dumps(a).decode() for a in args], dtype=object)
        return render(_X, [cat, json_strings(names), pid, tid, *self._times(ts, dur), encoded],
                      len(args))

    def _p2p_note(self, note: str, comm: str, op) -> str:
        """`nccl:send 0->1` / `nccl:recv 1<-0` with group-local ranks."""
        ranks = self.job.pgs[op.group].ranks
        me, peer = ranks.index(self.rank), ranks.index(int(op.peer))
        return f"{note} {me}->{peer}" if comm == "send" else f"{note} {me}<-{peer}"

    def _comm_args(self, op, comm: str, ext: int) -> dict[str, object]:
        """`record_param_comms` args: the PG, sizes, ranks, and Seq / Comms Id (torch 2.13)."""
        pg = self.job.pgs[op.group]
        torch_dtype, _, size = DTYPES.get(op.dtype or "FP32", DTYPES["FP32"])
        elems = int(op.bytes) // size
        out_elems = {"allgather": elems * len(pg.ranks),
                     "reducescatter": elems // len(pg.ranks)}.get(comm, elems)
        args = {"External id": int(ext), "Record function id": 0,
                "Collective name": COMMS[comm][1], "dtype": torch_dtype, "In msg nelems": elems,
                "Out msg nelems": out_elems, "Group size": len(pg.ranks), "In split size": "[]",
                "Out split size": "[]"}
        if pg.stride:
            args["Global rank start"], args["Global rank stride"] = pg.stride
        args.update({"Process Group Name": pg.name, "Process Group Description": pg.desc,
                     "Process Group Ranks": pg.rank_text})
        if comm in ("send", "recv"):
            args["Rank"] = pg.ranks.index(int(op.peer))
            args["Dst Rank" if comm == "send" else "Src Rank"] = int(op.peer)
        else:
            args["Rank"] = pg.ranks.index(self.rank)
        if op.seq >= 0:
            args["Seq"] = int(op.seq)
            args["Comms Id"] = _comms_id(pg, int(op.seq), op.kind == P2P)
        args["Ev Idx"] = int(ext)
        return args

    # --- device side -------------------------------------------------------------------------

    def _device(self) -> list[bytes]:
        """Kernels and copies on (device, stream), linked to their launch by correlation."""
        ops = self.ops
        return [*self._kernels(ops[ops["kind"] == COMPUTE]),
                *self._copies(ops[ops["kind"] == MEMCPY]),
                *self._nccl(ops[ops["kind"].isin((COLLECTIVE, P2P))])]

    def _kernels(self, ops: pd.DataFrame) -> list[bytes]:
        names = {n: n if self.job.cuda else cuda_kernel(n)[1] for n in ops["name"].unique()}
        return render(
            '{"ph":"X","cat":"kernel","name":%s,"pid":%d,"tid":%d,"ts":%d.%03d,"dur":%d.%03d,'
            '"args":{"External id":%d,"queued":0,"device":%d,"context":1,"stream":%d,'
            '"correlation":%d,"registers per thread":168,"shared memory":213504,'
            '"blocks per SM":1.0,"warps per SM":12.0,"grid":[132,1,1],"block":[384,1,1],'
            '"est. achieved occupancy %%":19}}',
            [json_strings(ops["name"].map(names)), self.device, ops["stream"].to_numpy(),
             *self._times(ops["t0"], ops["dur_ns"]), ops["launch_ext"].to_numpy(), self.device,
             ops["stream"].to_numpy(), ops["corr"].to_numpy()], len(ops))

    def _copies(self, ops: pd.DataFrame) -> list[bytes]:
        size, dur = ops["bytes"].to_numpy(np.int64), ops["dur_ns"].to_numpy(np.int64)
        names = [n if n.startswith("Memcpy ") else "Memcpy DtoD (Device -> Device)"
                 for n in ops["name"]]
        return render(
            '{"ph":"X","cat":"gpu_memcpy","name":%s,"pid":%d,"tid":%d,"ts":%d.%03d,'
            '"dur":%d.%03d,"args":{"External id":%d,"device":%d,"context":1,"stream":%d,'
            '"correlation":%d,"bytes":%d,"memory bandwidth (GB/s)":%r}}',
            [json_strings(names), self.device, ops["stream"].to_numpy(),
             *self._times(ops["t0"], dur), ops["launch_ext"].to_numpy(), self.device,
             ops["stream"].to_numpy(), ops["corr"].to_numpy(), size,
             size / np.maximum(dur, 1)], len(ops))

    def _nccl(self, ops: pd.DataFrame) -> list[bytes]:
        """NCCL kernels on their PG's stream, with the comm args kineto copies onto them."""
        return self._x("kernel", [self.nccl_kernel_name(r.comm, r.dtype) for r in ops.itertuples()],
                       self.device, ops["stream"].to_numpy(), ops["t0"], ops["dur_ns"],
                       [self._nccl_args(r) for r in ops.itertuples()])

    @staticmethod
    def nccl_kernel_name(comm: str, dtype: str) -> str:
        comm = "send" if comm == "batch_send_recv" else comm
        suffix = DTYPES.get(dtype or "FP32", DTYPES["FP32"])[1]
        return f"ncclDevKernel_{COMMS[comm][3].format(dt=suffix)}({_NCCL_ARGS})"

    def _nccl_args(self, op) -> dict[str, object]:
        args = {"External id": int(op.launch_ext), "queued": 0, "device": self.device,
                "context": 1, "stream": int(op.stream), "correlation": int(op.corr),
                "registers per thread": 96, "shared memory": 103808, "blocks per SM": 0.242424,
                "warps per SM": 3.878788, "grid": [32, 1, 1], "block": [512, 1, 1],
                "est. achieved occupancy %": 0}
        if op.comm != "batch_send_recv":  # the fused batch kernel carries no comm args
            comm_args = self._comm_args(op, op.comm, op.launch_ext)
            args.update({k: comm_args[k] for k in _KERNEL_COMM_ARGS if k in comm_args})
        return args

    def _syncs(self) -> list[bytes]:
        """`cuda_sync` Stream Wait Event per wait: stream, recording stream and record's corr."""
        ops = self.ops
        waits = ops[ops["kind"] == WAIT]
        records = ops[ops["kind"] == RECORD].sort_values("lt")
        found = pd.merge_asof(waits[["lt", "event_id"]].reset_index().sort_values("lt"),
                              records[["lt", "event_id", "stream", "corr"]],
                              on="lt", by="event_id", direction="backward")
        found = found.set_index("index").reindex(waits.index)
        wait_on = found["stream"].fillna(-1).astype("int64").tolist()
        record_corr = found["corr"].fillna(-1).astype("int64").tolist()
        args = [{"External id": 0, "cuda_sync_kind": "Stream Wait Event", "wait_on_stream": s,
                 "wait_on_cuda_event_record_corr_id": rc, "wait_on_cuda_event_id": int(e),
                 "stream": int(st), "correlation": int(c), "device": self.device, "context": 1}
                for s, rc, e, st, c in zip(wait_on, record_corr, waits["event_id"],
                                           waits["stream"], waits["corr"], strict=True)]
        return self._x("cuda_sync", ["Stream Wait Event"] * len(waits), self.device,
                       waits["stream"].to_numpy(np.int64), *sync_span(waits), args)

    def _flows(self) -> list[bytes]:
        """`ac2g` flows from each launch / wait call to its GPU activity (id = correlation)."""
        ops = self.ops[self.ops["kind"] != RECORD]
        gpu_ts = np.where(ops["kind"] == WAIT, sync_span(ops)[0], ops["t0"])
        corr, n = ops["corr"].to_numpy(), len(ops)
        start = render('{"ph":"s","id":%d,"pid":%d,"tid":%d,"ts":%d.%03d,"cat":"ac2g",'
                       '"name":"ac2g"}',
                       [corr, self.pid, self.pid, *micros(ops["lt"].to_numpy() - self.base)], n)
        return start + render(
            '{"ph":"f","id":%d,"pid":%d,"tid":%d,"ts":%d.%03d,"cat":"ac2g","name":"ac2g",'
            '"bp":"e"}',
            [corr, self.device, ops["stream"].to_numpy(np.int64), *micros(gpu_ts - self.base)],
            n)

    # --- metadata ----------------------------------------------------------------------------

    def _metadata(self) -> list[bytes]:
        ts = _us_text(self.start - self.base)
        rows = [(self.pid, 0, "process_name", "name", "python"),
                (self.pid, 0, "process_labels", "labels", "CPU"),
                (self.pid, 0, "process_sort_index", "sort_index", self.pid),
                (self.device, 0, "process_name", "name", "python"),
                (self.device, 0, "process_labels", "labels", f"GPU {self.device}"),
                (self.device, 0, "process_sort_index", "sort_index", 16777216 + self.device)]
        for stream in sorted(int(s) for s in self.ops["stream"].unique()):
            rows += [(self.device, stream, "thread_name", "name", f"stream {stream} "),
                     (self.device, stream, "thread_sort_index", "sort_index", stream)]
        rows += [(self.pid, self.pid, "thread_name", "name", f"thread {self.pid} (python)"),
                 (self.pid, self.pid, "thread_sort_index", "sort_index", self.pid)]
        return [",\n".join(f'{{"ph":"M","name":"{name}","ts":{ts},"pid":{pid},"tid":{tid},'
                           f'"args":{orjson.dumps({key: value}).decode()}}}'
                           for pid, tid, name, key, value in rows).encode()]

    def _memory(self) -> list[bytes]:
        """`[memory]` instant events (profile_memory=True) on the main thread: the caching
        allocator's totals after each allocation / release, as PyTorch's AddGenericMetadata
        writes their args (Device Type 1 = CUDA)."""
        memory = self.job.timeline.memory
        if memory is None:
            return []
        mine = memory[memory["rank"] == self.rank]
        addr = 0x7F0000000000 + np.cumsum(mine["bytes"].abs().to_numpy(np.int64))
        return render(
            '{"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]","pid":%d,"tid":%d,'
            '"ts":%d.%03d,"args":{"Device Type":1,"Device Id":%d,"Addr":%d,"Bytes":%d,'
            '"Total Allocated":%d,"Total Reserved":%d,"Ev Idx":%d}}',
            [self.pid, self.pid, *micros(mine["time_ns"].to_numpy(np.int64) + self.shift
                                         - self.base),
             self.device, addr, mine["bytes"].to_numpy(), mine["allocated"].to_numpy(),
             mine["reserved"].to_numpy(), np.arange(len(mine))], len(mine))

    def _ranges(self) -> list[bytes]:
        """The framework's `record_function` range around each forward and backward, named
        after Megatron's schedule functions (`forward_step` / `backward_step`): on the main
        thread while it launched the work, and as kineto's `gpu_user_annotation` over that
        work on the compute stream."""
        ranges = self.job.timeline.ranges
        if ranges is None:
            return []
        mine = ranges[ranges["rank"] == self.rank]
        names = json_strings(mine["phase"].map({"F": "forward_step", "B": "backward_step"}))
        ext = int(self.ops["ext"].max()) + 10 + np.arange(len(mine))
        host = [mine[c].to_numpy(np.int64) + self.shift for c in ("host_start_ns", "host_end_ns")]
        device = [mine[c].to_numpy(np.int64) + self.shift for c in ("start_ns", "end_ns")]
        stream = self.job.timeline.compute_stream
        return [*render(_IDS, ["user_annotation", names, self.pid, self.pid,
                               *self._times(host[0], host[1] - host[0]), ext, ext], len(mine)),
                *render(_IDS, ["gpu_user_annotation", names, self.device, stream,
                               *self._times(device[0], device[1] - device[0]), ext, ext],
                        len(mine))]

    def _instants(self) -> list[bytes]:
        start, end = _us_text(self.start - self.base), _us_text(self.end - self.base)
        dur = _us_text(self.end - self.start)
        return [",\n".join([
            f'{{"ph":"X","cat":"Trace","name":"PyTorch Profiler (0)","pid":"Spans",'
            f'"tid":"PyTorch Profiler","ts":{start},"dur":{dur},"args":{{"Op count":0}}}}',
            f'{{"ph":"M","name":"process_sort_index","ts":{start},"pid":"Spans","tid":0,'
            f'"args":{{"sort_index":536870912}}}}',
            f'{{"ph":"i","s":"g","name":"Iteration Start: PyTorch Profiler","pid":"Traces",'
            f'"tid":"Trace PyTorch Profiler","ts":{start}}}',
            f'{{"ph":"i","s":"g","name":"Record Window End","pid":"","tid":"","ts":{end}}}',
        ]).encode()]


def cuda_kernel(name: str) -> tuple[str, str]:
    """(aten op, CUDA kernel name) for a compute op named like an Ascend kernel or a CUDA one."""
    low = name.lower()
    for words, aten, kernel in KERNELS:
        if not words or any(w in low for w in words):
            return aten, kernel
    raise AssertionError("KERNELS ends with a catch-all")


def _us_text(ns: int) -> str:
    """ns as a µs JSON number exact to the ns."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def sync_span(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(ts, dur) of the `cuda_sync` activity of each wait: inside its runtime call (host time)."""
    call = ops["after"].to_numpy(np.int64) // 2  # the runtime call's duration
    return ops["lt"].to_numpy(np.int64) + call // 5, call * 3 // 5


def _cpu_args(ext) -> list[str]:
    """Args of a cpu_op or user_annotation: its ids only (no shapes recorded)."""
    return [f'{{"External id":{e},"Record function id":0,"Ev Idx":{e}}}'
            for e in np.asarray(ext, dtype=np.int64).tolist()]


def _comms_id(pg: _PG, seq: int, p2p: bool) -> int:
    """A stable 64-bit id of (pg name, seq, isP2P, rank start, stride, size), as on every member."""
    start, stride = pg.stride or (-1, 0)
    key = f"{pg.name}|{seq}|{int(p2p)}|{start}|{stride}|{len(pg.ranks)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
