"""Communication type and instance numbers from the names profilers give comm ops.

Shared by every parser: HCCL op names (`hcom_batchSendRecv__982_37_1`), NCCL/RCCL kernel names
(`ncclDevKernel_AllGather_RING_LL`), `Collective name` args (`_allgather_base`), c10d dispatcher ops
(`c10d::alltoall_base_`) and gloo / nccl annotations (`gloo:all_reduce`, `nccl:send 0->1`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tracegraph.schema import COLLECTIVE, P2P, P2P_COMMS

_PREFIXES = ("hcom_", "hccl_", "c10d::", "nccl:", "gloo:", "rccl:", "ncclkernel_",
             "nccldevkernel_", "_")
# Longest first, so "reducescatter" wins over "reduce" and "batchsendrecv" over "send".
_TYPES = (
    ("batchsendrecv", "batch_send_recv"),
    ("reducescatter", "reducescatter"),
    ("allreduce", "allreduce"),
    ("allgather", "allgather"),
    ("alltoall", "alltoall"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("sendrecv", "batch_send_recv"),
    ("receive", "recv"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
)

_HCCL_NAME = re.compile(
    r"^(?P<op>hc(?:om|cl)_[A-Za-z0-9]+?)_?__?(?P<tail>\d{1,3})_(?P<index>\d+)"
    r"(?:_(?P<iter>\d+))?(?:@(?P<group>[^@\s]+))?$"
)


@lru_cache(maxsize=4096)
def comm_type(name: str) -> str:
    """The comm type (one of schema.COMM_TYPES) a comm op name denotes, or "" if none."""
    text = name.strip().lower()
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text = text[len(prefix):]
                stripped = True
    text = text.replace("_", "").replace(" ", "")
    for key, kind in _TYPES:
        if text.startswith(key):
            return kind
    return ""


def comm_kind(comm: str) -> str:
    """The event kind (collective or p2p) of a comm type."""
    return P2P if comm in P2P_COMMS else COLLECTIVE


@dataclass(frozen=True)
class HcclName:
    """The parts of an msprof HCCL op name such as `hcom_allReduce__271_0_1@1102...`."""

    op: str  # "hcom_allReduce"
    comm: str  # "allreduce"
    group_tail: str  # last 3 digits of the group hash ("271")
    index: int  # 0-based instance index within the group
    iteration: int  # replay count (1 in op-by-op mode); -1 for two-part legacy names
    group: str  # full group hash when the name carries "@group", else ""

    @property
    def instance(self) -> str:
        """The name without the group suffix: identical on every member rank."""
        it = f"_{self.iteration}" if self.iteration >= 0 else ""
        return f"{self.op}__{self.group_tail}_{self.index}{it}"


@lru_cache(maxsize=65536)
def parse_hccl_name(name: str) -> HcclName | None:
    """Split an msprof HCCL op name; None when the name is not one."""
    match = _HCCL_NAME.match(name.strip())
    if not match:
        return None
    op = match["op"].rstrip("_")
    return HcclName(
        op=op,
        comm=comm_type(op),
        group_tail=match["tail"],
        index=int(match["index"]),
        iteration=int(match["iter"]) if match["iter"] else -1,
        group=match["group"] or "",
    )


def double_hash(text: str) -> str:
    """msprof's group id for an HCCL comm name: two 32-bit polynomial hashes (29, 131), decimal.

    msprof-analyze `cluster_analyse/common_func/utils.py`; `double_hash("group_name_19")` is
    "3985310405473756128".
    """
    h29 = h131 = 0
    for char in text:
        h29 = (h29 * 29 + ord(char)) & 0xFFFFFFFF
        h131 = (h131 * 131 + ord(char)) & 0xFFFFFFFF
    return str((h29 << 32) | h131)
