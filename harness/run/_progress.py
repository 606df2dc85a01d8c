"""What a run shows while it works: one rich Console for the stage lines and the progress of long
stage work (extraction, training, the expert, sweeps).

In a terminal the progress is drawn as live bars on the same Console that prints the stage lines,
so a stage's summary line is printed above the bars and stays on the screen; a stage's bars are
removed when its line is printed. Above the bars a status row says what the run is doing now
("[2/6] query", "loading the monitored model smollm2") and for how long, so that the screen is
never blank during slow work that has no bar; each stage's lines carry its counter ("[2/6]").
Each bar counts in a unit ("422/2,237 tokens") and a finished one says "done in 8.2s".

When stderr is not a terminal (a file, a pipe, nohup, a job scheduler), live bars cannot work: a
plain line per unfinished task is printed every `progress_interval()` seconds instead (and a
"STAGE: working" line while a stage reports no progress), a time-stamped line when a stage starts
and before each of its slow steps, never cut at 80 columns. The status row is not printed there:
a run refused by its checks says only its one error line.

Stages that run at the same time (`harness.run.Together`) report from their own threads: the
bars and steps reported from a thread belong to the stage it started, a stage's line removes its
own bars only, and the status row names every stage at work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text

from .._errors import InputError

__all__ = [
    "DEFAULT_PROGRESS_INTERVAL",
    "PROGRESS_INTERVAL_ENV",
    "StageProgress",
    "make_console",
    "progress_interval",
    "took",
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
    """Whole seconds, for times that run on ("12s so far", "about 1m52s left")."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def took(seconds: float) -> str:
    """How long finished work took, as a stage line and a finished bar say it ("done in 8.2s",
    "done in 1m15s"): tenths below ten seconds, where whole seconds would read "0s"."""
    return f"{seconds:.1f}s" if seconds < 10 else _duration(seconds)


class _CountColumn(ProgressColumn):
    """ "422/2,237 tokens": done and total in the task's unit; nothing on the status row."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        unit = task.fields.get("unit", "")
        return Text(f"{task.completed:,.0f}/{task.total:,.0f}" + (f" {unit}" if unit else ""))


class _TimeColumn(ProgressColumn):
    """The time left while a bar runs ("about 16s left"), "done in 8.2s" once it is full, and the
    time so far on the status row."""

    max_refresh = 0.5  # a remaining time that changes ten times a second cannot be read

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text(_duration(task.elapsed or 0.0))
        if task.finished:
            return Text(f"done in {took(task.finished_time or 0.0)}")
        left = task.time_remaining
        return Text(f"about {_duration(left)} left" if left is not None else "")


@dataclass
class _AtWork:
    """A stage at work, in the thread that runs it."""

    stage: str
    since: float  # when it started
    step: str = ""  # the slow step it is at, shown on the status row


@dataclass
class _Task:
    """One task's latest state, for the plain lines."""

    done: int
    total: int
    detail: str
    unit: str  # what is counted: "tokens", "examples", ...
    started: float  # when the task was first reported
    first_done: int  # its count then (work resumed from a store or a cache starts above 0)
    stage: str  # the stage at work in the thread that reports it ("": none)
    finished_shown: bool = False

    def line(self, what: str, now: float) -> str:
        elapsed = now - self.started
        share = self.done / self.total if self.total else 0.0
        unit = f" {self.unit}" if self.unit else ""
        text = f"{what}: {self.done:,}/{self.total:,}{unit} ({share:.0%})"
        if self.detail:
            text += f"  {self.detail}"
        if self.done >= self.total:
            return f"{text}  done in {took(elapsed)}"
        text += f"  {_duration(elapsed)} elapsed"
        if self.done > self.first_done:  # the rate of this run's work, not of what was resumed
            left = elapsed / (self.done - self.first_done) * (self.total - self.done)
            text += f", about {_duration(left)} left"
        return text


