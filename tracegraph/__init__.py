"""tracegraph: find why a distributed training step is slow, from the profiles of every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracegraph.loading.trace import Trace

__version__ = "0.1.0"


def load(path, **options) -> Trace:
    """Read every rank profile under `path` into a `Trace` (`tracegraph.loading.loader.load`)."""
    from tracegraph.loading.loader import load as _load

    return _load(path, **options)


__all__ = ["load", "__version__"]
