"""Random calibration/evaluation splits and the per-threshold statistics computed on them.

Everything here carries a leading axis R of trials (random splits), so that one code path
serves the sweep (R = 1 per seed) and guarantee validation (R = 500).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._candidates import CandidateBatch
from ._metrics import auroc, delegation_value, predict, twice_mann_whitney_u
from ._policies import MergeRule, Policy, cascade_scores, merge_scores, threshold_grid, uncertainty_signal
from ._quota import count_at_most, count_nearest
from ._settings import CAL_FRACTION, EST_FRACTION, N_GRID

__all__ = [
    "OBJECTIVES",
    "Objective",
    "Scores",
    "SplitMetrics",
    "Splits",
    "counts_above",
    "error_terms",
    "evaluate_delegation",
    "policy_signal",
    "random_splits",
    "signal_reference",
    "split_chunks",
    "split_sizes",
    "threshold_candidates",
]

Objective = Literal["auroc", "accuracy"]
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)

# Trials processed together; bounds the (trials, thresholds, examples) work arrays.
_CHUNK = 128


@dataclass(frozen=True)
class Scores:
    """Scores of the examples a cascade is calibrated and evaluated on (one probe seed's test split)."""

    label: NDArray[np.int64]
    probe: NDArray[np.float64]
    expert: NDArray[np.float64]
    dv: NDArray[np.float64]
    group: NDArray[np.str_] | None = None

    def __post_init__(self) -> None:
        n = len(self.label)
        for name in ("probe", "expert", "dv"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, label has {n}")
        if self.group is not None and len(self.group) != n:
            raise ValueError(f"group has {len(self.group)} entries, label has {n}")
        if not np.isin(self.label, (0, 1)).all():
            raise ValueError("labels must be 0 or 1")
        for name in ("probe", "expert"):
            values = np.asarray(getattr(self, name), dtype=np.float64)
            if not ((values >= 0) & (values <= 1)).all():  # also rejects NaN
                raise ValueError(f"{name} scores must lie in [0, 1]")
        if not np.isfinite(np.asarray(self.dv, dtype=np.float64)).all():
            raise ValueError("dv scores must be finite")

    @property
    def n(self) -> int:
        return len(self.label)

    @property
    def value(self) -> NDArray[np.float64]:
        """The true delegation value v = (2y - 1)(expert - probe)."""
        return delegation_value(self.label, self.probe, self.expert)


@dataclass(frozen=True)
class Splits:
    """Index sets of R random splits: a calibration half cut into D_est (optimisation) and D_cal
    (testing), and the other half for evaluation. Each array has shape (R, size)."""

    est: NDArray[np.int64]
    cal: NDArray[np.int64]
    evaluation: NDArray[np.int64]

    @property
    def calibration(self) -> NDArray[np.int64]:
        return np.concatenate([self.est, self.cal], axis=1)

    @property
    def trials(self) -> int:
        return self.est.shape[0]


def split_sizes(
    n: int,
    cal_fraction: float = CAL_FRACTION,
    est_fraction: float = EST_FRACTION,
    *,
    cal_size: int | None = None,
) -> tuple[int, int, int]:
    """(n_est, n_cal, n_eval): `cal_size` examples for calibration (default floor(cal_fraction n)),
    of which round(est_fraction .) go to D_est and the rest to D_cal; the remainder is for
    evaluation."""
    n_half = int(count_at_most(cal_fraction, n)) if cal_size is None else int(cal_size)
    if not 0 <= n_half <= n:
        raise ValueError(f"a calibration sample of {n_half} does not fit in {n} examples")
    n_est = int(count_nearest(est_fraction, n_half))
    return n_est, n_half - n_est, n - n_half


def random_splits(
    n: int,
    trials: int,
    seed: int | ArrayLike,
    *,
    cal_fraction: float = CAL_FRACTION,
    est_fraction: float = EST_FRACTION,
    cal_size: int | None = None,
) -> Splits:
    """R independent uniformly random splits of range(n), from a numpy Generator seeded by the
    integer(s) `seed` (any sign: each is mapped one-to-one to a non-negative entropy word)."""
    return next(
        split_chunks(
            n,
            trials,
            seed,
            chunk=trials,
            cal_fraction=cal_fraction,
            est_fraction=est_fraction,
            cal_size=cal_size,
        )
    )


def split_chunks(
    n: int,
    trials: int,
    seed: int | ArrayLike,
    *,
    chunk: int,
    cal_fraction: float = CAL_FRACTION,
    est_fraction: float = EST_FRACTION,
    cal_size: int | None = None,
) -> Iterator[Splits]:
    """The splits of `random_splits`, `chunk` trials at a time: one generator draws them in
    sequence, so the chunks put together are exactly `random_splits(n, trials, seed)`, with
    memory bounded by chunk x n."""
    n_est, n_cal, n_eval = split_sizes(n, cal_fraction, est_fraction, cal_size=cal_size)
    if min(n_est, n_cal, n_eval) < 1:
        raise ValueError(f"{n} examples are too few to split into D_est, D_cal and evaluation")
    words = [int(s) for s in np.atleast_1d(seed)]
    rng = np.random.default_rng([2 * s if s >= 0 else -2 * s - 1 for s in words])
    for start in range(0, trials, max(1, chunk)):
        rows = min(max(1, chunk), trials - start)
        perm = rng.permuted(np.tile(np.arange(n, dtype=np.int64), (rows, 1)), axis=1)
        yield Splits(perm[:, :n_est], perm[:, n_est : n_est + n_cal], perm[:, n_est + n_cal :])


def signal_reference(policy: Policy, splits: Splits) -> NDArray[np.int64]:
    """The calibration examples a policy's signal and thresholds may be fitted on.

    Calibrated policies use D_est only: the LTT guarantee needs the candidate thresholds (and
    the signal they cut) to be independent of D_cal, the split that tests them. Top-k policies
    test nothing, so they use the whole calibration half.
    """
    return splits.est if policy.calibrated else splits.calibration


def policy_signal(
    scores: Scores, policy: Policy, splits: Splits, *, on: Scores | None = None
) -> NDArray[np.float64]:
    """The delegation signal of every example of `on` (default: `scores`), shape (R, n) (or
    (1, n) when it does not depend on the split). Uncertainty is -|F(p) - 0.5| with F the
    empirical CDF of the probe scores of the trial's `signal_reference` in `scores`, so a
    policy fitted on one table can be applied to another."""
    target = scores if on is None else on
    if policy.signal == "dv":
        return target.dv[None, :]
    if policy.signal == "oracle":
        return target.value[None, :]
    if policy.signal == "uncertainty":
        return uncertainty_signal(target.probe, scores.probe[signal_reference(policy, splits)])
    raise ValueError(f"policy {policy.name!r} has no per-example signal")


def _rows(signal: NDArray[np.float64], index: NDArray[np.int64]) -> NDArray[np.float64]:
    """signal[r, index[r]] for every trial r, with a (1, n) signal shared by all trials."""
    if signal.shape[0] == 1:
        return signal[0][index]
    return np.take_along_axis(signal, index, axis=1)


def _dense_ranks(values: NDArray[np.float64]) -> NDArray[np.signedinteger]:
    """Per row, 0-based dense ranks: equal values share a rank, order is kept."""
    dtype = np.int16 if values.shape[1] <= np.iinfo(np.int16).max else np.int32
    order = np.argsort(values, axis=1)
    ordered = np.take_along_axis(values, order, axis=1)
    step = np.concatenate([np.zeros((values.shape[0], 1), bool), ordered[:, 1:] != ordered[:, :-1]], axis=1)
    rank = np.empty(values.shape, dtype=dtype)
    np.put_along_axis(rank, order, np.cumsum(step, axis=1).astype(dtype), axis=1)
    return rank


def _auroc_path(
    probe: NDArray[np.float64], merged: NDArray[np.float64], label: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """AUROC of the cascade when the first m inputs are delegated, for m = 0..n; shape (R, n+1).

    Inputs (R, n) are in delegation order. Delegating input i changes only the pairs (i, j)
    with j of the other class, so the Mann-Whitney U moves by a sum over one row: O(n^2) per
    trial instead of a sort per threshold. With h(s, c) = 1[s > c] + 1[s >= c] (twice the
    pair score, ties counting one half), every term is a small integer and the sums are exact.
    """
    # Compare dense ranks of all 2n scores of a trial instead of the floats: the same order
    # and the same ties, in a quarter of the memory traffic.
    rank = _dense_ranks(np.concatenate([probe, merged], axis=1))
    current, merged_rank = rank[:, : probe.shape[1]].copy(), rank[:, probe.shape[1] :]
    n1 = label.sum(axis=1)
    n0 = label.shape[1] - n1
    # A positive mover gains against negatives; a negative mover loses against positives.
    against_negatives = (~label).astype(np.float32)
    against_positives = -label.astype(np.float32)
    u2 = np.empty((probe.shape[0], probe.shape[1] + 1))  # 2 U
    u2[:, 0] = twice_mann_whitney_u(probe, label)[0]
    for m in range(probe.shape[1]):
        old = current[:, m : m + 1]
        new = merged_rank[:, m : m + 1]
        dh = (new > current).view(np.int8) + (new >= current).view(np.int8)
        dh -= (old > current).view(np.int8) + (old >= current).view(np.int8)
        weight = np.where(label[:, m : m + 1], against_negatives, against_positives)
        u2[:, m + 1] = u2[:, m] + np.einsum("rn,rn->r", dh.astype(np.float32), weight)
        current[:, m] = merged_rank[:, m]
    with np.errstate(divide="ignore", invalid="ignore"):
        return u2 / (2.0 * n1 * n0)[:, None]


# Above this many D_est examples the O(n^2) path costs more than one sort per threshold.
_PATH_LIMIT = 4096


def _auroc_at(
    probe: NDArray[np.float64], merged: NDArray[np.float64], label: NDArray[np.bool_], m: NDArray[np.int64]
) -> NDArray[np.float64]:
    """AUROC of the cascade with the first m[r, j] inputs delegated, shape (R, T); inputs (R, n)
    in delegation order. The incremental path for small n, a sort per threshold for large n."""
    if probe.shape[1] <= _PATH_LIMIT:
        return np.take_along_axis(_auroc_path(probe, merged, label), m, axis=1)
    out = np.empty(m.shape)
    position = np.arange(probe.shape[1])
    for r in range(m.shape[0]):
        output = np.where(position[None, :] < m[r][:, None], merged[r], probe[r])  # (T, n)
        out[r] = auroc(output, label[r])
    return out


def error_terms(scores: Scores, merge: MergeRule) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per example: 1 if the probe alone is wrong (read at 0.5), and the change in that when the
    input is delegated: +1 if merging breaks it, -1 if it fixes it, 0 otherwise."""
    label = scores.label.astype(bool)
    wrong_probe = (predict(scores.probe) != label).astype(np.int64)
    wrong_merged = (predict(merge_scores(scores.probe, scores.expert, merge)) != label).astype(np.int64)
    return wrong_probe, wrong_merged - wrong_probe


def _count_not_above(ordered: NDArray[np.float64], thresholds: NDArray[np.float64]) -> NDArray[np.int64]:
    """#{i : ordered[r, i] <= thresholds[r, j]} for rows sorted in increasing order."""
    return np.stack(
        [np.searchsorted(row, cut, side="right") for row, cut in zip(ordered, thresholds, strict=True)]
    )


def _count_above(
    values: NDArray[np.float64], thresholds: NDArray[np.float64], weights: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """For every row r and threshold j: #{i : values[r, i] > thresholds[r, j]} and the sum of
    weights[r, i] over those i, from one sort of each row and a binary search per threshold."""
    order = np.argsort(values, axis=1)
    at_most = _count_not_above(np.take_along_axis(values, order, axis=1), thresholds)
    prefix = np.concatenate(
        [
            np.zeros((values.shape[0], 1), weights.dtype),
            np.take_along_axis(weights, order, axis=1).cumsum(axis=1),
        ],
        axis=1,
    )
    above = values.shape[1] - at_most
    return above, prefix[:, -1:] - np.take_along_axis(prefix, at_most, axis=1)


def counts_above(
    values: NDArray[np.float64], weights: NDArray[np.int64], thresholds: NDArray[np.float64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """For every row r and column j of `thresholds` (R, J): #{i : values[r, i] > thresholds[r, j]}
    and the sum of weights[r, i] over those i. `values` and `weights` have shape (R, n), or
    (1, n) for one population shared by every row (sorted once, however many rows)."""
    weights = np.broadcast_to(weights, values.shape)
    if values.shape[0] == 1:
        order = np.argsort(values[0])
        at_most = np.searchsorted(values[0][order], thresholds, side="right")
        prefix = np.concatenate([[0], weights[0][order].cumsum()])
        return values.shape[1] - at_most, prefix[-1] - prefix[at_most]
    parts = [
        _count_above(values[r : r + _CHUNK], thresholds[r : r + _CHUNK], weights[r : r + _CHUNK])
        for r in range(0, values.shape[0], _CHUNK)
    ]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def threshold_candidates(
    scores: Scores,
    signal: NDArray[np.float64],
    splits: Splits,
    *,
    merge: MergeRule,
    objective: Objective | None,
    n_grid: int = N_GRID,
) -> CandidateBatch:
    """Per-threshold statistics on D_est and D_cal for every trial of `splits`.

    Thresholds are `threshold_grid` of the signal on the trial's D_est (independent of D_cal,
    which tests them). On D_est: budget, 0-1 error and the objective risk (1 - AUROC, the
    error, or NaN when `objective` is None because no caller needs it; a one-class D_est
    counts as AUROC 0). On D_cal: integer delegation and error counts.
    """
    if objective is not None and objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    merged_all = merge_scores(scores.probe, scores.expert, merge)
    wrong_probe, error_step = error_terms(scores, merge)
    parts: list[dict[str, NDArray]] = []
    for start in range(0, splits.trials, _CHUNK):
        part = Splits(*(a[start : start + _CHUNK] for a in (splits.est, splits.cal, splits.evaluation)))
        sig = signal if signal.shape[0] == 1 else signal[start : start + _CHUNK]
        s_est = _rows(sig, part.est)
        # D_est in decreasing signal: the inputs above threshold j are the first m_j of them.
        order = np.argsort(-s_est, axis=1, kind="stable")
        est_sorted = np.take_along_axis(part.est, order, axis=1)
        increasing = np.take_along_axis(s_est, order[:, ::-1], axis=1)
        thresholds = threshold_grid(increasing, n_grid, presorted=True)
        m = s_est.shape[1] - _count_not_above(increasing, thresholds)
        error_path = np.concatenate(
            [np.zeros((m.shape[0], 1), np.int64), np.cumsum(error_step[est_sorted], axis=1)], axis=1
        ) + wrong_probe[est_sorted].sum(axis=1, keepdims=True)
        est_error = np.take_along_axis(error_path, m, axis=1) / est_sorted.shape[1]
        if objective == "auroc":
            est_objective = 1.0 - np.nan_to_num(
                _auroc_at(
                    scores.probe[est_sorted], merged_all[est_sorted], scores.label[est_sorted].astype(bool), m
                ),
                nan=0.0,
            )
        elif objective == "accuracy":
            est_objective = est_error
        else:
            est_objective = np.full(m.shape, np.nan)

        cal_delegated, error_change = _count_above(_rows(sig, part.cal), thresholds, error_step[part.cal])
        parts.append(
            {
                "thresholds": thresholds,
                "est_budget": m / est_sorted.shape[1],
                "est_objective": est_objective,
                "est_error": est_error,
                "cal_delegated": cal_delegated.astype(np.int64),
                "cal_errors": (wrong_probe[part.cal].sum(axis=1, keepdims=True) + error_change).astype(
                    np.int64
                ),
            }
        )
    return CandidateBatch(
        **{k: np.concatenate([p[k] for p in parts]) for k in parts[0]},
        n_est=int(splits.est.shape[1]),
        n_cal=int(splits.cal.shape[1]),
    )


@dataclass(frozen=True)
class SplitMetrics:
    """Cascade metrics on evaluation sets, arrays of the delegation masks' leading shape.
    `errors` and `delegated` are the integer counts behind accuracy and the realised rate."""

    auroc: NDArray[np.float64]
    accuracy: NDArray[np.float64]
    realised: NDArray[np.float64]
    errors: NDArray[np.int64]
    delegated: NDArray[np.int64]
    n: int


def evaluate_delegation(
    scores: Scores,
    index: NDArray[np.int64],
    delegated: NDArray[np.bool_],
    merge: MergeRule,
    *,
    with_auroc: bool = True,
) -> SplitMetrics:
    """AUROC, accuracy and delegation rate of the cascade on `index` (shape (..., n_eval))
    with delegation masks of the same shape. with_auroc=False skips the AUROC (NaN), the one
    metric here that needs a sort."""
    wrong_probe, error_step = error_terms(scores, merge)
    errors = (wrong_probe[index] + np.where(delegated, error_step[index], 0)).sum(axis=-1)
    calls = delegated.sum(axis=-1)
    n = delegated.shape[-1]
    if with_auroc:
        output = cascade_scores(scores.probe[index], scores.expert[index], delegated, merge)
        area = auroc(output, scores.label[index])
    else:
        area = np.full(delegated.shape[:-1], np.nan)
    return SplitMetrics(
        auroc=area, accuracy=1.0 - errors / n, realised=calls / n, errors=errors, delegated=calls, n=n
    )
