"""Read bundle members in place: a directory, a single file, a zip or a tar (plain, gz, bz2, xz).

Nothing is extracted and the input is never modified. Member names are checked before use, links
and special files are refused, and every decompression layer is capped in size and in ratio while
it runs, so a bomb is stopped before it fills memory. Cut data comes back as far as it goes, with a
warning in `Source.warnings`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import blake3

from parsers.base import TraceError

T = TypeVar("T")

HEAD_BYTES = 64 << 10  # what discovery sniffs of a member, decompressed
_CHUNK = 8 << 20
_HASH_CHUNK = 1 << 20
_TAIL_BYTES = 64 << 20  # what is read past a tar's end to check its compressed stream
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
ARCHIVE_SUFFIXES = (*TAR_SUFFIXES, ".zip")
_DRIVE = re.compile(r"^[A-Za-z]:")
_HOME = re.compile(r"^~[^/\\]*[/\\]")  # ~/x, ~user/x: where an extractor may expand it
_OPENERS: tuple[tuple[bytes, Callable[[BinaryIO], BinaryIO]], ...] = (
    (b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", bz2.BZ2File),
    (b"\xfd7zXZ\x00", lzma.LZMAFile),
)
_DECODE_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile,
                  NotImplementedError)
_ZIP_ERRORS = (*_DECODE_ERRORS, ValueError, RuntimeError)  # what a garbage zip directory raises
_ZIP_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_TAR_KINDS = {tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink",
              tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device",
              tarfile.FIFOTYPE: "fifo"}
_ZIP_KINDS = {stat.S_IFLNK: "symlink", stat.S_IFCHR: "character device",
              stat.S_IFBLK: "block device", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


@dataclass(frozen=True)
class Limits:
    """Caps that stop decompression bombs and member floods."""

    max_member_bytes: int = 64 << 30  # decompressed size of one member
    max_ratio: float = 1000.0  # decompressed / compressed bytes of one stream ...
    ratio_min_bytes: int = 8 << 20  # ... once it has produced this much
    max_members: int = 100_000  # listing one takes ~30 µs: a flood is refused in seconds
    max_depth: int = 64  # folders on a member's path

    def check_size(self, size: int, where: str) -> None:
        """Refuse a member larger than `max_member_bytes`."""
        if size > self.max_member_bytes:
            raise TraceError(f"{where}: more than {self.max_member_bytes} bytes decompressed "
                             "(limit max_member_bytes); refusing a possible decompression bomb")

    def check_ratio(self, out: int, consumed: int, where: str) -> None:
        """Refuse a stream whose output outgrows its input by more than `max_ratio`."""
        if out > self.ratio_min_bytes and out > self.max_ratio * max(consumed, 1):
            raise TraceError(f"{where}: {out} bytes decompressed from {consumed} "
                             f"(over {self.max_ratio:g}x, limit max_ratio); "
                             "refusing a possible decompression bomb")

    def check_depth(self, depth: int, where: str) -> None:
        """Refuse a member nested in more than `max_depth` folders."""
        if depth > self.max_depth:
            raise TraceError(f"{where}: nested in more than {self.max_depth} folders "
                             "(limit max_depth)")

    def check_count(self, count: int, where: str) -> None:
        """Refuse an archive with more than `max_members` members."""
        if count > self.max_members:
            raise TraceError(f"{where}: more than {self.max_members} members (limit max_members)")


def member_name(raw: str, archive: object, limits: Limits) -> str:
    """The normalized POSIX name of a member; TraceError when it could escape the bundle or
    nests deeper than `limits` allow."""
    parts = re.split(r"[/\\]", raw)
    name = "/".join(p for p in parts if p not in ("", "."))
    limits.check_depth(name.count("/"), f"{archive}: member {raw[:200]!r}")
    problem = ("absolute path" if raw[:1] in ("/", "\\") else
               "drive letter" if _DRIVE.match(raw) else
               "'..' component" if ".." in parts else
               "home-relative path" if _HOME.match(raw) else
               "empty name" if not name else "")
    if problem:
        raise TraceError(f"{archive}: unsafe member {raw[:200]!r} ({problem})")
    return name


class _Counted:
    """A file wrapper that counts the bytes read through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw, self.count = raw, 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.count += len(data)
        return data


