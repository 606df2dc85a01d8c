"""Load shedding in front of the forward pass. A request is admitted only if the wait it would see
is bounded: with P requests already admitted and a measured forward cost of s seconds per
conversation, the newcomer waits about P * s, so it is refused at once (`Overloaded`, with a
Retry-After of that wait) when P * s > `max_queue` or P >= `max_pending`. A refused request has
cost nothing: no tokenisation, no forward pass, no expert call.

The cost s is measured, not configured: an exponentially weighted mean of seconds per
conversation over recent forward batches (their wall time over their size), so it follows the
machine's current load and batch sizes. Until the first batch is measured only the count cap holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ._errors import Overloaded

__all__ = ["MAX_PENDING", "MAX_QUEUE_SECONDS", "Admission", "QueueState"]

MAX_QUEUE_SECONDS = 1.0  # default expected-wait bound (--max-queue-ms 1000)
MAX_PENDING = 512  # default hard cap on admitted, unfinished forward requests (--max-pending)
SMOOTHING = 0.2  # weight of the newest batch in the mean cost: about the last ten batches count


@dataclass(frozen=True)
class QueueState:
    """What /metrics shows of the queue at one moment."""

    pending: int  # admitted requests not yet through the forward pass (tokenising or queued)
    seconds_per_item: float | None  # measured forward cost; None before the first batch
    expected_wait: float | None  # pending * seconds_per_item
    shed: int  # requests refused so far


class Admission:
    """Counts admitted requests and refuses one whose expected wait passes the bound (see above)."""

    def __init__(self, *, max_queue: float = MAX_QUEUE_SECONDS, max_pending: int = MAX_PENDING) -> None:
        if not (0 < max_queue < math.inf) or max_pending < 1:
            raise ValueError("max_queue must be a finite number of seconds above 0, max_pending at least 1")
        self.max_queue = max_queue
        self.max_pending = max_pending
        self.pending = 0
        self.shed = 0
        self._batch_seconds: float | None = None  # smoothed wall time of one batch
        self._batch_items = 0.0  # smoothed size of one batch

    @property
    def seconds_per_item(self) -> float | None:
        if self._batch_seconds is None:
            return None
        return self._batch_seconds / self._batch_items

    def expected_wait(self, ahead: int | None = None) -> float | None:
        """Seconds a request behind `ahead` admitted ones (default: all of them) would wait."""
        cost = self.seconds_per_item
        return None if cost is None else (self.pending if ahead is None else ahead) * cost

    def served(self, items: int, seconds: float) -> None:
        """Record one forward batch: `items` conversations in `seconds` of wall time."""
        if items < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        if self._batch_seconds is None:
            self._batch_seconds, self._batch_items = seconds, float(items)
            return
        self._batch_seconds += SMOOTHING * (seconds - self._batch_seconds)
        self._batch_items += SMOOTHING * (items - self._batch_items)

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold a place in the queue for the body's duration, or raise Overloaded at once."""
        wait = self.expected_wait()
        if self.pending >= self.max_pending or (wait is not None and wait > self.max_queue):
            self.shed += 1
            retry = wait if wait is not None else self.max_queue
            shown = "unknown" if wait is None else f"{wait:.1f} s"
            raise Overloaded(
                f"overloaded: {self.pending} requests ahead (expected wait {shown}); retry later",
                retry_after=math.ceil(retry),
            )
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    def state(self) -> QueueState:
        return QueueState(self.pending, self.seconds_per_item, self.expected_wait(), self.shed)
