"""Answers as JSON lines, for moving them through object storage: `write_answers` writes every
column of each stored answer exactly as stored, one object per line (behind `ctd cache export
--out FILE.jsonl`), and `import_answers` reads such files back into a cache (behind `ctd cache
import`) through `merge_caches`, the one way answers are added from elsewhere. `forget_answers`
removes the answers got one way (a `how`), once a copy of them in that form is on disk (behind
`ctd cache forget`): the next run asks those items again, and an import puts them back.

An import first reads every file, each into a new cache of its own in a temporary folder beside
the target (on its device, so a large import finds room where the cache lives), checking each
line; a malformed line is a ConfigError naming the file and line, and nothing is imported. Then
those caches are merged like any other machine's.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
import tempfile
from collections.abc import Sequence
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from ._cache import SCHEMA_VERSION, ScoreCache
from ._claims import _immediate
from ._errors import ConfigError
from ._merge import ANSWER_COLUMNS, MergeReport, merge_caches
from ._recovery import HOWS
from ._storage import as_storage_error, storage_errors, write_access

__all__ = ["answers_by_how", "forget_answers", "import_answers", "write_answers"]

_TEXT = (
    "key",
    "expert",
    "item_id",
    "endpoint",
    "model",
    "method",
    "template_sha256",
    "how",
    "response",
    "created",
)
_NULLABLE = frozenset({"label_mass", "prompt_tokens", "completion_tokens"})
_BATCH = 5_000  # answers per read of a cache being exported, and lines per insert into the staging cache
_FORGET_CHUNK = 500  # answers removed per write transaction by `forget_answers` (milliseconds each)
_INSERT = (
    "INSERT INTO scores (" + ", ".join(f'"{c}"' for c in ANSWER_COLUMNS) + ") "
    f"VALUES ({', '.join('?' * len(ANSWER_COLUMNS))})"
)
_KEY, _CREATED, _SCHEMA, _MASS, _SCORE, _HOW = (
    ANSWER_COLUMNS.index(c) for c in ("key", "created", "schema_version", "label_mass", "score", "how")
)
# A sum of label probabilities: at most 1, but for the rounding of the logprobs it was summed from.
_MASS_MAX = 1.0 + 1e-6
_TEXT_AT = tuple(ANSWER_COLUMNS.index(c) for c in _TEXT)
_REALS_AT = tuple(ANSWER_COLUMNS.index(c) for c in ("score", "latency_ms"))  # label_mass may be null
_COUNTS_AT = tuple(ANSWER_COLUMNS.index(c) for c in ("prompt_tokens", "completion_tokens"))


def write_answers(cache: ScoreCache, handle: TextIO, *, expert: str | None = None) -> int:
    """Write the answers of `cache` (of `expert` only, if given) to `handle`, one JSON object per
    line with every column of `ANSWER_COLUMNS` as stored, streamed in the order they were
    added; return how many."""
    where, values = ("WHERE expert = ?", (expert,)) if expert is not None else ("", ())
    return _write_rows(cache, handle, where, values)


def _write_rows(
    cache: ScoreCache, handle: TextIO, where: str, values: tuple[str, ...], keys: list[str] | None = None
) -> int:
    """Write the answers `where` selects to `handle` as `write_answers` does, read in one statement
    (a consistent snapshot that blocks no writer); return how many, and append their keys to
    `keys` if given. The cache's failures are StorageErrors naming it; the handle's are the
    caller's to name."""
    # `how` through the cache's own reading of it: an old cache it could not migrate (read-only)
    # has no such column, and a quoted unknown name would be read by SQLite as a string literal.
    columns = ", ".join(f'"{c}"' if c != "how" else f"{cache.how_column} AS how" for c in ANSWER_COLUMNS)
    written = 0
    with storage_errors(cache.path):
        connection = cache.engine.raw_connection()
    try:
        cursor = connection.cursor()
        with storage_errors(cache.path):
            cursor.execute(f"SELECT {columns} FROM scores {where} ORDER BY rowid", values)
        while True:
            with storage_errors(cache.path):
                rows = cursor.fetchmany(_BATCH)
            if not rows:
                return written
            for row in rows:
                handle.write(json.dumps(dict(zip(ANSWER_COLUMNS, row, strict=True)), ensure_ascii=False))
                handle.write("\n")
            written += len(rows)
            if keys is not None:
                keys.extend(row[_KEY] for row in rows)
    finally:
        connection.close()


