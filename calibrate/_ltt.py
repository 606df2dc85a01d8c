"""Learn-then-Test with Pareto filtering: budget control and performance control.

Both controllers take the per-threshold statistics of one calibration split (`Candidates`),
filter them on D_est, order them, test them on D_cal with p-values of integer loss counts
(exact binomial by default, Hoeffding-Bentkus on request), and pick the best certified
threshold on D_est's complementary objective.

References
----------
Angelopoulos et al. (2021). Learn then Test. Laufer-Goldshtein et al. (2023). Pareto testing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._candidates import CandidateBatch, Candidates
from ._fwer import FixedSequence, fwer_procedure
from ._pareto import pareto_rows
from ._pvalues import pvalue_table
from ._quota import count_at_most
from ._settings import ControlConfig, ControlMode

__all__ = [
    "ControlBatch",
    "ControlResult",
    "budget_control",
    "budget_control_batch",
    "empirical_control",
    "empirical_control_batch",
    "performance_control",
    "performance_control_batch",
]


@dataclass(frozen=True)
class ControlResult:
    """What a controller certified and chose, with everything needed to audit it.

    `order` lists the candidate indices in the order they were tested; `k` and `pvalues` are
    aligned with it, and `pvalue_method` names the p-value ("binomial", "hb", or "none" for
    the empirical selector). `certified` holds candidate indices whose hypothesis
    H: R > alpha was rejected. `threshold` is None when no policy is returned (performance control only); for
    budget control it is +inf ("never delegate") when nothing riskier was certified. `kstar`
    is the largest count that rejects at level delta, so that under fixed-sequence testing a
    hypothesis reached in the order is rejected iff k <= kstar; it is None under Holm and
    Bonferroni, whose levels differ per hypothesis. For the empirical selector it is the
    largest accepted error count, floor(alpha n).
    """

    mode: ControlMode
    alpha: float
    delta: float
    fwer: str
    pvalue_method: str
    pareto: bool
    threshold: float | None
    selected: int | None
    order: NDArray[np.int64]
    k: NDArray[np.int64]
    n: int
    pvalues: NDArray[np.float64]
    kstar: int | None
    certified: NDArray[np.int64]
    stopped_at: int | None
    n_est: int
    n_cal: int

    @property
    def has_policy(self) -> bool:
        return self.threshold is not None

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready record (lists instead of arrays, +inf as the string 'inf')."""

        def number(x: float | None) -> float | str | None:
            return "inf" if x is not None and np.isinf(x) else x

        return {
            "mode": self.mode,
            "alpha": self.alpha,
            "delta": self.delta,
            "fwer": self.fwer,
            "pvalue_method": self.pvalue_method,
            "pareto": self.pareto,
            "threshold": number(self.threshold),
            "selected": self.selected,
            "order": self.order.tolist(),
            "k": self.k.tolist(),
            "n": self.n,
            "pvalues": self.pvalues.tolist(),
            "kstar": self.kstar,
            "certified": self.certified.tolist(),
            "stopped_at": self.stopped_at,
            "n_est": self.n_est,
            "n_cal": self.n_cal,
        }


@dataclass(frozen=True)
class ControlBatch:
    """Controller outcomes for R trials at one (alpha, delta).

    `order` (R, T): candidate indices in testing order, of which the first n_candidates[r]
    were under test; `k` and `pvalues` (R, T) are aligned with `order` (p NaN beyond the
    family). `certified` (R, T) is a mask in candidate index space. `selected` is -1 and
    `threshold` NaN where no policy is returned; `stopped_at` is -1 where nothing failed.
    """

    mode: ControlMode
    alpha: float
    delta: float
    fwer: str
    pvalue_method: str
    pareto: bool
    n: int
    kstar: int | None
    n_est: int
    n_cal: int
    order: NDArray[np.int64]
    n_candidates: NDArray[np.int64]
    k: NDArray[np.int64]
    pvalues: NDArray[np.float64]
    certified: NDArray[np.bool_]
    stopped_at: NDArray[np.int64]
    selected: NDArray[np.int64]
    threshold: NDArray[np.float64]

    def __len__(self) -> int:
        return self.selected.size

    def trial(self, r: int) -> ControlResult:
        n = int(self.n_candidates[r])
        order = self.order[r, :n]
        stop = int(self.stopped_at[r])
        selected = int(self.selected[r])
        return ControlResult(
            mode=self.mode,
            alpha=self.alpha,
            delta=self.delta,
            fwer=self.fwer,
            pvalue_method=self.pvalue_method,
            pareto=self.pareto,
            threshold=None if selected < 0 else float(self.threshold[r]),
            selected=None if selected < 0 else selected,
            order=order,
            k=self.k[r, :n],
            n=self.n,
            pvalues=self.pvalues[r, :n],
            kstar=self.kstar,
            certified=order[self.certified[r, order]],
            stopped_at=None if stop < 0 else stop,
            n_est=self.n_est,
            n_cal=self.n_cal,
        )


