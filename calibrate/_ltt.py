"""Learn-then-Test with Pareto filtering: budget control and performance control.

Both controllers take the per-threshold statistics of one calibration split (`Candidates`),
filter them on D_est, order them, test them on D_cal with exact binomial p-values, and pick
the best certified threshold on D_est's complementary objective.

References
----------
Angelopoulos et al. (2021). Learn then Test. Laufer-Goldshtein et al. (2023). Pareto testing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ._fwer import FWERMethod, FWERProcedure, control_fwer
from ._pareto import pareto_front
from ._pvalues import binomial_kstar, binomial_pvalue

__all__ = [
    "Candidates",
    "ControlMode",
    "ControlResult",
    "budget_control",
    "empirical_control",
    "performance_control",
]

ControlMode = Literal["budget", "performance", "empirical"]


@dataclass(frozen=True)
class Candidates:
    """Per-threshold statistics of one calibration split (D_est for optimisation, D_cal for tests).

    Attributes
    ----------
    thresholds : float array of shape (T,)
        Most conservative first; thresholds[0] = +inf means "never delegate".
    est_budget : float array (T,)
        Fraction delegated on D_est.
    est_objective : float array (T,)
        Empirical objective risk on D_est (1 - AUROC, or 0-1 error).
    est_error : float array (T,)
        Empirical 0-1 error of the cascade on D_est.
    cal_delegated, cal_errors : int arrays (T,)
        Delegation and 0-1 error counts on D_cal.
    n_est, n_cal : int
    """

    thresholds: NDArray[np.float64]
    est_budget: NDArray[np.float64]
    est_objective: NDArray[np.float64]
    est_error: NDArray[np.float64]
    cal_delegated: NDArray[np.int64]
    cal_errors: NDArray[np.int64]
    n_est: int
    n_cal: int


@dataclass(frozen=True)
class ControlResult:
    """What a controller certified and chose, with everything needed to audit it.

    `order` lists the candidate indices in the order they were tested; `k` and `pvalues` are
    aligned with it. `certified` holds candidate indices whose hypothesis H: R > alpha was
    rejected. `threshold` is None when no policy is returned (performance control only); for
    budget control it is +inf ("never delegate") when nothing riskier was certified.
    """

    mode: ControlMode
    alpha: float
    delta: float
    fwer: str
    pareto: bool
    threshold: float | None
    selected: int | None
    order: NDArray[np.int64]
    k: NDArray[np.int64]
    n: int
    pvalues: NDArray[np.float64]
    kstar: int
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


def _fwer_name(method: FWERMethod | FWERProcedure) -> str:
    return method if isinstance(method, str) else method.name


def _best(candidates: NDArray[np.int64], *keys: NDArray[np.float64]) -> int:
    """The candidate minimising keys lexicographically, ties to the smallest index."""
    order = np.lexsort((candidates, *(key[candidates] for key in reversed(keys))))
    return int(candidates[order[0]])


def _test(
    c: Candidates,
    mode: ControlMode,
    order: NDArray[np.int64],
    counts: NDArray[np.int64],
    alpha: float,
    delta: float,
    fwer: FWERMethod | FWERProcedure,
    pareto: bool,
) -> tuple[ControlResult, NDArray[np.int64]]:
    k = counts[order].astype(np.int64)
    pvalues = binomial_pvalue(k, c.n_cal, alpha)
    outcome = control_fwer(pvalues, delta, fwer)
    certified = order[outcome.rejected]
    result = ControlResult(
        mode=mode,
        alpha=float(alpha),
        delta=float(delta),
        fwer=_fwer_name(fwer),
        pareto=pareto,
        threshold=None,
        selected=None,
        order=order,
        k=k,
        n=c.n_cal,
        pvalues=pvalues,
        kstar=int(binomial_kstar(c.n_cal, alpha, delta)),
        certified=certified,
        stopped_at=outcome.stopped_at,
        n_est=c.n_est,
        n_cal=c.n_cal,
    )
    return result, certified


def _with_selection(result: ControlResult, c: Candidates, selected: int | None) -> ControlResult:
    threshold = None if selected is None else float(c.thresholds[selected])
    return ControlResult(**{**result.__dict__, "selected": selected, "threshold": threshold})


def _check(alpha: float, delta: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


def budget_control(
    c: Candidates,
    *,
    alpha: float,
    delta: float,
    fwer: FWERMethod | FWERProcedure = "fixed-sequence",
    pareto: bool = True,
) -> ControlResult:
    """Certify P(R_B(lambda) <= alpha) >= 1 - delta for every certified lambda, then pick the
    certified lambda with the best empirical objective on D_est.

    Candidates (Pareto-filtered on D_est over (budget, objective)) are tested from
    conservative to aggressive with p_j = P(Binomial(n_cal, alpha) <= k_j), k_j the delegation
    count on D_cal. "Never delegate" has zero risk, so it is the answer when nothing else is
    certified. pareto=False is budget-only LTT: every threshold is tested and the most
    aggressive certified one (largest D_est budget) is chosen; the objective plays no part.
    """
    _check(alpha, delta)
    candidates = pareto_front(c.est_budget, c.est_objective) if pareto else np.arange(c.thresholds.size)
    # Conservative to aggressive: increasing D_est budget, then decreasing threshold.
    order = candidates[np.lexsort((-c.thresholds[candidates], c.est_budget[candidates]))]
    result, certified = _test(c, "budget", order, c.cal_delegated, alpha, delta, fwer, pareto)
    if not certified.size:
        selected = int(np.flatnonzero(np.isposinf(c.thresholds))[0])
    elif pareto:
        selected = _best(certified, c.est_objective, c.est_budget)
    else:
        selected = _best(certified, -c.est_budget, c.thresholds)
    return _with_selection(result, c, selected)


def performance_control(
    c: Candidates,
    *,
    alpha: float,
    delta: float,
    fwer: FWERMethod | FWERProcedure = "fixed-sequence",
    pareto: bool = True,
) -> ControlResult:
    """Certify P(R_P(lambda) <= alpha) >= 1 - delta, R_P the cascade's 0-1 error, then pick the
    certified lambda with the smallest empirical budget on D_est; no policy if none is certified.

    Candidates (Pareto-filtered over (budget, error) unless pareto=False) are tested in order
    of increasing D_est error, ties by D_est budget, with k_j the error count on D_cal.
    """
    _check(alpha, delta)
    candidates = _performance_order(c, pareto)
    result, certified = _test(c, "performance", candidates, c.cal_errors, alpha, delta, fwer, pareto)
    selected = _best(certified, c.est_budget, c.est_error) if certified.size else None
    return _with_selection(result, c, selected)


def _performance_order(c: Candidates, pareto: bool) -> NDArray[np.int64]:
    candidates = pareto_front(c.est_budget, c.est_error) if pareto else np.arange(c.thresholds.size)
    return candidates[np.lexsort((candidates, c.est_budget[candidates], c.est_error[candidates]))]


def empirical_control(c: Candidates, *, alpha: float, pareto: bool = True) -> ControlResult:
    """The plug-in baseline: accept every candidate whose D_cal error k/n is at most alpha (no
    test), then pick the smallest D_est budget. Same candidates and order as performance control."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    order = _performance_order(c, pareto)
    k = c.cal_errors[order].astype(np.int64)
    accepted = order[k <= alpha * c.n_cal]
    result = ControlResult(
        mode="empirical",
        alpha=float(alpha),
        delta=float("nan"),
        fwer="none",
        pareto=pareto,
        threshold=None,
        selected=None,
        order=order,
        k=k,
        n=c.n_cal,
        pvalues=np.full(k.size, np.nan),
        kstar=int(np.floor(alpha * c.n_cal)),
        certified=accepted,
        stopped_at=None,
        n_est=c.n_est,
        n_cal=c.n_cal,
    )
    selected = _best(accepted, c.est_budget, c.est_error) if accepted.size else None
    return _with_selection(result, c, selected)
