"""Caches that merge: another machine's answers come into this cache by key (new keys copied as
stored, the same score a duplicate, another score a conflict that keeps this cache's answer and
says why), recorded failures stay behind, a run's live claim on a key survives the merge and its
commit still works, a merge killed midway leaves a valid cache that a rerun completes, and
100,000 answers merge in seconds with bounded memory."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ctd_cli import run_ctd

from experts import ConfigError, ScoreCache, check_cache, list_claims, merge_caches, salvage_cache

# Private: a run's claims under the real ledger, held while another process merges.
from experts._claims import ClaimLedger

# Private: the batch size, to check that a killed merge left whole batches.
from experts._merge import ROWS_PER_TRANSACTION


def answer(i: int, *, score: float | None = None, response: str | None = None) -> dict[str, Any]:
    """A stored answer for item i, as a run writes it (every column set)."""
    return {
        "key": f"{i:064x}",
        "expert": "judge",
        "item_id": f"ex{i}",
        "endpoint": "http://127.0.0.1:9/v1",
        "model": "m",
        "method": "next-token",
        "template_sha256": "0" * 64,
        "schema_version": 1,
        "score": (i % 97) / 97 if score is None else score,
        "label_mass": 0.9,
        "response": response or json.dumps({"item": i, "text": "x" * 200}),
        "prompt_tokens": 40 + i % 7,
        "completion_tokens": 1,
        "latency_ms": 12.5,
        "created": datetime.now(UTC),
    }


def failure(i: int) -> dict[str, Any]:
    return {
        "key": f"{i:064x}",
        "expert": "judge",
        "item_id": f"ex{i}",
        "reason": "http-500",
        "message": "server error",
        "attempts": 6,
        "created": datetime.now(UTC),
    }


def cache_with(path: Path, answers: list[dict[str, Any]], failures: list[dict[str, Any]] = ()) -> Path:  # type: ignore[assignment]
    cache = ScoreCache(path)
    for start in range(0, len(answers), 10_000):
        cache.put_many(answers[start : start + 10_000])
    cache.put_many([], failures)
    cache.close()
    return path


def table(path: Path) -> list[tuple[Any, ...]]:
    """Every stored answer, every column, as SQLite holds it (sorted by key)."""
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT * FROM scores ORDER BY key").fetchall()


def test_new_keys_come_as_stored_and_a_rerun_is_all_duplicates(tmp_path: Path) -> None:
    there = cache_with(tmp_path / "there.sqlite", [answer(i) for i in range(50)], [failure(60), failure(61)])
    here = ScoreCache(tmp_path / "here.sqlite")
    here.put_many([answer(i) for i in range(40, 55)])  # 40..49 shared (same scores), 50..54 only here
    [report] = merge_caches(here, [there])
    assert (report.answers, report.added, report.duplicates, report.conflicts) == (50, 40, 10, 0)
    assert report.failures == 2  # counted, never merged
    with closing(sqlite3.connect(here.path)) as db:
        assert db.execute("SELECT COUNT(*) FROM failures").fetchone() == (0,)
    merged = {row[0]: row for row in table(here.path)}
    assert len(merged) == 55
    for row in table(there)[:40]:  # the keys new here (their own created times differ)
        assert merged[row[0]] == row  # same key, same row: every column as stored there
    before = table(here.path)
    [again] = merge_caches(here, [there])
    assert (again.added, again.duplicates, again.conflicts) == (0, 50, 0)
    assert table(here.path) == before
    here.close()


def test_a_conflict_keeps_this_caches_answer_and_says_why(tmp_path: Path) -> None:
    """Key 1: the server answered differently (another response); key 2: the same response
    scored differently. Both keep this cache's score, and the reason tells them apart."""
    there = cache_with(
        tmp_path / "there.sqlite",
        [answer(0), answer(1, score=0.75, response='{"other": true}'), answer(2, score=0.4, response="same")],
    )
    here = ScoreCache(tmp_path / "here.sqlite")
    here.put_many([answer(0), answer(1, score=0.25), answer(2, score=0.5, response="same")])
    [report] = merge_caches(here, [there])
    assert (report.added, report.duplicates, report.conflicts) == (0, 1, 2)
    by_key = {conflict.key: conflict for conflict in report.listed}
    server = by_key[f"{1:064x}"]
    assert (server.kept, server.other, server.difference) == (0.25, 0.75, 0.5)
    assert server.reason.startswith("score differs by 0.5 (0.25 kept, 0.75 there)")
    assert "non-deterministic server" in server.reason
    scoring = by_key[f"{2:064x}"]
    assert (
        scoring.difference == 0.09999999999999998 and "same raw answer scored differently" in scoring.reason
    )
    assert {row[0]: row[8] for row in table(here.path)} == {
        f"{0:064x}": 0.0,
        f"{1:064x}": 0.25,
        f"{2:064x}": 0.5,
    }
    assert report.to_dict()["conflicts_listed"][0]["reason"] == report.listed[0].reason
    here.close()


