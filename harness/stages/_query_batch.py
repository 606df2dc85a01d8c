"""`ctd query --batch-out` and `--batch-in`: a data set's expert requests as an OpenAI batch file
keyed by the cache key, and that batch's results committed to the cache (see `experts._batch`).
Nothing is sent to the expert by either: `vllm run-batch` or a provider's Batch API does that."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import experts
from experts import ExpertSpec, ScoreCache

from .._errors import InputError, check_failed_fraction
from ..data import atomic_path, check_writable, dumps, read_dataset
from ..run import Roots
from ._cost import estimate_queries
from ._query import keyed_items, write_query_table

__all__ = ["BatchInSummary", "BatchOutSummary", "batch_in", "batch_out"]

BATCH_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class BatchOutSummary:
    """What `--batch-out` wrote (see `experts.BatchRequests`); nothing was sent."""

    expert: str
    out: Path
    cache: Path
    total: int
    cached: int
    duplicates: int
    to_recover: int
    written: int
    lines: int
    tokens: int
    dropped: int
    usd: float = 0.0  # what the batch may cost at the expert's prices, with its batch discount
    estimate: str = ""  # the same as one line: "about N batch lines, about $X ..."
    pending: int = 0  # left out: out in an earlier batch file whose results were not read back
    pending_files: dict[str, int] = field(default_factory=dict)  # that file -> its requests left out

    def to_dict(self) -> dict[str, object]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class BatchInSummary:
    """What `--batch-in` committed (see `experts.BatchCommit`) and the table it wrote."""

    expert: str
    out: Path
    cache: Path
    total: int
    lines: int
    committed: int
    already: int
    failed: int
    unmatched: int
    missing: int
    failure_reasons: dict[str, int]
    dropped: int
    seconds: float
    usd: float  # what the batch's answers cost (their reported usage, with the batch discount)
    still_out: dict[str, int] = field(default_factory=dict)  # not in it, and still out: file -> how many

    def to_dict(self) -> dict[str, object]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}

    def still_out_line(self) -> str:
        """What is left of the batch files whose results these were not ("" when nothing)."""
        if not self.still_out:
            return ""
        return (
            f"{sum(self.still_out.values())} requests not in these results are still out, waiting for "
            f"their results (another results file?): {experts.pending_line(self.still_out, self.cache)}"
        )

    def check_failures(self, max_failed: float) -> None:
        """RunFailed (exit code 1) when more than `max_failed` of the examples have no score:
        failed in the batch, or not in it."""
        remedy = (
            f"their rows in {self.out} say why; `ctd query` (or another --batch-out) asks failed ones again"
        )
        if self.still_out:
            remedy += f"; {self.still_out_line()}"
        check_failed_fraction(
            self.failed + self.missing,
            self.total,
            max_failed,
            what=f"examples without an answer ({self.failed} failed in the batch, {self.missing} not in it)",
            remedy=remedy,
        )


def batch_out(data: Path, spec: ExpertSpec, path: Path, *, cache_path: Path | None = None) -> BatchOutSummary:
    """Write the requests `ctd query` would send for `data` (its cache misses, each key once,
    none out in an earlier batch file whose results were not read back) as an OpenAI batch file
    at `path`, atomically, and record in the cache that they are out; nothing is sent and no
    answer is written. The record is committed before the file takes its name, and released
    when it cannot take it: a batch file never exists without its record (a process killed in
    between leaves a record of a file that is not there, which `ctd cache release-batch`
    releases; never a file whose requests a second --batch-out would write again)."""
    check_writable(path, "--batch-out", BATCH_SUFFIXES)
    if path.exists():  # the data, a batch's requests or its paid results: never replaced
        raise InputError(f"--batch-out {path}: already exists; the requests go to a new file")
    dataset = read_dataset(data)
    cache_path = cache_path or Roots.resolve().cache
    counts = experts.BatchRequests()
    keyed = keyed_items(dataset.items, spec)  # once, for the lines and the estimate
    cache = ScoreCache.for_run(cache_path)  # which items are answered or out, and the new record
    file = str(path.resolve())
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")  # as the cache stores a time
    recorded = False
    try:
        with atomic_path(path) as tmp:
            with tmp.open("w", encoding="utf-8") as handle:
                lines = experts.batch_request_lines(
                    spec, keyed, cache, counts, tag=experts.batch_tag(file, created)
                )
                for line in lines:
                    handle.write(dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
            estimate = estimate_queries(keyed, spec, cache, batch=True, leave_out=counts.left_out)
            _record_out(cache, spec, file, created, counts.written_keys)
            recorded = True
    except BaseException:
        if recorded and not path.exists():  # the file could not take its name: nothing of it is out
            with contextlib.suppress(Exception):  # else its record stays: the safe side, released by hand
                cache.clear_batch_out([key for key, _ in counts.written_keys])
        raise
    finally:
        cache.close()
    return BatchOutSummary(
        expert=spec.name,
        out=path,
        cache=cache_path,
        total=counts.items,
        cached=counts.cached,
        duplicates=counts.duplicates,
        to_recover=counts.to_recover,
        written=counts.written,
        lines=counts.lines,
        tokens=counts.tokens,
        dropped=dataset.dropped,
        usd=estimate.usd,
        estimate=estimate.line(),
        pending=counts.pending,
        pending_files=dict(counts.pending_files),
    )


def _record_out(
    cache: ScoreCache, spec: ExpertSpec, file: str, created: str, keys: Sequence[tuple[str, str]]
) -> None:
    """Record that the requests of `keys` ((key, item id) pairs) are out in the batch file `file`,
    written at `created` (with `file`, its lines' tag); an InputError, with nothing recorded, when
    what this run saw as it wrote them changed since (see `ScoreCache.mark_batch_out`)."""
    rows = [
        {"key": key, "expert": spec.name, "item_id": item, "file": file, "created": created}
        for key, item in keys
    ]
    problem = cache.mark_batch_out(rows, file)
    if problem is not None:
        raise InputError(f"--batch-out {file}: {problem}; nothing was written: run it again")


def batch_in(
    data: Path, spec: ExpertSpec, results: Sequence[Path], out: Path, *, cache_path: Path | None = None
) -> BatchInSummary:
    """Commit a batch's results for `data` to the cache, scored as `ctd query` scores answers,
    then write `ctd query`'s table for `data` from the cache (nothing is sent). Every results
    file is read and checked before the first commit: a malformed line is one InputError naming
    file:line, and nothing is committed."""
    cache_path = cache_path or Roots.resolve().cache
    inputs = [("--data", data), ("--cache", cache_path), *(("--batch-in", Path(r)) for r in results)]
    check_writable(out, "--out", inputs=inputs)
    for path in results:
        if not Path(path).is_file():
            problem = "is a folder, expected a results .jsonl" if Path(path).is_dir() else "no such file"
            raise InputError(f"--batch-in {path}: {problem}")
    dataset = read_dataset(data)
    answers = experts.read_batch_results(results, api_key_env=spec.api_key_env)
    cache = ScoreCache.for_run(cache_path)
    started = time.monotonic()
    try:
        item_results, report = experts.commit_batch_results(spec, dataset.items, answers, cache)
    finally:
        cache.close()
    write_query_table(out, item_results, dataset.labels)
    return BatchInSummary(
        expert=spec.name,
        out=out,
        cache=cache_path,
        total=len(dataset.items),
        lines=report.lines,
        committed=report.committed,
        already=report.already,
        failed=report.failed,
        unmatched=report.unmatched,
        missing=report.missing,
        failure_reasons=dict(report.failure_reasons),
        dropped=dataset.dropped,
        seconds=round(time.monotonic() - started, 3),
        usd=report.usd,
        still_out=dict(report.still_out),
    )
