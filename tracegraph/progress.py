"""Progress bars on stderr for anything that may take more than a second or two."""

from __future__ import annotations

from types import TracebackType


class Progress:
    """A counted progress bar (`with Progress("reading ranks", total=n) as bar: bar.advance()`);
    a disabled one does nothing and does not even import rich (start-up stays short)."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self._bar = _rich_bar() if enabled else None
        self._task = self._bar.add_task(label, total=total) if self._bar else None

    def __enter__(self) -> Progress:
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar:
            self._bar.stop()

    def advance(self, steps: int = 1) -> None:
        """Count `steps` more units of work done."""
        if self._bar:
            self._bar.advance(self._task, steps)


def _rich_bar():  # noqa: ANN202 - rich's type is imported lazily
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    return RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
