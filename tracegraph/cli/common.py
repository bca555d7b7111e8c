"""What every command shares: consoles, exit codes, one-line errors, loading a bundle."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from parsers.base import TraceError, require_exists
from parsers.text import printable

if TYPE_CHECKING:
    from tracegraph.analysis.analyze import Analysis
    from tracegraph.loading.cachedir import CacheDir
    from tracegraph.loading.trace import Trace


def _broken_pipe() -> None:
    """rich's reaction to a closed pipe (it would exit 1 without a word): an error."""
    raise BrokenPipeError(errno.EPIPE, "Broken pipe")


_RICH_BROKEN_PIPE = Console.on_broken_pipe


def _stderr_gone(console: Console) -> None:
    """Any console's reaction to a closed pipe: on stderr (where rich would exit 1, a usage
    error's code lost) nothing more is said there, the command goes on (`2>&1 | head`: its
    stdout fails next) and its exit code says the rest; on stdout rich's own (`out` and
    `console()` make it an error)."""
    if not console.stderr:
        return _RICH_BROKEN_PIPE(console)
    console.quiet = True
    _silence(sys.stderr)
    return None


Console.on_broken_pipe = _stderr_gone  # type: ignore[method-assign]
out = Console(markup=False)  # text from profiles ("[/x]" in an op name or a path) stays text:
err = Console(stderr=True, markup=False)  # style with Text or style=, never with markup
out.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
UNWRAPPED = 100_000  # the width of output that is not on a terminal: every line whole

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2

F = TypeVar("F", bound=Callable[..., object])
T = TypeVar("T")


def friendly_errors(command: F) -> F:
    """Bad input, and a resource that ran out (memory, threads, a closed output), end in one
    line on stderr and exit code 2, never a traceback."""

    @wraps(command)
    def run(*args: object, **kwargs: object) -> object:
        try:
            return command(*args, **kwargs)
        except (TraceError, OSError) as error:
            fail(resource_error(error) or str(error))
        except Exception as error:  # what is not a resource running out stays a bug
            why = resource_error(error)
            if why is None:
                raise
            fail(why)
        except MemoryError as error:
            fail(resource_error(error) or "out of memory")

    return run  # type: ignore[return-value]


