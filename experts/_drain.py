"""A bounded stop of one `ExpertClient`: the answers in flight are waited for and committed.

Cancelling a run outright throws away every request in flight: each was paid for, and a resume
pays for it again. `ExpertClient.drain()` stops instead in three steps:

1. nothing new is sent: the producer stops queueing, and every worker that is not inside an
   attempt (waiting for an item, a limiter's RPM/TPM turn, a concurrency slot, or a retry's
   backoff: it has sent nothing) is cancelled at once;
2. an attempt under way (its requests sent, its outcome not yet committed) may finish for up
   to `grace` seconds: its answer or failure is committed like any other, then its worker ends
   instead of starting another attempt or item;
3. whatever is still under way when the grace runs out (or when `drain` is called again) is
   cancelled, and the `score` calls end with `Stopped`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["DRAIN_GRACE", "Drain", "Stopped"]

DRAIN_GRACE = 5.0  # seconds the answers in flight get to arrive once a stop is asked for


class Stopped(Exception):
    """`ExpertClient.score` ended early because `drain()` was called. The answers that arrived
    are committed to the cache (a rerun reads them back); items not answered were released."""


class Drain:
    """One client's stop: the tasks of its `score` calls in progress and, of those, the ones
    inside an attempt. Used from the client's event loop only (a signal handler installed with
    `loop.add_signal_handler` runs there)."""

    def __init__(self) -> None:
        self.asked = False
        self.grace = DRAIN_GRACE
        self._tasks: set[asyncio.Task[None]] = set()  # producers and workers of calls in progress
        self._sending: set[asyncio.Task[None]] = set()  # of those, the ones inside an attempt
        self._timer: asyncio.TimerHandle | None = None

    def ask(self, grace: float = DRAIN_GRACE) -> int:
        """Stop sending and give the attempts under way `grace` seconds; called again, cancel
        them now. Returns how many attempts are under way (answers in flight)."""
        in_flight = len(self._sending)
        if self.asked or grace <= 0:
            self.asked = True
            self._cancel(self._tasks)
            return in_flight
        self.asked, self.grace = True, grace
        self._cancel(self._tasks - self._sending)  # they have sent nothing
        self._timer = asyncio.get_running_loop().call_later(grace, self._cancel, self._tasks)
        return in_flight

    def check(self) -> None:
        """Raise `Stopped` once a stop was asked: called where a worker would start something
        new (an attempt, a retry's wait, its next item)."""
        if self.asked:
            raise Stopped("stopped: the client was drained")

    def sending(self) -> None:
        """The current task's attempt is about to send: from here a stop lets it finish."""
        self.check()
        self._sending.add(asyncio.current_task())  # type: ignore[arg-type]

    def settled(self) -> None:
        """The current task's attempt is over (its outcome committed, or it will retry)."""
        self._sending.discard(asyncio.current_task())  # type: ignore[arg-type]

    def watch(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        self._tasks.update(tasks)

    def unwatch(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        self._tasks.difference_update(tasks)
        self._sending.difference_update(tasks)
        if not self._tasks and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @staticmethod
    def _cancel(tasks: set[asyncio.Task[None]]) -> None:
        for task in list(tasks):
            task.cancel()
