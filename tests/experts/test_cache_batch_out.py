"""The cache's record of requests out in batch files (`batch_out`, written by `ctd query
--batch-out`): an answer however it comes releases its key, a salvage keeps the record, a release
forgets one file, and a record that meets another process's for the same keys records nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from experts import ScoreCache, salvage_cache

# Private: a live run's claims, as the cache holds them while it asks.
from experts._claims import ClaimLedger, Lease


def answer(i: int) -> dict[str, object]:
    return {
        "key": f"{i:064x}", "expert": "e", "item_id": f"ex{i}", "endpoint": "http://127.0.0.1/v1",
        "model": "m", "method": "next-token", "template_sha256": "0" * 64, "schema_version": 1,
        "score": 0.5, "label_mass": 0.9, "response": json.dumps({"i": i}), "latency_ms": 1.0,
        "created": datetime.now(UTC),
    }  # fmt: skip


def out(i: int, file: str) -> dict[str, object]:
    return {
        "key": f"{i:064x}",
        "expert": "e",
        "item_id": f"ex{i}",
        "file": file,
        "created": "2026-11-28 12:00:00",
    }


KEYS = [f"{i:064x}" for i in range(10)]


def test_an_answer_releases_its_key_and_a_release_forgets_one_file(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path / "cache.sqlite")
    try:
        assert cache.mark_batch_out([out(i, "/b/first.jsonl") for i in range(6)], "/b/first.jsonl") is None
        assert (
            cache.mark_batch_out([out(i, "/b/second.jsonl") for i in range(6, 10)], "/b/second.jsonl") is None
        )
        assert cache.pending_files(KEYS) == {"/b/first.jsonl": 6, "/b/second.jsonl": 4}
        cache.put_many([answer(0), answer(7)])  # answered (a live run, a merge): out no longer
        assert cache.pending_files(KEYS) == {"/b/first.jsonl": 5, "/b/second.jsonl": 3}
        assert cache.counts()["e"] == {"scores": 2, "failures": 0, "batch_out": 8}
        assert cache.release_batch("/b/second.jsonl") == 3
        assert cache.pending_files(KEYS) == {"/b/first.jsonl": 5}
        cache.clear_batch_out(KEYS[:3])
        assert set(cache.batch_files(KEYS)) == set(KEYS[3:6])
    finally:
        cache.close()


def test_a_record_that_no_longer_holds_records_nothing(tmp_path: Path) -> None:
    """What a `--batch-out` saw as it wrote its file must still hold when it records it: else
    nothing is recorded (it then removes its file) and the reason is returned. Another batch out
    under the same name; the same keys recorded out in another file meanwhile (two `--batch-out`
    at once); keys answered meanwhile; keys a live run is asking now."""
    cache = ScoreCache(tmp_path / "cache.sqlite")
    try:
        assert cache.mark_batch_out([out(i, "/b/a.jsonl") for i in range(4, 8)], "/b/a.jsonl") is None
        reused = cache.mark_batch_out([out(i, "/b/a.jsonl") for i in range(8, 10)], "/b/a.jsonl")
        assert reused == (
            "/b/a.jsonl (not found here) names 4 requests of another batch still out: give this batch "
            "another name, or if that batch was never submitted, `ctd cache release-batch /b/a.jsonl "
            f"--cache {tmp_path / 'cache.sqlite'}` first lets its requests be asked again"
        )
        taken = cache.mark_batch_out([out(i, "/b/b.jsonl") for i in range(10)], "/b/b.jsonl")
        assert taken == "another --batch-out wrote 4 of these requests meanwhile, to /b/a.jsonl (4)"
        cache.put_many([answer(0)])
        answered = cache.mark_batch_out([out(i, "/b/c.jsonl") for i in range(4)], "/b/c.jsonl")
        assert answered == "1 of these requests were answered meanwhile"
        asking = ClaimLedger(cache, lease=Lease(seconds=60, renew_every=20))
        assert asking.claim("e", {KEYS[1]: "ex1"}).mine == {KEYS[1]}
        claimed = cache.mark_batch_out([out(i, "/b/c.jsonl") for i in range(1, 4)], "/b/c.jsonl")
        assert claimed == "a live run is asking 1 of these requests now"
        assert cache.pending_files(KEYS) == {"/b/a.jsonl": 4}  # none of the refused was recorded
        assert cache.mark_batch_out([out(i, "/b/c.jsonl") for i in range(2, 4)], "/b/c.jsonl") is None
    finally:
        cache.close()


def test_a_salvage_keeps_the_requests_out(tmp_path: Path) -> None:
    """Without them, the salvaged cache's next --batch-out would write them again, to be paid twice."""
    cache = ScoreCache(tmp_path / "cache.sqlite")
    cache.put_many([answer(i) for i in range(3)])
    assert cache.mark_batch_out([out(i, "/b/first.jsonl") for i in range(3, 10)], "/b/first.jsonl") is None
    cache.close()
    result = salvage_cache(tmp_path / "cache.sqlite", tmp_path / "new.sqlite")
    assert result.recovered == {"scores": 3, "failures": 0, "batch_out": 7}
    salvaged = ScoreCache(tmp_path / "new.sqlite")
    try:
        assert salvaged.pending_files(KEYS) == {"/b/first.jsonl": 7}
    finally:
        salvaged.close()


def test_results_release_a_request_only_while_their_batch_holds_it(tmp_path: Path) -> None:
    """`release_batches` forgets a key only while the batch it was read in (by tag) holds it: a
    request released and recorded out anew in another file meanwhile (by another `--batch-out`)
    stays out. (A release by key alone, `clear_batch_out`, forgot the new record too.)"""
    cache = ScoreCache(tmp_path / "cache.sqlite")
    try:
        assert cache.mark_batch_out([out(i, "/b/first.jsonl") for i in range(4)], "/b/first.jsonl") is None
        seen = cache.batch_tags(KEYS[:4])  # what a --batch-in reads before scoring its results
        assert len(set(seen.values())) == 1 and set(seen) == set(KEYS[:4])
        assert cache.release_batch("/b/first.jsonl") == 4  # meanwhile: released, and key 0 written anew
        assert cache.mark_batch_out([out(0, "/b/second.jsonl")], "/b/second.jsonl") is None
        # The same file at the same time is the same batch: its record goes.
        assert cache.mark_batch_out([out(1, "/b/first.jsonl")], "/b/first.jsonl") is None
        cache.release_batches(seen)
        assert cache.batch_files(KEYS) == {KEYS[0]: "/b/second.jsonl"}
    finally:
        cache.close()
