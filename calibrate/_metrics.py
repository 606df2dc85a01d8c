"""Metrics of cascade outputs and of delegation signals. All work along the last axis."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._quota import count_nearest

__all__ = [
    "DECISION_THRESHOLD",
    "DV_TARGETS",
    "DVQuality",
    "DVTarget",
    "GroupRow",
    "accuracy",
    "auroc",
    "binary_delegation_value",
    "delegation_value",
    "dv_quality",
    "group_table",
    "mean_value_at_k",
    "predict",
]

DECISION_THRESHOLD = 0.5
"""A score s is read as the prediction 1[s >= 0.5] everywhere (accuracy, 0-1 error, v_bin)."""


DVTarget = Literal["continuous", "binary"]
"""What a DV probe learns: v = P_e(y|x) - P_p(y|x) (`delegation_value`), or v_bin = 1[probe wrong
and expert right] (`binary_delegation_value`)."""
DV_TARGETS: tuple[DVTarget, ...] = get_args(DVTarget)


def predict(scores: ArrayLike) -> NDArray[np.bool_]:
    """Hard prediction 1[s >= 0.5]."""
    return np.asarray(scores) >= DECISION_THRESHOLD


def delegation_value(label: ArrayLike, probe: ArrayLike, expert: ArrayLike) -> NDArray[np.float64]:
    """v = P_e(y|x) - P_p(y|x) = (2y - 1)(expert - probe)."""
    y = np.asarray(label)
    return (2.0 * y - 1.0) * (np.asarray(expert, np.float64) - np.asarray(probe, np.float64))


def binary_delegation_value(label: ArrayLike, probe: ArrayLike, expert: ArrayLike) -> NDArray[np.float64]:
    """v_bin = 1[probe wrong and expert right], reading scores at 0.5."""
    y = np.asarray(label).astype(bool)
    return ((predict(probe) != y) & (predict(expert) == y)).astype(np.float64)


def auroc(scores: ArrayLike, labels: ArrayLike) -> NDArray[np.float64]:
    """Area under the ROC curve along the last axis, ties counted one half:
    AUROC = (sum of positive ranks - n1 (n1 + 1) / 2) / (n1 n0), with average ranks for ties.

    `labels` broadcasts against `scores`. Rows with a single class give NaN.
    """
    twice_u, n1, n0 = twice_mann_whitney_u(scores, labels)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((n1 > 0) & (n0 > 0), twice_u / (2.0 * n1 * n0), np.nan)


def twice_mann_whitney_u(
    scores: ArrayLike, labels: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """2U = 2 (sum of positive average ranks) - n1 (n1 + 1), an integer (held exactly in a
    float up to 2^53), with the class sizes n1 and n0; along the last axis."""
    x = np.asarray(scores, dtype=np.float64)
    y = np.broadcast_to(np.asarray(labels), x.shape).astype(bool)
    n = x.shape[-1]
    order = np.argsort(x, axis=-1, kind="stable")
    xs = np.take_along_axis(x, order, axis=-1)
    ys = np.take_along_axis(y, order, axis=-1)
    position = np.arange(n)
    # Each run of equal scores shares the average of its positions: (first + last) / 2.
    changes = xs[..., 1:] != xs[..., :-1]
    starts_run = np.concatenate([np.ones((*x.shape[:-1], 1), bool), changes], axis=-1)
    ends_run = np.concatenate([changes, np.ones((*x.shape[:-1], 1), bool)], axis=-1)
    first = np.maximum.accumulate(np.where(starts_run, position, 0), axis=-1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends_run, position, n - 1), -1), axis=-1), -1)
    twice_rank = first + last + 2  # 2 x the average 1-based rank of the run: an integer
    n1 = ys.sum(axis=-1)
    n0 = n - n1
    twice_u = np.where(ys, twice_rank, 0).sum(axis=-1) - n1 * (n1 + 1)
    return twice_u.astype(np.float64), n1, n0


def accuracy(scores: ArrayLike, labels: ArrayLike) -> NDArray[np.float64]:
    """Fraction of 1[s >= 0.5] == y along the last axis."""
    y = np.asarray(labels).astype(bool)
    return (predict(scores) == y).mean(axis=-1)


@dataclass(frozen=True)
class DVQuality:
    """How well the DV score d(x) predicts the delegation value v: MSE and Spearman rank correlation."""

    mse: float
    spearman: float
    n: int


def dv_quality(dv: ArrayLike, value: ArrayLike) -> DVQuality:
    """MSE = mean (d - v)^2 and Spearman's rho between d and v: Pearson's r of their ranks, tied
    values sharing their mean rank; NaN with fewer than two examples, a NaN, or a constant input."""
    d = np.asarray(dv, dtype=np.float64)
    v = np.asarray(value, dtype=np.float64)
    if d.ndim != 1 or d.shape != v.shape:
        raise ValueError(
            f"dv and value must be one-dimensional and of one length, got {d.shape} and {v.shape}"
        )
    undefined = d.size < 2 or np.isnan(d).any() or np.isnan(v).any() or (d == d[0]).all() or (v == v[0]).all()
    rho = float("nan")
    if not undefined:
        # The ranks are exact (halves at most), and np.corrcoef of them as two columns is what
        # scipy.stats.spearmanr computes, to the bit, without importing scipy.stats (half a
        # second of `ctd eval`, in its DV stage).
        ranks = np.column_stack((_mean_ranks(d), _mean_ranks(v)))
        rho = float(np.corrcoef(ranks, rowvar=False)[1, 0])
    return DVQuality(mse=float(np.mean((d - v) ** 2)), spearman=rho, n=int(d.size))


def _mean_ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """1-based ranks of x, each run of tied values given the mean of its positions' ranks."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])  # first position of each run
    ends = np.r_[starts[1:], x.size]  # one past its last
    run = np.repeat(np.arange(starts.size), ends - starts)  # the run of each sorted position
    ranks = np.empty(x.size)
    ranks[order] = ((starts + 1 + ends) / 2)[run]  # ranks start+1..end: their mean
    return ranks


