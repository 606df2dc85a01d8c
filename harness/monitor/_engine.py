"""Where the monitor's micro-batches become scores: each batch of conversations is tokenised all at
once (`ProbeScorer.tokens_each`), then run through the forward pass and the probes
(`ProbeScorer.score`). The two stages overlap: the next batch is tokenised while this one runs.

`ThreadScorer` runs the stages in two threads of this process; `ProcessScorer` in a process of its
own, which alone loads the model (what runs there: harness/monitor/_scorer_process.py; and which
`RestartingScorer`, harness/monitor/_restart.py, starts again when it dies). Why a process: on a
GPU a forward pass is kernel launches, Python work under the GIL (12 ms a pass on an H200's host),
and so are template rendering and the server's HTTP work; in one process they take turns. On an
H200 the monitor served 394 requests/s with the GPU 30% busy and the GIL held nearly all the time
(issue 25). A scorer process has a GIL of its own.

Both answer `await score(conversations)` with one `Scored` or `InputError` (a conversation the chat
template rejects) per conversation, in order, and the seconds the forward pass took."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import InputError
from ._errors import Unavailable

if TYPE_CHECKING:
    from probes import Conversation

    from ._restart import RestartingScorer
    from ._scorer import PassCost, ProbeScorer

__all__ = [
    "DEVICE_LOST",
    "ProcessScorer",
    "Scored",
    "ScorerGone",
    "ThreadScorer",
    "scorer_ended",
    "start_scorer",
]

log = logging.getLogger("ctd.monitor")
STOP_SECONDS = 10.0  # a scorer process asked to stop gets this long before it is killed
WARM_UP = "warm-up"  # the conversation of the passes before serving
# The exit code of a scorer process whose GPU stopped answering after a failed pass (its CUDA
# context lost: an illegal memory access, a device-side assert), so that it is started again.
DEVICE_LOST = 3


@dataclass(frozen=True)
class Scored:
    """What the monitor needs of one conversation's pass: the probe's P(y=1), the DV score, and
    whether the conversation was cut to the probes' token limit."""

    probe: float
    dv: float
    truncated: bool


Outcome = Scored | InputError


class ScorerGone(Unavailable):
    """The scorer process ended: no check can be scored until it is started again, or, where it is
    not, until the monitor is restarted."""


def scorer_ended(exitcode: int | None) -> str:
    """What the monitor says of a scorer process that ended with `exitcode`."""
    if exitcode == DEVICE_LOST:
        return (
            f"the scorer process ended (exit code {exitcode}: its GPU stopped answering after a failed pass)"
        )
    return f"the scorer process ended (exit code {exitcode})"


def tokenize_stage(scorer: ProbeScorer, conversations: list[Conversation]) -> tuple[list[Any], float]:
    """The first stage: `ProbeScorer.tokens_each`, and its seconds."""
    started = time.perf_counter()
    return scorer.tokens_each(conversations), time.perf_counter() - started


def forward_stage(scorer: ProbeScorer, tokenised: tuple[list[Any], float]) -> tuple[list[Outcome], float]:
    """The second stage: `Scored` for each tokenised conversation (the refusals pass through), and
    the seconds of the slower stage, which bounds how fast batches go through the two."""
    from ._scorer import Tokens

    tokens, tokenize_seconds = tokenised
    kept = [t for t in tokens if isinstance(t, Tokens)]
    started = time.perf_counter()
    scores = iter(scorer.score(kept)) if kept else iter(())
    seconds = max(time.perf_counter() - started, tokenize_seconds)
    outcomes: list[Outcome] = []
    for t in tokens:
        if isinstance(t, Tokens):
            probe, dv = next(scores)
            outcomes.append(Scored(probe, dv, t.truncated))
        else:
            outcomes.append(t)
    return outcomes, seconds


def warm_up(scorer: ProbeScorer, max_batch: int) -> None:
    """The passes before serving: the first pays for allocation (seconds on a CPU), then the cost
    of a pass by its size is fitted, which cuts micro-batches into passes."""
    scorer.score([scorer.tokens(WARM_UP)])
    scorer.fit_pass_cost(max_batch)


