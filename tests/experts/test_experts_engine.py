"""The expert stage end to end against the fault-injecting OpenAI-compatible server
(tests/fault_server.py) on loopback: faults, retries and alignment, the cache and its keys,
the RPM limit, and a SIGKILL in the middle of a run followed by a resume."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from fault_server import FAULTS, FaultPlan, RunningServer, item_score, server_process

from experts import (
    ExpertClient,
    ExpertSpec,
    Item,
    ItemResult,
    RateLimit,
    RetryPolicy,
    ScoreCache,
    Timeout,
)

TESTS = Path(__file__).resolve().parents[1]
STAKES_V1 = TESTS.parent / "experts" / "prompts" / "stakes-v1.toml"
SECRET = "sk-test-SECRET-123"
KEY_ENV = "CTD_ENGINE_TEST_API_KEY"

# Faults the endpoint raises on (the second likelihood request is then not sent) and the reason
# each one is recorded under.
HTTP_FAULTS = {
    "429": "http-429",
    "500": "http-500",
    "slow": "timeout",
    "drop": "connection",
    "malformed": "malformed-json",
}


# A slow fault answers (500) this long after the request: 7 s past the client's 3 s read timeout,
# so that a client whose event loop a loaded machine stalls still times out first (with 1.5 s
# against 1 s a CI run under load saw 3 of 2,000 slow answers arrive as http-500). The server cuts
# the slow faults still sleeping short when it stops (tests/fault_server.py).
SLOW_SECONDS = 10.0


def make_spec(url: str, **changes: Any) -> ExpertSpec:
    spec = ExpertSpec(
        name="fault-expert",
        base_urls=(url,),
        model="fault-model",
        rate=RateLimit(concurrency=32),
        # Far under a slow fault (SLOW_SECONDS), far above a loaded answer: with 1 s a stall of a
        # loaded machine turned a normal answer into a timeout and broke exact request counts.
        timeout=Timeout(read=3.0),
        retry=RetryPolicy(max_attempts=8, initial=0.001, multiplier=2.0, maximum=0.01, deadline=120.0),
    )
    return replace(spec, **changes)


def make_items(n: int) -> list[Item]:
    """Ids unlike the server's item numbers; every third input is a message list."""
    items = []
    for i in range(n):
        if i % 3 == 0:
            conversation: Any = [
                {"role": "user", "content": f"Please look at item-{i} for me."},
                {"role": "assistant", "content": "Sure, looking now."},
            ]
        else:
            conversation = f"A request about item-{i}."
        items.append(Item(f"row-{i:05d}", conversation))
    return items


def run_client(spec: ExpertSpec, items: list[Item], cache: ScoreCache | None) -> tuple[list[ItemResult], Any]:
    return asyncio.run(ExpertClient(spec, cache=cache).score(items))


@dataclass
class Outcome:
    """What the fault plan says must happen to one item in one run."""

    scored: bool
    attempts: int
    requests: int  # HTTP requests the item sends in this run
    successes: int  # of those, answers the server counts as successful
    errors: list[str]  # reasons of the failed attempts


def predict(plan: FaultPlan, item: int, method: str, max_attempts: int, sent_before: int = 0) -> Outcome:
    """Replay the client's retry loop over the plan: the fault of each request depends only on
    the item and how many requests for it the server has seen."""
    if method == "next-token":
        return _predict_next_token(plan, item, max_attempts, sent_before)
    n, successes, errors = sent_before, 0, []
    per_attempt = 2  # likelihood: one request per answer
    no_label_reason = "no-label-mass" if method == "next-token" else "no-logprobs"
    for attempt in range(1, max_attempts + 1):
        faults = []
        for _ in range(per_attempt):
            n += 1
            fault = plan.fault(item, n)
            faults.append(fault)
            if fault in HTTP_FAULTS:
                break
            # The server counts a 200 answer with logprobs as a success (in chat, even one
            # without label tokens).
            if fault is None or (fault == "no-labels" and method == "next-token"):
                successes += 1
        last = faults[-1]
        if last in HTTP_FAULTS:
            errors.append(HTTP_FAULTS[last])
        elif "no-logprobs" in faults:
            errors.append("no-logprobs")
        elif "no-labels" in faults:
            errors.append(no_label_reason)
        else:
            return Outcome(True, attempt, n - sent_before, successes, errors)
    return Outcome(False, max_attempts, n - sent_before, successes, errors)