def answers_by_how(cache: ScoreCache, how: str, *, expert: str | None = None) -> dict[str, int]:
    """How many answers of each expert `cache` holds that were got as `how` (`experts._recovery`)."""
    where, values = _how_filter(cache, how, expert)
    with storage_errors(cache.path), cache.engine.connect() as connection:
        rows = connection.exec_driver_sql(
            f"SELECT expert, COUNT(*) FROM scores {where} GROUP BY expert ORDER BY expert", values
        )
        return {name: int(count) for name, count in rows}


def forget_answers(cache: ScoreCache, backup: Path, *, how: str, expert: str | None = None) -> int:
    """Remove from `cache` the answers got as `how` (of `expert` only, if given) and return how
    many were removed. First they are copied to `backup`, a new file (its folder made if need
    be), as `write_answers` writes them, so that `ctd cache import` puts them back; the copy is
    written beside, synced and only then given its name. The removal follows in short write
    transactions (other runs on the cache wait milliseconds, not for the copy), each removing an
    answer only if it is still stored as `how`. So no answer is ever only in neither place: a
    failure or a kill before the name leaves every answer stored and no `backup`; after it, the
    copy holds every answer removed (and perhaps some still stored: importing those adds nothing).
    A copy that cannot be written is a StorageError naming `backup`."""
    backup = Path(backup)
    if backup.exists():
        raise ConfigError(f"{backup}: already exists; the forgotten answers go to a new file")
    refused = write_access(cache.path)  # before the copy: a cache that cannot change leaves none
    if refused is not None:
        raise refused
    where, values = _how_filter(cache, how, expert)
    keys: list[str] = []
    try:
        backup.parent.mkdir(parents=True, exist_ok=True)
        tmp = backup.with_name(f".{backup.name}.{secrets.token_hex(4)}.partial")
        # O_EXCL: never another file; mode 0o666 less the umask, as any file the project writes.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                _write_rows(cache, handle, where, values, keys)
                handle.flush()
                os.fsync(handle.fileno())
            if keys:
                os.link(tmp, backup)  # never replaces a file: one made since the check is refused
                _sync_folder(backup.parent)
        finally:
            os.unlink(tmp)
    except OSError as exc:  # the copy's own failures name the copy, not the cache
        raise as_storage_error(backup, exc) from None
    removed = 0
    for start in range(0, len(keys), _FORGET_CHUNK):
        chunk = keys[start : start + _FORGET_CHUNK]
        with _immediate(cache) as cursor:  # a key re-stored since as something else stays
            cursor.execute(
                f"DELETE FROM scores WHERE key IN ({','.join('?' * len(chunk))}) AND {cache.how_column} = ?",
                (*chunk, how),
            )
            removed += cursor.rowcount
    return removed