class ThreadScorer:
    """The two stages in two threads of this process (one each: a stage runs one batch at a time)."""

    def __init__(self, scorer: ProbeScorer) -> None:
        self.scorer = scorer
        self._tokenize = ThreadPoolExecutor(1, thread_name_prefix="ctd-tokenize")
        self._forward = ThreadPoolExecutor(1, thread_name_prefix="ctd-forward")

    where = "in threads of the server's process"
    gone: str | None = None  # threads of this process end with it

    @property
    def pass_cost(self) -> PassCost | None:
        return self.scorer.pass_cost

    async def start(self, max_batch: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self._forward, warm_up, self.scorer, max_batch)

    async def score(self, conversations: list[Conversation]) -> tuple[list[Outcome], float]:
        loop = asyncio.get_running_loop()
        tokenised = await loop.run_in_executor(self._tokenize, tokenize_stage, self.scorer, conversations)
        return await loop.run_in_executor(self._forward, forward_stage, self.scorer, tokenised)

    async def aclose(self) -> None:
        self._tokenize.shutdown(wait=False, cancel_futures=True)
        self._forward.shutdown(wait=False, cancel_futures=True)


class ProcessScorer:
    """The two stages in a spawned process that loads the model; batches and outcomes cross a pipe.
    `start` returns once the process scored its warm-up passes, or raises what stopped it (the
    probes' InputError when the weights differ, say). If the process dies, every pending and later
    `score` raises ScorerGone."""

    def __init__(self, process: Any, connection: Connection, pass_cost: PassCost | None) -> None:
        self._process = process
        self._connection = connection
        self.pass_cost = pass_cost
        self.where = f"in a process of its own (pid {process.pid})"
        self._pending: dict[int, asyncio.Future[tuple[list[Outcome], float]]] = {}
        self._next = 0
        self.gone: str | None = None  # why the process ended, once it has
        # Told the exit code when the process ends unasked (`RestartingScorer` starts another);
        # without it, the end is logged as the monitor's.
        self.on_gone: Callable[[int | None], None] | None = None
        self._closing = False
        self._loop = asyncio.get_running_loop()
        # One sender: a large batch must not block the event loop while the process is busy.
        self._send = ThreadPoolExecutor(1, thread_name_prefix="ctd-scorer-send")
        self._reader = threading.Thread(target=self._read, name="ctd-scorer-read", daemon=True)
        self._reader.start()
        # A monitor never closed (a script that ends without `aclose`): at exit multiprocessing
        # would SIGTERM the process and wait out its grace period; this runs before that.
        self._at_exit = multiprocessing.util.Finalize(self, _kill, args=(process.pid,), exitpriority=10)

    @classmethod
    async def start(
        cls, safety: Path, dv: Path, *, model: str | None, batch_tokens: int, max_batch: int
    ) -> ProcessScorer:
        from ._scorer_process import ScorerLoad, serve_scorer  # it imports this module

        context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        ours, theirs = context.Pipe()
        process = context.Process(
            target=serve_scorer,
            args=(theirs, ScorerLoad(safety, dv, model, batch_tokens, max_batch)),
            name="ctd-scorer",
        )
        process.daemon = True
        process.start()
        theirs.close()  # the child's end: our reads see EOF when the child is gone
        try:
            kind, value = await asyncio.to_thread(_receive_ready, ours, process)
        except BaseException:  # cancelled while the model loads: nothing of it is worth keeping
            process.kill()
            # Reaped off the event loop: a process stuck in a driver call (a hung GPU) dies only
            # when the call returns, and the server must go on answering meanwhile.
            threading.Thread(target=_reap, args=(process, ours), name="ctd-scorer-reap", daemon=True).start()
            raise
        if kind == "error":
            await asyncio.to_thread(_stop, process, ours)
            await asyncio.to_thread(process.join)  # no reader thread yet: reaped here
            ours.close()
            raise value
        return cls(process, ours, value)

    @property
    def exitcode(self) -> int | None:
        """The process's exit code once it has ended and been reaped, else None."""
        return self._process.exitcode

    async def score(self, conversations: list[Conversation]) -> tuple[list[Outcome], float]:
        if self.gone is not None:
            raise ScorerGone(self.gone, retry_after=60)
        self._next += 1
        number = self._next
        future: asyncio.Future[tuple[list[Outcome], float]] = self._loop.create_future()
        self._pending[number] = future
        try:
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: the reader says why
                await self._loop.run_in_executor(self._send, self._connection.send, (number, conversations))
            return await future
        finally:
            self._pending.pop(number, None)

    def _read(self) -> None:
        """The reader thread: resolve each batch's future as its outcomes arrive."""
        while True:
            try:
                number, kind, value = self._connection.recv()
            except (EOFError, OSError):
                break
            except Exception:  # an answer that does not read: the process is not to be trusted
                log.exception("the scorer process's answer could not be read; ending it")
                self._process.kill()
                break
            try:
                self._loop.call_soon_threadsafe(self._resolve, number, kind, value)
            except RuntimeError:  # the loop is closed: nobody is waiting
                break
        # Closed after any write in progress (by the sending thread), never under one or under a
        # read; the process is reaped here only, so that its exit code is never lost to a race.
        try:
            self._send.submit(self._connection.close)
        except RuntimeError:  # the sending thread is shut down: no write in progress
            self._connection.close()
        self._process.join(STOP_SECONDS)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._end, self._process.exitcode)

    def _resolve(self, number: int, kind: str, value: Any) -> None:
        future = self._pending.get(number)
        if future is None or future.done():
            return
        if kind == "scored":
            future.set_result(value)
        else:  # "failed": the pass raised in the process; its traceback is in the process's log
            future.set_exception(RuntimeError(f"the scorer process failed this batch: {value}"))

    def _end(self, exitcode: int | None) -> None:
        why = f"{scorer_ended(exitcode)}; restart the monitor"
        try:
            if self.gone is None:
                self.gone = why
                if self._closing:  # asked to end: nothing to tell
                    return
                if self.on_gone is not None:  # before the checks waiting on it hear of it
                    self.on_gone(exitcode)
                else:
                    log.error(why)
        finally:  # whatever the hook does, no check waits on a dead process
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ScorerGone(self.gone or why, retry_after=60))

    async def aclose(self) -> None:
        """Ask the process to stop after the batches it has (None down the pipe, by the sending
        thread: two writers would interleave), and kill it when it has not stopped in time, or
        when the sending thread is stuck writing to a process that stopped reading."""
        if self._closing:
            return
        self._closing = True
        self._at_exit.cancel()
        stopping = self._loop.run_in_executor(self._send, _stop, self._process, self._connection)
        try:
            await asyncio.wait_for(asyncio.shield(stopping), STOP_SECONDS + 1)
        except TimeoutError:
            self._process.kill()  # the stuck write fails (the pipe's other end is gone), then `_stop` runs
            await stopping
        await asyncio.to_thread(self._reader.join)  # it saw the end, closed the pipe and reaped
        self._send.shutdown(wait=False)


