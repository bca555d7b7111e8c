"""Named simulator scenarios: every parameter of a run in one dataclass.

Any field can be overridden by name (`simulate("large", ranks=64)`); CLI flags such as --ranks,
--pp, --vpp, --microbatches and --steps map onto the fields of the same name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MIB = 1 << 20
HSDP_MODES = ("none", "sync", "async")
FLAVORS = ("ascend", "cuda")


@dataclass(frozen=True)
class Scenario:
    """Parameters of one simulated job. Times in ms unless the name says otherwise."""

    name: str = "custom"
    description: str = ""
    # --- job shape: profiled rank = stage*stage_stride + replica*replica_stride + ep_index
    ranks: int = 0  # profiled ranks, a multiple of pp*ep; 0 = one PP replica
    pp: int = 4
    vpp: int = 1
    microbatches: int = 8
    steps: int = 2
    first_step: int = 1  # number of the first ProfilerStep#N
    num_layers: int = 32
    layers: tuple[str, ...] | None = None  # pipeline_parallel_layers_per_stage, "0-5,24-29"
    ep: int = 1
    stage_stride: int = 0  # 0 = contiguous
    replica_stride: int = 0  # 0 = ep
    # --- compute (B of the embedding / head extras is twice their F)
    f_ms: float = 4.0  # forward per layer
    b_ms: float = 8.0  # backward per layer
    embed_ms: float = 0.0
    head_ms: float = 0.0
    attn_share: float = 0.4  # attention part of a MoE layer (the rest is the expert MLP)
    optimizer_ms: float = 5.0
    memcpy_us: int = 30
    input_bytes: int = 32_768
    noise: float = 0.01  # log-normal sigma of compute durations
    jitter: float = 0.0  # log-normal sigma of a run's compute speed and of each rank's per step
    stage_scale: tuple[float, ...] = ()  # per-stage compute speed (calibration), () = all 1
    slow_rank: int = -1
    slow_factor: float = 1.0
    # --- pipeline P2P (one 2-rank group and stream per edge, p2p_transport multi_stream)
    p2p_bytes: int = 8 * MIB
    p2p_gbps: float = 16.5
    batch_p2p: bool = True  # pair a send and a receive with the same peer into one op
    # --- HSDP gradient reduction after each chunk's last backward
    hsdp: str = "none"  # none | sync (wait on the compute stream) | async (drain before opt.)
    hsdp_groups: tuple[tuple[str, int, int, int], ...] = ()  # (comm, size, stride, bytes/layer)
    hsdp_tails_ms: tuple[tuple[int, tuple[float, ...]], ...] = ()  # chunk -> tail per group
    dp_gbps: float = 25.0
    arrival_jitter_ms: float = 0.2  # sigma of unprofiled members' arrivals
    # --- expert parallel all-to-all
    a2a_bytes: int = 16 * MIB
    ep_gbps: float = 24.0
    combined_1f1b: bool = True  # overlap a forward with a backward, a2a of one under the other
    serialize: bool = False  # compute and EP streams share one hardware queue
    late_rank: int = -1
    late_factor: float = 1.0  # expert MLP slowdown of late_rank (token imbalance)
    # --- memory (profile_memory=True): the allocator's totals after each allocation / release
    memory: bool = False
    base_mib: float = 1024.0  # context and workspaces, held from the first launch
    static_mib_per_layer: float = 600.0  # weights, gradients and optimizer state of one layer
    act_mib_per_layer: float = 90.0  # activations a microbatch keeps per layer until its B
    device_gib: float = 64.0  # the device's memory capacity
    # --- host, clocks, output
    launch_us: float = 2.0  # host time per launched kernel / op
    step_gap_us: float = 300.0  # host time between device idle and the next step's first launch
    host_stalls: tuple[tuple[int, int, int, float], ...] = ()  # (rank, step, unit, ms)
    clock_offset_us: tuple[float, float] = (20.0, 2000.0)
    kernels_per_chunk: int = 24
    kernel_gap_ns: int = 1500
    flavor: str = "ascend"  # kernel and comm names: ascend | cuda
    annotate: bool = False  # the framework's FWD/BWD ranges (`FWD mb=3 chunk=1`) in the trace
    compute_stream: int = 47
    pp_streams: tuple[int, int] = (49, 50)  # edge to the next stage, edge to the previous one
    hsdp_stream: int = 51
    ep_stream: int = 52
    epoch_ns: int = 1_757_664_000_000_000_000  # true clock at the first step's start
    threshold_ms: float = 1.0  # shortest bubble the ground truth lists

    def __post_init__(self) -> None:
        if self.hsdp not in HSDP_MODES:
            raise ValueError(f"hsdp must be one of {HSDP_MODES}, not {self.hsdp!r}")
        if self.flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}, not {self.flavor!r}")
        if min(self.pp, self.vpp, self.microbatches, self.steps, self.ep) < 1:
            raise ValueError("pp, vpp, microbatches, steps and ep must be at least 1")
        if self.hsdp != "none" and not self.hsdp_groups:
            raise ValueError("hsdp needs hsdp_groups")
        if self.stage_scale and len(self.stage_scale) != self.pp:
            raise ValueError(f"stage_scale has {len(self.stage_scale)} entries, pp is {self.pp}")


SEED_LAYOUT = ("0-5,24-29", "6-11,30-35", "12-17,36-41", "18-23,42-44")

HSDP_STRAGGLER_SYNC = Scenario(
    name="hsdp-straggler-sync",
    description="mindspore/hyper-parallel#390: PP4 VPP2, 16 microbatches, ranks 0/4096/8192/12288 "
                "of one PP replica; FSDP_REDUCE_GRAD waits on stream 47 before BWD_SEND, and a "
                "straggler among the unprofiled HSDP members stalls the pipeline",
    pp=4, vpp=2, microbatches=16, num_layers=45, layers=SEED_LAYOUT,
    stage_stride=4096, replica_stride=128,
    f_ms=11.2, b_ms=103.245 / 6, head_ms=17.6, stage_scale=(1.0, 1.07, 0.99, 1.0),
    optimizer_ms=40.0, noise=0.001, hsdp="sync",
    hsdp_groups=(("allreduce", 128, 32, 1_048_576 * 4), ("allreduce", 32, 128, 8_388_608 * 4)),
    hsdp_tails_ms=((7, (284.5, 180.0)), (6, (0.0, 114.7))),
)

HSDP_STRAGGLER_ASYNC = dataclasses.replace(
    HSDP_STRAGGLER_SYNC, name="hsdp-straggler-async", hsdp="async",
    description="the same job and straggler after the fix: BWD_SEND first, the reduction on its "
                "own stream, drained before the optimizer")

EP_A2A_OVERLAP = Scenario(
    name="ep-a2a-overlap",
    description="MoE PP2 x EP4 (8 ranks): dispatch/combine all-to-all per layer overlapped with "
                "the other microbatch by combined 1F1B; rank 2's expert compute is 1.6x (token "
                "imbalance), so it is late to its all-to-alls",
    pp=2, ep=4, microbatches=8, num_layers=8, f_ms=3.0, b_ms=6.0, optimizer_ms=3.0,
    late_rank=2, late_factor=1.6, kernels_per_chunk=48, flavor="cuda", compute_stream=7,
    pp_streams=(20, 24), hsdp_stream=28, ep_stream=32,
)

EP_A2A_SERIALIZED = dataclasses.replace(
    EP_A2A_OVERLAP, name="ep-a2a-serialized", serialize=True,
    description="the same MoE job with compute and all-to-all on one hardware queue "
                "(CUDA_DEVICE_MAX_CONNECTIONS=1 style): every all-to-all runs alone")

SERIALIZED_STREAMS = dataclasses.replace(
    EP_A2A_OVERLAP, name="serialized-streams", serialize=True, late_rank=-1, late_factor=1.0,
    description="MoE PP2 x EP4 with combined 1F1B, compute and all-to-all streams on one hardware "
                "queue (CUDA_DEVICE_MAX_CONNECTIONS=1): the overlap silently disappears")

PP_COMPUTE_STRAGGLER = Scenario(
    name="pp-compute-straggler",
    description="PP4 1F1B, 8 microbatches; rank 2 (stage 2) computes 1.3x slower",
    pp=4, microbatches=8, num_layers=32, slow_rank=2, slow_factor=1.3,
)

PP_COMPUTE_HEALTHY = dataclasses.replace(
    PP_COMPUTE_STRAGGLER, name="pp-compute-healthy", slow_rank=-1, slow_factor=1.0,
    description="the same PP4 job without the straggler: what fixing rank 2 would give")

PP_MEMORY = Scenario(
    name="pp-memory",
    description="PP4 1F1B, 8 microbatches, profile_memory: stage r keeps p - r microbatches of "
                "activations at its peak, so memory falls from the first stage to the last",
    pp=4, microbatches=8, num_layers=32, memory=True, device_gib=24.0,
)

VPP = Scenario(
    name="vpp",
    description="PP4 x VPP2 interleaved 1F1B, 16 microbatches, profile_memory, no annotations: "
                "the schedule must be recovered from P2P and op order alone",
    pp=4, vpp=2, microbatches=16, num_layers=32, f_ms=2.0, b_ms=4.0, memory=True,
)

VPP_ANNOTATED = dataclasses.replace(
    VPP, name="vpp-annotated", annotate=True,
    description="the same interleaved job with the framework's FWD/BWD ranges (`FWD mb=3 "
                "chunk=1`) around every microbatch")

LARGE = Scenario(
    name="large",
    description="benchmark: PP4 VPP2 x replicas, async HSDP over the profiled replicas, "
                "~1M device ops per rank",
    ranks=8, pp=4, vpp=2, microbatches=16, num_layers=32, hsdp="async",
    hsdp_groups=(("allreduce", 0, 0, 32 * MIB),), kernels_per_chunk=7800,
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    HSDP_STRAGGLER_SYNC, HSDP_STRAGGLER_ASYNC, EP_A2A_OVERLAP, EP_A2A_SERIALIZED,
    SERIALIZED_STREAMS, PP_COMPUTE_STRAGGLER, PP_COMPUTE_HEALTHY, PP_MEMORY, VPP, VPP_ANNOTATED,
    LARGE)}


def scenario(name: str, **overrides: object) -> Scenario:
    """A named scenario with fields overridden; a new pp/vpp drops the per-stage layout and
    speeds calibrated for the old shape unless they are overridden too."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    base = SCENARIOS[name]
    fields = {f.name for f in dataclasses.fields(Scenario)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown scenario parameter(s) {unknown}")
    if "pp" in overrides or "vpp" in overrides:
        overrides = {"layers": None, "stage_scale": (), **overrides}
    return dataclasses.replace(base, **overrides)
