"""The SQLite cache and ledger of expert answers (through sqlmodel).

`scores` holds one row per successful answer, keyed by a hash of everything that can change
the answer; `failures` records items that failed after their retries, with the reason. A
failure is never a cache hit: resuming retries it. Writes go through one `CacheWriter` task
that commits in short batches, so a crash loses at most the answers of the last batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, insert
from sqlalchemy.exc import DBAPIError
from sqlmodel import Field, Session, SQLModel, create_engine, select

from ._errors import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "CacheKey",
    "CacheWriter",
    "FailureRow",
    "ScoreCache",
    "ScoreRow",
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


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint; safe with WAL
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


class ScoreCache:
    """Get and put rows of one SQLite file. Safe to share between the event loop (reads) and the
    writer's thread (writes)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"{self.path}: is a folder, expected the cache's SQLite file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"{self.path}: a file stands where its folder should be") from None
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot create its folder ({exc.strerror or exc})") from None
        self.engine = create_engine(
            f"sqlite:///{self.path}", connect_args={"check_same_thread": False, "timeout": 30}
        )
        event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            SQLModel.metadata.create_all(self.engine)
        except DBAPIError as exc:  # not SQLite, unreadable, or no room to create the tables
            self.engine.dispose()
            raise ConfigError(f"{self.path}: cannot be used as the cache ({exc.orig})") from None

    def get_many(self, keys: Sequence[str]) -> dict[str, CachedScore]:
        """The cached scores among `keys` (looked up 500 at a time)."""
        found: dict[str, CachedScore] = {}
        # The hot path of a resumed run: plain SQL on the driver connection, no ORM objects.
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                cursor.execute(f"SELECT key, score, label_mass FROM scores WHERE key IN ({marks})", chunk)
                for key, score, mass in cursor.fetchall():
                    found[key] = CachedScore(score, mass)
            cursor.close()
        finally:
            connection.close()
        return found

    def put_many(self, scores: Iterable[dict[str, Any]], failures: Iterable[dict[str, Any]] = ()) -> None:
        """Insert rows (dicts of column values) in one transaction; a key already stored keeps
        its first answer."""
        scores, failures = list(scores), list(failures)
        with Session(self.engine) as session:
            if scores:
                session.execute(insert(ScoreRow).prefix_with("OR IGNORE"), scores)
            if failures:
                session.execute(insert(FailureRow), failures)
            session.commit()

    def counts(self) -> dict[str, dict[str, int]]:
        """{expert: {"scores": n, "failures": m}}."""
        out: dict[str, dict[str, int]] = {}
        with Session(self.engine) as session:
            for expert, n in session.exec(select(ScoreRow.expert, func.count()).group_by(ScoreRow.expert)):
                out.setdefault(expert, {"scores": 0, "failures": 0})["scores"] = n
            for expert, n in session.exec(
                select(FailureRow.expert, func.count()).group_by(FailureRow.expert)
            ):
                out.setdefault(expert, {"scores": 0, "failures": 0})["failures"] = n
        return out

    def rows(self, expert: str | None = None) -> Iterable[ScoreRow]:
        with Session(self.engine) as session:
            query = select(ScoreRow)
            if expert is not None:
                query = query.where(ScoreRow.expert == expert)
            yield from session.exec(query.order_by(ScoreRow.created))

    def lookup_item(self, item_id: str) -> tuple[list[ScoreRow], list[FailureRow]]:
        with Session(self.engine) as session:
            scores = list(session.exec(select(ScoreRow).where(ScoreRow.item_id == item_id)))
            failures = list(session.exec(select(FailureRow).where(FailureRow.item_id == item_id)))
        return scores, failures

    def integrity_check(self) -> str:
        with self.engine.connect() as connection:
            return str(connection.exec_driver_sql("PRAGMA integrity_check").scalar())

    def close(self) -> None:
        self.engine.dispose()


def now() -> datetime:
    return datetime.now(UTC)


class CacheWriter:
    """The single writer, committing in groups: a worker hands over its row and resumes once the
    row is committed. The writer takes everything queued at that moment (up to `batch` rows)
    as one transaction in a thread, so the event loop never waits on the disk. Since no worker
    starts its next item before its answer is durable, a crash or kill -9 loses at most the
    answers of the items in flight (one per worker), and the queue never holds more than that."""

    def __init__(self, cache: ScoreCache, *, batch: int = 512) -> None:
        self.cache = cache
        self.batch = batch
        self._queue: asyncio.Queue[tuple[str, dict[str, Any], asyncio.Future[None]] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.committed = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cache-writer")

    async def put_score(self, row: dict[str, Any]) -> None:
        """Returns once the row is committed (raises if the commit failed)."""
        await self._submit("score", row)

    async def put_failure(self, row: dict[str, Any]) -> None:
        await self._submit("failure", row)

    async def _submit(self, kind: str, row: dict[str, Any]) -> None:
        if self._task is None or self._task.done():
            raise RuntimeError("the cache writer is not running")
        committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((kind, row, committed))
        await committed

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            group = [first]
            while len(group) < self.batch and not self._queue.empty():
                group.append(self._queue.get_nowait())
            entries = [entry for entry in group if entry is not None]
            if entries:
                scores = [row for kind, row, _ in entries if kind == "score"]
                failures = [row for kind, row, _ in entries if kind == "failure"]
                try:
                    await asyncio.to_thread(self.cache.put_many, scores, failures)
                except Exception as exc:  # the disk failed: every waiting worker hears of it
                    for _, _, committed in entries:
                        if not committed.done():
                            committed.set_exception(exc)
                    raise
                self.committed += len(scores)
                for _, _, committed in entries:
                    if not committed.done():
                        committed.set_result(None)
            if None in group:
                return

    async def close(self) -> None:
        """Commit everything handed over, then stop."""
        if self._task is None:
            return
        if not self._task.done():
            self._queue.put_nowait(None)
        await self._task
        self._task = None
