"""Validation of a K-stage cascade's joint guarantee over many random calibration samples.

Each trial draws a calibration sample of a seed's table (30% D_est, 70% D_cal), certifies the
configurations (`cascade_control_batch`) and measures the chosen one, as `validate` does for
one expert: on the `population` (the table minus D_est, the finite population D_cal is a
uniform draw from) and, when given, on a `fresh` table. A trial violates when it chose a
configuration and some controlled risk's loss count exceeds floor(alpha m) on the m rows
measured: calls to expert k, inputs scored wrong and kept, inputs abstained on. The empirical
selector (every configuration whose D_cal counts meet the levels, no test) runs beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ._cascade import (
    ABSTAIN_MARGINS,
    CASCADE_GRID,
    CascadeGrid,
    CascadeLevels,
    CascadeOutcome,
    CascadeScores,
    cascade_control_batch,
    cascade_grid,
    cascade_outcome,
    choose,
    configuration_risks,
    selection_keys,
)
from ._cascade_policies import cascade_policy_scores
from ._joint import meets_levels
from ._pvalues import ProportionCI, clopper_pearson
from ._quota import count_at_most
from ._settings import DEFAULT_SPLIT_SEED, DEFAULT_TRIALS, EST_FRACTION, ControlConfig
from ._splits import split_chunks

__all__ = ["CascadeValidation", "validate_cascade"]

_CHUNK = 64


@dataclass(frozen=True)
class CascadeValidation:
    """One level's validation: per selector ("ltt", "empirical") and measurement ("population",
    "fresh"), the violation rate of the joint guarantee with its 95% Clopper-Pearson interval,
    the violations of each risk, and the selection rate; `per_trial` holds every trial."""

    levels: CascadeLevels
    delta: float
    trials: int
    violation: dict[str, dict[str, ProportionCI]]
    risk_violations: dict[str, dict[str, dict[str, int]]]
    selection: dict[str, ProportionCI]
    per_trial: dict[str, NDArray] = field(repr=False)
    policy: str = "ctd"

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": "cascade",
            **({} if self.policy == "ctd" else {"policy": self.policy}),
            "levels": dict(self.levels.named()),
            "delta": self.delta,
            "trials": self.trials,
            **{
                selector: {
                    "selection_rate": self.selection[selector].proportion,
                    **{
                        measurement: {
                            "violation_rate": ci.proportion,
                            "violation_ci95": [ci.low, ci.high],
                            "risk_violations": self.risk_violations[selector][measurement],
                        }
                        for measurement, ci in self.violation[selector].items()
                    },
                }
                for selector in self.violation
            },
        }


def _violations(outcome: CascadeOutcome, levels: CascadeLevels) -> dict[str, NDArray[np.bool_]]:
    """Per controlled risk, the trials whose loss count exceeds floor(alpha m)."""
    out = {}
    for name, level in levels.named():
        if name.startswith("budget-"):
            losses = outcome.calls[:, int(name.removeprefix("budget-")) - 1]
        else:
            losses = outcome.wrong if name == "error" else outcome.abstained
        out[name] = losses > count_at_most(level, outcome.n)
    return out


def _empirical(
    scores: CascadeScores,
    est: NDArray[np.int64],
    cal: NDArray[np.int64],
    levels: CascadeLevels,
    grid: CascadeGrid,
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """The plug-in selector: of the configurations whose D_cal counts meet every level, the one
    the tested selector's keys prefer."""
    risks, est_counts = configuration_risks(scores, grid, est, cal, levels)
    selected = choose(meets_levels(risks), selection_keys(est_counts, scores.stages, est.shape[1]))
    thresholds, margin = grid.config(np.maximum(selected, 0))
    return selected, thresholds, margin


