"""Counts from fractions: k = floor(f n) or round(f n), read as the user meant the fraction.

A fraction like 0.29 is stored as 0.28999999999999998 and 0.29 * 50 evaluates to
14.499999999999998; a count that is an integer (or a half) up to rounding is taken as one.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["count_at_most", "count_nearest"]

_ULPS = 4  # the decimal-to-binary error of f plus the product's rounding is about 2 ulps


def _product(fraction: ArrayLike, n: ArrayLike) -> NDArray[np.float64]:
    x = np.asarray(fraction, dtype=np.float64) * np.asarray(n, dtype=np.float64)
    return x + _ULPS * np.spacing(np.abs(x))


def count_at_most(fraction: ArrayLike, n: ArrayLike) -> NDArray[np.int64]:
    """The largest integer k with k <= f n: floor(f n)."""
    return np.floor(_product(fraction, n)).astype(np.int64)


def count_nearest(fraction: ArrayLike, n: ArrayLike) -> NDArray[np.int64]:
    """f n rounded to the nearest integer, halves up: floor(f n + 1/2)."""
    return np.floor(_product(fraction, n) + 0.5).astype(np.int64)
