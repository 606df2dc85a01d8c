"""Where the cache's storage fails: every sqlite3 or OS error met opening, reading or writing the
SQLite file becomes one StorageError (CacheCorrupt for a damaged file) that names it, and the
checks a run makes on the file before it pays for anything.

What is checked before a run, and why that much (`ScoreCache.for_run`):

- write access, with the errno the OS gives: the file opened for writing, a file created next
  to it (SQLite's write-ahead log and its index live there), so a read-only mount, an immutable
  file or a folder without permission is named with its cause rather than "unable to open";
- free space: below `MIN_FREE_BYTES` on the file's device the first commit would fail;
- SQLite's `PRAGMA quick_check` (every page's b-tree structure, not the index-to-table match of
  `integrity_check`), for at most `CHECK_SECONDS`. Measured on this project's 2-core machine
  (2026-11-25): on a cache of 100,000 answers (62 MB, 15,272 pages) quick_check took 0.13 s
  and integrity_check 0.32 s with the file in the page cache; that is about 0.5 GB/s, so a 1 GB
  cache is checked whole in about 2 s. A larger (or cold) file is checked as far as the time
  allows, and the reads of the run translate what the check did not reach;
- a write transaction begun and rolled back: another process's lock held past the busy timeout,
  or a file SQLite opened read-only, is found here, before the endpoint is asked anything.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from ._errors import CacheCorrupt, StorageError, storage_kind

__all__ = [
    "CHECK_SECONDS",
    "MIN_FREE_BYTES",
    "as_storage_error",
    "check_pages",
    "check_place",
    "free_bytes",
    "probe_write",
    "storage_errors",
    "write_access",
]

MIN_FREE_BYTES = 64 * 1024
"""Less than this free on the cache's device is a full disk: a commit writes pages of 4 KiB to
the write-ahead log, and a few of them per batch."""

CHECK_SECONDS = 2.0
"""How long a run may spend on `PRAGMA quick_check` before it starts (see the module's text)."""


def as_storage_error(path: Path, error: BaseException) -> StorageError:
    """`error` (sqlite3 or OS) as the StorageError of the cache at `path`. SQLite's "unable to
    open database file" says nothing of why: the OS is asked, so the line names the cause."""
    kind = storage_kind(error)
    if kind == "corrupt":
        return CacheCorrupt(f"{path}: {error}", path=path)
    if kind == "other" and isinstance(error, sqlite3.OperationalError) and "unable to open" in str(error):
        cause = write_access(path)
        if cause is not None:
            return cause
    return StorageError(f"{path}: {error}", path=path, kind=kind)


@contextmanager
def storage_errors(path: Path) -> Iterator[None]:
    """SQLite failing to read or write the cache (a full disk, an I/O error, a read-only file, a
    lock, a damaged page) as one StorageError naming the file: where the cache is used, this is
    where its errors enter."""
    try:
        yield
    except DBAPIError as exc:
        raise as_storage_error(path, exc.orig) from None
    except (sqlite3.Error, OSError) as exc:
        raise as_storage_error(path, exc) from None


def check_place(path: Path) -> None:
    """Before the cache at `path` is opened for a run: a StorageError when its folder refuses
    writes (the OS's reason) or its device is full. A missing folder is left to the opening,
    which creates it; a path that is a folder, to its ConfigError."""
    if path.is_dir() or not path.parent.is_dir():
        return
    refused = write_access(path)
    if refused is not None:
        raise refused
    free = free_bytes(path.parent)
    if free < MIN_FREE_BYTES:
        raise StorageError(f"{path}: {free} bytes free on its device", path=path, kind="full")


def write_access(path: Path) -> StorageError | None:
    """Why the cache at `path` cannot be written, asked of the OS: the file opened for writing
    (when it exists) and a file created in its folder (SQLite keeps its write-ahead log there).
    None when both work; nothing is left behind."""
    try:
        if path.exists():
            os.close(os.open(path, os.O_RDWR))
    except OSError as exc:
        return StorageError(
            f"{path}: cannot be opened for writing ({exc.strerror or exc})", path=path, kind=storage_kind(exc)
        )
    folder = path.parent
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        return StorageError(
            f"{path}: cannot create files in {folder}, as SQLite must next to its cache "
            f"({exc.strerror or exc})",
            path=path,
            kind=storage_kind(exc),
        )
    os.close(fd)
    os.unlink(probe)
    return None


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write on the device of `folder` (root may use the blocks
    a file system reserves for it)."""
    stats = os.statvfs(folder)
    blocks = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
    return blocks * stats.f_frsize


def check_pages(connection: sqlite3.Connection, path: Path, *, seconds: float) -> None:
    """Run `PRAGMA quick_check` for at most `seconds` (SQLite's progress handler stops it) and
    raise CacheCorrupt naming the first problem it reports. Stopped by the clock, it passes:
    the pages it did not reach are checked by the reads of the run."""
    deadline = time.monotonic() + seconds
    connection.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        rows = connection.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            return
        raise as_storage_error(path, exc) from None
    except sqlite3.DatabaseError as exc:
        raise as_storage_error(path, exc) from None
    finally:
        connection.set_progress_handler(None, 0)
    problems = [str(line) for (line,) in rows if line != "ok"]
    if problems:
        first = problems[0].replace("\n", " ").removeprefix("*** in database main *** ")
        raise CacheCorrupt(f"{path}: damaged ({first})", path=path)


def probe_write(connection: Any, path: Path) -> None:
    """Begin a write transaction, write a row and roll it back: another process's lock held past
    the busy timeout, or a file SQLite could open only read-only, fails here."""
    with storage_errors(path):
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            cursor.execute(
                "INSERT OR REPLACE INTO claims (key, expert, item_id, owner, host, pid, expires) "
                "VALUES ('preflight', '', '', '', '', 0, 0)"
            )
        finally:
            connection.rollback()
