"""Stop signals (SIGTERM, and SIGINT unless ignored) handled inside a running event loop.

Outside an event loop a stop signal raises KeyboardInterrupt where the code happens to be
(`harness.cli._app._terminate`), as Ctrl-C does. Inside one that is unsafe: raised in the middle of
asyncio's own machinery (a callback, a task switch) it can end as a traceback rather than a
clean stop, and asyncio.run only guards SIGINT, and only when SIGINT is not ignored (a
background job of a shell script runs with SIGINT ignored). So the async parts of a run take
both signals as loop callbacks instead, and decide themselves how to stop.

Only the main thread receives signals. A stage run in a thread beside it (`harness.run`) gets
them through a `StopRelay` bound to that thread: the main thread, stopped, calls `relay.stop()`,
and the thread's event loop takes it as it would take the signal.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

__all__ = ["StopRelay", "run_stoppable", "stop_signals"]

T = TypeVar("T")

_bound = threading.local()  # .relay: the StopRelay of the thread running a stage beside the main one


class StopRelay:
    """Stop signals for one thread other than the main one, passed on by the main thread: each
    `stop()` calls the `on_stop` of the `stop_signals` block the thread is in (in that block's
    event loop), or of the next block it enters, so a stop that comes between two event loops is
    not lost. Bind it in the thread with `bound()`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # `stop` may run in a signal handler, over itself
        self._stops = 0  # how many stops were asked for: a second one cuts a drain short
        self._blocks: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []

    @property
    def stopped(self) -> bool:
        return self._stops > 0

    def stop(self) -> None:
        """A stop signal, for the thread: from any thread."""
        with self._lock:
            self._stops += 1
            blocks = list(self._blocks)
        for loop, on_stop in blocks:
            with suppress(RuntimeError):  # the loop closed meanwhile: its block is over
                loop.call_soon_threadsafe(on_stop)

    @contextmanager
    def bound(self) -> Iterator[None]:
        """For the length of the block, in the calling thread: its `stop_signals` blocks take
        this relay's stops."""
        _bound.relay = self
        try:
            yield
        finally:
            del _bound.relay

    @contextmanager
    def _listen(self, on_stop: Callable[[], None]) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        block = (loop, on_stop)
        with self._lock:
            self._blocks.append(block)
            missed = self._stops  # asked for before this block began
        for _ in range(missed):
            loop.call_soon(on_stop)
        try:
            yield
        finally:
            with self._lock:
                self._blocks.remove(block)


@contextmanager
def stop_signals(on_stop: Callable[[], None]) -> Iterator[None]:
    """For the length of the block, in the running event loop: SIGTERM, and SIGINT unless this
    process ignores it, call `on_stop` (once per signal) between callbacks, never inside the
    code the signal interrupted. The handlers in force before are put back after. Outside the
    main thread (which alone receives signals) `on_stop` is called for the stops of the thread's
    `StopRelay`, if it has one; else nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        relay: StopRelay | None = getattr(_bound, "relay", None)
        if relay is None:
            yield
        else:
            with relay._listen(on_stop):
                yield
        return
    loop = asyncio.get_running_loop()
    signums = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # an ignored SIGINT stays ignored
        signums.append(signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in signums}
    for signum in signums:
        loop.add_signal_handler(signum, on_stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            if handler is not None:  # None: a handler set outside Python, which we cannot restore
                signal.signal(signum, handler)


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, where a stop signal cancels `main` and ends as KeyboardInterrupt,
    whether SIGINT is ignored or not."""

    async def guarded() -> tuple[bool, T | None]:
        task = asyncio.ensure_future(main)
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        with stop_signals(stop):
            try:
                return False, await task
            except asyncio.CancelledError:
                if not stopped:
                    raise
                return True, None

    stopped, result = asyncio.run(guarded())
    if stopped:
        raise KeyboardInterrupt
    return result  # type: ignore[return-value]