def test_requests_out_in_a_batch_file_there_are_named_not_recorded(tmp_path: Path) -> None:
    """The other machine's requests out in a batch file are not recorded here (that batch may be
    read back as failures or released there, which no later merge could tell this cache), but
    the report names their files and counts those this cache has no answer for, which a run
    here would ask again."""
    there = cache_with(tmp_path / "there.sqlite", [answer(i) for i in range(10)])
    source = ScoreCache(there)
    out = [{"key": f"{i:064x}", "expert": "judge", "item_id": f"ex{i}", "file": "/there/b.jsonl",
            "created": datetime.now(UTC)} for i in range(10, 15)]  # fmt: skip
    assert source.mark_batch_out(out, "/there/b.jsonl") is None
    source.close()
    merged = run_ctd("cache", "merge", str(there), "--cache", str(tmp_path / "here.sqlite"), cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    said = " ".join(merged.stdout.split())  # the terminal wraps the line
    assert "5 requests are out in batch files there, not read back yet: /there/b.jsonl (5)" in said
    assert "a run here would ask again (and pay for) those it has no answer for" in said
    here = ScoreCache(tmp_path / "here.sqlite")
    try:
        assert here.pending_files([f"{i:064x}" for i in range(20)]) == {}
        here.put_many([answer(11), answer(13)])  # answered here since: a run here asks 3 of the 5
        assert merge_caches(here, [there])[0].out_there == {"/there/b.jsonl": 3}
    finally:
        here.close()


def test_a_live_claim_survives_the_merge_and_its_holders_commit_keeps_the_merged_answer(
    tmp_path: Path,
) -> None:
    """A run (this process) holds a claim on key 7 of this cache while `ctd cache merge` (another
    process) brings an answer for it: the answer goes in, the claim stays, a second run finds the
    item answered, and the holder's own commit (another score) neither fails nor replaces it."""
    there = cache_with(tmp_path / "there.sqlite", [answer(i, score=0.125) for i in range(5, 10)])
    here = ScoreCache(tmp_path / "here.sqlite")
    holder = ClaimLedger(here)
    assert holder.claim("judge", {f"{7:064x}": "ex7"}).mine == {f"{7:064x}"}
    merged = run_ctd("cache", "merge", str(there), "--cache", str(here.path), "--json", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    [report] = json.loads(merged.stdout)["sources"]
    assert (report["added"], report["added_while_claimed"]) == (5, 1)
    [claims] = list_claims(here)
    assert (claims.live, claims.owner) == (1, holder.owner)
    other_run = ClaimLedger(here).claim("judge", {f"{7:064x}": "ex7"})
    assert other_run.mine == set() and other_run.scored[f"{7:064x}"].score == 0.125
    here.put_many([answer(7, score=0.875)], release_owner=holder.owner)  # the holder's commit
    assert list_claims(here) == []
    assert here.get_many([f"{7:064x}"])[f"{7:064x}"].score == 0.125
    here.close()


MERGE_IN_A_PROCESS = """
import sys
from experts import ScoreCache, merge_caches
merge_caches(ScoreCache(sys.argv[1]), [sys.argv[2]])
"""


def test_a_killed_merge_leaves_a_valid_cache_that_a_rerun_completes_quickly(tmp_path: Path) -> None:
    """kill -9 after the first batches are committed: the cache is sound and holds whole batches;
    the rerun adds the rest (what came before counts as duplicates) in seconds, its memory
    bounded by a batch, not by the 100,000 answers."""
    n = 100_000
    there = cache_with(tmp_path / "there.sqlite", [answer(i) for i in range(n)])
    here = tmp_path / "here.sqlite"
    ScoreCache(here).close()
    merging = subprocess.Popen([sys.executable, "-c", MERGE_IN_A_PROCESS, str(here), str(there)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and merging.poll() is None:
            with closing(sqlite3.connect(here)) as db:
                if db.execute("SELECT COUNT(*) FROM scores").fetchone()[0] > 0:
                    break
            time.sleep(0.005)
        merging.send_signal(signal.SIGKILL)
    finally:
        merging.wait()
    assert merging.returncode == -signal.SIGKILL, "the merge ended before it could be killed"
    with closing(sqlite3.connect(here)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        done = db.execute("SELECT COUNT(*) FROM scores").fetchone()[0]
    assert 0 < done < n and done % ROWS_PER_TRANSACTION == 0
    cache = ScoreCache(here)
    tracemalloc.start()
    started = time.perf_counter()
    [report] = merge_caches(cache, [there])
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    cache.close()
    assert (report.added, report.duplicates, report.conflicts) == (n - done, done, 0)
    assert table(here) == table(there)
    print(
        f"rerun merged {n - done} new of {n} answers in {seconds:.2f} s, peak {peak / 2**20:.1f} MiB traced"
    )
    assert seconds < 60 and peak < 32 * 2**20


def test_answers_still_in_a_write_ahead_log_that_cannot_be_read_are_refused_not_skipped(
    tmp_path: Path,
) -> None:
    """A killed run's cache keeps its last answers in its write-ahead log. Copied with the log into
    a folder this process cannot create files in (a read-only mount, another user's folder; here
    `chattr +i`), the log cannot be read: check, merge and salvage each refuse in one line, where
    they had read the main file alone and found none of those answers."""
    killed = tmp_path / "killed.sqlite"
    writer = (
        "import os, sys\nsys.path[:0] = sys.argv[2:]\n"
        "from test_cache_merge import answer, cache_with\nfrom experts import ScoreCache\n"
        "cache_with(__import__('pathlib').Path(sys.argv[1]), [])\n"
        "cache = ScoreCache(sys.argv[1])\ncache.put_many([answer(i) for i in range(30)])\n"
        "os._exit(0)  # as kill -9: no checkpoint of the log into the file\n"
    )
    here = str(Path(__file__).parent)
    subprocess.run([sys.executable, "-c", writer, str(killed), here, *sys.path], check=True)
    log = Path(f"{killed}-wal")
    assert log.stat().st_size > 0
    readable, shut = tmp_path / "readable", tmp_path / "shut"
    for folder in (readable, shut):
        folder.mkdir()
        for path in (killed, log):
            (folder / path.name).write_bytes(path.read_bytes())
    target = ScoreCache(tmp_path / "target.sqlite")
    try:
        assert [r.added for r in merge_caches(target, [readable / killed.name])] == [30]
        done = subprocess.run(["chattr", "+i", str(shut)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"chattr +i does not work here: {done.stderr.decode().strip()}")
        refusal = r"its write-ahead log killed.sqlite-wal \([\d,]+ bytes\) holds answers that cannot be read"
        try:
            for call in (
                lambda: check_cache(shut / killed.name),
                lambda: merge_caches(target, [shut / killed.name]),
                lambda: salvage_cache(shut / killed.name, tmp_path / "salvaged.sqlite"),
            ):
                with pytest.raises(ConfigError, match=refusal):
                    call()
        finally:
            subprocess.run(["chattr", "-i", str(shut)], check=False)
    finally:
        target.close()


@pytest.mark.parametrize(
    "schema", ["CREATE TABLE scores (player TEXT, score INT)", "CREATE TABLE notes (text TEXT)"]
)
def test_another_programs_database_named_as_the_cache_is_refused_untouched(
    tmp_path: Path, schema: str
) -> None:
    """Opening it as the cache, even to read (`ctd cache stats`), would switch it to WAL and add
    this project's tables; it is refused in one line, its bytes as they were. An empty database
    is a new cache."""
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as db:
        db.execute(schema)
        db.commit()
    before = other.read_bytes()
    with pytest.raises(ConfigError, match=r"other.db: not a ctd cache \(an SQLite database holding"):
        ScoreCache(other)
    done = run_ctd("cache", "stats", "--cache", str(other), cwd=tmp_path)
    assert done.returncode == 2 and "not a ctd cache" in done.stderr, done.stderr
    assert other.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    ScoreCache(empty).close()
