"""Answers from other caches brought into this one (`merge_caches`, behind `ctd cache merge`
and, through `experts._answers`, `ctd cache import`).

Keys are what an answer depends on (`CacheKey`), so a key means the same question on every
machine: a key absent here is inserted with every column as stored there (same key, same
row); a key present with the same score is a duplicate; a key present with another score is a
conflict, and this cache's answer is kept (a run that read it has already used it). Failures
are never answers: they are counted, not merged. Claims are runs in flight on the other
machine: not merged either, nor are the records of requests out in a batch file there
(`batch_out`): a batch there may be read back as failures, or released, which no later merge
could tell this cache; they are counted by file, so that the report can say a run here would
ask them again before that batch's answers are merged.

A run on this cache may be asking about a key the merge brings (it holds a claim on it): the
score is inserted and the claim left alone. When the holder commits, its insert finds the key
scored and keeps the stored answer (`ScoreCache.put_many` inserts OR IGNORE) and its claim is
deleted as always; runs waiting on the claim find the score at their next look.

Every source is checked before the first insert (it exists, is not this cache, is a ctd cache
of this SCHEMA_VERSION, SQLite's integrity check finds nothing). The rows are streamed from the
source and committed `ROWS_PER_TRANSACTION` at a time, each batch one IMMEDIATE transaction: a
run writing to this cache meanwhile waits for one batch at most (well within its busy
timeout), and a crash leaves this cache valid with whole batches in it. The merge is idempotent
by key, so rerunning it finishes the work: what came through before counts as duplicates.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._cache import SCHEMA_VERSION, ScoreCache, ScoreRow, score_columns_sql
from ._claims import _chunks, _immediate, is_stale
from ._errors import ConfigError, StorageError
from ._repair import _read_only, check_cache

__all__ = [
    "ANSWER_COLUMNS",
    "CONFLICTS_LISTED",
    "Conflict",
    "MergeReport",
    "check_merge_sources",
    "merge_caches",
]

ANSWER_COLUMNS: tuple[str, ...] = tuple(ScoreRow.model_fields)
"""Every column of a stored answer, in the table's order: what a merge copies and an export keeps."""

ROWS_PER_TRANSACTION = 5_000
"""Answers committed per transaction: about 50 ms of this cache's write lock on this project's
2-core machine, so that a run committing meanwhile never waits long."""

CONFLICTS_LISTED = 10_000
"""Conflicts a report lists key by key; past that they are counted only (a non-deterministic
server can make every shared key one, and the report must not grow with the cache)."""

_KEY, _SCORE, _RESPONSE = (ANSWER_COLUMNS.index(c) for c in ("key", "score", "response"))


@dataclass(frozen=True)
class Conflict:
    """One key both caches answered, with different scores: `kept` is this cache's (it stays),
    `other` the source's. `same_response` tells the two causes apart: the same raw answer scored
    differently, or the server answering the same request differently."""

    key: str
    expert: str
    item_id: str
    kept: float
    other: float
    same_response: bool

    @property
    def difference(self) -> float:
        return abs(self.kept - self.other)

    @property
    def reason(self) -> str:
        if self.same_response:
            why = "the same raw answer scored differently (scoring changed without a new SCHEMA_VERSION?)"
        else:
            why = "the server answered the same request differently (a non-deterministic server)"
        return f"score differs by {self.difference:.3g} ({self.kept:.6g} kept, {self.other:.6g} there): {why}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "expert": self.expert,
            "item_id": self.item_id,
            "kept": self.kept,
            "other": self.other,
            "difference": self.difference,
            "reason": self.reason,
        }


