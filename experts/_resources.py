"""What one `ExpertClient` holds open for its life, shared by all its `score` calls: one endpoint
(a connection pool), one limiter (the concurrency slots and the RPM/TPM budget), one breaker, and
with a cache one claims ledger (with its heartbeat) and one cache writer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from ._breaker import Breaker
from ._cache import ScoreCache
from ._cache_writer import CacheWriter
from ._claims import ClaimLedger, Lease
from ._endpoint import Endpoint
from ._limiter import Limiter
from ._registry import ExpertSpec

__all__ = ["ClientResources"]


@dataclass
class ClientResources:
    limiter: Limiter
    breaker: Breaker
    endpoint: Endpoint
    ledger: ClaimLedger | None
    writer: CacheWriter | None
    heartbeat: asyncio.Task[None] | None

    @classmethod
    async def open(
        cls,
        spec: ExpertSpec,
        *,
        cache: ScoreCache | None,
        transport: httpx.AsyncBaseTransport | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        lease: Lease | None = None,
    ) -> ClientResources:
        """Open them in the running event loop: the cache's stale claims are swept first (a
        failing disk is found before any connection is made)."""
        ledger = ClaimLedger(cache, lease=lease) if cache is not None else None
        if ledger is not None:
            await asyncio.to_thread(ledger.sweep)  # claims of runs that died: tidiness, not needed
        endpoint = Endpoint(
            spec.request_urls(),
            api_key_env=spec.api_key_env,
            timeout=spec.timeout,
            max_connections=spec.rate.concurrency,
            transport=transport,
        )
        writer = None
        if ledger is not None:
            writer = CacheWriter(ledger.cache, release_owner=ledger.owner)
            writer.start()
        return cls(
            limiter=Limiter(spec.rate, clock=clock, sleep=sleep),
            breaker=Breaker(spec.effective_down_after, cooldown=spec.retry.cooldown, clock=clock),
            endpoint=endpoint,
            ledger=ledger,
            writer=writer,
            heartbeat=asyncio.create_task(ledger.heartbeat(), name="claims-heartbeat") if ledger else None,
        )

    async def aclose(self) -> None:
        """Commit what the writer was handed (re-raising a disk error), then release the claims
        still held and close the connections, whatever happened before."""
        if self.heartbeat is not None:
            self.heartbeat.cancel()
            await asyncio.gather(self.heartbeat, return_exceptions=True)
        try:
            if self.writer is not None:
                await self.writer.close()
        finally:
            if self.ledger is not None:
                await self.ledger.close()  # after the writer: an item handed over is stored first
            await self.endpoint.aclose()
