"""Joint control: certify several risks of one threshold at once, the family-wise error at delta.

A deployment asks for "at most 20% of traffic to the expert and an error rate of at most 10%".
For each candidate lambda_j the hypothesis is H_j: R_m(lambda_j) > alpha_m for SOME risk m, and
its p-value is the largest of the risks' p-values, p_j = max_m p_jm, each from the integer loss
count of risk m on D_cal (exact binomial, or Hoeffding-Bentkus). Validity in one paragraph:
under H_j some m* has R_m* > alpha_m*, so P(p_j <= u) <= P(p_jm* <= u) <= u for every u: p_j
is a valid p-value of the union H_j (the intersection-union test, Berger 1982). The candidates
and their order are fixed on D_est, independently of D_cal, so any FWER procedure over the p_j
(fixed-sequence by default) gives P(some certified lambda has some R_m > alpha_m) <= delta:
every risk holds at every certified threshold at once, with probability at least 1 - delta.

The family is Pareto-filtered on D_est over the risks (and the selection objective when it is
not one of them), and tested in increasing order of the same max-p-value computed on D_est's
counts (Pareto testing's order). Among the certified thresholds the one with the best D_est
`objective` is chosen: "auroc" (the cascade's AUROC, as budget control), "accuracy" (fewest
errors) or "budget" (fewest expert calls); none is chosen when nothing is certified.

References
----------
Angelopoulos et al. (2021). Learn then Test, section 4 (several risks: max of p-values).
Berger (1982). Multiparameter hypothesis testing and acceptance sampling. (intersection-union)
Laufer-Goldshtein et al. (2023). Efficiently controlling multiple risks with Pareto testing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ._candidates import CandidateBatch, Candidates
from ._fwer import fwer_procedure
from ._ltt import first_by, masked_order
from ._pareto import pareto_members
from ._pvalues import pvalue_table
from ._quota import count_at_most
from ._risks import RiskCounts, candidate_risks
from ._settings import DEFAULT_JOINT_OBJECTIVE, ControlConfig

__all__ = [
    "JOINT_OBJECTIVES",
    "JointBatch",
    "JointObjective",
    "JointResult",
    "joint_control",
    "joint_control_batch",
    "joint_empirical_batch",
    "joint_family",
]

JointObjective = Literal["auroc", "accuracy", "budget"]
JOINT_OBJECTIVES: tuple[JointObjective, ...] = get_args(JointObjective)


def _tails(method: str, losses: NDArray[np.int64], n: NDArray[np.int64], alpha: float) -> NDArray[np.float64]:
    """p-values of H: R > alpha for counts (R, T) over n (R,) rows, from one table per distinct n
    (the same function the single-risk controllers tabulate). No rows: p = 1."""
    out = np.ones(losses.shape)
    for size in np.unique(n):
        rows = n == size
        if size > 0:
            out[rows] = pvalue_table(method, int(size), alpha)[losses[rows]]  # type: ignore[arg-type]
    return out


def _combined(method: str, risks: Sequence[RiskCounts], on: Literal["est", "cal"]) -> NDArray[np.float64]:
    """The per-risk p-values of every trial and candidate on D_est or D_cal, (R, T, M)."""
    return np.stack(
        [_tails(method, getattr(r, f"{on}_losses"), getattr(r, f"n_{on}"), r.alpha) for r in risks], axis=2
    )


@dataclass(frozen=True)
class JointResult:
    """What joint control certified and chose for one calibration split. `order` lists the
    candidate indices tested, in order; `pvalues` (the max over risks) and `risk_pvalues`
    (one column per risk of `levels`) are aligned with it; `certified` holds candidate indices.
    `threshold` and `selected` are None when nothing was certified."""

    levels: dict[str, float]
    delta: float
    fwer: str
    pvalue_method: str
    pareto: bool
    objective: str
    threshold: float | None
    selected: int | None
    order: NDArray[np.int64]
    pvalues: NDArray[np.float64]
    risk_pvalues: NDArray[np.float64]
    cal_losses: NDArray[np.int64]
    n_cal: dict[str, int]
    certified: NDArray[np.int64]
    stopped_at: int | None
    n_est: int

    @property
    def has_policy(self) -> bool:
        return self.threshold is not None

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready record (lists for arrays, +inf as 'inf')."""
        threshold = self.threshold
        return {
            "mode": "joint",
            "levels": dict(self.levels),
            "delta": self.delta,
            "fwer": self.fwer,
            "pvalue_method": self.pvalue_method,
            "pareto": self.pareto,
            "objective": self.objective,
            "threshold": "inf" if threshold is not None and np.isinf(threshold) else threshold,
            "selected": self.selected,
            "order": self.order.tolist(),
            "pvalues": self.pvalues.tolist(),
            "risk_pvalues": {name: self.risk_pvalues[:, m].tolist() for m, name in enumerate(self.levels)},
            "cal_losses": {name: self.cal_losses[:, m].tolist() for m, name in enumerate(self.levels)},
            "n_cal": dict(self.n_cal),
            "certified": self.certified.tolist(),
            "stopped_at": self.stopped_at,
            "n_est": self.n_est,
        }


