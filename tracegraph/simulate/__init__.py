"""Training-step simulator: named scenarios -> a `Timeline` with injected ground truth.

Importing the package loads the scenarios only (the command line lists them in its help); the
model and the writers load when a bundle is simulated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracegraph.simulate import scenarios
from tracegraph.simulate.scenarios import SCENARIOS, Scenario

if TYPE_CHECKING:
    from tracegraph.simulate.timeline import Timeline

__all__ = ["SCENARIOS", "Scenario", "Timeline", "simulate"]


def simulate(scenario: str, *, seed: int = 0, **overrides: object) -> Timeline:
    """Simulate a named scenario (fields overridable by name) with a seeded, deterministic model."""
    from tracegraph.simulate import ground_truth
    from tracegraph.simulate.model import Job

    job = Job(scenarios.scenario(scenario, **overrides), seed)
    timeline = job.build()
    timeline.ground_truth = ground_truth.build(job, timeline)
    return timeline


def __getattr__(name: str) -> object:
    """`Timeline`, loaded when asked for."""
    if name == "Timeline":
        from tracegraph.simulate.timeline import Timeline

        return Timeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
