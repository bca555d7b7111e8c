"""`tracegraph whatif`: predict what a fix gains by replaying the dependency graph, edited.

Exit codes (as its help says): 0 a prediction was made, also when an edit finds nothing to change
(a fix that does not apply says so and gains 0); 1 no step could be predicted; 2 bad input or an
edit the bundle cannot take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from parsers.base import TraceError
from tracegraph.cli import options
from tracegraph.cli.common import (
    Source,
    fit_output,
    friendly_errors,
    inputs_exist,
    out,
    print_json,
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

EXIT_REFUSED = 1
NO_EDIT = ("no edit given (--fix, --straggler, --scale, --remove-wait): the replay of the "
           "measurement as it is, the model's own check")
Fix = Annotated[list[str] | None, typer.Option(
    "--fix", help="decouple-reduction (the reduction wait after the send, drained before the "
                  "optimizer), couple-reduction (the reverse), separate-queues (repeatable).")]
StragglerOpt = Annotated[list[str] | None, typer.Option(
    "--straggler", help="RANK, absent or auto (slow ranks and absent members), optionally "
                        "=median: brought to their peers' median (repeatable).")]
ScaleOpt = Annotated[list[str] | None, typer.Option(
    "--scale", help="SELECTOR=FACTOR: a category (ep_alltoall), op kind (compute), launch, or "
                    "name pattern ('aclnnMatmul*') takes FACTOR times as long (repeatable).")]
RemoveWaitOpt = Annotated[list[str] | None, typer.Option(
    "--remove-wait", help="SELECTOR: those ops (or the waits on that category) no longer wait "
                          "for another lane or rank (repeatable).")]


def whatif_command(
    bundle: Bundle,
    fix: Fix = None,
    straggler: StragglerOpt = None,
    scale: ScaleOpt = None,
    remove_wait: RemoveWaitOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    html: Annotated[Path | None, typer.Option(
        "--html", help="Write the HTML report with the what-if section: measured and predicted "
                       "waterfalls side by side.")] = None,
    top: Annotated[int, typer.Option(help="Bubbles listed per state (0: all).")] = 10,
    threshold_ms: ThresholdMs = 1.0,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    cache_size: options.CacheSize = None,  # sets the command's cap (its callback)
    jobs: Jobs = None,
    rank_map: RankMap = None,
    dask: Dask = None,
    width: Width = None,
    quiet: Quiet = False,
) -> None:
    """Replay the bundle's dependency graph with the edits and predict each step and rank.

    Exit codes: 0 a prediction was made, also when an edit finds nothing to change in this
    bundle (a fix that does not apply says so on its line, e.g. "no op waits for a data-parallel
    reduction: nothing to change", and the gain is 0); 1 no step could be predicted (the replay
    of the measurement misses it by more than 2 %: each refused step says why); 2 bad input or
    an edit the bundle cannot take (a rank it does not hold, a pattern no op matches).
    """
    fit_output(width, quiet)

    @friendly_errors
    def run() -> None:
        inputs_exist(bundle)
        from reports.whatif import print_prediction
        from tracegraph.whatif.edits import EditError, parse_edits
        from tracegraph.whatif.engine import CycleError
        from tracegraph.whatif.predict import predict
        from tracegraph.whatif.summary import summarize_prediction

        source = Source(threshold_ms, cache_dir, no_cache, jobs, rank_map, dask)
        with source.cluster() as client:  # on a cluster, the graph is gathered to replay it
            try:
                edits = parse_edits(fix or [], straggler or [], scale or [], remove_wait or [])
                if not edits:
                    warn(NO_EDIT)
                analysis = source.analysis(bundle, client)
                prediction = predict(analysis, edits, threshold_ms=threshold_ms)
            except (EditError, CycleError) as error:
                raise TraceError(f"{bundle}: {error}") from None
            summary = summarize_prediction(prediction, top=top)
            if html is not None:
                from reports.html import write_report

                write_report(analysis, html, top=top, prediction=prediction)
        if as_json:
            print_json(summary)
        else:
            print_prediction(out, summary)
            if html is not None:
                out.print(f"wrote {html}", highlight=False)
        if not prediction.predicted:
            raise typer.Exit(EXIT_REFUSED)

    run()
