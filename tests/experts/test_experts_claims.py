"""Runs that share one cache: items in flight are claimed in it, so that two processes never
pay twice for an item, and a claim whose holder died never blocks the next run for long.

The two-process tests run the real `ctd query` twice at once against the fault-injecting
server (tests/fault_server.py) in a process of its own; the server's counts say who paid."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ctd_cli import CTD, run_ctd
from fault_server import FaultPlan, RunningServer, item_score, server_process
from test_experts_engine import db_rows, make_spec, predict, server_stats

from experts import ExpertClient, FailureKind, Item, RateLimit, ScoreCache, Timeout, list_claims

# Private: claims under a lease, unit-tested.
from experts._claims import ClaimLedger, Lease, process_gone, this_host

TESTS = Path(__file__).resolve().parents[1]

# The fault rates of issue 12: half of all requests meet a fault.
ISSUE_12_FAULTS = {"429": 0.20, "500": 0.15, "drop": 0.05, "malformed": 0.05, "no-logprobs": 0.05}
MAX_ATTEMPTS = 60  # far above what any item of the plan needs (the test checks), so none fails

# `ctd query` has no option for the retry backoff (0.5 s doubling up to 30 s by default): through
# half of all requests failing that would take minutes, so these runs start `ctd` with a
# shorter default backoff. Everything else is the real command.
CTD_FAST_BACKOFF = (
    "from experts import RetryPolicy; "
    "RetryPolicy.__init__.__kwdefaults__.update(initial=0.001, maximum=0.01); " + CTD
)


def write_workdir(folder: Path, n: int, url: str, *, concurrency: int) -> dict[str, str]:
    """A dataset of n items and a registry with the expert `faulty`; the environment for `ctd`."""
    rows = [
        {
            "ids": f"ex{i}",
            "inputs": f"item-{i}: is this risky?",
            "labels": "high-stakes" if i % 2 else "low-stakes",
        }
        for i in range(n)
    ]
    (folder / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "experts.toml").write_text(
        f'[experts.faulty]\nbase_url = "{url}"\nmodel = "fault-model"\n'
        f"concurrency = {concurrency}\nmax_attempts = {MAX_ATTEMPTS}\ntimeout = 10\n"
    )
    return {"CTD_CACHE": str(folder / "cache.sqlite"), "CTD_EXPERTS_FILE": str(folder / "experts.toml")}


def start_query(
    folder: Path, env: dict[str, str], out: str, method: str, *, prelude: str = ""
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", prelude + CTD_FAST_BACKOFF, "query", "--data", "data.jsonl", "--out", out,
         "--expert", "faulty", "--method", method, "--no-check", "--json"],
        cwd=folder, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def read_out(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- two processes, one cache


def two_queries_on_one_cache(folder: Path, n: int, method: str, delay: float) -> None:
    """Two `ctd query` processes started together on the same items and the same new cache,
    through the fault rates of issue 12: every item is paid for once across both."""
    plan = FaultPlan(rates=ISSUE_12_FAULTS)
    outcomes = [predict(plan, i, method, MAX_ATTEMPTS) for i in range(n)]
    assert all(o.scored for o in outcomes)  # the cap is above what any item needs
    with server_process(folder, {"rates": ISSUE_12_FAULTS, "delay": delay}) as url:
        env = write_workdir(folder, n, url, concurrency=16)
        runs = [start_query(folder, env, f"out-{name}.csv", method) for name in ("a", "b")]
        finished = [run.communicate(timeout=600) for run in runs]
        stats = server_stats(url)
    for run, (_, stderr) in zip(runs, finished, strict=True):
        assert run.returncode == 0, stderr
    summaries = [json.loads(stdout) for stdout, _ in finished]
    for summary in summaries:
        assert summary["total"] == n and summary["failed"] == 0
        assert summary["scored"] + summary["cached"] == n
    # Both really ran at once (else the test proves nothing), and between them scored each item once.
    assert min(s["scored"] for s in summaries) >= n // 10, summaries
    assert sum(s["scored"] for s in summaries) == n, summaries

    # The server's own counts: each item met exactly the requests one run alone would have sent
    # (the faults depend on how many requests the item has had), so one success per answer.
    for i, outcome in enumerate(outcomes):
        assert stats["requests"].get(i, 0) == outcome.requests, (i, outcome)
        assert stats["successes"].get(i, 0) == outcome.successes, (i, outcome)
    if method == "next-token":
        assert all(stats["successes"].get(i, 0) == 1 for i in range(n))

    # Both outputs complete and aligned; each item came from the expert in exactly one of them.
    outputs = [read_out(folder / f"out-{name}.csv") for name in ("a", "b")]
    for rows in outputs:
        assert [row["id"] for row in rows] == [f"ex{i}" for i in range(n)]
        for i, row in enumerate(rows):
            assert abs(float(row["expert"]) - item_score(i)) <= 1e-12, (i, row)
    for i, (a, b) in enumerate(zip(*outputs, strict=True)):
        assert {a["source"], b["source"]} == {"expert", "cache"}, (i, a, b)

    db = folder / "cache.sqlite"
    assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert db_rows(db, "SELECT count(*), count(DISTINCT item_id) FROM scores") == [(n, n)]
    assert db_rows(db, "SELECT count(*) FROM failures") == [(0,)]
    assert db_rows(db, "SELECT count(*) FROM claims") == [(0,)]  # both released everything


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_two_queries_on_one_cache_pay_once(tmp_path: Path, method: str) -> None:
    # The delay keeps each run long (seconds) next to the gap between the two starts.
    two_queries_on_one_cache(tmp_path, 400, method, delay=0.1 if method == "next-token" else 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_two_queries_on_one_cache_pay_once_2400_items(tmp_path: Path, method: str) -> None:
    two_queries_on_one_cache(tmp_path, 2400, method, delay=0.02)


# --------------------------------------------------------------------------- a killed holder

KILLED_LEASE = 600.0
# The killed run's claims last this long (the default is 60 s): waiting them out could never pass.
LONG_LEASE = (
    f"from experts._claims import Lease; Lease.__init__.__kwdefaults__.update(seconds={KILLED_LEASE}); "
)


def test_sigkill_of_a_claim_holder_does_not_block_the_other_run(tmp_path: Path) -> None:
    """Two runs at once; one is killed mid-run. The other takes over its claims at once (the
    holder is gone from this host) instead of waiting out the killed run's lease, and finishes
    everything, paying again only for the killed run's items in flight. The killed run holds its
    claims under a 600 s lease, so "did not wait for it" is a bound far from both the lease and
    the rest of the run (a fixed 30 s next to the default 60 s lease failed on a loaded machine)."""
    n, concurrency = 1200, 8
    with server_process(tmp_path, {"rates": {"429": 0.05, "500": 0.05}, "delay": 0.05}) as url:
        env = write_workdir(tmp_path, n, url, concurrency=concurrency)
        db = tmp_path / "cache.sqlite"
        first = start_query(tmp_path, env, "out-a.csv", "next-token", prelude=LONG_LEASE)
        second = start_query(tmp_path, env, "out-b.csv", "next-token")
        deadline = time.monotonic() + 60
        while True:  # both runs are paying, and the first holds claims
            assert first.poll() is None and second.poll() is None, "a run ended before the kill"
            assert time.monotonic() < deadline, "the runs did not get going"
            try:
                expires = dict(db_rows(db, "SELECT pid, min(expires) FROM claims GROUP BY pid"))
                stored = db_rows(db, "SELECT count(*) FROM scores")[0][0]
            except sqlite3.Error:  # not created yet
                expires, stored = {}, 0
            if {first.pid, second.pid} <= expires.keys() and stored >= 200:
                break
            time.sleep(0.05)
        # The run to be killed holds its claims under the long lease, else waiting out a 60 s lease
        # would pass too.
        assert expires[first.pid] > time.time() + KILLED_LEASE / 2, expires
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = time.monotonic()
        time.sleep(0.3)  # requests that reached the server before the kill finish there
        at_kill = server_stats(url)
        try:
            stdout, stderr = second.communicate(timeout=KILLED_LEASE / 2)
        except subprocess.TimeoutExpired:
            second.kill()
            second.communicate()
            pytest.fail(
                f"the second run was going {KILLED_LEASE / 2:.0f} s after the kill: it waits for the lease"
            )
        took = time.monotonic() - killed_at
        end = server_stats(url)
    assert second.returncode == 0, stderr
    assert took < KILLED_LEASE / 2, (
        f"the second run waited {took:.1f} s after the kill: it waited for the lease"
    )
    summary = json.loads(stdout)
    assert summary["failed"] == 0 and summary["cached"] + summary["scored"] == n
    rows = read_out(tmp_path / "out-b.csv")
    assert [row["id"] for row in rows] == [f"ex{i}" for i in range(n)]
    assert all(abs(float(row["expert"]) - item_score(i)) <= 1e-12 for i, row in enumerate(rows))
    # Paid twice: only items the killed run had in flight (asked, not committed), one per worker.
    paid_twice = {i for i, count in end["successes"].items() if count > 1}
    assert paid_twice <= {i for i, count in at_kill["successes"].items() if count > 0}
    assert len(paid_twice) <= concurrency, sorted(paid_twice)
    assert all(end["successes"].get(i, 0) >= 1 for i in range(n))
    assert db_rows(db, "SELECT count(*) FROM scores") == [(n,)]
    assert db_rows(db, "SELECT count(*) FROM claims") == [(0,)]
    assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]


# --------------------------------------------------------------------------- `ctd cache stats`


def test_cache_stats_shows_claims_in_progress_and_stale_ones(tmp_path: Path) -> None:
    n = 400
    with server_process(tmp_path, {"delay": 0.2}) as url:
        env = write_workdir(tmp_path, n, url, concurrency=4)  # a slow run (20 s), killed early
        run = start_query(tmp_path, env, "out.csv", "next-token")
        deadline = time.monotonic() + 60
        while True:
            assert run.poll() is None, "the run ended before its claims were seen"
            assert time.monotonic() < deadline, "no claims seen"
            stats = run_ctd("cache", "stats", "--json", cwd=tmp_path, env=env)
            if stats.returncode == 0 and json.loads(stats.stdout)["experts"].get("faulty", {}).get("claims"):
                break
            time.sleep(0.1)
        report = json.loads(stats.stdout)
        assert report["experts"]["faulty"]["stale_claims"] == 0
        [holder] = report["holders"]
        assert holder["pid"] == run.pid and holder["host"] == this_host()
        assert holder["claims"] >= 1 and 0 < holder["lease_left_s"] <= Lease().seconds
        table = run_ctd("cache", "stats", cwd=tmp_path, env=env)
        assert "claimed now" in table.stdout and f"pid {run.pid}" in table.stdout, table.stdout

        run.send_signal(signal.SIGKILL)
        run.wait(10)
        report = json.loads(run_ctd("cache", "stats", "--json", cwd=tmp_path, env=env).stdout)
        counts = report["experts"]["faulty"]
        assert counts["claims"] == 0 and counts["stale_claims"] >= 1
        assert report["holders"][0]["pid"] == run.pid
        assert "its run is gone" in run_ctd("cache", "stats", cwd=tmp_path, env=env).stdout

    # The next run on this host sweeps them (and would take them over without the sweep).
    cache = ScoreCache(tmp_path / "cache.sqlite")
    ClaimLedger(cache).sweep()
    assert list_claims(cache) == []
    cache.close()


# --------------------------------------------------------------------------- leases, in one process


def key_of(spec: Any, item: Item) -> str:
    return ExpertClient(spec, cache=None).request_for(item)[1]


def hold(
    cache: ScoreCache, spec: Any, items: list[Item], *, owner: str, host: str, pid: int, expires: float
) -> None:
    """Claims on `items` as another run would hold them."""
    with cache.engine.begin() as connection:
        for item in items:
            connection.exec_driver_sql(
                "INSERT INTO claims (key, expert, item_id, owner, host, pid, expires) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key_of(spec, item), spec.name, item.id, owner, host, pid, expires),
            )


def score_row(spec: Any, item: Item, score: float) -> dict[str, Any]:
    # Private: the cache's own clock.
    from experts._cache import now

    return {
        "key": key_of(spec, item), "expert": spec.name, "item_id": item.id, "endpoint": "x", "model": "x",
        "method": spec.method, "template_sha256": "x", "schema_version": 1, "score": score,
        "label_mass": None, "response": "{}", "latency_ms": 1.0, "created": now(),
    }  # fmt: skip


def test_a_run_waits_for_items_a_live_run_holds(tmp_path: Path) -> None:
    """Items another live run holds are not asked: the ones it answers come from the cache, the
    ones it lets go unanswered (it failed them) are claimed and asked here."""
    cache = ScoreCache(tmp_path / "cache.db")
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(40)]
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=4))
        other = {"owner": "other-run", "host": this_host(), "pid": os.getpid()}  # alive: this process
        hold(cache, spec, items[:6], **other, expires=time.time() + 60)

        async def the_other_run() -> None:
            await asyncio.sleep(0.6)
            answered = [score_row(spec, item, 0.123) for item in items[:4]]
            failed = [
                {"key": key_of(spec, item), "expert": spec.name, "item_id": item.id, "reason": "http-500",
                 "message": "HTTP 500", "attempts": 6, "created": answered[0]["created"]}
                for item in items[4:6]
            ]  # fmt: skip
            await asyncio.to_thread(cache.put_many, answered, failed, release_owner="other-run")

        async def both() -> Any:
            client = ExpertClient(spec, cache=cache, lease=Lease(poll=0.05))
            started = time.monotonic()
            (results, stats), _ = await asyncio.gather(client.score(items), the_other_run())
            return results, stats, time.monotonic() - started

        results, stats, took = asyncio.run(both())
        requests = server.server.counts.requests
    assert took >= 0.6
    assert [r.source for r in results] == ["cache"] * 4 + ["expert"] * 36
    assert [r.score for r in results[:4]] == [0.123] * 4  # the other run's answers
    assert all(requests[i] == 0 for i in range(4))
    assert all(requests[i] == 1 for i in range(4, 40))
    assert stats.cached == 4 and stats.scored == 36 and stats.waiting == 0
    assert db_rows(tmp_path / "cache.db", "SELECT count(*) FROM claims") == [(0,)]
    cache.close()


FAR_LEASE = 5.0


def test_stale_claims_are_taken_over(tmp_path: Path) -> None:
    """A claim of a process gone from this host is taken over at once, whatever its lease; a
    claim from another host only when its lease runs out. The far host's lease (5 s) and the
    windows around it leave seconds for a loaded machine (1.5 s and a 1 s window once)."""
    cache = ScoreCache(tmp_path / "cache.db")
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(20)]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=4))
        held_at = time.monotonic()
        hold(
            cache, spec, items[:3], owner="killed", host=this_host(), pid=dead.pid, expires=time.time() + 600
        )
        hold(
            cache,
            spec,
            items[3:5],
            owner="far-away",
            host="another-host",
            pid=1,
            expires=time.time() + FAR_LEASE,
        )
        sent_at: dict[int, float] = {}
        original = server.server._fault

        async def record(request: Any, item: int) -> Any:
            sent_at.setdefault(item, time.monotonic())
            return await original(request, item)

        server.server._fault = record  # type: ignore[method-assign]
        results, _ = asyncio.run(ExpertClient(spec, cache=cache, lease=Lease(poll=0.05)).score(items))
    assert [r.source for r in results] == ["expert"] * 20
    assert all(sent_at[i] - held_at < 3.0 for i in (0, 1, 2))  # the dead holder's: at once
    assert all(FAR_LEASE <= sent_at[i] - held_at < FAR_LEASE + 3.0 for i in (3, 4))  # after its lease
    assert db_rows(tmp_path / "cache.db", "SELECT count(*) FROM claims") == [(0,)]
    cache.close()


def test_the_heartbeat_keeps_a_long_run_s_claims_live(tmp_path: Path) -> None:
    """With a 2.5 s lease renewed every 0.2 s, a run of over twice the lease never shows a stale
    claim to an observer, and its claims vanish when it ends. Each answer takes longer than the
    lease and the run claims all 8 items at once, so every claim must be renewed to stay live
    (without renewal all go stale). A renewal has 2.3 s to come late before a claim goes stale
    (0.4 s with a 0.5 s lease once, too little on a loaded machine)."""
    cache = ScoreCache(tmp_path / "cache.db")
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(8)]  # two rounds: 7 s
    samples: list[tuple[int, int]] = []
    with RunningServer(FaultPlan(delay=3.5)) as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=4), timeout=Timeout(read=30.0))
        client = ExpertClient(spec, cache=cache, lease=Lease(seconds=2.5, renew_every=0.2, poll=0.05))
        run = threading.Thread(target=lambda: asyncio.run(client.score(items)))
        started = time.monotonic()
        run.start()
        while run.is_alive():
            holders = list_claims(cache)
            samples.append((sum(h.live for h in holders), sum(h.stale for h in holders)))
            time.sleep(0.05)
        run.join()
        took = time.monotonic() - started
    assert took > 2 * 2.5  # the run outlasted its lease twice over
    assert any(live for live, _ in samples)
    assert all(stale == 0 for _, stale in samples), samples
    assert list_claims(cache) == []
    cache.close()


def test_process_gone() -> None:
    assert not process_gone(os.getpid())
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert process_gone(exited.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while not process_gone(zombie.pid):  # killed and not yet reaped: a zombie is gone
        assert time.monotonic() < deadline
        time.sleep(0.01)
    zombie.wait()
    assert process_gone(0) and process_gone(-1)


def test_own_claims_are_not_waited_for(tmp_path: Path) -> None:
    """The same input twice in one run is asked twice (as before claims), never waited on."""
    cache = ScoreCache(tmp_path / "cache.db")
    ledger = ClaimLedger(cache)
    first = ledger.claim("e", {"k1": "a", "k2": "b"})
    assert first.mine == {"k1", "k2"} and not first.held and not first.scored
    again = ledger.claim("e", {"k1": "a"})
    assert again.mine == {"k1"}
    other_ledger = ClaimLedger(cache)
    other = other_ledger.claim("e", {"k1": "a", "k3": "c"})
    assert other.held == {"k1"} and other.mine == {"k3"}
    ledger.release_all()
    assert [(h.owner, h.live) for h in list_claims(cache)] == [(other_ledger.owner, 1)]
    cache.close()


def test_items_out_in_a_batch_file_are_not_sent(tmp_path: Path) -> None:
    """A request out in a batch file (`ctd query --batch-out` recorded it) is nobody's to claim: a
    live run fails its items as "in-batch" without sending them or recording a failure (the item
    with the same input follows it), and a request answered since (`--batch-in`) is a cache hit."""
    cache = ScoreCache(tmp_path / "cache.db")
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(12)]
    items.append(Item("row-0-again", items[0].conversation))
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=4))
        out = [
            {"key": key_of(spec, item), "expert": spec.name, "item_id": item.id, "file": "/b/batch.jsonl",
             "created": "2026-11-28 12:00:00"}
            for item in items[:4]
        ]  # fmt: skip
        assert cache.mark_batch_out(out, "/b/batch.jsonl") is None
        cache.put_many([score_row(spec, items[3], 0.25)])  # its answer came back: out no longer
        results, stats = asyncio.run(ExpertClient(spec, cache=cache, lease=Lease(poll=0.05)).score(items))
        requests = server.server.counts.requests
    assert [r.source for r in results] == ["failed"] * 3 + ["cache"] + ["expert"] * 8 + ["failed"]
    assert {(r.reason, r.failure, r.attempts) for r in results if r.source == "failed"} == {
        ("in-batch", FailureKind.IN_BATCH, 0)
    }
    assert results[3].score == 0.25 and results[-1].id == "row-0-again"
    assert all(requests[i] == 0 for i in range(4)) and all(requests[i] == 1 for i in range(4, 12))
    assert (stats.failed, stats.cached, stats.scored, stats.failure_reasons) == (4, 1, 8, {"in-batch": 4})
    assert db_rows(tmp_path / "cache.db", "SELECT count(*) FROM failures") == [(0,)]
    assert db_rows(tmp_path / "cache.db", "SELECT count(*) FROM claims") == [(0,)]
    assert cache.pending_files([key_of(spec, item) for item in items]) == {"/b/batch.jsonl": 3}
    cache.close()