def fail(message: str) -> NoReturn:
    """End the command: `error: message` on stderr, exit code 2."""
    err.print(_labelled("error:", "red", message), highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def resource_error(error: BaseException) -> str | None:
    """What to say of an error that is a resource running out, else None."""
    text = str(error)
    if isinstance(error, BrokenPipeError):
        _silence(sys.stdout)
        return "standard output closed before everything was written (broken pipe)"
    if isinstance(error, MemoryError) or (isinstance(error, ImportError) and (
            "failed to map segment" in text or "cannot allocate memory" in text.lower())):
        return ("out of memory: the process reached its memory or address-space limit "
                f"(ulimit -v, a container's){f' ({text[:200]})' if text else ''}")
    if isinstance(error, UnicodeEncodeError):
        return (f"{printable(str(error.object))}: cannot be written as a file name or text in "
                f"{error.encoding} ({error.reason})")
    if type(error).__name__ == "BrokenProcessPool":
        return "a parser process died (killed, or out of memory); nothing was analysed"
    if any(t in text.lower() for t in ("can't start new thread", "failed to launch worker")):
        return (f"cannot start a thread ({text[:200]}): the process reached its limit on "
                "threads, processes or address space")
    return None


def fit_output(width: int | None = None, quiet: bool = False) -> None:
    """Output fit for where it is read: on a terminal wrapped at its width, elsewhere (a pipe,
    a CI log, `less`) never, so that a line stays one line; `width` sets one. Progress on stderr
    unless `quiet`."""
    from tracegraph import progress

    out.width = width or (None if out.is_terminal else UNWRAPPED)
    out.soft_wrap = not width  # a terminal wraps long lines itself, unbroken for copying
    progress.quiet(quiet)


def console() -> Console:
    """A console for rich markup on stdout, as wide as `out`, a closed pipe an error as there."""
    markup = Console(width=out.width)
    markup.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    return markup


def inputs_exist(*paths: Path) -> None:
    """Fail on a missing input at once: commands call this before importing pandas and the
    analysis, so a mistyped path costs no more than the interpreter's start."""
    for path in paths:
        require_exists(path)


def cluster(dask: str | None, jobs: int | None) -> AbstractContextManager[Any]:
    """The Dask client of the `--dask` cluster (held while the command runs: its ranks and
    analysis live there), else None."""
    if not dask:
        return nullcontext(None)
    from tracegraph.loading.distributed import dask_cluster

    return dask_cluster(dask, jobs)


def cache_folder(cache_dir: Path | None, no_cache: bool) -> CacheDir | None:
    """The command's cache folder (None with --no-cache): one object per folder for the whole
    command, so that a fault is said once and the size cap counts every entry it writes."""
    if no_cache:
        return None
    from tracegraph.loading.cachedir import CacheDir, default_cache_dir

    root = cache_dir or default_cache_dir()
    if root not in _COMMAND.caches:
        _COMMAND.caches[root] = CacheDir(root, cache_limit(), warn)
    return _COMMAND.caches[root]


def cache_limit() -> int:
    """The command's cap on the cache folder: --cache-size, else $TRACEGRAPH_CACHE_SIZE, else
    the default."""
    from tracegraph.loading.cachedir import SIZE_ENV, default_limit

    try:
        return _COMMAND.limit or default_limit()
    except ValueError as error:
        raise TraceError(f"${SIZE_ENV}: {error}") from None


class _Command:
    """What the running command's steps share: its cache folders, the cap --cache-size set."""

    def __init__(self) -> None:
        self.caches: dict[Path, CacheDir] = {}
        self.limit: int | None = None

    def begin(self) -> None:
        """A new command (several run in one process under tests): nothing shared yet."""
        self.caches.clear()
        self.limit = None


_COMMAND = _Command()


def set_cache_limit(value: str | None) -> str | None:
    """--cache-size's callback: the cap for this command (None: $TRACEGRAPH_CACHE_SIZE or the
    default)."""
    from tracegraph.loading.cachedir import parse_size

    try:
        _COMMAND.limit = parse_size(value) if value is not None else None
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def load_bundle(bundle: Path, cache_dir: Path | None, no_cache: bool, jobs: int | None,
                rank_map: Path | None, client: Any = None) -> Trace:
    """Load for a command: on the cluster of `client` (where the ranks stay), else locally;
    the trace's warnings go to stderr."""
    mapping = read_rank_map(rank_map) if rank_map else None
    options = {"cache_dir": cache_dir, "use_cache": not no_cache, "rank_map": mapping,
               "progress": True}  # a bar on a terminal, else lines; none after -q
    if client is not None:
        from tracegraph.loading.distributed import load_on_cluster

        trace = load_on_cluster(bundle, client, **options)
    else:
        from tracegraph.loading.loader import load

        trace = load(bundle, jobs=jobs, cache_folder=cache_folder(cache_dir, no_cache),
                     **options)
    for warning in trace.warnings:
        warn(warning)
    return trace


def analysis_of(trace: Trace, cache_dir: Path | None, no_cache: bool, threshold_ms: float
                ) -> Analysis:
    """The analysis of `trace`: read from the cache when an earlier run stored it (unless
    --no-cache), else computed and stored; a trace on a cluster is analysed there (and not
    cached: its analysis stays on the workers)."""
    if getattr(trace, "client", None) is not None:
        from tracegraph.analysis.distributed import analyze_on_cluster

        return analyze_on_cluster(trace, threshold_ms=threshold_ms)
    from tracegraph.analysis.analyze import analyze

    return remember(trace, cache_dir, no_cache, "analysis", {"threshold_ms": threshold_ms},
                    lambda: analyze(trace, threshold_ms=threshold_ms))


def inventory_of(trace: Trace, cache_dir: Path | None, no_cache: bool) -> dict[str, object]:
    """What the bundle holds (`tracegraph.loading.inventory`), kept in the cache; summed up on
    the workers for a trace on a cluster."""
    if getattr(trace, "client", None) is not None:
        from tracegraph.loading.distributed import inventory_on_cluster as inventory
    else:
        from tracegraph.loading.inventory import inventory
    return remember(trace, cache_dir, no_cache, "inventory", {}, lambda: inventory(trace))


def pipeline_and_findings(analysis: Analysis, cache_dir: Path | None, no_cache: bool,
                          threshold_ms: float) -> tuple[Any, list]:
    """The pipeline recovered from `analysis` and its findings, kept in the cache."""
    from tracegraph.analysis.findings import find_all
    from tracegraph.analysis.pipeline import recover

    options = {"threshold_ms": threshold_ms}
    pipeline = remember(analysis.trace, cache_dir, no_cache, "pipeline", options,
                        lambda: recover(analysis))
    findings = remember(analysis.trace, cache_dir, no_cache, "findings", options,
                        lambda: find_all(analysis, pipeline))
    return pipeline, findings


def remember(trace: Trace, cache_dir: Path | None, no_cache: bool, what: str,
             options: dict[str, object], compute: Callable[[], T]) -> T:
    """`compute()` of `trace`, kept in the cache for the next run (tracegraph.analysis.cache)."""
    from tracegraph.analysis.cache import remembered

    return remembered(trace, cache_folder(cache_dir, no_cache), what, options, compute, warn)


class Source(NamedTuple):
    """How a command reads and analyses its bundles (the options they share)."""

    threshold_ms: float
    cache_dir: Path | None
    no_cache: bool
    jobs: int | None
    rank_map: Path | None
    dask: str | None = None

    def cluster(self) -> AbstractContextManager[Any]:
        """The `--dask` cluster's client for the command's duration, else None."""
        return cluster(self.dask, self.jobs)

    def verdict(self, analysis: Analysis) -> dict[str, object]:
        """The verdict of `analysis` (tracegraph.verdict), its findings kept in the cache."""
        from tracegraph.verdict import verdict

        pipeline, findings = pipeline_and_findings(analysis, self.cache_dir, self.no_cache,
                                                   self.threshold_ms)
        return verdict(analysis, findings=[f.as_dict() for f in findings],
                       pipeline=pipeline.as_dict() if pipeline is not None else None)

    def analysis(self, path: Path, client: Any = None) -> Analysis:
        """The bundle at `path` loaded (on `client`'s cluster, if any) and analysed."""
        trace = load_bundle(path, self.cache_dir, self.no_cache, self.jobs, self.rank_map,
                            client)
        return analysis_of(trace, self.cache_dir, self.no_cache, self.threshold_ms)


def read_rank_map(path: Path) -> dict[str, int]:
    """--rank-map's {profile: rank}; TraceError unless every value is a rank id."""
    from parsers.values import rank_id

    try:
        mapping = json.loads(path.read_text())
        ranks = {str(k): rank_id(v) for k, v in mapping.items()}
    except (ValueError, TypeError, AttributeError, RecursionError) as error:
        raise TraceError(f"{path}: not a JSON object of profile -> rank ({error})") from None
    if None in ranks.values():
        bad = next(k for k, v in ranks.items() if v is None)
        raise TraceError(f"{path}: {bad!r:.100} maps to {mapping[bad]!r:.40}, not a rank id")
    return ranks



def print_json(value: object) -> None:
    """`value` as indented JSON on stdout (orjson: an analysis' JSON in a tenth of the time)."""
    import orjson

    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
    sys.stdout.write(orjson.dumps(value, option=options).decode() + "\n")
    sys.stdout.flush()


class _ClosedOutput(io.TextIOBase):
    """Standard output when the command was started without one (`>&-`): writing fails."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise TraceError("standard output is closed (started with >&-): nothing can be "
                         "printed; redirect it to a file or /dev/null")


def _silence(stream: Any) -> None:
    """Point `stream`'s descriptor (stdout, stderr) at /dev/null: what is still buffered for a
    closed pipe is dropped at exit instead of raising again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def warn(message: str) -> None:
    """A warning line on stderr."""
    err.print(_labelled("warning:", "yellow", message), highlight=False, soft_wrap=True)


def _labelled(label: str, style: str, message: str) -> Text:
    """"label message" on one line, the label styled, the message printable as it is."""
    return Text.assemble((label, style), " ", printable(message))


def tolerant_streams() -> None:
    """Before each command: stdout and stderr print what they cannot encode (a file name's
    stray bytes) escaped; a closed stdout says so when written to (`_ClosedOutput`), a closed
    stderr is /dev/null; the command's cache folders are opened anew; output fits where it is
    read (`fit_output`)."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the process's lifetime)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    _COMMAND.begin()
    fit_output()
