"""Hand memory the process freed back to the system: Arrow's allocator and glibc's malloc
keep what they free for reuse, so a big table let go would still count in the process's
resident memory (and its peak) until the end."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


def hand_back() -> None:
    """Return the free memory Arrow's pool and glibc's heap hold to the system (a few ms)."""
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
