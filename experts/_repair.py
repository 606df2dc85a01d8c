"""A damaged cache: SQLite's integrity check on it (`check_cache`, behind `ctd cache check`), and
every answer that can still be read copied into a new cache (`salvage_cache`, behind `ctd cache
salvage`). Both read the file without writing it: SQLite opens it read-only, and where even that
needs a write (a write-ahead log in a read-only folder) as an immutable file."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ._cache import BatchOutRow, FailureRow, ScoreCache, ScoreRow, score_columns_sql
from ._errors import ConfigError, StorageError
from ._storage import as_storage_error

__all__ = ["CacheCheck", "SalvageResult", "check_cache", "salvage_cache"]

# The tables worth keeping (batch_out: requests out in batch files, or they would be written and
# paid again); claims are runs in flight.
_SALVAGED = (ScoreRow, FailureRow, BatchOutRow)
_RANGE = 512  # rowids per read: a damaged page costs a bisection within its range only


@dataclass(frozen=True)
class CacheCheck:
    """What SQLite's `PRAGMA integrity_check` said of a cache: `problems` holds its lines (at
    most `limit` of them), empty when the file is sound."""

    path: Path
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class SalvageResult:
    """What `salvage_cache` copied: rows per table into `out`, and the rowid ranges of `source`
    that could not be read (rows there, if any, are lost)."""

    source: Path
    out: Path
    recovered: dict[str, int]
    unreadable: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "source": str(self.source),
            "out": str(self.out),
            "recovered": self.recovered,
            "unreadable_rowids": {t: [list(r) for r in ranges] for t, ranges in self.unreadable.items()},
        }


@contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that never writes `path` nor leaves a file next to it. With no write-ahead
    log beside it (no run has it open, and the last one closed cleanly) the file is opened as
    immutable: the main file is all there is to read. With a log, read-only mode reads it too;
    where it cannot (the log's index cannot be made in a read-only folder), a ConfigError says
    so: read without its log, a killed run's cache would seem to hold none of its last answers."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    uri = f"file:{quote(str(path.resolve()))}"
    log = Path(f"{path}-wal")
    logged = log.exists() and log.stat().st_size > 0
    connection = sqlite3.connect(f"{uri}?{'mode=ro' if logged else 'immutable=1'}", uri=True)
    try:
        connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:  # read-only mode could not make the log's index
        connection.close()
        if not logged:
            raise as_storage_error(path, exc) from None
        raise ConfigError(
            f"{path}: its write-ahead log {log.name} ({log.stat().st_size:,} bytes) holds answers that "
            f"cannot be read here ({exc}): copy {path.name} and {log.name} into a folder you can write, "
            "and run the command on the copy"
        ) from None
    except sqlite3.DatabaseError as exc:  # not a database, or its first page damaged
        connection.close()
        if "file is not a database" in str(exc):  # as the cache's own open says it: no salvage to try
            raise ConfigError(f"{path}: not a ctd cache (file is not a database)") from None
        raise as_storage_error(path, exc) from None
    with closing(connection):
        yield connection


def check_cache(path: Path, *, limit: int = 100) -> CacheCheck:
    """Run SQLite's full `PRAGMA integrity_check` on the cache at `path` (every page, and every
    index against its table) and return what it found. The check stops at the first page it
    cannot parse ("database disk image is malformed", no more said): then each table is read
    a rowid range at a time, and the rowids that cannot be read are named. A file SQLite cannot
    read at all is one problem saying so."""
    path = Path(path)
    try:
        with _read_only(path) as connection:
            try:
                lines = [str(line) for (line,) in connection.execute(f"PRAGMA integrity_check({int(limit)})")]
            except sqlite3.DatabaseError as exc:
                lines = [f"SQLite: {exc}", *_unreadable_rows(connection)]
    except StorageError as exc:
        return CacheCheck(path, (str(exc).removeprefix(f"{path}: "),))
    return CacheCheck(path, tuple(line for line in lines if line != "ok"))


def _unreadable_rows(connection: sqlite3.Connection) -> list[str]:
    """One line per table naming the rowid ranges that cannot be read."""
    try:
        listed = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = [name for (name,) in listed]
    except sqlite3.DatabaseError as exc:
        return [f"the list of tables cannot be read ({exc})"]
    lines = []
    for table in tables:
        lost: list[tuple[int, int]] = []
        for _ in _readable(connection, table, "rowid", lost):
            pass
        if lost:
            ranges = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in lost)
            lines.append(f"table {table}: the rows with rowid {ranges} cannot be read (a damaged page)")
    return lines


def salvage_cache(source: Path, out: Path) -> SalvageResult:
    """Copy every readable row of the answers (`scores`), the failure ledger (`failures`) and the
    requests out in batch files (`batch_out`) of the cache at `source` into a new cache at `out`,
    table by table, `_RANGE` rowids at a time; a range that fails to read is halved until the
    unreadable rowids are isolated and skipped. `out` is written next to itself and renamed into
    place when complete."""
    source, out = Path(source), Path(out)
    if out.exists():
        raise ConfigError(f"{out}: already exists; salvage writes a new cache")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.unlink()  # the new cache is made by ScoreCache, on an empty path
        ScoreCache(tmp).close()  # the schema of this version
        recovered: dict[str, int] = {}
        unreadable: dict[str, list[tuple[int, int]]] = {}
        with _read_only(source) as reader, closing(sqlite3.connect(tmp)) as writer:
            for model in _SALVAGED:
                table = model.__tablename__
                columns = ", ".join(model.model_fields)
                marks = ", ".join("?" * len(model.model_fields))
                lost: list[tuple[int, int]] = []
                count = 0
                read = columns
                if model is ScoreRow:  # an old cache's scores lack `how`: read what it would be
                    read = score_columns_sql(_columns(reader, table) or model.model_fields)
                for rows in _readable(reader, table, read, lost):
                    # OR IGNORE: a row a damaged page garbled into a NULL or a repeated key is left out
                    before = writer.total_changes
                    writer.executemany(f"INSERT OR IGNORE INTO {table} ({columns}) VALUES ({marks})", rows)
                    count += writer.total_changes - before
                writer.commit()
                recovered[table], unreadable[table] = count, lost
        for suffix in ("-wal", "-shm"):  # the new cache closed cleanly: its log is empty
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)
        os.replace(tmp, out)
    except BaseException:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)
        raise
    return SalvageResult(source, out, recovered, unreadable)


def _columns(reader: sqlite3.Connection, table: str) -> set[str]:
    """The columns `table` has; empty when its schema cannot be read (then the read says why)."""
    try:
        return {row[1] for row in reader.execute(f"PRAGMA table_info({table})")}
    except sqlite3.DatabaseError:
        return set()


def _readable(
    reader: sqlite3.Connection, table: str, columns: str, lost: list[tuple[int, int]]
) -> Iterator[list[tuple[object, ...]]]:
    """The readable rows of `table`, a rowid range at a time; the rowid ranges that could not
    be read are appended to `lost`."""
    try:
        low, high = reader.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {table}").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc) or "no such column" in str(exc):
            return  # an older cache without the table: nothing to read, and nothing lost
        low, high = 1, _rowid_bound(reader)
    except sqlite3.DatabaseError:  # a damaged page on the way to either end
        low, high = 1, _rowid_bound(reader)
    if low is None:  # an empty table
        return
    pending: list[tuple[int, int]] = []  # a stack: the lowest range on top
    start = low
    while start <= high:
        pending.append((start, min(start + _RANGE - 1, high)))
        start += _RANGE
    pending.reverse()
    while pending:
        first, last = pending.pop()
        # One rowid is looked up, not scanned: a scan steps on to the next row to see where the
        # range ends, and fails when that row lies on the damaged page.
        where, values = ("rowid = ?", (first,)) if first == last else ("rowid BETWEEN ? AND ?", (first, last))
        try:
            rows = reader.execute(f"SELECT {columns} FROM {table} WHERE {where}", values).fetchall()
        except sqlite3.DatabaseError:
            if first == last:
                if lost and lost[-1][1] == first - 1:
                    lost[-1] = (lost[-1][0], first)
                else:
                    lost.append((first, first))
                continue
            middle = (first + last) // 2
            pending += [(middle + 1, last), (first, middle)]  # the lower half is read first
            continue
        if rows:
            yield rows


def _rowid_bound(reader: sqlite3.Connection) -> int:
    """An upper bound on the rowids of a table whose last page cannot be read: the cache's
    rows are numbered from 1 as they are added, and none takes less than 16 bytes of its file."""
    pages, size = (reader.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "page_size"))
    return max(1, pages * size // 16)