class _Inflated(io.RawIOBase):
    """Decompresses a stream, enforcing the ratio cap; a cut stream ends early (`truncated`)."""

    def __init__(self, raw: BinaryIO, opener: Callable[[BinaryIO], BinaryIO], where: str,
                 limits: Limits) -> None:
        self._counted = _Counted(raw)
        self._inner = opener(self._counted)  # type: ignore[arg-type]
        self.where, self._limits = where, limits
        self.out, self.truncated = 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        try:
            data = self._inner.read1(len(buf))  # type: ignore[attr-defined]
        except EOFError:
            self.truncated = True
            return 0
        buf[: len(data)] = data
        self.out += len(data)
        self._limits.check_ratio(self.out, self._counted.count, self.where)
        return len(data)

    def drain(self) -> None:
        """Read on to the stream's end (at most _TAIL_BYTES), so that a stream cut after the
        data was read, its end marker or checksum missing, is noted `truncated`."""
        left = _TAIL_BYTES
        while left > 0 and (data := self.read(min(left, _CHUNK))):
            left -= len(data)


class _Headers(tarfile.TarInfo):
    """A tar header that notes on its archive (`ended`) the zero block ending a whole tar."""

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(archive)
        except tarfile.EOFHeaderError:
            archive.ended = True  # type: ignore[attr-defined]
            raise


class _Slice(io.RawIOBase):
    """The next `size` bytes of a stream; `short` when the stream ends first."""

    def __init__(self, raw: BinaryIO, size: int) -> None:
        self._raw, self._left, self.short = raw, size, False

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        data = self._take(len(buf))
        buf[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Skip what is left, noting a short stream."""
        while self._take(_CHUNK):
            pass

    def _take(self, size: int) -> bytes:
        want = min(size, self._left, _CHUNK)
        data = self._raw.read(want) if want else b""
        self._left -= len(data)
        if len(data) < want:
            self.short, self._left = True, 0
        return data


class Source:
    """The members of a bundle, in archive order, and guarded access to their bytes."""

    random_access = True

    def __init__(self, path: Path, limits: Limits) -> None:
        self.path, self.limits = path, limits
        self.members: dict[str, object] = {}  # name -> handle of the concrete source
        self.warnings: list[str] = []
        self._digest: str | None = None

    # -- listing -------------------------------------------------------------------------------
    def scan(self, want: Callable[[str], bool], probe: Callable[[str, bytes], T]) -> dict[str, T]:
        """List the members; return `probe(name, head)` for each member `want` selects."""
        self._list()
        return {name: probe(name, self._head(name)) for name in self.members if want(name)}

    def _list(self) -> None:
        raise NotImplementedError

    def _add(self, name: str, handle: object) -> None:
        if name in self.members:
            raise TraceError(f"{self.path}: duplicate member {name!r}")
        self.members[name] = handle
        self.limits.check_count(len(self.members), str(self.path))

    # -- reading -------------------------------------------------------------------------------
    def read(self, name: str) -> bytes:
        """The decompressed bytes of one member."""
        self._require([name])
        with self._opened(name) as raw:
            return self._decode(name, raw)

    def stream(self, names: set[str]) -> Iterator[tuple[str, bytes]]:
        """(name, bytes) of the requested members, in archive order."""
        self._require(names)
        return ((name, self.read(name)) for name in self.members if name in names)

    def fingerprint(self, names: Iterable[str]) -> str:
        """A digest of the members' bytes (of the archive's, for an archive) and names: any
        change to what they hold is another digest, whatever their sizes and times say."""
        names = sorted(set(names))
        self._require(names)
        digest = blake3.blake3()
        for name in names:
            digest.update(f"{name}\0{self._content(name)}\0".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def close(self) -> None:
        """Release open files."""

    def local_path(self, name: str) -> Path | None:
        """The file on disk that holds member `name` unchanged, if any (not in an archive)."""
        return None

    def _open(self, name: str) -> BinaryIO:
        raise NotImplementedError

    def _content(self, name: str) -> str:
        """The digest of what holds member `name`: the archive's bytes, read once."""
        if self._digest is None:
            self._digest = content_digest(self.path)
        return self._digest

    def _head(self, name: str) -> bytes:
        with self._opened(name) as raw:
            return self._decode(name, raw, head=True)

    def _opened(self, name: str) -> BinaryIO:
        try:
            return self._open(name)
        except _ZIP_ERRORS as exc:
            raise TraceError(f"{self._where(name)}: cannot open ({exc})") from None

    def _where(self, name: str) -> str:
        return f"{self.path}: member {name}"

    def _require(self, names: Iterable[str]) -> None:
        missing = [n for n in names if n not in self.members]
        if missing:
            raise TraceError(f"{self.path}: no member {missing[0]!r}")

    def _decode(self, name: str, raw: BinaryIO, head: bool = False) -> bytes:
        """A member's bytes (only its first HEAD_BYTES if `head`), gunzipped for `.gz`."""
        where = self._where(name)
        gz = _Inflated(raw, _OPENERS[0][1], where, self.limits) if name.endswith(".gz") else None
        reader = io.BufferedReader(gz, HEAD_BYTES if head else _CHUNK) if gz else raw
        try:
            data = reader.read(HEAD_BYTES) if head else _read_capped(reader, where, self.limits)
        except _DECODE_ERRORS as exc:
            raise TraceError(f"{where}: unreadable ({exc})") from None
        if not head and ((gz and gz.truncated) or getattr(raw, "short", False)):
            self.warn(f"{where}: truncated; kept the {len(data)} bytes that could be read")
        return data

    def warn(self, message: str) -> None:
        """Add a warning once."""
        if message not in self.warnings:
            self.warnings.append(message)


