"""Micro-batching: concurrent callers each submit one item; a background task gathers the items
that arrive within a bounded wait (or up to a batch size) and hands them to one call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """`await submit(item)` returns `run(batch)[position]` for the batch the item went into.

    A batch closes when it holds `max_batch` items or `max_wait` seconds after its first item
    arrived; while `concurrency` batches are running, new items keep gathering, so under load the
    batches grow by themselves and an idle caller waits at most `max_wait`. An exception raised by
    `run` is raised in every caller of that batch (the batch fails together, never silently)."""

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_batch: int,
        max_wait: float,
        concurrency: int = 1,
    ) -> None:
        if max_batch < 1 or max_wait < 0 or concurrency < 1:
            raise ValueError("max_batch and concurrency must be at least 1, max_wait at least 0")
        self._run = run
        self.max_batch = max_batch
        self.max_wait = max_wait
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(concurrency)
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0  # batches run so far
        self.items = 0  # items in them

    async def submit(self, item: T) -> R:
        if self._task is None:
            self._task = asyncio.create_task(self._gather(), name="micro-batcher")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future))
        return await future

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            await self._slots.acquire()  # a batch keeps filling while the previous ones run
            batch = [first]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                    continue
                except asyncio.QueueEmpty:
                    pass
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), left))
                except TimeoutError:
                    break
            task = asyncio.create_task(self._finish(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _finish(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            self.batches += 1
            self.items += len(batch)
            results = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items got {len(results)} results")
        except BaseException as error:  # every caller hears of it; none is left waiting
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(error, Exception):
                raise
        else:
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        tasks = [t for t in (self._task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