def _predict_next_token(plan: FaultPlan, item: int, max_attempts: int, sent_before: int) -> Outcome:
    """`predict` for next-token scoring with `make_spec`'s expert (20 top logprobs, an external
    server): an answer without label tokens or logprobs is followed, in the same attempt, by the
    recovery ladder's one rung for it (named-labels, experts._recovery). The rung's clean answer
    scores the item; its answer without label mass fails it for good with the first answer's
    reason (deterministic requests: no retry); its HTTP fault is the attempt's error."""
    n, successes, errors = sent_before, 0, []
    for attempt in range(1, max_attempts + 1):
        reason = None
        for _ in range(2):  # the item's own request, then the rung's if it is needed
            n += 1
            fault = plan.fault(item, n)
            if fault in HTTP_FAULTS:
                errors.append(HTTP_FAULTS[fault])
                break
            if fault is None or fault == "no-labels":  # the server counts a 200 with logprobs
                successes += 1
            if fault is None:
                return Outcome(True, attempt, n - sent_before, successes, errors)
            if reason is not None:  # the rung answered outside too: failed, not retried
                errors.append(reason)
                return Outcome(False, attempt, n - sent_before, successes, errors)
            reason = "no-logprobs" if fault == "no-logprobs" else "no-label-mass"
    return Outcome(False, max_attempts, n - sent_before, successes, errors)


def merge_drop(counter: Counter[str]) -> Counter[str]:
    """Timeouts and dropped connections in one bin (see test_dropped_connection_reason)."""
    merged = Counter(counter)
    merged["timeout|connection"] = merged.pop("timeout", 0) + merged.pop("connection", 0)
    return +merged


