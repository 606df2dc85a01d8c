"""Pareto filtering of candidate thresholds on the (budget, objective) plane.

References
----------
Laufer-Goldshtein, Fisch, Barzilay, Jaakkola (2023). Efficiently controlling multiple
risks with Pareto testing.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["pareto_front"]


def pareto_front(budget: ArrayLike, objective: ArrayLike) -> NDArray[np.int64]:
    """Indices of the non-dominated points when minimising both coordinates, in O(N log N).

    Point i is dominated if some j has budget_j <= budget_i and objective_j <= objective_i
    with at least one strict. Among exact duplicates the smallest index is kept, so the
    result is deterministic. Returned indices are sorted by increasing budget (and so by
    decreasing objective).

    Parameters
    ----------
    budget, objective : float arrays of shape (N,), no NaN.
    """
    b = np.asarray(budget, dtype=np.float64)
    o = np.asarray(objective, dtype=np.float64)
    if b.shape != o.shape or b.ndim != 1:
        raise ValueError(f"budget and objective must be 1-d of equal length, got {b.shape}, {o.shape}")
    if np.isnan(b).any() or np.isnan(o).any():
        raise ValueError("budget and objective must not contain NaN")
    # Sort by budget, then objective, then index; a point survives iff its objective is
    # strictly below every objective seen before it.
    if b.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(b.size), o, b))
    o_sorted = o[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], o_sorted[:-1])))
    keep = o_sorted < best_before
    return order[keep].astype(np.int64)
