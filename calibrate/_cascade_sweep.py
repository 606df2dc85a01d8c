"""The sweep of a K-stage cascade: per probe seed one random calibration/evaluation split (as
`sweep`), and at every level given the configuration joint control certifies and chooses on the
calibration half (`cascade_control_batch`), run on the evaluation half.

Per (seed, level) row: the configuration chosen, (lambda_1..lambda_K, tau) (NaN when nothing
was certified; +inf: the stage is never asked), and on the m evaluation rows its realised rates,
calls_k = #{reach stage k} / m, error = #{scored wrong and kept} / m, abstained = #{abstained on} / m,
and accuracy = 1 - error (the quantity `--accuracy` certifies; an abstention is not an error).
With policies beyond CTD (`CASCADE_POLICIES`) a row is per (seed, level, policy), the policy's
signal (`cascade_policy_scores`) cut by the same grid and certified by the same joint tests,
on the same split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product

import numpy as np
from numpy.typing import NDArray

from ._cascade import (
    ABSTAIN_MARGINS,
    CASCADE_GRID,
    CascadeLevels,
    CascadeScores,
    cascade_control_batch,
    cascade_grid,
    cascade_outcome,
)
from ._cascade_policies import CASCADE_POLICIES, cascade_policy_scores
from ._fwer import FWER_METHODS, FWERMethod
from ._metrics import predict
from ._pvalues import PVALUE_METHODS, PValueMethod
from ._settings import (
    CAL_FRACTION,
    DEFAULT_CASCADE_POLICIES,
    DEFAULT_DELTA,
    DEFAULT_FWER,
    DEFAULT_PVALUE,
    DEFAULT_SPLIT_SEED,
    EST_FRACTION,
    ControlConfig,
)
from ._splits import random_splits

__all__ = ["CascadeSweepConfig", "CascadeSweepResult", "cascade_sweep", "cascade_sweep_columns"]


@dataclass(frozen=True, kw_only=True)
class CascadeSweepConfig:
    """What to sweep: the levels (one `CascadeLevels` each, all with the same count of experts),
    the policies (`CASCADE_POLICIES`; CTD alone by default) and the testing and splitting
    settings `sweep` has."""

    levels: tuple[CascadeLevels, ...]
    delta: float = DEFAULT_DELTA
    fwer: FWERMethod = DEFAULT_FWER
    pvalue: PValueMethod = DEFAULT_PVALUE
    split_seed: int = DEFAULT_SPLIT_SEED
    cal_fraction: float = CAL_FRACTION
    est_fraction: float = EST_FRACTION
    n_grid: int = CASCADE_GRID
    policies: tuple[str, ...] = DEFAULT_CASCADE_POLICIES

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("give at least one level")
        unknown = [p for p in self.policies if p not in CASCADE_POLICIES]
        if not self.policies or unknown or len(set(self.policies)) != len(self.policies):
            raise ValueError(
                f"policies must be distinct names from {', '.join(CASCADE_POLICIES)}, "
                f"got {list(self.policies)}"
            )
        if len({len(level.budgets) for level in self.levels}) != 1:
            raise ValueError("every level needs one budget per expert, the same count")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta}")
        if self.fwer not in FWER_METHODS:
            raise ValueError(f"fwer must be one of {FWER_METHODS}, got {self.fwer!r}")
        if self.pvalue not in PVALUE_METHODS:
            raise ValueError(f"pvalue must be one of {PVALUE_METHODS}, got {self.pvalue!r}")
        if self.n_grid < 1:
            raise ValueError(f"n_grid must be at least 1, got {self.n_grid}")

    @property
    def stages(self) -> int:
        return len(self.levels[0].budgets)

    @property
    def by_policy(self) -> bool:
        """Whether the table names each row's policy (not for CTD alone, the default)."""
        return self.policies != ("ctd",)

    @property
    def control(self) -> ControlConfig:
        return ControlConfig(delta=self.delta, fwer=self.fwer, pvalue=self.pvalue)


def cascade_sweep_columns(stages: int, *, policy: bool = False) -> tuple[str, ...]:
    """The columns of a K-stage sweep table, in order (`policy`: with the policy column)."""
    ks = range(1, stages + 1)
    return (
        "seed",
        "level",
        *(("policy",) if policy else ()),
        *(f"budget_{k}" for k in ks),
        "error_level",
        "abstain_level",
        "n_eval",
        "n_certified",
        *(f"threshold_{k}" for k in ks),
        "margin",
        *(f"calls_{k}" for k in ks),
        "error",
        "abstained",
        "accuracy",
    )


