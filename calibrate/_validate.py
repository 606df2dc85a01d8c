"""Empirical validation of the guarantees over many random calibration splits.

Each trial draws a calibration sample from a seed's test split, calibrates on it, and measures
the realised risk of the returned policy in up to three ways:

- `paper`: on the rest of the split (the paper's protocol). Finite evaluation noise inflates
  it: LTT puts the chosen risk just below alpha, and a policy whose risk is exactly alpha
  exceeds floor(alpha m) losses on m evaluation rows about half the time.
- `population`: on the whole test split the calibration sample was drawn from (the finite
  population LTT's guarantee is about); measurable on any real table.
- `fresh`: on an independent table (same columns), e.g. new rows from the same generator.

A violation is a loss count above floor(alpha m) on the m examples measured, decided on
integers: delegations in budget mode, cascade errors in performance mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ._fwer import FWERMethod, FWERProcedure, fwer_procedure
from ._ltt import ControlBatch, budget_control_batch, empirical_control_batch, performance_control_batch
from ._policies import POLICIES, MergeRule, Policy
from ._pvalues import ProportionCI, PValueMethod, clopper_pearson
from ._quota import count_at_most
from ._splits import (
    Objective,
    Scores,
    Splits,
    _rows,
    counts_above,
    error_terms,
    policy_signal,
    split_chunks,
    split_sizes,
    threshold_candidates,
)

__all__ = [
    "MEASUREMENTS",
    "Measurement",
    "SelectorResult",
    "SelectorSummary",
    "ValidationMode",
    "ValidationResult",
    "validate",
    "validate_levels",
]

ValidationMode = Literal["budget", "performance"]
Measurement = Literal["paper", "population", "fresh"]
MEASUREMENTS: tuple[str, ...] = get_args(Measurement)

# Trials whose split-dependent signal is evaluated on a fresh table at once: bounds the
# (trials, fresh rows) work array.
_FRESH_CHUNK = 32
# Trials drawn and calibrated together: chunk x examples index entries (64 MB of int64).
_WORK_ELEMENTS = 8_000_000


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
    measurement the realised rate, accuracy and violation; `empirical_` columns alike)."""

    mode: ValidationMode
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


@dataclass(frozen=True)
class _Counts:
    """Loss counts of the chosen thresholds on one measured population of `n` examples:
    delegations and cascade errors, shape (R, J) for R trials and J thresholds per trial."""

    delegated: NDArray[np.int64]
    errors: NDArray[np.int64]
    n: int


def _measure(
    scores: Scores,
    splits: Splits,
    signal: NDArray[np.float64],
    cuts: NDArray[np.float64],
    merge: MergeRule,
    policy: Policy,
    fresh: Scores | None,
) -> dict[str, _Counts]:
    """Delegation and error counts of every trial's thresholds `cuts` (R, J) (+inf: delegate
    nothing) on the evaluation rest, the whole split, and the fresh table."""
    wrong, step = error_terms(scores, merge)
    delegated, change = counts_above(signal, step[None, :], cuts)
    population = _Counts(delegated, int(wrong.sum()) + change, scores.n)
    # The evaluation rest is the split minus the calibration sample: subtract the sample's
    # counts (small) instead of counting the rest (large when the sample is a small draw).
    calibration = splits.calibration
    delegated, change = counts_above(_rows(signal, calibration), step[calibration], cuts)
    sample_errors = wrong[calibration].sum(axis=1)[:, None] + change
    out = {
        "paper": _Counts(
            population.delegated - delegated,
            population.errors - sample_errors,
            scores.n - calibration.shape[1],
        ),
        "population": population,
    }
    if fresh is not None:
        fresh_wrong, fresh_step = error_terms(fresh, merge)
        parts = []
        # A split-dependent signal (uncertainty) is a (trials, fresh rows) array: in chunks.
        chunk = splits.trials if signal.shape[0] == 1 else _FRESH_CHUNK
        for start in range(0, splits.trials, chunk):
            part = Splits(*(a[start : start + chunk] for a in (splits.est, splits.cal, splits.evaluation)))
            fresh_signal = policy_signal(scores, policy, part, on=fresh)
            parts.append(counts_above(fresh_signal, fresh_step[None, :], cuts[start : start + chunk]))
        delegated = np.concatenate([p[0] for p in parts])
        change = np.concatenate([p[1] for p in parts])
        out["fresh"] = _Counts(delegated, int(fresh_wrong.sum()) + change, fresh.n)
    return out


