"""Dollars: what one client's requests cost, and a limit that no request may pass.

A `Spend` counts the tokens each answer reports (`usage.prompt_tokens`/`completion_tokens`) times
the expert's `Price`. With a limit, each attempt first takes a `Reservation` of what its request
can cost at most (`Spend.bound`). An attempt that would take the spent dollars, plus every
reservation in flight, past the limit waits for those to settle (most cost far less than their
bound); once none is in flight and it still does not fit, it is not sent (`CostLimitReached`).
When the attempt ends its reservation is closed with the tokens really used, body by body, so
the limit holds with any number of requests in flight: spent <= limit.

An attempt's reservation covers every body it may send: its request's and, for next-token
scoring, the recovery rungs' (`experts._recovery`), so no request of an attempt that began can
be refused by the limit half way (a paid answer left without its score would be paid again).
Every path that sends a body marks it on the attempt's reservation (`sending`, then `answered`
or `refused`); `experts._attempts.Attempts` takes one per attempt, retries included, and closes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._config import Price
from ._errors import ConfigError
from ._scoring import Request

__all__ = [
    "FIRST_OVERHEAD",
    "IN_FLIGHT",
    "PER_MESSAGE",
    "REFUSED",
    "CostLimitReached",
    "Reservation",
    "Spend",
    "TokenBound",
]

FIRST_OVERHEAD = 1024
"""Tokens a chat template may add to one request until an answer has shown what it adds (a
guard model's template writes its whole policy around the conversation: a few hundred tokens)."""

PER_MESSAGE = 16
"""Tokens a chat template may add per message beyond those of a request already answered (role
markers and separators: about 5 in Llama 3, Gemma and ChatML templates)."""


class CostLimitReached(Exception):
    """A request would have taken the dollars spent past the cost limit, so it was not sent.
    The answers that arrived are committed (a rerun reads them back for nothing); `spent` is
    the dollars spent in all, the `before` of earlier runs included, and `limit` the limit."""

    def __init__(self, spent: float, limit: float, *, needed: float) -> None:
        super().__init__(
            f"cost limit reached: ${spent:.4f} spent of the ${limit:.4f} allowed; the next request "
            f"could cost up to ${needed:.4f}"
        )
        self.spent = spent
        self.limit = limit
        self.needed = needed


@dataclass(frozen=True)
class TokenBound:
    """At most this many tokens for one request: prompt (every body's) and generated, and the
    same per body sent."""

    prompt: int
    completion: int
    bodies: tuple[tuple[int, int], ...] = ()


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string in a JSON value (roles and keys' values included: more than
    the text a template renders, which is what makes it a bound)."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, Mapping):
        return sum(_text_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_bytes(v) for v in value)
    return len(json.dumps(value).encode("utf-8")) if value is not None else 0


def _shape(body: Mapping[str, Any]) -> tuple[int, int]:
    """(messages, text bytes) of one body: a chat request's messages and template arguments
    (`chat_template_kwargs` may put text into the prompt), or a completion's prompt (0 messages)."""
    if "messages" in body:
        messages = body["messages"]
        text = _text_bytes(messages) + _text_bytes(body.get("chat_template_kwargs"))
        return len(messages), text
    return 0, _text_bytes(body.get("prompt"))


class Spend:
    """One client's dollars: `spent` by this client (from the answers' token counts), `before`
    it (earlier runs of the same run folder), and, with a `limit`, the reservations in flight.

    The bound of a request's cost (`bound`) rests on two assumptions, stated here because the
    limit is only as good as they are:

    1. A tokenizer never makes more tokens of a text than it has UTF-8 bytes, plus one per
       message: true of byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2: every token covers at
       least one byte) and of SentencePiece with byte fallback (Llama 2, Gemma: a piece covers at
       least one character, and the dummy prefix adds one).
    2. The chat template adds a fixed number of tokens per message count: then what it adds to a
       request of n messages is at most the prompt tokens of any answered request of n' messages
       plus `PER_MESSAGE` for each message beyond n' (the answer's text tokens are >= 0), and at
       most `FIRST_OVERHEAD` plus `PER_MESSAGE` per message before any answer.

    Generated tokens are bounded by each body's `max_tokens` (times its `n`). A request that got
    no answer (a timeout, a dropped connection) is charged its bound, since the server may have
    done the work; one refused with an error status costs nothing; a count an answer does not
    report is charged that body's bound. So `spent` is never below the dollars the answers'
    counts say."""

    def __init__(self, price: Price, *, limit: float | None = None, before: float = 0.0) -> None:
        if limit is not None and not (limit >= 0):  # NaN is refused too
            raise ConfigError(f"a cost limit must be 0 or more dollars, not {limit!r}", setting="cost_limit")
        self.price = price
        self.limit = limit
        self.before = before
        self.prompt_tokens = 0  # reported by the answers (or bounds, see above)
        self.completion_tokens = 0
        self.requests = 0  # HTTP requests settled
        self._reserved = 0.0  # dollars of the reservations in flight
        self._open = 0  # reservations in flight (a count: the dollars' float sum may not return to 0)
        self._overhead: dict[int, int] = {}  # messages -> the least prompt tokens an answer reported
        self._waiting: list[asyncio.Future[None]] = []  # reservations waiting for others to settle
        # Called after each reservation closes (what was spent may have changed): a run keeps
        # its record of the dollars current with it, so a hard kill loses little of it.
        self.on_close: Callable[[], None] | None = None

    @property
    def spent(self) -> float:
        """Dollars this client spent."""
        return self.price.usd(self.prompt_tokens, self.completion_tokens)

    @property
    def total(self) -> float:
        """Dollars spent in all: earlier runs' and this client's."""
        return self.before + self.spent

    @property
    def bounded(self) -> bool:
        """Whether a request's bound matters: there is a limit to hold, or a price to charge a
        request left without an answer (free and unlimited, every bound is $0)."""
        return self.limit is not None or not self.price.free

    @property
    def reserved(self) -> float:
        return self._reserved

    def bound(self, request: Request) -> TokenBound:
        """The most tokens `request` can be billed for (see the class's assumptions)."""
        bodies = []
        for body in request.bodies:
            messages, text = _shape(body)
            max_tokens = body.get("max_tokens")
            if not isinstance(max_tokens, int) or max_tokens < 0:
                raise ConfigError("a request without max_tokens has no bounded cost", setting="max_tokens")
            prompt = text + messages + self._template_overhead(messages)
            bodies.append((prompt, max_tokens * int(body.get("n", 1))))
        return TokenBound(sum(p for p, _ in bodies), sum(c for _, c in bodies), tuple(bodies))

    def _template_overhead(self, messages: int) -> int:
        seen = [least + PER_MESSAGE * max(0, messages - n) for n, least in self._overhead.items()]
        return min(seen) if seen else FIRST_OVERHEAD + PER_MESSAGE * messages

    async def reserve(self, request: Request) -> Reservation:
        """Hold what `request` can cost. When the spent dollars, the reservations in flight and
        this one would pass the limit, wait for those in flight to settle; CostLimitReached, with
        nothing held, once none is in flight and it still does not fit."""
        while True:
            try:
                return self.reserve_now(request)
            except CostLimitReached:
                if self._open == 0:
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def reserve_now(self, request: Request) -> Reservation:
        """Hold what `request` can cost; CostLimitReached, with nothing held, when the spent
        dollars, the reservations in flight and this one would pass the limit."""
        bound = self.bound(request) if self.bounded else TokenBound(0, 0)
        usd = self.price.usd(bound.prompt, bound.completion)
        if self.limit is not None and self.total + self._reserved + usd > self.limit:
            raise CostLimitReached(self.total, self.limit, needed=usd)
        self._reserved += usd
        self._open += 1
        return Reservation(self, request, bound, usd)

    def _settled(self) -> None:
        """A reservation closed: the reservations waiting look again."""
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def _learn(self, body: Mapping[str, Any], prompt_tokens: int) -> None:
        """Keep, per message count, the least prompt tokens a body was billed: a bound of what
        the template adds (a body's text tokens are >= 0)."""
        messages = _shape(body)[0]
        self._overhead[messages] = min(self._overhead.get(messages, prompt_tokens), prompt_tokens)

    def __repr__(self) -> str:
        limit = "none" if self.limit is None else f"${self.limit:.4f}"
        return f"Spend(spent=${self.total:.4f}, reserved=${self._reserved:.4f}, limit={limit})"


class _Unanswered:
    """A body's outcome while it has none: sent, no answer yet (a timeout, a dropped connection
    or a cancellation leaves it so, and it is charged its bound)."""

    def __repr__(self) -> str:
        return "IN_FLIGHT"


IN_FLIGHT = _Unanswered()
REFUSED = None  # an error status: the server did no billable work


class Reservation:
    """What one attempt may cost, held until it closes: the bound of every body the attempt may
    send (`request.bodies`, in the order they are sent). The sender marks each body it sends
    (`sending`) and its outcome (`answered`, `refused`); `close` charges each sent body what its
    answer reports (that body's bound for a count it does not report), its bound when it got no
    answer, nothing when refused or never sent, and frees the rest. Closing twice does nothing."""

    def __init__(self, spend: Spend, request: Request, bound: TokenBound, usd: float) -> None:
        self._spend = spend
        self._request = request
        self._bound = bound
        self._usd = usd
        self.open = True
        self.outcomes: list[Any] = []  # per body sent, in order: its answer, IN_FLIGHT or REFUSED

    def sending(self) -> int:
        """The next body leaves now: from here it may be billed. Its index, for its outcome."""
        self.outcomes.append(IN_FLIGHT)
        return len(self.outcomes) - 1

    def answered(self, index: int, payload: Any) -> None:
        self.outcomes[index] = payload

    def refused(self) -> None:
        """The body in flight was answered with an error status: not billed."""
        if self.outcomes and self.outcomes[-1] is IN_FLIGHT:
            self.outcomes[-1] = REFUSED

    def _body_bound(self, index: int) -> tuple[int, int]:
        bodies = self._bound.bodies
        if index < len(bodies):
            return bodies[index]
        return max(bodies, default=(self._bound.prompt, self._bound.completion))

    def close(self) -> None:
        """Charge what the bodies sent may have cost (see the class) and free the reservation."""
        if not self.open:
            return
        self.open = False
        spend = self._spend
        for index, outcome in enumerate(self.outcomes):
            if outcome is REFUSED:
                continue
            prompt_bound, completion_bound = self._body_bound(index)
            usage = outcome.get("usage") if isinstance(outcome, dict) else None
            usage = usage if isinstance(usage, dict) else {}
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            reported = isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0
            spend.prompt_tokens += prompt if reported else prompt_bound
            ok = isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0
            spend.completion_tokens += completion if ok else completion_bound
            if reported and index < len(self._request.bodies):
                spend._learn(self._request.bodies[index], prompt)
        spend.requests += len(self.outcomes)
        spend._open -= 1
        spend._reserved = spend._reserved - self._usd if spend._open else 0.0
        spend._settled()
        if spend.on_close is not None:
            spend.on_close()
