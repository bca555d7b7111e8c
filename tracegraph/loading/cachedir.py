"""The cache folder: where it lies, entries written safely, faults said once, a size cap.

An entry is a folder named by its key (a parsed rank: `tracegraph.loading.cache`; an analysis:
`tracegraph.analysis.cache`). It is written in a private temporary folder (`.tmp-…`: an
unpredictable name that did not exist, made by `mkdtemp`, mode 0700 and its files 0600 whatever
the umask) and published whole by one rename, which never follows a link planted at the entry's
name. Only real folders owned by this user are read as entries: a link or another user's folder
at an entry's name is a miss. The cache folder itself is made 0700 with a CACHEDIR.TAG (backup
tools skip it).

A temporary folder is locked (`flock`) while its writer lives: a later run that writes removes
those whose writer is gone (killed, out of memory), as `tracegraph cache clear` does.

The cache is an optimisation, never a failure: the first fault (full, read-only, not a folder,
unreadable, file size limit) is said once and the run goes on without writing; what the cache
holds is still read. A run that finds everything cached writes nothing.

Size: once a run has written, the least recently used entries (an entry's folder time, renewed
when a run reads it) go until the folder holds at most the cap; the entries the run used stay.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

DIR_ENV, SIZE_ENV = "TRACEGRAPH_CACHE_DIR", "TRACEGRAPH_CACHE_SIZE"
DEFAULT_LIMIT = 5 << 30
TEMPORARY = (".tmp-", ".handoff-")  # folders being written; swept once their writer is gone
_NEW, _TRASH = ".new-", ".trash-"  # a temporary folder before it is locked; one being removed
_ENTRY = re.compile(r"([a-z_]+-)?[0-9a-f]{32}")  # a rank's key, or WHAT-KEY of an analysis
_TAG = "CACHEDIR.TAG"
_TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
             "# tracegraph's cache: parsed ranks and analyses (https://bford.info/cachedir/)\n")
_RENEW_S = 3600  # an entry's time is renewed when read, at most this often
_NEW_STALE_S = 3600
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def default_cache_dir() -> Path:
    """`$TRACEGRAPH_CACHE_DIR`, else the user's cache folder (~/.cache/tracegraph on Linux)."""
    from platformdirs import user_cache_dir

    return Path(os.environ.get(DIR_ENV) or user_cache_dir("tracegraph"))


def parse_size(text: str) -> int:
    """Bytes of a size such as "5G", "500MiB", "1.5 GB" or "800000000"; ValueError otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not found or float(found[1]) * _UNITS[found[2]] < 1:
        raise ValueError(f"{text!r} is not a size (e.g. 5G, 500M)")
    return int(float(found[1]) * _UNITS[found[2]])


def default_limit() -> int:
    """`$TRACEGRAPH_CACHE_SIZE`, else DEFAULT_LIMIT; ValueError for a value that is no size."""
    text = os.environ.get(SIZE_ENV)
    return parse_size(text) if text else DEFAULT_LIMIT


@dataclass(frozen=True)
class Entry:
    """An entry as the cache folder lists it."""

    name: str
    size: int  # bytes of its files
    used: float  # when a run last wrote or read it (epoch s)


class CacheDir:
    """One run's use of the cache folder at `root`: entries read and written, its first fault
    said through `warn`, its size kept under `limit` bytes."""

    def __init__(self, root: Path, limit: int | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        self.limit = default_limit() if limit is None else limit
        self.warn = warn or (lambda message: None)
        self.fault: str | None = None  # why the run stopped writing (said once)
        self.used: set[str] = set()  # entries this run read or wrote: never evicted by it
        self._held: int | None = None  # bytes in entries, once counted
        self._ready = False

    # -- reading ---------------------------------------------------------------------------------
    def entry(self, name: str) -> Path | None:
        """The folder of entry `name`, when the cache holds one this user wrote (marked used)."""
        path = self.root / name
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as error:  # the cache path is a file, unreadable, a link loop
            self.failed(error)
            return None
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            return None
        self.used.add(name)
        if time.time() - status.st_mtime > _RENEW_S:
            with contextlib.suppress(OSError):  # a read-only cache keeps the old time
                os.utime(path)
        return path

    def discard(self, name: str) -> None:
        """Remove entry `name` (it did not read back)."""
        self.used.discard(name)
        _remove(self.root / name)

    # -- writing ---------------------------------------------------------------------------------
    def put(self, name: str, write: Callable[[Path], None]) -> bool:
        """Store entry `name`: `write(folder)` fills a private temporary folder, published whole
        by a rename. False when not stored (held already, or the cache is unusable: said once);
        what `write` raises other than OSError goes to the caller."""
        if self.fault is not None:
            return False
        try:
            with self._private(".tmp-") as folder:
                write(folder)
                size = _privatize(folder)
                if not _published(folder, self.root / name):
                    return False  # another run stored it first, or something else is there
        except OSError as error:
            self.failed(error)
            return False
        self.used.add(name)
        self._grew(size)
        return True

    @contextmanager
    def handoff(self) -> Iterator[Path]:
        """A private folder for files that become entries by a rename: in the cache, else (the
        cache unusable) in the system's temporary folder."""
        with ExitStack() as stack:
            folder = None
            if self.fault is None:
                try:
                    folder = stack.enter_context(self._private(".handoff-"))
                except OSError as error:
                    self.failed(error)
            yield folder or Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="tracegraph-")))

    def failed(self, error: OSError) -> None:
        """Stop writing for this run; say why the first time."""
        if self.fault is None:
            self.fault = error.strerror or str(error)
            where = f" ({error.filename})" if error.filename and str(error.filename) != str(
                self.root) else ""
            self.warn(f"cache {self.root} unusable: {self.fault}{where}; "
                      "going on without caching")

    @contextmanager
    def _private(self, prefix: str) -> Iterator[Path]:
        """A new folder `prefix`-RANDOM in the cache, mode 0700, locked while it exists."""
        self._prepare()
        made = Path(tempfile.mkdtemp(prefix=_NEW, dir=self.root))
        lock = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with contextlib.suppress(OSError):  # a file system without locks: never swept
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            folder = made.with_name(prefix + made.name[len(_NEW):])
            os.rename(made, folder)
            made = folder
            yield folder
        finally:
            shutil.rmtree(made, ignore_errors=True)  # gone already when published
            os.close(lock)

    def _prepare(self) -> None:
        """The cache folder made (private, tagged) and cleared of dead runs' leftovers, once."""
        if self._ready:
            return
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # a file or a link there fails below
            os.mkdir(self.root, 0o700)
        with contextlib.suppress(FileExistsError):
            _write_private(self.root / _TAG, _TAG_TEXT.encode())
        self._ready = True
        sweep(self.root)

    # -- the size cap ----------------------------------------------------------------------------
    def _grew(self, size: int) -> None:
        if self._held is None:
            self._held = sum(e.size for e in entries(self.root))
        else:
            self._held += size
        if self._held > self.limit:
            self._held = self._evict()

    def _evict(self) -> int:
        """Remove the least recently used entries (not this run's) down to the cap; what is
        left, in bytes."""
        held = entries(self.root)
        total = sum(e.size for e in held)
        for entry in sorted(held, key=lambda e: e.used):
            if total <= self.limit:
                break
            if entry.name not in self.used:
                _remove(self.root / entry.name)
                total -= entry.size
        return total