def _trials(
    scores: Scores,
    splits: Splits,
    probe_seed: int,
    levels: tuple[float, ...],
    *,
    mode: ValidationMode,
    spec: Policy,
    merge: MergeRule,
    objective: Objective | None,
    n_grid: int,
    delta: float,
    fwer: FWERMethod | FWERProcedure,
    pareto: bool,
    pvalue: PValueMethod,
    fresh: Scores | None,
) -> list[dict[str, NDArray]]:
    """Calibrate every trial of `splits` at every level and measure the returned policies: per
    level, the per-trial columns (the empirical selector's prefixed `empirical_`)."""
    signal = policy_signal(scores, spec, splits)
    candidates = threshold_candidates(scores, signal, splits, merge=merge, objective=objective, n_grid=n_grid)
    control = budget_control_batch if mode == "budget" else performance_control_batch
    prefixes = ("", "empirical_") if mode == "performance" else ("",)
    chosen: list[ControlBatch] = []  # selector-major: every level of "", then of "empirical_"
    for prefix in prefixes:
        for alpha in levels:
            if prefix:
                chosen.append(empirical_control_batch(candidates, alpha=alpha, pareto=pareto))
            else:
                chosen.append(
                    control(candidates, alpha=alpha, delta=delta, fwer=fwer, pareto=pareto, pvalue=pvalue)
                )
    selected = np.stack([c.selected >= 0 for c in chosen], axis=1)  # (R, J)
    thresholds = np.stack([c.threshold for c in chosen], axis=1)
    measured = _measure(scores, splits, signal, np.where(selected, thresholds, np.inf), merge, spec, fresh)
    count = splits.trials
    out = []
    for a, alpha in enumerate(levels):
        part: dict[str, NDArray] = {"seed": np.full(count, probe_seed), "alpha": np.full(count, alpha)}
        for s, prefix in enumerate(prefixes):
            j = s * len(levels) + a
            part[f"{prefix}threshold"] = thresholds[:, j]
            part[f"{prefix}selected"] = selected[:, j]
            for measurement, counts in measured.items():
                name = prefix + ("" if measurement == "paper" else f"{measurement}_")
                losses = counts.delegated[:, j] if mode == "budget" else counts.errors[:, j]
                part[f"{name}realised"] = counts.delegated[:, j] / counts.n
                part[f"{name}accuracy"] = 1.0 - counts.errors[:, j] / counts.n
                part[f"{name}violated"] = selected[:, j] & (losses > count_at_most(alpha, counts.n))
        out.append(part)
    return out


