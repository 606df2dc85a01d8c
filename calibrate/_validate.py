"""Empirical validation of the guarantees over many random calibration splits.

Each trial draws a calibration sample from a seed's test split, calibrates on it, and measures
the realised risk of the returned policy in up to three ways:

- `paper`: on the rest of the split (the paper's protocol). Finite evaluation noise inflates
  it: LTT puts the chosen risk just below alpha, and a policy whose risk is exactly alpha
  exceeds floor(alpha m) losses on m evaluation rows about half the time.
- `population`: on the split minus D_est. Given the D_est rows the thresholds were fitted on,
  D_cal is a uniform draw from the rest of the split: the finite population whose risk LTT
  certifies. Measurable on any real table; with half splits D_cal is a large share of it and
  the binomial test is conservative there, so it is a weak test of a procedure.
- `fresh`: on an independent table (same columns), e.g. new rows from the same generator.

A violation is a loss count above floor(alpha m) on the m examples measured, decided on
integers: delegations in budget mode, cascade errors in performance mode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ._fwer import FWERMethod, FWERProcedure, fwer_procedure
from ._joint import JOINT_OBJECTIVES, JointObjective
from ._ltt import ControlBatch, budget_control_batch, empirical_control_batch, performance_control_batch
from ._policies import POLICIES, CalibratedPolicyName, MergeRule, Policy
from ._pvalues import PValueMethod
from ._quota import count_at_most
from ._settings import (
    CERTIFIED_MODES,
    DEFAULT_DELTA,
    DEFAULT_FWER,
    DEFAULT_JOINT_OBJECTIVE,
    DEFAULT_PARETO,
    DEFAULT_PVALUE,
    DEFAULT_SPLIT_SEED,
    DEFAULT_TRIALS,
    EST_FRACTION,
    N_GRID,
    ControlConfig,
)
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
from ._validation_results import (
    SelectorResult,
    SelectorSummary,
    ValidationMode,
    ValidationResult,
    summarise,
)

__all__ = ["ValidationConfig", "validate", "validate_levels"]


# Trials whose split-dependent signal is evaluated on a fresh table at once: bounds the
# (trials, fresh rows) work array.
_FRESH_CHUNK = 32
# Trials drawn and calibrated together: chunk x examples index entries (64 MB of int64).
_WORK_ELEMENTS = 8_000_000


@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    """How `validate` and `validate_levels` draw, calibrate and test (the level and the mode are
    the call's).

    `trials` random calibration samples are spread round-robin over the probe seeds; each is
    `cal_size` examples of its seed's test split (None: half), `est_fraction` of them D_est and
    the rest D_cal, drawn from a generator seeded by (`seed`, probe seed). `policy` (a calibrated
    one) is calibrated with its own merge rule unless `merge` names one, on `n_grid` + 1
    thresholds; budget mode optimises `objective` among the Pareto candidates. `delta`, `fwer`,
    `pareto` and `pvalue` are the tests' settings (`ControlConfig`): P(every certified threshold
    has R <= alpha) >= 1 - delta. `selection` is what joint control (`validate_joint`) picks its
    certified threshold by.
    """

    trials: int = DEFAULT_TRIALS
    policy: CalibratedPolicyName = "ctd"
    objective: Objective = "auroc"
    merge: MergeRule | None = None
    delta: float = DEFAULT_DELTA
    fwer: FWERMethod | FWERProcedure = DEFAULT_FWER
    pareto: bool = DEFAULT_PARETO
    pvalue: PValueMethod = DEFAULT_PVALUE
    cal_size: int | None = None
    est_fraction: float = EST_FRACTION
    n_grid: int = N_GRID
    seed: int | tuple[int, ...] = DEFAULT_SPLIT_SEED
    selection: JointObjective = DEFAULT_JOINT_OBJECTIVE

    def __post_init__(self) -> None:
        spec = POLICIES.get(self.policy)
        if spec is None or not spec.calibrated:
            calibrated = [p.name for p in POLICIES.values() if p.calibrated]
            raise ValueError(
                f"validation needs a calibrated policy, one of {calibrated}; got {self.policy!r}"
            )
        if self.trials < 1:
            raise ValueError(f"trials must be at least 1, got {self.trials}")
        self.control  # checks delta, fwer and pvalue  # noqa: B018
        if self.selection not in JOINT_OBJECTIVES:
            raise ValueError(f"unknown selection {self.selection!r}; choose one of {JOINT_OBJECTIVES}")
        if self.cal_size is not None and self.cal_size < 2:
            raise ValueError(f"cal_size must be at least 2, got {self.cal_size}")

    @property
    def spec(self) -> Policy:
        """The calibrated policy validated."""
        return POLICIES[self.policy]

    @property
    def control(self) -> ControlConfig:
        """The testing settings of every trial's controller."""
        return ControlConfig(delta=self.delta, fwer=self.fwer, pareto=self.pareto, pvalue=self.pvalue)


