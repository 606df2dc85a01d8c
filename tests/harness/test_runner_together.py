"""Stages run at the same time (`harness.run.Together`): both at work at once, their records and
outcomes as in a sequential run, a failure or a stop of either handled as `ctd eval` needs it (the
probe stage's work kept when the expert fails; the expert client drained when the probe stage
fails or Ctrl-C lands). The stages here are small real ones that write their output files."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

# Private: the relay is what a stage run beside the main thread listens to for stops
from harness._signals import StopRelay, stop_signals
from harness.run import (
    Manifests,
    RunLayout,
    RunLog,
    StageProgress,
    StageResult,
    StageStatus,
    Together,
    run_stages,
)

WAIT = 20.0  # seconds: a stage that waits longer than this for the other is not run beside it


@dataclass
class Working:
    """A stage in the calling thread: waits for `ready` (when given), sets `started`, then fails
    with `error` or writes its output."""

    layout: RunLayout
    name: str = "probe"
    ready: threading.Event | None = None
    started: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    seconds: float = 0.0
    until: Callable[[], bool] | None = None  # after `seconds`, the stage waits for this to hold
    ran: int = 0

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        return self.name, {}

    def outputs(self) -> list[Path]:
        return [self.layout.root / f"{self.name}.txt"]

    def reusable(self) -> bool:
        return True

    def run(self) -> StageResult:
        self.ran += 1
        self.started.set()
        if self.ready is not None and not self.ready.wait(WAIT):
            raise AssertionError(f"{self.name}: the stage beside it never started")
        time.sleep(self.seconds)
        deadline = time.monotonic() + WAIT
        while self.until is not None and not self.until():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: what it waits for never came while it worked")
            time.sleep(0.01)
        if self.error is not None:
            raise self.error
        self.outputs()[0].write_text(self.name)
        return StageResult(f"{self.name} done")

    def check_outputs(self) -> None:
        pass


@dataclass
class Asking:
    """A stage as the query stage is: an event loop that takes stops in `stop_signals` (the
    first drains, here: stops at the next answer) and raises KeyboardInterrupt when stopped.
    It answers `items` one per `pause` seconds."""

    layout: RunLayout
    items: int = 10
    pause: float = 0.05
    fail_after: int | None = None
    answered: int = 0
    stopped_at: float | None = None
    started: threading.Event = field(default_factory=threading.Event)
    name: ClassVar[str] = "query"

    def fingerprint(self) -> tuple[str, dict[str, Any]]:
        return self.name, {}

    def outputs(self) -> list[Path]:
        return [self.layout.root / "query.txt"]

    def reusable(self) -> bool:
        return True

    def run(self) -> StageResult:
        async def ask() -> bool:
            stopped = asyncio.Event()
            with stop_signals(stopped.set):
                self.started.set()
                for _ in range(self.items):
                    if stopped.is_set():
                        self.stopped_at = time.monotonic()
                        return False
                    await asyncio.sleep(self.pause)
                    self.answered += 1
                    if self.fail_after is not None and self.answered >= self.fail_after:
                        raise RuntimeError("the expert went away")
            return True

        if not asyncio.run(ask()):
            raise KeyboardInterrupt
        self.outputs()[0].write_text(str(self.answered))
        return StageResult(f"{self.answered} answered")

    def check_outputs(self) -> None:
        pass


@pytest.fixture()
def layout(tmp_path: Path) -> RunLayout:
    (tmp_path / "run" / "manifests").mkdir(parents=True)
    return RunLayout(tmp_path / "run")


def run(layout: RunLayout, stages: list, **callbacks) -> tuple[RunLog, Any]:
    log = RunLog()
    log.started({})
    try:
        result = run_stages(stages, Manifests(layout), log, **callbacks)
    except BaseException as error:  # the test reads which error came out
        result = error
    return json.loads(layout.run_log.read_text()), result


def statuses(record: dict) -> dict[str, str]:
    return {name: stage["status"] for name, stage in record["stages"].items()}


def ctrl_c_after_answers(query: Asking, answers: int, signum: int = signal.SIGINT) -> None:
    """Ctrl-C (or `signum`) to the calling (main) thread once `query` has answered `answers` items."""
    main = threading.get_ident()

    def interrupt() -> None:
        while query.answered < answers:
            time.sleep(0.01)
        signal.pthread_kill(main, signum)

    threading.Thread(target=interrupt, daemon=True).start()


def test_together_stages_work_at_the_same_time_and_report_in_order(layout) -> None:
    """The probe stage waits for the query stage to have started (it fails after WAIT seconds if
    they ran one after the other), the query stage finishes first, and the outcomes still come
    probe first; each is recorded and its manifest written; the callbacks come one at a time."""
    query = Asking(layout, pause=0.02)
    seen: list[str] = []
    # The probe stage ends only once the query stage's end is told (a fixed 1.5 s could run out on
    # a loaded machine); a run that told ends in stage order only would fail it after WAIT.
    probe = Working(layout, ready=query.started, until=lambda: "done query" in seen)
    record, outcomes = run(
        layout,
        [Together((probe, query)), Working(layout, name="dv")],
        on_start=lambda name: seen.append(f"start {name}"),
        on_stage=lambda outcome: seen.append(f"done {outcome.stage}"),
    )
    assert not isinstance(outcomes, BaseException), outcomes
    assert [o.stage for o in outcomes] == ["probe", "query", "dv"]
    assert all(o.status is StageStatus.RAN for o in outcomes)
    assert statuses(record) == {"probe": "ran", "query": "ran", "dv": "ran"}
    assert seen.index("done query") < seen.index("done probe") < seen.index("start dv")
    assert (layout.root / "query.txt").read_text() == "10"
    assert all(Manifests(layout).read(name)["status"] == "done" for name in ("probe", "query", "dv"))

    # A rerun skips both, as it would have run one after the other.
    again_probe, again_query = Working(layout), Asking(layout)
    _, outcomes = run(layout, [Together((again_probe, again_query))])
    assert [o.status for o in outcomes] == [StageStatus.SKIPPED, StageStatus.SKIPPED]
    assert again_probe.ran == 0 and again_query.answered == 0


def test_a_failing_first_stage_stops_the_one_beside_it(layout) -> None:
    """The probe stage fails while the query stage asks: the query stage is stopped through its
    relay (not left to answer all 400 items), recorded as interrupted, and the probe's error is
    the one raised."""
    query = Asking(layout, items=400)
    probe = Working(layout, ready=query.started, seconds=0.2, error=MemoryError("CUDA out of memory"))
    started = time.monotonic()
    record, error = run(layout, [Together((probe, query)), Working(layout, name="dv")])
    assert isinstance(error, MemoryError)
    assert time.monotonic() - started < 10
    assert query.answered < 100
    assert statuses(record) == {"probe": "failed", "query": "interrupted"}
    assert not (layout.root / "query.txt").exists()


def test_a_failing_stage_beside_lets_the_first_finish_then_raises(layout) -> None:
    """The query stage fails at its third answer: the failure is told at once (`on_failed`,
    while the probe stage still works), the probe stage finishes and keeps its manifest (a rerun
    skips it), the query's error is raised, and the stage after them does not run."""
    query = Asking(layout, fail_after=3)
    told: list[tuple[str, str, bool]] = []
    # The probe stage works until the failure is told (not a fixed 1.0 s the query stage could
    # outlast on a loaded machine); telling it only after the probe stage ends fails it after WAIT.
    probe = Working(layout, ready=query.started, until=lambda: bool(told))

    def on_failed(name: str, error: BaseException) -> None:
        told.append((name, str(error), (layout.root / "probe.txt").exists()))

    dv = Working(layout, name="dv")
    record, error = run(layout, [Together((probe, query)), dv], on_failed=on_failed)
    assert isinstance(error, RuntimeError) and str(error) == "the expert went away"
    assert told == [("query", "the expert went away", False)]
    assert statuses(record) == {"probe": "ran", "query": "failed"}
    assert Manifests(layout).read("probe")["status"] == "done"
    assert dv.ran == 0


