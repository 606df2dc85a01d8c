"""What guarantee validation returns: per selector and measurement, violation and selection
rates with exact Clopper-Pearson intervals, and the per-trial table behind them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ._policies import MergeRule
from ._pvalues import ProportionCI, PValueMethod, clopper_pearson
from ._settings import CertifiedMode

__all__ = [
    "JOINT_MODE",
    "MEASUREMENTS",
    "Measurement",
    "SelectorResult",
    "SelectorSummary",
    "ValidationMode",
    "ValidationResult",
    "summarise",
]

ValidationMode = CertifiedMode  # validation measures the modes that certify
JOINT_MODE = "joint"  # ValidationResult.mode of a joint level (every named risk at once)
Measurement = Literal["paper", "population", "fresh"]
MEASUREMENTS: tuple[Measurement, ...] = get_args(Measurement)


@dataclass(frozen=True)
class SelectorSummary:
    """How one selector fared over the trials, in one measurement. `violation` is
    unconditional (a trial without a policy does not violate), `conditional_violation` is over
    the trials that returned a policy, and the means are over those trials too."""

    trials: int
    selections: int
    violations: int
    violation: ProportionCI
    conditional_violation: ProportionCI
    selection: ProportionCI
    mean_realised_budget: float
    mean_accuracy: float

    @property
    def violation_rate(self) -> float:
        return self.violation.proportion

    @property
    def selection_rate(self) -> float:
        return self.selection.proportion

    def to_dict(self) -> dict[str, object]:
        return {
            "trials": self.trials,
            "violations": self.violations,
            "selections": self.selections,
            "violation_rate": self.violation_rate,
            "violation_ci95": [self.violation.low, self.violation.high],
            "conditional_violation_rate": self.conditional_violation.proportion,
            "conditional_violation_ci95": [self.conditional_violation.low, self.conditional_violation.high],
            "selection_rate": self.selection_rate,
            "selection_ci95": [self.selection.low, self.selection.high],
            # Means over the trials that returned a policy.
            "mean_realised_budget": self.mean_realised_budget,
            "mean_accuracy": self.mean_accuracy,
        }


@dataclass(frozen=True)
class SelectorResult:
    """One selector's returned policies, measured on the evaluation rest (`paper`), the whole
    split (`population`) and, when given, an independent table (`fresh`)."""

    paper: SelectorSummary
    population: SelectorSummary
    fresh: SelectorSummary | None = None

    def measured(self, measurement: Measurement) -> SelectorSummary | None:
        return getattr(self, measurement)

    def to_dict(self) -> dict[str, object]:
        """The paper protocol's keys at the top (as `ctd validate` always printed them), the
        other measurements under their names."""
        out = self.paper.to_dict()
        out["population"] = self.population.to_dict()
        if self.fresh is not None:
            out["fresh"] = self.fresh.to_dict()
        return out


@dataclass(frozen=True)
class ValidationResult:
    """`tested`: the LTT selector; `empirical`: the plug-in selector (performance mode only).
    `split_sizes`: (n_est, n_cal, n_eval) per probe seed; `fresh_sizes`: rows of the fresh
    table per seed. `per_trial`: one entry per trial (seed, threshold, selected, and per
    measurement the realised rate, accuracy and violation; `empirical_` columns alike).

    A joint level (`mode` "joint", `validate_joint`) names its risk levels in `levels` (alpha is
    NaN), has the empirical selector too, and `by_risk` holds, per risk, each selector's
    violations of that risk alone ("tested", "empirical"), a trial violating when any one does.
    """

    mode: ValidationMode | Literal["joint"]
    policy: str
    merge: MergeRule
    fwer: str
    pvalue_method: PValueMethod
    alpha: float
    delta: float
    objective: str | None
    pareto: bool
    seed: tuple[int, ...]
    split_sizes: dict[int, tuple[int, int, int]]
    fresh_sizes: dict[int, int] | None
    tested: SelectorResult
    empirical: SelectorResult | None
    per_trial: dict[str, NDArray] = field(repr=False)
    levels: dict[str, float] | None = None
    by_risk: dict[str, dict[str, SelectorResult]] | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "policy": self.policy,
            "merge": self.merge,
            "fwer": self.fwer,
            "pvalue_method": self.pvalue_method,
            "alpha": self.alpha,
            "delta": self.delta,
            "objective": self.objective,
            "pareto": self.pareto,
            "seed": list(self.seed),
            # The smallest split over the seeds: D_cal's size bounds what can be certified.
            **{
                name: min(sizes[i] for sizes in self.split_sizes.values())
                for i, name in enumerate(("n_est", "n_cal", "n_eval"))
            },
            "splits_by_seed": {str(seed): list(sizes) for seed, sizes in self.split_sizes.items()},
            **self.tested.to_dict(),
        }
        if self.fresh_sizes is not None:
            out["fresh_rows_by_seed"] = {str(seed): n for seed, n in self.fresh_sizes.items()}
        if self.empirical is not None:
            out["empirical"] = self.empirical.to_dict()
        if self.levels is not None:
            del out["alpha"]
            out["levels"] = dict(self.levels)
        if self.by_risk is not None:
            out["by_risk"] = {
                risk: {name: _violations(selector) for name, selector in selectors.items()}
                for risk, selectors in self.by_risk.items()
            }
        return out


def _violations(selector: SelectorResult) -> dict[str, object]:
    """Violation counts and rates of one selector per measurement (one risk of a joint level)."""
    return {
        measurement: {
            "violations": s.violations,
            "violation_rate": s.violation_rate,
            "violation_ci95": [s.violation.low, s.violation.high],
        }
        for measurement in MEASUREMENTS
        if (s := selector.measured(measurement)) is not None
    }


def summarise(selected: NDArray[np.bool_], violated: NDArray[np.bool_], realised, acc) -> SelectorSummary:
    trials = selected.size
    chosen = int(selected.sum())
    return SelectorSummary(
        trials=trials,
        selections=chosen,
        violations=int(violated.sum()),
        violation=clopper_pearson(int(violated.sum()), trials),
        conditional_violation=clopper_pearson(int(violated.sum()), chosen),
        selection=clopper_pearson(chosen, trials),
        mean_realised_budget=float(realised[selected].mean()) if chosen else float("nan"),
        mean_accuracy=float(acc[selected].mean()) if chosen else float("nan"),
    )
