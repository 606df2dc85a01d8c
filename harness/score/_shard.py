"""One shard scored: its rows read from the input, the monitor's scorer run over them in
micro-batches (`harness.monitor.ProbeScorer`, the bundle's threshold and merge rule), the expert
asked for the delegated rows in one cached call when asked to, and the rows written as one
Parquet file, atomically and never twice. `ShardScorer` loads the bundle and the model once and
then scores any number of shards: it is what a Ray actor holds."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import calibrate
from probes import BATCH_TOKENS, MAX_BATCH_TOKENS

from .._errors import InputError
from ..monitor import expert_answer, read_bundle
from ._defaults import DEFAULT_MICRO_BATCH
from ._inputs import InputRow, read_rows
from ._layout import ScoreLayout
from ._plan import ShardTask, shard_record
from ._stop import RayStop

if TYPE_CHECKING:
    import pyarrow as pa

    from experts import ExpertClient, ExpertSpec, Item, ItemResult, RunStats, ScoreCache

    from ..monitor import ProbeScorer

__all__ = ["OUTPUT_COLUMNS", "ScoreOptions", "ShardDone", "ShardScorer", "output_schema"]

OUTPUT_COLUMNS = (
    "id",
    "probe",
    "dv",
    "delegated",
    "expert",
    "score",
    "label",
    "truncated",
    "reason",
    "true_label",
)
SHARD_RECORD_VERSION = 1
REFUSED = "refused"  # a row's reason when the chat template refuses its conversation


@dataclass(frozen=True)
class ScoreOptions:
    """How to score (picklable: a Ray actor's constructor argument)."""

    bundle: Path
    out: Path
    expert: bool = False  # ask the bundle's expert for delegated rows
    expert_url: str | None = None  # the expert at another URL than the bundle's
    expert_cache: Path | None = None  # the expert cache (SQLite); None: no cache
    model: str | None = None  # another copy of the same weights, as `ctd monitor serve --model`
    micro_batch: int = DEFAULT_MICRO_BATCH
    batch_tokens: int = BATCH_TOKENS  # padded tokens in one forward pass at most
    threads: int | None = None  # torch threads in this process (a Ray CPU actor sets its share)

    def check(self) -> None:
        if self.micro_batch < 1:
            raise InputError(f"--micro-batch {self.micro_batch}: must be at least 1")
        if not 1 <= self.batch_tokens <= MAX_BATCH_TOKENS:
            raise InputError(f"--batch-tokens {self.batch_tokens}: must lie in 1..{MAX_BATCH_TOKENS}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"threads {self.threads}: must be at least 1")


@dataclass(frozen=True)
class ShardDone:
    index: int
    rows: int
    tokens: int  # monitored-model tokens of the shard (its cost)
    delegated: int
    expert_calls: int  # delegated rows sent to the expert (not answered from the cache)
    seconds: float
    written: bool  # False when the shard file was already there (nothing redone)
    expert_failed: int = 0  # delegated rows left without an expert score (asked again on rerun)
    refused: int = 0  # rows the chat template refused: no scores, the reason says why
    reused: int = 0  # rows whose probe side came from the shard's earlier file (not the model)
    expert_in_batch: int = 0  # of expert_failed: requests out in a batch file (nothing sent)

    @property
    def model_rows(self) -> int:
        """Rows this shard put through the model (what a rows/s rate counts)."""
        return self.rows - self.reused

    @classmethod
    def from_record(cls, record: dict[str, Any], *, written: bool) -> ShardDone:
        return cls(
            index=int(record["index"]),
            rows=int(record["rows"]),
            tokens=int(record["tokens"]),
            delegated=int(record["delegated"]),
            expert_calls=int(record["expert_calls"]),
            seconds=float(record["seconds"]),
            written=written,
            expert_failed=int(record.get("expert_failed", 0)),
            refused=int(record.get("refused", 0)),
            reused=int(record.get("reused", 0)),
            expert_in_batch=int(record.get("expert_in_batch", 0)),
        )


class ShardScorer:
    """`ShardScorer(options)(task)` -> ShardDone. Idempotent: a shard file already there (with the
    task's rows) is not rewritten."""

    def __init__(self, options: ScoreOptions, *, stop: RayStop | None = None) -> None:
        """`stop`: a Ray job's stop board (`harness.score._stop`), which the expert calls watch."""
        options.check()
        if options.threads is not None:
            import torch

            torch.set_num_threads(options.threads)
        self.options = options
        self.layout = ScoreLayout(Path(options.out))
        self.bundle = read_bundle(Path(options.bundle))
        self.spec: ExpertSpec | None = self.bundle.expert_spec(options.expert_url) if options.expert else None
        # One event loop, expert client and cache for the scorer's life, opened at the first
        # expert call: the client's breaker then sees every shard's failures (a dead endpoint
        # stops the job instead of failing each shard's rows anew; a revoked key's 401s are the
        # rows' failures, which --max-failed judges at the end), and an actor
        # scoring thousands of shards holds one SQLite engine, not one per shard.
        self._loop: asyncio.Runner | None = None
        self._client: ExpertClient | None = None
        self._cache: ScoreCache | None = None
        self._scorer: ProbeScorer | None = None
        self.loading_seconds = 0.0  # spent loading the model (not a shard's scoring time)
        self._stop = stop

    @property
    def scorer(self) -> ProbeScorer:
        """The bundle's probes over the model, loaded at the first row that needs them: a rerun
        that only asks the expert again for a shard's failed rows loads no model."""
        if self._scorer is None:
            from ..monitor import ProbeScorer  # torch and the model load here, not at import

            started = time.perf_counter()
            scorer = ProbeScorer.load(
                self.bundle.layout.safety_probe,
                self.bundle.layout.dv_probe,
                model=self.options.model,
                batch_tokens=self.options.batch_tokens,
            )
            # Micro-batches are cut into passes by what a pass costs on this machine.
            scorer.fit_pass_cost(self.options.micro_batch)
            self._scorer = scorer
            self.loading_seconds += time.perf_counter() - started
        return self._scorer

    def __call__(self, task: ShardTask) -> ShardDone:
        target = self.layout.shard(task.index)
        record = shard_record(target)
        if task.done_by(record):
            assert record is not None
            return ShardDone.from_record(record, written=False)
        if task.wrote(record):
            assert record is not None
            # Scored again for its expert failures, a shard an earlier job wrote with more rows
            # (a job rerun with a smaller --limit) keeps every row: the file it replaces held them.
            task = replace(task, stop_row=max(task.stop_row, int(record.get("stop_row", task.stop_row))))
        started, loaded_before = time.perf_counter(), self.loading_seconds
        rows = read_rows(
            Path(task.path),
            start=task.byte_offset if task.byte_offset is not None else task.first_row,
            line=task.first_line,
            first_index=task.first_row,
            count=task.rows,
        )
        # A shard scored again (for its expert failures, or for rows a smaller --limit left out)
        # keeps the probe side of the rows its file holds: only the rows past them meet the model.
        scores, sides, tokens = _probe_side_of(target, record, rows) if task.wrote(record) else ([], [], 0)
        reused = len(scores)
        # Each row's tokens, or why the model's chat template refuses the conversation (the
        # monitor answers such a request with a 4xx; here the row says why and the job goes on:
        # one odd conversation among millions must not stop it).
        fresh = (
            [
                str(t) if isinstance(t, InputError) else t
                for t in self.scorer.tokens_each([row.item.conversation for row in rows[reused:]])
            ]
            if reused < len(rows)
            else []
        )
        scorable = [(reused + i, t) for i, t in enumerate(fresh) if not isinstance(t, str)]
        scores += [None] * len(fresh)  # None: refused
        sides += [t if isinstance(t, str) else t.truncated for t in fresh]
        tokens += sum(len(t.ids) for _, t in scorable)
        for at in range(0, len(scorable), self.options.micro_batch):
            group = scorable[at : at + self.options.micro_batch]
            for (i, _), pair in zip(group, self.scorer.score([t for _, t in group]), strict=True):
                scores[i] = pair
        delegated = [i for i, pair in enumerate(scores) if pair and self.bundle.delegates(pair[1])]
        answers, calls, in_batch = self._ask(task, rows, delegated)
        table = self._table(rows, sides, scores, answers)
        record = {
            "version": SHARD_RECORD_VERSION,
            "index": task.index,
            **task.row_range(),
            "rows": len(rows),
            "tokens": tokens,
            "refused": sum(isinstance(side, str) for side in sides),
            "delegated": len(delegated),
            "expert_calls": calls,
            "expert_failed": sum(answers[i][0] is None for i in delegated) if self.spec is not None else 0,
            "expert_in_batch": in_batch,
            "seconds": time.perf_counter() - started - (self.loading_seconds - loaded_before),
            "reused": reused,
        }
        _write_once(table, record, self.layout, task.index, replace=target.exists())
        return ShardDone.from_record(record, written=True)

    def _ask(
        self, task: ShardTask, rows: list[InputRow], delegated: list[int]
    ) -> tuple[dict[int, tuple[float | None, str | None]], int, int]:
        """{row index: (expert score, reason)} for the delegated rows, how many were sent to the
        expert (the rest came from the cache or are out in a batch file) and how many are out in
        a batch file. Without the expert: no score, "expert-disabled"."""
        if self.spec is None or not delegated:
            return {i: (None, "expert-disabled") for i in delegated}, 0, 0
        from experts import FailureKind, Item, Stopped

        # Ids unique within the call (an input's id may repeat); the cache is keyed by content.
        items = [Item(f"{task.index}-{i}", rows[i].item.conversation) for i in delegated]
        client = self._expert_client()
        # A Ray job's actor is registered on its stop board until the answers are committed.
        with self._stop.asking() if self._stop is not None else nullcontext() as board:
            try:
                # A stop drains the client: the answers in flight are committed, not paid twice.
                results, stats = self._expert_loop().run(self._score(client, items, board))
            except Stopped:
                self._close_client()  # drained: it sends nothing more (an actor that lives on opens another)
                raise KeyboardInterrupt from None  # what a stop signal is everywhere else in a job
        answers = {i: expert_answer(result) for i, result in zip(delegated, results, strict=True)}
        in_batch = stats.failure_reasons[FailureKind.IN_BATCH.value]  # failed without being sent
        return answers, stats.scored + stats.failed - in_batch, in_batch

    async def _score(
        self, client: ExpertClient, items: list[Item], board: Any
    ) -> tuple[list[ItemResult], RunStats]:
        """One `score` call that a stop signal drains, as does a Ray job's stop board (`board`,
        None outside Ray: `RayStop.watch`)."""
        from ..stages import score_stoppable

        if board is None:
            return await score_stoppable(client, items, opened=True)
        watcher = asyncio.create_task(RayStop.watch(board, client))
        try:
            return await score_stoppable(client, items, opened=True)
        finally:
            watcher.cancel()
            with suppress(Exception, asyncio.CancelledError):  # a failed look must not cost the answers
                await watcher

    def _expert_loop(self) -> asyncio.Runner:
        if self._loop is None:
            self._loop = asyncio.Runner()
        return self._loop

    def _expert_client(self) -> ExpertClient:
        """The scorer's one client, open (see `__init__`)."""
        if self._client is None:
            from experts import ExpertClient, ScoreCache

            assert self.spec is not None
            if self.options.expert_cache is not None:
                self._cache = ScoreCache(self.options.expert_cache)
            client = ExpertClient(self.spec, cache=self._cache)
            self._expert_loop().run(client.__aenter__())
            self._client = client
        return self._client

    def _table(
        self,
        rows: list[InputRow],
        sides: list[str | bool],
        scores: list[tuple[float, float] | None],
        answers: dict[int, tuple[float | None, str | None]],
    ) -> pa.Table:
        """The shard's columns; `sides`: each row's truncation, or why the chat template refused it."""
        import pyarrow as pa

        columns: dict[str, list[Any]] = {name: [] for name in OUTPUT_COLUMNS}
        for i, (row, side, pair) in enumerate(zip(rows, sides, scores, strict=True)):
            if isinstance(side, str) or pair is None:  # refused by the chat template: no scores
                refused = {
                    "id": row.item.id,
                    "delegated": False,
                    "truncated": False,
                    "reason": f"{REFUSED}: {side}",
                    "true_label": row.label,
                }
                for name in OUTPUT_COLUMNS:
                    columns[name].append(refused.get(name))
                continue
            probe, dv = pair
            answer, reason = answers.get(i, (None, "not-delegated"))
            expert = self.bundle.expert_score(answer)
            score = self.bundle.merged(probe, expert)
            for name, value in (
                ("id", row.item.id),
                ("probe", probe),
                ("dv", dv),
                ("delegated", i in answers),
                ("expert", expert),
                ("score", score),
                ("label", int(calibrate.predict(score))),
                ("truncated", side),
                ("reason", reason),
                ("true_label", row.label),
            ):
                columns[name].append(value)
        return pa.table(columns, schema=output_schema())

    def close(self) -> None:
        """Let the model and the expert cache go (a Ray actor's end; a process's exit does the same)."""
        self._scorer = None
        try:
            self._close_client()
        finally:
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.close()

    def _close_client(self) -> None:
        """Close the expert client (committing the answers handed over) and its cache."""
        client, self._client = self._client, None
        try:
            if client is not None and self._loop is not None:
                self._loop.run(client.__aexit__(None, None, None))
        finally:
            if self._cache is not None:
                self._cache.close()
                self._cache = None


def _probe_side_of(
    path: Path, record: dict[str, Any] | None, rows: list[InputRow]
) -> tuple[list[tuple[float, float] | None], list[str | bool], int]:
    """The probe side of the first rows of `rows` as the shard file at `path` holds them (written by
    an earlier job for the same task: `record` is its record): each row's (probe, DV) scores or
    None, its truncation or why the chat template refused it, and their tokens. Nothing when the
    file cannot be trusted with it: unreadable, of another record version, or its rows not the
    first of `rows` (their ids differ)."""
    import pyarrow.parquet as pq

    nothing: tuple[list[tuple[float, float] | None], list[str | bool], int] = ([], [], 0)
    if record is None or record.get("version") != SHARD_RECORD_VERSION:
        return nothing
    try:
        earlier = pq.read_table(path, columns=["id", "probe", "dv", "truncated", "reason"]).to_pylist()
    except Exception:  # damaged or changed under us: the rows meet the model again
        return nothing
    if len(earlier) != record.get("rows") or len(earlier) > len(rows):
        return nothing
    if any(old["id"] != row.item.id for old, row in zip(earlier, rows, strict=False)):
        return nothing
    scores: list[tuple[float, float] | None] = []
    sides: list[str | bool] = []
    for old in earlier:
        reason = old["reason"] or ""
        if old["probe"] is None or old["dv"] is None:
            if not reason.startswith(f"{REFUSED}: "):
                return nothing
            scores.append(None)
            sides.append(reason.removeprefix(f"{REFUSED}: "))
        else:
            scores.append((old["probe"], old["dv"]))
            sides.append(bool(old["truncated"]))
    return scores, sides, int(record.get("tokens", 0))


def output_schema() -> pa.Schema:
    """The columns of every shard file (the same in each, whatever its rows hold)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("probe", pa.float64()),
            ("dv", pa.float64()),
            ("delegated", pa.bool_()),
            ("expert", pa.float64()),
            ("score", pa.float64()),
            ("label", pa.int8()),
            ("truncated", pa.bool_()),
            ("reason", pa.string()),
            ("true_label", pa.int8()),
        ]
    )


# What link(2) answers on a file system that has no hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _write_once(
    table: pa.Table, record: dict[str, Any], layout: ScoreLayout, index: int, *, replace: bool
) -> None:
    """Write the shard under a temporary name, then give it its name with a hard link, which fails
    when a shard file is there already (another worker wrote it meanwhile: its rows are the same,
    and the first one stays). `replace`: the file there is not done (fewer rows, the last shard of
    a job tried with a smaller --limit, or rows the expert failed on) and is replaced. A file
    system without hard links (some FUSE mounts of buckets) gets a rename where no file is yet."""
    import pyarrow.parquet as pq

    temp = layout.shard_temp(index)
    target = layout.shard(index)
    table = table.replace_schema_metadata({b"ctd": json.dumps(record).encode()})
    try:
        pq.write_table(table, temp)
        if replace:
            os.replace(temp, target)
            return
        try:
            os.link(temp, target)
        except FileExistsError:  # another worker's file: the same rows, kept
            pass
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
            if not target.exists():
                os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
