"""K-stage cascades: the configuration counts against a direct run of the cascade, K = 1 against
the single-expert engine, and the joint guarantee (each expert's budget, the error, the
abstention rate) on held-out populations, with an anti-conservative variant caught."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate

# Private: the configuration counts, checked against the direct run of the cascade.
from calibrate._cascade import (
    ABSTAIN_MARGINS,
    CascadeLevels,
    CascadeScores,
    _counts,
    cascade_control_batch,
    cascade_grid,
    cascade_outcome,
    cascade_risks,
    choose,
    configuration_risks,
    selection_keys,
)
from calibrate._cascade_validate import validate_cascade
from calibrate._joint import run_joint_tests


def cascade_table(n: int, stages: int, seed: int) -> CascadeScores:
    """A cascade whose later experts are better on hard inputs, with noisy DV scores of the
    value of each stage over the one before."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    sign = 2 * label - 1
    hard = np.abs(rng.normal(size=n))
    scores = [np.clip(0.5 + sign * (0.25 - 0.12 * hard) + rng.normal(0, 0.15, n), 0, 1)]
    for k in range(stages):
        skill = 0.28 + 0.04 * k
        scores.append(np.clip(0.5 + sign * (skill - 0.1 * hard / (k + 1)) + rng.normal(0, 0.15, n), 0, 1))
    stacked = np.stack(scores)
    value = sign[None, :] * (stacked[1:] - stacked[:-1])
    dv = value + rng.normal(0, 0.2, value.shape)
    return CascadeScores(label, stacked[0], stacked[1:], dv)


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("margins", [(0.0,), ABSTAIN_MARGINS])
def test_configuration_counts_equal_a_direct_run_of_the_cascade(
    stages: int, margins: tuple[float, ...]
) -> None:
    scores = cascade_table(300, stages, seed=stages)
    splits = calibrate.random_splits(scores.n, 6, seed=1)
    grid = cascade_grid(scores, splits.est, n_grid=6, margins=margins)
    counts = _counts(scores, grid, splits.cal)
    for index in np.random.default_rng(0).integers(0, grid.size, 40):
        thresholds, margin = grid.config(np.full(splits.trials, index))
        direct = cascade_outcome(scores, splits.cal, thresholds, margin)
        for k in range(stages):
            assert (counts[f"calls-{k + 1}"][:, index] == direct.calls[:, k]).all()
        assert (counts["wrong"][:, index] == direct.wrong).all()
        assert (splits.cal.shape[1] - counts["kept"][:, index] == direct.abstained).all()


def test_one_stage_counts_are_the_single_expert_engines() -> None:
    """K = 1 without abstention: each configuration's D_cal delegations and errors are those
    `threshold_candidates` counts for the same thresholds."""
    cascade = cascade_table(400, 1, seed=7)
    scores = calibrate.Scores(
        label=cascade.label, probe=cascade.probe, expert=cascade.experts[0], dv=cascade.dv[0]
    )
    splits = calibrate.random_splits(scores.n, 5, seed=2)
    signal = calibrate.policy_signal(scores, calibrate.POLICIES["ctd"], splits)
    candidates = calibrate.threshold_candidates(
        scores, signal, splits, merge="overwrite", objective=None, n_grid=12
    )
    grid = cascade_grid(cascade, splits.est, n_grid=12)
    budget, error = cascade_risks(cascade, grid, splits.est, splits.cal, CascadeLevels((0.3,), error=0.2))
    np.testing.assert_array_equal(grid.thresholds[:, 0, ::-1], candidates.thresholds)
    np.testing.assert_array_equal(budget.cal_losses[:, ::-1], candidates.cal_delegated)
    np.testing.assert_array_equal(error.cal_losses[:, ::-1], candidates.cal_errors)


def _union_of_single_risk_tests(
    scores: CascadeScores, splits: calibrate.Splits, levels: CascadeLevels, control: calibrate.ControlConfig
) -> np.ndarray:
    """Anti-conservative on purpose: each risk tested alone at delta, and a configuration
    certified when ANY of those tests certified it."""
    margins = ABSTAIN_MARGINS if levels.abstain is not None else (0.0,)
    grid = cascade_grid(scores, splits.est, margins=margins)
    risks, est_counts = configuration_risks(scores, grid, splits.est, splits.cal, levels)
    keys = selection_keys(est_counts, scores.stages, splits.est.shape[1])
    members = np.ones(keys[0].shape, bool)
    certified = np.zeros(keys[0].shape, bool)
    for risk in risks:
        certified |= run_joint_tests([risk], members, tuple(keys[:-1]), control).certified
    return grid.config(np.maximum(choose(certified, keys), 0)), choose(certified, keys) >= 0