@dataclass
class MergeReport:
    """What one source brought: `answers` read from it, `added` (new keys, `claimed` of them
    held by a live run here), `duplicates` (present with the same score), `conflicts` (present
    with another score; the first `CONFLICTS_LISTED` in `listed`), and `failures` it recorded
    (never merged)."""

    source: str
    answers: int = 0
    added: int = 0
    duplicates: int = 0
    conflicts: int = 0
    claimed: int = 0
    failures: int = 0
    # Its batch files with requests out that this cache has no answer for: how many each.
    out_there: dict[str, int] = field(default_factory=dict)
    listed: list[Conflict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "answers": self.answers,
            "added": self.added,
            "duplicates": self.duplicates,
            "conflicts": self.conflicts,
            "added_while_claimed": self.claimed,
            "failures_not_merged": self.failures,
            "out_in_batches_there": self.out_there,
            "conflicts_listed": [conflict.to_dict() for conflict in self.listed],
        }


def check_merge_sources(target: Path, sources: Sequence[Path]) -> None:
    """Raise a ConfigError (one line naming the source) unless every source can be merged into
    the cache at `target`: it exists, is not `target` itself, and is a sound ctd cache of this
    SCHEMA_VERSION. Reads the sources only."""
    target = Path(target)
    for source in map(Path, sources):
        if not source.exists():
            raise ConfigError(f"{source}: no such file")
        if not source.is_file():
            raise ConfigError(f"{source}: is a folder, expected a cache's SQLite file")
        if target.exists() and os.path.samefile(source, target):
            raise ConfigError(f"{source}: is this cache itself ({target}); name another machine's cache")
        _check_source(source)


