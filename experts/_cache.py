"""The SQLite cache and ledger of expert answers (through sqlmodel).

`scores` holds one row per successful answer, keyed by a hash of everything that can change
the answer; `failures` records items that failed after their retries, with the reason. A
failure is never a cache hit: resuming retries it. `batch_out` holds the requests written to a
batch file whose results have not been read back. `claims` holds the items some run is asking
about right now (the protocol is in `experts._claims`): committing an item's score or failure
deletes its claim in the same transaction. A client's writes go through one
`experts._cache_writer.CacheWriter` task that commits in short batches, so a crash loses at most
the answers of the last batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import event, func, insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import defer
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Field, Session, SQLModel, create_engine, select

from ._errors import ConfigError, StorageError, storage_kind
from ._storage import CHECK_SECONDS, check_pages, check_place, probe_write, storage_errors

__all__ = [
    "HOW_OF_OLD_ROWS",
    "SCHEMA_VERSION",
    "BatchOutRow",
    "CacheKey",
    "ClaimRow",
    "FailureRow",
    "ScoreCache",
    "ScoreRow",
    "batch_tag",
    "score_columns_sql",
]

SCHEMA_VERSION = 1
"""Bump when the meaning of a cached score changes; every key changes with it."""


class ScoreRow(SQLModel, table=True):
    __tablename__ = "scores"

    key: str = Field(primary_key=True)
    expert: str = Field(index=True)
    item_id: str = Field(index=True)
    endpoint: str
    model: str
    method: str
    template_sha256: str
    schema_version: int
    score: float
    label_mass: float | None = None
    # How the score was obtained: "top-k" (the item's own request), a recovery rung's name
    # (`experts._recovery`), or "likelihood". Added after the first caches: see `_add_how`.
    how: str = Field(default="top-k", sa_column_kwargs={"server_default": "top-k"})
    response: str  # the raw answer, as JSON
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float
    created: datetime


class FailureRow(SQLModel, table=True):
    __tablename__ = "failures"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(index=True)
    expert: str = Field(index=True)
    item_id: str
    reason: str
    message: str
    attempts: int
    created: datetime


class ClaimRow(SQLModel, table=True):
    """An item some run is asking the expert about: its key, who holds it and until when.
    Rows live only while their item is in flight, so the table stays small."""

    __tablename__ = "claims"

    key: str = Field(primary_key=True)
    expert: str
    item_id: str
    owner: str  # one run (a uuid)
    host: str
    pid: int
    expires: float  # unix seconds: the lease, renewed while the holder runs


class BatchOutRow(SQLModel, table=True):
    """A request written to a batch file (`ctd query --batch-out`) whose result no `--batch-in`
    has read back yet: a second batch file leaves it out, so the same request is not paid twice."""

    __tablename__ = "batch_out"

    key: str = Field(primary_key=True)
    expert: str
    item_id: str
    file: str  # the batch file's absolute path when it was written
    created: datetime


@dataclass(frozen=True, kw_only=True)
class CacheKey:
    """What an answer depends on. Left out on purpose: the API key, timeouts, rate limits,
    retry settings and which replica answered (none of them changes the answer)."""

    endpoint: str  # the expert's base URLs, sorted and joined
    model: str  # served model name
    method: str
    labels: Mapping[str, str]
    template_sha256: str
    body: Mapping[str, Any]  # the full request (path and bodies) as sent, defaults included

    def digest(self) -> str:
        material = {
            "schema": SCHEMA_VERSION,
            "endpoint": self.endpoint,
            "model": self.model,
            "method": self.method,
            "labels": dict(self.labels),
            "template": self.template_sha256,
            "body": self.body,
        }
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedScore:
    score: float
    label_mass: float | None
    how: str = "top-k"


HOW_OF_OLD_ROWS = "CASE method WHEN 'likelihood' THEN 'likelihood' ELSE 'top-k' END"
"""SQL for the `how` of a row stored before the column existed: every such answer came from the
item's own request (next-token: "top-k"; likelihood scoring: "likelihood")."""


