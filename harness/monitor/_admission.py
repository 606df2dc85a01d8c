"""Load shedding in front of the forward pass. A request is admitted only if the time it would
wait for its forward result is bounded: with P requests already admitted, batches of at most B,
and a forward batch of n conversations costing about o + c * n seconds, the newcomer is done after
about ceil((P + 1) / B) * o + (P + 1) * c. It is refused at once (`Overloaded`, with that wait as
Retry-After) when this exceeds `max_queue`, or when P reaches `max_pending`; a request that finds
the queue empty is always admitted. A refused request has cost nothing: no tokenisation, no
forward pass, no expert call.

o (per-batch overhead) and c (per conversation) are measured, not configured: a least-squares
line through recent batches' (size, wall time), exponentially weighted so that it follows the
machine's load. Fitting the overhead apart matters: charging it to each conversation of a small
batch would keep batches small (a pessimistic queue admits few, so batches stay small) and cap
throughput far below what full batches give. While batch sizes have not varied enough to fit a
line, the cost is charged per conversation (o = 0). Until the first batch is measured, at most
one batch (B requests) is admitted: a burst that arrives first must not queue blind.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ._errors import Overloaded

__all__ = ["MAX_PENDING", "MAX_QUEUE_SECONDS", "Admission", "QueueState"]

MAX_QUEUE_SECONDS = 1.0  # default expected-wait bound (--max-queue-ms 1000)
MAX_PENDING = 512  # default hard cap on admitted, unfinished forward requests (--max-pending)
SMOOTHING = 0.1  # each batch's weight decays by this per later batch: about the last 20 count
SPREAD = 0.25  # the sizes' weighted variance (in conversations^2) needed to fit a line


@dataclass(frozen=True)
class QueueState:
    """What /metrics shows of the queue at one moment."""

    pending: int  # admitted requests not yet through the forward pass (tokenising or queued)
    seconds_per_batch: float | None  # fitted forward overhead o; None before the first batch
    seconds_per_item: float | None  # fitted forward cost per conversation c
    expected_wait: float | None  # a newcomer's wait for its forward result (see the module)
    shed: int  # requests refused so far


class Admission:
    """Counts admitted requests and refuses one whose expected wait passes the bound (see above)."""

    def __init__(
        self, *, max_queue: float = MAX_QUEUE_SECONDS, max_pending: int = MAX_PENDING, max_batch: int = 32
    ) -> None:
        if not (0 < max_queue < math.inf) or max_pending < 1 or max_batch < 1:
            raise ValueError("need finite max_queue seconds above 0, max_pending and max_batch at least 1")
        self.max_queue = max_queue
        self.max_pending = max_pending
        self.max_batch = max_batch
        self.pending = 0
        self.shed = 0
        self._spread = random.Random()
        # Exponentially weighted sums over batches: weight, n, n^2, seconds, n * seconds.
        self._weight = self._items = self._items_sq = self._seconds = self._items_seconds = 0.0

    def cost(self) -> tuple[float, float] | None:
        """(o, c): the fitted seconds per batch and per conversation; None before any batch."""
        if self._weight == 0:
            return None
        w, n, nn, t, nt = self._weight, self._items, self._items_sq, self._seconds, self._items_seconds
        spread = w * nn - n * n
        if spread > SPREAD * w * w:  # sizes varied: fit the line
            per_item = (w * nt - n * t) / spread
            overhead = (t - per_item * n) / w
            if per_item > 0 and overhead >= 0:
                return overhead, per_item
        return 0.0, t / n  # one size seen (or a fit that makes no sense): all cost per conversation

    @property
    def seconds_per_item(self) -> float | None:
        cost = self.cost()
        return None if cost is None else cost[1]

    def expected_wait(self, ahead: int | None = None) -> float | None:
        """Seconds until the forward result of a request behind `ahead` admitted ones (default:
        all of them): ceil((ahead + 1) / batch) * o + (ahead + 1) * c."""
        cost = self.cost()
        if cost is None:
            return None
        overhead, per_item = cost
        queued = (self.pending if ahead is None else ahead) + 1
        return math.ceil(queued / self.max_batch) * overhead + queued * per_item

    def served(self, items: int, seconds: float) -> None:
        """Record one forward batch: `items` conversations in `seconds` of wall time."""
        if items < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        keep = 1 - SMOOTHING
        self._weight = keep * self._weight + 1
        self._items = keep * self._items + items
        self._items_sq = keep * self._items_sq + items * items
        self._seconds = keep * self._seconds + seconds
        self._items_seconds = keep * self._items_seconds + items * seconds

    def refusal(self) -> Overloaded | None:
        """The Overloaded a newcomer would meet now, or None when it would be admitted. Its
        Retry-After is the expected wait stretched by a random factor in [1, 2): clients refused
        together then come back spread out, not as one burst a second later."""
        wait = self.expected_wait() if self.pending else 0.0  # an empty queue always admits
        cap = self.max_pending if wait is not None else min(self.max_pending, self.max_batch)
        if self.pending < cap and (wait is None or wait <= self.max_queue):
            return None
        retry = wait if wait is not None else self.max_queue
        shown = "unknown" if wait is None else f"{wait:.1f} s"
        return Overloaded(
            f"overloaded: {self.pending} requests ahead (expected wait {shown}); retry later",
            retry_after=math.ceil(retry * (1 + self._spread.random())),
        )

    def check(self) -> None:
        """Raise the refusal a newcomer would meet now (the server asks before reading a body)."""
        refusal = self.refusal()
        if refusal is not None:
            self.shed += 1
            raise refusal

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold a place in the queue for the body's duration, or raise Overloaded at once."""
        self.check()
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    def state(self) -> QueueState:
        cost = self.cost()
        overhead, per_item = (None, None) if cost is None else cost
        return QueueState(self.pending, overhead, per_item, self.expected_wait(), self.shed)