def validate_cascade(
    scores_by_seed: Mapping[int, CascadeScores],
    *,
    levels: Sequence[CascadeLevels],
    trials: int = DEFAULT_TRIALS,
    control: ControlConfig | None = None,
    cal_size: int | None = None,
    n_grid: int = CASCADE_GRID,
    abstain_margins: Sequence[float] = ABSTAIN_MARGINS,
    fresh: Mapping[int, CascadeScores] | None = None,
    seed: int = DEFAULT_SPLIT_SEED,
    policy: str = "ctd",
) -> list[CascadeValidation]:
    """Calibrate the cascade on `trials` random samples (round-robin over the seeds; `cal_size`
    rows each, default half of a seed's table) at every level and measure the chosen
    configurations. Margins are used only by levels that control abstention. `policy`: what
    each stage's threshold cuts (`cascade_policy_scores`: "ctd", the DV scores; "uncertainty")."""
    control = control or ControlConfig()
    scores_by_seed = {s: cascade_policy_scores(v, policy) for s, v in scores_by_seed.items()}
    if fresh is not None:
        fresh = {s: cascade_policy_scores(v, policy) for s, v in fresh.items()}
    seeds = sorted(scores_by_seed)
    per_seed = np.bincount(np.arange(trials) % len(seeds), minlength=len(seeds))
    columns: list[dict[str, list[NDArray]]] = [{} for _ in levels]

    def add(a: int, name: str, values: NDArray) -> None:
        columns[a].setdefault(name, []).append(values)

    for probe_seed, count in zip(seeds, per_seed, strict=True):
        scores = scores_by_seed[probe_seed]
        for splits in split_chunks(
            scores.n,
            int(count),
            [seed, probe_seed],
            chunk=_CHUNK,
            est_fraction=EST_FRACTION,
            cal_size=cal_size,
        ):
            population = np.concatenate([splits.cal, splits.evaluation], axis=1)
            for a, level in enumerate(levels):
                margins = abstain_margins if level.abstain is not None else (0.0,)
                grid = cascade_grid(scores, splits.est, n_grid=n_grid, margins=margins)
                batch = cascade_control_batch(scores, grid, splits.est, splits.cal, level, control=control)
                chosen = {
                    "ltt": (batch.selected, batch.thresholds, batch.margin),
                    "empirical": _empirical(scores, splits.est, splits.cal, level, grid),
                }
                add(a, "seed", np.full(splits.trials, probe_seed))
                for selector, (selected, thresholds, margin) in chosen.items():
                    picked = selected >= 0
                    add(a, f"{selector}_selected", picked)
                    # A trial with nothing chosen is measured as "never delegate": it violates nothing.
                    safe_thresholds = np.where(picked[:, None], thresholds, np.inf)
                    safe_margin = np.where(picked, margin, 0.0)
                    measured = {"population": (scores, population)}
                    if fresh is not None:
                        other = fresh[probe_seed]
                        measured["fresh"] = (other, np.tile(np.arange(other.n), (splits.trials, 1)))
                    for measurement, (table, index) in measured.items():
                        outcome = cascade_outcome(table, index, safe_thresholds, safe_margin)
                        violated = _violations(outcome, level)
                        any_risk = np.zeros(splits.trials, bool)
                        for risk, flags in violated.items():
                            add(a, f"{selector}_{measurement}_{risk}_violated", picked & flags)
                            any_risk |= flags
                        add(a, f"{selector}_{measurement}_violated", picked & any_risk)
                        for k in range(scores.stages):
                            add(a, f"{selector}_{measurement}_calls_{k + 1}", outcome.calls[:, k] / outcome.n)
                        add(a, f"{selector}_{measurement}_error", outcome.wrong / outcome.n)
                        add(a, f"{selector}_{measurement}_abstained", outcome.abstained / outcome.n)

    results = []
    for a, level in enumerate(levels):
        per_trial = {name: np.concatenate(parts) for name, parts in columns[a].items()}
        measurements = ("population", "fresh") if fresh is not None else ("population",)
        violation: dict[str, dict[str, ProportionCI]] = {}
        risks: dict[str, dict[str, dict[str, int]]] = {}
        selection = {}
        for selector in ("ltt", "empirical"):
            selection[selector] = clopper_pearson(int(per_trial[f"{selector}_selected"].sum()), trials)
            violation[selector] = {
                m: clopper_pearson(int(per_trial[f"{selector}_{m}_violated"].sum()), trials)
                for m in measurements
            }
            risks[selector] = {
                m: {
                    name: int(per_trial[f"{selector}_{m}_{name}_violated"].sum()) for name, _ in level.named()
                }
                for m in measurements
            }
        results.append(
            CascadeValidation(
                level, float(control.delta), trials, violation, risks, selection, per_trial, policy
            )
        )
    return results
