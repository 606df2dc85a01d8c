"""Failure kinds and the breaker: every exception of the tree maps to one typed kind (a refused
connection included, as the real endpoint reports it), and the breaker's states move as its
docstring says, under a clock that only moves when told to."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import pytest

from experts import (
    BreakerState,
    ConfigError,
    EndpointDown,
    ExpertClient,
    ExpertError,
    ExpertSpec,
    FailureKind,
    InvalidSetting,
    Item,
    RetryPolicy,
    StorageError,
)

# Private: the circuit breaker and the transport errors it counts, unit-tested.
from experts._breaker import Breaker
from experts._errors import HTTPStatusError, ResponseError, TransportError

REFUSED = TransportError("refused", reason="connection")


def test_every_error_of_the_tree_has_one_kind_and_only_silence_is_an_endpoint_fault() -> None:
    expected = {
        REFUSED: FailureKind.CONNECTION,
        TransportError("no answer", reason="timeout"): FailureKind.TIMEOUT,
        TransportError("generic"): FailureKind.CONNECTION,
        HTTPStatusError(500, "boom"): FailureKind.SERVER_ERROR,
        HTTPStatusError(503, "busy"): FailureKind.SERVER_ERROR,
        HTTPStatusError(429, "slow down"): FailureKind.RATE_LIMITED,
        HTTPStatusError(404, "no such model"): FailureKind.REJECTED,
        HTTPStatusError(400, "bad"): FailureKind.REJECTED,
        ResponseError("not json", reason="malformed-json"): FailureKind.BAD_RESPONSE,
        EndpointDown("down"): FailureKind.ENDPOINT_DOWN,
        StorageError("disk full"): FailureKind.STORAGE,
        ConfigError("too big"): FailureKind.CONFIG,
        InvalidSetting("tpm", "0", "must be above 0"): FailureKind.CONFIG,
        ExpertError("something else"): FailureKind.OTHER,
    }
    for error, kind in expected.items():
        assert FailureKind.of(error) is kind, error
    faults = {kind for kind in FailureKind if kind.endpoint_fault}
    assert faults == {
        FailureKind.CONNECTION,
        FailureKind.TIMEOUT,
        FailureKind.SERVER_ERROR,
        FailureKind.ENDPOINT_DOWN,
    }


def free_port() -> int:
    """A loopback port nothing listens on (bound, read and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_items_carry_the_kind_of_their_last_error_through_the_client() -> None:
    """Through the real endpoint code: a refused connection is CONNECTION (the tag the monitor
    once missed), and each HTTP answer its kind, with the stored reason tags unchanged."""
    answers = {1: (503, b"{}"), 2: (429, b"{}"), 3: (404, b"{}"), 4: (200, b"not json")}

    def handler(request: httpx.Request) -> httpx.Response:
        text = json.loads(request.content)["messages"][1]["content"]
        item = int(re.search(r"item-(\d+)", text).group(1))  # type: ignore[union-attr]
        status, body = answers[item]
        return httpx.Response(status, content=body)

    spec = ExpertSpec(
        name="kinds", base_urls=("http://kinds.test/v1",), model="m", retry=RetryPolicy(max_attempts=1)
    )
    items = [Item(f"i{n}", f"about item-{n}") for n in answers]
    results, _ = asyncio.run(
        ExpertClient(spec, cache=None, transport=httpx.MockTransport(handler)).score(items)
    )
    assert [(r.reason, r.failure) for r in results] == [
        ("http-503", FailureKind.SERVER_ERROR),
        ("http-429", FailureKind.RATE_LIMITED),
        ("http-404", FailureKind.REJECTED),
        ("malformed-json", FailureKind.BAD_RESPONSE),
    ]
    refused = ExpertSpec(
        name="gone",
        base_urls=(f"http://127.0.0.1:{free_port()}/v1",),
        model="m",
        retry=RetryPolicy(max_attempts=1),
    )
    (result,), _ = asyncio.run(ExpertClient(refused, cache=None).score([Item("x", "item-9")]))
    assert (result.source, result.reason, result.failure) == ("failed", "connection", FailureKind.CONNECTION)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_online_breaker_opens_cools_down_and_lets_one_probe_through() -> None:
    clock = Clock()
    breaker = Breaker(3, cooldown=10.0, clock=clock)
    for _ in range(2):
        assert breaker.admit() is False
        breaker.failed(REFUSED)
    breaker.failed(HTTPStatusError(404, "an answer"))  # an answer between: the count starts over
    for _ in range(3):
        assert breaker.state is BreakerState.CLOSED
        breaker.failed(REFUSED)  # no EndpointDown: an online breaker opens instead
    assert (breaker.state, breaker.trips) == (BreakerState.OPEN, 1)
    with pytest.raises(EndpointDown, match="cooling down"):
        breaker.admit()
    clock.now += 9.9
    assert breaker.state is BreakerState.OPEN
    clock.now += 0.1
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.admit() is True  # the probe
    with pytest.raises(EndpointDown, match="a probe is out"):
        breaker.admit()  # one probe at a time
    breaker.failed(REFUSED, probe=True)  # the probe failed: open for another cooldown
    assert breaker.state is BreakerState.OPEN
    clock.now += 10.0
    assert breaker.admit() is True
    breaker.abandon(probe=True)  # cancelled without an outcome: the next item probes instead
    assert breaker.admit() is True
    breaker.answered(probe=True)
    assert breaker.state is BreakerState.CLOSED and breaker.admit() is False
    assert breaker.trips == 1  # a reopening after a failed probe is not a new trip


def test_a_batch_breaker_raises_at_the_limit_and_never_refuses() -> None:
    breaker = Breaker(2)
    breaker.failed(REFUSED)
    with pytest.raises(EndpointDown, match="2 items in a row"):
        breaker.failed(REFUSED)
    assert breaker.admit() is False and breaker.state is BreakerState.CLOSED
