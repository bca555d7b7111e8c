"""The root causes a bubble of idle time is charged to: one declaration per category.

Blame, the simulator's ground truth, the checks, diffs and every report read their names, colours
and meanings from here, so a category added to REGISTRY is known everywhere at once. The names
are public: they are the `category` values of `analyze --json`, `diff --json` and
ground_truth.json.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tracegraph.schema import P2P_COMMS


@dataclass(frozen=True)
class Cause:
    """One root-cause category."""

    name: str  # the public category string
    dim: str  # the parallel dimension whose communication it is (dp, pp, ep, tp, cp), or ""
    color: str  # its colour in every report
    meaning: str  # one line for the performance engineer reading a report


DP_REDUCTION = "dp_reduction"
PP_P2P = "pp_p2p"
EP_ALLTOALL = "ep_alltoall"
TP_COLLECTIVE = "tp_collective"
CP_COLLECTIVE = "cp_collective"
COLLECTIVE = "collective"
COMPUTE_STRAGGLER = "compute_straggler"
HOST_LAUNCH = "host_launch"
PIPELINE_FILL = "pipeline_fill"
PEER_COMPUTE = "peer_compute"
OWN_COMPUTE = "own_compute"
UNKNOWN = "unknown"

REGISTRY: tuple[Cause, ...] = (
    Cause(DP_REDUCTION, "dp", "#d62728", "waiting on a data-parallel gradient reduction (DP / "
          "HSDP / FSDP AllReduce or ReduceScatter): a late DP peer or a slow reduction"),
    Cause(PP_P2P, "pp", "#ff7f0e", "waiting on a pipeline send / recv: the peer stage posted "
          "late or the transfer was slow"),
    Cause(EP_ALLTOALL, "ep", "#e377c2", "waiting on an expert-parallel all-to-all (MoE dispatch "
          "/ combine): token imbalance or a late peer"),
    Cause(TP_COLLECTIVE, "tp", "#9467bd", "waiting on a tensor-parallel collective inside a "
          "layer (AllReduce / AllGather / ReduceScatter of activations)"),
    Cause(CP_COLLECTIVE, "cp", "#637939", "waiting on a context-parallel collective (sequence "
          "shards exchanging keys / values)"),
    Cause(COLLECTIVE, "", "#ad494a", "waiting on a collective whose group's parallel dimension "
          "is unknown: not necessarily a DP reduction"),
    Cause(COMPUTE_STRAGGLER, "", "#8c564b", "a rank computes slower than its peers and they "
          "wait for it"),
    Cause(HOST_LAUNCH, "", "#bcbd22", "the device idles because the host enqueued work late "
          "(CPU-bound launch, Python overhead, data loading)"),
    Cause(PIPELINE_FILL, "", "#f0b84a", "inherent pipeline warm-up / cool-down of the schedule "
          "(expected, shrinks with more microbatches)"),
    Cause(PEER_COMPUTE, "", "#c7c7a0", "waiting for a peer's compute that no straggler test "
          "singled out (normal variation, or no peer to judge it by), in a job without a "
          "pipeline or through a collective the pipeline does not order"),
    Cause(OWN_COMPUTE, "", "#98df8a", "the rank's own compute, in a job without a pipeline: on "
          "its critical path, its work; in a bubble, work on another of its streams or threads "
          "that the lane waited for (no peer involved)"),
    Cause(UNKNOWN, "", "#7f7f7f", "time the causal walk could not explain (no matching record, "
          "or the chain was too deep)"),
)
"""Every category, in the order reports list them."""

BY_NAME: dict[str, Cause] = {cause.name: cause for cause in REGISTRY}
CATEGORIES: tuple[str, ...] = tuple(BY_NAME)
COLORS: dict[str, str] = {cause.name: cause.color for cause in REGISTRY}
DIMS: tuple[str, ...] = tuple(cause.dim for cause in REGISTRY if cause.dim)
"""The parallel dimensions that have a category of their own: dp, pp, ep, tp, cp."""

_BY_DIM = {cause.dim: cause.name for cause in REGISTRY if cause.dim}
_BY_COMM = {"alltoall": EP_ALLTOALL, **dict.fromkeys(sorted(P2P_COMMS), PP_P2P)}


def get(name: str) -> Cause:
    """The category of that name; UNKNOWN's entry for a name not in REGISTRY."""
    return BY_NAME.get(name, BY_NAME[UNKNOWN])


def color(name: str) -> str:
    """A category's report colour (UNKNOWN's for a name not in REGISTRY)."""
    return get(name).color


def order(names: Iterable[str]) -> list[str]:
    """Category names in REGISTRY order, names not in it last (alphabetically)."""
    return sorted(names, key=lambda n: (CATEGORIES.index(n) if n in BY_NAME else len(BY_NAME), n))


def for_dim(dim: str) -> str:
    """The category of communication in a group of this parallel dimension ("" if none)."""
    return _BY_DIM.get(dim, "")


def for_collective(dim: str, comm: str) -> str:
    """The category a communication op is charged to: its group's inferred parallel dimension's,
    else its comm type's (all-to-all: EP, send / recv: PP), else COLLECTIVE, never a guess."""
    return _BY_DIM.get(dim) or _BY_COMM.get(comm, COLLECTIVE)


ROOT_TIE_SHARE = 0.01
"""causes whose times differ by less than this share of their bubble tie for the root"""
LISTED_SHARE = 0.05
"""every cause holding at least this share of its bubble is listed with it"""


def root_of(causes: Sequence[tuple[int, int]], bubble_ns: int) -> int:
    """Which of a bubble's causes, each (ns, start) — its time in the bubble and when its first
    piece began —, is the root: the one holding the most time; those within ROOT_TIE_SHARE of
    the bubble of it go to the origin of the chain, the one furthest upstream (earliest). -1
    when there is none. The one rule behind analyze's roots and every ground truth's."""
    if not causes:
        return -1
    most = max(ns for ns, _ in causes)
    tied = [k for k, (ns, _) in enumerate(causes) if most - ns <= ROOT_TIE_SHARE * bubble_ns]
    return min(tied, key=lambda k: (causes[k][1], -causes[k][0]))
