"""The monitor's old drift alarm, kept as the reference the e-detector is measured against (it is
no longer in the product): every 50 outcomes, look at the last 1,000 and alarm when the exact
one-sided Clopper-Pearson lower bound of their rate at level 1e-4 is above the certified alpha.
Vectorised over the looks: the lower bound of k events in n is the `level` quantile of
Beta(k, n - k + 1), as `calibrate.clopper_pearson(k, n, confidence=1 - 2 level).low` gives it."""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["EVERY", "LEVEL", "WINDOW", "window_alarms"]

LEVEL = 1e-4  # one-sided false-alarm probability of one look
EVERY = 50  # outcomes between looks
WINDOW = 1000  # the most recent outcomes a look reads


def window_alarms(events: np.ndarray, target: float) -> np.ndarray:
    """The outcome numbers (1-based) at which a look raised the alarm, in order."""
    hits = np.asarray(events, dtype=bool)
    counts = np.concatenate([[0], np.cumsum(hits)])
    looks = np.arange(EVERY, hits.size + 1, EVERY)
    n = np.minimum(looks, WINDOW)
    k = counts[looks] - counts[looks - n]
    with np.errstate(invalid="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(LEVEL, np.maximum(k, 1), n - k + 1), 0.0)
    return looks[lower > target]