def _population_violation(
    scores: CascadeScores, levels: CascadeLevels, selector, trials: int = 200
) -> calibrate.ProportionCI:
    """The joint violation rate on the population (table minus D_est) over random 600-row
    calibration samples of a large table."""
    splits = calibrate.random_splits(scores.n, trials, seed=11, cal_size=600)
    population = np.concatenate([splits.cal, splits.evaluation], axis=1)
    (thresholds, margin), picked = selector(splits)
    outcome = cascade_outcome(
        scores, population, np.where(picked[:, None], thresholds, np.inf), np.where(picked, margin, 0.0)
    )
    violated = np.zeros(trials, bool)
    for name, level in levels.named():
        if name.startswith("budget-"):
            losses = outcome.calls[:, int(name.removeprefix("budget-")) - 1]
        else:
            losses = outcome.wrong if name == "error" else outcome.abstained
        violated |= losses > int(np.floor(level * outcome.n + 1e-9))
    return calibrate.clopper_pearson(int((picked & violated).sum()), trials)


LEVELS = [
    CascadeLevels((0.5, 0.2), error=0.2),
    CascadeLevels((0.6, 0.3), error=0.15, abstain=0.1),
]


@pytest.mark.parametrize("levels", LEVELS, ids=["budgets-error", "budgets-error-abstain"])
def test_the_joint_guarantee_holds_and_the_union_of_single_tests_is_caught(levels: CascadeLevels) -> None:
    scores = cascade_table(12_000, 2, seed=3)
    control = calibrate.ControlConfig(delta=0.1)

    def ltt(splits: calibrate.Splits):
        margins = ABSTAIN_MARGINS if levels.abstain is not None else (0.0,)
        grid = cascade_grid(scores, splits.est, margins=margins)
        batch = cascade_control_batch(scores, grid, splits.est, splits.cal, levels, control=control)
        return (batch.thresholds, batch.margin), batch.selected >= 0

    tested = _population_violation(scores, levels, ltt)
    broken = _population_violation(
        scores, levels, lambda s: _union_of_single_risk_tests(scores, s, levels, control)
    )
    assert tested.high <= control.delta + 0.02, tested
    assert broken.low > control.delta, broken


def test_validation_reports_each_risk_and_the_empirical_selector_beside_it() -> None:
    table, fresh = cascade_table(6_000, 2, seed=5), cascade_table(6_000, 2, seed=6)
    (result,) = validate_cascade(
        {0: table}, levels=[CascadeLevels((0.5, 0.2), error=0.2)], trials=60, cal_size=600, fresh={0: fresh}
    )
    record = result.to_dict()
    assert record["levels"] == {"budget-1": 0.5, "budget-2": 0.2, "error": 0.2}
    for selector in ("ltt", "empirical"):
        assert set(record[selector]) == {"selection_rate", "population", "fresh"}
        assert set(record[selector]["fresh"]["risk_violations"]) == {"budget-1", "budget-2", "error"}
    assert result.selection["ltt"].proportion > 0.5
    # The plug-in selector puts each risk at its level: it violates far more often than LTT.
    assert result.violation["empirical"]["fresh"].k > result.violation["ltt"]["fresh"].k
    assert len(result.per_trial["ltt_selected"]) == 60


def test_bad_levels_are_refused() -> None:
    scores = cascade_table(200, 2, seed=0)
    splits = calibrate.random_splits(scores.n, 2, seed=0)
    grid = cascade_grid(scores, splits.est)
    with pytest.raises(ValueError, match="at least one level"):
        CascadeLevels((None, None))
    with pytest.raises(ValueError, match=r"lie in \(0, 1\)"):
        CascadeLevels((0.3, 1.2))
    with pytest.raises(ValueError, match="1 budgets for a cascade of 2"):
        cascade_risks(scores, grid, splits.est, splits.cal, CascadeLevels((0.3,)))
    with pytest.raises(ValueError, match="abstention level needs"):
        cascade_risks(scores, grid, splits.est, splits.cal, CascadeLevels((0.3, 0.1), abstain=0.1))
    with pytest.raises(ValueError, match="margins must start at 0"):
        cascade_grid(scores, splits.est, margins=(0.1, 0.2))
    assert isinstance(
        cascade_risks(scores, grid, splits.est, splits.cal, CascadeLevels((0.3, None)))[0],
        calibrate.RiskCounts,
    )
