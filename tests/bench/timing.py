"""Wall-clock timing shared by the benchmarks: repeated runs after one warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable


def timings(run: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of `repeats` runs of `run`, after one untimed warm-up run (imports, caches)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times
