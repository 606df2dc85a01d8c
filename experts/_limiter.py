"""Concurrency, requests-per-minute and tokens-per-minute limits for one endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ._config import RateLimit

__all__ = ["Limiter", "Pacer"]


class Pacer:
    """Spaces admissions so that at most `per_minute` units pass in any 60-second window (the
    generic cell rate algorithm without burst): a call of weight w is admitted no earlier than
    the previous call's time plus its weight x 60 / per_minute. A weight above a minute's
    allowance waits its turn rather than failing, and each call sleeps at most once."""

    def __init__(
        self,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.per_minute = float(per_minute)
        self._seconds_per_unit = 60.0 / per_minute
        self._next = clock()  # the earliest time the next call may pass
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()  # first come, first served

    async def take(self, amount: float = 1.0) -> None:
        async with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + amount * self._seconds_per_unit
            if start > now:
                await self._sleep(start - now)

    def give_back(self, amount: float) -> None:
        """Return units taken in excess (a token estimate above the tokens used); the schedule
        never moves before the present."""
        self._next = max(self._clock(), self._next - amount * self._seconds_per_unit)

    def __repr__(self) -> str:
        return f"Pacer(per_minute={self.per_minute:g}, next in {max(0.0, self._next - self._clock()):.2f} s)"


class Limiter:
    """At most `limit.concurrency` requests in flight (`async with limiter.slot()`), and RPM and
    TPM pacing (`await limiter.admit(tokens, requests)`) where the limit sets them."""

    def __init__(
        self,
        limit: RateLimit,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit.concurrency)
        self.requests = Pacer(limit.rpm, clock=clock, sleep=sleep) if limit.rpm else None
        self.tokens = Pacer(limit.tpm, clock=clock, sleep=sleep) if limit.tpm else None
        self.in_flight = 0

    async def admit(self, tokens: int, requests: int = 1) -> None:
        """Wait until `requests` HTTP requests carrying about `tokens` tokens may start;
        ConfigError at once, before anything is sent, if `tokens` exceed the whole TPM budget."""
        self.limit.check_fits(tokens)
        if self.requests is not None:
            await self.requests.take(requests)
        if self.tokens is not None:
            await self.tokens.take(tokens)

    def settle(self, estimated: int, used: int | None) -> None:
        """Correct the TPM schedule once the answers report the tokens really used."""
        if self.tokens is not None and used is not None and used < estimated:
            self.tokens.give_back(estimated - used)

    def slot(self) -> _Slot:
        return _Slot(self)

    def __repr__(self) -> str:
        return f"Limiter(in_flight={self.in_flight}, requests={self.requests}, tokens={self.tokens})"


class _Slot:
    """Holds one concurrency slot; released on any exit, errors included."""

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter

    async def __aenter__(self) -> None:
        await self._limiter._slots.acquire()
        self._limiter.in_flight += 1

    async def __aexit__(self, *exc: object) -> None:
        self._limiter.in_flight -= 1
        self._limiter._slots.release()
