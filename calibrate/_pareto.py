"""Pareto filtering of candidate thresholds on the (budget, objective) plane.

References
----------
Laufer-Goldshtein, Fisch, Barzilay, Jaakkola (2023). Efficiently controlling multiple
risks with Pareto testing.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["pareto_front", "pareto_members", "pareto_rows"]


def pareto_rows(budget: ArrayLike, objective: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Pareto filtering of every row of (R, N) arrays at once, minimising both coordinates.

    Returns `order` (R, N), each row's indices sorted by (budget, objective, index), and
    `keep` (R, N), aligned with `order`: True for the non-dominated points. Point i is
    dominated if some j has budget_j <= budget_i and objective_j <= objective_i with one
    strict; among exact duplicates only the smallest index is kept. O(N log N) per row.
    """
    b = np.asarray(budget, dtype=np.float64)
    o = np.asarray(objective, dtype=np.float64)
    if b.shape != o.shape or b.ndim != 2:
        raise ValueError(f"budget and objective must be 2-d of equal shape, got {b.shape}, {o.shape}")
    if np.isnan(b).any() or np.isnan(o).any():
        raise ValueError("budget and objective must not contain NaN")
    index = np.broadcast_to(np.arange(b.shape[1]), b.shape)
    order = np.lexsort((index, o, b), axis=1)
    o_sorted = np.take_along_axis(o, order, axis=1)
    # A point survives iff its objective is strictly below every objective sorted before it.
    best_before = np.minimum.accumulate(
        np.concatenate([np.full((b.shape[0], 1), np.inf), o_sorted[:, :-1]], axis=1), axis=1
    )
    return order.astype(np.int64), o_sorted < best_before


def pareto_front(budget: ArrayLike, objective: ArrayLike) -> NDArray[np.int64]:
    """Indices of the non-dominated points of (budget, objective), minimising both; see
    `pareto_rows`. Sorted by increasing budget (and so by decreasing objective).

    Parameters
    ----------
    budget, objective : float arrays of shape (N,), no NaN.
    """
    b = np.asarray(budget, dtype=np.float64)
    o = np.asarray(objective, dtype=np.float64)
    if b.shape != o.shape or b.ndim != 1:
        raise ValueError(f"budget and objective must be 1-d of equal length, got {b.shape}, {o.shape}")
    order, keep = pareto_rows(b[None, :], o[None, :])
    return order[0][keep[0]]


# Trials whose (T, T, D) dominance comparisons are made at once.
_CHUNK = 64


def pareto_members(points: ArrayLike) -> NDArray[np.bool_]:
    """The non-dominated points of every row of an (R, N, D) array, minimising all D coordinates,
    as an (R, N) mask. Point i is dominated if some j is <= in every coordinate and < in one;
    among exact duplicates only the smallest index is kept. D = 2 is `pareto_rows`; otherwise
    O(N^2 D) per row.
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"points must be 3-d (rows, points, coordinates), got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError("points must not contain NaN")
    if x.shape[2] == 2:
        order, keep = pareto_rows(x[:, :, 0], x[:, :, 1])
        members = np.zeros(x.shape[:2], dtype=bool)
        np.put_along_axis(members, order, keep, axis=1)
        return members
    earlier = np.tri(x.shape[1], k=-1, dtype=bool)  # earlier[i, j]: j < i
    out = []
    for start in range(0, x.shape[0], _CHUNK):
        part = x[start : start + _CHUNK]
        other, this = part[:, None, :, :], part[:, :, None, :]  # [r, i, j, d]: j against i
        no_worse = (other <= this).all(axis=3)
        better = (other < this).any(axis=3)
        equal = (other == this).all(axis=3)
        out.append(~((no_worse & better) | (equal & earlier[None])).any(axis=2))
    return np.concatenate(out) if out else np.zeros(x.shape[:2], dtype=bool)
