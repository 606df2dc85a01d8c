"""Concurrency, requests-per-minute and tokens-per-minute limits for one endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ._config import RateLimit

__all__ = ["Limiter", "TokenBucket"]


class TokenBucket:
    """A bucket of `per_minute` units refilled continuously. `take(n)` waits until the bucket
    holds min(n, capacity) and then removes n; the level may go negative (debt), so a request
    larger than a minute's allowance waits for a full bucket instead of failing."""

    def __init__(
        self,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._level = self.capacity
        self._stamp = clock()
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()  # first come, first served

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, amount: float) -> None:
        async with self._lock:
            self._refill()
            need = min(amount, self.capacity)
            while self._level < need:
                await self._sleep((need - self._level) / self.rate)
                self._refill()
            self._level -= amount

    def give_back(self, amount: float) -> None:
        """Return units taken in excess (a token estimate above the tokens used)."""
        self._refill()
        self._level = min(self.capacity, self._level + amount)

    def __repr__(self) -> str:
        return f"TokenBucket(level={self._level:.1f}, capacity={self.capacity:.1f})"


class Limiter:
    """At most `limit.concurrency` requests in flight (`async with limiter.slot()`), and RPM and
    TPM buckets (`await limiter.admit(tokens)`) where the limit sets them."""

    def __init__(
        self,
        limit: RateLimit,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit.concurrency)
        self.requests = TokenBucket(limit.rpm, clock=clock, sleep=sleep) if limit.rpm else None
        self.tokens = TokenBucket(limit.tpm, clock=clock, sleep=sleep) if limit.tpm else None
        self.in_flight = 0

    async def admit(self, tokens: int) -> None:
        if self.requests is not None:
            await self.requests.take(1)
        if self.tokens is not None:
            await self.tokens.take(tokens)

    def settle(self, estimated: int, used: int | None) -> None:
        """Correct the TPM bucket once the answer reports the tokens really used."""
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
