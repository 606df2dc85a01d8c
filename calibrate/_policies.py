"""Delegation policies: signals, merge rules, the cascade output, top-k and central-k selection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._quota import count_nearest
from ._settings import N_GRID

__all__ = [
    "DEFAULT_POLICIES",
    "MERGE_RULES",
    "POLICIES",
    "POLICY_NAMES",
    "CalibratedPolicyName",
    "MergeRule",
    "Policy",
    "PolicyName",
    "batch_ranks",
    "cascade_scores",
    "median_rank_signal",
    "merge_scores",
    "threshold_grid",
    "topk_mask",
    "uncertainty_signal",
]

MergeRule = Literal["overwrite", "average"]
MERGE_RULES: tuple[str, ...] = get_args(MergeRule)

CalibratedPolicyName = Literal["ctd", "unc-calibrated"]
PolicyName = Literal[CalibratedPolicyName, "dv-topk", "unc-topk", "oracle-topk", "unc-central"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)  # nested Literals flatten


@dataclass(frozen=True)
class Policy:
    """A delegation strategy: which signal ranks inputs, how the delegated set is chosen, and
    how probe and expert scores merge on delegated inputs (its default rule)."""

    name: PolicyName
    signal: Literal["dv", "uncertainty", "oracle", "median-rank"]
    mechanism: Literal["calibrated", "topk", "central"]
    merge: MergeRule

    @property
    def calibrated(self) -> bool:
        return self.mechanism == "calibrated"


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("ctd", "dv", "calibrated", "overwrite"),
        Policy("unc-calibrated", "uncertainty", "calibrated", "average"),
        Policy("dv-topk", "dv", "topk", "overwrite"),
        Policy("unc-topk", "uncertainty", "topk", "average"),
        Policy("oracle-topk", "oracle", "topk", "overwrite"),
        # McKenzie et al.: the k inputs whose probe-score rank is nearest the median of the
        # whole evaluation pool.
        Policy("unc-central", "median-rank", "central", "average"),
    )
}
DEFAULT_POLICIES: tuple[str, ...] = ("ctd", "unc-calibrated", "dv-topk", "unc-topk", "oracle-topk")


def merge_scores(probe: ArrayLike, expert: ArrayLike, rule: MergeRule) -> NDArray[np.float64]:
    """m(p, e) = e (overwrite) or (p + e) / 2 (average)."""
    p = np.asarray(probe, dtype=np.float64)
    e = np.asarray(expert, dtype=np.float64)
    if rule == "overwrite":
        return np.broadcast_to(e, np.broadcast_shapes(p.shape, e.shape)).copy()
    if rule == "average":
        return (p + e) / 2.0
    raise ValueError(f"unknown merge rule {rule!r}; choose one of {MERGE_RULES}")


def cascade_scores(
    probe: ArrayLike, expert: ArrayLike, delegated: ArrayLike, rule: MergeRule
) -> NDArray[np.float64]:
    """Cascade output: m(p, e) where delegated, p elsewhere."""
    p = np.asarray(probe, dtype=np.float64)
    return np.where(np.asarray(delegated, bool), merge_scores(p, expert, rule), p)


def uncertainty_signal(probe: ArrayLike, reference: ArrayLike) -> NDArray[np.float64]:
    """Proximity-to-median uncertainty -|F(p) - 0.5|, F the right-continuous empirical CDF of
    `reference` (the calibration probe scores). Leading axes of `reference` index trials."""
    p = np.asarray(probe, dtype=np.float64)
    ref = np.sort(np.asarray(reference, dtype=np.float64), axis=-1)
    if ref.ndim == 1:
        cdf = np.searchsorted(ref, p, side="right") / ref.size
    else:
        rows = ref.reshape(-1, ref.shape[-1])
        probes = np.broadcast_to(p, ref.shape[:-1] + p.shape[-1:]).reshape(rows.shape[0], -1)
        cdf = np.stack([np.searchsorted(r, q, side="right") for r, q in zip(rows, probes, strict=True)])
        cdf = cdf.reshape(ref.shape[:-1] + p.shape[-1:]) / ref.shape[-1]
    return -np.abs(cdf - 0.5)


def median_rank_signal(probe: ArrayLike) -> NDArray[np.float64]:
    """-|r - (N-1)/2| with r the 0-based rank of each probe score in its pool (ties by position)."""
    p = np.asarray(probe, dtype=np.float64)
    rank = np.empty(p.shape, dtype=np.float64)
    order = np.argsort(p, axis=-1, kind="stable")
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(p.shape[-1]), p.shape), axis=-1)
    return -np.abs(rank - (p.shape[-1] - 1) / 2.0)


def topk_mask(signal: ArrayLike, budgets: ArrayLike, batch_size: int) -> NDArray[np.bool_]:
    """Per consecutive batch of `batch_size` inputs, delegate the k = round(budget * b) with the
    highest signal (b the batch's size; ties go to the earlier input).

    Parameters
    ----------
    signal : float array of shape (n,), in arrival order.
    budgets : float array of shape (A,).

    Returns
    -------
    mask : bool array of shape (A, n).
    """
    a = np.atleast_1d(np.asarray(budgets, dtype=np.float64))
    rank = batch_ranks(signal, batch_size)
    n = rank.size
    batch = np.arange(n) // batch_size
    starts = np.arange(0, n, batch_size)
    sizes = np.minimum(batch_size, n - starts)
    k = count_nearest(a[:, None], sizes[None, :])  # (A, n_batches)
    return rank[None, :] < k[:, batch]


def batch_ranks(signal: ArrayLike, batch_size: int) -> NDArray[np.int64]:
    """Per consecutive batch of `batch_size` inputs, each input's 0-based rank by decreasing
    signal (ties go to the earlier input): top-k delegates the inputs of rank < k.

    Parameters
    ----------
    signal : float array of shape (n,), in arrival order.

    Returns
    -------
    rank : int array of shape (n,).
    """
    s = np.asarray(signal, dtype=np.float64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n = s.size
    batch = np.arange(n) // batch_size
    order = np.lexsort((np.arange(n), -s, batch))
    starts = np.arange(0, n, batch_size)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - starts[batch[order]]
    return rank


def threshold_grid(
    signal: ArrayLike, n_grid: int = N_GRID, *, presorted: bool = False
) -> NDArray[np.float64]:
    """Candidate thresholds, most conservative first: [+inf (never delegate), then the
    quantiles of the given signal at levels 1, ..., 0 (n_grid values)].

    Quantiles interpolate linearly between order statistics (numpy's default method).
    Leading axes of `signal` index trials; the result has shape (..., n_grid + 1). With
    presorted=True the signal's last axis is already in increasing order.
    """
    s = np.asarray(signal, dtype=np.float64)
    s = s if presorted else np.sort(s, axis=-1)
    position = np.linspace(1.0, 0.0, n_grid) * (s.shape[-1] - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, s.shape[-1] - 1)
    fraction = position - low
    below, above = s[..., low], s[..., high]
    gap = above - below
    # Interpolate from the nearer end (as numpy does) so the grid stays monotone and within
    # [below, above] whatever the rounding.
    q = np.where(fraction >= 0.5, above - gap * (1 - fraction), below + gap * fraction)
    never = np.full((*q.shape[:-1], 1), np.inf)
    return np.concatenate([never, q], axis=-1)
