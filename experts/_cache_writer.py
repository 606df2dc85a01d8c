"""The single writer of a client's answers: rows handed over by the workers are committed in
groups, one transaction in a thread at a time, each worker resuming once its row is durable."""

from __future__ import annotations

import asyncio
from typing import Any

from ._cache import ScoreCache
from ._errors import StorageError

__all__ = ["CacheWriter"]


class CacheWriter:
    """The single writer, committing in groups: a worker hands over its row and resumes once the
    row is committed. The writer takes everything queued at that moment (up to `batch` rows)
    as one transaction in a thread, so the event loop never waits on the disk. Since no worker
    starts its next item before its answer is durable, a crash or kill -9 loses at most the
    answers of the items in flight (one per worker), and the queue never holds more than that."""

    def __init__(self, cache: ScoreCache, *, batch: int = 512, release_owner: str | None = None) -> None:
        self.cache = cache
        self.batch = batch
        self.release_owner = release_owner  # the run whose claims each commit releases
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
        if self._task is not None and self._task.done() and not self._task.cancelled():
            died = self._task.exception()
            if isinstance(died, StorageError):  # a long-lived client's later calls hear it too
                raise died.restated(str(died))
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
                    await asyncio.to_thread(
                        self.cache.put_many, scores, failures, release_owner=self.release_owner
                    )
                except StorageError:
                    await self._commit_one_by_one(entries)  # raises unless every row fits alone
                except Exception as exc:  # every waiting worker hears of it
                    for _, _, committed in entries:
                        if not committed.done():
                            committed.set_exception(exc)
                    raise
                else:
                    self.committed += len(scores)
                    for _, _, committed in entries:
                        if not committed.done():
                            committed.set_result(None)
            if None in group:
                return

    async def _commit_one_by_one(
        self, entries: list[tuple[str, dict[str, Any], asyncio.Future[None]]]
    ) -> None:
        """The group's transaction failed to write: paid answers first, try each row on its own
        (a row may still fit where the group did not), then raise what stopped the rest."""
        first_error: StorageError | None = None
        lost = 0
        for kind, row, committed in sorted(entries, key=lambda entry: entry[0] != "score"):
            try:
                scores, failures = ([row], []) if kind == "score" else ([], [row])
                await asyncio.to_thread(
                    self.cache.put_many, scores, failures, release_owner=self.release_owner
                )
            except StorageError as exc:
                first_error = first_error or exc
                lost += kind == "score"
                if not committed.done():  # its worker may be cancelled by now
                    committed.set_exception(exc)
                continue
            self.committed += kind == "score"
            if not committed.done():
                committed.set_result(None)
        if first_error is not None:
            raise first_error.restated(
                f"{first_error} ({lost} answer(s) waiting to commit could not be stored)"
            )

    async def close(self) -> None:
        """Commit everything handed over, then stop."""
        if self._task is None:
            return
        if not self._task.done():
            self._queue.put_nowait(None)
        await self._task
        self._task = None