@dataclass(frozen=True)
class _Counts:
    """Loss counts of the chosen thresholds on one measured population of `n` examples:
    delegations and cascade errors, shape (R, J) for R trials and J thresholds per trial. Counted
    on the positives only (`_measure(positives=True)`), `errors` are missed positives and `n`
    the positives measured, per trial (R,)."""

    delegated: NDArray[np.int64]
    errors: NDArray[np.int64]
    n: int | NDArray[np.int64]


def _measure(
    scores: Scores,
    splits: Splits,
    signal: NDArray[np.float64],
    cuts: NDArray[np.float64],
    merge: MergeRule,
    policy: Policy,
    fresh: Scores | None,
    *,
    positives: bool = False,
) -> dict[str, _Counts]:
    """Delegation and error counts of every trial's thresholds `cuts` (R, J) (+inf: delegate
    nothing) on the evaluation rest, the population and the fresh table; with `positives`, the
    errors and sizes of the positives (label 1) only: missed positives, the false-negative risk.

    The population is the split minus D_est: given the D_est rows the thresholds were fitted on,
    D_cal is a uniform draw from the rest, and that finite set's risk is what the tests
    certify. Both it and the evaluation rest are counted as the whole split minus a sample
    (small) instead of counting them directly (large when the sample is a small draw)."""
    wrong, step = _terms(scores, merge, positives)
    delegated, change = counts_above(signal, step[None, :], cuts)
    whole = _Counts(delegated, int(wrong.sum()) + change, int(scores.label.sum()) if positives else scores.n)

    def without(index: NDArray[np.int64], counts: _Counts) -> _Counts:
        delegated, change = counts_above(_rows(signal, index), step[index], cuts)
        errors = wrong[index].sum(axis=1)[:, None] + change
        removed = scores.label[index].sum(axis=1) if positives else index.shape[1]
        return _Counts(counts.delegated - delegated, counts.errors - errors, counts.n - removed)

    population = without(splits.est, whole)
    out = {"paper": without(splits.cal, population), "population": population}
    if fresh is not None:
        fresh_wrong, fresh_step = _terms(fresh, merge, positives)
        parts = []
        # A split-dependent signal (uncertainty) is a (trials, fresh rows) array: in chunks.
        chunk = splits.trials if signal.shape[0] == 1 else _FRESH_CHUNK
        for start in range(0, splits.trials, chunk):
            part = Splits(*(a[start : start + chunk] for a in (splits.est, splits.cal, splits.evaluation)))
            fresh_signal = policy_signal(scores, policy, part, on=fresh)
            parts.append(counts_above(fresh_signal, fresh_step[None, :], cuts[start : start + chunk]))
        delegated = np.concatenate([p[0] for p in parts])
        change = np.concatenate([p[1] for p in parts])
        fresh_n = int(fresh.label.sum()) if positives else fresh.n
        out["fresh"] = _Counts(delegated, int(fresh_wrong.sum()) + change, fresh_n)
    return out


def _terms(scores: Scores, merge: MergeRule, positives: bool) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """`error_terms`, restricted to the positives when `positives`: a negative then never counts."""
    wrong, step = error_terms(scores, merge)
    if positives:
        return wrong * scores.label, step * scores.label
    return wrong, step


def _trials(
    scores: Scores,
    splits: Splits,
    probe_seed: int,
    levels: tuple[float, ...],
    *,
    mode: ValidationMode,
    config: ValidationConfig,
    merge: MergeRule,
    objective: Objective | None,
    fresh: Scores | None,
) -> list[dict[str, NDArray]]:
    """Calibrate every trial of `splits` at every level and measure the returned policies: per
    level, the per-trial columns (the empirical selector's prefixed `empirical_`)."""
    spec, control = config.spec, config.control
    signal = policy_signal(scores, spec, splits)
    candidates = threshold_candidates(
        scores, signal, splits, merge=merge, objective=objective, n_grid=config.n_grid
    )
    tested = budget_control_batch if mode == "budget" else performance_control_batch
    prefixes = ("", "empirical_") if mode == "performance" else ("",)
    chosen: list[ControlBatch] = []  # selector-major: every level of "", then of "empirical_"
    for prefix in prefixes:
        for alpha in levels:
            select = empirical_control_batch if prefix else tested
            chosen.append(select(candidates, alpha=alpha, control=control))
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


def _check_call(mode: str, alphas: tuple[float, ...]) -> None:
    if mode not in CERTIFIED_MODES:
        raise ValueError(f"mode must be 'budget' or 'performance', got {mode!r}")
    if not alphas or not all(0 < a < 1 for a in alphas):
        raise ValueError(f"alphas must lie in (0, 1), got {alphas}")


