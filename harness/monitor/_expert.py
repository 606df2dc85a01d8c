"""The expert side of the monitor: delegated conversations go to the expert through one long-lived
`ExpertClient` (one connection pool, limiter, retries, optional cache, and one breaker shared by
every micro-batch), with an online retry policy (a request waits seconds, not the batch stage's
minutes). When the expert fails or is down, the answer is "no expert score" with the reason;
nothing is raised to the caller."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import httpx

from experts import (
    BreakerState,
    ExpertClient,
    ExpertError,
    ExpertSpec,
    FailureKind,
    Item,
    ItemResult,
    RetryPolicy,
    ScoreCache,
    StorageError,
    Timeout,
)

from ._batcher import MicroBatcher

__all__ = ["ONLINE_RETRY", "ONLINE_TIMEOUT", "ExpertAnswer", "ExpertGate", "expert_answer"]

# Two attempts within 10 s; after 4 items in a row fail at the endpoint the breaker opens for
# `cooldown` seconds (ExpertGate's), then lets one probe item through.
ONLINE_RETRY = RetryPolicy(
    max_attempts=2, initial=0.05, maximum=0.5, deadline=10.0, down_after=4, cooldown=5.0
)
ONLINE_TIMEOUT = Timeout(connect=2.0, read=30.0, write=5.0, pool=10.0)

ExpertAnswer = tuple[float | None, str | None]  # (score, why there is none)


class ExpertGate:
    """`await ask(item)` -> (score, None) or (None, reason), reason "expert-down" or
    "expert-failed: TAG". Open it (`await gate.open()` or `async with`) before use: its client's
    resources then live until `aclose`. While the client's breaker is open (the expert found
    down) requests answer at once with "expert-down", and nothing is sent; after `cooldown`
    seconds one probe item goes out and its answer closes the breaker. `transport` is for tests
    (counting the requests that really go out)."""

    def __init__(
        self,
        spec: ExpertSpec,
        *,
        cache: Path | None = None,
        max_batch: int = 16,
        max_wait: float = 0.002,
        concurrency: int = 8,
        cooldown: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.spec = replace(spec, retry=replace(ONLINE_RETRY, cooldown=cooldown), timeout=ONLINE_TIMEOUT)
        self.client = ExpertClient(
            self.spec, cache=ScoreCache(cache) if cache is not None else None, transport=transport
        )
        self.batcher: MicroBatcher[Item, ExpertAnswer] = MicroBatcher(
            self._run, max_batch=max_batch, max_wait=max_wait, concurrency=concurrency
        )

    async def open(self) -> None:
        await self.client.__aenter__()

    async def __aenter__(self) -> ExpertGate:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def down(self) -> bool:
        """Whether the breaker is open (cooling down): half-open is not down, a probe may go."""
        return self.client.breaker_state is BreakerState.OPEN

    async def ask(self, item: Item) -> ExpertAnswer:
        if self.down:
            return None, "expert-down"
        try:
            return await self.batcher.submit(item)
        except Exception as error:  # an expert fault the client did not classify: still an answer
            return None, f"expert-failed: {type(error).__name__}"

    async def _run(self, items: list[Item]) -> list[ExpertAnswer]:
        try:
            results, _stats = await self.client.score(items)
        except ExpertError as error:  # the cache's disk, a setting: still no request is lost
            return [(None, f"expert-failed: {error.reason}")] * len(items)
        return [expert_answer(result) for result in results]

    async def aclose(self) -> None:
        try:
            await self.batcher.aclose()
        finally:
            # A cache that cannot store the last answers at shutdown changes nothing the
            # requests were told (the cache is an optional saving): the shutdown goes on.
            with contextlib.suppress(StorageError):
                await self.client.__aexit__(None, None, None)


def expert_answer(result: ItemResult) -> ExpertAnswer:
    """(score, None), or (None, why there is none) as a Decision's reason says it."""
    if result.score is not None:
        return result.score, None
    if result.failure is FailureKind.ENDPOINT_DOWN:  # refused by the open breaker: nothing sent
        return None, "expert-down"
    return None, f"expert-failed: {result.reason}"