@pytest.mark.usefixtures("python_interrupt_handler")
def test_ctrl_c_while_waiting_for_the_stage_beside_stops_it(layout) -> None:
    """The probe stage is done and the query stage still asks when Ctrl-C lands in the main
    thread: the query stage takes it through its relay and stops, and the run ends as
    interrupted with the probe stage recorded as done."""
    query = Asking(layout, items=400)
    probe = Working(layout, ready=query.started)
    ctrl_c_after_answers(query, 5)
    record, error = run(layout, [Together((probe, query))])
    assert isinstance(error, KeyboardInterrupt)
    assert query.answered < 100
    assert statuses(record) == {"probe": "ran", "query": "interrupted"}


def test_a_stop_while_a_stage_records_its_outputs_is_its_interruption(layout) -> None:
    """Ctrl-C lands after the stage's work, while the runner hashes its outputs for the
    manifest: run.json says the stage was interrupted (not "running" forever), and no manifest
    says it is done, so the rerun runs it again."""

    @dataclass
    class StoppedWhileHashed(Working):
        done: bool = False

        def run(self) -> StageResult:
            result = super().run()
            self.done = True
            return result

        def outputs(self) -> list[Path]:
            if self.done:  # asked for by the manifest, once the work is done
                raise KeyboardInterrupt
            return super().outputs()

    record, error = run(layout, [StoppedWhileHashed(layout)])
    assert isinstance(error, KeyboardInterrupt)
    assert statuses(record) == {"probe": "interrupted"}
    assert (Manifests(layout).read("probe") or {}).get("status") != "done"


def test_a_stop_between_two_event_loops_is_not_lost() -> None:
    """A stop the relay gets while its thread is outside any `stop_signals` block is delivered
    when the thread enters the next one, as many times as it was asked."""
    relay = StopRelay()
    calls: list[int] = []

    async def block() -> None:
        with stop_signals(lambda: calls.append(1)):
            await asyncio.sleep(0.05)

    def thread() -> None:
        with relay.bound():
            relay.stop()
            relay.stop()
            asyncio.run(block())

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert calls == [1, 1]


