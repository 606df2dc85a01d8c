"""The expert client: scores items through the cache, the limiter, retries and the endpoint."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from ._breaker import BreakerState
from ._cache import SCHEMA_VERSION, CacheKey, CacheWriter, ScoreCache, now
from ._claims import ClaimLedger, Lease
from ._errors import EndpointDown, ExpertError, HTTPStatusError
from ._failure import FailureKind
from ._prompts import Conversation, PromptTemplate, load_template
from ._registry import ExpertSpec
from ._resources import ClientResources
from ._scoring import Request, build_request, parse_response, total_usage

__all__ = ["ExpertClient", "Item", "ItemResult", "ProgressSink", "RunStats", "score_items"]

_LOOKUP_CHUNK = 1024  # items keyed and looked up in the cache at a time
_CLAIM_BATCH_MAX = 512  # items claimed in one transaction at most (see `_produce`)


@dataclass(frozen=True)
class Item:
    """One input to score: an id and the conversation."""

    id: str
    conversation: Conversation


@dataclass(frozen=True)
class ItemResult:
    """The outcome for one item, in input order. `score` is None when `source` is "failed",
    and `reason` then says why (the last error's tag, e.g. "http-429", "timeout", "no-label-mass",
    as stored in the cache's failures table) and `failure` what kind of failure that is."""

    id: str
    score: float | None
    label_mass: float | None
    source: Literal["cache", "expert", "failed"]
    reason: str | None = None
    attempts: int = 0
    failure: FailureKind | None = None  # the typed kind of `reason`, for decisions (not display)


@dataclass
class RunStats:
    """Counters of one run, for progress and the final report."""

    total: int = 0
    cached: int = 0
    scored: int = 0
    failed: int = 0
    retries: int = 0
    rate_limited: int = 0  # answers with status 429
    in_flight: int = 0
    waiting: int = 0  # items another run on the same cache is asking about right now
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    errors_seen: Counter[str] = field(default_factory=Counter)

    @property
    def done(self) -> int:
        return self.cached + self.scored + self.failed


class ProgressSink(Protocol):
    def update(self, stats: RunStats) -> None: ...


@dataclass(frozen=True)
class _Pending:
    index: int
    item: Item
    request: Request
    key: str


class ExpertClient:
    """Scores items with one expert. The transport, clock, sleep and random source can be
    injected (tests use them to avoid real waiting); by default httpx over aiohttp. With a
    cache, items in flight are claimed in it under `lease`, so that runs sharing the cache
    never query the same item at once (see `experts._claims`).

    Life, like httpx's clients: `async with ExpertClient(...) as client:` opens one endpoint
    (connection pool), limiter (concurrency, RPM, TPM), breaker and, with a cache, one claims
    ledger and writer (`experts._resources`); `await client.score(items)` may then be called any
    number of times, concurrently too, and all calls share them: at most `rate.concurrency`
    requests in flight in all, one RPM/TPM budget, one breaker. `score` called outside `async
    with` opens them around that one call and closes them after (a script's or a batch run's
    single call). Once the `async with` block has ended the client refuses use (RuntimeError)."""

    def __init__(
        self,
        spec: ExpertSpec,
        *,
        cache: ScoreCache | None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        progress: ProgressSink | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.spec = spec
        self.template: PromptTemplate = load_template(spec.template)
        self._endpoint_id = spec.endpoint_id()
        self.cache = cache
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random(0)
        self._progress = progress
        self._lease = lease or Lease()
        self._held: ClientResources | None = None  # open between __aenter__ and __aexit__
        self._closed = False

    async def _open(self) -> ClientResources:
        if self._closed:
            raise RuntimeError("this ExpertClient has been closed: open a new one")
        return await ClientResources.open(
            self.spec,
            cache=self.cache,
            transport=self._transport,
            clock=self._clock,
            sleep=self._sleep,
            lease=self._lease,
        )

    async def __aenter__(self) -> ExpertClient:
        if self._held is not None:
            raise RuntimeError("this ExpertClient is already open")
        self._held = await self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        held, self._held, self._closed = self._held, None, True
        if held is not None:
            await held.aclose()

    @property
    def breaker_state(self) -> BreakerState:
        """The shared breaker's state while open; CLOSED when the client is not open."""
        return self._held.breaker.state if self._held is not None else BreakerState.CLOSED

    def request_for(self, item: Item) -> tuple[Request, str]:
        """The request an item sends and its cache key."""
        request = build_request(
            self.spec.method,
            self.template,
            item.conversation,
            self.spec.model,
            top_logprobs=self.spec.top_logprobs,
        )
        key = CacheKey(
            endpoint=self._endpoint_id,
            model=self.spec.model,
            method=self.spec.method,
            labels=self.template.labels,
            template_sha256=self.template.sha256,
            body={"path": request.path, "bodies": list(request.bodies)},
        ).digest()
        return request, key

    async def score(self, items: Sequence[Item]) -> tuple[list[ItemResult], RunStats]:
        """One result per item, aligned with `items`. Items with a cached score send nothing;
        the others are queried; failures after the retry cap are recorded, never raised, unless
        so many come in a row that the endpoint is down (EndpointDown; answers so far are kept;
        with `retry.cooldown` set the breaker opens instead and items fail as endpoint-down).
        Items another run on the same cache is asking about are waited for, not paid twice."""
        if self._held is not None:
            return await self._score(items, self._held)
        held = await self._open()
        try:
            return await self._score(items, held)
        finally:
            await held.aclose()

    async def _score(self, items: Sequence[Item], held: ClientResources) -> tuple[list[ItemResult], RunStats]:
        stats = RunStats(total=len(items))
        results: list[ItemResult | None] = [None] * len(items)
        # Keys this call claimed and has not answered yet (a count per key: an input may come
        # twice): released at the end if the call fails. Keys only, so memory stays flat.
        unanswered: Counter[str] = Counter()
        n_workers = max(1, min(self.spec.rate.concurrency, len(items)))
        queue: asyncio.Queue[_Pending | None] = asyncio.Queue(maxsize=2 * n_workers)
        workers = [
            asyncio.create_task(self._worker(queue, held, results, stats, unanswered))
            for _ in range(n_workers)
        ]
        producer = asyncio.create_task(
            self._produce(items, results, stats, queue, n_workers, held, unanswered)
        )
        tasks = [producer, *workers]
        try:
            # If the workers die (a disk error on commit, say), the producer must not wait on a
            # full queue forever: the first exception anywhere ends the call.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            left = list(unanswered)
            if left and held.ledger is not None:  # a call that failed frees its items at once
                await held.ledger.release(left)
            self._report(stats)
        return [r for r in results if r is not None], stats

    async def _produce(
        self,
        items: Sequence[Item],
        results: list[ItemResult | None],
        stats: RunStats,
        queue: asyncio.Queue[_Pending | None],
        n_workers: int,
        held: ClientResources,
        unanswered: Counter[str],
    ) -> None:
        """Queue the misses, claiming them a batch at a time just before they are queued: the
        claims a run holds beyond its items in flight stay few, so a second run finds most
        items free. Items another run holds are set aside and looked at again every
        `lease.poll` seconds once this run's own items are queued: each ends as a cache hit
        (the other run answered it) or is claimed and queried here (its claim went stale, or
        the other run failed it and let it go)."""
        batch_size = min(_CLAIM_BATCH_MAX, 2 * n_workers)
        ledger = held.ledger
        waiting: list[_Pending] = []
        for misses in self._misses(items, results, stats):
            for start in range(0, len(misses), batch_size):
                batch = misses[start : start + batch_size]
                mine, others = await self._claim(batch, results, stats, ledger, unanswered)
                waiting += others
                for pending in mine:
                    await queue.put(pending)
        while waiting:
            stats.waiting = len(waiting)
            self._report(stats)
            await asyncio.sleep(self._lease.poll)
            mine, waiting = await self._claim(waiting, results, stats, ledger, unanswered)
            for pending in mine:
                await queue.put(pending)
        stats.waiting = 0
        for _ in range(n_workers):
            await queue.put(None)

    def _misses(
        self, items: Sequence[Item], results: list[ItemResult | None], stats: RunStats
    ) -> Iterator[list[_Pending]]:
        """Fill in cached results chunk by chunk and yield each chunk's items to query."""
        for start in range(0, len(items), _LOOKUP_CHUNK):
            chunk = [
                (i, items[i], *self.request_for(items[i]))
                for i in range(start, min(start + _LOOKUP_CHUNK, len(items)))
            ]
            cached = self.cache.get_many([key for *_, key in chunk]) if self.cache is not None else {}
            misses = []
            for index, item, request, key in chunk:
                hit = cached.get(key)
                if hit is not None:
                    results[index] = ItemResult(item.id, hit.score, hit.label_mass, "cache")
                    stats.cached += 1
                else:
                    misses.append(_Pending(index, item, request, key))
            self._report(stats)
            if misses:
                yield misses

    async def _claim(
        self,
        batch: list[_Pending],
        results: list[ItemResult | None],
        stats: RunStats,
        ledger: ClaimLedger | None,
        unanswered: Counter[str],
    ) -> tuple[list[_Pending], list[_Pending]]:
        """Split `batch` into the items this run now holds (counted in `unanswered`) and those
        another run holds; items another run answered since they were looked up become cache
        hits. A claim under way when the call is cancelled is waited for and counted all the
        same (its thread runs on), so that the call's end can release it."""
        if ledger is None:
            return batch, []
        work = asyncio.ensure_future(
            asyncio.to_thread(ledger.claim, self.spec.name, {p.key: p.item.id for p in batch})
        )
        try:
            claimed = await asyncio.shield(work)
        except asyncio.CancelledError:
            claimed = await work
            unanswered.update(
                p.key for p in batch if p.key not in claimed.scored and p.key not in claimed.held
            )
            raise
        mine, others = [], []
        for pending in batch:
            hit = claimed.scored.get(pending.key)
            if hit is not None:
                results[pending.index] = ItemResult(pending.item.id, hit.score, hit.label_mass, "cache")
                stats.cached += 1
            elif pending.key in claimed.held:
                others.append(pending)
            else:
                mine.append(pending)
        unanswered.update(p.key for p in mine)
        return mine, others

    async def _worker(
        self,
        queue: asyncio.Queue[_Pending | None],
        held: ClientResources,
        results: list[ItemResult | None],
        stats: RunStats,
        unanswered: Counter[str],
    ) -> None:
        while (pending := await queue.get()) is not None:
            results[pending.index] = await self._query(pending, held, stats)
            unanswered[pending.key] -= 1  # its score or failure is stored: the claim is gone
            if unanswered[pending.key] <= 0:
                del unanswered[pending.key]
            self._report(stats)

    async def _query(self, pending: _Pending, held: ClientResources, stats: RunStats) -> ItemResult:
        """One item through the breaker and the retry loop (the only retry layer in the stage).
        A half-open breaker's probe gets one attempt: its outcome is what closes or reopens it."""
        breaker, writer = held.breaker, held.writer
        try:
            probe = breaker.admit()
        except EndpointDown as exc:  # open: nothing is sent
            return await self._failed(pending, exc, 0, writer, stats)
        try:
            return await self._attempts(pending, held, stats, probe=probe)
        finally:
            breaker.abandon(probe=probe)  # a no-op once the probe's outcome is in

    async def _attempts(
        self, pending: _Pending, held: ClientResources, stats: RunStats, *, probe: bool
    ) -> ItemResult:
        endpoint, limiter, writer, breaker = held.endpoint, held.limiter, held.writer, held.breaker
        policy = self.spec.retry
        max_attempts = 1 if probe else policy.max_attempts
        deadline = self._clock() + policy.deadline
        request = pending.request
        attempt = 0
        while True:
            attempt += 1
            await limiter.admit(request.tokens, requests=len(request.bodies))
            try:
                async with limiter.slot():
                    stats.in_flight = limiter.in_flight
                    payloads, seconds = [], 0.0
                    for body in request.bodies:
                        payload, took = await endpoint.request("POST", request.path, body)
                        payloads.append(payload)
                        seconds += took
                score = parse_response(self.spec.method, payloads, self.template, request)
            except ExpertError as exc:
                stats.errors_seen[exc.reason] += 1
                if isinstance(exc, HTTPStatusError) and exc.status == 429:
                    stats.rate_limited += 1
                delay = max(getattr(exc, "retry_after", None) or 0.0, policy.backoff(attempt, self._rng))
                if not exc.retryable or attempt >= max_attempts or self._clock() + delay > deadline:
                    failed = await self._failed(pending, exc, attempt, writer, stats)
                    breaker.failed(exc, probe=probe)  # after the failure is in the ledger
                    return failed
                stats.retries += 1
                await self._sleep(delay)
                continue
            breaker.answered(probe=probe)
            usage = total_usage(payloads)
            prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
            limiter.settle(request.tokens, (prompt_tokens or 0) + (completion_tokens or 0) if usage else None)
            stats.prompt_tokens += prompt_tokens or 0
            stats.completion_tokens += completion_tokens or 0
            stats.scored += 1
            if writer is not None:
                response = payloads[0] if len(payloads) == 1 else payloads
                await writer.put_score(
                    self._row(pending, response, score.p, score.label_mass, seconds, usage)
                )
            return ItemResult(pending.item.id, score.p, score.label_mass, "expert", attempts=attempt)

    def _row(
        self,
        pending: _Pending,
        payload: Any,
        p: float,
        mass: float | None,
        seconds: float,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "key": pending.key,
            "expert": self.spec.name,
            "item_id": pending.item.id,
            "endpoint": self._endpoint_id,
            "model": self.spec.model,
            "method": self.spec.method,
            "template_sha256": self.template.sha256,
            "schema_version": SCHEMA_VERSION,
            "score": p,
            "label_mass": mass,
            "response": json.dumps(payload, separators=(",", ":")),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "latency_ms": seconds * 1000.0,
            "created": now(),
        }

    async def _failed(
        self, pending: _Pending, exc: ExpertError, attempts: int, writer: CacheWriter | None, stats: RunStats
    ) -> ItemResult:
        stats.failed += 1
        stats.failure_reasons[exc.reason] += 1
        if writer is not None:
            await writer.put_failure(
                {
                    "key": pending.key,
                    "expert": self.spec.name,
                    "item_id": pending.item.id,
                    "reason": exc.reason,
                    "message": str(exc)[:500],
                    "attempts": attempts,
                    "created": now(),
                }
            )
        return ItemResult(
            pending.item.id,
            None,
            None,
            "failed",
            reason=exc.reason,
            attempts=attempts,
            failure=FailureKind.of(exc),
        )

    def _report(self, stats: RunStats) -> None:
        if self._progress is not None:
            self._progress.update(stats)


def score_items(
    spec: ExpertSpec, items: Sequence[Item], *, cache: ScoreCache | None, progress: ProgressSink | None = None
) -> tuple[list[ItemResult], RunStats]:
    """Synchronous wrapper over `ExpertClient.score` for scripts and notebooks."""
    return asyncio.run(ExpertClient(spec, cache=cache, progress=progress).score(items))
