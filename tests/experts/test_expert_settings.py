"""The expert's settings: retry backoff, refused invalid settings, the outage counter, the
interrupts held while a server starts, and timeouts."""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import time
from typing import Any

import pytest
from expert_fakes import FakeTime

from experts import ConfigError, EndpointDown, InvalidSetting, RateLimit, RetryPolicy, Timeout, signals_held

# Private: the limiter, outage counter and errors, unit-tested.
from experts._breaker import Breaker
from experts._errors import HTTPStatusError, ResponseError, TransportError
from experts._limiter import Limiter


class FixedRng(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_exponential_with_jitter_and_cap() -> None:
    policy = RetryPolicy(initial=0.5, multiplier=2.0, maximum=30.0, jitter=0.5)
    assert policy.backoff(1, FixedRng(0.0)) == 0.5
    assert policy.backoff(2, FixedRng(0.0)) == 1.0
    assert policy.backoff(4, FixedRng(0.0)) == 4.0
    assert policy.backoff(4, FixedRng(0.5)) == 3.0
    assert policy.backoff(20, FixedRng(0.0)) == 30.0  # capped
    rng = random.Random(7)
    for attempt in range(1, 40):
        base = min(30.0, 0.5 * 2.0 ** (attempt - 1))
        for _ in range(50):
            wait = policy.backoff(attempt, rng)
            assert base * 0.5 <= wait <= base <= 30.0
    no_jitter = RetryPolicy(initial=0.25, multiplier=3.0, maximum=5.0, jitter=0.0)
    assert [no_jitter.backoff(a, rng) for a in (1, 2, 3, 4)] == [0.25, 0.75, 2.25, 5.0]


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: RetryPolicy(max_attempts=0), "max_attempts"),
        (lambda: RetryPolicy(max_attempts=2.5), "max_attempts"),
        (lambda: RetryPolicy(jitter=1.5), "jitter"),
        (lambda: RetryPolicy(jitter=math.nan), "jitter"),
        (lambda: RetryPolicy(multiplier=0.5), "multiplier"),
        (lambda: RetryPolicy(initial=-1.0), "initial"),
        (lambda: RetryPolicy(deadline=math.nan), "deadline"),
        (lambda: RetryPolicy(maximum=math.inf), "maximum"),
        (lambda: RetryPolicy(down_after=-1), "down_after"),
        (lambda: RateLimit(concurrency=0), "concurrency"),
        (lambda: RateLimit(concurrency=True), "concurrency"),
        (lambda: RateLimit(concurrency=1.5), "concurrency"),
        (lambda: RateLimit(rpm=0), "rpm"),
        (lambda: RateLimit(rpm=math.nan), "rpm"),  # NaN compares false: it used to switch the limit off
        (lambda: RateLimit(rpm=math.inf), "rpm"),
        (lambda: RateLimit(rpm="fast"), "rpm"),
        (lambda: RateLimit(tpm=-5), "tpm"),
        (lambda: RateLimit(tpm=math.nan), "tpm"),
        (lambda: Timeout(read=0), "read"),
        (lambda: Timeout(read=math.nan), "read"),
        (lambda: Timeout(connect=math.inf), "connect"),
        (lambda: Timeout(pool="30"), "pool"),
    ],
)
def test_invalid_settings_raise_naming_the_setting(make: Any, setting: str) -> None:
    with pytest.raises(InvalidSetting) as info:
        make()
    assert info.value.setting == setting
    assert isinstance(info.value, ConfigError)
    assert str(info.value).startswith(f"{setting} = ")


def test_a_request_larger_than_the_tpm_is_refused_not_paced() -> None:
    fake = FakeTime(max_sleeps=5)

    async def main() -> None:
        limiter = Limiter(RateLimit(tpm=100), clock=fake.clock, sleep=fake.sleep)
        await limiter.admit(100)  # exactly a minute's budget: admitted
        with pytest.raises(ConfigError, match=r"about 101 tokens .* tpm = 100"):
            await limiter.admit(101)

    asyncio.run(main())
    assert fake.sleeps == []  # refused at once, not after a wait


def test_outage_trips_on_endpoint_failures_in_a_row_only() -> None:
    outage = Breaker(limit=3)
    refused = TransportError("refused", reason="connection")
    for _ in range(2):
        outage.failed(refused)
    outage.answered()  # an answer between them: the count starts again
    outage.failed(HTTPStatusError(503, "overloaded"))
    outage.failed(refused)
    outage.failed(ResponseError("no label tokens", reason="no-labels"))  # it answered: up
    outage.failed(HTTPStatusError(404, "no such model"))  # a 4xx is an answer too
    assert outage.streak == 0
    outage.failed(TransportError("slow", reason="timeout"))
    outage.failed(HTTPStatusError(500, "boom"))
    with pytest.raises(EndpointDown, match=r"3 items in a row failed .*HTTP 502"):
        outage.failed(HTTPStatusError(502, "bad gateway"))


@pytest.mark.usefixtures("python_interrupt_handler")
def test_an_interrupt_while_a_server_starts_is_held_then_delivered() -> None:
    """Ctrl-C inside the block (where LocalServer forks the server, and `ctd eval` imports torch)
    is not raised there, where it would lose the child's handle (or abort the process inside
    torch's compiled import), but right after the block, in the caller's hands."""
    finished_block = False
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler has run by now: it only recorded the signal
        finished_block = True
    assert finished_block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_timeout_to_httpx() -> None:
    t = Timeout(connect=1.0, read=2.0, write=3.0, pool=4.0).to_httpx()
    assert (t.connect, t.read, t.write, t.pool) == (1.0, 2.0, 3.0, 4.0)
