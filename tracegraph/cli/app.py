"""The `tracegraph` command line: one module per command, assembled here.

Heavy modules (pandas, pyarrow, the analysis) are imported inside the commands that use them,
so `tracegraph --help` and commands that need none of them start fast.
"""

from __future__ import annotations

import inspect

import typer

from tracegraph.cli.analyze import analyze_command
from tracegraph.cli.cache import cache_app
from tracegraph.cli.common import tolerant_streams
from tracegraph.cli.export import export_command, graph_command
from tracegraph.cli.gate import check_command, diff_command
from tracegraph.cli.report import report_command
from tracegraph.cli.simulate import simulate_command
from tracegraph.cli.whatif import whatif_command


def reflowed(doc: str | None) -> str:
    """A docstring as help text: each paragraph's lines joined into one, so the terminal wraps
    it instead of breaking it where the source did."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def flags_without_a_type() -> None:
    """Typer's help gives a flag the type of a value it does not take (`--json <bool>`): a
    flag shows none."""
    option = typer.core.TyperOption
    shown = option.display_type_rich
    option.display_type_rich = lambda self, ctx: None if self.is_flag else shown(self, ctx)


flags_without_a_type()
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find why a distributed training step is slow. Parsed ranks and analyses "
                       "are cached in $TRACEGRAPH_CACHE_DIR, else the user's cache folder "
                       "(~/.cache/tracegraph on Linux): `tracegraph cache info`.",
                  callback=tolerant_streams)
for name, command in (("analyze", analyze_command), ("report", report_command),
                      ("diff", diff_command), ("check", check_command),
                      ("simulate", simulate_command), ("export", export_command),
                      ("graph", graph_command), ("whatif", whatif_command)):
    app.command(name=name, help=reflowed(command.__doc__))(command)
app.add_typer(cache_app, name="cache")


def main() -> None:
    """Entry point for `python -m tracegraph`."""
    app()
