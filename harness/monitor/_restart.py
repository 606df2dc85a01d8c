"""A scorer process started again when it dies (the kernel's out-of-memory killer, a crash in
native code), so that the monitor's state (its budget's count of delegations, its drift detector,
its decision log) outlives it. While the new process loads the model, checks answer 503 with a
Retry-After of about that long, and /healthz says so. A process that keeps dying (more than
`RESTARTS` deaths in `RESTART_WINDOW` seconds) or cannot be started again (an error, or not ready
within `START_TIMEOUT` or ten times the first load, whichever is longer) is not tried again: the
monitor must be restarted, as before. A pass that fails in a live process (a CUDA error, CUDA's
out of memory) fails its batch alone and restarts nothing, unless the GPU no longer answers after
it (a lost CUDA context: an illegal memory access, a device-side assert): then the process ends
(`DEVICE_LOST`) and is started again like any that died."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ._engine import Outcome, ProcessScorer, ScorerGone, scorer_ended

if TYPE_CHECKING:
    from probes import Conversation

    from ._scorer import PassCost

__all__ = ["RESTARTS", "RESTART_WINDOW", "RestartingScorer"]

log = logging.getLogger("ctd.monitor")
RESTARTS = 3  # deaths started again within RESTART_WINDOW; one more and the monitor must be restarted
RESTART_WINDOW = 600.0
START_TIMEOUT = 300.0  # seconds a new process may take to load, at least (a hung GPU, a stuck disk)


class RestartingScorer:
    """A `ProcessScorer` whose process is started again (`start()`, as the first was) when it
    dies. It scores, says where and what a pass costs, as the process it runs now does."""

    def __init__(
        self,
        first: ProcessScorer,
        start: Callable[[], Awaitable[ProcessScorer]],
        *,
        load_seconds: float,
        restarts: int = RESTARTS,
        window: float = RESTART_WINDOW,
    ) -> None:
        self._current = first
        self._start = start
        self._retry_after = max(1, math.ceil(load_seconds))  # a restart takes about as long as a load
        self._start_timeout = max(START_TIMEOUT, 10 * load_seconds)
        self._restarts, self._window = restarts, window
        self._deaths: list[float] = []
        self._why: str | None = None  # while restarting, or once given up: what /healthz says
        self._given_up = False
        self._restarting: asyncio.Task[None] | None = None
        self._closing = False
        first.on_gone = self._died

    @property
    def where(self) -> str:
        return self._current.where

    @property
    def pass_cost(self) -> PassCost | None:
        return self._current.pass_cost

    @property
    def gone(self) -> str | None:
        return self._why

    async def score(self, conversations: list[Conversation]) -> tuple[list[Outcome], float]:
        if self._why is not None:
            raise self._unavailable()
        try:
            return await self._current.score(conversations)
        except ScorerGone:  # it died under this batch: say what happens now
            raise self._unavailable() from None

    def _unavailable(self) -> ScorerGone:
        why = self._why or "the scorer process ended; restarting it"
        return ScorerGone(why, retry_after=60 if self._given_up else self._retry_after)

    def _died(self, exitcode: int | None) -> None:
        """Told by the process that ended (in the event loop): start another, unless it keeps dying."""
        if self._closing:
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self._window] + [now]
        ended = scorer_ended(exitcode)
        if len(self._deaths) > self._restarts:
            minutes = f"{self._window / 60:g} minutes"
            self._why = f"{ended}, {len(self._deaths)} times in {minutes}; restart the monitor"
            self._given_up = True
            log.error(self._why)
            return
        self._why = f"{ended}; restarting it"
        log.error(self._why)
        self._restarting = asyncio.get_running_loop().create_task(self._restart(ended))
        self._restarting.add_done_callback(_log_failure)

    async def _restart(self, ended: str) -> None:
        try:
            # The dead one first: its pipe and reader thread, and the process killed if it
            # lingers (its pipe ended, it has not exited), so that its GPU memory can be freed.
            await self._current.aclose()
            fresh = await asyncio.wait_for(self._start(), self._start_timeout)
        except TimeoutError:  # the load is cancelled: `ProcessScorer.start` kills the process
            self._give_up(f"{ended} and was not ready again within {self._start_timeout:.0f} s")
            return
        except Exception as error:
            self._give_up(f"{ended} and could not be started again ({error})")
            return
        fresh.on_gone = self._died
        self._current = fresh
        self._why = None
        if fresh.gone is not None:  # it died before it could be told to say so
            self._died(fresh.exitcode)
            return
        log.warning("the scorer process is back: scoring %s", fresh.where)

    def _give_up(self, why: str) -> None:
        self._why = f"{why}; restart the monitor"
        self._given_up = True
        log.error(self._why)

    async def aclose(self) -> None:
        self._closing = True
        if self._restarting is not None:
            self._restarting.cancel()  # a process still loading is killed (`ProcessScorer.start`)
            with contextlib.suppress(asyncio.CancelledError, Exception):  # logged by `_log_failure`
                await self._restarting
        await self._current.aclose()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("restarting the scorer process failed", exc_info=task.exception())
