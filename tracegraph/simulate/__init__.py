"""Training-step simulator: named scenarios -> a `Timeline` with injected ground truth."""

from __future__ import annotations

from tracegraph.simulate import ground_truth, scenarios
from tracegraph.simulate.model import Job
from tracegraph.simulate.scenarios import SCENARIOS, Scenario
from tracegraph.simulate.timeline import Timeline

__all__ = ["SCENARIOS", "Scenario", "Timeline", "simulate"]


def simulate(scenario: str, *, seed: int = 0, **overrides: object) -> Timeline:
    """Simulate a named scenario (fields overridable by name) with a seeded, deterministic model."""
    job = Job(scenarios.scenario(scenario, **overrides), seed)
    timeline = job.build()
    timeline.ground_truth = ground_truth.build(job, timeline)
    return timeline
