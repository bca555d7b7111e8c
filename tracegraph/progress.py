"""Progress on stderr for anything that may take more than a second or two: a bar on a terminal;
elsewhere (a CI log, a pipe, a notebook) a plain line at a steady pace, the first after PACE_S,
so a short task prints nothing; nothing at all once `quiet()` was called (`-q`)."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

PACE_S = 5.0  # seconds between two plain progress lines
_QUIET = threading.Event()


def quiet(on: bool = True) -> None:
    """No progress at all from now on (`on`), or progress again."""
    if on:
        _QUIET.set()
    else:
        _QUIET.clear()


class Progress:
    """Counted progress (`with Progress("reading ranks", total=n) as bar: bar.advance()`); a
    disabled one does nothing and does not even import rich (start-up stays short)."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self._shown: _Bar | _Lines | None = None
        if enabled and not _QUIET.is_set():
            self._shown = _Bar(label, total) if sys.stderr.isatty() else _Lines(label, total)

    def __enter__(self) -> Progress:
        if self._shown:
            self._shown.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._shown:
            self._shown.stop()

    def advance(self, steps: int = 1) -> None:
        """Count `steps` more units of work done."""
        if self._shown:
            self._shown.advance(steps)


class _Bar:
    """rich's bar, gone when the work is done."""

    def __init__(self, label: str, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(label, total=total)
        self.start, self.stop = self._bar.start, self._bar.stop

    def advance(self, steps: int) -> None:
        self._bar.advance(self._task, steps)


class _Lines:
    """"reading ranks: 3/8 after 5 s" every PACE_S while the work runs, and a last line when it
    ends if one was printed."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._began = 0.0
        self._said = False

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._said:
            self._say("done in")

    def advance(self, steps: int) -> None:
        self.done += steps

    def _run(self) -> None:
        while not self._stop.wait(PACE_S):
            self._say("after")
            self._said = True

    def _say(self, when: str) -> None:
        elapsed = time.monotonic() - self._began
        sys.stderr.write(f"{self.label}: {self.done}/{self.total} {when} {elapsed:.0f} s\n")
        sys.stderr.flush()