def score_columns_sql(present: Iterable[str]) -> str:
    """The SELECT list of every `ScoreRow` column, in order, for a scores table that has the
    columns `present`: one written before `how` existed gets `HOW_OF_OLD_ROWS` in its place (a
    merge or salvage of an old cache must carry its rows' `how` as a migration would)."""
    present = set(present)
    return ", ".join(
        f'"{name}"' if name in present or name != "how" else f"{HOW_OF_OLD_ROWS} AS how"
        for name in ScoreRow.model_fields
    )


def batch_tag(file: str, created: str) -> str:
    """The id of one `--batch-out`'s batch: 12 hex digits of the sha256 of its file's absolute
    path and the time of its record (`batch_out.created`, as stored). Each custom_id of its lines
    ends in `@TAG`, so that a result line releases only the record of the batch that asked it: a
    results file read again, or arriving after its batch was released and written anew, leaves the
    newer batch's record alone."""
    return hashlib.sha256(f"{file}\n{created}".encode()).hexdigest()[:12]


def batch_file_shown(file: str, requests: int | None = None) -> str:
    """`file` as a message names a batch file: with its number of `requests` where given, marked
    when no such file is here (a `--batch-out` stopped between its record and its rename, say,
    or a file moved since)."""
    notes = [] if requests is None else [str(requests)]
    notes += [] if os.path.exists(file) else ["not found here"]
    return f"{file} ({', '.join(notes)})" if notes else file


def release_batch_command(file: str, cache: Path) -> str:
    """The command that lets the requests of batch file `file`, recorded out in the cache at
    `cache`, be asked again."""
    return f"`ctd cache release-batch {file} --cache {cache}`"


@contextmanager
def _immediate(cache: ScoreCache) -> Iterator[Any]:
    """A cursor inside one write transaction, begun IMMEDIATE: the write lock is taken before
    the first read, so no other run can claim or answer a key between our look and our write
    (and two runs never deadlock upgrading a read to a write)."""
    # storage_errors: a full disk, a lock held past the busy timeout and a damaged page are one
    # StorageError here, as at every read and write of the cache.
    with storage_errors(cache.path), cache.write_lock:  # our writers take turns without busy sleeps
        connection = cache.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
            except BaseException:
                connection.rollback()
                raise
            connection.commit()
        finally:
            connection.close()


def _recording_problem(cursor: Any, keys: Sequence[str], file: str, cache: Path) -> str | None:
    """Why the keys of batch file `file` cannot be recorded as out now in the cache at `cache`
    (see `mark_batch_out`)."""
    held = cursor.execute("SELECT COUNT(*) FROM batch_out WHERE file = ?", (file,)).fetchone()[0]
    if held:
        return (
            f"{batch_file_shown(file)} names {held} requests of another batch still out: give this "
            f"batch another name, or if that batch was never submitted, {release_batch_command(file, cache)} "
            "first lets its requests be asked again"
        )
    others: Counter[str] = Counter()
    answered = claimed = 0
    now = time.time()
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        marks = ",".join("?" * len(chunk))
        others.update(
            f for (f,) in cursor.execute(f"SELECT file FROM batch_out WHERE key IN ({marks})", chunk)
        )
        answered += cursor.execute(f"SELECT COUNT(*) FROM scores WHERE key IN ({marks})", chunk).fetchone()[0]
        claimed += cursor.execute(
            f"SELECT COUNT(*) FROM claims WHERE key IN ({marks}) AND expires > ?", [*chunk, now]
        ).fetchone()[0]
    if others:
        named = ", ".join(f"{f} ({n})" for f, n in sorted(others.items()))
        return f"another --batch-out wrote {sum(others.values())} of these requests meanwhile, to {named}"
    if answered:
        return f"{answered} of these requests were answered meanwhile"
    if claimed:
        return f"a live run is asking {claimed} of these requests now"
    return None


