"""`tracegraph simulate`: write a simulated bundle whose injected causes are known."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from parsers.base import TraceError
from tracegraph.cli.common import friendly_errors, out


def simulate_command(
    scenario: Annotated[str, typer.Argument(help="hsdp-straggler-sync, hsdp-straggler-async, "
                                            "ep-a2a-overlap, ep-a2a-serialized, "
                                            "pp-compute-straggler, pp-compute-healthy, large")],
    output: Annotated[Path, typer.Option("-o", "--output", help="OUT.tar.gz")],
    fmt: Annotated[str, typer.Option("--format", help="ascend (MindSpore msprof), kineto or nsys "
                                     "(Nsight Systems SQLite exports, one per node)")
                   ] = "ascend",
    layout: Annotated[str, typer.Option(
        help="text (trace_view.json and friends) or db (ascend only: the profiler's .db export)")
    ] = "text",
    seed: Annotated[int, typer.Option(help="Noise seed; same seed, same bytes.")] = 0,
    jitter: Annotated[float | None, typer.Option(
        help="Run-to-run and step-to-step variation of compute speed, as on a real cluster "
             "(log-normal sigma: 0.01 is about 1 %; default none).")] = None,
    ranks: Annotated[int | None, typer.Option(help="Profiled ranks.")] = None,
    pp: Annotated[int | None, typer.Option(help="Pipeline stages.")] = None,
    vpp: Annotated[int | None, typer.Option(help="Virtual stages (chunks) per rank.")] = None,
    microbatches: Annotated[int | None, typer.Option(help="Microbatches per step.")] = None,
    steps: Annotated[int | None, typer.Option(help="Profiled steps.")] = None,
    kernels_per_chunk: Annotated[int | None, typer.Option(
        help="Kernels per F/B chunk (events per rank grow with it).")] = None,
) -> None:
    """Simulate a training step with known causes; the ground truth goes beside the archive."""
    from tracegraph.simulate import simulate
    from tracegraph.simulate.bundle_writer import write_bundle

    overrides = {k: v for k, v in {"ranks": ranks, "pp": pp, "vpp": vpp,
                                   "microbatches": microbatches, "steps": steps,
                                   "kernels_per_chunk": kernels_per_chunk,
                                   "jitter": jitter}.items()
                 if v is not None}

    @friendly_errors
    def run() -> None:
        if fmt not in ("ascend", "kineto", "nsys"):
            raise TraceError(f"--format {fmt}: must be ascend, kineto or nsys")
        if layout not in ("text", "db") or (layout == "db" and fmt != "ascend"):
            raise TraceError(f"--layout {layout}: must be text, or db with --format ascend")
        try:
            timeline = simulate(scenario, seed=seed, **overrides)
        except ValueError as error:
            raise TraceError(f"simulate {scenario}: {error}") from None
        archive = write_bundle(timeline, output, fmt, layout)
        truth = archive.with_name(archive.name.removesuffix(".tar.gz") + ".ground_truth.json")
        out.print(f"wrote {archive} ({archive.stat().st_size / 2**20:.1f} MiB, "
                  f"{len(timeline.ranks)} ranks, {len(timeline.ops):,} device ops) and {truth}",
                  highlight=False)

    run()
