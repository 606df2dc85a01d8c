"""Progress of long stage work (extraction, training, sweeps) as rich bars with ETA."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeRemainingColumn

__all__ = ["StageProgress"]


class StageProgress:
    """A callable `(description, done, total)`: one bar per description, redrawn at most ten times a
    second. Use as a context manager; output goes to stderr so stdout stays clean for --json."""

    def __init__(self, console: Console | None = None, *, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,}/{task.total:,}"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            disable=not enabled,
        )
        self._tasks: dict[str, TaskID] = {}
        self._last = 0.0

    def __enter__(self) -> StageProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, description: str, done: int, total: int) -> None:
        if description not in self._tasks:
            self._tasks[description] = self._progress.add_task(description, total=total)
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        self._progress.update(self._tasks[description], completed=done, total=total)
