"""Stop signals (SIGTERM, and SIGINT unless ignored) handled inside a running event loop.

Outside an event loop a stop signal raises KeyboardInterrupt where the code happens to be
(`harness.cli._app._terminate`), as Ctrl-C does. Inside one that is unsafe: raised in the middle of
asyncio's own machinery (a callback, a task switch) it can end as a traceback rather than a
clean stop, and asyncio.run only guards SIGINT, and only when SIGINT is not ignored (a
background job of a shell script runs with SIGINT ignored). So the async parts of a run take
both signals as loop callbacks instead, and decide themselves how to stop.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["run_stoppable", "stop_signals"]

T = TypeVar("T")


@contextmanager
def stop_signals(on_stop: Callable[[], None]) -> Iterator[None]:
    """For the length of the block, in the running event loop: SIGTERM, and SIGINT unless this
    process ignores it, call `on_stop` (once per signal) between callbacks, never inside the
    code the signal interrupted. The handlers in force before are put back after. Outside the
    main thread (which alone receives signals) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
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