# -- the folder as a whole (also `tracegraph cache`) -----------------------------------------------
def entries(root: Path) -> list[Entry]:
    """The entries in the cache folder `root` (what is not an entry's name is left alone)."""
    found = []
    for item in _listing(root):
        if _ENTRY.fullmatch(item.name) and item.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):  # removed meanwhile
                found.append(Entry(item.name, _size(Path(item.path)),
                                   item.stat(follow_symlinks=False).st_mtime))
    return found


def leftovers(root: Path) -> list[Path]:
    """Temporary folders whose writer is gone (unlocked; unnamed ones after an hour)."""
    found = []
    for item in _listing(root):
        if not item.is_dir(follow_symlinks=False):
            continue
        path = Path(item.path)
        if item.name.startswith(TEMPORARY) and not _locked(path) or item.name.startswith(
                _TRASH) or item.name.startswith(_NEW) and _age(item) > _NEW_STALE_S:
            found.append(path)
    return found


def sweep(root: Path) -> int:
    """Remove the leftovers of dead runs; how many there were."""
    gone = leftovers(root)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return len(gone)


def clear(root: Path) -> tuple[int, int]:
    """Remove every entry and every leftover: (entries removed, bytes freed)."""
    held = entries(root)
    for entry in held:
        _remove(root / entry.name)
    sweep(root)
    return len(held), sum(e.size for e in held)


def _listing(root: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(root) as items:
            return list(items)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size(folder: Path) -> int:
    with os.scandir(folder) as items:
        return sum(i.stat(follow_symlinks=False).st_size for i in items
                   if i.is_file(follow_symlinks=False))


def _age(item: os.DirEntry) -> float:
    return time.time() - item.stat(follow_symlinks=False).st_mtime


def _locked(folder: Path) -> bool:
    """Whether a live process holds `folder`'s lock (or it cannot be told)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _remove(path: Path) -> None:
    """Remove a folder of the cache: renamed aside first, so no reader finds half of it."""
    aside = path.with_name(f"{_TRASH}{os.getpid()}-{os.urandom(6).hex()}")
    try:
        os.rename(path, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _privatize(folder: Path) -> int:
    """Make the files in `folder` readable by their owner alone; their total size."""
    total = 0
    for path in folder.iterdir():
        status = path.lstat()
        if stat.S_ISREG(status.st_mode):
            path.chmod(0o600)
            total += status.st_size
    return total


def _published(folder: Path, entry: Path) -> bool:
    """Rename `folder` to `entry` unless something is there (a link is never followed)."""
    if os.path.lexists(entry):
        return False
    try:
        os.rename(folder, entry)
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            return False  # stored by another run meanwhile
        raise
    return True


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