def _split_sizes(
    scores_by_seed: Mapping[int, Scores], config: ValidationConfig
) -> dict[int, tuple[int, int, int]]:
    """(n_est, n_cal, n_eval) of every probe seed that gets at least one trial."""
    seeds = sorted(scores_by_seed)
    per_seed = np.bincount(np.arange(config.trials) % len(seeds), minlength=len(seeds))
    return {
        s: split_sizes(scores_by_seed[s].n, est_fraction=config.est_fraction, cal_size=config.cal_size)
        for s, count in zip(seeds, per_seed, strict=True)
        if count
    }


def _chunks(
    scores_by_seed: Mapping[int, Scores], config: ValidationConfig, fresh: Mapping[int, Scores] | None
) -> Iterator[tuple[int, Scores, Splits, Scores | None]]:
    """The trials' random splits, chunk by chunk: (probe seed, its scores, a chunk of splits,
    its fresh table). Trials go round-robin over the probe seeds; a seed's splits come from a
    generator seeded by (`config.seed`, probe seed)."""
    seeds = sorted(scores_by_seed)
    if fresh is not None and (missing := [s for s in seeds if s not in fresh]):
        raise ValueError(f"the fresh table has no rows for probe seed {missing[0]}")
    words = [int(w) for w in np.atleast_1d(config.seed)]
    per_seed = np.bincount(np.arange(config.trials) % len(seeds), minlength=len(seeds))
    for probe_seed, count in zip(seeds, per_seed, strict=True):
        if count == 0:
            continue
        scores = scores_by_seed[probe_seed]
        for splits in split_chunks(
            scores.n,
            int(count),
            [*words, probe_seed],
            chunk=max(1, _WORK_ELEMENTS // scores.n),
            est_fraction=config.est_fraction,
            cal_size=config.cal_size,
        ):
            yield probe_seed, scores, splits, None if fresh is None else fresh[probe_seed]


def _selector(
    per_trial: dict[str, NDArray], prefix: str, fresh: bool, violated: str = "violated"
) -> SelectorResult:
    """One selector's summaries (columns `prefix`...) per measurement; `violated` names the
    violation column read (a joint level's per-risk ones: `budget_violated`, ...)."""

    def summary(measurement: str) -> SelectorSummary:
        name = prefix + ("" if measurement == "paper" else f"{measurement}_")
        return summarise(
            per_trial[f"{prefix}selected"],
            per_trial[f"{name}{violated}"],
            per_trial[f"{name}realised"],
            per_trial[f"{name}accuracy"],
        )

    return SelectorResult(
        paper=summary("paper"),
        population=summary("population"),
        fresh=summary("fresh") if fresh else None,
    )


def validate_levels(
    scores_by_seed: Mapping[int, Scores],
    *,
    mode: ValidationMode,
    alphas: Sequence[float],
    config: ValidationConfig | None = None,
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
    _check_call(mode, levels)
    config = config or ValidationConfig()
    merge_rule: MergeRule = config.merge or config.spec.merge
    # Performance mode filters on the certified risk itself; budget-only LTT needs no objective.
    fit_objective: Objective | None = config.objective if mode == "budget" else "accuracy"
    if mode == "budget" and not config.pareto:
        fit_objective = None
    words = [int(w) for w in np.atleast_1d(config.seed)]
    parts: list[list[dict[str, NDArray]]] = []  # per chunk of trials, per level
    sizes = _split_sizes(scores_by_seed, config)
    for probe_seed, scores, splits, fresh_scores in _chunks(scores_by_seed, config, fresh):
        parts.append(
            _trials(
                scores,
                splits,
                probe_seed,
                levels,
                mode=mode,
                config=config,
                merge=merge_rule,
                objective=fit_objective,
                fresh=fresh_scores,
            )
        )

    results = []
    for a, alpha in enumerate(levels):
        per_trial = {k: np.concatenate([p[a][k] for p in parts]) for k in parts[0][a]}
        results.append(
            ValidationResult(
                mode=mode,
                policy=config.policy,
                merge=merge_rule,
                fwer=fwer_procedure(config.fwer).name,
                pvalue_method=config.pvalue,
                alpha=alpha,
                delta=float(config.delta),
                objective=fit_objective,
                pareto=config.pareto,
                seed=tuple(words),
                split_sizes=sizes,
                fresh_sizes=None if fresh is None else {s: fresh[s].n for s in sizes},
                tested=_selector(per_trial, "", fresh is not None),
                empirical=_selector(per_trial, "empirical_", fresh is not None)
                if mode == "performance"
                else None,
                per_trial=per_trial,
            )
        )
    return tuple(results)


def validate(
    scores_by_seed: Mapping[int, Scores],
    *,
    mode: ValidationMode,
    alpha: float,
    config: ValidationConfig | None = None,
    fresh: Mapping[int, Scores] | None = None,
) -> ValidationResult:
    """Repeat calibration on `trials` random calibration samples and measure the realised risk
    of each returned policy (paper protocol, population, and fresh data when given):
    `validate_levels` at the one level `alpha`."""
    (result,) = validate_levels(scores_by_seed, mode=mode, alphas=(alpha,), config=config, fresh=fresh)
    return result
