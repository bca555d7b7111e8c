"""Hand memory the process freed back to the system: Arrow's allocator and glibc's malloc
keep what they free for reuse, so a big table let go would still count in the process's
resident memory (and its peak) until the end."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

HAND_BACK_BYTES = 64 << 20  # freed since the last hand-back that makes another worth its cost
_owed = [0]


def hand_back(freed: int | None = None) -> None:
    """Return the free memory Arrow's pool and glibc's heap hold to the system. With `freed`
    (bytes just let go), only once HAND_BACK_BYTES have been let go since the last time: a
    hand-back walks the heap (~60 ms on a fragmented GB heap)."""
    if freed is not None:
        _owed[0] += freed
        if _owed[0] < HAND_BACK_BYTES:
            return
    _owed[0] = 0
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    """glibc's malloc_trim, or None on a C library without it."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def use_system_allocator() -> None:
    """Arrow allocates from the C library's malloc, unless ARROW_DEFAULT_MEMORY_POOL chooses:
    its default (mimalloc) keeps ~25 MB a parsed rank freed out of the system's reach, for no
    speed the analysis gains (same CPU on 8 Kineto ranks); glibc's heap `hand_back` returns."""
    import pyarrow as pa

    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())
