"""The policy comparison: budgets x policies x batch sizes x seeds x objectives, as a tidy table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ._candidates import Candidates
from ._decisions import ANY_BATCH_SIZE, ANY_OBJECTIVE, DECISION_COLUMNS, DecisionMasks, decision_columns
from ._fwer import FWER_METHODS, FWERMethod
from ._groups import GROUP_COLUMNS, concat_groups, group_delegation, tidy_groups
from ._joint import joint_control
from ._ltt import budget_control
from ._policies import (
    DEFAULT_POLICIES,
    MERGE_RULES,
    POLICIES,
    MergeRule,
    Policy,
    batch_ranks,
    median_rank_signal,
    topk_mask,
)
from ._pvalues import PVALUE_METHODS, PValueMethod
from ._settings import (
    CAL_FRACTION,
    DEFAULT_BATCH_SIZES,
    DEFAULT_BUDGETS,
    DEFAULT_DELTA,
    DEFAULT_FWER,
    DEFAULT_PARETO,
    DEFAULT_PVALUE,
    DEFAULT_SPLIT_SEED,
    EST_FRACTION,
    N_GRID,
    ControlConfig,
)
from ._splits import (
    OBJECTIVES,
    Objective,
    Scores,
    SplitMetrics,
    evaluate_delegation,
    policy_signal,
    random_splits,
    threshold_candidates,
)

__all__ = [
    "ANY_BATCH_SIZE",
    "ANY_OBJECTIVE",
    "DECISION_COLUMNS",
    "GROUP_COLUMNS",
    "SWEEP_COLUMNS",
    "DecisionMasks",
    "MergeChoice",
    "SweepConfig",
    "SweepResult",
    "sweep",
]

MergeChoice = Literal["default", "overwrite", "average"]

SWEEP_COLUMNS: tuple[str, ...] = (
    "seed",
    "policy",
    "merge",
    "objective",
    "budget",
    "batch_size",
    "auroc",
    "accuracy",
    "realised",
    "threshold",
    "n_certified",
)


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What to compare. `merge="default"` uses each policy's own rule (overwrite for DV and
    oracle policies, average for uncertainty ones); "overwrite"/"average" impose one rule on all
    (the score-merging controls). `accuracy` B: every calibrated row certifies its budget and
    the error level round(1 - B, 12) jointly (`joint_control`, selecting by the row's
    objective) instead of its budget alone; None: budget control, as the paper."""

    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    policies: tuple[str, ...] = DEFAULT_POLICIES
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    objectives: tuple[Objective, ...] = OBJECTIVES
    delta: float = DEFAULT_DELTA
    merge: MergeChoice = "default"
    n_grid: int = N_GRID
    cal_fraction: float = CAL_FRACTION
    est_fraction: float = EST_FRACTION
    fwer: FWERMethod = DEFAULT_FWER
    pvalue: PValueMethod = DEFAULT_PVALUE
    pareto: bool = DEFAULT_PARETO
    split_seed: int = DEFAULT_SPLIT_SEED
    accuracy: float | None = None

    def __post_init__(self) -> None:
        if not self.budgets or not all(0 < b < 1 for b in self.budgets):
            raise ValueError(f"budgets must lie in (0, 1), got {self.budgets}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies:
            raise ValueError(f"unknown policy {unknown}; choose from {tuple(POLICIES)}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be positive, got {self.batch_sizes}")
        if not self.objectives or any(o not in OBJECTIVES for o in self.objectives):
            raise ValueError(f"objectives must be among {OBJECTIVES}, got {self.objectives}")
        if self.merge != "default" and self.merge not in MERGE_RULES:
            raise ValueError(f"merge must be 'default' or one of {MERGE_RULES}, got {self.merge!r}")
        if self.fwer not in FWER_METHODS:
            raise ValueError(f"fwer must be one of {FWER_METHODS}, got {self.fwer!r}")
        if self.pvalue not in PVALUE_METHODS:
            raise ValueError(f"pvalue must be one of {PVALUE_METHODS}, got {self.pvalue!r}")
        if self.n_grid < 1:
            raise ValueError(f"n_grid must be at least 1, got {self.n_grid}")
        if self.accuracy is not None and not 0 < self.accuracy < 1:
            raise ValueError(f"accuracy must lie in (0, 1), got {self.accuracy}")

    @property
    def error_level(self) -> float | None:
        """The certified error level 1 - accuracy (rounded, so that 1 - 0.9 reads 0.1), or None."""
        return None if self.accuracy is None else round(1.0 - self.accuracy, 12)

    @property
    def control(self) -> ControlConfig:
        """The testing settings of every calibrated row's budget control."""
        return ControlConfig(delta=self.delta, fwer=self.fwer, pareto=self.pareto, pvalue=self.pvalue)

    def merge_for(self, policy: Policy) -> MergeRule:
        return policy.merge if self.merge == "default" else self.merge


@dataclass(frozen=True)
class SweepResult:
    """`table`: tidy columns (SWEEP_COLUMNS), one row per policy x budget x batch size x seed x
    objective; calibrated policies do not depend on the batch size and top-k policies not on
    the objective, so their rows repeat across those axes. `ltt`: one audit record per
    calibrated (policy, objective, seed, budget). With `config.accuracy`, a calibrated row
    whose budget and error level no threshold certified jointly has no policy: threshold, auroc,
    accuracy and realised are NaN and n_certified is 0, and it has no decision or group rows
    (there is no mask). `baselines`: probe-only and expert-only
    metrics on each seed's evaluation half. `groups`: the group-conditional table
    (GROUP_COLUMNS), one row per policy x budget x batch size x seed x objective x group of the
    evaluation half, made from the same delegation masks as `table` (repeating across the same
    axes); for a group g and mask S: n = |g|, n_delegated = |g and S|, delegation_rate =
    n_delegated / n, mean_v_selected = mean v over g and S (NaN when empty), mean_v_all = mean v
    over g. No rows when the scores carry no groups. `decision_masks`: the same masks per
    example, compact (`DecisionMasks`), and `decisions` their tidy table (DECISION_COLUMNS), so
    that a reader can look at any example without re-running the sweep."""

    config: SweepConfig
    table: dict[str, NDArray]
    ltt: list[dict[str, object]] = field(repr=False)
    baselines: dict[str, NDArray] = field(repr=False)
    groups: dict[str, NDArray] = field(repr=False)
    decision_masks: tuple[DecisionMasks, ...] = field(repr=False)

    @property
    def decisions(self) -> dict[str, NDArray]:
        """The tidy table of `decision_masks`, made on each call: a writer of a large sweep
        takes `decision_masks` one at a time instead."""
        return decision_columns(self.decision_masks)


def _decisions_for(
    parts: list[DecisionMasks],
    *,
    seed: int,
    policy: str,
    objective: str,
    batch_size: int,
    budgets: tuple[float, ...],
    evaluation: NDArray[np.int64],
    signal: NDArray[np.float64],
    delegated: NDArray[np.bool_],
    rank: NDArray[np.int64] | None = None,
) -> None:
    """Append one policy's masks (shape (budgets, evaluation rows))."""
    parts.append(
        DecisionMasks(seed, policy, objective, batch_size, budgets, evaluation, signal, rank, delegated)
    )


def _rows_for(
    rows: dict[str, list],
    *,
    seed: int,
    policy: str,
    merge: str,
    objectives: tuple[str, ...],
    batch_sizes: tuple[int, ...],
    budgets: tuple[float, ...],
    metrics: SplitMetrics,
    thresholds: NDArray[np.float64],
    n_certified: NDArray[np.int64],
) -> None:
    for objective in objectives:
        for batch_size in batch_sizes:
            for a, budget in enumerate(budgets):
                rows["seed"].append(seed)
                rows["policy"].append(policy)
                rows["merge"].append(merge)
                rows["objective"].append(objective)
                rows["budget"].append(budget)
                rows["batch_size"].append(batch_size)
                rows["auroc"].append(metrics.auroc[a])
                rows["accuracy"].append(metrics.accuracy[a])
                rows["realised"].append(metrics.realised[a])
                rows["threshold"].append(thresholds[a])
                rows["n_certified"].append(n_certified[a])


def _groups_for(
    parts: list[dict[str, NDArray]],
    *,
    scores: Scores,
    evaluation: NDArray[np.int64],
    seed: int,
    policy: str,
    budgets: tuple[float, ...],
    delegated: NDArray[np.bool_],
    objectives: tuple[str, ...],
    batch_sizes: tuple[int, ...],
) -> None:
    """Append the group table of one policy's masks (shape (budgets, evaluation rows))."""
    if scores.group is None:
        return
    found = group_delegation(scores.value[evaluation], scores.group[evaluation], delegated)
    parts.append(
        tidy_groups(
            found, seed=seed, policy=policy, objectives=objectives, batch_sizes=batch_sizes, budgets=budgets
        )
    )


def _calibrate_budgets(
    candidates: Candidates, objective: Objective, config: SweepConfig
) -> tuple[NDArray[np.float64], NDArray[np.int64], list[dict[str, object]]]:
    """Every budget's threshold (NaN: no policy), certified count and audit record: budget
    control, or with `config.accuracy` joint control of the budget and the error level."""
    if config.accuracy is None:
        results = [budget_control(candidates, alpha=float(a), control=config.control) for a in config.budgets]
    else:
        results = [
            joint_control(
                candidates,
                budget=float(a),
                error=config.error_level,
                objective=objective,
                control=config.control,
            )
            for a in config.budgets
        ]
    thresholds = np.array([np.nan if r.threshold is None else r.threshold for r in results], dtype=np.float64)
    n_certified = np.array([r.certified.size for r in results], dtype=np.int64)
    return thresholds, n_certified, [r.to_dict() for r in results]


def _without(metrics: SplitMetrics, has_policy: NDArray[np.bool_]) -> SplitMetrics:
    """The metrics with NaN where a budget has no policy (nothing to measure)."""
    if has_policy.all():
        return metrics
    return replace(
        metrics,
        auroc=np.where(has_policy, metrics.auroc, np.nan),
        accuracy=np.where(has_policy, metrics.accuracy, np.nan),
        realised=np.where(has_policy, metrics.realised, np.nan),
    )


def sweep(scores_by_seed: Mapping[int, Scores], config: SweepConfig | None = None) -> SweepResult:
    """Compare the policies on every seed's test split: one random calibration/evaluation split
    per seed (seeded by (split_seed, seed)), calibrated policies by budget control on the
    calibration half, top-k policies per batch of the evaluation half in its random order.
    Every delegation mask (shape (budgets, evaluation rows)) also goes into the group table."""
    config = config or SweepConfig()
    budgets = np.asarray(config.budgets)
    rows: dict[str, list] = {c: [] for c in SWEEP_COLUMNS}
    ltt: list[dict[str, object]] = []
    baselines: dict[str, list] = {
        k: [] for k in ("seed", "n_eval", "probe_auroc", "probe_accuracy", "expert_auroc", "expert_accuracy")
    }
    no_threshold = np.full(budgets.size, np.nan)
    no_count = np.full(budgets.size, -1, dtype=np.int64)
    group_parts: list[dict[str, NDArray]] = []
    decision_parts: list[DecisionMasks] = []
    for seed in sorted(scores_by_seed):
        scores = scores_by_seed[seed]
        splits = random_splits(
            scores.n,
            1,
            [config.split_seed, seed],
            cal_fraction=config.cal_fraction,
            est_fraction=config.est_fraction,
        )
        evaluation = splits.evaluation[0]
        nobody = np.zeros((1, evaluation.size), bool)
        probe_only = evaluate_delegation(scores, evaluation[None], nobody, "overwrite")
        expert_only = evaluate_delegation(scores, evaluation[None], ~nobody, "overwrite")
        baselines["seed"].append(seed)
        baselines["n_eval"].append(evaluation.size)
        baselines["probe_auroc"].append(probe_only.auroc[0])
        baselines["probe_accuracy"].append(probe_only.accuracy[0])
        baselines["expert_auroc"].append(expert_only.auroc[0])
        baselines["expert_accuracy"].append(expert_only.accuracy[0])

        for name in config.policies:
            policy = POLICIES[name]
            merge = config.merge_for(policy)
            common = dict(rows=rows, seed=seed, policy=name, merge=merge, budgets=config.budgets)
            on_decisions = dict(
                parts=decision_parts, seed=seed, policy=name, budgets=config.budgets, evaluation=evaluation
            )
            on_groups = dict(
                parts=group_parts,
                scores=scores,
                evaluation=evaluation,
                seed=seed,
                policy=name,
                budgets=config.budgets,
            )
            if policy.calibrated:
                signal = policy_signal(scores, policy, splits)
                signal_eval = signal[0][evaluation]  # one split: row 0
                for objective in config.objectives:
                    # Budget-only LTT never looks at the objective: skip computing it (joint
                    # control selects by it, Pareto or not).
                    (candidates,) = threshold_candidates(
                        scores,
                        signal,
                        splits,
                        merge=merge,
                        objective=objective if config.pareto or config.accuracy is not None else None,
                        n_grid=config.n_grid,
                    )
                    thresholds, n_certified, records = _calibrate_budgets(candidates, objective, config)
                    for record in records:
                        ltt.append({"seed": seed, "policy": name, "objective": objective, **record})
                    # A budget without a policy (joint control only) has no mask: NaN metrics.
                    has_policy = ~np.isnan(thresholds)
                    delegated = signal_eval[None, :] > thresholds[:, None]
                    metrics = _without(
                        evaluate_delegation(scores, evaluation[None], delegated, merge), has_policy
                    )
                    kept = tuple(b for b, keep in zip(config.budgets, has_policy, strict=True) if keep)
                    _decisions_for(
                        **{**on_decisions, "budgets": kept},
                        objective=objective,
                        batch_size=ANY_BATCH_SIZE,
                        signal=signal_eval,
                        delegated=delegated[has_policy],
                    )
                    _groups_for(
                        **{**on_groups, "budgets": kept},
                        delegated=delegated[has_policy],
                        objectives=(objective,),
                        batch_sizes=config.batch_sizes,
                    )
                    _rows_for(
                        **common,
                        objectives=(objective,),
                        batch_sizes=config.batch_sizes,
                        metrics=metrics,
                        thresholds=thresholds,
                        n_certified=n_certified,
                    )
            elif policy.mechanism == "topk":
                signal_eval = policy_signal(scores, policy, splits)[0][evaluation]
                for batch_size in config.batch_sizes:
                    delegated = topk_mask(signal_eval, budgets, batch_size)
                    metrics = evaluate_delegation(scores, evaluation[None], delegated, merge)
                    _decisions_for(
                        **on_decisions,
                        objective=ANY_OBJECTIVE,
                        batch_size=batch_size,
                        signal=signal_eval,
                        delegated=delegated,
                        rank=batch_ranks(signal_eval, batch_size),
                    )
                    _groups_for(
                        **on_groups,
                        delegated=delegated,
                        objectives=config.objectives,
                        batch_sizes=(batch_size,),
                    )
                    _rows_for(
                        **common,
                        objectives=config.objectives,
                        batch_sizes=(batch_size,),
                        metrics=metrics,
                        thresholds=no_threshold,
                        n_certified=no_count,
                    )
            else:  # central-k over the whole evaluation pool
                signal_eval = median_rank_signal(scores.probe[evaluation])
                delegated = topk_mask(signal_eval, budgets, evaluation.size)
                metrics = evaluate_delegation(scores, evaluation[None], delegated, merge)
                _decisions_for(
                    **on_decisions,
                    objective=ANY_OBJECTIVE,
                    batch_size=ANY_BATCH_SIZE,
                    signal=signal_eval,
                    delegated=delegated,
                )
                _groups_for(
                    **on_groups,
                    delegated=delegated,
                    objectives=config.objectives,
                    batch_sizes=config.batch_sizes,
                )
                _rows_for(
                    **common,
                    objectives=config.objectives,
                    batch_sizes=config.batch_sizes,
                    metrics=metrics,
                    thresholds=no_threshold,
                    n_certified=no_count,
                )
    table = {c: np.asarray(v) for c, v in rows.items()}
    return SweepResult(
        config=config,
        table=table,
        ltt=ltt,
        baselines={k: np.asarray(v) for k, v in baselines.items()},
        groups=concat_groups(group_parts),
        decision_masks=tuple(decision_parts),
    )
