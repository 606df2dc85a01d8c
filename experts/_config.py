"""Settings of an expert endpoint, as frozen keyword-only value objects."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

__all__ = ["RateLimit", "RetryPolicy", "Timeout"]


@dataclass(frozen=True, kw_only=True)
class Timeout:
    """Seconds allowed to connect, to read a response, to write a request, and to wait for a
    free connection from the pool."""

    connect: float = 10.0
    read: float = 120.0
    write: float = 10.0
    pool: float = 30.0

    def __post_init__(self) -> None:
        if min(self.connect, self.read, self.write, self.pool) <= 0:
            raise ValueError(f"timeouts must be positive, got {self}")

    def to_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.write, pool=self.pool)


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """At most `concurrency` requests in flight, `rpm` requests and `tpm` tokens per minute
    (None: unlimited)."""

    concurrency: int = 16
    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value}")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retry an item up to `max_attempts` times in all, within `deadline` seconds of its first
    attempt, waiting initial * multiplier^(attempt-1) seconds (capped at `maximum`) scaled by a
    random factor in [1 - jitter, 1], or what the server's Retry-After asks if that is longer."""

    max_attempts: int = 6
    initial: float = 0.5
    multiplier: float = 2.0
    maximum: float = 30.0
    jitter: float = 0.5
    deadline: float = 900.0
    # End the run once this many items in a row have failed at the endpoint (transport errors,
    # 5xx) with no answer between them; 0 means twice the concurrency, at least 8.
    down_after: int = 0

    def __post_init__(self) -> None:
        if self.down_after < 0:
            raise ValueError(f"down_after must be at least 0, got {self.down_after}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must lie in [0, 1], got {self.jitter}")
        if min(self.initial, self.maximum, self.deadline) < 0 or self.multiplier < 1:
            raise ValueError(f"invalid backoff settings {self}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.maximum, self.initial * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * rng.random())
