"""The simulator's output: what happened on every rank, before it is written in a profiler format.

The discrete-event model (`tracegraph.simulate.model`) produces a `Timeline`; the format writers
(`tracegraph.simulate.write_ascend`, `write_kineto`) turn it into files exactly as the real
profilers lay them out. Everything a writer needs is here; nothing here reaches the files unless a
real profiler would write it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from parsers.base import GroupInfo

TIMELINE_COLUMNS = {
    # --- device operations, one row each (same meaning as tracegraph.schema.EVENTS) -----------
    "rank": "int32",  # global rank
    "stream": "int64",  # device stream id (e.g. 47 = main compute stream in the seed case)
    "name": "string",  # kernel / task name as the profiler would show it
    "kind": "string",  # compute | wait | record | collective | p2p | memcpy
    "comm": "string",  # schema.COMM_TYPES or ""
    "start_ns": "int64",  # on the TRUE global clock; writers add the rank's clock offset
    "dur_ns": "int64",
    "group": "string",  # group id (key of Timeline.groups) or ""
    "peer": "int32",  # P2P peer global rank or -1
    "seq": "int64",  # instance index within the group (HCCL name index / NCCL Seq) or -1
    "bytes": "int64",
    "dtype": "string",  # "BFP16", "FP32" (Ascend spelling); writers translate for Kineto
    "event_id": "int64",  # a wait and the record it waits on share this id; -1 otherwise
    # --- what the host did ---------------------------------------------------------------------
    "launch_ns": "int64",  # when the host enqueued the op (true clock); <= start_ns
    # --- schedule facts: ground truth only, writers must NOT emit them as markers -------------
    "step": "int32",  # training step number
    "phase": "string",  # F | B | W | "" (comm / sync ops)
    "microbatch": "int32",  # -1 when not a microbatch op
    "chunk": "int32",  # virtual pipeline stage (global stage id, 0..pp*vpp-1), -1 otherwise
    "meta_step": "string",  # scheduler action: FWD, BWD, BWD_SEND, FSDP_REDUCE_GRAD, ... or ""
}


RANGE_COLUMNS = {
    "rank": "int32",
    "phase": "string",  # F | B: the framework names its range (forward_step, mstx "forward")
    "host_start_ns": "int64",  # the range on the host: around the launches of its work
    "host_end_ns": "int64",
    "start_ns": "int64",  # the work it launched on the device (true clock)
    "end_ns": "int64",
    "chunk": "int32",  # the stage's model chunk (0..v-1) and the microbatch it runs (in its
    "microbatch": "int32",  # name only where the scenario's `range_label` puts them)
}
"""The ranges a framework opens around each forward and backward (scenario `annotate`): what
its profiler shows, named as real frameworks name them (`range_names`)."""


def range_names(ranges: pd.DataFrame, phase_names: dict[str, str], label: str) -> pd.Series:
    """The name of each range: the writer's name of its phase (`phase_names`: F / B -> e.g.
    `forward_step`), or the scenario's `range_label` template filled in with it (`phase`), the
    short phase (`PHASE`: FWD / BWD), the model chunk (`chunk`) and microbatch (`mb`)."""
    phase = ranges["phase"].map(phase_names)
    if not label:
        return phase
    short = ranges["phase"].map({"F": "FWD", "B": "BWD"})
    return pd.Series([label.format(phase=p, PHASE=s, chunk=c, mb=m) for p, s, c, m in zip(
        phase, short, ranges["chunk"], ranges["microbatch"], strict=True)], index=ranges.index)

MEMORY_COLUMNS = {
    "rank": "int32",
    "time_ns": "int64",  # when the host allocated / released (true clock)
    "bytes": "int64",  # + allocation, − release
    "allocated": "int64",  # the allocator's total allocated bytes after it
    "reserved": "int64",  # ... and its reserved bytes
}


@dataclass
class StepSpan:
    """One ProfilerStep#N on one rank, on the true clock."""

    rank: int
    step: int
    start_ns: int
    end_ns: int


@dataclass
class Timeline:
    """A simulated job: device ops on every rank, groups, clocks and the injected ground truth."""

    scenario: str
    params: dict[str, object]  # every parameter of the run, for the sample README / ground truth
    ops: pd.DataFrame  # TIMELINE_COLUMNS, sorted by (rank, stream, start_ns)
    groups: dict[str, GroupInfo]  # group id -> members; GroupInfo.desc is the parallel dim name
    steps: list[StepSpan]
    clock_offset_ns: dict[int, int]  # rank -> offset the rank's clock runs ahead of true time
    compute_stream: int = 47  # the main compute stream id
    memory: pd.DataFrame | None = None  # MEMORY_COLUMNS: the allocator's totals, None: unprofiled
    ranges: pd.DataFrame | None = None  # RANGE_COLUMNS: the framework's ranges, None: none
    ground_truth: dict[str, object] = field(default_factory=dict)  # see ground_truth.json

    @property
    def ranks(self) -> list[int]:
        """The global ranks of the job that were profiled."""
        return sorted(int(r) for r in self.ops["rank"].unique())
