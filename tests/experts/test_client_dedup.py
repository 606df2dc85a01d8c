"""Items of one `score` call with the same input share one request (experts._flights), and
`ExpertClient.drain()` stops a call without throwing away the answers in flight
(experts._drain)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from fault_server import FaultPlan, RunningServer, item_score
from test_experts_engine import db_rows, make_spec

# Private: the client module, patched to count the requests it sends.
import experts._client
from experts import ExpertClient, Item, RateLimit, RetryPolicy, ScoreCache, Stopped
from harness.data import read_table
from harness.stages import query_items

N, DISTINCT = 100, 50


def repeated_items(twin: int = DISTINCT) -> list[Item]:
    """100 items holding 50 distinct inputs: item k asks what item k + `twin` asks (1: pairs of
    neighbours, 50: the second half repeats the first)."""
    return [Item(f"row-{i:03d}", f"A request about item-{input_of(i, twin)}.") for i in range(N)]


def input_of(i: int, twin: int) -> int:
    return i % DISTINCT if twin == DISTINCT else i // 2


# In one lookup chunk; then pairs of neighbours split by chunks of 15 (item 14 in the first
# chunk, item 15 in the second, ...): each pair's first item is still in flight when the other
# is looked up.
@pytest.mark.parametrize(
    ("chunk", "twin"), [(1024, DISTINCT), (15, 1)], ids=["one-lookup-chunk", "across-lookup-chunks"]
)
@pytest.mark.parametrize("cached", [True, False], ids=["cache", "no-cache"])
def test_the_same_input_is_asked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, twin: int, cached: bool
) -> None:
    monkeypatch.setattr(experts._client, "_LOOKUP_CHUNK", chunk)
    cache = ScoreCache(tmp_path / "cache.db") if cached else None
    items = repeated_items(twin)
    with RunningServer(FaultPlan(delay=0.2)) as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=8))
        results, stats = asyncio.run(ExpertClient(spec, cache=cache).score(items))
        requests = dict(server.server.counts.requests)
    assert requests == dict.fromkeys(range(DISTINCT), 1)  # 50 requests, not 100
    assert [r.id for r in results] == [item.id for item in items]
    for i, result in enumerate(results):
        assert result.source == "expert" and result.attempts == 1
        assert result.score == pytest.approx(item_score(input_of(i, twin)), abs=1e-12)
    for i, result in enumerate(results):  # a repeat's result is its first item's, under its own id
        first = i % DISTINCT if twin == DISTINCT else i - i % 2
        assert result == replace(results[first], id=items[i].id)
    assert (stats.scored, stats.shared, stats.cached, stats.failed) == (DISTINCT, N - DISTINCT, 0, 0)
    assert stats.done == stats.total == N
    if cache is not None:
        cache.close()
        assert db_rows(tmp_path / "cache.db", "SELECT count(*) FROM scores") == [(DISTINCT,)]


def test_a_repeat_met_after_its_answer_is_stored_is_a_cache_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only keys in flight are remembered (memory stays flat): a repeat looked up after the
    first item's answer was committed reads it from the cache; nothing is paid twice."""
    monkeypatch.setattr(experts._client, "_LOOKUP_CHUNK", 4)
    cache = ScoreCache(tmp_path / "cache.db")
    items = repeated_items()
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=2))
        results, stats = asyncio.run(ExpertClient(spec, cache=cache).score(items))
        assert dict(server.server.counts.requests) == dict.fromkeys(range(DISTINCT), 1)
    cache.close()
    assert stats.scored == DISTINCT and stats.shared + stats.cached == N - DISTINCT and stats.cached > 0
    assert [r.score for r in results[:DISTINCT]] == [r.score for r in results[DISTINCT:]]


def test_a_failure_is_shared_too() -> None:
    items = [Item("a", "About item-7."), Item("b", "About item-8."), Item("c", "About item-7.")]
    with RunningServer(FaultPlan(broken=frozenset({7}))) as server:
        spec = make_spec(server.url, retry=RetryPolicy(max_attempts=3, initial=0.001, maximum=0.01))
        results, stats = asyncio.run(ExpertClient(spec, cache=None).score(items))
        requests = dict(server.server.counts.requests)
    # The broken input asked once, not twice: its own request and the recovery ladder's one rung
    # (named-labels; experts._recovery), not retried since every request was deterministic.
    assert requests == {7: 2, 8: 1}
    assert [(r.id, r.source, r.reason) for r in results] == [
        ("a", "failed", "no-label-mass"),
        ("b", "expert", None),
        ("c", "failed", "no-label-mass"),
    ]
    assert (stats.scored, stats.shared, stats.failed) == (1, 0, 2)
    assert stats.failure_reasons == {"no-label-mass": 2}


