"""A Ray job's stop, told to its actors through a stop board: a small Ray actor of the job's own.

Without Ray a stop signal drains the job's expert client: nothing more is sent, and the answers
in flight are committed to the cache before the process ends (`harness.stages.score_stoppable`).
A Ray job's actors are other processes, often on other machines, and shutting Ray down kills
them with their answers in flight: paid for and lost. So each actor registers on the board
while it asks the expert (`RayStop.asking`) and watches it during the call (`RayStop.watch`),
draining its client once the board says stop; the driver, stopped or failed, says stop on the
board and waits while actors are still asking (`RayStop.stop_and_wait`), then shuts Ray down.
A registered actor beats on the board from a thread of its own until its answers are committed;
one that has not beaten for `BEAT_STALE` seconds died mid-call (killed, or its machine lost), and
nothing waits for it.

The word travels through Ray, not through --out: a shared file system's caches (an NFS client
keeps a file's absence for up to a minute) would hold it back. Ray is imported only where a
method runs, which is only in a Ray job."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experts import ExpertClient

__all__ = ["RayStop", "StopBoard"]

WATCH_EVERY = 0.2  # seconds between an asking actor's looks at the board
WAIT_EVERY = 0.1  # seconds between the driver's looks for actors still asking
BEAT_EVERY = 0.5  # seconds between a registered actor's beats on the board
BEAT_STALE = 3.0  # seconds without a beat after which a registered call is taken for dead
BOARD_PREFIX = "ctd-score-stop-"


class StopBoard:
    """The board (run as a Ray actor): whether the job is stopping, and the calls asking now, each
    with the time of its last beat on the board's `clock`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.stopping = False
        self.clock = clock
        self.asking: dict[str, float] = {}

    def begin(self, call: str) -> bool:
        """Register `call`, unless the job is stopping (then the call must send nothing)."""
        if self.stopping:
            return False
        self.asking[call] = self.clock()
        return True

    def beat(self, call: str) -> None:
        """`call` is alive (a beat that comes after its end registers nothing)."""
        if call in self.asking:
            self.asking[call] = self.clock()

    def end(self, call: str) -> None:
        self.asking.pop(call, None)

    def is_stopping(self) -> bool:
        return self.stopping

    def stop(self) -> int:
        """Say stop; how many calls are asking now."""
        self.stopping = True
        return self.still_asking()

    def still_asking(self) -> int:
        """How many registered calls are alive: those of an actor that died mid-call are dropped."""
        now = self.clock()
        for call in [call for call, beaten in self.asking.items() if now - beaten > BEAT_STALE]:
            del self.asking[call]
        return len(self.asking)


@dataclass(frozen=True)
class RayStop:
    """One job's stop board, by its name (picklable: it travels with the actors)."""

    name: str = field(default_factory=lambda: BOARD_PREFIX + uuid.uuid4().hex)

    def open(self) -> Any:
        """The driver's: start the board; keep the handle for the job's length (the board ends
        with the last). It takes no CPU, so a pool that holds every CPU still leaves it room."""
        import ray

        return ray.remote(StopBoard).options(name=self.name, num_cpus=0).remote()

    @staticmethod
    def stop_and_wait(board: Any, seconds: float) -> int:
        """The driver's, with the handle `open` gave: say stop, and wait up to `seconds` while
        actors are still asking (their answers in flight being committed); how many still were
        at the end. A line on stderr says so when there is anything to wait for."""
        import sys

        import ray

        left = ray.get(board.stop.remote(), timeout=seconds)
        if not left:
            return 0
        waiting = f"waiting up to {seconds:g} s for the actors' answers in flight"
        print(f"stopping: {waiting}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + seconds
        while left and time.monotonic() < deadline:
            time.sleep(WAIT_EVERY)
            left = ray.get(board.still_asking.remote(), timeout=seconds)
        return left

    @contextmanager
    def asking(self) -> Iterator[Any]:
        """An actor's: registered on the board for the block, in which it asks the expert; the
        block gets the board (for `watch`). A job stopping already raises KeyboardInterrupt at
        once: nothing is sent. A stop said after the registration finds it, and the driver waits
        for the block to end, while a thread beats on the board for it."""
        import ray

        board = ray.get_actor(self.name)
        call = uuid.uuid4().hex
        if not ray.get(board.begin.remote(call)):
            raise KeyboardInterrupt
        ended = threading.Event()
        beating = threading.Thread(target=_beat, args=(board, call, ended), name="ctd-stop-beat", daemon=True)
        beating.start()
        try:
            yield board
        finally:
            ended.set()
            beating.join()  # the thread ends with the call
            with suppress(Exception):  # a board gone with Ray must not replace the call's outcome
                board.end.options(enable_task_events=False).remote(call)  # not waited for

    @staticmethod
    async def watch(board: Any, client: ExpertClient) -> None:
        """An actor's, beside its `score` call, with the board `asking` gave: drain the client once
        the board says stop (the answers in flight are committed, then the call raises
        `experts.Stopped`). A look that fails (Ray cancelling the task's children, say) is tried
        again; a board that died (the driver is gone, and Ray with it) ends the watch."""
        import ray

        look = board.is_stopping.options(enable_task_events=False)  # five a second: kept off Ray's events
        while True:
            try:
                if await look.remote():
                    break
            except ray.exceptions.ActorDiedError:
                return
            except ray.exceptions.RayError:
                pass
            await asyncio.sleep(WATCH_EVERY)
        client.drain()


def _beat(board: Any, call: str, ended: threading.Event) -> None:
    """Beat on `board` for `call` every `BEAT_EVERY` seconds until `ended` (not waited for: a
    board gone with Ray ends nothing here). A thread, not the call's event loop, so that a commit
    holding the loop still beats."""
    beat = board.beat.options(enable_task_events=False)
    while not ended.wait(BEAT_EVERY):
        with suppress(Exception):
            beat.remote(call)
