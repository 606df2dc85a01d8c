"""The expert side of the monitor: delegated conversations go to the expert through the existing
`ExpertClient` (limiter, retries, optional cache, outage breaker), micro-batched, with an online
retry policy (a request waits seconds, not the batch stage's minutes). When the expert fails or is
down, the answer is "no expert score" with the reason; nothing is raised to the caller."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from experts import (
    EndpointDown,
    ExpertClient,
    ExpertError,
    ExpertSpec,
    Item,
    RetryPolicy,
    ScoreCache,
    Timeout,
)

from ._batcher import MicroBatcher

__all__ = ["ONLINE_RETRY", "ONLINE_TIMEOUT", "ExpertAnswer", "ExpertGate"]

# Two attempts within 10 s; the breaker opens after 4 items in a row fail at the endpoint.
ONLINE_RETRY = RetryPolicy(max_attempts=2, initial=0.05, maximum=0.5, deadline=10.0, down_after=4)
ONLINE_TIMEOUT = Timeout(connect=2.0, read=30.0, write=5.0, pool=10.0)
DOWN_REASONS = ("transport", "timeout", "endpoint-down")  # failures that say the endpoint is gone

ExpertAnswer = tuple[float | None, str | None]  # (score, why there is none)


class ExpertGate:
    """`await ask(item)` -> (score, None) or (None, reason). After the expert is found down (the
    client's breaker, or `down_batches` batches in a row failing at the endpoint) it is not asked
    for `cooldown` seconds: those requests answer at once with reason "expert-down"."""

    def __init__(
        self,
        spec: ExpertSpec,
        *,
        cache: Path | None = None,
        max_batch: int = 16,
        max_wait: float = 0.002,
        concurrency: int = 8,
        cooldown: float = 5.0,
        down_batches: int = 3,
    ) -> None:
        self.spec = replace(spec, retry=ONLINE_RETRY, timeout=ONLINE_TIMEOUT)
        self.client = ExpertClient(self.spec, cache=ScoreCache(cache) if cache is not None else None)
        self.batcher: MicroBatcher[Item, ExpertAnswer] = MicroBatcher(
            self._run, max_batch=max_batch, max_wait=max_wait, concurrency=concurrency
        )
        self.cooldown = cooldown
        self.down_batches = down_batches
        self._down_until = 0.0
        self._failing_batches = 0

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

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
        except EndpointDown:
            self._open()
            return [(None, "expert-down")] * len(items)
        except ExpertError as error:  # the cache's disk, a setting: still no request is lost
            return [(None, f"expert-failed: {error.reason}")] * len(items)
        answers: list[ExpertAnswer] = [
            (r.score, None) if r.score is not None else (None, f"expert-failed: {r.reason}") for r in results
        ]
        if all(
            r.score is None and (r.reason in DOWN_REASONS or str(r.reason).startswith("http-5"))
            for r in results
        ):
            self._failing_batches += 1
            if self._failing_batches >= self.down_batches:
                self._open()
        else:
            self._failing_batches = 0
        return answers

    def _open(self) -> None:
        self._down_until = time.monotonic() + self.cooldown
        self._failing_batches = 0

    async def aclose(self) -> None:
        await self.batcher.aclose()
