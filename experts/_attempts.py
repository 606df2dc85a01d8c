"""One item's way to its answer: the breaker, the retries with their back-off and deadline,
the spend's reservation, the recovery ladder, and the commit of its score or failure."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from ._cache_writer import CacheWriter
from ._drain import Drain, Stopped
from ._errors import EndpointDown, ExpertError, HTTPStatusError, ResponseError
from ._failure import FailureKind
from ._items import Item, ItemResult, RunStats
from ._prompts import PromptTemplate
from ._recovery import Scored, ladder, plain_how, recover
from ._registry import ExpertSpec
from ._resources import ClientResources
from ._rows import AnswerRows
from ._scoring import Request, parse_response, total_usage
from ._spend import CostLimitReached, Reservation, Spend

__all__ = ["Attempts", "Pending"]


@dataclass(frozen=True)
class Pending:
    """An item to ask: its place in the call, its request and its cache key."""

    index: int
    item: Item
    request: Request
    key: str


class Attempts:
    """Asks items of one expert for an `ExpertClient`, one `query` per item; shares the client's
    clock, sleep, random source, drain and spend. `over_limit` is the spend's refusal that
    drained the client, if one did."""

    def __init__(
        self,
        spec: ExpertSpec,
        template: PromptTemplate,
        rows: AnswerRows,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        rng: random.Random,
        drain: Drain,
        spend: Spend | None,
    ) -> None:
        self.spec = spec
        self.template = template
        self.rows = rows
        self.spend = spend
        self.over_limit: CostLimitReached | None = None
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._drain = drain

    async def query(self, pending: Pending, held: ClientResources, stats: RunStats) -> ItemResult:
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
        self, pending: Pending, held: ClientResources, stats: RunStats, *, probe: bool
    ) -> ItemResult:
        policy = self.spec.retry
        max_attempts = 1 if probe else policy.max_attempts
        deadline = self._clock() + policy.deadline
        request = pending.request
        attempt = 0
        while True:
            attempt += 1
            await held.limiter.admit(request.tokens, requests=len(request.bodies))
            reservation = await self._reserve(self._billable(request))
            try:
                last = attempt >= max_attempts
                outcome = await self._attempt(
                    pending, held, stats, attempt, last, deadline, probe, reservation
                )
            finally:
                self._drain.settled()
                if reservation is not None:
                    reservation.close()  # what was sent is charged; a body still in flight, its bound
            if isinstance(outcome, ItemResult):
                return outcome
            self._drain.check()  # a stop came while the attempt was under way: no retry
            stats.retries += 1
            await self._sleep(outcome)

    def _billable(self, request: Request) -> Request:
        """Every body an attempt at `request` may send: its own and, for next-token scoring, the
        recovery rungs' (reserved up front, so that the limit never stops an attempt between a
        paid answer and its score)."""
        if self.spend is None or not self.spend.bounded or self.spec.method != "next-token":
            return request  # no rung to price: not built on every attempt of a free, unlimited run
        rungs = ladder(request, self.template, self.spec.server)
        return replace(request, bodies=(*request.bodies, *(rung.request.body for rung in rungs)))

    async def _reserve(self, request: Request) -> Reservation | None:
        """What the next attempt may cost, held in the spend; over the limit, the client drains
        (nothing more is sent, the answers in flight land) and this attempt stops (`Stopped`)."""
        if self.spend is None:
            return None
        try:
            return await self.spend.reserve(request)
        except CostLimitReached as refused:
            if self.over_limit is None:
                self.over_limit = refused
            if not self._drain.asked:
                self._drain.ask()
            raise Stopped(str(refused)) from None

    async def _attempt(
        self,
        pending: Pending,
        held: ClientResources,
        stats: RunStats,
        attempt: int,
        last: bool,
        deadline: float,
        probe: bool,
        reservation: Reservation | None = None,
    ) -> ItemResult | float:
        """One attempt: the item's result (committed), or the seconds to wait before the next.
        From the moment it sends to the commit of its outcome, a stop lets it finish (Drain)."""
        endpoint, limiter, writer, breaker = held.endpoint, held.limiter, held.writer, held.breaker
        request = pending.request
        payloads: list[Any] = []
        try:
            async with limiter.slot():
                self._drain.sending()
                stats.in_flight = limiter.in_flight
                seconds = 0.0
                for body in request.bodies:
                    sent = reservation.sending() if reservation is not None else 0
                    payload, took = await endpoint.request("POST", request.path, body)
                    if reservation is not None:
                        reservation.answered(sent, payload)
                    payloads.append(payload)
                    seconds += took
            scored = await self._scored(payloads, request, held, reservation)
            score, payloads, estimated = scored.score, scored.payloads, scored.estimated_tokens
            seconds += scored.seconds
        except ExpertError as exc:
            if reservation is not None and isinstance(exc, HTTPStatusError):
                reservation.refused()  # an error status is not billed; a lost answer may be
            stats.errors_seen[exc.reason] += 1
            if isinstance(exc, HTTPStatusError) and exc.status == 429:
                stats.rate_limited += 1
            delay = max(getattr(exc, "retry_after", None) or 0.0, self.spec.retry.backoff(attempt, self._rng))
            if not exc.retryable or last or self._clock() + delay > deadline:
                failed = await self._failed(pending, exc, attempt, writer, stats)
                breaker.failed(exc, probe=probe)  # after the failure is in the ledger
                return failed
            return delay
        breaker.answered(probe=probe)
        usage = total_usage(payloads)
        prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        limiter.settle(estimated, (prompt_tokens or 0) + (completion_tokens or 0) if usage else None)
        stats.prompt_tokens += prompt_tokens or 0
        stats.completion_tokens += completion_tokens or 0
        stats.scored += 1
        if writer is not None:
            answer = scored.answer
            response = answer[0] if len(answer) == 1 else answer
            row = self.rows.score(
                pending.key, pending.item.id, response, score, seconds=seconds, usage=usage, how=scored.how
            )
            await writer.put_score(row)
        return ItemResult(
            pending.item.id, score.p, score.label_mass, "expert", attempts=attempt, how=scored.how
        )

    async def _scored(
        self, payloads: list[Any], request: Request, held: ClientResources, reservation: Reservation | None
    ) -> Scored:
        """The score of an attempt's answers; a next-token answer without label mass goes down
        the recovery ladder (`experts._recovery`) before it counts as a failure."""
        try:
            score = parse_response(self.spec.method, payloads, self.template, request)
        except ResponseError as exc:
            if self.spec.method != "next-token":
                raise

            return await recover(exc, payloads, request, self.template, self.spec.server, held, reservation)
        how = plain_how(self.spec.method)
        return Scored(score, how, tuple(payloads), tuple(payloads), request.tokens, 0.0)

    async def _failed(
        self, pending: Pending, exc: ExpertError, attempts: int, writer: CacheWriter | None, stats: RunStats
    ) -> ItemResult:
        stats.count_failure(exc.reason)
        if writer is not None:
            await writer.put_failure(self.rows.failure(pending.key, pending.item.id, exc, attempts=attempts))
        return ItemResult(
            pending.item.id,
            None,
            None,
            "failed",
            reason=exc.reason,
            attempts=attempts,
            failure=FailureKind.of(exc),
        )