def _check_source(source: Path) -> None:
    try:
        with _read_only(source) as reader:
            tables = {
                name for (name,) in reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not {"scores", "failures"} <= tables:
                raise ConfigError(f"{source}: not a ctd cache (no table of scores and failures)")
            columns = {row[1] for row in reader.execute("PRAGMA table_info(scores)")}
            missing = [c for c in ANSWER_COLUMNS if c not in columns and c != "how"]  # `how`: migrated
            if missing:
                raise ConfigError(
                    f"{source}: not a ctd cache of this version (its scores lack {', '.join(missing)})"
                )
    except StorageError as exc:
        said = str(exc).removeprefix(f"{source}: ")
        if "malformed" in said:  # a damaged first page: a cache, but not a sound one
            raise _damaged(source, said) from None
        raise ConfigError(f"{source}: not a ctd cache ({said})") from None
    found = check_cache(source)
    if not found.ok:
        raise _damaged(source, found.problems[0])
    with _read_only(source) as reader:
        row = reader.execute(
            "SELECT schema_version FROM scores WHERE schema_version != ? LIMIT 1", (SCHEMA_VERSION,)
        ).fetchone()
    if row is not None:
        raise ConfigError(
            f"{source}: holds answers of cache schema {row[0]}, this ctd writes schema {SCHEMA_VERSION}; "
            "their keys never match this version's questions, so they cannot be merged"
        )


def _damaged(source: Path, problem: str) -> ConfigError:
    return ConfigError(
        f"{source}: damaged ({problem}); copy what can be read with "
        f"`ctd cache salvage --cache {source} --out NEW.sqlite` and merge NEW.sqlite"
    )


def merge_caches(
    cache: ScoreCache, sources: Sequence[Path], *, names: Sequence[str] | None = None
) -> list[MergeReport]:
    """Merge the scored answers of each cache in `sources` into `cache`, in order, after checking
    them all (`check_merge_sources`). `names` label the reports (the source paths by default)."""
    sources = [Path(source) for source in sources]
    check_merge_sources(cache.path, sources)
    labels = list(names) if names is not None else [str(source) for source in sources]
    return [merge_one(cache, source, label) for source, label in zip(sources, labels, strict=True)]


def merge_one(cache: ScoreCache, source: Path, label: str) -> MergeReport:
    """Merge one checked source (see the module's text); the rows are read `ROWS_PER_TRANSACTION`
    at a time, so memory stays bounded whatever the source's size."""
    report = MergeReport(source=label)
    with _read_only(source) as reader:
        # A cache older than the `how` column reads as its migration would fill it.
        columns = score_columns_sql(row[1] for row in reader.execute("PRAGMA table_info(scores)"))
        report.failures = reader.execute("SELECT COUNT(*) FROM failures").fetchone()[0]
        cursor = reader.execute(f"SELECT {columns} FROM scores ORDER BY rowid")
        while batch := cursor.fetchmany(ROWS_PER_TRANSACTION):
            with _immediate(cache) as writer:
                _merge_batch(writer, batch, report)
        tables = {name for (name,) in reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "batch_out" in tables:  # a cache older than the table has no batch out
            report.out_there = _out_unanswered(reader, cache)
    return report


def _out_unanswered(reader: sqlite3.Connection, cache: ScoreCache) -> dict[str, int]:
    """The source's batch files with requests out that `cache` has no answer for (those a run
    here would ask again), and how many each."""
    out: Counter[str] = Counter()
    rows = reader.execute("SELECT key, file FROM batch_out")
    while chunk := rows.fetchmany(ROWS_PER_TRANSACTION):
        answered = cache.get_many([key for key, _ in chunk])
        out.update(file for key, file in chunk if key not in answered)
    return dict(sorted(out.items()))


def _merge_batch(writer: sqlite3.Cursor, batch: list[tuple[Any, ...]], report: MergeReport) -> None:
    """Insert the rows of `batch` whose keys this cache lacks; count the rest as duplicates or
    conflicts. `writer` is inside this cache's write transaction."""
    report.answers += len(batch)
    here: dict[str, float] = {}
    for chunk in _chunks([row[_KEY] for row in batch]):
        marks = ",".join("?" * len(chunk))
        here.update(writer.execute(f"SELECT key, score FROM scores WHERE key IN ({marks})", chunk).fetchall())
    new = [row for row in batch if row[_KEY] not in here]
    clashing = [row for row in batch if row[_KEY] in here and not _same_score(here[row[_KEY]], row[_SCORE])]
    report.duplicates += len(batch) - len(new) - len(clashing)
    report.conflicts += len(clashing)
    room = CONFLICTS_LISTED - len(report.listed)
    if clashing and room > 0:
        report.listed += _conflicts(writer, clashing[:room], here)
    if new:
        marks = ", ".join("?" * len(ANSWER_COLUMNS))
        columns = ", ".join(f'"{c}"' for c in ANSWER_COLUMNS)
        writer.executemany(f"INSERT INTO scores ({columns}) VALUES ({marks})", new)
        # An answered key is out in no batch file any longer (as `ScoreCache.put_many` does).
        writer.executemany("DELETE FROM batch_out WHERE key = ?", [(row[_KEY],) for row in new])
        report.added += len(new)
        report.claimed += _live_claims(writer, [row[_KEY] for row in new])


def _same_score(kept: float, other: float) -> bool:
    return kept == other or (math.isnan(kept) and math.isnan(other))


def _conflicts(writer: sqlite3.Cursor, rows: list[tuple[Any, ...]], here: dict[str, float]) -> list[Conflict]:
    keys = [row[_KEY] for row in rows]
    responses: dict[str, str] = {}
    for chunk in _chunks(keys):
        marks = ",".join("?" * len(chunk))
        responses.update(
            writer.execute(f"SELECT key, response FROM scores WHERE key IN ({marks})", chunk).fetchall()
        )
    expert, item_id = ANSWER_COLUMNS.index("expert"), ANSWER_COLUMNS.index("item_id")
    return [
        Conflict(
            key=row[_KEY],
            expert=row[expert],
            item_id=row[item_id],
            kept=here[row[_KEY]],
            other=row[_SCORE],
            same_response=responses.get(row[_KEY]) == row[_RESPONSE],
        )
        for row in rows
    ]


def _live_claims(writer: sqlite3.Cursor, keys: list[str]) -> int:
    """How many of `keys` a live run on this cache holds a claim on (left in place: see the
    module's text)."""
    now, gone, live = time.time(), {}, 0
    for chunk in _chunks(keys):
        marks = ",".join("?" * len(chunk))
        held = writer.execute(
            f"SELECT host, pid, expires FROM claims WHERE key IN ({marks})", chunk
        ).fetchall()
        live += sum(not is_stale(host, pid, expires, now=now, gone=gone) for host, pid, expires in held)
    return live