def _how_filter(cache: ScoreCache, how: str, expert: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause of the answers got as `how` (of `expert`), read as the cache reads `how`."""
    if expert is None:
        return f"WHERE {cache.how_column} = ?", (how,)
    return f"WHERE {cache.how_column} = ? AND expert = ?", (how, expert)


def _sync_folder(folder: Path) -> None:
    """Make a new name in `folder` durable (a system without folder syncs skips it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def import_answers(target: Path, files: Sequence[Path]) -> list[MergeReport]:
    """Read the JSON-lines `files` (as `write_answers` writes them) into the cache at `target`
    (created if missing, once every file has been read): all of them are checked line by line
    before the first answer is added (see the module's text)."""
    target = Path(target)
    files = [Path(file) for file in files]
    for file in files:
        if not file.exists():
            raise ConfigError(f"{file}: no such file")
        if not file.is_file():
            raise ConfigError(f"{file}: is a folder, expected a .jsonl file of answers")
        if file.suffix.lower() != ".jsonl":
            raise ConfigError(
                f"{file}: unknown file type {file.suffix or '(none)'!r}; import reads the .jsonl "
                "that `ctd cache export --out FILE.jsonl` writes"
            )
    beside = target.parent if target.parent.is_dir() else None  # None: the system's temporary folder
    with tempfile.TemporaryDirectory(prefix=".ctd-import-", dir=beside) as folder:
        staged = []
        for number, file in enumerate(files):
            staged.append(Path(folder) / f"{number}.sqlite")
            _stage(file, staged[-1])
        cache = ScoreCache.for_run(target)
        try:
            return merge_caches(cache, staged, names=[str(file) for file in files])
        finally:
            cache.close()


def _stage(file: Path, into: Path) -> None:
    """Check every line of `file` and store its answers in a new cache at `into`."""
    ScoreCache(into).close()  # this version's tables
    with closing(sqlite3.connect(into)) as staging, file.open("rb") as lines:
        batch: list[tuple[Any, ...]] = []
        numbers: list[int] = []
        for number, raw in enumerate(lines, start=1):
            answer = _parse_line(raw, f"{file}:{number}")
            if answer is not None:
                batch.append(answer)
                numbers.append(number)
            if len(batch) == _BATCH:
                _insert(staging, batch, numbers, file)
                batch, numbers = [], []
        _insert(staging, batch, numbers, file)
        staging.commit()


def _parse_line(raw: bytes, where: str) -> tuple[Any, ...] | None:
    """The checked answer on one line, None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    if not text.strip():
        return None
    try:
        answer = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    return _answer_row(answer, where)


def _insert(
    staging: sqlite3.Connection, batch: list[tuple[Any, ...]], numbers: list[int], file: Path
) -> None:
    before = staging.total_changes
    try:
        staging.executemany(_INSERT, batch)
    except sqlite3.IntegrityError:  # the only constraint a checked row can break: its key repeats
        stopped = staging.total_changes - before  # executemany stops at the row that failed
        raise ConfigError(
            f"{file}:{numbers[stopped]}: key {batch[stopped][0]} repeats an earlier line of this file; "
            "import each export as a file of its own"
        ) from None


def _answer_row(answer: Any, where: str) -> tuple[Any, ...]:
    """The values of one exported answer in `ANSWER_COLUMNS` order, checked field by field (a
    row as `write_answers` writes it passes the quick look; any other gets the full check, which
    names what is wrong)."""
    if isinstance(answer, dict) and "how" not in answer:  # exported before `how`: as migrated
        answer = {**answer, "how": "likelihood" if answer.get("method") == "likelihood" else "top-k"}
    if isinstance(answer, dict) and len(answer) == len(ANSWER_COLUMNS):
        row = tuple(answer.get(name) for name in ANSWER_COLUMNS)
        if _looks_whole(row):
            return row
    if not isinstance(answer, dict):
        raise ConfigError(f"{where}: expected a JSON object with the fields {', '.join(ANSWER_COLUMNS)}")
    unknown = sorted(set(answer) - set(ANSWER_COLUMNS))
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; an answer has {', '.join(ANSWER_COLUMNS)}")
    for name in ANSWER_COLUMNS:
        if name not in answer and name not in _NULLABLE:
            raise ConfigError(
                f"{where}: missing field {name!r} (`ctd cache export --out FILE.jsonl` writes every field)"
            )
        _check_field(name, answer.get(name), where)
    return tuple(answer.get(name) for name in ANSWER_COLUMNS)


def _looks_whole(row: tuple[Any, ...]) -> bool:
    """Every field present and of its type: the quick look at a row (an import's hot loop)."""
    try:
        datetime.fromisoformat(row[_CREATED])
    except (TypeError, ValueError):
        return False
    return (
        all(type(row[at]) is str for at in _TEXT_AT)
        and bool(row[_KEY])
        and type(row[_SCHEMA]) is int
        and row[_SCHEMA] == SCHEMA_VERSION
        and all(type(row[at]) is float and math.isfinite(row[at]) for at in _REALS_AT)
        and 0.0 <= row[_SCORE] <= 1.0
        and (row[_MASS] is None or (type(row[_MASS]) is float and 0.0 <= row[_MASS] <= _MASS_MAX))
        and row[_HOW] in HOWS
        and all(row[at] is None or (type(row[at]) is int and row[at] >= 0) for at in _COUNTS_AT)
    )


def _check_field(name: str, value: Any, where: str) -> None:
    def wrong(expected: str) -> ConfigError:
        return ConfigError(f"{where}: field {name!r} must be {expected}, got {json.dumps(value)[:60]}")

    if value is None and name in _NULLABLE:
        return
    if name in _TEXT:
        if not isinstance(value, str) or (name == "key" and not value):
            raise wrong("a non-empty string" if name == "key" else "a string")
        if name == "created":
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise wrong("a date and time like 2026-11-25 10:00:00.000000") from None
        if name == "how" and value not in HOWS:
            raise wrong(f"one of {', '.join(HOWS)}")
    elif name == "schema_version":
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong("an integer")
        if value != SCHEMA_VERSION:
            raise ConfigError(
                f"{where}: an answer of cache schema {value}, this ctd writes schema {SCHEMA_VERSION}; "
                "its key never matches this version's questions"
            )
    elif name in ("prompt_tokens", "completion_tokens"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise wrong("a count (an integer >= 0) or null")
    elif not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise wrong("a finite number" + (" or null" if name in _NULLABLE else ""))
    elif name == "score" and not 0 <= value <= 1:
        raise wrong("a probability in [0, 1]")
    elif name == "label_mass" and not 0 <= value <= _MASS_MAX:
        raise wrong("a probability mass in [0, 1] or null")