def mean_value_at_k(signal: ArrayLike, value: ArrayLike, fractions: ArrayLike) -> NDArray[np.float64]:
    """Mean v of the top-k examples ranked by `signal`, k = max(1, round(f N)), for each fraction f.

    Ties in the signal are broken by position, so the result is deterministic.
    """
    s = np.asarray(signal, dtype=np.float64)
    v = np.asarray(value, dtype=np.float64)
    order = np.lexsort((np.arange(s.size), -s))
    prefix = np.cumsum(v[order])
    k = np.clip(count_nearest(fractions, s.size), 1, s.size)
    return prefix[k - 1] / k


@dataclass(frozen=True)
class GroupRow:
    """One row of the group-conditional table: mean v of all examples of a group, and, per
    selection rule, the mean v of the selected examples and the group's delegation rate."""

    group: str
    n: int
    mean_v_all: float
    mean_v_selected: dict[str, float]
    delegation_rate: dict[str, float]


def group_table(value: ArrayLike, groups: ArrayLike, selections: Mapping[str, ArrayLike]) -> list[GroupRow]:
    """Per group g: mean v over g; for each named selection mask S, mean v over g and S
    (NaN if empty) and |g and S| / |g|."""
    v = np.asarray(value, dtype=np.float64)
    g = np.asarray(groups).astype(str)
    masks = {name: np.asarray(mask, dtype=bool) for name, mask in selections.items()}
    rows = []
    for name in np.unique(g):
        in_group = g == name
        selected_mean = {}
        rates = {}
        for rule, mask in masks.items():
            chosen = in_group & mask
            selected_mean[rule] = float(v[chosen].mean()) if chosen.any() else float("nan")
            rates[rule] = float(chosen.sum() / in_group.sum())
        rows.append(
            GroupRow(
                group=str(name),
                n=int(in_group.sum()),
                mean_v_all=float(v[in_group].mean()),
                mean_v_selected=selected_mean,
                delegation_rate=rates,
            )
        )
    return rows
