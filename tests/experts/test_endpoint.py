"""The Endpoint over httpx.MockTransport: answers, Retry-After, status and transport errors,
the API key read per request, and replicas."""

from __future__ import annotations

import asyncio
import email.utils
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from experts import ConfigError

# Private: the endpoint and the errors it translates, unit-tested.
from experts._endpoint import Endpoint
from experts._errors import HTTPStatusError, ResponseError, TransportError


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def one_request(handler: Any, **kwargs: Any) -> Any:
    async with Endpoint(["http://a.test/v1/"], transport=httpx.MockTransport(handler), **kwargs) as endpoint:
        return await endpoint.request("POST", "/chat/completions", {"x": 1})


def test_endpoint_returns_parsed_json_and_posts_the_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    payload, seconds = run(one_request(handler))
    assert payload == {"ok": True}
    assert seconds >= 0
    assert str(seen[0].url) == "http://a.test/v1/chat/completions"
    assert seen[0].method == "POST"
    assert json.loads(seen[0].content) == {"x": 1}


@pytest.mark.parametrize("value", ["7", "7.5"])
def test_429_retry_after_seconds(value: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": "slow down"}, headers={"Retry-After": value})

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.status == 429
    assert info.value.retryable
    assert info.value.reason == "http-429"
    assert info.value.retry_after == float(value)


def test_429_retry_after_http_date() -> None:
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": when})

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.retry_after is not None
    assert 27.0 <= info.value.retry_after <= 30.5

    past = email.utils.format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429, headers={"Retry-After": past})))
    assert info.value.retry_after == 0.0
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429, headers={"Retry-After": "soon"})))
    assert info.value.retry_after is None
    with pytest.raises(HTTPStatusError) as info:
        run(one_request(lambda r: httpx.Response(429)))
    assert info.value.retry_after is None


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (404, False),
        (408, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
    ],
)
def test_status_errors(status: int, retryable: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text="detail text")

    with pytest.raises(HTTPStatusError) as info:
        run(one_request(handler))
    assert info.value.status == status
    assert info.value.retryable is retryable
    assert info.value.reason == f"http-{status}"
    assert "detail text" in str(info.value)


def test_non_json_body_is_malformed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"choices": [', headers={"content-type": "application/json"})

    with pytest.raises(ResponseError) as info:
        run(one_request(handler))
    assert info.value.reason == "malformed-json"
    assert info.value.retryable


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (httpx.ConnectError("refused"), "connection"),
        (httpx.RemoteProtocolError("server disconnected"), "connection"),
        (httpx.ReadError("reset"), "connection"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.ConnectTimeout("slow"), "timeout"),
        (httpx.PoolTimeout("busy"), "timeout"),
    ],
)
def test_transport_errors(exc: Exception, reason: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(TransportError) as info:
        run(one_request(handler))
    assert info.value.reason == reason
    assert info.value.retryable


def test_authorization_header_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    headers: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-unit-1")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-unit-2")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.delenv("CTD_UNIT_TEST_KEY")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    monkeypatch.setenv("CTD_UNIT_TEST_KEY", "")
    run(one_request(handler, api_key_env="CTD_UNIT_TEST_KEY"))
    run(one_request(handler))
    assert headers == ["Bearer sk-unit-1", "Bearer sk-unit-2", None, None, None]


def test_endpoint_reads_the_key_at_each_request_and_stores_it_nowhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    async def main() -> None:
        monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-first")
        async with Endpoint(
            ["http://a.test/v1"], api_key_env="CTD_UNIT_TEST_KEY", transport=httpx.MockTransport(handler)
        ) as endpoint:
            await endpoint.request("POST", "/x", {})
            assert "sk-first" not in repr(vars(endpoint))
            monkeypatch.setenv("CTD_UNIT_TEST_KEY", "sk-second")
            await endpoint.request("POST", "/x", {})

    run(main())
    assert seen == ["Bearer sk-first", "Bearer sk-second"]


def test_replicas_alternate_when_idle() -> None:
    hosts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        return httpx.Response(200, json={})

    async def main() -> None:
        async with Endpoint(
            ["http://a.test/v1", "http://b.test/v1"], transport=httpx.MockTransport(handler)
        ) as endpoint:
            for _ in range(6):
                await endpoint.request("POST", "/chat/completions", {})

    run(main())
    assert hosts == ["a.test", "b.test"] * 3


def test_replicas_prefer_the_least_busy() -> None:
    hosts: list[str] = []

    async def main() -> None:
        gate = asyncio.Event()
        entered = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            hosts.append(request.url.host)
            if request.url.host == "a.test":
                entered.set()
                await gate.wait()
            return httpx.Response(200, json={})

        async with Endpoint(
            ["http://a.test/v1", "http://b.test/v1"], transport=httpx.MockTransport(handler)
        ) as endpoint:
            slow = asyncio.create_task(endpoint.request("POST", "/chat/completions", {}))
            await asyncio.wait_for(entered.wait(), 5)
            # a.test holds one request: round-robin would send every other request there.
            for _ in range(4):
                await endpoint.request("POST", "/chat/completions", {})
            gate.set()
            await asyncio.wait_for(slow, 5)
            await endpoint.request("POST", "/chat/completions", {})
            await endpoint.request("POST", "/chat/completions", {})

    run(main())
    assert hosts[:5] == ["a.test", "b.test", "b.test", "b.test", "b.test"]
    assert sorted(hosts[5:]) == ["a.test", "b.test"]


def test_endpoint_needs_a_base_url() -> None:
    with pytest.raises(ConfigError):
        Endpoint([])
