"""What a run shows while it works: one rich Console for the stage lines and the progress of long
stage work (extraction, training, the expert, sweeps).

In a terminal the progress is drawn as live bars on the same Console that prints the stage lines,
so a stage's summary line is printed above the bars and stays on the screen; a stage's bars are
removed when its line is printed. When stderr is not a terminal (a file, a pipe, nohup, a job
scheduler), live bars cannot work: a plain line per unfinished task is printed every
`progress_interval()` seconds instead (and a "STAGE: working" line while a stage reports no
progress), never cut at 80 columns.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeRemainingColumn

from .._errors import InputError

__all__ = [
    "DEFAULT_PROGRESS_INTERVAL",
    "PROGRESS_INTERVAL_ENV",
    "StageProgress",
    "make_console",
    "progress_interval",
]

PROGRESS_INTERVAL_ENV = "CTD_PROGRESS_INTERVAL"  # seconds between plain progress lines
DEFAULT_PROGRESS_INTERVAL = 30.0  # at least two lines a minute in a scheduler's log
_FILE_WIDTH = 200  # a table's width when the output is a file: rich would use 80 columns
_REDRAW_SECONDS = 0.1  # live bars are redrawn at most ten times a second


def progress_interval() -> float:
    """Seconds between plain progress lines: $CTD_PROGRESS_INTERVAL, else 30."""
    raw = os.environ.get(PROGRESS_INTERVAL_ENV)
    if not raw:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:  # also NaN
        raise InputError(f"${PROGRESS_INTERVAL_ENV}={raw!r}: expected a number of seconds above 0")
    return seconds


def make_console(*, stderr: bool) -> Console:
    """The CLI's console for stdout or stderr. Text is never wrapped or cropped (soft wrap); when
    the stream is not a terminal, tables get a wide page instead of rich's default 80 columns."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal:
        console = Console(stderr=stderr, soft_wrap=True, width=_FILE_WIDTH)
    return console


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class _Task:
    """One task's latest state, for the plain lines."""

    done: int
    total: int
    detail: str
    started: float  # when the task was first reported
    first_done: int  # its count then (work resumed from a store or a cache starts above 0)
    finished_shown: bool = False

    def line(self, what: str, now: float) -> str:
        elapsed = now - self.started
        share = self.done / self.total if self.total else 0.0
        text = f"{what}: {self.done:,}/{self.total:,} ({share:.0%})"
        if self.detail:
            text += f"  {self.detail}"
        if self.done >= self.total:
            return f"{text}  done in {_duration(elapsed)}"
        text += f"  {_duration(elapsed)} elapsed"
        if self.done > self.first_done:  # the rate of this run's work, not of what was resumed
            left = elapsed / (self.done - self.first_done) * (self.total - self.done)
            text += f", about {_duration(left)} left"
        return text


class StageProgress:
    """A callable `(what, done, total, detail="")`: one bar (or plain line) per `what`, and
    `print` for stage lines through the same Console. Use as a context manager. Output goes to
    stderr so stdout stays clean for --json; `enabled=False` shows nothing."""

    def __init__(
        self, console: Console | None = None, *, enabled: bool = True, interval: float | None = None
    ) -> None:
        self.console = console or make_console(stderr=True)
        self._enabled = enabled
        self._live = enabled and self.console.is_terminal
        self._interval = interval if interval is not None else progress_interval()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_line = time.monotonic()  # when the plain output last printed anything
        self._stage = ""  # the stage at work, for the "STAGE: working" lines
        self._stage_since = time.monotonic()  # when it started
        self._tasks: dict[str, _Task] = {}  # plain mode
        self._bars: dict[str, TaskID] = {}  # live mode
        self._last_redraw = 0.0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.completed:,}/{task.total:,}"),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self._live,
        )

    def __enter__(self) -> StageProgress:
        if self._live:
            self._progress.start()
        elif self._enabled:
            self._ticker = threading.Thread(target=self._tick, name="ctd-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._live:
            self._progress.stop()

    def __call__(self, what: str, done: int, total: int, detail: str = "") -> None:
        if not self._enabled:
            return
        if self._live:
            self._draw(what, done, total, detail)
            return
        now = time.monotonic()
        with self._lock:
            task = self._tasks.get(what)
            if task is None or done < task.done:  # a new task, or the same work started again
                task = self._tasks[what] = _Task(done, total, detail, now, done)
            task.done, task.total, task.detail = done, total, detail
            if done >= total and not task.finished_shown:
                task.finished_shown = True
                self._say(task.line(what, now))

    def stage_started(self, stage: str) -> None:
        """A stage starts its work (the plain "STAGE: working" lines name it)."""
        with self._lock:
            self._stage, self._stage_since = stage, time.monotonic()

    def print(self, markup: str) -> None:
        """A stage line (rich markup): above the live bars, which belong to the finished stage
        and are removed; in plain mode, a line of its own."""
        if self._live:
            for bar in self._bars.values():
                self._progress.remove_task(bar)
            self._bars.clear()
            self._progress.refresh()  # else the line is printed above the last frame, bars and all
        with self._lock:
            self._tasks.clear()
            self._stage, self._last_line = "", time.monotonic()
        self.console.print(markup)

    def _draw(self, what: str, done: int, total: int, detail: str) -> None:
        if what not in self._bars:
            self._bars[what] = self._progress.add_task(escape(what), total=total, detail="")
        now = time.monotonic()
        if now - self._last_redraw < _REDRAW_SECONDS and done < total:
            return
        self._last_redraw = now
        self._progress.update(self._bars[what], completed=done, total=total, detail=escape(detail))

    def _say(self, text: str) -> None:
        """One plain line, stamped with the local time; called with the lock held."""
        self._last_line = time.monotonic()
        self.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False, highlight=False)

    def _tick(self) -> None:
        """Plain mode: every interval, a line per unfinished task, or one naming the stage at work
        when it reports no progress."""
        while not self._stopped.wait(self._interval):
            now = time.monotonic()
            with self._lock:
                running = {w: t for w, t in self._tasks.items() if t.done < t.total}
                for what, task in running.items():
                    self._say(task.line(what, now))
                if not running and self._stage and now - self._last_line >= self._interval:
                    self._say(f"{self._stage}: working, {_duration(now - self._stage_since)} so far")