class StageProgress:
    """A callable `(what, done, total, detail="", unit="")`: one bar (or plain line) per `what`;
    `print` for stage lines through the same Console; `plan`, `stage_started`, `step` and
    `status` for what the run is doing now. Use as a context manager (entered again inside, it
    stays up until the outermost exit). Output goes to stderr so stdout stays clean for --json;
    `enabled=False` shows nothing."""

    def __init__(
        self, console: Console | None = None, *, enabled: bool = True, interval: float | None = None
    ) -> None:
        self.console = console or make_console(stderr=True)
        self._enabled = enabled
        self._live = enabled and self.console.is_terminal
        self._interval = interval if interval is not None else progress_interval()
        self._depth = 0  # nested `with` blocks
        self._lock = threading.RLock()  # stages at work report from their own threads
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_line = time.monotonic()  # when the plain output last printed anything
        self._stages: tuple[str, ...] = ()  # the run's stages in order, for the counters
        self._at_work: dict[int, _AtWork] = {}  # by thread: the stages at work, in the order started
        self._tasks: dict[str, _Task] = {}  # plain mode
        self._bars: dict[str, tuple[TaskID, str]] = {}  # live mode: each bar and its stage
        self._status: TaskID | None = None  # live mode: the row saying what the run does now
        self._redrawn: dict[str, float] = {}  # live mode: when each bar was last redrawn
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            _CountColumn(),
            TextColumn("{task.fields[detail]}"),
            _TimeColumn(),
            console=self.console,
            disable=not self._live,
        )

    def __enter__(self) -> StageProgress:
        self._depth += 1
        if self._depth > 1:
            return self
        if self._live:
            self._progress.start()
        elif self._enabled:
            self._ticker = threading.Thread(target=self._tick, name="ctd-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self._stopped.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._live:
            self._clear_status()  # what the run was doing is over; a bar left shows where it stopped
            self._progress.stop()

    def __call__(self, what: str, done: int, total: int, detail: str = "", unit: str = "") -> None:
        if not self._enabled:
            return
        if self._live:
            self._draw(what, done, total, detail, unit)
            return
        now = time.monotonic()
        with self._lock:
            task = self._tasks.get(what)
            if task is None or done < task.done:  # a new task, or the same work started again
                task = self._tasks[what] = _Task(done, total, detail, unit, now, done, self._owner())
            task.done, task.total, task.detail = done, total, detail
            if done >= total and not task.finished_shown:
                task.finished_shown = True
                self._say(task.line(what, now))

    def plan(self, header: str, stages: Sequence[str]) -> None:
        """A run of `stages` begins (its checks passed): `header` is printed as a line of its
        own, and from now on each stage's lines carry its counter ("[2/6] query")."""
        self._stages = tuple(stages)
        self.print(escape(header))

    def counter(self, stage: str) -> str:
        """ "[2/6] " for the second of six planned stages; "" for a stage outside the plan."""
        if stage not in self._stages:
            return ""
        return f"[{self._stages.index(stage) + 1}/{len(self._stages)}] "

    def stage_started(self, stage: str) -> None:
        """A stage starts its work: the status row names it with its counter (live), a line says
        so (plain), and the plain "STAGE: working" lines name it."""
        if not self._enabled:
            return
        with self._lock:
            self._at_work[threading.get_ident()] = _AtWork(stage, time.monotonic())
            if self._live:
                self._show_status()
        if not self._live:
            with self._lock:
                self._say(f"{self.counter(stage)}{stage}: started")

    def step(self, text: str) -> None:
        """The stage at work starts a slow step that shows no bar of its own (loading a model,
        starting a server, drawing figures): shown on the status row (live) or as a line
        (plain)."""
        if not self._enabled:
            return
        at_work = self._at_work.get(threading.get_ident())
        if self._live:
            with self._lock:
                if at_work is not None:
                    at_work.step = text
                    self._show_status()
                else:
                    self._set_status(escape(text), "")
            return
        with self._lock:
            self._say(f"{self.counter(at_work.stage)}{at_work.stage}: {text}" if at_work else text)

    def status(self, text: str) -> None:
        """What the run does before its stages (its checks): on the status row in a terminal,
        nowhere else, so that a run refused by a check prints only its one error line."""
        if self._live:
            self._set_status(escape(text), "")

    def print(self, markup: str) -> None:
        """A stage line (rich markup): above the live bars; the bars of the calling thread belong
        to the stage that finished and are removed, as is its part of the status row; in plain
        mode, a line of its own."""
        if not self._enabled:
            return
        with self._lock:
            at_work = self._at_work.pop(threading.get_ident(), None)
            # What ends with the line: the bars and tasks of its stage and of no stage, or, when no
            # other stage is at work, all of them.
            mine = {at_work.stage if at_work is not None else "", ""}
            others = bool(self._at_work)
            self._tasks = {w: t for w, t in self._tasks.items() if others and t.stage not in mine}
            self._last_line = time.monotonic()
            if self._live:
                for what, (bar, owner) in list(self._bars.items()):
                    if not others or owner in mine:
                        self._progress.remove_task(bar)
                        del self._bars[what]
                        self._redrawn.pop(what, None)
                if others:
                    self._show_status()
                else:
                    self._clear_status()
                self._progress.refresh()  # else the line is printed above the last frame, bars and all
        self.console.print(markup)

    def _owner(self) -> str:
        """The stage at work in the calling thread; "" in a thread of no stage."""
        at_work = self._at_work.get(threading.get_ident())
        return at_work.stage if at_work is not None else ""

    def _show_status(self) -> None:
        """The status row naming each stage at work, and the step it is at."""
        parts = [(f"{self.counter(w.stage)}{w.stage}", escape(w.step)) for w in list(self._at_work.values())]
        if len(parts) == 1:
            self._set_status(*parts[0])
        elif parts:
            self._set_status(" | ".join(f"{name}: {step}" if step else name for name, step in parts), "")

    def _set_status(self, description: str, detail: str) -> None:
        """The status row: created at the top of the live display, or its text replaced (its
        clock keeps running while the stage is the same)."""
        if self._status is None:
            self._status = self._progress.add_task(description, total=None, detail=detail, unit="")
        else:
            self._progress.update(self._status, description=description, detail=detail)
        self._progress.refresh()

    def _clear_status(self) -> None:
        if self._status is not None:
            self._progress.remove_task(self._status)
            self._status = None

    def _draw(self, what: str, done: int, total: int, detail: str, unit: str) -> None:
        with self._lock:
            if what not in self._bars:
                bar = self._progress.add_task(escape(what), total=total, detail="", unit=unit)
                self._bars[what] = (bar, self._owner())
                at_work = self._at_work.get(threading.get_ident())
                if at_work is not None and at_work.step:  # the step before this bar is over
                    at_work.step = ""
                    self._show_status()
            now = time.monotonic()
            if now - self._redrawn.get(what, 0.0) < _REDRAW_SECONDS and done < total:
                return
            self._redrawn[what] = now
            bar, _ = self._bars[what]
            self._progress.update(bar, completed=done, total=total, detail=escape(detail), unit=unit)

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
                quiet = now - self._last_line >= self._interval
                running = {w: t for w, t in self._tasks.items() if t.done < t.total}
                for what, task in running.items():
                    self._say(task.line(what, now))
                if not (quiet or running):
                    continue
                busy = {task.stage for task in running.values()}
                for at_work in self._at_work.values():
                    if at_work.stage not in busy:  # a stage at work that reports no progress
                        stage = f"{self.counter(at_work.stage)}{at_work.stage}"
                        self._say(f"{stage}: working, {_duration(now - at_work.since)} so far")