@dataclass(frozen=True)
class CascadeSweepResult:
    """`table`: one row per (seed, level[, policy]), `cascade_sweep_columns(K, policy=by_policy)`;
    `baselines`: per seed the evaluation half's size and the accuracy of the probe alone and of
    each expert alone."""

    config: CascadeSweepConfig
    table: dict[str, NDArray]
    baselines: dict[str, NDArray] = field(repr=False)


def _rate(count: np.int64, m: int, chosen: bool) -> float:
    """count / m, or NaN when the level certified nothing (no configuration to measure)."""
    return float(count / m) if chosen else float("nan")


def cascade_sweep(
    scores_by_seed: Mapping[int, CascadeScores], config: CascadeSweepConfig
) -> CascadeSweepResult:
    """Calibrate the cascade on each seed's calibration half (split seeded by (split_seed,
    seed), 30% D_est / 70% D_cal) at every level, and measure the chosen configuration on the
    evaluation half; a level with nothing certified has NaN thresholds and rates."""
    stages = config.stages
    rows: dict[str, list] = {c: [] for c in cascade_sweep_columns(stages, policy=config.by_policy)}
    baselines: dict[str, list] = {"seed": [], "n_eval": [], "probe_accuracy": []}
    baselines |= {f"expert_{k}_accuracy": [] for k in range(1, stages + 1)}
    for seed in sorted(scores_by_seed):
        scores = scores_by_seed[seed]
        if scores.stages != stages:
            raise ValueError(f"seed {seed}: a cascade of {scores.stages} experts, the levels name {stages}")
        splits = random_splits(
            scores.n,
            1,
            [config.split_seed, seed],
            cal_fraction=config.cal_fraction,
            est_fraction=config.est_fraction,
        )
        evaluation = splits.evaluation
        m = evaluation.shape[1]
        right = predict(scores.stage_scores[:, evaluation[0]]) == scores.label[evaluation[0]].astype(bool)
        baselines["seed"].append(seed)
        baselines["n_eval"].append(m)
        baselines["probe_accuracy"].append(float(right[0].mean()))
        for k in range(1, stages + 1):
            baselines[f"expert_{k}_accuracy"].append(float(right[k].mean()))
        signals = {p: cascade_policy_scores(scores, p) for p in config.policies}
        for (a, level), policy in product(enumerate(config.levels), config.policies):
            cut = signals[policy]
            margins = ABSTAIN_MARGINS if level.abstain is not None else (0.0,)
            grid = cascade_grid(cut, splits.est, n_grid=config.n_grid, margins=margins)
            batch = cascade_control_batch(cut, grid, splits.est, splits.cal, level, control=config.control)
            chosen = bool(batch.selected[0] >= 0)
            outcome = cascade_outcome(
                cut,
                evaluation,
                np.where(chosen, batch.thresholds, np.inf),
                np.where(chosen, batch.margin, 0.0),
            )
            error = _rate(outcome.wrong[0], m, chosen)
            row = {
                "seed": seed,
                "level": a,
                "error_level": np.nan if level.error is None else level.error,
                "abstain_level": np.nan if level.abstain is None else level.abstain,
                "n_eval": m,
                "n_certified": int(batch.tests.certified[0].sum()),
                "margin": float(batch.margin[0]),
                "error": error,
                "abstained": _rate(outcome.abstained[0], m, chosen),
                "accuracy": 1.0 - error,
            }
            if config.by_policy:
                row["policy"] = policy
            for k in range(stages):
                budget = level.budgets[k]
                row[f"budget_{k + 1}"] = np.nan if budget is None else budget
                row[f"threshold_{k + 1}"] = float(batch.thresholds[0, k])
                row[f"calls_{k + 1}"] = _rate(outcome.calls[0, k], m, chosen)
            for column, value in row.items():
                rows[column].append(value)
    return CascadeSweepResult(
        config,
        {c: np.asarray(v) for c, v in rows.items()},
        {k: np.asarray(v) for k, v in baselines.items()},
    )
