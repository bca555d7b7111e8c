"""`tracegraph analyze`: what held each step back, the answer first; what the bundle holds."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from parsers.base import TraceError
from tracegraph.cli import options
from tracegraph.cli.common import (
    analysis_of,
    cluster,
    fit_output,
    friendly_errors,
    inputs_exist,
    inventory_of,
    load_bundle,
    out,
    print_json,
    remember,
    warn,
)
from tracegraph.cli.options import (
    Bundle,
    CacheDir,
    Dask,
    Jobs,
    NoCache,
    Quiet,
    RankMap,
    ThresholdMs,
    Width,
)

if TYPE_CHECKING:
    from tracegraph.analysis.analyze import Analysis
    from tracegraph.loading.trace import Trace

TOP_BUBBLES = 5


@friendly_errors
def analyze_command(
    bundle: Bundle,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    step: Annotated[int | None, typer.Option(help="Only this ProfilerStep number.")] = None,
    top: Annotated[int, typer.Option(
        help="Bubbles shown with their chains, longest first (0: all).")] = TOP_BUBBLES,
    threshold_ms: ThresholdMs = 1.0,
    inventory: Annotated[bool, typer.Option(
        "--inventory", help="Also list what the bundle holds: every rank and group.")] = False,
    detail: Annotated[bool, typer.Option(
        "--detail", help="Also print each step's tables: step time per rank, bubble time by "
                         "cause, the critical path's runs, clock offsets, stragglers.")] = False,
    inventory_only: Annotated[bool, typer.Option(
        "--inventory-only", help="Only list what the bundle holds; no analysis.")] = False,
    width: Width = None,
    quiet: Quiet = False,
) -> None:
    """Read every rank's profile, then say what held each step back: the verdict first (step
    time, the causes largest first with their origin, the fix and its replayed gain), then the
    longest bubbles with their causal chains, the findings, the pipeline and the gain ceilings.

    The output does not grow with the ranks: --inventory and --detail add the long tables.
    """
    fit_output(width, quiet)
    inputs_exist(bundle)
    with cluster(dask, jobs) as client:  # on a cluster, the analysis is read where it lies
        trace = load_bundle(bundle, cache_dir, no_cache, jobs, rank_map, client)
        held = partial(inventory_of, trace, cache_dir, no_cache)
        analysed = partial(analysis_of, trace, cache_dir, no_cache, threshold_ms)
        options = {"threshold_ms": threshold_ms, "step": step, "top": top,
                   "inventory_only": inventory_only,
                   "on_cluster": client is not None}  # whose summary refuses the ceilings
        if as_json:  # the JSON itself is kept: a second run reads and prints it
            print_json(remember(trace, cache_dir, no_cache, "summary", options, lambda: _summary(
                bundle, trace, held(), None if inventory_only else analysed(), step, top)))
            return
        analysis = None if inventory_only else analysed()
        summary = remember(trace, cache_dir, no_cache, "summary", options,
                           lambda: _summary(bundle, trace, held(), analysis, step, top))
        if analysis is not None:
            _print_answer(summary, analysis, detail=detail, inventory=inventory)
        else:
            _print_inventory(summary)


def _print_answer(summary: dict, analysis: Analysis, *, detail: bool, inventory: bool) -> None:
    """The verdict, what was read in one line, the top bubbles, findings, pipeline and gain
    ceilings; with `detail` the per-step tables, with `inventory` the inventory."""
    from reports.findings import print_findings
    from reports.pipeline import pipeline_lines
    from reports.terminal import print_analysis, print_bubbles, print_verdict, read_line
    from reports.whatif import print_ceilings

    for warning in analysis.warnings:
        warn(warning)
    print_verdict(out, summary["verdict"])
    out.print(read_line(summary, detail=detail, inventory=inventory), highlight=False)
    print_bubbles(out, summary)
    print_findings(out, summary["findings"])
    for line in pipeline_lines(summary.get("pipeline")):
        out.print(line, highlight=False, markup=False)
    print_ceilings(out, summary["gain_ceilings"])
    if detail:
        out.print("\nper step:", highlight=False)
        print_analysis(out, summary, analysis)
    if inventory:
        out.print()
        _print_inventory(summary)


def _summary(bundle: Path, trace: Trace, summary: dict[str, object],
             analysis: Analysis | None, step: int | None, top: int) -> dict[str, object]:
    """What `analyze` prints: the inventory (`summary`) and, with an analysis, its summary
    (findings, the pipeline schedule, gain ceilings, each shown bubble's causes) and verdict."""
    from tracegraph.analysis.findings import find_all
    from tracegraph.analysis.pipeline import recover
    from tracegraph.analysis.summary import summarize
    from tracegraph.verdict import verdict

    if analysis is not None:
        _check_step(bundle, analysis, step)
        pipeline = recover(analysis)
        summary |= summarize(analysis, step=step, top=top, findings=find_all(analysis, pipeline),
                             pipeline=pipeline)
        summary["verdict"] = verdict(analysis, findings=summary["findings"],
                                     pipeline=summary.get("pipeline"), step=step)
        with_device_steps(summary["ranks"], analysis)
        summary["warnings"] = trace.warnings + analysis.warnings
    return summary


def with_device_steps(ranks: list[dict[str, object]], analysis: Analysis) -> None:
    """Each rank's `steps` as the analysis times them (the device work each host step
    launched: what the step tables show; a rank without a timeline, its step table's, listed in
    `steps_from_step_table`), its host markers' kept as `host_steps`."""
    import pandas as pd

    table, stated = analysis.step_table(), analysis.stated_steps()
    for rank in ranks:
        mine = table[table["rank"] == rank["rank"]]
        told = stated[stated["rank"] == rank["rank"]]
        rank["host_steps"] = rank["steps"]
        rank["steps"] = {str(int(s)): round(float(ms), 3) for s, ms in zip(
            pd.concat([mine["step"], told["step"]]), pd.concat([mine["ms"], told["ms"]]),
            strict=True) if s >= 0}
        if len(told):
            rank["steps_from_step_table"] = [str(int(s)) for s in told["step"]]


def _check_step(bundle: Path, analysis: Analysis, step: int | None) -> None:
    """`--step N` names a step the bundle holds."""
    steps = sorted({int(s) for s in analysis.steps["step"]})
    if step is not None and step not in steps:
        held = ", ".join(map(str, steps)) or "none (no ProfilerStep markers)"
        raise TraceError(f"{bundle}: no step {step}; its steps: {held}")


def _comm_text(comm: dict[str, object], labels: dict[str, str]) -> str:
    """One entry of a rank's comm ops: its host calls (and how many launched no kernel the
    trace kept), or device ops, by comm and group; kernels no call in the trace launched."""
    if comm.get("host_call") is False:
        return f"{comm['kernel']} kernel×{comm['count']} ({comm['comm'] or 'type unknown'}, " \
               "no launch in the trace)"
    lost = f" ({comm['no_kernel']} no kernel kept)" if comm.get("no_kernel") else ""
    return (f"{comm['comm'] or 'collective'}×{comm['count']} "
            f"@{labels.get(comm['group'], comm['group']) or '?'}{lost}")


def _print_inventory(summary: dict[str, object]) -> None:
    import pandas as pd
    from rich.table import Table

    from tracegraph.loading.groups import group_labels

    labels = group_labels(pd.DataFrame(summary["groups"]))

    ranks = Table(title=f"{len(summary['ranks'])} ranks in {summary['source']}")
    steps = "host steps (ms)" if "host_steps" not in (summary["ranks"] or [{}])[0] else \
        "steps (ms)"
    for column in ("rank", "framework", "events", "lanes", "comm ops", steps):
        ranks.add_column(column, overflow="fold")
    for r in summary["ranks"]:
        lanes = ", ".join(f"{n} {k}" for k, n in r["lanes"].items())
        comm = "\n".join(_comm_text(c, labels) for c in r["comm_ops"])
        told = r.get("steps_from_step_table", [])
        steps = ", ".join(f"#{k}: {v:.1f}" + (" (step table)" if k in told else "")
                          for k, v in r["steps"].items())
        ranks.add_row(str(r["rank"]), r["framework"], f"{r['events']:,}", lanes, comm or "-",
                      steps or "-")
    out.print(ranks)
    groups = Table(title=f"{len(summary['groups'])} groups")
    for column in ("group", "name", "dim", "size", "ranks", "source"):
        groups.add_column(column, overflow="fold")
    for g in summary["groups"]:
        members = ", ".join(map(str, g["ranks"][:16])) + (" …" if len(g["ranks"]) > 16 else "")
        label = labels.get(g["group"], g["group"])  # as the comm ops and chains name it
        groups.add_row(g["group"], label if label != g["group"] else "-", g["dim"] or "-",
                       str(g["size"]), members, g["source"])
    out.print(groups)