@dataclass(frozen=True)
class JointBatch:
    """Joint control of R trials. `order` (R, T) candidate indices in testing order, the first
    n_candidates[r] tested; `pvalues` (R, T) and `risk_pvalues` (R, T, M) aligned with `order`
    (NaN beyond the family; NaN everywhere for the empirical selector); `cal_losses` (R, T, M)
    and `certified` (R, T) in candidate index space; `selected` -1 and `threshold` NaN where
    nothing was certified; `stopped_at` -1 where nothing failed."""

    levels: dict[str, float]
    delta: float
    fwer: str
    pvalue_method: str
    pareto: bool
    objective: str
    n_est: int
    n_cal: NDArray[np.int64]
    order: NDArray[np.int64]
    n_candidates: NDArray[np.int64]
    pvalues: NDArray[np.float64]
    risk_pvalues: NDArray[np.float64]
    cal_losses: NDArray[np.int64]
    certified: NDArray[np.bool_]
    stopped_at: NDArray[np.int64]
    selected: NDArray[np.int64]
    threshold: NDArray[np.float64]

    def __len__(self) -> int:
        return self.selected.size

    def trial(self, r: int) -> JointResult:
        n = int(self.n_candidates[r])
        order = self.order[r, :n]
        selected, stop = int(self.selected[r]), int(self.stopped_at[r])
        return JointResult(
            levels=dict(self.levels),
            delta=self.delta,
            fwer=self.fwer,
            pvalue_method=self.pvalue_method,
            pareto=self.pareto,
            objective=self.objective,
            threshold=None if selected < 0 else float(self.threshold[r]),
            selected=None if selected < 0 else selected,
            order=order,
            pvalues=self.pvalues[r, :n],
            risk_pvalues=self.risk_pvalues[r, :n],
            cal_losses=self.cal_losses[r, order],
            n_cal={name: int(self.n_cal[r, m]) for m, name in enumerate(self.levels)},
            certified=order[self.certified[r, order]],
            stopped_at=None if stop < 0 else stop,
            n_est=self.n_est,
        )


def _check(c: CandidateBatch, risks: Sequence[RiskCounts], objective: str) -> None:
    names = [r.name for r in risks]
    if not names:
        raise ValueError("joint control needs at least one risk level")
    if len(set(names)) != len(names):
        raise ValueError(f"each risk may be named once, got {names}")
    for r in risks:
        if r.cal_losses.shape != c.thresholds.shape:
            raise ValueError(
                f"{r.name}: counts have shape {r.cal_losses.shape}, candidates {c.thresholds.shape}"
            )
    if objective not in JOINT_OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {JOINT_OBJECTIVES}")
    if objective == "auroc" and np.isnan(c.est_objective).any():
        raise ValueError("selecting by AUROC needs candidates computed with objective 'auroc'")