def _sqlite_pragmas(busy_timeout: float) -> Callable[[Any, Any], None]:
    """The settings of every connection to the cache, for the engine's "connect" event."""

    def apply(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        _use_wal(cursor, within=busy_timeout)  # readers never block the writer
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint; safe with WAL
        cursor.close()

    return apply


def _use_wal(cursor: Any, *, within: float) -> None:
    """Switch the file to WAL (it stays so). The switch needs the file to itself and SQLite
    does not wait for that: when two runs open a new cache at the same moment, one of them
    hears "database is locked" and tries again shortly, for at most `within` seconds (the busy
    timeout: a lock held longer is another process's, and the error says so)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            if cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("could not switch the cache to WAL: database is locked")
        time.sleep(0.05)


def _refuse_foreign(path: Path) -> None:
    """ConfigError when `path` is an SQLite database of something else (tables, but no table of
    answers keyed as this project keys them), read without writing it: opening it as the cache
    would switch it to WAL and add this project's tables to it, even for a command that only
    reads. A new file, an empty database and a cache of any version pass."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        # timeout 0: a file another process holds locked is left to the open below, which waits
        # for it as long as the caller said and names the lock when it does not end
        with closing(
            sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=0)
        ) as db:
            tables = sorted(
                name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(scores)")}
    except sqlite3.Error:  # not a database, damaged, or not readable here: the open below says which
        return
    if tables and not {"key", "score"} <= columns:
        raise ConfigError(
            f"{path}: not a ctd cache (an SQLite database holding {', '.join(tables[:3])}"
            f"{', ...' if len(tables) > 3 else ''}): give --cache (or $CTD_CACHE) another file"
        )


class ScoreCache:
    """Get and put rows of one SQLite file. Safe to share between the event loop (reads) and the
    writer's thread (writes). Every failure of the file (full, read-only, locked, damaged) is a
    StorageError naming it; `for_run` also checks, before a run pays for anything, that the file
    can be written and is not damaged."""

    def __init__(self, path: Path | str, *, busy_timeout: float = 30.0) -> None:
        """Open (or create) the cache at `path`; `busy_timeout` is how long to wait for another
        process's lock on it. A path that cannot be a cache (a folder, a file that is not SQLite)
        is a ConfigError; a file system that refuses it is a StorageError."""
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        if self.path.is_dir():
            raise ConfigError(f"{self.path}: is a folder, expected the cache's SQLite file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"{self.path}: a file stands where its folder should be") from None
        except OSError as exc:
            if storage_kind(exc) != "other":  # a read-only mount, no permission: the machine
                raise StorageError(
                    f"{self.path}: cannot create its folder ({exc.strerror or exc})",
                    path=self.path,
                    kind=storage_kind(exc),
                ) from None
            raise ConfigError(f"{self.path}: cannot create its folder ({exc.strerror or exc})") from None
        _refuse_foreign(self.path)
        self.engine = create_engine(
            f"sqlite:///{self.path}", connect_args={"check_same_thread": False, "timeout": busy_timeout}
        )
        event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout))
        # This process's writers (the cache writer, the claims) take turns here: SQLite's own
        # busy wait between two connections sleeps in steps of milliseconds, which would stall
        # every worker waiting on a commit.
        self.write_lock = threading.Lock()
        try:
            with storage_errors(self.path):
                self._create_tables()
                self.how_column = self._add_how()
        except StorageError as exc:
            self.engine.dispose()
            if "file is not a database" in str(exc):  # met at open: the wrong file, not a damaged cache
                raise ConfigError(
                    f"{self.path}: cannot be used as the cache (file is not a database)"
                ) from None
            raise

    @classmethod
    def for_run(
        cls, path: Path | str, *, check_seconds: float = CHECK_SECONDS, busy_timeout: float = 30.0
    ) -> ScoreCache:
        """The cache a run will write, checked before anything is paid (see `experts._storage`):
        writable (the OS's reason when not), room on its device, its pages sound as far as
        `check_seconds` of `PRAGMA quick_check` reach, and no other process holding its lock."""
        check_place(Path(path))
        cache = cls(path, busy_timeout=busy_timeout)
        try:
            connection = cache.engine.raw_connection()
            try:
                check_pages(connection.driver_connection, cache.path, seconds=check_seconds)
                with cache.write_lock:
                    probe_write(connection, cache.path)
            finally:
                connection.close()
        except BaseException:
            cache.close()
            raise
        return cache

    def _create_tables(self) -> None:
        """Create the missing tables (an older cache gains the new ones) under the write lock:
        two runs started together on a new file would otherwise race between "is it there?"
        and "create it", and the loser would fail with "table already exists". A cache that
        has them all is only read, and one this process may not write (a read-only file) is
        read as it is: what writes to it fails there, with the file system's reason."""
        with self.engine.connect() as connection:
            names = connection.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")
            if set(SQLModel.metadata.tables) <= {name for (name,) in names}:
                return
            connection.rollback()
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                SQLModel.metadata.create_all(connection)
                connection.commit()
            except DBAPIError as exc:
                if "readonly" not in str(exc.orig).replace(" ", "").lower():
                    raise
                connection.rollback()

    def _add_how(self) -> str:
        """Migrate a cache written before the `how` column, in place: add it and fill it for the
        rows already there (`HOW_OF_OLD_ROWS`), in one transaction under the write lock. Returns
        the SQL that reads a row's `how`: the column, or, for an old cache this process may not
        write (a read-only file), the expression that the migration would have stored."""
        with self.engine.connect() as connection:
            columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(scores)")}
            if "how" in columns:
                return "how"
            connection.rollback()
            try:
                with self.write_lock:
                    connection.exec_driver_sql("BEGIN IMMEDIATE")
                    columns = {row[1] for row in connection.exec_driver_sql("PRAGMA table_info(scores)")}
                    if "how" not in columns:  # another process may have migrated it meanwhile
                        connection.exec_driver_sql(
                            "ALTER TABLE scores ADD COLUMN how VARCHAR NOT NULL DEFAULT 'top-k'"
                        )
                        connection.exec_driver_sql(f"UPDATE scores SET how = {HOW_OF_OLD_ROWS}")
                    connection.commit()
            except DBAPIError as exc:
                if "readonly" not in str(exc.orig).replace(" ", "").lower():
                    raise
                connection.rollback()
                return HOW_OF_OLD_ROWS
        return "how"

    def get_many(self, keys: Sequence[str]) -> dict[str, CachedScore]:
        """The cached scores among `keys` (looked up 500 at a time)."""
        rows = self._rows(f"score, label_mass, {self.how_column}", keys)
        return {key: CachedScore(score, mass, how) for key, score, mass, how in rows}

    def responses(self, keys: Sequence[str]) -> dict[str, str]:
        """The raw stored answers (JSON text) among `keys` (looked up 500 at a time)."""
        return dict(self._rows("response", keys))

    def _rows(self, columns: str, keys: Sequence[str], table: str = "scores") -> list[tuple[Any, ...]]:
        """(key, *columns) of the rows of `table` (the stored scores) among `keys`, 500 keys per query."""
        rows: list[tuple[Any, ...]] = []
        # The hot path of a resumed run: plain SQL on the driver connection, no ORM objects.
        with storage_errors(self.path):
            connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            with storage_errors(self.path):  # a damaged page is met here, mid-run
                for start in range(0, len(keys), 500):
                    chunk = list(keys[start : start + 500])
                    marks = ",".join("?" * len(chunk))
                    cursor.execute(f"SELECT key, {columns} FROM {table} WHERE key IN ({marks})", chunk)
                    rows += cursor.fetchall()
                cursor.close()
        finally:
            connection.close()
        return rows

    def put_many(
        self,
        scores: Iterable[dict[str, Any]],
        failures: Iterable[dict[str, Any]] = (),
        *,
        release_owner: str | None = None,
    ) -> None:
        """Insert rows (dicts of column values) in one transaction; a key already stored keeps
        its first answer, and an answered key is no longer out in a batch file. With
        `release_owner`, that run's claims on the rows' keys are deleted in the same transaction,
        so no other run ever sees an item neither claimed nor stored."""
        scores, failures = list(scores), list(failures)
        with storage_errors(self.path), self.write_lock, Session(self.engine) as session:
            if scores:
                session.execute(insert(ScoreRow).prefix_with("OR IGNORE"), scores)
                answered = [(row["key"],) for row in scores]
                session.connection().exec_driver_sql("DELETE FROM batch_out WHERE key = ?", answered)
            if failures:
                session.execute(insert(FailureRow), failures)
            if release_owner is not None:
                # Plain SQL: this runs at every commit of a run, and compiling an ORM delete
                # with an IN list each time costs more than the delete.
                released = sorted({(row["key"], release_owner) for row in (*scores, *failures)})
                if released:
                    session.connection().exec_driver_sql(
                        "DELETE FROM claims WHERE key = ? AND owner = ?", released
                    )
            session.commit()

    def batch_files(self, keys: Sequence[str]) -> dict[str, str]:
        """The keys among `keys` out in a batch file no `--batch-in` has read back: key -> file."""
        return dict(self._rows("file", keys, table="batch_out"))

    def batch_tags(self, keys: Sequence[str]) -> dict[str, str]:
        """The keys among `keys` out in a batch file: key -> the `batch_tag` of the batch that holds it."""
        rows = self._rows("file, created", keys, table="batch_out")
        return {key: batch_tag(file, created) for key, file, created in rows}

    def mark_batch_out(self, rows: Sequence[dict[str, Any]], file: str) -> str | None:
        """Record `BatchOutRow`s (dicts of column values, all of batch file `file`) in one
        transaction that holds the write lock from its first read, so that what this process saw
        when it wrote the file still holds: None once recorded; else nothing is recorded and the
        reason is returned: `file` names requests of another batch still out (the name is reused
        before that batch was read back), some keys were recorded out in another file meanwhile
        (two `--batch-out` at once), answered meanwhile, or are being asked by a live run now."""
        columns = list(BatchOutRow.model_fields)
        values = [tuple(row[column] for column in columns) for row in rows]
        with _immediate(self) as cursor:  # with a problem nothing was written: its commit is empty
            problem = _recording_problem(cursor, [value[0] for value in values], file, self.path)
            if problem is None:
                names, marks = ", ".join(columns), ", ".join("?" * len(columns))
                cursor.executemany(f"INSERT INTO batch_out ({names}) VALUES ({marks})", values)
        return problem

    def release_batch(self, file: str) -> int:
        """Forget that the requests of the batch file `file` (its absolute path) are out: a batch
        never submitted, failed or expired. Returns how many were."""
        with storage_errors(self.path), self.write_lock, Session(self.engine) as session:
            released = session.connection().exec_driver_sql("DELETE FROM batch_out WHERE file = ?", (file,))
            session.commit()
            return int(released.rowcount)

    def batch_files_out(self) -> dict[str, int]:
        """Every batch file with requests out: file -> how many."""
        with storage_errors(self.path), Session(self.engine) as session:
            found = session.connection().exec_driver_sql("SELECT file, COUNT(*) FROM batch_out GROUP BY file")
            return {file: int(n) for file, n in found}

    def pending_files(self, keys: Sequence[str]) -> dict[str, int]:
        """The batch files holding requests of `keys` that are out: file -> how many."""
        files = Counter(self.batch_files(keys).values())
        return dict(files)

    def clear_batch_out(self, keys: Sequence[str]) -> None:
        """Forget that `keys` are out in a batch file (their results were read back), 500 keys a
        transaction (another run on the cache waits on each briefly)."""
        for start in range(0, len(keys), 500):
            chunk = tuple(keys[start : start + 500])
            marks = ",".join("?" * len(chunk))
            with storage_errors(self.path), self.write_lock, Session(self.engine) as session:
                session.connection().exec_driver_sql(f"DELETE FROM batch_out WHERE key IN ({marks})", chunk)
                session.commit()

    def release_batches(self, held: Mapping[str, str]) -> None:
        """Forget that the keys of `held` (key -> `batch_tag`) are out, each only while the batch
        of that tag still holds it: a `--batch-out` that recorded one meanwhile keeps its record.
        500 keys a transaction, each holding the write lock from its first read."""
        pairs = sorted(held.items())
        for start in range(0, len(pairs), 500):
            chunk = dict(pairs[start : start + 500])
            marks = ",".join("?" * len(chunk))
            with _immediate(self) as cursor:
                found = cursor.execute(
                    f"SELECT key, file, created FROM batch_out WHERE key IN ({marks})", list(chunk)
                ).fetchall()
                gone = [(key,) for key, file, created in found if batch_tag(file, created) == chunk[key]]
                cursor.executemany("DELETE FROM batch_out WHERE key = ?", gone)

    def counts(self) -> dict[str, dict[str, int]]:
        """{expert: {"scores": n, "failures": m, "batch_out": k}} (k: requests out in batch files;
        0 in a cache older than that table, which this process could not add)."""
        out: dict[str, dict[str, int]] = {}
        tables: list[Any] = [ScoreRow, FailureRow]
        with storage_errors(self.path), Session(self.engine) as session:
            present = {
                name
                for (name,) in session.connection().exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            }
            tables += [BatchOutRow] if BatchOutRow.__tablename__ in present else []
            for table in tables:
                for expert, n in session.exec(select(table.expert, func.count()).group_by(table.expert)):
                    out.setdefault(expert, dict.fromkeys(("scores", "failures", "batch_out"), 0))[
                        table.__tablename__
                    ] = n
        return out

    def _select_scores(self) -> Any:
        """SELECT of whole `ScoreRow`s; on an old cache this process could not migrate (a
        read-only file), without the `how` it lacks (`_with_how` fills it in)."""
        query = select(ScoreRow)
        return query if self.how_column == "how" else query.options(defer(ScoreRow.how))  # type: ignore[arg-type]

    def _with_how(self, row: ScoreRow) -> ScoreRow:
        """`row` with the `how` a migration would store, where the file has no such column."""
        if self.how_column != "how":
            set_committed_value(row, "how", "likelihood" if row.method == "likelihood" else "top-k")
        return row

    def rows(self, expert: str | None = None) -> Iterable[ScoreRow]:
        with storage_errors(self.path), Session(self.engine) as session:
            query = self._select_scores()
            if expert is not None:
                query = query.where(ScoreRow.expert == expert)
            for row in session.exec(query.order_by(ScoreRow.created)):
                yield self._with_how(row)

    def failed_keys(self, keys: Sequence[str], reasons: Iterable[str]) -> set[str]:
        """The keys among `keys` with a recorded failure for one of `reasons`."""
        wanted = frozenset(reasons)
        return {key for key, reason in self._rows("reason", keys, table="failures") if reason in wanted}

    def lookup_item(self, item_id: str) -> tuple[list[ScoreRow], list[FailureRow]]:
        with storage_errors(self.path), Session(self.engine) as session:
            query = self._select_scores().where(ScoreRow.item_id == item_id)
            scores = [self._with_how(row) for row in session.exec(query)]
            failures = list(session.exec(select(FailureRow).where(FailureRow.item_id == item_id)))
        return scores, failures

    def integrity_check(self) -> str:
        with storage_errors(self.path), self.engine.connect() as connection:
            return str(connection.exec_driver_sql("PRAGMA integrity_check").scalar())

    def close(self) -> None:
        self.engine.dispose()


def now() -> datetime:
    return datetime.now(UTC)