def test_the_query_summary_counts_shared_answers(tmp_path: Path) -> None:
    items = repeated_items()
    with RunningServer() as server:
        spec = make_spec(server.url, rate=RateLimit(concurrency=8))
        out = tmp_path / "out.csv"
        summary = query_items(items, [None] * N, spec, out, cache_path=tmp_path / "cache.db", check=False)
        assert sum(server.server.counts.requests.values()) == DISTINCT
        again = query_items(items, [None] * N, spec, out, cache_path=tmp_path / "cache.db", check=False)
    assert (summary.scored, summary.shared, summary.cached, summary.failed) == (DISTINCT, N - DISTINCT, 0, 0)
    assert (again.scored, again.shared, again.cached) == (0, 0, N)  # a rerun reads both from the cache
    table = read_table(out).columns
    assert list(table["id"].astype(str)) == [item.id for item in items]


# --------------------------------------------------------------------------- drain


def mock_client(
    tmp_path: Path, delay: float, *, status: int = 200, **spec: object
) -> tuple[ExpertClient, list[int]]:
    """A client over a transport that answers each item after `delay` seconds; the list of
    items whose request arrived."""
    arrived: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        item = int(json.loads(request.content)["messages"][1]["content"].split("item-")[1].split(".")[0])
        arrived.append(item)
        await asyncio.sleep(delay)
        if status != 200:
            return httpx.Response(status, json={"error": "down"})
        p = item_score(item)
        top = [{"token": "high", "logprob": math.log(p)}, {"token": "low", "logprob": math.log(1 - p)}]
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": [{"top_logprobs": top}]}}]})

    settings = {"rate": RateLimit(concurrency=4), **spec}
    cache = ScoreCache(tmp_path / "cache.db")
    client = ExpertClient(
        make_spec("http://mock.test/v1", **settings), cache=cache, transport=httpx.MockTransport(handler)
    )
    return client, arrived


async def drain_when(client: ExpertClient, arrived: list[int], n: int, grace: float) -> tuple[int, float]:
    while len(arrived) < n:
        await asyncio.sleep(0.005)
    return client.drain(grace), time.monotonic()


def test_drain_commits_the_answers_in_flight_and_sends_nothing_more(tmp_path: Path) -> None:
    client, arrived = mock_client(tmp_path, delay=0.3)
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(40)]

    async def run() -> tuple[int, float]:
        scoring = asyncio.ensure_future(client.score(items))
        in_flight, _ = await drain_when(client, arrived, 4, grace=5.0)
        with pytest.raises(Stopped):
            await scoring
        return in_flight, time.monotonic()

    in_flight, _ = asyncio.run(run())
    assert in_flight == 4
    assert sorted(arrived) == [0, 1, 2, 3]  # nothing sent after the drain
    assert client.cache is not None
    keys = [client.request_for(item)[1] for item in items[:4]]
    assert len(client.cache.get_many(keys)) == 4  # every answer in flight was committed
    assert client.cache.get_many([client.request_for(items[4])[1]]) == {}
    client.cache.close()


def test_drain_ends_retry_waits_at_once_and_cuts_slow_answers_at_the_grace(tmp_path: Path) -> None:
    # Every answer a 500: each item waits 30 s before its retry (nothing in flight then).
    client, arrived = mock_client(
        tmp_path, delay=0.0, status=500, retry=RetryPolicy(max_attempts=5, initial=30.0, maximum=30.0)
    )
    items = [Item(f"row-{i}", f"A request about item-{i}.") for i in range(8)]

    async def run(client: ExpertClient, arrived: list[int], grace: float) -> float:
        scoring = asyncio.ensure_future(client.score(items))
        _, asked = await drain_when(client, arrived, 4, grace=grace)
        with pytest.raises(Stopped):
            await scoring
        return time.monotonic() - asked

    assert asyncio.run(run(client, arrived, 5.0)) < 1.0  # not the 30 s backoff, nor the 5 s grace
    assert len(arrived) == 4
    # Answers slower than the grace are cut at the grace.
    (tmp_path / "slow").mkdir()
    slow, slow_arrived = mock_client(tmp_path / "slow", delay=30.0)
    assert 0.2 <= asyncio.run(run(slow, slow_arrived, 0.2)) < 1.5
    with pytest.raises(Stopped):  # a drained client sends nothing more
        asyncio.run(slow.score(items))
    assert len(slow_arrived) == 4