def test_a_first_stage_that_fails_before_it_starts_starts_nothing_beside_it(layout) -> None:
    """The probe stage's fingerprint fails (an input unreadable): the query stage is never
    started (nothing asked, nothing recorded) and the run does not wait for it."""

    class Unreadable(Working):
        def fingerprint(self) -> tuple[str, dict[str, Any]]:
            raise OSError("train.jsonl: permission denied")

    query = Asking(layout)
    log = RunLog()
    log.started({})
    with pytest.raises(OSError, match="permission denied"):
        run_stages([Together((Unreadable(layout), query))], Manifests(layout), log)
    assert query.answered == 0 and not query.started.is_set()
    assert log.invocations[-1].stages == {}


@pytest.fixture(params=["ctrl-c", "sigterm-nohup"])
def stop_signal(request: pytest.FixtureRequest) -> Iterator[int]:
    """The stop to send, with the handlers `ctd` has for it: Ctrl-C with Python's SIGINT handler;
    SIGTERM in a background job (nohup), where SIGINT is ignored and SIGTERM raises
    KeyboardInterrupt by itself (`harness.cli._app._terminate`)."""

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if request.param == "ctrl-c":
        handlers = {signal.SIGINT: signal.default_int_handler}
    else:
        handlers = {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: terminate}
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield signal.SIGINT if request.param == "ctrl-c" else signal.SIGTERM
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_stop_reaches_the_stage_beside_before_the_first_has_unwound(layout, stop_signal: int) -> None:
    """Ctrl-C (or, in a background job that ignores SIGINT, SIGTERM) lands while the probe stage
    works, and the probe stage is slow to unwind (a store's last commit): the query stage has
    stopped asking before the probe stage has unwound, not after it (its client would go on
    paying for new answers meanwhile). The probe stage unwinds once the query stage stops, or
    after 10 s (was a fixed 1.0 s with 0.5 s to spare, too little on a loaded machine)."""

    @dataclass
    class SlowToStop(Working):
        unwound_at: float = 0.0

        def run(self) -> StageResult:
            try:
                return super().run()
            except KeyboardInterrupt:
                deadline = time.monotonic() + 10.0
                while query.stopped_at is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.unwound_at = time.monotonic()
                raise

    query = Asking(layout, items=400)
    probe = SlowToStop(layout, ready=query.started, seconds=30.0)
    ctrl_c_after_answers(query, 5, stop_signal)
    record, error = run(layout, [Together((probe, query))])
    assert isinstance(error, KeyboardInterrupt)
    assert query.stopped_at is not None and query.stopped_at < probe.unwound_at
    assert statuses(record) == {"probe": "interrupted", "query": "interrupted"}


def test_bars_of_two_stages_each_keep_up_in_a_terminal() -> None:
    """Live bars: the probe stage reports every 5 ms while the query stage reports every 0.15 s;
    the query stage's bar shows its latest count (a redraw throttle shared by all bars dropped
    nearly every update of the slower one), and the probe stage's line leaves the query's bar."""
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    display = StageProgress(console)
    stop = threading.Event()

    def probe() -> None:
        display.stage_started("probe")
        n = 0
        while not stop.is_set():
            n += 1
            display("extract dev", n, 10**6, unit="tokens")
            time.sleep(0.005)
        display.print("probe done")

    with display:
        display.plan("run", ["probe", "query"])
        worker = threading.Thread(target=probe)
        worker.start()
        display.stage_started("query")
        for answered in range(1, 8):
            display("expert", answered, 100, unit="examples")
            time.sleep(0.15)
        stop.set()
        worker.join()
        shown = {task.description: task.completed for task in display._progress.tasks}
        assert shown["expert"] == 7, shown
        assert "extract dev" not in shown  # its stage's line removed it
        display.print("query done")


def test_a_line_from_a_thread_of_no_stage_leaves_the_stage_at_work_alone() -> None:
    """Plain lines: a stage skipped beside another prints its line from a thread with nothing at
    work; the working stage's task keeps its start, so its elapsed time and estimate go on."""
    out = io.StringIO()
    display = StageProgress(Console(file=out, width=200), interval=0.2)
    with display:
        display.stage_started("probe")
        display("extract dev", 10, 100, unit="tokens")
        time.sleep(1.1)
        other = threading.Thread(target=display.print, args=("[2/2] query skipped (up to date)",))
        other.start()
        other.join()
        display("extract dev", 20, 100, unit="tokens")
        deadline = time.monotonic() + 20  # a loaded machine's ticker comes late: poll, not a fixed 0.5 s
        while "extract dev: 20/100" not in out.getvalue():
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.05)
    lines = [line for line in out.getvalue().splitlines() if "extract dev: 20/100" in line]
    # At least the 1.1 s slept: the task kept its start (a restarted one shows 0s).
    assert lines and all(re.search(r" [1-9]\d*s elapsed, about \d+s left$", line) for line in lines), (
        out.getvalue()
    )