def db_rows(path: Path, query: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(query).fetchall()
    finally:
        connection.close()


# --------------------------------------------------------------------------- faults, alignment, resume


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_fault_run_scores_everything_or_fails_with_a_reason(tmp_path: Path, method: str) -> None:
    n = 2000
    broken = frozenset({3, 500, 1234, 1999})
    plan = FaultPlan(
        rates=dict.fromkeys(FAULTS, 0.03), broken=broken, slow_seconds=SLOW_SECONDS, retry_after=0.01
    )
    items = make_items(n)
    db = tmp_path / "cache.db"
    cache = ScoreCache(db)
    with RunningServer(plan) as server:
        spec = make_spec(server.url, method=method)
        cap = spec.retry.max_attempts
        started = time.perf_counter()
        results, stats = run_client(spec, items, cache)
        took = time.perf_counter() - started
        counts = server.server.counts
        first_requests = Counter(counts.requests)
        first_successes = Counter(counts.successes)

        # Aligned with the inputs, one result each.
        assert [r.id for r in results] == [item.id for item in items]
        outcomes = [predict(plan, i, method, cap) for i in range(n)]
        expected_failed = {i for i, o in enumerate(outcomes) if not o.scored}
        assert broken <= expected_failed
        expected_errors: Counter[str] = Counter()
        for i, (result, outcome) in enumerate(zip(results, outcomes, strict=True)):
            expected_errors.update(outcome.errors)
            # One retry layer: the server saw exactly the requests the plan implies.
            assert counts.requests[i] == outcome.requests, (i, outcome)
            assert counts.successes[i] == outcome.successes, (i, outcome)
            assert result.attempts == outcome.attempts
            if outcome.scored:
                assert result.source == "expert"
                assert result.reason is None
                assert result.score is not None
                assert abs(result.score - item_score(i)) <= 1e-12
                if method == "next-token":
                    assert result.label_mass == pytest.approx(0.9, abs=1e-12)
            else:
                assert result.source == "failed"
                assert result.score is None
                assert result.reason
        for i in broken:
            assert results[i].reason == ("no-label-mass" if method == "next-token" else "no-logprobs")
        faults_met = sum(counts.faults.values())
        assert faults_met > 300  # the plan did inject faults of every kind
        assert set(counts.faults) == set(FAULTS)
        assert stats.scored == n - len(expected_failed)
        assert stats.failed == len(expected_failed)
        assert stats.cached == 0
        assert stats.rate_limited == counts.faults["429"]
        assert stats.retries == sum(o.attempts - 1 for o in outcomes)
        assert merge_drop(stats.errors_seen) == merge_drop(expected_errors)
        # 26 s on a loaded 2-core machine (likelihood); a run whose workers were serialised would
        # wait out its 70-140 slow faults one by one, 3 s each (the bound was 30 s with a 1 s timeout).
        assert took < 90

        # The database: one score per scored item, each the clean score; no error stored as a score.
        keys = [ExpertClient(spec, cache=None).request_for(item)[1] for item in items]
        assert len(set(keys)) == n
        stored = cache.get_many(keys)
        assert set(stored) == {keys[i] for i in range(n) if i not in expected_failed}
        for i, key in enumerate(keys):
            if key in stored:
                assert stored[key].score == results[i].score
        rows = db_rows(db, "SELECT item_id, key, score, response, method FROM scores")
        assert len(rows) == n - len(expected_failed)
        for item_id, key, score, response, row_method in rows:
            i = int(item_id.removeprefix("row-"))
            assert i not in expected_failed
            assert key == keys[i]
            assert abs(score - item_score(i)) <= 1e-12
            assert row_method == method
            answer = json.loads(response)
            answers = [answer] if method == "next-token" else answer
            assert len(answers) == (1 if method == "next-token" else 2)
            assert all("logprobs" in a["choices"][0] for a in answers)
        failures = db_rows(db, "SELECT item_id, key, reason, attempts FROM failures")
        assert sorted(int(r[0].removeprefix("row-")) for r in failures) == sorted(expected_failed)
        for item_id, key, reason, attempts in failures:
            i = int(item_id.removeprefix("row-"))
            assert key == keys[i]
            assert reason == results[i].reason
            assert attempts == outcomes[i].attempts  # the cap, or 1 when the recovery ladder failed
        assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]

        # A second run sends nothing for stored items and retries the failed ones only.
        again, stats2 = run_client(spec, items, cache)
        assert [r.id for r in again] == [item.id for item in items]
        for i in range(n):
            if i in expected_failed:
                outcome = predict(plan, i, method, cap, sent_before=first_requests[i])
                assert counts.requests[i] - first_requests[i] == outcome.requests
                assert again[i].source == ("expert" if outcome.scored else "failed")
            else:
                assert counts.requests[i] == first_requests[i]
                assert counts.successes[i] == first_successes[i]
                assert again[i].source == "cache"
                assert again[i].score == results[i].score
                assert again[i].label_mass == results[i].label_mass
        assert stats2.cached == n - len(expected_failed)
        for i in broken:
            assert again[i].source == "failed"
        failures = db_rows(db, "SELECT item_id FROM failures")
        assert len(failures) == len(expected_failed) + stats2.failed
        assert cache.integrity_check() == "ok"
    cache.close()


def test_dropped_connection_reason(tmp_path: Path) -> None:
    with RunningServer(FaultPlan(rates={"drop": 1.0})) as server:
        spec = make_spec(
            server.url,
            timeout=Timeout(read=5.0),
            retry=RetryPolicy(max_attempts=2, initial=0.001, maximum=0.01),
        )
        started = time.perf_counter()
        results, _ = run_client(spec, make_items(3), None)
        assert time.perf_counter() - started < 5.0  # not a read timeout
        assert server.server.counts.faults["drop"] == 6
    assert [r.reason for r in results] == ["connection"] * 3


# --------------------------------------------------------------------------- cache keys and the API key


