"""Empirical validation of joint control: every named risk at once, over random calibration samples.

Each trial calibrates one random sample with `joint_control_batch` (LTT, the max of the risks'
exact p-values in fixed sequence or another FWER procedure) and with `joint_empirical_batch`
(the plug-in selector beside it), and measures both returned policies like `validate` does:
on the evaluation rest (`paper`), the split minus D_est (`population`) and an independent table
(`fresh`). A trial violates when it returned a policy and, on the m rows measured, its
delegations exceed floor(alpha_B m), OR its errors exceed floor(alpha_E m), OR (with an fnr
level) its missed positives exceed floor(alpha_F m_pos) on the m_pos positives: decided on
integers. Joint control promises a violation rate of at most delta on the population.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ._candidates import CandidateBatch
from ._fwer import fwer_procedure
from ._joint import JointBatch, JointObjective, joint_control_batch, joint_empirical_batch, joint_family
from ._policies import MergeRule
from ._quota import count_at_most
from ._risks import RiskCounts, candidate_risks, missed_positives
from ._settings import ControlConfig
from ._splits import Scores, Splits, policy_signal, threshold_candidates
from ._validate import ValidationConfig, _chunks, _measure, _selector, _split_sizes
from ._validation_results import JOINT_MODE, ValidationResult

__all__ = ["JointLevel", "validate_joint"]

_SELECTORS = ("", "empirical_")  # LTT, then the plug-in selector


class JointSelector(Protocol):
    """What picks a threshold per trial: `joint_control_batch`'s signature."""

    def __call__(
        self,
        c: CandidateBatch,
        risks: Sequence[RiskCounts],
        *,
        objective: JointObjective = ...,
        control: ControlConfig | None = ...,
        members: NDArray[np.bool_] | None = ...,
    ) -> JointBatch: ...


@dataclass(frozen=True)
class JointLevel:
    """One joint level: the delegation rate at most `budget`, the cascade's 0-1 error at most
    `error` and, when given, its false-negative rate on the positives at most `fnr`, all at one
    threshold. A risk left None is not controlled; at least one must be given."""

    budget: float | None
    error: float | None
    fnr: float | None = None

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a joint level needs at least one of budget, error and fnr")
        for name, alpha in self.levels.items():
            if not 0 < alpha < 1:
                raise ValueError(f"the {name} level must lie in (0, 1), got {alpha}")

    @property
    def levels(self) -> dict[str, float]:
        """The controlled risks and their levels, in the order budget, error, fnr."""
        named = {"budget": self.budget, "error": self.error, "fnr": self.fnr}
        return {name: float(alpha) for name, alpha in named.items() if alpha is not None}


def _risks(c: CandidateBatch, level: JointLevel, missed: RiskCounts | None) -> list[RiskCounts]:
    risks = candidate_risks(c, budget=level.budget, error=level.error)
    if level.fnr is not None and missed is not None:
        risks.append(replace(missed, alpha=level.fnr))
    return risks


