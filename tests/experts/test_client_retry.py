"""The client's retry loop (fake clock and sleep, no real waiting): Retry-After and backoff,
attempt caps, deadlines, released slots, a down endpoint, and RPM pacing per HTTP request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from expert_fakes import FakeTime, likelihood_answer

from experts import (
    EndpointDown,
    ExpertClient,
    ExpertSpec,
    Item,
    RateLimit,
    RetryPolicy,
    ScoreCache,
    load_template,
)


def chat_ok(p: float) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "logprobs": {
                    "content": [
                        {
                            "token": "high",
                            "top_logprobs": [
                                {"token": "high", "logprob": math.log(p)},
                                {"token": "low", "logprob": math.log(1 - p)},
                            ],
                        }
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1},
    }


def unit_spec(**changes: Any) -> ExpertSpec:
    spec = ExpertSpec(
        name="unit",
        base_urls=("http://a.test/v1",),
        model="m",
        rate=RateLimit(concurrency=2),
        retry=RetryPolicy(
            max_attempts=4, initial=1.0, multiplier=2.0, maximum=10.0, jitter=0.0, deadline=1000
        ),
    )
    return dataclasses.replace(spec, **changes)


def run_client(spec: ExpertSpec, handler: Any, items: list[Item]) -> tuple[Any, Any, FakeTime]:
    fake = FakeTime()
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, stats = asyncio.run(client.score(items))
    return results, stats, fake


def item_of(request: httpx.Request) -> int:
    body = json.loads(request.content)
    text = body["messages"][1]["content"] if "messages" in body else body["prompt"]
    return int(re.search(r"item-(\d+)", text).group(1))  # type: ignore[union-attr]


def test_client_honours_retry_after_and_backoff() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(429, headers={"Retry-After": "7"})
        if calls == 2:
            return httpx.Response(503)
        return httpx.Response(200, json=chat_ok(0.25))

    results, stats, fake = run_client(unit_spec(), handler, [Item("a", "item-1")])
    assert calls == 3
    assert fake.sleeps == [7.0, 2.0]  # Retry-After beats backoff 1.0; then backoff of attempt 2
    assert results[0].source == "expert"
    assert results[0].score == pytest.approx(0.25)
    assert results[0].attempts == 3
    assert stats.retries == 2
    assert stats.rate_limited == 1
    assert stats.errors_seen == {"http-429": 1, "http-503": 1}


def test_client_attempt_cap_and_non_retryable_errors() -> None:
    counts: dict[int, int] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        item = item_of(request)
        counts[item] = counts.get(item, 0) + 1
        if item == 1:
            return httpx.Response(500)
        if item == 2:
            return httpx.Response(400, text="bad request")
        if item == 3:
            raise httpx.ConnectError("refused")
        if item == 4:
            return httpx.Response(200, json={"choices": [{"message": {"content": "high"}}]})
        return httpx.Response(200, json=chat_ok(0.5 + item / 100))

    items = [Item(f"id{i}", f"input item-{i}") for i in range(8)]
    results, stats, _ = run_client(unit_spec(), handler, items)
    assert [r.id for r in results] == [f"id{i}" for i in range(8)]
    # Item 4 (no logprobs): its request and the recovery ladder's one rung, never retried.
    assert counts == {0: 1, 1: 4, 2: 1, 3: 4, 4: 2, 5: 1, 6: 1, 7: 1}
    by_id = {r.id: r for r in results}
    assert (by_id["id1"].source, by_id["id1"].reason, by_id["id1"].attempts) == ("failed", "http-500", 4)
    assert (by_id["id2"].source, by_id["id2"].reason, by_id["id2"].attempts) == ("failed", "http-400", 1)
    assert (by_id["id3"].source, by_id["id3"].reason) == ("failed", "connection")
    assert (by_id["id4"].source, by_id["id4"].reason) == ("failed", "no-logprobs")
    for i in (0, 5, 6, 7):
        assert by_id[f"id{i}"].score == pytest.approx(0.5 + i / 100)
        assert by_id[f"id{i}"].reason is None
    for i in (1, 2, 3, 4):
        assert by_id[f"id{i}"].score is None
    assert stats.failed == 4
    assert stats.scored == 4
    assert stats.failure_reasons == {"http-500": 1, "http-400": 1, "connection": 1, "no-logprobs": 1}


def test_client_deadline_stops_retrying() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503)

    spec = unit_spec(
        retry=RetryPolicy(max_attempts=10, initial=4.0, multiplier=2.0, maximum=100, jitter=0.0, deadline=10)
    )
    results, _, fake = run_client(spec, handler, [Item("a", "item-1")])
    # Attempt 1 fails at t=0 and waits 4 s; attempt 2 would wait 8 s more, past the 10 s deadline.
    assert calls == 2
    assert fake.sleeps == [4.0]
    assert results[0].source == "failed"
    assert results[0].attempts == 2


def test_client_releases_slots_when_every_request_fails() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow")

    spec = unit_spec(
        rate=RateLimit(concurrency=1),
        retry=RetryPolicy(max_attempts=3, initial=0.01, jitter=0.0, down_after=1000),
    )
    items = [Item(f"id{i}", f"item-{i}") for i in range(20)]

    async def main() -> Any:
        fake = FakeTime()
        client = ExpertClient(
            spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
        )
        return await asyncio.wait_for(client.score(items), 10)

    results, stats = asyncio.run(main())
    assert [r.id for r in results] == [i.id for i in items]
    assert all(r.source == "failed" and r.reason == "timeout" and r.attempts == 3 for r in results)
    assert stats.failed == 20


def test_client_stops_when_the_endpoint_is_down(tmp_path: Path) -> None:
    """Every request refused: after `down_after` items (default max(8, 2 x concurrency)) the run
    ends with EndpointDown instead of paying each remaining item its retries, and the failures
    so far are in the ledger."""
    sent = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal sent
        sent += 1
        raise httpx.ConnectError("connection refused")

    spec = unit_spec(rate=RateLimit(concurrency=1), retry=RetryPolicy(max_attempts=3, initial=0.01))
    items = [Item(f"id{i}", f"item-{i}") for i in range(50)]
    cache = ScoreCache(tmp_path / "cache.db")

    async def main() -> Any:
        fake = FakeTime()
        client = ExpertClient(
            spec, cache=cache, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
        )
        return await asyncio.wait_for(client.score(items), 10)

    with pytest.raises(EndpointDown, match="8 items in a row failed after their retries"):
        asyncio.run(main())
    assert sent == 8 * 3
    assert sum(c["failures"] for c in cache.counts().values()) == 8
    cache.close()


def test_client_overflowing_logprob_fails_only_that_item() -> None:
    bad = {"choices": [{"logprobs": {"content": [{"top_logprobs": [{"token": "high", "logprob": 800.0}]}]}}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=bad if item_of(request) == 1 else chat_ok(0.5))

    spec = unit_spec(retry=RetryPolicy(max_attempts=2, initial=0.01, jitter=0.0))
    results, _, _ = run_client(spec, handler, [Item("a", "item-1"), Item("b", "item-2")])
    assert [r.source for r in results] == ["failed", "expert"]
    assert results[0].reason


def likelihood_ok(request: httpx.Request) -> httpx.Response:
    """A fake /completions echo answer giving p = 0.3 for every item."""
    template = load_template("stakes-v1")
    prompt = json.loads(request.content)["prompt"]
    answer = "high" if prompt.endswith(template.answers["high"]) else "low"
    prompt_chars = len(prompt) - len(template.answers[answer])
    ll = math.log(0.3) if answer == "high" else math.log(0.7)
    return httpx.Response(
        200, json=likelihood_answer(prompt_chars, template.answers[answer], [ll, 0.0, 0.0, 0.0])
    )


def test_client_likelihood_sends_one_request_per_answer() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return likelihood_ok(request)

    results, stats, _ = run_client(unit_spec(method="likelihood"), handler, [Item("a", "item-1")])
    assert paths == ["/v1/completions", "/v1/completions"]
    assert results[0].score == pytest.approx(0.3, abs=1e-12)
    assert results[0].label_mass is None
    assert stats.scored == 1


def test_client_rpm_counts_http_requests_for_likelihood() -> None:
    fake = FakeTime()
    stamps: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        stamps.append(fake.now)
        return likelihood_ok(request)

    spec = unit_spec(method="likelihood", rate=RateLimit(concurrency=4, rpm=60))
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, _ = asyncio.run(client.score([Item(f"id{i}", f"item-{i}") for i in range(100)]))
    assert all(r.source == "expert" for r in results)
    assert len(stamps) == 200
    # Whatever burst the bucket allows at the start (at most a minute's worth, 60 requests), the
    # remaining 140 requests go at one per second.
    assert stamps[-1] - stamps[0] >= 140 - 1


def test_client_rpm_paces_next_token_requests() -> None:
    fake = FakeTime()
    stamps: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        stamps.append(fake.now)
        return httpx.Response(200, json=chat_ok(0.5))

    spec = unit_spec(rate=RateLimit(concurrency=4, rpm=60))
    client = ExpertClient(
        spec, cache=None, transport=httpx.MockTransport(handler), clock=fake.clock, sleep=fake.sleep
    )
    results, _ = asyncio.run(client.score([Item(f"id{i}", f"item-{i}") for i in range(100)]))
    assert all(r.source == "expert" for r in results)
    assert len(stamps) == 100
    assert stamps[-1] - stamps[0] == pytest.approx(99.0)  # one request per second, no burst