def _objective_keys(c: CandidateBatch, objective: str) -> tuple[NDArray[np.float64], ...]:
    """What selection minimises, lexicographically (then the index)."""
    if objective == "auroc":
        return (c.est_objective, c.est_budget)
    if objective == "accuracy":
        return (c.est_error, c.est_budget)
    return (c.est_budget, c.est_error)


def joint_family(
    c: CandidateBatch, risks: Sequence[RiskCounts], objective: str, pareto: bool
) -> NDArray[np.bool_]:
    """The tested family (R, T): the Pareto front of D_est over the risks' rates (and the objective
    when it is not a risk), or every candidate. It reads the risks' names and D_est counts, not
    their levels: one family serves every level of the same risks."""
    if not pareto:
        return np.ones(c.thresholds.shape, bool)
    names = {r.name for r in risks}
    coordinates = [r.est_rate for r in risks]
    if objective == "auroc":
        coordinates.append(c.est_objective)
    elif {"accuracy": "error", "budget": "budget"}[objective] not in names:
        coordinates.append(_objective_keys(c, objective)[0])
    if len(coordinates) == 1:
        coordinates.append(np.zeros(c.thresholds.shape))
    return pareto_members(np.stack(coordinates, axis=2))


def _select(
    c: CandidateBatch, certified: NDArray[np.bool_], objective: str
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    selected = first_by(certified, *_objective_keys(c, objective))
    rows = np.arange(selected.size)
    return selected, np.where(selected >= 0, c.thresholds[rows, np.maximum(selected, 0)], np.nan)


@dataclass(frozen=True)
class JointTests:
    """The max-p-value tests of a family of R trials: `order` (R, T) indices in testing order,
    the first n_candidates[r] tested; `pvalues` (R, T) and `risk_pvalues` (R, T, M) aligned with
    `order` (NaN beyond the family); `certified` (R, T) in index space; `stopped_at` (R,)."""

    fwer: str
    order: NDArray[np.int64]
    n_candidates: NDArray[np.int64]
    pvalues: NDArray[np.float64]
    risk_pvalues: NDArray[np.float64]
    certified: NDArray[np.bool_]
    stopped_at: NDArray[np.int64]


def run_joint_tests(
    risks: Sequence[RiskCounts],
    members: NDArray[np.bool_],
    tie_keys: tuple[NDArray, ...],
    control: ControlConfig,
) -> JointTests:
    """Test H_j: some R_m(j) > alpha_m for the `members` (R, T) of each trial with p_j = max_m p_jm
    on D_cal, in increasing order of the same max-p-value on D_est, ties by `tie_keys` then the
    index, with `control.fwer` at `control.delta`. The order depends on D_est only."""
    est_p = _combined(control.pvalue, risks, "est").max(axis=2)
    cal_risk_p = _combined(control.pvalue, risks, "cal")
    order = masked_order(members, (est_p, *tie_keys))
    n_candidates = members.sum(axis=1).astype(np.int64)
    tested = np.arange(order.shape[1])[None, :] < n_candidates[:, None]
    risk_p = np.where(tested[:, :, None], np.take_along_axis(cal_risk_p, order[:, :, None], axis=1), np.nan)
    pvalues = risk_p.max(axis=2)
    procedure = fwer_procedure(control.fwer)
    outcome = procedure.run_batch(pvalues, control.delta)
    certified = np.zeros(outcome.rejected.shape, bool)
    np.put_along_axis(certified, order, outcome.rejected, axis=1)
    return JointTests(procedure.name, order, n_candidates, pvalues, risk_p, certified, outcome.stopped_at)


def joint_control_batch(
    c: CandidateBatch,
    risks: Sequence[RiskCounts],
    *,
    objective: JointObjective = DEFAULT_JOINT_OBJECTIVE,
    control: ControlConfig | None = None,
    members: NDArray[np.bool_] | None = None,
) -> JointBatch:
    """Certify P(R_m(lambda) <= alpha_m for every risk m and every certified lambda) >= 1 - delta
    with p_j = max_m p_jm, then pick the certified lambda with the best D_est `objective`.

    The family (Pareto-optimal on D_est unless `control.pareto` is False) is tested in
    increasing order of its D_est max-p-value, ties by D_est budget, then threshold
    (descending) and index; `control.fwer` runs over the D_cal max-p-values at `control.delta`.
    `members`: the family `joint_family` returns for these risks, when already computed.
    """
    control = control or ControlConfig()
    _check(c, risks, objective)
    members = joint_family(c, risks, objective, control.pareto) if members is None else members
    tested = run_joint_tests(risks, members, (c.est_budget, -c.thresholds), control)
    selected, threshold = _select(c, tested.certified, objective)
    return JointBatch(
        levels={r.name: r.alpha for r in risks},
        delta=float(control.delta),
        fwer=tested.fwer,
        pvalue_method=control.pvalue,
        pareto=control.pareto,
        objective=objective,
        n_est=c.n_est,
        n_cal=np.stack([r.n_cal for r in risks], axis=1),
        order=tested.order,
        n_candidates=tested.n_candidates,
        pvalues=tested.pvalues,
        risk_pvalues=tested.risk_pvalues,
        cal_losses=np.stack([r.cal_losses for r in risks], axis=2),
        certified=tested.certified,
        stopped_at=tested.stopped_at,
        selected=selected,
        threshold=threshold,
    )


def meets_levels(risks: Sequence[RiskCounts]) -> NDArray[np.bool_]:
    """The plug-in rule, untested: every risk's D_cal loss count is at most floor(alpha n), (R, T)."""
    met = np.ones(risks[0].cal_losses.shape, bool)
    for r in risks:
        met &= r.cal_losses <= count_at_most(r.alpha, r.n_cal)[:, None]
    return met


def joint_empirical_batch(
    c: CandidateBatch,
    risks: Sequence[RiskCounts],
    *,
    objective: JointObjective = DEFAULT_JOINT_OBJECTIVE,
    control: ControlConfig | None = None,
    members: NDArray[np.bool_] | None = None,
) -> JointBatch:
    """The plug-in baseline: accept every candidate of the family whose D_cal loss count is at
    most floor(alpha_m n_m) for every risk (no test), then pick by the D_est `objective`.
    Of `control` it reads `pareto` only; `members` as `joint_control_batch`."""
    pareto = (control or ControlConfig()).pareto
    _check(c, risks, objective)
    members = joint_family(c, risks, objective, pareto) if members is None else members
    accepted = members & meets_levels(risks)
    order = masked_order(members, (c.est_budget, -c.thresholds))
    selected, threshold = _select(c, accepted, objective)
    return JointBatch(
        levels={r.name: r.alpha for r in risks},
        delta=float("nan"),
        fwer="none",
        pvalue_method="none",
        pareto=pareto,
        objective=objective,
        n_est=c.n_est,
        n_cal=np.stack([r.n_cal for r in risks], axis=1),
        order=order,
        n_candidates=members.sum(axis=1).astype(np.int64),
        pvalues=np.full(order.shape, np.nan),
        risk_pvalues=np.full((*order.shape, len(risks)), np.nan),
        cal_losses=np.stack([r.cal_losses for r in risks], axis=2),
        certified=accepted,
        stopped_at=np.full(len(c), -1, dtype=np.int64),
        selected=selected,
        threshold=threshold,
    )


def joint_control(
    c: Candidates,
    *,
    budget: float | None = None,
    error: float | None = None,
    extra: Sequence[RiskCounts] = (),
    objective: JointObjective = DEFAULT_JOINT_OBJECTIVE,
    control: ControlConfig | None = None,
) -> JointResult:
    """`joint_control_batch` for one calibration split, at the budget and error levels given
    (and any `extra` risk, e.g. `missed_positives` on the same split)."""
    batch = CandidateBatch.stack([c])
    risks = [*candidate_risks(batch, budget=budget, error=error), *extra]
    return joint_control_batch(batch, risks, objective=objective, control=control).trial(0)
