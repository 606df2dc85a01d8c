"""The breaker of one client: stops paying retries to an endpoint that no longer answers.

Closed, it counts the items that failed at the endpoint in a row (connection, timeout, 5xx after
every retry; any answer resets the count). At `limit` it trips. Without a cooldown (a batch run)
tripping raises EndpointDown: the run ends instead of waiting out each remaining item's retries.
With a cooldown (a service) it opens: items fail at once as endpoint-down, nothing sent, for
`cooldown` seconds; then it is half-open: one item goes out as a probe (one attempt), the others
still fail at once; the probe's answer closes it, its endpoint fault opens it again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from ._errors import EndpointDown, ExpertError
from ._failure import FailureKind

__all__ = ["Breaker", "BreakerState"]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"  # cooling down: nothing is sent
    HALF_OPEN = "half-open"  # cooled down: the next item is a probe


class Breaker:
    """Shared by every item of every `score` call of one client (see the module docstring)."""

    def __init__(
        self, limit: int, *, cooldown: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.cooldown = cooldown
        self.streak = 0
        self.trips = 0  # times it opened (or raised EndpointDown), for metrics and tests
        self._clock = clock
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() < self._opened_at + (self.cooldown or 0.0):
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def admit(self) -> bool:
        """Whether the next item may be sent as the half-open probe (True) or normally (False);
        EndpointDown if it may not be sent at all."""
        state = self.state
        if state is BreakerState.CLOSED:
            return False
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        waiting = "a probe is out" if state is BreakerState.HALF_OPEN else "cooling down"
        raise EndpointDown(f"the expert is considered down after {self.limit} failures in a row ({waiting})")

    def answered(self, *, probe: bool = False) -> None:
        """The endpoint answered an item: closed again, the count starts over."""
        self.streak = 0
        self._opened_at = None
        if probe:
            self._probing = False

    def failed(self, error: ExpertError, *, probe: bool = False) -> None:
        """An item failed for good with `error`. Raises EndpointDown when a breaker without a
        cooldown trips."""
        if not FailureKind.of(error).endpoint_fault:  # it answered: it is up
            self.answered(probe=probe)
            return
        if probe or self._opened_at is not None:  # the probe (or a straggler) failed: open again
            self._probing = self._probing and not probe
            self._opened_at = self._clock()
            return
        self.streak += 1
        if self.streak < self.limit:
            return
        self.trips += 1
        if self.cooldown is None:
            raise EndpointDown(
                f"the expert stopped answering: {self.streak} items in a row failed after their "
                f"retries, the last with {error}"
            )
        self.streak = 0
        self._opened_at = self._clock()

    def abandon(self, *, probe: bool) -> None:
        """The probe ended without an outcome (cancelled): let the next item probe instead."""
        if probe:
            self._probing = False
