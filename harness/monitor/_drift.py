"""The guarantee online: LTT certified a risk (the delegation rate, or the cascade's error) under
the calibration distribution. A `RateWatch` follows the realised outcomes in arrival order with an
e-detector (Shin, Ramdas & Rinaldo, "E-detectors: a nonparametric framework for sequential change
detection", 2024): the e-Shiryaev-Roberts statistic over a mixture of betting e-processes for the
null "the rate is at most the certified alpha", and alarms when it reaches A.

The guarantee: while every outcome's rate, given the past, is at most alpha, the mean number of
outcomes to a false alarm is at least A (the mean time to false alarm, MTFA), and an alarm within
the first m outcomes has probability at most m / A. It holds at every outcome, with no horizon and
no per-look level to add up, which is what the old sliding-window test at a fixed 1e-4 per look
lacked (it false-alarmed in 7-8.5% of 100,000-request streams at the certified rate).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

import calibrate

from .._errors import InputError

__all__ = [
    "ALARM_LINE_SECONDS",
    "BETTING_FRACTIONS",
    "DEFAULT_MTFA",
    "MAX_MTFA",
    "MIN_MTFA",
    "Alarm",
    "AlarmLines",
    "DelegationCap",
    "RateWatch",
    "check_mtfa",
]

# Mean time to false alarm, in outcomes (requests for the delegation rate). 1e8 is about 116 days
# of worst-case traffic (at exactly alpha) at 10 requests/s, so a fleet of 10 replicas expects at
# most one false alarm in 11.6 days. The delay grows only like log A: tests/bench/bench_drift.py
# measured late 2x drift found in a median 340 requests at alpha 0.1 and 88 at 0.3 (1e6: 222 and
# 66, with 6-8% of 100,000-request streams false-alarming, as many as the old window alarm did;
# 1e8: none of 100), against 400 and 200 for the old window alarm.
DEFAULT_MTFA = 1e8
MIN_MTFA, MAX_MTFA = 100.0, 1e12

# Betting fractions c of the largest bet 1/alpha: lambda = c / alpha, c = 1/2, 1/4, ..., 1/256.
# A drift to the rate p is bet on best (Kelly) at c = (p - alpha) / (1 - alpha): 0.11 for 2x at
# alpha 0.1, 0.43 at 0.3, 0.022 for 1.2x at 0.1, so the grid spans large and small drifts; each
# fraction gets weight 1/8, a cost of log 8 in evidence. Measured (bench_drift.py --grids, median
# delays from the start at 2x, 1.5x, 1.2x): within 2-6% of the best of four grids in every case,
# where 1/2..1/16 missed 1.2x at alpha 0.1 and 1/4..1/64 was 20% slower at 2x at alpha 0.3.
BETTING_FRACTIONS: tuple[float, ...] = tuple(2.0**-j for j in range(1, 9))

# Under a lasting drift the statistic restarts and alarms again every few hundred requests (at
# 500 requests/s, several times a second): the process log gets one line per risk this often at
# most; every alarm is still in the decision log and counted in /metrics.
ALARM_LINE_SECONDS = 60.0


def check_mtfa(mtfa: float) -> float:
    """`--drift-mtfa`: a finite number of outcomes in [MIN_MTFA, MAX_MTFA]; one line otherwise."""
    if not (math.isfinite(mtfa) and MIN_MTFA <= mtfa <= MAX_MTFA):
        raise InputError(
            f"--drift-mtfa {mtfa:g}: the mean number of requests to a false drift alarm must lie in "
            f"[{MIN_MTFA:g}, {MAX_MTFA:g}]"
        )
    return float(mtfa)


@dataclass(frozen=True)
class Alarm:
    """The detector's evidence after one outcome: the e-SR `statistic` (mean over the betting
    fractions) since the last restart, the `threshold` A it alarms at, and the counts. `raised`
    when the statistic reached A; a statistic at the certified rate grows like the number of
    outcomes, so it reads as "outcomes' worth of evidence" against a threshold of A outcomes."""

    risk: str  # "delegation" or "error"
    target: float  # the certified alpha
    statistic: float
    threshold: float
    since: int  # outcomes since the statistic last restarted
    since_events: int  # events among them
    seen: int  # outcomes in all
    events: int  # events in all
    alarms: int  # alarms raised so far, this one included

    @property
    def raised(self) -> bool:
        return self.statistic >= self.threshold

    def describe(self) -> str:
        rate = self.since_events / self.since if self.since else 0.0
        return (
            f"drift: the {self.risk} rate is above the certified {self.target:g}: e-detector "
            f"evidence {self.statistic:.3g} >= {self.threshold:g} over the last {self.since} requests "
            f"({self.since_events}/{self.since} = {rate:.3f} over all of them: the evidence adds up bets "
            f"started at each, so a rise among the latest shows first; after {self.seen} requests in all); "
            f"traffic at the certified rate does this once per {self.threshold:g} requests at most on average"
        )


class AlarmLines:
    """Which alarms get a line in the process log: each risk's first, then at most one per `every`
    seconds, counting the alarms raised since the line before."""

    def __init__(self, every: float = ALARM_LINE_SECONDS) -> None:
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}  # risk -> (when its last line was, its alarms then)

    def line(self, alarm: Alarm, now: float) -> str | None:
        """The line for `alarm` raised at `now` (seconds on any monotonic clock), or None."""
        last = self._last.get(alarm.risk)
        if last is not None and now - last[0] < self.every:
            return None
        self._last[alarm.risk] = (now, alarm.alarms)
        unsaid = alarm.alarms - 1 - (last[1] if last is not None else 0)
        more = (
            f"; {unsaid} more {alarm.risk} alarm{'s' if unsaid > 1 else ''} since the last line "
            f"({alarm.alarms} in all; a line at most every {self.every:g} s)"
            if unsaid
            else ""
        )
        return alarm.describe() + more


def _sr_path(start: float, factors: list[float]) -> list[float]:
    """R_n = (R_{n-1} + 1) e_n from R_0 = start, one float operation order shared with `add`."""
    return list(accumulate(factors, lambda r, e: (r + 1.0) * e, initial=start))[1:]


class RateWatch:
    """Bernoulli outcomes X in arrival order, against H0: P(X = 1 | past) <= target = alpha.

    Per betting fraction c (lambda = c / alpha < 1 / alpha), e = 1 + lambda (X - alpha) is positive
    with E[e | past] <= 1 under H0. The Shiryaev-Roberts statistic R_n = (R_{n-1} + 1) e_n
    (R_0 = 0) sums the betting martingales started at every past outcome; the detector is the mean
    M_n of R_n over the fractions and alarms at the first n with M_n >= A.
    Proof of E[tau] >= A: under H0, E[M_n | past] <= M_{n-1} + 1, so M_n - n is a supermartingale;
    optional stopping at the bounded time tau ^ n gives E[tau ^ n] >= E[M_{tau ^ n}] >= A P(tau <= n),
    and n -> infinity gives E[tau] >= A (or tau is infinite with positive probability). Likewise
    M_n + m - n is a nonnegative supermartingale up to m, so Ville's inequality bounds
    P(tau <= m) <= m / A.
    After an alarm `alarm` stays True, `alarms` counts it, and the statistic restarts from 0 (a
    new stopping time: the bound holds again for the time to the next false alarm). A target of 1
    can never be exceeded: that watch only counts. The statistic never exceeds len(fractions) * A
    before a restart and never falls below the smallest e, so plain float64 is stable for any
    number of outcomes.
    """

    def __init__(
        self,
        risk: str,
        target: float,
        *,
        mtfa: float = DEFAULT_MTFA,
        fractions: tuple[float, ...] = BETTING_FRACTIONS,
    ) -> None:
        if not 0 < target <= 1 or not fractions or not all(0 < c < 1 for c in fractions):
            raise ValueError("need 0 < target <= 1 and betting fractions in (0, 1)")
        self.risk, self.target, self.threshold = risk, target, check_mtfa(mtfa)
        self._watching = target < 1
        lambdas = [c / target for c in fractions]
        self._up = [1.0 + lam * (1.0 - target) for lam in lambdas]  # e after an event
        self._down = [1.0 - lam * target for lam in lambdas]  # e after a non-event
        self._sr = [0.0] * len(fractions)
        self.statistic = 0.0
        self.since = self.since_events = 0
        self.seen = self.events = 0
        self.alarms = 0
        self.first_raised: Alarm | None = None
        self.latest_raised: Alarm | None = None

    def _mean(self, paths: list[float]) -> float:
        total = 0.0
        for value in paths:  # left to right, as `extend` sums its columns
            total += value
        return total / len(paths)

    def _raise(self) -> Alarm:
        self.alarms += 1
        alarm = self.last
        self.first_raised = self.first_raised or alarm
        self.latest_raised = alarm
        self._sr = [0.0] * len(self._sr)
        self.statistic, self.since, self.since_events = 0.0, 0, 0
        return alarm

    def add(self, event: bool) -> Alarm | None:
        """Record one outcome; returns the Alarm when this outcome raised one (else None)."""
        hit = bool(event)
        self.seen += 1
        self.events += hit
        self.since += 1
        self.since_events += hit
        if not self._watching:
            return None
        factors = self._up if hit else self._down
        self._sr = [(r + 1.0) * e for r, e in zip(self._sr, factors, strict=True)]
        self.statistic = self._mean(self._sr)
        return self._raise() if self.statistic >= self.threshold else None

    def extend(self, events: np.ndarray) -> list[Alarm]:
        """`add` for each outcome in order, vectorised over time (the same float operations, so
        the same state to the bit); returns the alarms raised."""
        hits = np.asarray(events, dtype=bool).ravel()
        raised: list[Alarm] = []
        if not self._watching:
            self.seen, self.since = self.seen + hits.size, self.since + hits.size
            count = int(hits.sum())
            self.events, self.since_events = self.events + count, self.since_events + count
            return raised
        start, block = 0, 256
        while start < hits.size:
            chunk = hits[start : start + block]
            paths = [
                np.array(_sr_path(r, np.where(chunk, up, down).tolist()))
                for r, up, down in zip(self._sr, self._up, self._down, strict=True)
            ]
            total = np.zeros(chunk.size)
            for path in paths:
                total = total + path
            means = total / len(paths)
            crossed = np.flatnonzero(means >= self.threshold)
            used = int(crossed[0]) + 1 if crossed.size else chunk.size
            count = int(chunk[:used].sum())
            self.seen, self.since = self.seen + used, self.since + used
            self.events, self.since_events = self.events + count, self.since_events + count
            self._sr = [float(path[used - 1]) for path in paths]
            self.statistic = float(means[used - 1])
            if crossed.size:
                raised.append(self._raise())
                block = 256  # the next change may be near: do not redo a long block for it
            else:
                block = min(2 * block, 16384)
            start += used
        return raised

    @property
    def alarm(self) -> bool:
        """Whether any alarm was raised (latched: it stays True after the statistic restarts)."""
        return self.alarms > 0

    @property
    def last(self) -> Alarm:
        """The evidence now."""
        return Alarm(
            self.risk,
            self.target,
            self.statistic,
            self.threshold,
            self.since,
            self.since_events,
            self.seen,
            self.events,
            self.alarms,
        )

    def interval(self, confidence: float = 0.95) -> calibrate.ProportionCI:
        """The exact interval of the rate over all outcomes so far."""
        return calibrate.clopper_pearson(self.events, self.seen, confidence=confidence)


def check_delegation_rate(rate: float) -> float:
    """`--max-delegation-rate` within [DelegationCap.MIN_RATE, 1] (NaN is not), or one line."""
    low = DelegationCap.MIN_RATE
    if not low <= rate <= 1:
        raise InputError(
            f"--max-delegation-rate {rate:g}: must lie in [{low:g}, 1] (the cap counts calls over the "
            f"last 1/R requests, {1 / low:,.0f} at most)"
        )
    return rate


class DelegationCap:
    """`--max-delegation-rate`: over the last `window` policy delegations-or-not, expert calls stop
    once `rate * window` of them were calls; the skipped ones are counted. The window is 200
    requests, or 1/rate where that is longer, so that it always holds at least one call."""

    WINDOW = 200
    MIN_RATE = 1e-4  # a window of 10,000 requests at most

    def __init__(self, rate: float) -> None:
        self.rate = check_delegation_rate(rate)
        self.window = max(self.WINDOW, math.ceil(1 / rate))
        self._calls: deque[bool] = deque(maxlen=self.window)
        self._in_window = 0  # calls among `_calls`, kept as it changes: no sum per request
        self.skipped = 0

    def resume(self, calls: list[bool]) -> None:
        """Take the window on from an earlier server's requests (oldest first, True where the
        expert was called): a restart must not give the cap an empty window, or a server that
        restarts often would call the expert on every delegated request."""
        for call in calls[-self.window :]:
            self._push(call)

    def _push(self, call: bool) -> None:
        if len(self._calls) == self.window:
            self._in_window -= self._calls[0]
        self._calls.append(call)
        self._in_window += call

    def allow(self, delegated: bool) -> bool:
        """Record one request; True when it may call the expert (it is delegated and under the cap)."""
        call = delegated and self._in_window + 1 <= self.rate * self.window
        if delegated and not call:
            self.skipped += 1
        self._push(call)
        return call
