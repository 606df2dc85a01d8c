"""One shard scored: its rows read from the input, the monitor's scorer run over them in
micro-batches (`harness.monitor.ProbeScorer`, the bundle's threshold and merge rule), the expert
asked for the delegated rows in one cached call when asked to, and the rows written as one
Parquet file, atomically and never twice. `ShardScorer` loads the bundle and the model once and
then scores any number of shards: it is what a Ray actor holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import calibrate

from .._errors import InputError
from ..monitor import expert_answer, read_bundle
from ._defaults import DEFAULT_MICRO_BATCH
from ._inputs import InputRow, read_rows
from ._layout import ScoreLayout
from ._plan import ShardTask, shard_record

if TYPE_CHECKING:
    import pyarrow as pa

    from experts import ExpertSpec, Item

    from ..monitor import ProbeScorer, Tokens

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
    threads: int | None = None  # torch threads in this process (a Ray CPU actor sets its share)

    def check(self) -> None:
        if self.micro_batch < 1:
            raise InputError(f"--micro-batch {self.micro_batch}: must be at least 1")
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
        )


class ShardScorer:
    """`ShardScorer(options)(task)` -> ShardDone. Idempotent: a shard file already there (with the
    task's rows) is not rewritten."""

    def __init__(self, options: ScoreOptions) -> None:
        options.check()
        if options.threads is not None:
            import torch

            torch.set_num_threads(options.threads)
        from ..monitor import ProbeScorer  # torch and the model load here, not at import

        self.options = options
        self.layout = ScoreLayout(Path(options.out))
        self.bundle = read_bundle(Path(options.bundle))
        self.spec: ExpertSpec | None = self.bundle.expert_spec(options.expert_url) if options.expert else None
        self.scorer: ProbeScorer = ProbeScorer.load(
            self.bundle.layout.safety_probe, self.bundle.layout.dv_probe, model=options.model
        )

    def __call__(self, task: ShardTask) -> ShardDone:
        target = self.layout.shard(task.index)
        record = shard_record(target)
        if task.matches(record):
            return ShardDone.from_record(record, written=False)
        started = time.perf_counter()
        rows = read_rows(
            Path(task.path),
            start=task.byte_offset if task.byte_offset is not None else task.first_row,
            line=task.first_line,
            first_index=task.first_row,
            count=task.rows,
        )
        tokens = [self._tokens(row) for row in rows]
        scores: list[tuple[float, float]] = []
        for at in range(0, len(tokens), self.options.micro_batch):
            scores += self.scorer.score(tokens[at : at + self.options.micro_batch])
        delegated = [i for i, (_, dv) in enumerate(scores) if self.bundle.delegates(dv)]
        answers, calls = self._ask(task, rows, delegated)
        table = self._table(rows, tokens, scores, answers)
        record = {
            "version": SHARD_RECORD_VERSION,
            "index": task.index,
            **task.row_range(),
            "rows": len(rows),
            "tokens": sum(len(t.ids) for t in tokens),
            "delegated": len(delegated),
            "expert_calls": calls,
            "seconds": time.perf_counter() - started,
        }
        _write_once(table, record, self.layout, task.index, replace=target.exists())
        return ShardDone.from_record(record, written=True)

    def _tokens(self, row: InputRow) -> Tokens:
        from probes import ProbeError

        try:
            return self.scorer.tokens(row.item.conversation)
        except ProbeError as error:  # the chat template refuses the conversation
            raise InputError(f"{row.where}: {str(error).removeprefix('example 0: ')}") from None

    def _ask(
        self, task: ShardTask, rows: list[InputRow], delegated: list[int]
    ) -> tuple[dict[int, tuple[float | None, str | None]], int]:
        """{row index: (expert score, reason)} for the delegated rows, and how many were sent to
        the expert (the rest came from the cache). Without the expert: no score, "expert-disabled"."""
        if self.spec is None or not delegated:
            return {i: (None, "expert-disabled") for i in delegated}, 0
        from experts import Item

        # Ids unique within the call (an input's id may repeat); the cache is keyed by content.
        items = [Item(f"{task.index}-{i}", rows[i].item.conversation) for i in delegated]
        results, stats = asyncio.run(self._score(items))
        answers = {i: expert_answer(result) for i, result in zip(delegated, results, strict=True)}
        return answers, stats.scored + stats.failed

    async def _score(self, items: list[Item]) -> Any:
        from experts import ExpertClient, ScoreCache

        cache = self.options.expert_cache
        assert self.spec is not None
        client = ExpertClient(self.spec, cache=ScoreCache(cache) if cache is not None else None)
        return await client.score(items)

    def _table(
        self,
        rows: list[InputRow],
        tokens: list[Tokens],
        scores: list[tuple[float, float]],
        answers: dict[int, tuple[float | None, str | None]],
    ) -> pa.Table:
        import pyarrow as pa

        columns: dict[str, list[Any]] = {name: [] for name in OUTPUT_COLUMNS}
        for i, (row, tok, (probe, dv)) in enumerate(zip(rows, tokens, scores, strict=True)):
            expert, reason = answers.get(i, (None, "not-delegated"))
            score = self.bundle.merged(probe, expert)
            for name, value in (
                ("id", row.item.id),
                ("probe", probe),
                ("dv", dv),
                ("delegated", i in answers),
                ("expert", expert),
                ("score", score),
                ("label", int(calibrate.predict(score))),
                ("truncated", tok.truncated),
                ("reason", reason),
                ("true_label", row.label),
            ):
                columns[name].append(value)
        return pa.table(columns, schema=output_schema())

    def close(self) -> None:
        """Let the model go (a Ray actor's end; a process's exit does the same)."""
        self.__dict__.pop("scorer", None)


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


def _write_once(
    table: pa.Table, record: dict[str, Any], layout: ScoreLayout, index: int, *, replace: bool
) -> None:
    """Write the shard under a temporary name, then give it its name with a hard link, which fails
    when a shard file is there already (another worker wrote it meanwhile: its rows are the same,
    and the first one stays). `replace`: the file there holds another row range (the last shard of
    a job tried with a smaller --limit) and is replaced."""
    import pyarrow.parquet as pq

    temp = layout.shard_temp(index)
    target = layout.shard(index)
    table = table.replace_schema_metadata({b"ctd": json.dumps(record).encode()})
    try:
        pq.write_table(table, temp)
        if replace:
            os.replace(temp, target)
            return
        with contextlib.suppress(FileExistsError):  # another worker's file: the same rows, kept
            os.link(temp, target)
    finally:
        temp.unlink(missing_ok=True)