def test_cache_key_changes_and_the_api_key_is_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 40
    broken = frozenset({7})
    items = make_items(n)
    run_folder = tmp_path / "run"
    db = run_folder / "cache.db"
    template_copy = run_folder / "stakes-v1-edited.toml"
    run_folder.mkdir()
    template_copy.write_text(
        STAKES_V1.read_text(encoding="utf-8").replace("careful reviewer", "careful judge"), encoding="utf-8"
    )
    auth_seen: Counter[str | None] = Counter()

    @web.middleware
    async def record_auth(request: web.Request, handler: Any) -> web.StreamResponse:
        auth_seen[request.headers.get("Authorization")] += 1
        return await handler(request)

    monkeypatch.setenv(KEY_ENV, SECRET)
    running = RunningServer(FaultPlan(broken=broken))
    running.server.app.middlewares.append(record_auth)
    cache = ScoreCache(db)
    with running as server:
        requests = server.server.counts.requests

        def run(spec: ExpertSpec) -> tuple[list[ItemResult], int]:
            before = sum(requests.values())
            results, _ = run_client(spec, items, cache)
            assert [r.id for r in results] == [item.id for item in items]
            return results, sum(requests.values()) - before

        base = make_spec(server.url, api_key_env=KEY_ENV, rate=RateLimit(concurrency=8))
        results, sent = run(base)
        assert sent == n + 1  # the broken item: its request and the recovery ladder's one rung
        assert auth_seen == {f"Bearer {SECRET}": sent}
        assert [r.source for r in results].count("expert") == n - 1

        def assert_all(results: list[ItemResult], source: str) -> None:
            for i, result in enumerate(results):
                if i in broken:
                    assert result.source == "failed"
                else:
                    assert result.source == source, (i, result)
                    assert abs(result.score - item_score(i)) <= 1e-12  # type: ignore[operator]

        # Another API key: every stored item is a hit.
        monkeypatch.setenv(KEY_ENV, "sk-another-key-456")
        results, sent = run(base)
        assert_all(results, "cache")
        assert sent == 2  # only the broken item (its request and the ladder's rung)
        # Without any key: still hits.
        monkeypatch.delenv(KEY_ENV)
        results, sent = run(base)
        assert_all(results, "cache")
        monkeypatch.setenv(KEY_ENV, SECRET)

        # Another served model (the server ignores it): every item misses, then hits.
        other_model = replace(base, model="another-served-model")
        results, sent = run(other_model)
        assert_all(results, "expert")
        assert sent == n + 1
        assert_all(run(other_model)[0], "cache")

        # The same template with one word changed: misses.
        edited = replace(base, template=str(template_copy))
        results, _ = run(edited)
        assert_all(results, "expert")
        assert_all(run(edited)[0], "cache")

        # Another scoring method: misses (likelihood sends two requests per item).
        likelihood = replace(base, method="likelihood")
        results, sent = run(likelihood)
        assert_all(results, "expert")
        assert sent == 2 * (n - 1) + 2 * base.retry.max_attempts
        assert_all(run(likelihood)[0], "cache")

        # The first configuration still hits after all that.
        assert_all(run(base)[0], "cache")
        assert set(auth_seen) == {f"Bearer {SECRET}", "Bearer sk-another-key-456", None}

        stored = db_rows(db, "SELECT model, template_sha256, method, count(*) FROM scores GROUP BY 1, 2, 3")
        assert len(stored) == 4
        assert all(count == n - 1 for *_, count in stored)

        def files() -> Iterator[Path]:
            return (path for path in tmp_path.rglob("*") if path.is_file())

        # The key appears in no file of the run folder, the database's -wal and -shm included.
        names = {path.name for path in files()}
        assert {"cache.db", "cache.db-wal"} <= names
        for path in files():
            assert SECRET.encode() not in path.read_bytes(), path
            assert KEY_ENV.encode() not in path.read_bytes(), path
    cache.close()
    for path in files():
        assert SECRET.encode() not in path.read_bytes(), path


def test_replicas_share_the_load(tmp_path: Path) -> None:
    n = 300
    with RunningServer(FaultPlan()) as first, RunningServer(FaultPlan()) as second:
        spec = make_spec(first.url, base_urls=(second.url, first.url), rate=RateLimit(concurrency=8))
        cache = ScoreCache(tmp_path / "cache.db")
        results, _ = run_client(spec, make_items(n), cache)
        assert [r.source for r in results] == ["expert"] * n
        assert all(abs(r.score - item_score(i)) <= 1e-12 for i, r in enumerate(results) if r.score)
        a, b = first.server.counts.requests, second.server.counts.requests
        assert all(a[i] + b[i] == 1 for i in range(n))
        assert min(sum(a.values()), sum(b.values())) >= n // 4
        # One endpoint identity for the pair, whatever the order they are listed in.
        swapped = replace(spec, base_urls=(first.url, second.url))
        assert all(r.source == "cache" for r in run_client(swapped, make_items(n), cache)[0])
        assert sum(a.values()) + sum(b.values()) == n
        cache.close()


