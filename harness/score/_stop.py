"""A Ray job's stop, told to its actors through the job's --out folder, which every actor sees.

Without Ray a stop signal drains the job's expert client: nothing more is sent, and the answers
in flight are committed to the cache before the process ends (`harness.stages.score_stoppable`).
A Ray job's actors are other processes, often on other machines, and shutting Ray down kills
them with their answers in flight: paid for and lost. So the driver, stopped, puts a flag file
in --out (`RayStop.ask`) and waits (`RayStop.wait_for_actors`) while any actor is asking the
expert; each actor marks the folder while it asks (`RayStop.asking`), watches for the flag
(`RayStop.watch`) and drains its client when it appears. Then Ray is shut down.

The names carry the driver's token: a flag or mark left by a killed job never touches another,
and the next job on the folder removes them (`ScoreLayout.temps`)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experts import ExpertClient

__all__ = ["RayStop"]

WATCH_EVERY = 0.2  # seconds between an asking actor's looks for the flag
WAIT_EVERY = 0.1  # seconds between the driver's looks for actors still asking


@dataclass(frozen=True)
class RayStop:
    """The stop of one Ray job on the folder `root` (picklable: it travels with the actors)."""

    root: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def flag(self) -> Path:
        return self.root / f".stop-{self.token}"

    @property
    def asked(self) -> bool:
        return self.flag.exists()

    def ask(self) -> None:
        """The driver's: tell every actor to stop asking the expert."""
        self.flag.touch()

    def actors_asking(self) -> list[Path]:
        return list(self.root.glob(f".asking-{self.token}-*"))

    def wait_for_actors(self, seconds: float) -> int:
        """The driver's, after `ask`: wait up to `seconds` while an actor is still asking (its
        answers in flight being committed). Returns how many still were at the end."""
        deadline = time.monotonic() + seconds
        while (left := len(self.actors_asking())) and time.monotonic() < deadline:
            time.sleep(WAIT_EVERY)
        return left

    @contextmanager
    def asking(self) -> Iterator[None]:
        """An actor's: the folder marked for the block, in which it asks the expert. A stop asked
        before the mark is there raises KeyboardInterrupt at once: nothing is sent. One asked
        after it finds the mark, and the driver waits for the block to end."""
        mark = self.root / f".asking-{self.token}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        mark.touch()
        try:
            if self.asked:
                raise KeyboardInterrupt
            yield
        finally:
            mark.unlink(missing_ok=True)

    async def watch(self, client: ExpertClient) -> None:
        """An actor's, beside its `score` call: drain the client once the flag appears (the
        answers in flight are committed, then the call raises `experts.Stopped`)."""
        while not await asyncio.to_thread(self.flag.exists):
            await asyncio.sleep(WATCH_EVERY)
        client.drain()
