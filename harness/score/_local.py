"""A planned job scored in this one process: the pending shards in order, one `ShardScorer`, the
progress in shards with rows/s, and the job's totals (the shards written before included, from
their files' records)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._errors import add_also
from ._plan import ScorePlan, shard_record
from ._shard import ScoreOptions, ShardDone, ShardScorer

__all__ = ["Progress", "ScoreSummary", "score_local", "summarize"]

# (what, done, total, detail, unit): harness.run.StageProgress's call
Progress = Callable[[str, int, int, str, str], None]
PROGRESS_WHAT = "score"


@dataclass(frozen=True)
class ScoreSummary:
    """The job's totals: every shard of the plan, written now or before."""

    out: Path
    rows: int
    shards: int
    written: int  # shards written by this run
    skipped: int  # shards that were there already
    delegated: int
    expert_calls: int
    expert_failed: int  # delegated rows without an expert score: asked again by a rerun
    refused: int  # rows the chat template refused (their reason says why)
    tokens: int
    seconds: float  # this run's wall time
    rows_scored: int  # rows this run put through the model (what rows/s counts)
    reused: int = 0  # rows of the shards it wrote whose probe side came from their earlier file
    expert_in_batch: int = 0  # of expert_failed: requests out in a batch file (nothing sent)

    @property
    def rows_per_second(self) -> float:
        return self.rows_scored / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "out": str(self.out), "rows_per_second": self.rows_per_second}

    def line(self) -> str:
        failed = f" ({self.expert_failed:,} rows failed: rerun to ask again)" if self.expert_failed else ""
        if self.expert_in_batch:
            failed = (
                f" ({self.expert_failed:,} rows failed, {self.expert_in_batch:,} of them out in a batch file:"
                " rerun after its ctd query --batch-in)"
            )
        refused = f"; {self.refused:,} rows refused by the chat template (see reason)" if self.refused else ""
        reused = f" ({self.reused:,} rows' probe scores kept from their shard files)" if self.reused else ""
        return (
            f"{self.rows:,} rows in {self.shards} shards ({self.written} written, {self.skipped} "
            f"already there): {self.delegated:,} delegated, {self.expert_calls:,} expert calls{failed}, "
            f"{self.tokens:,} tokens{refused}; {self.rows_per_second:.1f} rows/s overall{reused}; "
            f"wrote {self.out}"
        )


def summarize(plan: ScorePlan, done: Iterable[ShardDone], seconds: float) -> ScoreSummary:
    """The totals of `plan`: the shards this run did (`done`) and the others from their files."""
    by_index = {d.index: d for d in done}
    every: list[ShardDone] = []
    for task in plan.shards:
        if task.index in by_index:
            every.append(by_index[task.index])
            continue
        record = shard_record(plan.layout.shard(task.index))
        if task.wrote(record):
            assert record is not None
            every.append(ShardDone.from_record(record, written=False))  # expert failures counted too
    written = [d for d in every if d.written]
    return ScoreSummary(
        out=plan.out,
        rows=sum(d.rows for d in every),
        shards=len(plan.shards),
        written=len(written),
        skipped=len(every) - len(written),
        delegated=sum(d.delegated for d in every),
        expert_calls=sum(d.expert_calls for d in every),
        expert_failed=sum(d.expert_failed for d in every),
        refused=sum(d.refused for d in every),
        tokens=sum(d.tokens for d in every),
        seconds=seconds,
        rows_scored=sum(d.model_rows for d in written),
        reused=sum(d.reused for d in written),
        expert_in_batch=sum(d.expert_in_batch for d in every),
    )


def score_local(plan: ScorePlan, options: ScoreOptions, *, progress: Progress | None = None) -> ScoreSummary:
    """Score the plan's pending shards here, in order (the model is loaded only when one is
    pending). `progress` gets shards done/total with rows/s."""
    started = time.perf_counter()
    with plan.held():
        pending = plan.pending()
        total = len(plan.shards)
        finished = total - len(pending)
        report = progress or (lambda *_: None)
        report(PROGRESS_WHAT, finished, total, "", "shards")
        done: list[ShardDone] = []
        if pending:
            scorer = ShardScorer(options)
            begun = time.perf_counter()
            rows = 0  # put through the model: rows/s leaves out reused rows and the model's loading
            try:
                for task in pending:
                    result = scorer(task)
                    done.append(result)
                    rows += result.model_rows
                    finished += 1
                    rate = rows / max(time.perf_counter() - begun - scorer.loading_seconds, 1e-9)
                    report(PROGRESS_WHAT, finished, total, f"{rate:.1f} rows/s", "shards")
            except BaseException as error:
                _close_after(scorer, error)
                raise
            scorer.close()
    return summarize(plan, done, time.perf_counter() - started)


def _close_after(scorer: ShardScorer, error: BaseException) -> None:
    """Close the scorer of a job that failed with `error`, which stays the error raised: one of the
    closing's own (committing the expert's answers) becomes a note on it, not its replacement."""
    try:
        scorer.close()
    except Exception as closing:
        add_also(error, f"closing the shard scorer (committing the expert's answers) failed: {closing}")