def _check(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


def masked_order(mask: NDArray[np.bool_], keys: tuple[NDArray, ...]) -> NDArray[np.int64]:
    """Per row, candidate indices sorted by `keys` lexicographically, then index, with the
    masked-in candidates first."""
    index = np.broadcast_to(np.arange(mask.shape[1]), mask.shape)
    masked = [np.where(mask, key, np.inf) for key in reversed(keys)]
    return np.lexsort((index, *masked), axis=1).astype(np.int64)


def first_by(mask: NDArray[np.bool_], *keys: NDArray) -> NDArray[np.int64]:
    """Per row, the masked-in index minimising `keys` (then the index); -1 if none."""
    best = masked_order(mask, keys)[:, 0]
    return np.where(mask.any(axis=1), best, -1).astype(np.int64)


def _family_order(
    in_family: NDArray[np.bool_], order_keys: tuple[NDArray, ...], counts: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Testing order per row: family members first, sorted by `order_keys` then index.
    Returns (order, family sizes, D_cal counts aligned with order)."""
    order = masked_order(in_family, order_keys)
    k = np.take_along_axis(counts, order, axis=1).astype(np.int64)
    return order, in_family.sum(axis=1).astype(np.int64), k


def _test_in_order(
    c: CandidateBatch,
    mode: ControlMode,
    in_family: NDArray[np.bool_],
    order_keys: tuple[NDArray, ...],
    counts: NDArray[np.int64],
    alpha: float,
    control: ControlConfig,
) -> ControlBatch:
    """Order the family, compute p-values from the integer D_cal counts, and run the FWER
    procedure on every row."""
    order, n_candidates, k = _family_order(in_family, order_keys, counts)
    member = np.arange(order.shape[1])[None, :] < n_candidates[:, None]
    # Every count lies in 0..n_cal: tabulate the p-values once and look the counts up.
    tail = pvalue_table(control.pvalue, c.n_cal, alpha)
    pvalues = np.where(member, tail[k], np.nan)
    procedure = fwer_procedure(control.fwer)
    outcome = procedure.run_batch(pvalues, control.delta)
    certified = np.zeros_like(outcome.rejected)
    np.put_along_axis(certified, order, outcome.rejected, axis=1)
    return ControlBatch(
        mode=mode,
        alpha=float(alpha),
        delta=float(control.delta),
        fwer=procedure.name,
        pvalue_method=control.pvalue,
        pareto=control.pareto,
        n=c.n_cal,
        # The tail is non-decreasing in k, so "k <= kstar" and "p <= delta" agree exactly.
        kstar=int(np.flatnonzero(tail <= control.delta).max(initial=-1))
        if procedure.name == FixedSequence.name
        else None,
        n_est=c.n_est,
        n_cal=c.n_cal,
        order=order,
        n_candidates=n_candidates,
        k=k,
        pvalues=pvalues,
        certified=certified,
        stopped_at=outcome.stopped_at,
        selected=np.full(len(c), -1, dtype=np.int64),
        threshold=np.full(len(c), np.nan),
    )


def _select(batch: ControlBatch, c: CandidateBatch, selected: NDArray[np.int64]) -> ControlBatch:
    rows = np.arange(selected.size)
    threshold = np.where(selected >= 0, c.thresholds[rows, np.maximum(selected, 0)], np.nan)
    return ControlBatch(**{**batch.__dict__, "selected": selected, "threshold": threshold})


def _pareto_members(budget: NDArray, objective: NDArray) -> NDArray[np.bool_]:
    """The Pareto-optimal candidates of every row, as a mask in candidate index space."""
    order, keep = pareto_rows(budget, objective)
    members = np.zeros(budget.shape, dtype=bool)
    np.put_along_axis(members, order, keep, axis=1)
    return members


def budget_control_batch(
    c: CandidateBatch,
    *,
    alpha: float,
    control: ControlConfig | None = None,
) -> ControlBatch:
    """Certify P(R_B(lambda) <= alpha) >= 1 - delta for every certified lambda, then pick the
    certified lambda with the best empirical objective on D_est; for each of R trials.

    Candidates (Pareto-filtered on D_est over (budget, objective)) are tested from
    conservative to aggressive (increasing D_est budget, then decreasing threshold) with
    p_j = P(Binomial(n_cal, alpha) <= k_j), k_j the delegation count on D_cal. "Never
    delegate" has zero risk, so it is the answer when nothing else is certified.
    With `control.pareto` False it is budget-only LTT: every threshold is tested and the most aggressive
    certified one (largest D_est budget, then smallest threshold) is chosen; the objective
    plays no part.
    """
    _check(alpha)
    control = control or ControlConfig()
    members = (
        _pareto_members(c.est_budget, c.est_objective)
        if control.pareto
        else np.ones(c.thresholds.shape, bool)
    )
    batch = _test_in_order(
        c,
        "budget",
        members,
        (c.est_budget, -c.thresholds),
        c.cal_delegated,
        alpha,
        control,
    )
    if control.pareto:
        best = first_by(batch.certified, c.est_objective, c.est_budget)
    else:
        best = first_by(batch.certified, -c.est_budget, c.thresholds)
    never = np.argmax(np.isposinf(c.thresholds), axis=1)
    return _select(batch, c, np.where(best >= 0, best, never).astype(np.int64))


def performance_control_batch(
    c: CandidateBatch,
    *,
    alpha: float,
    control: ControlConfig | None = None,
) -> ControlBatch:
    """Certify P(R_P(lambda) <= alpha) >= 1 - delta, R_P the cascade's 0-1 error, then pick the
    certified lambda with the smallest empirical budget on D_est; no policy if none is certified.

    Candidates (Pareto-filtered over (budget, error) unless `control.pareto` is False) are tested in order
    of increasing D_est error, ties by D_est budget, with k_j the error count on D_cal.
    """
    _check(alpha)
    control = control or ControlConfig()
    members = (
        _pareto_members(c.est_budget, c.est_error) if control.pareto else np.ones(c.thresholds.shape, bool)
    )
    batch = _test_in_order(
        c,
        "performance",
        members,
        (c.est_error, c.est_budget),
        c.cal_errors,
        alpha,
        control,
    )
    return _select(batch, c, first_by(batch.certified, c.est_budget, c.est_error))


def empirical_control_batch(
    c: CandidateBatch, *, alpha: float, control: ControlConfig | None = None
) -> ControlBatch:
    """The plug-in baseline: accept every candidate whose D_cal error k/n is at most alpha (no
    test), then pick the smallest D_est budget. Same candidates and order as performance control
    (of `control` it reads `pareto` only)."""
    _check(alpha)
    pareto = (control or ControlConfig()).pareto
    members = _pareto_members(c.est_budget, c.est_error) if pareto else np.ones(c.thresholds.shape, bool)
    order, n_candidates, k = _family_order(members, (c.est_error, c.est_budget), c.cal_errors)
    accepted = members & (c.cal_errors <= count_at_most(alpha, c.n_cal))
    plug_in = ControlBatch(
        mode="empirical",
        alpha=float(alpha),
        delta=float("nan"),
        fwer="none",
        pvalue_method="none",
        pareto=pareto,
        n=c.n_cal,
        kstar=int(count_at_most(alpha, c.n_cal)),
        n_est=c.n_est,
        n_cal=c.n_cal,
        order=order,
        n_candidates=n_candidates,
        k=k,
        pvalues=np.full(order.shape, np.nan),
        certified=accepted,
        stopped_at=np.full(len(c), -1, dtype=np.int64),
        selected=np.full(len(c), -1, dtype=np.int64),
        threshold=np.full(len(c), np.nan),
    )
    return _select(plug_in, c, first_by(accepted, c.est_budget, c.est_error))


def budget_control(
    c: Candidates,
    *,
    alpha: float,
    control: ControlConfig | None = None,
) -> ControlResult:
    """`budget_control_batch` for one calibration split."""
    batch = CandidateBatch.stack([c])
    return budget_control_batch(batch, alpha=alpha, control=control).trial(0)


def performance_control(
    c: Candidates,
    *,
    alpha: float,
    control: ControlConfig | None = None,
) -> ControlResult:
    """`performance_control_batch` for one calibration split."""
    batch = CandidateBatch.stack([c])
    return performance_control_batch(batch, alpha=alpha, control=control).trial(0)


def empirical_control(c: Candidates, *, alpha: float, control: ControlConfig | None = None) -> ControlResult:
    """`empirical_control_batch` for one calibration split."""
    return empirical_control_batch(CandidateBatch.stack([c]), alpha=alpha, control=control).trial(0)
