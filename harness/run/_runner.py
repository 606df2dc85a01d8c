"""The runner: each stage in order, skipped when its manifest says it is up to date, with the run
log rewritten after every stage so that an interrupted run says where it stopped."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import suppress

from ._log import Manifests, RunLog, StageStatus
from ._stage import Stage, StageOutcome

__all__ = ["listed_paths", "run_stages"]


def run_stages(
    stages: Sequence[Stage],
    manifests: Manifests,
    run_log: RunLog,
    *,
    on_start: Callable[[str], None] | None = None,
    on_stage: Callable[[StageOutcome], None] | None = None,
    spent: Callable[[str], float | None] | None = None,
) -> tuple[StageOutcome, ...]:
    """Run (or skip) `stages` in order, calling `on_start(name)` before a stage's work and
    `on_stage(outcome)` after it (or its skip). A stage that raises is recorded as failed
    (interrupted on Ctrl-C or SIGTERM) in run.json and log.txt, and the error propagates.
    `spent(name)`: the dollars the stage spent in this invocation (None: it spends none),
    recorded with its outcome, whatever that is."""
    cost = spent or (lambda name: None)
    layout = manifests.layout
    outcomes: list[StageOutcome] = []
    for stage in stages:
        started = time.perf_counter()
        fingerprint, inputs = stage.fingerprint()
        if manifests.up_to_date(stage.name, fingerprint) and stage.reusable():
            outcome = StageOutcome(stage.name, StageStatus.SKIPPED, 0.0, "up to date")
            manifests.log(f"{stage.name}: skipped (inputs unchanged)")
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
            run_log.record(stage.name, StageStatus.RUNNING, None, "")
            run_log.write(layout.run_log)
            try:  # from here a Ctrl-C is recorded as this stage's interruption, even while it is shown
                if on_start is not None:
                    on_start(stage.name)
                result = stage.run()
            except BaseException as error:
                status = (
                    StageStatus.INTERRUPTED if isinstance(error, KeyboardInterrupt) else StageStatus.FAILED
                )
                run_log.record(
                    stage.name, status, time.perf_counter() - started, str(error), cost(stage.name)
                )
                # The disk may be why the stage failed: its error, not the log's, is the news.
                with suppress(OSError):
                    manifests.log(f"{stage.name}: {status}: {type(error).__name__}: {error}")
                with suppress(OSError):
                    run_log.write(layout.run_log)
                raise
            manifests.finish(stage.name, fingerprint, inputs, stage.outputs(), result.manifest)
            detail = result.detail + (
                f" (ran again: {listed_paths(changed)} had changed on disk)" if changed else ""
            )
            outcome = StageOutcome(stage.name, StageStatus.RAN, time.perf_counter() - started, detail)
            manifests.log(f"{stage.name}: finished in {outcome.seconds:.1f} s: {result.detail}")
        ran = outcome.status is StageStatus.RAN
        run_log.record(
            stage.name, outcome.status, outcome.seconds, outcome.detail, cost(stage.name) if ran else None
        )
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


def _same_fingerprint(manifests: Manifests, stage: str, fingerprint: str) -> bool:
    manifest = manifests.read(stage)
    return bool(manifest) and manifest.get("fingerprint") == fingerprint and manifest.get("status") == "done"


def listed_paths(paths: list[str]) -> str:
    """The first path, and how many more."""
    return paths[0] + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")
