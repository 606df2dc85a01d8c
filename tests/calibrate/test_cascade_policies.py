"""The uncertainty policy of a K-stage cascade: its signal by hand, its K = 1 counts against the
one-expert engine fed the same signal, and the sweep's and validation's policy dimension (CTD
rows unchanged, uncertainty rows those of the same machinery on the uncertainty signals)."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate
from calibrate import (
    CascadeLevels,
    CascadeScores,
    CascadeSweepConfig,
    cascade_grid,
    cascade_outcome,
    cascade_risks,
    uncertainty_signals,
)


def _table(n: int, stages: int, seed: int) -> CascadeScores:
    """Later experts better on hard inputs; noisy DV scores of each stage's value."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    sign = 2 * label - 1
    hard = np.abs(rng.normal(size=n))
    scores = [np.clip(0.5 + sign * (0.25 - 0.12 * hard) + rng.normal(0, 0.15, n), 0, 1)]
    for k in range(stages):
        skill = 0.28 + 0.04 * k
        scores.append(np.clip(0.5 + sign * (skill - 0.1 * hard / (k + 1)) + rng.normal(0, 0.15, n), 0, 1))
    stacked = np.stack(scores)
    dv = sign[None, :] * (stacked[1:] - stacked[:-1]) + rng.normal(0, 0.2, (stages, n))
    return CascadeScores(label, stacked[0], stacked[1:], dv)


def test_each_stage_sees_the_uncertainty_of_the_score_it_is_handed() -> None:
    scores = CascadeScores(
        label=np.array([0, 1, 1]),
        probe=np.array([0.125, 0.5, 0.75]),
        experts=np.array([[0.375, 1.0, 0.25], [0.0, 0.625, 0.5]]),
        dv=np.array([[9.0, 9.0, 9.0], [-9.0, -9.0, -9.0]]),
    )
    out = uncertainty_signals(scores)
    # stage 1: the probe's score; stage 2: expert 1's (expert 2's own score is never a signal).
    np.testing.assert_array_equal(out.dv, [[-0.375, 0.0, -0.25], [-0.125, -0.5, -0.25]])
    for name in ("label", "probe", "experts"):
        np.testing.assert_array_equal(getattr(out, name), getattr(scores, name))
    assert scores.dv[0, 0] == 9.0  # the input is left as it was
    assert calibrate.cascade_policy_scores(scores, "ctd") is scores
    with pytest.raises(ValueError, match="unknown cascade policy 'unc-topk'"):
        calibrate.cascade_policy_scores(scores, "unc-topk")


def test_one_stage_uncertainty_counts_are_the_single_expert_engines() -> None:
    """K = 1: each configuration's D_cal delegations and errors are those the one-expert engine
    counts for the same thresholds of the same signal, -|p - 0.5|, with expert overwrite.

    Not the one-expert "unc-calibrated" policy itself: it ranks by -|F(p) - 0.5|, F the
    empirical CDF of each trial's D_est probe scores (a per-trial signal the cascade's shared
    (K, n) signal cannot hold), and it averages probe and expert scores where the cascade
    overwrites. What both share is checked below: each delegates a central band of probe scores.
    """
    cascade = uncertainty_signals(_table(400, 1, seed=7))
    scores = calibrate.Scores(
        label=cascade.label, probe=cascade.probe, expert=cascade.experts[0], dv=cascade.dv[0]
    )
    splits = calibrate.random_splits(scores.n, 5, seed=2)
    signal = -np.abs(scores.probe - 0.5)[None, :]
    candidates = calibrate.threshold_candidates(
        scores, signal, splits, merge="overwrite", objective=None, n_grid=12
    )
    grid = cascade_grid(cascade, splits.est, n_grid=12)
    budget, error = cascade_risks(cascade, grid, splits.est, splits.cal, CascadeLevels((0.3,), error=0.2))
    np.testing.assert_array_equal(grid.thresholds[:, 0, ::-1], candidates.thresholds)
    np.testing.assert_array_equal(budget.cal_losses[:, ::-1], candidates.cal_delegated)
    np.testing.assert_array_equal(error.cal_losses[:, ::-1], candidates.cal_errors)
    # Every threshold delegates a band of probe scores around 0.5: any input nearer 0.5 than a
    # delegated one is delegated too.
    distance = np.abs(cascade.probe - 0.5)
    for g in range(grid.thresholds.shape[2]):
        outcome_mask = cascade.dv[0][splits.cal[0]] > grid.thresholds[0, 0, g]
        if outcome_mask.any() and not outcome_mask.all():
            d = distance[splits.cal[0]]
            assert d[outcome_mask].max() < d[~outcome_mask].min()