async def start_scorer(
    safety: Path,
    dv: Path,
    *,
    model: str | None,
    batch_tokens: int,
    max_batch: int,
    process: bool | None = None,
) -> ThreadScorer | RestartingScorer:
    """The monitor's scorer, warmed up. `process`: in a process of its own, started again if it
    dies (True), in threads of this one (False), or None: a process when there is a GPU, where
    the launches hold the GIL, and threads on a CPU, where the forward pass does not hold it and a
    second process only adds a copy of the interpreter."""
    if process is None:
        process = await asyncio.to_thread(_has_gpu)
    if process:
        from ._restart import RestartingScorer

        def start() -> Awaitable[ProcessScorer]:
            return ProcessScorer.start(
                safety, dv, model=model, batch_tokens=batch_tokens, max_batch=max_batch
            )

        started = time.monotonic()
        first = await start()
        return RestartingScorer(first, start, load_seconds=time.monotonic() - started)
    from ._scorer import ProbeScorer  # torch is imported here, not at start-up

    scorer = ThreadScorer(
        await asyncio.to_thread(ProbeScorer.load, safety, dv, model=model, batch_tokens=batch_tokens)
    )
    await scorer.start(max_batch)
    return scorer


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _receive_ready(connection: Connection, process: Any) -> tuple[str, Any]:
    try:
        return connection.recv()
    except (EOFError, OSError):
        process.join(STOP_SECONDS)
        raise RuntimeError(
            f"the scorer process ended while loading the model (exit code {process.exitcode}); "
            "its error is above"
        ) from None


def _stop(process: Any, connection: Connection) -> None:
    """Ask the process to stop (None down the pipe), then kill it if it has not after STOP_SECONDS.
    Neither closes the connection nor reaps the process: the reader thread does both."""
    with contextlib.suppress(OSError, ValueError):
        connection.send(None)
    if not multiprocessing.connection.wait([process.sentinel], STOP_SECONDS):
        process.kill()


def _reap(process: Any, connection: Connection) -> None:
    """Wait for a killed process to end, then close its pipe (after the thread reading it saw the
    end: never under its read)."""
    process.join()
    connection.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
