"""The `tracegraph` command line: one module per command, assembled here.

Heavy modules (pandas, pyarrow, the analysis) are imported inside the commands that use them,
so `tracegraph --help` and commands that need none of them start fast.
"""

from __future__ import annotations

import typer

from tracegraph.cli.analyze import analyze_command
from tracegraph.cli.common import tolerant_streams
from tracegraph.cli.export import export_command, graph_command
from tracegraph.cli.gate import check_command, diff_command
from tracegraph.cli.report import report_command
from tracegraph.cli.simulate import simulate_command
from tracegraph.cli.whatif import whatif_command

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find why a distributed training step is slow.",
                  callback=tolerant_streams)
for name, command in (("analyze", analyze_command), ("report", report_command),
                      ("diff", diff_command), ("check", check_command),
                      ("simulate", simulate_command), ("export", export_command),
                      ("graph", graph_command), ("whatif", whatif_command)):
    app.command(name=name)(command)


def main() -> None:
    """Entry point for `python -m tracegraph`."""
    app()
