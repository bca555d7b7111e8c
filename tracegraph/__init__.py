"""tracegraph: find why a distributed training step is slow, from the profiles of every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracegraph.api import Result
    from tracegraph.loading.trace import Trace

__version__ = "0.1.0"


def load(path, **options) -> Trace:
    """Read every rank profile under `path` into a `Trace` (`tracegraph.loading.loader.load`)."""
    from tracegraph.loading.loader import load as _load

    return _load(path, **options)


def analyze(path, **options) -> Result:
    """Load and analyse the bundle at `path`: a `Result` whose bubbles, causes, critical path,
    stragglers, steps and findings are DataFrames in ms (`tracegraph.api.analyze`)."""
    from tracegraph.api import analyze as _analyze

    return _analyze(path, **options)


__all__ = ["analyze", "load", "__version__"]