# --------------------------------------------------------------------------- RPM against the server


def test_rpm_limit_against_the_server() -> None:
    """600 requests per minute, paced without burst (experts._limiter.Pacer): request k arrives no
    earlier than k / 10 s after the run starts, so no 60 s window ever holds more than 600. 120
    requests show the spacing in 12 s (640 took 66 s, the first 600 unchecked)."""
    arrivals: list[float] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        return await handler(request)

    running = RunningServer(FaultPlan())
    running.server.app.middlewares.append(record)
    n = 120
    with running as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=16, rpm=600))
        started = time.monotonic()
        results, _ = run_client(spec, make_items(n), None)
        took = time.monotonic() - started
    assert all(r.source == "expert" for r in results)
    assert len(arrivals) == n
    assert took >= (n - 1) / 10 - 0.05
    arrivals.sort()
    for k, at in enumerate(arrivals):  # a machine's stalls only delay: these bounds hold under load
        assert at - started >= k / 10 - 0.05, k
    # The tail really is paced: the last 30 requests span about 2.9 s; a stall of the client's loop
    # may bunch a few of them up (2.9 s was the bound once).
    assert arrivals[-1] - arrivals[-31] >= 2.5


# --------------------------------------------------------------------------- SIGKILL and resume

SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from experts import ExpertSpec, Item, RateLimit, RetryPolicy, ScoreCache, Timeout, score_items

    url, db, n, concurrency, method = sys.argv[1:6]
    n, concurrency = int(n), int(concurrency)
    spec = ExpertSpec(
        name="resume",
        base_urls=(url,),
        model="fault-model",
        method=method,
        api_key_env="CTD_ENGINE_TEST_API_KEY",
        rate=RateLimit(concurrency=concurrency),
        timeout=Timeout(read=10.0),
        retry=RetryPolicy(max_attempts=6, initial=0.001, maximum=0.01),
    )
    items = [Item(f"row-{i:05d}", f"A request about item-{i}.") for i in range(n)]
    results, stats = score_items(spec, items, cache=ScoreCache(db))
    assert [r.id for r in results] == [item.id for item in items]
    print(json.dumps({"cached": stats.cached, "scored": stats.scored, "failed": stats.failed}))
    """
)


def server_stats(url: str) -> dict[str, dict[int, int]]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=10) as response:
        data = json.load(response)
    return {name: {int(k): v for k, v in data[name].items()} for name in ("requests", "successes")}


def committed(db: Path) -> dict[int, str]:
    """{item number: key} of the scores stored in the database."""
    return {
        int(item_id.removeprefix("row-")): key
        for item_id, key in db_rows(db, "SELECT item_id, key FROM scores")
    }


@pytest.mark.parametrize("method", ["next-token", "likelihood"])
def test_sigkill_mid_run_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    n, concurrency = 1500, 8
    plan = {"rates": {"429": 0.02, "500": 0.02}, "delay": 0.02}
    script = tmp_path / "score.py"
    script.write_text(SCRIPT)
    db = tmp_path / "cache.db"
    monkeypatch.setenv(KEY_ENV, SECRET)
    with server_process(tmp_path, plan) as url:
        command = [sys.executable, str(script), url, str(db), str(n), str(concurrency), method]

        scorer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while True:
            assert scorer.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "nothing was committed in time"
            if db.exists():
                try:
                    if db_rows(db, "SELECT count(*) FROM scores")[0][0] >= 300:
                        break
                except sqlite3.Error:
                    pass
            time.sleep(0.01)
        time.sleep(0.025)  # land inside a batch, not right after a commit
        scorer.send_signal(signal.SIGKILL)
        scorer.wait(10)
        assert scorer.returncode == -signal.SIGKILL
        time.sleep(0.3)  # requests that reached the server before the kill finish there

        at_kill = committed(db)
        assert 300 <= len(at_kill) < n
        assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
        # The killed run's claims stay behind (its items in flight and queued), its pid gone.
        assert db_rows(db, "SELECT DISTINCT pid FROM claims") == [(scorer.pid,)]
        stats_at_kill = server_stats(url)
        answered_at_kill = {i for i, count in stats_at_kill["successes"].items() if count > 0}
        assert set(at_kill) <= answered_at_kill

        started = time.monotonic()
        finished = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        # The dead holder was on this host: its claims are taken over at once, not after the
        # 60 s lease.
        assert time.monotonic() - started < 30
        summary = json.loads(finished.stdout.strip().splitlines()[-1])
        assert summary == {"cached": len(at_kill), "scored": n - len(at_kill), "failed": 0}

        end = server_stats(url)
        # Items committed before the kill: no request at all after it.
        for i in at_kill:
            assert end["requests"][i] == stats_at_kill["requests"][i], i
        # No item lost; every item stored once, with its clean score.
        assert all(end["successes"].get(i, 0) >= 1 for i in range(n))
        final = committed(db)
        assert set(final) == set(range(n))
        assert {i: final[i] for i in at_kill} == at_kill
        rows = db_rows(db, "SELECT item_id, score FROM scores")
        assert len(rows) == n
        assert all(abs(score - item_score(int(i.removeprefix("row-")))) <= 1e-12 for i, score in rows)
        # Asked again after the kill: only the items in flight at the kill (asked before it, not
        # committed). Workers wait for their commit, so that is at most one item per worker.
        asked_again = {
            i for i, count in end["requests"].items() if 0 < stats_at_kill["requests"].get(i, 0) < count
        }
        assert asked_again <= set(range(n)) - set(at_kill)
        assert len(asked_again) <= concurrency
        if method == "next-token":  # one request per attempt: a success is a paid answer
            for i in at_kill:
                assert end["successes"][i] == 1, i
            duplicated = {i for i, count in end["successes"].items() if count > 1}
            assert duplicated == answered_at_kill - set(at_kill)
            assert all(end["successes"][i] == 2 for i in duplicated)
            assert duplicated <= asked_again
        assert db_rows(db, "SELECT count(*) FROM claims") == [(0,)]
        assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
        assert not any(SECRET.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def test_answered_but_uncommitted_items_stay_within_concurrency(tmp_path: Path) -> None:
    """At every request, the answers already given but not yet committed (what a kill -9 at that
    moment would lose and pay for again) number at most `concurrency`."""
    concurrency = 2
    db = tmp_path / "cache.db"
    cache = ScoreCache(db)
    reader = sqlite3.connect(db)
    answered = 0
    worst = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal answered, worst
        stored = reader.execute("SELECT count(*) FROM scores").fetchone()[0]
        worst = max(worst, answered - stored)
        await asyncio.sleep(0.002)  # a fast server on a fast network
        text = json.loads(request.content)["messages"][1]["content"]
        p = item_score(int(text.split("item-")[1].split(".")[0]))
        answered += 1
        top = [{"token": "high", "logprob": math.log(p)}, {"token": "low", "logprob": math.log(1 - p)}]
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": [{"top_logprobs": top}]}}]})

    spec = make_spec("http://fault.test/v1", rate=RateLimit(concurrency=concurrency))
    items = [Item(f"row-{i:05d}", f"A request about item-{i}.") for i in range(400)]
    try:
        results, _ = asyncio.run(
            ExpertClient(spec, cache=cache, transport=httpx.MockTransport(handler)).score(items)
        )
    finally:
        reader.close()
        cache.close()
    assert all(r.source == "expert" for r in results)
    assert worst <= concurrency, f"{worst} answered items were uncommitted at once"


def test_a_disk_error_ends_the_run_instead_of_hanging(tmp_path: Path) -> None:
    """If every commit fails, the workers die; the producer must not wait on a full queue."""

    class FullDisk(ScoreCache):
        def put_many(self, scores, failures=(), **release):  # type: ignore[no-untyped-def]
            raise OSError(28, "No space left on device")

    items = [Item(f"id{i}", f"item-{i}") for i in range(300)]
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=4))
        client = ExpertClient(spec, cache=FullDisk(tmp_path / "cache.db"))
        with pytest.raises(OSError, match="No space left"):
            asyncio.run(asyncio.wait_for(client.score(items), timeout=30))
