"""The expert client: scores items through the cache, the limiter, retries and the endpoint."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from ._attempts import Attempts, Pending
from ._breaker import BreakerState
from ._cache import CacheKey, ScoreCache
from ._claims import Lease
from ._drain import DRAIN_GRACE, Drain, Stopped
from ._failure import FailureKind
from ._flights import Flights
from ._items import Item, ItemResult, ProgressSink, RunStats
from ._prompts import PromptTemplate, load_template
from ._registry import ExpertSpec
from ._resources import ClientResources
from ._rows import AnswerRows
from ._scoring import Request, build_request
from ._spend import CostLimitReached, Spend

__all__ = ["ExpertClient", "KeyedItems", "score_items"]

_LOOKUP_CHUNK = 1024  # items keyed and looked up in the cache at a time
_CLAIM_BATCH_MAX = 512  # items claimed in one transaction at most (see `_produce`)


@dataclass(frozen=True)
class KeyedItems:
    """Items with each one's cache key and its request's estimated prompt tokens, for one
    expert (`ExpertClient.keyed`). Keys, not requests: memory grows by a key an item, not by
    the requests' text."""

    items: Sequence[Item]
    keys: list[str]
    tokens: list[int]
    keyspace: tuple[object, ...]  # the client's, checked by `score`

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class _Call:
    """The state of one `score` call, shared by its producer and workers."""

    items: Sequence[Item]
    keys: Sequence[str] | None  # the items' cache keys when the caller had them (`KeyedItems`)
    held: ClientResources
    stats: RunStats
    queue: asyncio.Queue[Pending | None]
    results: list[ItemResult | None] = field(init=False)
    flights: Flights = field(init=False)  # keys in flight, with the items that share them
    # Keys this call claimed and has not answered yet (one count per key: items with the same
    # input share one claim): released at the end if the call fails. Keys only: memory stays flat.
    unanswered: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)
        self.flights = Flights(self.items, self.results, self.stats)


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
    single call). Once the `async with` block has ended the client refuses use (RuntimeError).
    `drain()` stops it gracefully: the answers in flight are committed, then `score` raises
    `Stopped` (see `experts._drain`).

    With a `spend` (`experts._spend`), every attempt reserves what it can cost before it is
    sent and settles with the tokens its answer reports; an attempt that cannot fit under the
    spend's limit once those in flight have settled is not sent, the client drains (the answers
    in flight are committed) and `score` raises `CostLimitReached`."""

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
        spend: Spend | None = None,
    ) -> None:
        self.spec = spec
        self.spend = spend
        self.template: PromptTemplate = load_template(spec.template)
        self._endpoint_id = spec.endpoint_id()
        # What a cache key depends on besides the item: keys made by another client are this
        # one's when these are equal (`keyed`).
        self._keyspace = (
            self._endpoint_id,
            spec.model,
            spec.method,
            spec.top_logprobs,
            tuple(sorted(self.template.labels.items())),
            self.template.sha256,
        )
        self.cache = cache
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._progress = progress
        self._lease = lease or Lease()
        self._held: ClientResources | None = None  # open between __aenter__ and __aexit__
        self._closed = False
        self._drain = Drain()
        self.rows = AnswerRows(spec, self.template, self._endpoint_id)
        self._attempts = Attempts(
            spec,
            self.template,
            self.rows,
            clock=clock,
            sleep=sleep,
            rng=rng or random.Random(0),
            drain=self._drain,
            spend=spend,
        )

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

    def drain(self, grace: float = DRAIN_GRACE) -> int:
        """Stop sending; the requests in flight get `grace` seconds to arrive and be committed,
        then the `score` calls under way raise `Stopped` (a second call cuts the grace short).
        Call it in the client's event loop (`loop.add_signal_handler`, say). Returns how many
        answers were in flight. The client sends nothing afterwards."""
        return self._drain.ask(grace)

    @property
    def breaker_state(self) -> BreakerState:
        """The shared breaker's state while open; CLOSED when the client is not open."""
        return self._held.breaker.state if self._held is not None else BreakerState.CLOSED

    def request(self, item: Item) -> Request:
        """The request an item sends."""
        return build_request(
            self.spec.method,
            self.template,
            item.conversation,
            self.spec.model,
            top_logprobs=self.spec.top_logprobs,
        )

    def request_for(self, item: Item) -> tuple[Request, str]:
        """The request an item sends and its cache key."""
        request = self.request(item)
        key = CacheKey(
            endpoint=self._endpoint_id,
            model=self.spec.model,
            method=self.spec.method,
            labels=self.template.labels,
            template_sha256=self.template.sha256,
            body={"path": request.path, "bodies": list(request.bodies)},
        ).digest()
        return request, key

    def keyed(self, items: Sequence[Item] | KeyedItems) -> KeyedItems:
        """`items` with their cache keys and their requests' estimated prompt tokens, computed
        once for every pass over them (the checks before a run, its estimate, `score`): keying
        (a JSON dump and a hash) is most of what such a pass costs. Items keyed already come
        back as they are, if keyed for this client's expert (ValueError otherwise)."""
        if isinstance(items, KeyedItems):
            if items.keyspace != self._keyspace:
                raise ValueError("these items were keyed for another expert, model, template or endpoint")
            return items
        keys, tokens = [], []
        for item in items:
            request, key = self.request_for(item)
            keys.append(key)
            tokens.append(request.tokens)
        return KeyedItems(items, keys, tokens, self._keyspace)

    async def score(self, items: Sequence[Item] | KeyedItems) -> tuple[list[ItemResult], RunStats]:
        """One result per item, aligned with `items`. Items with a cached score send nothing;
        the others are queried; failures after the retry cap are recorded, never raised, unless
        so many come in a row that the endpoint is down (EndpointDown; answers so far are kept;
        with `retry.cooldown` set the breaker opens instead and items fail as endpoint-down).
        Items another run on the same cache is asking about are waited for, not paid twice;
        items out in a batch file fail as "in-batch" without a request (their answers come with
        `--batch-in`); items of this call with the same input share one request (see
        `experts._flights`). `items` may come keyed (`keyed`, by a client of the same keyspace)."""
        if isinstance(items, KeyedItems):
            items = self.keyed(items)  # checked: keyed for this expert
        if self._held is not None:
            return await self._score(items, self._held)
        held = await self._open()
        try:
            return await self._score(items, held)
        finally:
            await held.aclose()

    async def _score(
        self, items: Sequence[Item] | KeyedItems, held: ClientResources
    ) -> tuple[list[ItemResult], RunStats]:
        try:
            return await self._score_items(items, held)
        except Stopped:
            over_limit = self._attempts.over_limit  # the spend's refusal that drained the client
            if over_limit is None or self.spend is None or self.spend.limit is None:
                raise
            # Raised again with what was spent once the answers in flight were settled.
            raise CostLimitReached(self.spend.total, self.spend.limit, needed=over_limit.needed) from None

    async def _score_items(
        self, asked: Sequence[Item] | KeyedItems, held: ClientResources
    ) -> tuple[list[ItemResult], RunStats]:
        self._drain.check()  # a drained client sends nothing more
        items, keys = (asked.items, asked.keys) if isinstance(asked, KeyedItems) else (asked, None)
        n_workers = max(1, min(self.spec.rate.concurrency, len(items)))
        call = _Call(items, keys, held, RunStats(total=len(items)), asyncio.Queue(maxsize=2 * n_workers))
        workers = [asyncio.create_task(self._worker(call)) for _ in range(n_workers)]
        tasks = [asyncio.create_task(self._produce(call, n_workers)), *workers]
        self._drain.watch(tasks)
        try:
            # If the workers die (a disk error on commit, say), the producer must not wait on a
            # full queue forever: the first exception anywhere ends the call.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if self._drain.asked:  # the attempts under way land, or the grace runs out (Drain)
                done, _ = await asyncio.wait(tasks)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None and not isinstance(error, Stopped):
                    raise error  # a disk error during a drain says more than the stop
            self._drain.check()
            await asyncio.gather(*tasks)
        finally:
            self._drain.unwatch(tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            left = list(call.unanswered)
            if left and held.ledger is not None:  # a call that failed frees its items at once
                await held.ledger.release(left)
            self._report(call.stats)
        return [r for r in call.results if r is not None], call.stats

    async def _produce(self, call: _Call, n_workers: int) -> None:
        """Queue the misses, claiming them a batch at a time just before they are queued: the
        claims a run holds beyond its items in flight stay few, so a second run finds most
        items free. Items another run holds are set aside and looked at again every
        `lease.poll` seconds once this run's own items are queued: each ends as a cache hit
        (the other run answered it) or is claimed and queried here (its claim went stale, or
        the other run failed it and let it go)."""
        batch_size = min(_CLAIM_BATCH_MAX, 2 * n_workers)
        waiting: list[Pending] = []
        for misses in self._misses(call):
            for start in range(0, len(misses), batch_size):
                mine, others = await self._claim(call, misses[start : start + batch_size])
                waiting += others
                for pending in mine:
                    await call.queue.put(pending)
        while waiting:
            call.stats.waiting = len(waiting)
            self._report(call.stats)
            await asyncio.sleep(self._lease.poll)
            mine, waiting = await self._claim(call, waiting)
            for pending in mine:
                await call.queue.put(pending)
        call.stats.waiting = 0
        for _ in range(n_workers):
            await call.queue.put(None)

    def _misses(self, call: _Call) -> Iterator[list[Pending]]:
        """Fill in cached results chunk by chunk and yield each chunk's items to query: one
        per key not already in flight in this call (the others follow it)."""
        items, stats = call.items, call.stats
        for start in range(0, len(items), _LOOKUP_CHUNK):
            stop = min(start + _LOOKUP_CHUNK, len(items))
            if call.keys is not None:
                keys = call.keys[start:stop]
            else:
                keys = [self.request_for(items[i])[1] for i in range(start, stop)]
            cached = self.cache.get_many(keys) if self.cache is not None else {}
            misses = []
            for index, key in enumerate(keys, start):
                item, hit = items[index], cached.get(key)
                if hit is not None:
                    call.results[index] = ItemResult(item.id, hit.score, hit.label_mass, "cache", how=hit.how)
                    stats.cached += 1
                elif call.flights.lead(key, index):
                    misses.append(Pending(index, item, self.request(item), key))
            self._report(stats)
            if misses:
                yield misses

    async def _claim(self, call: _Call, batch: list[Pending]) -> tuple[list[Pending], list[Pending]]:
        """Split `batch` into the items this run now holds (counted in `unanswered`) and those
        another run holds; items another run answered since they were looked up become cache
        hits. A claim under way when the call is cancelled is waited for and counted all the
        same (its thread runs on), so that the call's end can release it."""
        ledger = call.held.ledger
        if ledger is None:
            return batch, []
        work = asyncio.ensure_future(
            asyncio.to_thread(ledger.claim, self.spec.name, {p.key: p.item.id for p in batch})
        )
        try:
            claimed = await asyncio.shield(work)
        except asyncio.CancelledError:
            claimed = await work
            call.unanswered.update(p.key for p in batch if p.key in claimed.mine)
            raise
        mine, others = [], []
        for pending in batch:
            hit = claimed.scored.get(pending.key)
            if hit is not None:
                result = ItemResult(pending.item.id, hit.score, hit.label_mass, "cache", how=hit.how)
                call.results[pending.index] = result
                call.stats.cached += 1
                call.flights.land(pending.key, result)
            elif pending.key in claimed.out:
                self._out_in_batch(call, pending)
            elif pending.key in claimed.held:
                others.append(pending)
            else:
                mine.append(pending)
        call.unanswered.update(p.key for p in mine)
        return mine, others

    @staticmethod
    def _out_in_batch(call: _Call, pending: Pending) -> None:
        """A request out in a batch file fails here without being sent, and without a failure
        row (the expert did not fail it): its answer comes with `--batch-in`, and a rerun after
        that finds it in the cache."""
        kind = FailureKind.IN_BATCH
        result = ItemResult(pending.item.id, None, None, "failed", reason=kind.value, failure=kind)
        call.results[pending.index] = result
        call.stats.count_failure(kind.value)
        call.flights.land(pending.key, result)

    async def _worker(self, call: _Call) -> None:
        while True:
            self._drain.check()  # a stop was asked: no next item
            if (pending := await call.queue.get()) is None:
                return
            result = await self._attempts.query(pending, call.held, call.stats)
            call.results[pending.index] = result
            call.flights.land(pending.key, result)
            call.unanswered[pending.key] -= 1  # its score or failure is stored: the claim is gone
            if call.unanswered[pending.key] <= 0:
                del call.unanswered[pending.key]
            self._report(call.stats)

    def _report(self, stats: RunStats) -> None:
        if self.spend is not None:
            stats.cost_usd = self.spend.spent
        if self._progress is not None:
            self._progress.update(stats)


def score_items(
    spec: ExpertSpec, items: Sequence[Item], *, cache: ScoreCache | None, progress: ProgressSink | None = None
) -> tuple[list[ItemResult], RunStats]:
    """Synchronous wrapper over `ExpertClient.score` for scripts and notebooks."""
    return asyncio.run(ExpertClient(spec, cache=cache, progress=progress).score(items))
