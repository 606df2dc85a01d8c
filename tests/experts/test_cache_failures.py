"""The cache's storage failing under the library: a lock another process holds past the busy
timeout and a page damaged after the cache was opened are each one StorageError that names
the file (CacheCorrupt for the damage), raised by the read or write that met it, in bounded
time; salvage copies what is readable and says which rowids it could not read."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest

from experts import CacheCorrupt, ScoreCache, StorageError, check_cache, list_claims, salvage_cache

# Private: the claim ledger, failed directly under the cache.
from experts._claims import ClaimLedger

N = 120


def _row(i: int) -> dict[str, object]:
    return {
        "key": f"{i:064x}",
        "expert": "e",
        "item_id": f"ex{i}",
        "endpoint": "http://127.0.0.1/v1",
        "model": "m",
        "method": "next-token",
        "template_sha256": "0" * 64,
        "schema_version": 1,
        "score": 0.5,
        "label_mass": 0.9,
        "response": json.dumps({"text": "x" * 1000}),
        "latency_ms": 1.0,
        "created": datetime.now(UTC),
    }


def _damage_middle_leaf(path: Path) -> None:
    """Overwrite the headers of the two middle leaf pages of the `scores` table, which hold the
    middle rows (ex59 among them: rows are stored in the order written). SQLite's dbstat names
    each page's table: the file's other tables, empty or not, move the pages around."""
    with closing(sqlite3.connect(path)) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        query = "SELECT pageno FROM dbstat WHERE name = 'scores' AND pagetype = 'leaf' ORDER BY pageno"
        try:
            leaves = [page for (page,) in db.execute(query)]
        except sqlite3.OperationalError as error:  # a SQLite built without the dbstat table
            pytest.skip(f"SQLite's dbstat is not available here: {error}")
    with path.open("r+b") as handle:
        for page in leaves[len(leaves) // 2 - 1 : len(leaves) // 2 + 1]:
            handle.seek((page - 1) * size)
            handle.write(b"\xff" * 64)


@pytest.fixture()
def damaged(tmp_path: Path) -> Iterator[ScoreCache]:
    """A damaged cache opened without the checks of `for_run`, as a run meets a page that its
    time-bounded check did not reach (or that went bad after it)."""
    path = tmp_path / "cache.sqlite"
    cache = ScoreCache(path)
    cache.put_many(_row(i) for i in range(N))
    cache.close()  # the last connection checkpoints the log into the file
    _damage_middle_leaf(path)
    cache = ScoreCache(path)
    yield cache
    cache.close()


KEYS = [f"{i:064x}" for i in range(N)]


@pytest.mark.parametrize(
    "read",
    [
        lambda c: c.get_many(KEYS),
        lambda c: c.responses(KEYS),
        lambda c: list(c.rows()),
        lambda c: c.lookup_item("ex59"),
        lambda c: ClaimLedger(c).claim("e", {k: "x" for k in KEYS}),
    ],
    ids=["get_many", "responses", "rows", "lookup_item", "claim"],
)
def test_a_page_damaged_mid_run_is_cache_corrupt_naming_the_file(damaged: ScoreCache, read) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CacheCorrupt) as caught:
        read(damaged)
    error = caught.value
    assert str(error) == f"{damaged.path}: database disk image is malformed"
    assert error.environment and error.path == damaged.path
    assert f"ctd cache check --cache {damaged.path}" in error.remedy
    assert f"ctd cache salvage --cache {damaged.path} --out" in error.remedy


def test_salvage_names_the_rowids_it_could_not_read(damaged: ScoreCache, tmp_path: Path) -> None:
    assert not check_cache(damaged.path).ok
    result = salvage_cache(damaged.path, tmp_path / "new.sqlite")
    lost = sum(b - a + 1 for a, b in result.unreadable["scores"])
    assert 0 < lost < N and result.recovered == {"scores": N - lost, "failures": 0, "batch_out": 0}
    assert check_cache(tmp_path / "new.sqlite").ok
    salvaged = ScoreCache(tmp_path / "new.sqlite")
    assert len(salvaged.get_many(KEYS)) == N - lost
    salvaged.close()


@pytest.fixture()
def held(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A cache whose lock another process holds: `BEGIN IMMEDIATE` (the write lock: readers
    go on) or, with `exclusive`, SQLite's exclusive locking mode (nothing else gets in)."""
    path = tmp_path / "cache.sqlite"
    cache = ScoreCache(path)
    cache.put_many([_row(0)])
    cache.close()
    take = (
        ["PRAGMA locking_mode=EXCLUSIVE", "BEGIN EXCLUSIVE", "DELETE FROM claims"]
        if request.param == "exclusive"
        else ["BEGIN IMMEDIATE"]
    )
    code = (
        f"import sqlite3, time\nc = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        + "".join(f"c.execute({sql!r})\n" for sql in take)
        + "print('held', flush=True)\ntime.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield path
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("held", ["immediate", "exclusive"], indirect=True)
def test_a_lock_held_past_the_busy_timeout_is_one_storage_error_before_the_run(held: Path) -> None:
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        ScoreCache.for_run(held, busy_timeout=0.3)
    assert time.monotonic() - started < 5  # one busy timeout, not one per attempt to switch to WAL
    assert caught.value.kind == "locked" and caught.value.environment
    assert str(caught.value).startswith(f"{held}: ") and "locked" in str(caught.value)
    assert "another process holds it locked" in caught.value.remedy


def test_the_checks_before_a_run_leave_the_cache_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    ScoreCache(path).close()
    cache = ScoreCache.for_run(path)
    assert list_claims(cache) == [] and cache.counts() == {}  # the write probe was rolled back
    cache.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.sqlite"]  # no probe file left


def test_the_wal_switch_giving_up_on_a_lock_is_a_locked_cache() -> None:
    """`_use_wal` raises its own "database is locked" (built in Python, no SQLite result code):
    it is the machine's doing (exit 3, "end that process"), not an unknown failure (exit 1)."""
    import sqlite3

    # Private: how a storage error is classified.
    from experts._errors import storage_kind

    assert (
        storage_kind(sqlite3.OperationalError("could not switch the cache to WAL: database is locked"))
        == "locked"
    )


def test_salvage_of_a_cache_without_a_failures_table_is_quick(tmp_path: Path) -> None:
    """An older cache that never had the table: nothing to read there, not millions of probes."""
    import sqlite3

    source = tmp_path / "old.sqlite"
    connection = sqlite3.connect(source)
    connection.execute("CREATE TABLE scores (key TEXT PRIMARY KEY, expert TEXT, item_id TEXT, endpoint TEXT, "
                       "model TEXT, method TEXT, template_sha256 TEXT, schema_version INT, score REAL, "
                       "label_mass REAL, response TEXT, prompt_tokens INT, completion_tokens INT, "
                       "latency_ms REAL, created TEXT)")  # fmt: skip
    row = ("k", "e", "i", "u", "m", "next-token", "t", 1, 0.5, 1.0, "{}", 1, 1, 1.0, "2026-01-01")
    connection.execute(f"INSERT INTO scores VALUES ({','.join('?' * len(row))})", row)
    connection.commit()
    connection.close()
    started = time.monotonic()
    result = salvage_cache(source, tmp_path / "new.sqlite")
    assert result.recovered == {"scores": 1, "failures": 0, "batch_out": 0}
    assert result.unreadable == {"scores": [], "failures": [], "batch_out": []}
    assert time.monotonic() - started < 10
