"""Profiler databases (SQLite files: Ascend's `.db` export, Nsight Systems' `.sqlite` export),
opened read only and never written beside.

A directory's database is opened in place (`mode=ro`; `immutable=1` where its folder is
read-only or it is in WAL mode, whose readers would create -shm files); an archive member from a
private temporary copy that is removed after. A hostile schema runs no function
(`trusted_schema = OFF`); text that is not UTF-8 (old exports hold Latin-1 bytes) is read as
Latin-1 rather than failing the read. Whatever SQLite reports becomes a one-line TraceError
naming the member.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from parsers.base import Reader, ShortOfResources, TraceError, local_path

SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class Database:
    """An open profiler database, its tables (name -> columns), what it states about itself
    (its metadata table as a dict) and its schema version."""

    conn: sqlite3.Connection
    where: str  # the member, for messages
    tables: dict[str, set[str]]
    stated: dict[str, str] = field(default_factory=dict)
    version: str = ""

    def has(self, table: str, *columns: str) -> bool:
        """Whether the database has `table` with every one of `columns`."""
        return table in self.tables and set(columns) <= self.tables[table]

    def query(self, sql: str, params: tuple = (), batch: int | None = None) -> pd.DataFrame:
        """The rows of `sql` as a DataFrame (fetched `batch` rows at a time where given, each
        batch turned into columns before the next: a big table never exists as one Python
        tuple per row); TraceError (naming the file) when SQLite fails."""
        try:
            cursor = self.conn.execute(sql, params)
            columns = [c[0] for c in cursor.description]
            if batch is None:
                return pd.DataFrame(cursor.fetchall(), columns=columns)
            parts = [pd.DataFrame(rows, columns=columns)
                     for rows in iter(lambda: cursor.fetchmany(batch), [])]
        except sqlite3.Error as err:
            raise TraceError(f"{self.where}: {problem(err)}") from None
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)

    def values(self, table: str) -> dict[str, str]:
        """A (name, value) table such as META_DATA as a dict."""
        if not self.has(table, "name", "value"):
            return {}
        rows = self.query(f"SELECT name, value FROM {table}")
        return {str(k): str(v) for k, v in zip(rows["name"], rows["value"], strict=True)}


@contextmanager
def opened(member: str, read: Reader, wanted: Callable[[str], bool] = lambda name: True
           ) -> Iterator[Database]:
    """The database `member`, open read only, with the columns of the tables `wanted` lists."""
    path = local_path(read, member)
    if path is not None:
        check_header(_head(path), member)
        with _connected(path, member, wanted, immutable=_immutable(path)) as db:
            yield db
        return
    data = read(member)
    check_header(data[:100], member)
    with _private_copy(data, member) as copy, _connected(copy, member, wanted, True) as db:
        yield db


def _head(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(100)


def check_header(head: bytes, where: str) -> None:
    """TraceError unless `head` begins an SQLite database."""
    if not head:
        raise TraceError(f"{where}: empty file, not an SQLite database")
    if not head.startswith(SQLITE_MAGIC):
        raise TraceError(f"{where}: not an SQLite database (no 'SQLite format 3' header)")


def _immutable(path: Path) -> bool:
    """Open without locking (and so without ever writing beside the file) where that is safe or
    needed: a read-only folder, or a WAL database (whose readers create -shm files)."""
    wal = _head(path)[18:20] == b"\x02\x02"
    return wal or not os.access(path.parent, os.W_OK)


@contextmanager
def _private_copy(data: bytes, where: str) -> Iterator[Path]:
    """`data` in a file of a fresh private (0700) temporary folder, removed on exit; refused
    when the temporary space cannot hold it."""
    with tempfile.TemporaryDirectory(prefix="tracegraph-db-") as folder:
        free = shutil.disk_usage(folder).free
        if len(data) > free:
            raise ShortOfResources(f"{where}: {len(data) >> 20} MiB database, only "
                                   f"{free >> 20} MiB free in the temporary folder {folder}")
        copy = Path(folder) / "profile.db"
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield copy


@contextmanager
def _connected(path: Path, where: str, wanted: Callable[[str], bool], immutable: bool
               ) -> Iterator[Database]:
    uri = path.resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=2.0, check_same_thread=False)
    except sqlite3.Error as err:
        raise TraceError(f"{where}: cannot open ({problem(err)})") from None
    with closing(conn):
        conn.text_factory = text
        conn.execute("PRAGMA trusted_schema = OFF")  # a hostile schema runs no function
        db = Database(conn, where, {})
        names = db.query("SELECT name FROM sqlite_master WHERE type = 'table'")["name"]
        db.tables = {name: set(db.query(f"PRAGMA table_info('{name}')")["name"])
                     for name in names if wanted(name)}
        yield db


def text(raw: bytes) -> str:
    """A TEXT value: UTF-8, else (old exports, Windows hosts) Latin-1, which reads any byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def problem(err: sqlite3.Error) -> str:
    """What SQLite reported, and what it most likely means."""
    message = str(err)
    if "locked" in message or "busy" in message:
        return f"{message}: another process holds it (is the profiler still writing it?)"
    if "not a database" in message or "malformed" in message:
        return f"{message}: damaged or not an SQLite database"
    return message
