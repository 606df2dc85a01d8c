"""The guarantee online: LTT certified a risk (the delegation rate, or the cascade's error) under
the calibration distribution. A `RateWatch` follows the realised rate over a sliding window of
recent requests and raises an alarm when the exact (Clopper-Pearson) lower confidence bound of the
window's rate passes the certified level: the new traffic does not look like the calibration data.

False alarms: a look alarms with probability at most `level` when the true rate is at most the
target (the one-sided exact bound), and looks happen every `every` outcomes, so over N outcomes the
chance of any false alarm is at most level * N / every (a union bound): 1e-4 * 2000 / 50 = 0.4%.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import calibrate

__all__ = ["ALARM_LEVEL", "CHECK_EVERY", "WINDOW", "Alarm", "DelegationCap", "RateWatch"]

ALARM_LEVEL = 1e-4  # one-sided false-alarm probability of one look
CHECK_EVERY = 50  # outcomes between looks
WINDOW = 1000  # the most recent outcomes a look reads


@dataclass(frozen=True)
class Alarm:
    """The evidence of one look: k events in the window's n outcomes, the exact one-sided lower
    bound at `level`, and the certified `target` it is compared with."""

    risk: str  # "delegation" or "error"
    k: int
    n: int
    lower: float
    target: float
    level: float
    seen: int  # outcomes recorded in all when the look was taken

    @property
    def raised(self) -> bool:
        return self.lower > self.target

    def describe(self) -> str:
        return (
            f"drift: the {self.risk} rate over the last {self.n} requests is {self.k}/{self.n} = "
            f"{self.k / self.n:.3f}; its exact lower bound at level {self.level:g} is {self.lower:.3f}, "
            f"above the certified {self.target:g} (after {self.seen} requests)"
        )


class RateWatch:
    """Bernoulli outcomes in arrival order; a look every `every` of them over the last `window`."""

    def __init__(
        self,
        risk: str,
        target: float,
        *,
        window: int = WINDOW,
        every: int = CHECK_EVERY,
        level: float = ALARM_LEVEL,
    ) -> None:
        if not 0 < target <= 1 or window < 1 or every < 1 or not 0 < level < 0.5:
            raise ValueError("need 0 < target <= 1, window and every >= 1, 0 < level < 0.5")
        self.risk, self.target, self.every, self.level = risk, target, every, level
        self._recent: deque[bool] = deque(maxlen=window)
        self._count = 0  # events in the window (kept in step with the deque)
        self.seen = 0
        self.events = 0  # in all
        self.last: Alarm | None = None  # the last look
        self.first_raised: Alarm | None = None

    def add(self, event: bool) -> Alarm | None:
        """Record one outcome; returns the look's Alarm when this outcome triggered a look that
        raised it (else None)."""
        if len(self._recent) == self._recent.maxlen:
            self._count -= self._recent[0]
        self._recent.append(bool(event))
        self._count += bool(event)
        self.seen += 1
        self.events += bool(event)
        if self.seen % self.every:
            return None
        n = len(self._recent)
        # A one-sided bound at `level` is the lower end of the two-sided interval at 1 - 2 level.
        lower = calibrate.clopper_pearson(self._count, n, confidence=1 - 2 * self.level).low
        self.last = Alarm(self.risk, self._count, n, lower, self.target, self.level, self.seen)
        if self.last.raised and self.first_raised is None:
            self.first_raised = self.last
        return self.last if self.last.raised else None

    @property
    def alarm(self) -> bool:
        """Whether the last look raised the alarm (it clears at a look that does not)."""
        return self.last is not None and self.last.raised

    def interval(self, confidence: float = 0.95) -> calibrate.ProportionCI:
        """The exact interval of the rate over all outcomes so far."""
        return calibrate.clopper_pearson(self.events, self.seen, confidence=confidence)


class DelegationCap:
    """`--max-delegation-rate`: over the last `window` policy delegations-or-not, expert calls stop
    once `rate * window` of them were calls; the skipped ones are counted."""

    def __init__(self, rate: float, window: int = 200) -> None:
        if not 0 < rate <= 1 or window < 1:
            raise ValueError("--max-delegation-rate must lie in (0, 1] and the window be at least 1")
        self.rate, self.window = rate, window
        self._calls: deque[bool] = deque(maxlen=window)
        self.skipped = 0

    def allow(self, delegated: bool) -> bool:
        """Record one request; True when it may call the expert (it is delegated and under the cap)."""
        call = delegated and sum(self._calls) + 1 <= self.rate * self.window
        if delegated and not call:
            self.skipped += 1
        self._calls.append(call)
        return call