def _read_capped(reader: BinaryIO, where: str, limits: Limits) -> bytes:
    """All of `reader`, refused past the size limit: a file on disk in one read of its size (the
    bytes exist once), a stream (a decompressed member) chunk by chunk."""
    size = _file_size(reader)
    if size is not None:
        limits.check_size(size, where)
        return reader.read(size)  # what it held when measured: bytes appended since are not read
    chunks, total = [], 0
    while chunk := reader.read(_CHUNK):
        total += len(chunk)
        limits.check_size(total, where)
        chunks.append(chunk)
    return b"".join(chunks)


def _file_size(reader: BinaryIO) -> int | None:
    """The size of the regular file `reader` reads, else None (a stream, an archive member)."""
    try:
        status = os.fstat(reader.fileno())
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def content_digest(path: Path) -> str:
    """BLAKE3 of a file's bytes, read in chunks (about 3 GB/s: a tenth of a second for the
    350 MB of an 8-rank bundle, against seconds to parse it)."""
    digest = blake3.blake3()
    buffer = bytearray(_HASH_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as raw:
        while size := raw.readinto(buffer):
            digest.update(view[:size])
    return digest.hexdigest()


class DirSource(Source):
    """A directory; symlinks are never followed (those leading outside it are reported)."""

    def _list(self) -> None:
        root = self.path.resolve()
        pending = [""]
        while pending:
            rel = pending.pop()
            for entry in self._entries(root / rel):
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    self._symlink(root, name)
                elif entry.is_dir(follow_symlinks=False):
                    self.limits.check_depth(name.count("/") + 1, f"{self.path}: folder {name}")
                    pending.append(name)
                elif entry.is_file(follow_symlinks=False):
                    self._add(name, root / name)
                else:
                    self.warn(f"{self.path}: skipped {name}: not a regular file")
        self.members = dict(sorted(self.members.items()))

    def _entries(self, folder: Path) -> list[os.DirEntry]:
        try:
            with os.scandir(folder) as entries:
                return list(entries)
        except OSError as exc:
            self.warn(f"{self.path}: skipped {folder}: {exc.strerror}")
            return []

    def _symlink(self, root: Path, name: str) -> None:
        """Skip a link: a target inside the bundle is listed under its own name anyway."""
        try:
            target = (root / name).resolve()
        except (OSError, RuntimeError):  # a loop (RuntimeError before Python 3.13)
            self.warn(f"{self.path}: skipped {name}: symlink loop")
            return
        if not target.is_relative_to(root):
            self.warn(f"{self.path}: skipped {name}: symlink to outside the bundle")

    def _open(self, name: str) -> BinaryIO:
        return open(self.members[name], "rb")  # type: ignore[arg-type]  # noqa: SIM115

    def local_path(self, name: str) -> Path | None:
        self._require([name])
        return None if name.endswith(".gz") else self.members[name]  # type: ignore[return-value]

    def _content(self, name: str) -> str:
        return content_digest(self.members[name])  # type: ignore[arg-type]


class FileSource(DirSource):
    """A single file: its one member is its name."""

    def _list(self) -> None:
        self._add(self.path.name, self.path.resolve())


class ZipSource(Source):
    """A zip archive, read member by member."""

    def __init__(self, path: Path, limits: Limits) -> None:
        super().__init__(path, limits)
        try:
            self._zip = zipfile.ZipFile(path)
        except _ZIP_ERRORS as exc:  # a name flagged UTF-8 that is not: UnicodeDecodeError
            raise TraceError(f"{path}: not a readable zip archive, truncated or corrupt "
                             f"({exc})") from None

    def _list(self) -> None:
        infos = self._zip.infolist()
        self.limits.check_count(len(infos), str(self.path))
        for info in infos:
            name = member_name(info.filename, self.path, self.limits)
            kind = _ZIP_KINDS.get(stat.S_IFMT(info.external_attr >> 16))
            if kind:
                raise TraceError(f"{self._where(info.filename)}: {kind} entries are not allowed")
            if info.is_dir():
                if info.file_size:
                    self.warn(f"{self._where(name)}/: a folder entry holding {info.file_size} "
                              "bytes; ignored")
                continue
            if info.flag_bits & 0x1:
                raise TraceError(f"{self._where(name)}: encrypted")
            if info.compress_type not in _ZIP_METHODS:
                self.warn(f"{self._where(name)}: skipped: compression method "
                          f"{info.compress_type} is not supported")
                continue
            self.limits.check_size(info.file_size, self._where(name))
            self.limits.check_ratio(info.file_size, info.compress_size, self._where(name))
            self._add(name, info)

    def _open(self, name: str) -> BinaryIO:
        return self._zip.open(self.members[name])  # type: ignore[arg-type,return-value]

    def close(self) -> None:
        self._zip.close()


class TarSource(Source):
    """A tar archive, plain or compressed, read front to back: `read` rescans, `stream` does not."""

    random_access = False

    def scan(self, want: Callable[[str], bool], probe: Callable[[str, bytes], T]) -> dict[str, T]:
        """One pass: list the members, probing the heads of those `want` selects."""
        found = {}
        for name, _, data in self._pass():
            self._add(name, None)
            if want(name):
                found[name] = probe(name, self._decode(name, data, head=True))
        return found

    def read(self, name: str) -> bytes:
        found = self.stream({name})
        try:
            return next(found)[1]
        except StopIteration:
            raise TraceError(f"{self._where(name)}: gone; the archive changed") from None
        finally:
            found.close()  # type: ignore[attr-defined]

    def stream(self, names: set[str]) -> Iterator[tuple[str, bytes]]:
        self._require(names)
        return ((name, self._decode(name, data)) for name, _, data in self._pass()
                if name in names)

    def _pass(self) -> Iterator[tuple[str, tarfile.TarInfo, _Slice]]:
        """Each regular member once, checked, with a reader of its data. A pass that goes
        through notes a cut: inside a member, before the zero blocks that end a tar, or in the
        compressed stream after them (its end marker or checksum missing)."""
        with self.path.open("rb") as raw:
            body = self._body(raw)
            try:
                with tarfile.open(fileobj=body, mode="r|", bufsize=1 << 20,
                                  tarinfo=_Headers) as archive:
                    cut = yield from self._members(archive, body)
                    cut = cut or ("" if getattr(archive, "ended", False) else
                                  " before its end-of-archive blocks")
                if isinstance(body, _Inflated):
                    body.drain()
            except (tarfile.TarError, *_DECODE_ERRORS) as exc:
                raise TraceError(f"{self.path}: not a readable tar archive ({exc})") from None
            if cut or (isinstance(body, _Inflated) and body.truncated):
                self.warn(f"{self.path}: archive truncated{cut}; members after the cut are missing")

    def _members(self, archive: tarfile.TarFile,
                 body: BinaryIO) -> Generator[tuple[str, tarfile.TarInfo, _Slice], None, str]:
        """The pass proper; returns where the archive was cut ("" if it was not)."""
        for count, info in enumerate(archive, 1):
            self.limits.check_count(count, str(self.path))
            name = self._checked(info)
            if name is None:
                continue
            if isinstance(body, _Inflated):
                body.where = self._where(name)
            data = _Slice(archive.fileobj, info.size)  # type: ignore[arg-type]
            yield name, info, data
            data.drain()
            if data.short:
                return f" inside member {name}"
        return ""

    def _body(self, raw: BinaryIO) -> BinaryIO:
        """The archive's tar stream: decompressed (and guarded) when its magic says so."""
        magic = raw.read(8)
        raw.seek(0)
        for prefix, opener in _OPENERS:
            if magic.startswith(prefix):
                return _Inflated(raw, opener, str(self.path), self.limits)  # type: ignore[return-value]
        return raw

    def _checked(self, info: tarfile.TarInfo) -> str | None:
        """The member's safe name, None for a folder; TraceError for links and special files."""
        name = member_name(info.name, self.path, self.limits)
        if info.isdir():
            return None
        if not info.isfile() or info.issparse():
            kind = _TAR_KINDS.get(info.type, "sparse" if info.issparse() else "special")
            raise TraceError(f"{self._where(info.name)}: {kind} members are not allowed")
        self.limits.check_size(info.size, self._where(name))
        return name


def open_source(path: Path, limits: Limits) -> Source:
    """The source that reads `path`: a directory, an archive or a single file."""
    if path.is_dir():
        return DirSource(path, limits)
    lower = path.name.lower()
    if lower.endswith(".zip"):
        return ZipSource(path, limits)
    if lower.endswith(TAR_SUFFIXES):
        return TarSource(path, limits)
    return FileSource(path, limits)
