"""The runner: each stage in order, skipped when its manifest says it is up to date, with the run
log rewritten after every stage so that an interrupted run says where it stopped. Stages that
need nothing of each other may run at the same time (`Together`): the probe stage's GPU work and
the query stage's wait for the expert."""

from __future__ import annotations

import fcntl
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import FrameType

from .._errors import InputError
from .._signals import StopRelay
from ._layout import RunLayout
from ._log import Manifests, RunLog, StageStatus
from ._stage import Stage, StageOutcome

__all__ = ["Together", "listed_paths", "one_invocation", "run_stages"]


@contextmanager
def one_invocation(layout: RunLayout) -> Iterator[None]:
    """Hold the run folder for one `ctd eval` invocation for the block (a lock on `layout.lock`,
    which the system drops when the process ends): a second invocation of the same run meanwhile
    is one InputError. Each rewrites run.json and the stages' manifests whole, so two at once
    would lose one's record (its costs among them) and mix their stages' outputs."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{layout.root}: another `ctd eval` of this run is running; wait for it to end (or stop "
                "it), then rerun to resume"
            ) from None
        yield


@dataclass(frozen=True)
class Together:
    """Stages that run at the same time, none reading another's outputs: the first in the calling
    thread, where Ctrl-C and SIGTERM land, each other in a thread of its own that takes those
    stops through a `StopRelay` (in its `stop_signals` blocks; elsewhere it runs on to its end).

    When the first stage fails or is stopped, the others are stopped and waited for. When another
    fails, the first goes on to its end, so that its work is kept for the rerun, and the failure
    is raised then (`on_failed` says it at once). Their outcomes come in the order listed."""

    stages: tuple[Stage, ...]


@dataclass
class _Runner:
    manifests: Manifests
    run_log: RunLog
    on_start: Callable[[str], None] | None
    on_stage: Callable[[StageOutcome], None] | None
    on_failed: Callable[[str, BaseException], None] | None
    cost: Callable[[str], float | None]

    def __post_init__(self) -> None:
        # Stages run together call back from their own threads: one call at a time
        self._lock = threading.Lock()

    def record(
        self, stage: str, status: StageStatus, seconds: float | None, detail: str, cost: float | None
    ) -> None:
        self.run_log.record(stage, status, seconds, detail, cost)
        self.run_log.write(self.manifests.layout.run_log)

    def one(self, stage: Stage, then: Callable[[], None] = lambda: None) -> StageOutcome:
        """Run or skip `stage`, recording it; its error propagates. `then()` is called once it
        has started (or been skipped): the stages beside it start after its line."""
        manifests = self.manifests
        started = time.perf_counter()
        fingerprint, inputs = stage.fingerprint()
        if manifests.up_to_date(stage.name, fingerprint) and stage.reusable():
            outcome = StageOutcome(stage.name, StageStatus.SKIPPED, 0.0, "up to date")
            manifests.log(f"{stage.name}: skipped (inputs unchanged)")
            then()
        else:
            # Same inputs and settings but an output edited, truncated or deleted since: say so,
            # or the rerun looks like it ignored its manifest.
            changed = (
                manifests.changed_outputs(stage.name)
                if _same_fingerprint(manifests, stage.name, fingerprint)
                else []
            )
            manifests.invalidate(stage.name)
            if changed:
                shown = ", ".join(changed)
                manifests.log(
                    f"{stage.name}: outputs changed on disk since it ran ({shown}): running it again"
                )
            manifests.log(f"{stage.name}: started")
            self.record(stage.name, StageStatus.RUNNING, None, "", None)
            try:  # from here a Ctrl-C is recorded as this stage's interruption, even while it is shown
                if self.on_start is not None:
                    with self._lock:
                        self.on_start(stage.name)
                then()
                result = stage.run()
                # Still the stage's: a stop while its outputs are hashed is its interruption too
                manifests.finish(stage.name, fingerprint, inputs, stage.outputs(), result.manifest)
            except BaseException as error:
                status = (
                    StageStatus.INTERRUPTED if isinstance(error, KeyboardInterrupt) else StageStatus.FAILED
                )
                seconds = time.perf_counter() - started
                self.run_log.record(stage.name, status, seconds, str(error), self.cost(stage.name))
                # The disk may be why the stage failed: its error, not the log's, is the news.
                with suppress(OSError):
                    manifests.log(f"{stage.name}: {status}: {type(error).__name__}: {error}")
                with suppress(OSError):
                    self.run_log.write(manifests.layout.run_log)
                raise
            detail = result.detail + (
                f" (ran again: {listed_paths(changed)} had changed on disk)" if changed else ""
            )
            outcome = StageOutcome(stage.name, StageStatus.RAN, time.perf_counter() - started, detail)
            manifests.log(f"{stage.name}: finished in {outcome.seconds:.1f} s: {result.detail}")
        ran = outcome.status is StageStatus.RAN
        self.record(
            stage.name,
            outcome.status,
            outcome.seconds,
            outcome.detail,
            self.cost(stage.name) if ran else None,
        )
        if self.on_stage is not None:
            with self._lock:
                self.on_stage(outcome)
        try:
            stage.check_outputs()
        except Exception as error:
            manifests.log(f"stopped after the {stage.name} stage: {error}")
            raise
        return outcome

    def together(self, group: Together) -> list[StageOutcome]:
        first, *others = group.stages
        relays = [StopRelay() for _ in others]
        # Waited for with an Event: a Thread.join that Ctrl-C interrupts marks the thread as
        # ended while it runs on (CPython's bpo-45274 fix releases the thread's own lock).
        ended = [threading.Event() for _ in others]
        first_over = threading.Event()
        outcomes: dict[str, StageOutcome] = {}
        errors: dict[str, BaseException] = {}

        def beside(stage: Stage, relay: StopRelay, done: threading.Event) -> None:
            with relay.bound():
                try:
                    outcomes[stage.name] = self.one(stage)
                except BaseException as error:
                    errors[stage.name] = error
                    # Told now only while the first stage works on: else it is raised at once.
                    if self.on_failed is not None and not relay.stopped and not first_over.is_set():
                        with suppress(Exception), self._lock:
                            self.on_failed(stage.name, error)
                finally:
                    done.set()

        launched: list[tuple[threading.Event, StopRelay]] = []  # waited for: those that may run

        def start_beside() -> None:
            from experts import signals_held

            for stage, relay, done in zip(others, relays, ended, strict=True):
                name = f"ctd-stage-{stage.name}"
                thread = threading.Thread(target=beside, args=(stage, relay, done), name=name, daemon=True)
                # A stop is held while the thread starts, so that a started thread is always in
                # `launched` (waited for) and an unstarted one never is; it is delivered after.
                with signals_held():
                    thread.start()
                    launched.append((done, relay))

        stopped: BaseException | None = None
        with _passed_on_at_once(launched) as heard:
            try:
                outcomes[first.name] = self.one(first, then=start_beside)
            except BaseException as error:
                stopped = error
            finally:
                heard.raising = False  # from here a stop is passed on and counted, not raised
            first_over.set()
            # A stop reaches the stages beside as it comes, when the SIGINT handler could be
            # wrapped (`heard`); else, and for the first stage's failure, it is passed on here,
            # in a loop where a KeyboardInterrupt landing anywhere is counted and the wait goes on.
            owed = 1 if stopped is not None and not heard.count else 0
            while True:
                try:
                    while owed:
                        owed -= 1
                        for _, relay in launched:
                            relay.stop()
                    for done, _ in launched:
                        done.wait()
                    break
                except KeyboardInterrupt as error:
                    stopped = stopped or error
                    owed += 0 if heard.wrapped else 1
        if stopped is None and heard.count:  # stopped while waiting for the stages beside
            stopped = KeyboardInterrupt()
        if stopped is not None:
            raise stopped
        for stage in others:
            if stage.name in errors:
                raise errors[stage.name]
        return [outcomes[stage.name] for stage in group.stages]


@dataclass
class _Heard:
    wrapped: bool = False  # the SIGINT handler passes each stop on as it comes
    count: int = 0  # the stops it passed on
    raising: bool = True  # and then does what it did before (a KeyboardInterrupt)


@contextmanager
def _passed_on_at_once(launched: list[tuple[threading.Event, StopRelay]]) -> Iterator[_Heard]:
    """For the length of the block, SIGINT (and SIGTERM, which `ctd` turns into it; SIGTERM
    alone where SIGINT is ignored) first stops the stages beside, then, while `heard.raising`,
    does what it did: so the expert client starts draining at once, not once the first stage has
    unwound from the KeyboardInterrupt (a store's last commit), and a stop while the first stage
    is over and the others are waited for raises nothing there. Only in the main thread and
    where that signal has a Python handler; elsewhere `heard.wrapped` is False."""
    heard = _Heard()
    # SIGINT's handler, which `ctd`'s SIGTERM handler calls, so that one wrapper hears both; or,
    # where SIGINT is ignored (a background job, nohup) and SIGTERM raises by itself, SIGTERM's.
    # Never both: one SIGTERM would be passed on twice, and a second stop cuts a drain short.
    wrapped = signal.SIGINT if callable(signal.getsignal(signal.SIGINT)) else signal.SIGTERM
    previous = signal.getsignal(wrapped)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield heard
        return

    def stop_beside(signum: int, frame: FrameType | None) -> None:
        heard.count += 1
        for _, relay in list(launched):
            relay.stop()
        if heard.raising:
            previous(signum, frame)

    signal.signal(wrapped, stop_beside)
    heard.wrapped = True
    try:
        yield heard
    finally:
        signal.signal(wrapped, previous)


def run_stages(
    stages: Sequence[Stage | Together],
    manifests: Manifests,
    run_log: RunLog,
    *,
    on_start: Callable[[str], None] | None = None,
    on_stage: Callable[[StageOutcome], None] | None = None,
    on_failed: Callable[[str, BaseException], None] | None = None,
    spent: Callable[[str], float | None] | None = None,
) -> tuple[StageOutcome, ...]:
    """Run (or skip) `stages` in order, a `Together` group's at the same time, calling
    `on_start(name)` before a stage's work and `on_stage(outcome)` after it (or its skip), each
    from the thread that runs the stage, one at a time. A stage that raises is recorded as failed
    (interrupted on Ctrl-C or SIGTERM) in run.json and log.txt, and the error propagates;
    `on_failed(name, error)` is told at once when that stage ran beside another that goes on.
    `spent(name)`: the dollars the stage spent in this invocation (None: it spends none),
    recorded with its outcome, whatever that is."""
    runner = _Runner(manifests, run_log, on_start, on_stage, on_failed, spent or (lambda name: None))
    outcomes: list[StageOutcome] = []
    for item in stages:
        if isinstance(item, Together):
            outcomes.extend(runner.together(item))
        else:
            outcomes.append(runner.one(item))
    return tuple(outcomes)


def _same_fingerprint(manifests: Manifests, stage: str, fingerprint: str) -> bool:
    manifest = manifests.read(stage)
    return bool(manifest) and manifest.get("fingerprint") == fingerprint and manifest.get("status") == "done"


def listed_paths(paths: list[str]) -> str:
    """The first path, and how many more."""
    return paths[0] + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")