def _check_options(
    mode: str, policy: str, trials: int, alphas: tuple[float, ...], delta: float, cal_size: int | None
) -> Policy:
    if mode not in ("budget", "performance"):
        raise ValueError(f"mode must be 'budget' or 'performance', got {mode!r}")
    spec = POLICIES.get(policy)
    if spec is None or not spec.calibrated:
        calibrated = [p.name for p in POLICIES.values() if p.calibrated]
        raise ValueError(f"validation needs a calibrated policy, one of {calibrated}; got {policy!r}")
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if not alphas or not all(0 < a < 1 for a in alphas):
        raise ValueError(f"alphas must lie in (0, 1), got {alphas}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if cal_size is not None and cal_size < 2:
        raise ValueError(f"cal_size must be at least 2, got {cal_size}")
    return spec


def validate_levels(
    scores_by_seed: Mapping[int, Scores],
    *,
    mode: ValidationMode,
    alphas: Sequence[float],
    delta: float,
    trials: int = 500,
    policy: str = "ctd",
    objective: Objective = "auroc",
    merge: MergeRule | None = None,
    pareto: bool = True,
    fwer: FWERMethod | FWERProcedure = "fixed-sequence",
    pvalue: PValueMethod = "binomial",
    cal_size: int | None = None,
    est_fraction: float = 0.3,
    n_grid: int = 100,
    seed: int | Sequence[int] = 0,
    fresh: Mapping[int, Scores] | None = None,
) -> tuple[ValidationResult, ...]:
    """`validate` at every risk level of `alphas`, on the same random splits and candidates
    (one result per level, in the order given): the candidates do not depend on alpha, so
    each extra level costs one pass of testing and counting.

    Trials are spread round-robin over the probe seeds. Each draws `cal_size` examples of its
    seed's test split (default half) for calibration, 30% of them D_est and the rest D_cal,
    from a generator seeded by (`seed`, probe seed). Budget mode certifies R_B <= alpha and
    optimises `objective`; performance mode certifies the 0-1 error R_P <= alpha (its Pareto
    objective is the error itself) and also runs the empirical selector on the same
    candidates. `fresh` maps each probe seed to an independent table to measure on.
    """
    levels = tuple(float(a) for a in alphas)
    spec = _check_options(mode, policy, trials, levels, delta, cal_size)
    merge_rule: MergeRule = merge or spec.merge
    # Performance mode filters on the certified risk itself; budget-only LTT needs no objective.
    fit_objective: Objective | None = objective if mode == "budget" else "accuracy"
    if mode == "budget" and not pareto:
        fit_objective = None
    seeds = sorted(scores_by_seed)
    if fresh is not None and (missing := [s for s in seeds if s not in fresh]):
        raise ValueError(f"the fresh table has no rows for probe seed {missing[0]}")
    words = [int(w) for w in np.atleast_1d(seed)]
    per_seed = np.bincount(np.arange(trials) % len(seeds), minlength=len(seeds))

    parts: list[list[dict[str, NDArray]]] = []  # per chunk of trials, per level
    sizes: dict[int, tuple[int, int, int]] = {}
    for probe_seed, count in zip(seeds, per_seed, strict=True):
        if count == 0:
            continue
        scores = scores_by_seed[probe_seed]
        sizes[probe_seed] = split_sizes(scores.n, est_fraction=est_fraction, cal_size=cal_size)
        for splits in split_chunks(
            scores.n,
            int(count),
            [*words, probe_seed],
            chunk=max(1, _WORK_ELEMENTS // scores.n),
            est_fraction=est_fraction,
            cal_size=cal_size,
        ):
            parts.append(
                _trials(
                    scores,
                    splits,
                    probe_seed,
                    levels,
                    mode=mode,
                    spec=spec,
                    merge=merge_rule,
                    objective=fit_objective,
                    n_grid=n_grid,
                    delta=delta,
                    fwer=fwer,
                    pareto=pareto,
                    pvalue=pvalue,
                    fresh=None if fresh is None else fresh[probe_seed],
                )
            )

    def selector(per_trial: dict[str, NDArray], prefix: str) -> SelectorResult:
        def summary(measurement: str) -> SelectorSummary:
            name = prefix + ("" if measurement == "paper" else f"{measurement}_")
            return _summary(
                per_trial[f"{prefix}selected"],
                per_trial[f"{name}violated"],
                per_trial[f"{name}realised"],
                per_trial[f"{name}accuracy"],
            )

        return SelectorResult(
            paper=summary("paper"),
            population=summary("population"),
            fresh=summary("fresh") if fresh is not None else None,
        )

    results = []
    for a, alpha in enumerate(levels):
        per_trial = {k: np.concatenate([p[a][k] for p in parts]) for k in parts[0][a]}
        results.append(
            ValidationResult(
                mode=mode,
                policy=policy,
                merge=merge_rule,
                fwer=fwer_procedure(fwer).name,
                pvalue_method=pvalue,
                alpha=alpha,
                delta=float(delta),
                objective=fit_objective,
                pareto=pareto,
                seed=tuple(words),
                split_sizes=sizes,
                fresh_sizes=None if fresh is None else {s: fresh[s].n for s in sizes},
                tested=selector(per_trial, ""),
                empirical=selector(per_trial, "empirical_") if mode == "performance" else None,
                per_trial=per_trial,
            )
        )
    return tuple(results)


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
    fwer: FWERMethod | FWERProcedure = "fixed-sequence",
    pvalue: PValueMethod = "binomial",
    cal_size: int | None = None,
    est_fraction: float = 0.3,
    n_grid: int = 100,
    seed: int | Sequence[int] = 0,
    fresh: Mapping[int, Scores] | None = None,
) -> ValidationResult:
    """Repeat calibration on `trials` random calibration samples and measure the realised risk
    of each returned policy (paper protocol, population, and fresh data when given):
    `validate_levels` at the one level `alpha`."""
    (result,) = validate_levels(
        scores_by_seed,
        mode=mode,
        alphas=(alpha,),
        delta=delta,
        trials=trials,
        policy=policy,
        objective=objective,
        merge=merge,
        pareto=pareto,
        fwer=fwer,
        pvalue=pvalue,
        cal_size=cal_size,
        est_fraction=est_fraction,
        n_grid=n_grid,
        seed=seed,
        fresh=fresh,
    )
    return result
