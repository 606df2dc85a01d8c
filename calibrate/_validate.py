"""Empirical validation of the guarantees over many random calibration/evaluation splits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ._fwer import FWERMethod
from ._ltt import ControlBatch, budget_control_batch, empirical_control_batch, performance_control_batch
from ._policies import POLICIES, MergeRule
from ._pvalues import ProportionCI, clopper_pearson
from ._quota import count_at_most
from ._splits import (
    Objective,
    Scores,
    Splits,
    evaluate_delegation,
    policy_signal,
    random_splits,
    threshold_candidates,
)

__all__ = ["SelectorSummary", "ValidationMode", "ValidationResult", "validate"]

ValidationMode = Literal["budget", "performance"]


@dataclass(frozen=True)
class SelectorSummary:
    """How one selector fared over the trials. A violation is a trial whose returned policy
    breaks the target on the evaluation half: more than floor(alpha n_eval) delegations
    (budget) or errors (performance). `violation` is unconditional (a trial without a policy
    does not violate), `conditional_violation` is over the trials that returned a policy, and
    the means are over those trials too."""

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
class ValidationResult:
    """`tested`: the LTT selector; `empirical`: the plug-in selector (performance mode only).
    `split_sizes`: (n_est, n_cal, n_eval) per probe seed. `per_trial`: one entry per trial
    (seed, threshold, realised, accuracy, selected, violated, ...)."""

    mode: ValidationMode
    policy: str
    merge: MergeRule
    fwer: str
    alpha: float
    delta: float
    objective: str | None
    pareto: bool
    split_sizes: dict[int, tuple[int, int, int]]
    tested: SelectorSummary
    empirical: SelectorSummary | None
    per_trial: dict[str, NDArray] = field(repr=False)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "policy": self.policy,
            "merge": self.merge,
            "fwer": self.fwer,
            "alpha": self.alpha,
            "delta": self.delta,
            "objective": self.objective,
            "pareto": self.pareto,
            # The smallest split over the seeds: D_cal's size bounds what can be certified.
            **{
                name: min(sizes[i] for sizes in self.split_sizes.values())
                for i, name in enumerate(("n_est", "n_cal", "n_eval"))
            },
            "splits_by_seed": {str(seed): list(sizes) for seed, sizes in self.split_sizes.items()},
            **self.tested.to_dict(),
        }
        if self.empirical is not None:
            out["empirical"] = self.empirical.to_dict()
        return out


def _summary(selected: NDArray[np.bool_], violated: NDArray[np.bool_], realised, acc) -> SelectorSummary:
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


def _outcome(
    results: ControlBatch,
    scores: Scores,
    splits: Splits,
    signal_eval: NDArray[np.float64],
    merge: MergeRule,
    mode: ValidationMode,
    alpha: float,
) -> dict[str, NDArray]:
    """Per-trial results of the chosen thresholds on the evaluation halves."""
    thresholds = results.threshold
    selected = results.selected >= 0
    delegated = signal_eval > np.where(selected, thresholds, np.inf)[:, None]
    metrics = evaluate_delegation(scores, splits.evaluation, delegated, merge, with_auroc=False)
    # A violation is a loss count above alpha n on the evaluation half, decided on integers.
    losses = metrics.delegated if mode == "budget" else metrics.errors
    return {
        "threshold": thresholds,
        "realised": metrics.realised,
        "accuracy": metrics.accuracy,
        "selected": selected,
        "violated": selected & (losses > count_at_most(alpha, metrics.n)),
    }


def validate(
    scores_by_seed: Mapping[int, Scores],
    *,
    mode: ValidationMode,
    alpha: float,
    delta: float,
    trials: int = 500,
    policy: str = "ctd",
    objective: Objective = "auroc",
    merge: MergeRule | None = None,
    pareto: bool = True,
    fwer: FWERMethod = "fixed-sequence",
    cal_fraction: float = 0.5,
    est_fraction: float = 0.3,
    n_grid: int = 100,
    seed: int = 0,
) -> ValidationResult:
    """Repeat calibration on `trials` random splits (spread round-robin over the probe seeds) and
    measure the realised risk of each returned policy on the held-out evaluation half.

    Budget mode certifies R_B <= alpha and optimises `objective`; performance mode certifies
    the 0-1 error R_P <= alpha (its Pareto objective is the error itself) and also runs the
    empirical selector on the same candidates.
    """
    if mode not in ("budget", "performance"):
        raise ValueError(f"mode must be 'budget' or 'performance', got {mode!r}")
    spec = POLICIES.get(policy)
    if spec is None or not spec.calibrated:
        calibrated = [p.name for p in POLICIES.values() if p.calibrated]
        raise ValueError(f"validation needs a calibrated policy, one of {calibrated}; got {policy!r}")
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    merge_rule: MergeRule = merge or spec.merge
    # Performance mode filters on the certified risk itself; budget-only LTT needs no objective.
    fit_objective: Objective | None = objective if mode == "budget" else "accuracy"
    if mode == "budget" and not pareto:
        fit_objective = None
    seeds = sorted(scores_by_seed)
    per_seed = np.bincount(np.arange(trials) % len(seeds), minlength=len(seeds))

    parts: list[dict[str, NDArray]] = []
    sizes: dict[int, tuple[int, int, int]] = {}
    control = budget_control_batch if mode == "budget" else performance_control_batch
    for probe_seed, count in zip(seeds, per_seed, strict=True):
        if count == 0:
            continue
        scores = scores_by_seed[probe_seed]
        splits = random_splits(
            scores.n, int(count), [seed, probe_seed], cal_fraction=cal_fraction, est_fraction=est_fraction
        )
        sizes[probe_seed] = (splits.est.shape[1], splits.cal.shape[1], splits.evaluation.shape[1])
        signal = policy_signal(scores, spec, splits)
        candidates = threshold_candidates(
            scores, signal, splits, merge=merge_rule, objective=fit_objective, n_grid=n_grid
        )
        signal = np.broadcast_to(signal, (int(count), scores.n))
        signal_eval = np.take_along_axis(signal, splits.evaluation, axis=1)
        tested = control(candidates, alpha=alpha, delta=delta, fwer=fwer, pareto=pareto)
        part = {"seed": np.full(int(count), probe_seed)}
        part |= _outcome(tested, scores, splits, signal_eval, merge_rule, mode, alpha)
        if mode == "performance":
            plug_in = empirical_control_batch(candidates, alpha=alpha, pareto=pareto)
            outcome = _outcome(plug_in, scores, splits, signal_eval, merge_rule, mode, alpha)
            part |= {f"empirical_{k}": v for k, v in outcome.items()}
        parts.append(part)
    per_trial = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def summary(prefix: str) -> SelectorSummary:
        return _summary(
            per_trial[f"{prefix}selected"],
            per_trial[f"{prefix}violated"],
            per_trial[f"{prefix}realised"],
            per_trial[f"{prefix}accuracy"],
        )

    return ValidationResult(
        mode=mode,
        policy=policy,
        merge=merge_rule,
        fwer=fwer,
        alpha=float(alpha),
        delta=float(delta),
        objective=fit_objective,
        pareto=pareto,
        split_sizes=sizes,
        tested=summary(""),
        empirical=summary("empirical_") if mode == "performance" else None,
        per_trial=per_trial,
    )
