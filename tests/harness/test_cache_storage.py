"""The storage under a run as `ctd query` meets it: a damaged, full, read-only or unwritable
cache or output is one line that names the file and says what to do, found before anything is
paid where it can be, with exit code 3 (the environment failed, not the input or the run).

The disks are real: a small tmpfs (the `small_disk` fixture), remounted read-only where the test
needs it, and `chattr +i` for a file that even root cannot write; where the machine allows
neither, the test is skipped with the reason."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctd_cli import run_ctd
from fault_server import RunningServer
from full_disk import fill

from experts import ScoreCache

# Private: the exit code of an environment failure.
from harness._errors import EXIT_ENVIRONMENT


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    rows = [{"ids": f"ex{i}", "inputs": f"item-{i}: is this risky?"} for i in range(20)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def query(folder: Path, url: str, cache: Path, *, out: str = "out.csv"):  # type: ignore[no-untyped-def]
    """`ctd query` of the 20 examples with an expert registered at `url`, through `cache`."""
    registry = folder / "experts.toml"
    registry.write_text(f'[experts.fault]\nbase_url = "{url}"\nmodel = "fault-model"\nmax_attempts = 2\n')
    env = {"CTD_CACHE": str(cache), "CTD_EXPERTS_FILE": str(registry)}
    return run_ctd("query", "--data", "data.jsonl", "--out", out, "--expert", "fault", cwd=folder, env=env)


def paid(running: RunningServer) -> int:
    """Every request the server saw: items, the endpoint check's probes and its model list."""
    counts = running.server.counts
    return sum(counts.requests.values()) + counts.models


