"""The `tracegraph` program. Signals are set before anything else is imported, so that Ctrl-C
(or SIGTERM) wherever it lands ends the command with one line and exit code 128 + the signal
(130 for Ctrl-C), its temporary files removed and its parser processes killed on the way out;
a second one ends it at once. A file size limit (`ulimit -f`) makes writes fail (the cache then
goes unused) rather than killing the process. An address-space limit (`ulimit -v`) below what
the numeric libraries reserve at start is refused in one line: under it they crash or hang
(OpenBLAS, glibc's thread-local data) where no error can be caught.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

STOPPING = (signal.SIGINT, signal.SIGTERM)
ADDRESS_SPACE_FLOOR = 2 << 30  # numpy, pyarrow, scipy and their thread pools reserve ~1.8 GiB


class Stopped(BaseException):
    """A signal that ends the command: not an Exception, so no handler of errors takes it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    for each in STOPPING:  # a second signal while unwinding ends the process at once
        signal.signal(each, _stop_now)
    raise Stopped(signum)


def _stop_now(signum: int, frame: object) -> None:
    os._exit(128 + signum)


def main() -> None:
    """Run the command line; exit 128 + the signal when one stops it."""
    for each in STOPPING:
        signal.signal(each, _stop)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if (short := _address_space_short()) is not None:
        _say(short)
        sys.exit(2)
    try:
        from tracegraph.cli.app import app

        app()
    except Stopped as stop:
        name = signal.Signals(stop.signum).name
        _say(f"interrupted ({name}): stopped" if stop.signum == signal.SIGINT else
             f"stopped by {name}")
        sys.exit(128 + stop.signum)
    except (MemoryError, ImportError) as error:  # out of memory before a command could say it
        from tracegraph.cli.common import resource_error

        _say(resource_error(error) or f"cannot start: {error}")
        sys.exit(2)


def _address_space_short() -> str | None:
    """Why the address-space limit is too small to start under, or None when it is not."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY or limit >= ADDRESS_SPACE_FLOOR:
        return None
    return (f"out of memory: the address space is limited to {limit >> 20} MiB (ulimit -v); "
            f"the numeric libraries reserve about {ADDRESS_SPACE_FLOOR >> 30} GiB of it before "
            "reading a byte: raise it, and bound memory with a cgroup (RSS) limit instead")


def _say(line: str) -> None:
    """`error: line` on stderr, without any library (the one that failed may be rich)."""
    stream = sys.stderr or sys.__stderr__
    if stream is not None:
        try:
            stream.write(f"error: {line}\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed too: the exit code says it
            pass
