"""Benchmark of the monitor's drift detector against the old window alarm (run by hand, not in CI):

    PYTHONPATH=. python tests/bench/bench_drift.py [STREAMS]
    PYTHONPATH=. python tests/bench/bench_drift.py --grids [STREAMS]

On the same seeded Bernoulli streams, for alpha 0.1 and 0.3, through the product's own `RateWatch`
(the e-detector, at A = 1e8, the default, and at A = 1e6) and the old sliding-window alarm
(tests/window_alarm.py: every 50 requests, the last 1,000, level 1e-4 per look):
1. False alarms: STREAMS streams of 100,000 requests at exactly the certified rate; the share of
   streams with at least one alarm, and alarms per 100,000 requests.
2. Delay: requests from the start of a 2x drift to the first alarm after it, when the drift starts
   at once and after 50,000 good requests (median and 90th percentile over STREAMS streams).
With --grids instead: the choice of betting fractions, the median delay to detect drift to 2x,
1.5x and 1.2x alpha from the start (within 20,000 requests; "inf": not in half the streams) for
a few grids of c in lambda = c / alpha, at the default A.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the old alarm lives there, not in the product
sys.path.insert(0, str(Path(__file__).parents[2]))  # first: tests/experts/ must not shadow experts
from window_alarm import window_alarms

from harness.monitor import DEFAULT_MTFA, RateWatch

# Private: the betting fractions the drift watch mixes, timed one by one.
from harness.monitor._drift import BETTING_FRACTIONS

STREAM = 100_000
GOOD_BEFORE = 50_000
AFTER = 5_000
DETECTORS = ("e-SR A=1e8", "e-SR A=1e6", "old window")


def alarm_times(detector: str, stream: np.ndarray, alpha: float) -> list[int]:
    if detector == "old window":
        return window_alarms(stream, alpha).tolist()
    mtfa = DEFAULT_MTFA if detector == "e-SR A=1e8" else 1e6
    return [a.seen for a in RateWatch("delegation", alpha, mtfa=mtfa).extend(stream)]


def delay(times: list[int], start: int) -> float:
    later = [t - start for t in times if t > start]
    return float(later[0]) if later else float("inf")


def main(streams: int) -> None:
    assert DEFAULT_MTFA == 1e8, "the table's first row names the default"
    started = time.perf_counter()
    print(f"{streams} streams per cell; delays in requests after a 2x drift starts")
    print("| alpha | detector | streams of 100k with a false alarm | false alarms per 100k |"
          " delay from start: median / p90 | delay after 50k good: median / p90 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for alpha in (0.1, 0.3):
        tag = round(alpha * 10)
        null = [np.random.default_rng([1, tag, n]).random(STREAM) < alpha for n in range(streams)]
        drifting: dict[int, list[np.ndarray]] = {}
        for before in (0, GOOD_BEFORE):
            drifting[before] = []
            for n in range(streams):
                rng = np.random.default_rng([2, tag, before, n])
                good, bad = rng.random(before) < alpha, rng.random(AFTER) < 2 * alpha
                drifting[before].append(np.concatenate([good, bad]))
        for detector in DETECTORS:
            false = [len(alarm_times(detector, s, alpha)) for s in null]
            cells = [f"{sum(f > 0 for f in false)}/{streams}", f"{np.mean(false):.3f}"]
            for before in (0, GOOD_BEFORE):
                delays = [delay(alarm_times(detector, s, alpha), before) for s in drifting[before]]
                cells.append(f"{np.median(delays):.0f} / {np.percentile(delays, 90):.0f}")
            print(f"| {alpha} | {detector} | " + " | ".join(cells) + " |")
    print(f"({time.perf_counter() - started:.0f} s)")


GRIDS = {
    "1/2..1/16": tuple(2.0**-j for j in range(1, 5)),
    "1/4..1/64": tuple(2.0**-j for j in range(2, 7)),
    "1/2..1/256 (default)": BETTING_FRACTIONS,
    "1/2..1/4096": tuple(2.0**-j for j in range(1, 13)),
}


def grids(streams: int) -> None:
    started = time.perf_counter()
    print(f"{streams} streams per cell; median requests to detect drift from the start, A = {DEFAULT_MTFA:g}")
    print("| alpha | fractions c | 2x | 1.5x | 1.2x |")
    print("|---|---|---|---|---|")
    for alpha in (0.1, 0.3):
        for name, fractions in GRIDS.items():
            cells = []
            for factor in (2.0, 1.5, 1.2):
                delays = []
                for n in range(streams):
                    rng = np.random.default_rng([4, round(alpha * 10), round(factor * 10), n])
                    stream = rng.random(20_000)
                    watch = RateWatch("delegation", alpha, fractions=fractions)
                    delays.append(delay([a.seen for a in watch.extend(stream < factor * alpha)], 0))
                cells.append(f"{np.median(delays):.0f}")
            print(f"| {alpha} | {name} | " + " | ".join(cells) + " |")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--grids"]:
        grids(int(arguments[1]) if len(arguments) > 1 else 40)
    else:
        main(int(arguments[0]) if arguments else 100)