LEVELS = (CascadeLevels((0.5, 0.2), error=0.15), CascadeLevels((0.6, 0.3), error=0.15, abstain=0.1))


def test_the_sweep_adds_a_policy_column_only_beyond_ctd() -> None:
    by_seed = {seed: _table(1500, 2, seed) for seed in (0, 1)}
    default = calibrate.cascade_sweep(by_seed, CascadeSweepConfig(levels=LEVELS))
    assert tuple(default.table) == calibrate.cascade_sweep_columns(2)
    both = calibrate.cascade_sweep(
        by_seed, CascadeSweepConfig(levels=LEVELS, policies=("ctd", "uncertainty"))
    )
    assert tuple(both.table) == calibrate.cascade_sweep_columns(2, policy=True)
    assert list(both.table["policy"]) == ["ctd", "uncertainty"] * 4  # per seed, level, policy
    # The uncertainty rows are a CTD sweep of the uncertainty signals, split for split.
    signals = {seed: uncertainty_signals(s) for seed, s in by_seed.items()}
    direct = calibrate.cascade_sweep(signals, CascadeSweepConfig(levels=LEVELS))
    for policy, expected in (("ctd", default), ("uncertainty", direct)):
        rows = both.table["policy"] == policy
        for column, values in expected.table.items():
            np.testing.assert_array_equal(both.table[column][rows], values, err_msg=f"{policy} {column}")
    for name, values in default.baselines.items():
        np.testing.assert_array_equal(both.baselines[name], values)
    assert (both.table["n_certified"] > 0).any()
    # The realised rates are those of the uncertainty cascade run on the evaluation half.
    chosen = np.flatnonzero((both.table["policy"] == "uncertainty") & (both.table["n_certified"] > 0))
    i = chosen[0]
    seed = int(both.table["seed"][i])
    splits = calibrate.random_splits(1500, 1, [calibrate.DEFAULT_SPLIT_SEED, seed])
    thresholds = np.array([[both.table["threshold_1"][i], both.table["threshold_2"][i]]])
    outcome = cascade_outcome(
        signals[seed], splits.evaluation, thresholds, np.array([both.table["margin"][i]])
    )
    assert both.table["calls_2"][i] == outcome.calls[0, 1] / outcome.n


@pytest.mark.parametrize("policies", [(), ("ctd", "ctd"), ("ctd", "unc-calibrated")])
def test_bad_policies_are_refused(policies: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="policies must be distinct names from ctd, uncertainty"):
        CascadeSweepConfig(levels=LEVELS, policies=policies)


def test_validation_of_the_uncertainty_policy_is_the_validation_of_its_signals() -> None:
    by_seed = {0: _table(3000, 2, seed=5)}
    fresh = {0: _table(1000, 2, seed=6)}
    kwargs = {"levels": LEVELS[:1], "trials": 40, "cal_size": 600, "n_grid": 6}
    (via_policy,) = calibrate.validate_cascade(by_seed, fresh=fresh, policy="uncertainty", **kwargs)
    (direct,) = calibrate.validate_cascade(
        {0: uncertainty_signals(by_seed[0])}, fresh={0: uncertainty_signals(fresh[0])}, **kwargs
    )
    assert via_policy.to_dict() == {"policy": "uncertainty", **direct.to_dict()} != direct.to_dict()
    assert "policy" not in direct.to_dict()
    for name, values in direct.per_trial.items():
        np.testing.assert_array_equal(via_policy.per_trial[name], values, err_msg=name)
    assert via_policy.selection["ltt"].proportion > 0
    (ctd,) = calibrate.validate_cascade(by_seed, fresh=fresh, **kwargs)
    assert not np.array_equal(
        ctd.per_trial["ltt_population_calls_1"], via_policy.per_trial["ltt_population_calls_1"]
    )


def test_the_uncertainty_policy_keeps_the_joint_guarantee() -> None:
    """On a large table, the population violation rate of the certified uncertainty cascade is
    consistent with delta, while the untested selector on the same trials is caught above it."""
    (result,) = calibrate.validate_cascade(
        {0: _table(12_000, 2, seed=3)},
        levels=[CascadeLevels((0.6, 0.3), error=0.15, abstain=0.1)],
        trials=200,
        cal_size=600,
        control=calibrate.ControlConfig(delta=0.1),
        policy="uncertainty",
    )
    assert result.selection["ltt"].proportion > 0.5
    assert result.violation["ltt"]["population"].low <= 0.1
    assert result.violation["empirical"]["population"].low > 0.1
