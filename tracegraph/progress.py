"""Progress bars on stderr for anything that may take more than a second or two."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress


class Progress:
    """A counted progress bar (`with Progress("reading ranks", total=n) as bar: bar.advance()`)."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self._bar = RichProgress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
            disable=not enabled,
        )
        self._task = self._bar.add_task(label, total=total)

    def __enter__(self) -> Progress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._bar.stop()

    def advance(self, steps: int = 1) -> None:
        """Count `steps` more units of work done."""
        self._bar.advance(self._task, steps)