def _trials(
    scores: Scores,
    splits: Splits,
    probe_seed: int,
    levels: tuple[JointLevel, ...],
    *,
    config: ValidationConfig,
    merge: MergeRule,
    selection: JointObjective,
    fresh: Scores | None,
    procedure: JointSelector,
) -> list[dict[str, NDArray]]:
    """Calibrate every trial of `splits` at every joint level with both selectors (on one set
    of candidates and counts) and measure the returned policies: per level, the per-trial
    columns (the empirical selector's prefixed `empirical_`)."""
    spec, control = config.spec, config.control
    signal = policy_signal(scores, spec, splits)
    candidates = threshold_candidates(
        scores,
        signal,
        splits,
        merge=merge,
        objective="auroc" if selection == "auroc" else None,
        n_grid=config.n_grid,
    )
    with_fnr = any(level.fnr is not None for level in levels)
    # The missed-positive counts do not depend on the level: counted once, relabelled per level.
    missed = (
        missed_positives(scores, signal, splits, candidates.thresholds, merge=merge, alpha=0.5)
        if with_fnr
        else None
    )
    risks = [_risks(candidates, level, missed) for level in levels]
    # The tested family reads the risks' D_est counts, not their levels: one Pareto front per set
    # of risks named, shared by every level naming them and by both selectors.
    families: dict[tuple[str, ...], NDArray[np.bool_]] = {}
    for named in risks:
        key = tuple(r.name for r in named)
        if key not in families:
            families[key] = joint_family(candidates, named, selection, control.pareto)
    chosen: list[JointBatch] = []  # selector-major: every level of LTT, then of the empirical one
    for prefix in _SELECTORS:
        select = joint_empirical_batch if prefix else procedure
        for named in risks:
            family = families[tuple(r.name for r in named)]
            chosen.append(select(candidates, named, objective=selection, control=control, members=family))
    selected = np.stack([c.selected >= 0 for c in chosen], axis=1)  # (R, J)
    thresholds = np.stack([c.threshold for c in chosen], axis=1)
    cuts = np.where(selected, thresholds, np.inf)
    measured = _measure(scores, splits, signal, cuts, merge, spec, fresh)
    positives = (
        _measure(scores, splits, signal, cuts, merge, spec, fresh, positives=True) if with_fnr else None
    )
    count = splits.trials
    out = []
    for a, level in enumerate(levels):
        part: dict[str, NDArray] = {"seed": np.full(count, probe_seed)}
        part |= {f"{name}_level": np.full(count, alpha) for name, alpha in level.levels.items()}
        for s, prefix in enumerate(_SELECTORS):
            j = s * len(levels) + a
            part[f"{prefix}threshold"] = thresholds[:, j]
            part[f"{prefix}selected"] = selected[:, j]
            part[f"{prefix}certified"] = chosen[j].certified.sum(axis=1)  # thresholds certified (accepted)
            for measurement, counts in measured.items():
                name = prefix + ("" if measurement == "paper" else f"{measurement}_")
                losses = {"budget": counts.delegated[:, j], "error": counts.errors[:, j]}
                sizes: dict[str, int | NDArray[np.int64]] = {"budget": counts.n, "error": counts.n}
                part[f"{name}realised"] = counts.delegated[:, j] / counts.n
                part[f"{name}accuracy"] = 1.0 - counts.errors[:, j] / counts.n
                if positives is not None:
                    missed_counts = positives[measurement]
                    losses["fnr"] = missed_counts.errors[:, j]
                    sizes["fnr"] = missed_counts.n
                    part[f"{name}fnr"] = missed_counts.errors[:, j] / np.maximum(missed_counts.n, 1)
                violated = np.zeros(count, bool)
                for risk, alpha in level.levels.items():
                    broken = selected[:, j] & (losses[risk] > count_at_most(alpha, sizes[risk]))
                    part[f"{name}{risk}_violated"] = broken
                    violated |= broken
                part[f"{name}violated"] = violated
        out.append(part)
    return out


def validate_joint(
    scores_by_seed: Mapping[int, Scores],
    *,
    levels: Sequence[JointLevel],
    config: ValidationConfig | None = None,
    fresh: Mapping[int, Scores] | None = None,
    procedure: JointSelector = joint_control_batch,
) -> tuple[ValidationResult, ...]:
    """Joint control validated at every joint level of `levels` (one result each, in order),
    on the same random splits, candidates and counts as `validate_levels` draws them.

    Per trial, `joint_control_batch` certifies the levels at `config.delta` with `config.fwer`
    and picks by `config.selection` ("auroc", "accuracy" or "budget" on D_est), and the empirical
    selector picks from the thresholds whose D_cal counts meet every level. A trial violates when
    any one risk exceeds its level on the rows measured; `by_risk` of each result splits that up.
    `config.objective` is not used: candidates carry the AUROC when selection needs it.
    `procedure` replaces the tested selector (a test passes an anti-conservative one to show
    that the check catches it).
    """
    levels = tuple(levels)
    if not levels:
        raise ValueError("give at least one joint level")
    if not all(isinstance(level, JointLevel) for level in levels):
        raise ValueError("levels must be JointLevel values")
    config = config or ValidationConfig()
    selection = config.selection
    merge_rule: MergeRule = config.merge or config.spec.merge
    sizes = _split_sizes(scores_by_seed, config)
    parts = [
        _trials(
            scores,
            splits,
            probe_seed,
            levels,
            config=config,
            merge=merge_rule,
            selection=selection,
            fresh=fresh_scores,
            procedure=procedure,
        )
        for probe_seed, scores, splits, fresh_scores in _chunks(scores_by_seed, config, fresh)
    ]
    measured_fresh = fresh is not None
    results = []
    for a, level in enumerate(levels):
        per_trial = {k: np.concatenate([p[a][k] for p in parts]) for k in parts[0][a]}
        results.append(
            ValidationResult(
                mode=JOINT_MODE,  # type: ignore[arg-type]
                policy=config.policy,
                merge=merge_rule,
                fwer=fwer_procedure(config.fwer).name,
                pvalue_method=config.pvalue,
                alpha=float("nan"),
                delta=float(config.delta),
                objective=selection,
                pareto=config.pareto,
                seed=tuple(int(w) for w in np.atleast_1d(config.seed)),
                split_sizes=sizes,
                fresh_sizes=None if fresh is None else {s: fresh[s].n for s in sizes},
                tested=_selector(per_trial, "", measured_fresh),
                empirical=_selector(per_trial, "empirical_", measured_fresh),
                per_trial=per_trial,
                levels=level.levels,
                by_risk={
                    risk: {
                        "tested": _selector(per_trial, "", measured_fresh, f"{risk}_violated"),
                        "empirical": _selector(per_trial, "empirical_", measured_fresh, f"{risk}_violated"),
                    }
                    for risk in level.levels
                },
            )
        )
    return tuple(results)