def assert_environment_error(result, *fragments: str) -> str:  # type: ignore[no-untyped-def]
    """Exit code 3, stderr one line starting 'error: ', no traceback, each fragment in it."""
    assert result.returncode == EXIT_ENVIRONMENT, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def build_cache(path: Path, n: int, *, response_chars: int = 1000) -> None:
    """A real cache of `n` answers written by ScoreCache, checkpointed into the main file."""
    cache = ScoreCache(path)
    cache.put_many(
        {
            "key": f"{i:064x}",
            "expert": "fault",
            "item_id": f"ex{i}",
            "endpoint": "http://127.0.0.1/v1",
            "model": "fault-model",
            "method": "next-token",
            "template_sha256": "0" * 64,
            "schema_version": 1,
            "score": i / n,
            "label_mass": 0.9,
            "response": json.dumps({"text": "x" * response_chars, "i": i}),
            "latency_ms": 1.0,
            "created": datetime.now(UTC),
        }
        for i in range(n)
    )
    cache.close()
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def corrupt_a_middle_page(path: Path) -> int:
    """Overwrite the header of the table leaf page in the middle of the file (page type 0x0d;
    page 1, the file's header, is left alone) and return its number."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[16:18], "big")
    leaves = [page for page in range(2, len(raw) // size + 1) if raw[(page - 1) * size] == 0x0D]
    page = leaves[len(leaves) // 2]
    with path.open("r+b") as handle:
        handle.seek((page - 1) * size)
        handle.write(b"\xff" * 64)
    return page


def readable_rowids(path: Path, table: str, top: int) -> int:
    """How many rows of `table` with rowid 1..top SQLite can read one by one: the salvage's
    count, found another way."""
    found = 0
    with closing(sqlite3.connect(path)) as db:
        for rowid in range(1, top + 1):
            try:
                found += len(db.execute(f"SELECT * FROM {table} WHERE rowid = ?", (rowid,)).fetchall())
            except sqlite3.DatabaseError:
                continue
    return found


@pytest.fixture()
def read_only_disk(small_disk: Path) -> Iterator[Path]:
    """`small_disk`, to be remounted read-only by `remount_read_only` once the test has put
    its files there."""
    yield small_disk


def remount_read_only(mount: Path) -> None:
    done = subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount a tmpfs read-only here: {done.stderr.decode().strip()}")


# --------------------------------------------------------------------------- a damaged cache


def test_a_corrupt_page_is_one_line_before_anything_is_paid_and_salvage_recovers_the_rest(
    workdir: Path,
) -> None:
    cache = workdir / "cache.sqlite"
    n = 120
    build_cache(cache, n)
    corrupt_a_middle_page(cache)
    with RunningServer() as running:
        result = query(workdir, running.url, cache)
        assert paid(running) == 0  # not even the endpoint check
    line = assert_environment_error(result, str(cache), "ctd cache check", "ctd cache salvage")
    assert "damaged" in line, line

    check = run_ctd("cache", "check", "--cache", str(cache), cwd=workdir)
    assert check.returncode == 1, (check.stdout, check.stderr)
    assert "Traceback" not in check.stderr and f"{cache}: damaged" in check.stdout
    assert "table scores: the rows with rowid" in check.stdout

    new = workdir / "salvaged.sqlite"
    salvage = run_ctd("cache", "salvage", "--cache", str(cache), "--out", str(new), "--json", cwd=workdir)
    assert salvage.returncode == 0, (salvage.stdout, salvage.stderr)
    report = json.loads(salvage.stdout)
    expected = readable_rowids(cache, "scores", n)
    assert 0 < expected < n  # the damaged page held some of the rows, not all
    assert report["recovered"] == {"scores": expected, "failures": 0, "batch_out": 0}
    with closing(sqlite3.connect(new)) as db:
        assert db.execute("SELECT COUNT(*) FROM scores").fetchone() == (expected,)
    assert run_ctd("cache", "check", "--cache", str(new), cwd=workdir).returncode == 0
    assert sorted(p.name for p in workdir.glob("salvaged*")) == ["salvaged.sqlite"]  # no temporaries


# --------------------------------------------------------------------------- a full disk


def test_a_cache_on_a_full_disk_is_one_line_before_anything_is_paid(workdir: Path, small_disk: Path) -> None:
    fill(small_disk)
    cache = small_disk / "cache.sqlite"
    with RunningServer() as running:
        result = query(workdir, running.url, cache)
        assert paid(running) == 0
    assert_environment_error(result, str(cache), "no space left")


def test_an_out_on_a_full_disk_is_one_line_before_anything_is_paid(workdir: Path, small_disk: Path) -> None:
    fill(small_disk)
    out = small_disk / "out.csv"
    with RunningServer() as running:
        result = query(workdir, running.url, workdir / "cache.sqlite", out=str(out))
        assert paid(running) == 0
    assert_environment_error(result, f"--out {out}", "no space left")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


# --------------------------------------------------------------------------- read-only


def test_a_cache_in_a_read_only_folder_is_one_line(workdir: Path, read_only_disk: Path) -> None:
    cache = read_only_disk / "cache.sqlite"
    build_cache(cache, 20, response_chars=10)
    remount_read_only(read_only_disk)
    with RunningServer() as running:
        result = query(workdir, running.url, cache)
        assert paid(running) == 0
    assert_environment_error(result, str(cache), "read-only")


def test_an_out_in_a_read_only_folder_is_one_line(workdir: Path, read_only_disk: Path) -> None:
    remount_read_only(read_only_disk)
    out = read_only_disk / "out.csv"
    with RunningServer() as running:
        result = query(workdir, running.url, workdir / "cache.sqlite", out=str(out))
        assert paid(running) == 0
    assert_environment_error(result, f"--out {out}", "Read-only file system")


@pytest.fixture()
def immutable(workdir: Path) -> Iterator[Path]:
    """A cache file that even root cannot open for writing (`chattr +i`)."""
    cache = workdir / "cache.sqlite"
    build_cache(cache, 20, response_chars=10)
    done = subprocess.run(["chattr", "+i", str(cache)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr.decode().strip()}")
    try:
        yield cache
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=False)


def test_a_cache_older_than_a_table_reads_where_it_cannot_be_written(workdir: Path) -> None:
    """A cache written before the `batch_out` table, in a file this process may not write (its
    folder writable, as for a file shared read-only): it cannot gain the table and is read as it
    is; what would write to it fails there."""
    cache = workdir / "old.sqlite"
    build_cache(cache, 20, response_chars=10)
    with closing(sqlite3.connect(cache)) as db:
        db.execute("DROP TABLE batch_out")
        db.commit()
    done = subprocess.run(["chattr", "+i", str(cache)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr.decode().strip()}")
    try:
        opened = ScoreCache(cache)
        try:
            assert len(opened.get_many([f"{i:064x}" for i in range(20)])) == 20
        finally:
            opened.close()
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=False)


def test_a_cache_file_that_cannot_be_written_is_one_line_before_anything_is_paid(
    workdir: Path, immutable: Path
) -> None:
    with RunningServer() as running:
        result = query(workdir, running.url, immutable)
        assert paid(running) == 0
    assert_environment_error(result, str(immutable), "cannot be written")
