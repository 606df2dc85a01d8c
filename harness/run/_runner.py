"""The runner: each stage in order, skipped when its manifest says it is up to date, with the run
log rewritten after every stage so that an interrupted run says where it stopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import suppress

from ._log import Manifests, RunLog, StageStatus
from ._stage import Stage, StageOutcome

__all__ = ["run_stages"]


def run_stages(
    stages: Sequence[Stage],
    manifests: Manifests,
    run_log: RunLog,
    *,
    on_start: Callable[[str], None] | None = None,
    on_stage: Callable[[StageOutcome], None] | None = None,
) -> tuple[StageOutcome, ...]:
    """Run (or skip) `stages` in order, calling `on_start(name)` before a stage's work and
    `on_stage(outcome)` after it (or its skip). A stage that raises is recorded as failed
    (interrupted on Ctrl-C or SIGTERM) in run.json and log.txt, and the error propagates."""
    layout = manifests.layout
    outcomes: list[StageOutcome] = []
    for stage in stages:
        started = time.perf_counter()
        fingerprint, inputs = stage.fingerprint()
        if manifests.up_to_date(stage.name, fingerprint) and stage.reusable():
            outcome = StageOutcome(stage.name, StageStatus.SKIPPED, 0.0, "up to date")
            manifests.log(f"{stage.name}: skipped (inputs unchanged)")
        else:
            manifests.invalidate(stage.name)
            manifests.log(f"{stage.name}: started")
            run_log.record(stage.name, StageStatus.RUNNING, None, "")
            run_log.write(layout.run_log)
            if on_start is not None:
                on_start(stage.name)
            try:
                result = stage.run()
            except BaseException as error:
                status = (
                    StageStatus.INTERRUPTED if isinstance(error, KeyboardInterrupt) else StageStatus.FAILED
                )
                run_log.record(stage.name, status, time.perf_counter() - started, str(error))
                # The disk may be why the stage failed: its error, not the log's, is the news.
                with suppress(OSError):
                    manifests.log(f"{stage.name}: {status}: {type(error).__name__}: {error}")
                with suppress(OSError):
                    run_log.write(layout.run_log)
                raise
            manifests.finish(stage.name, fingerprint, inputs, stage.outputs(), result.manifest)
            outcome = StageOutcome(stage.name, StageStatus.RAN, time.perf_counter() - started, result.detail)
            manifests.log(f"{stage.name}: finished in {outcome.seconds:.1f} s: {result.detail}")
        run_log.record(stage.name, outcome.status, outcome.seconds, outcome.detail)
        run_log.write(layout.run_log)
        outcomes.append(outcome)
        if on_stage is not None:
            on_stage(outcome)
        try:
            stage.check_outputs()
        except Exception as error:
            manifests.log(f"stopped after the {stage.name} stage: {error}")
            raise
    return tuple(outcomes)
