"""The guarantees, validated empirically on simulated scores tables.

The fast tests use the split-half protocol of `ctd validate` (the paper's). The slow ones
calibrate on 800 examples and evaluate on 40,000 fresh ones, which measures the population
risk of each returned policy and so the LTT guarantee itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import calibrate
from harness import scores_from_columns, simulate_scores

DELTA = 0.1


def monte_carlo_margin(trials: int, rate: float = DELTA) -> float:
    """Three binomial standard errors: a rate at delta exceeds delta + margin w.p. ~0.1%."""
    return 3.0 * np.sqrt(rate * (1 - rate) / trials)


def test_margin_is_what_it_claims() -> None:
    # The exact binomial upper tail at the margin must be small, not just the normal one.
    trials = 500
    k = int(np.floor((DELTA + monte_carlo_margin(trials)) * trials))
    assert 1.0 - calibrate.binomial_pvalue(k, trials, DELTA) < 0.005


def simulated(scenario: str, n: int, seeds: int, random_state: int = 0) -> dict[int, calibrate.Scores]:
    columns = simulate_scores(scenario, n, seeds, n_dev=0, random_state=random_state)  # type: ignore[arg-type]
    return scores_from_columns(columns).test_scores()


@pytest.mark.parametrize("scenario", ["strong", "weak"])
def test_budget_guarantee_over_500_splits(scenario: str) -> None:
    result = calibrate.validate(
        simulated(scenario, 1600, 3), mode="budget", alpha=0.3, delta=DELTA, trials=500
    )
    assert result.tested.trials == 500
    assert result.tested.selection_rate == 1.0  # budget control always has "never delegate"
    assert result.tested.violation_rate <= DELTA + monte_carlo_margin(500)
    # Realised budgets sit below the target on average, yet the procedure is not trivially
    # safe: it uses most of the budget (never delegating would also pass the line above).
    assert 0.2 < result.tested.mean_realised_budget < 0.3


@pytest.mark.parametrize("scenario", ["strong", "weak"])
def test_empirical_selector_violates_far_more_often(scenario: str) -> None:
    result = calibrate.validate(
        simulated(scenario, 1600, 3), mode="performance", alpha=0.22, delta=DELTA, trials=500
    )
    assert result.empirical is not None
    assert result.tested.violation_rate <= DELTA + monte_carlo_margin(500)
    assert result.empirical.violation_rate > 2 * DELTA
    assert result.empirical.violation_rate > 2.5 * result.tested.violation_rate
    # The price of the guarantee: more delegation than the plug-in selector.
    assert result.tested.mean_realised_budget > result.empirical.mean_realised_budget


def test_paper_qualitative_findings() -> None:
    """Weak expert: CTD plateaus and top-k spends its quota; strong expert: CTD beats
    uncertainty top-k at a moderate budget."""
    config = calibrate.SweepConfig(budgets=(0.334211, 0.95), batch_sizes=(128,))
    weak = calibrate.sweep(simulated("weak", 1600, 3), config).table
    at_95 = (weak["budget"] == 0.95) & (weak["objective"] == "accuracy")
    ctd = weak["realised"][at_95 & (weak["policy"] == "ctd")].mean()
    topk = weak["realised"][at_95 & (weak["policy"] == "unc-topk")].mean()
    assert ctd < 0.5
    assert topk == pytest.approx(0.95, abs=0.01)
    assert (
        weak["accuracy"][at_95 & (weak["policy"] == "ctd")].mean()
        > weak["accuracy"][at_95 & (weak["policy"] == "unc-topk")].mean()
    )

    strong = calibrate.sweep(simulated("strong", 1600, 3), config).table
    at_33 = (strong["budget"] == 0.334211) & (strong["objective"] == "auroc")
    assert (
        strong["auroc"][at_33 & (strong["policy"] == "ctd")].mean()
        > strong["auroc"][at_33 & (strong["policy"] == "unc-topk")].mean()
    )


FRESH = 40_000
CALIBRATION = 800


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["strong", "weak"])
@pytest.mark.parametrize("alpha", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("pareto", [True, False])
def test_budget_guarantee_on_fresh_data(scenario: str, alpha: float, pareto: bool) -> None:
    scores = simulated(scenario, FRESH + CALIBRATION, 1, random_state=7)
    trials = 2000
    result = calibrate.validate(
        scores,
        mode="budget",
        alpha=alpha,
        delta=DELTA,
        trials=trials,
        pareto=pareto,
        objective="accuracy",
        cal_fraction=CALIBRATION / (FRESH + CALIBRATION),
    )
    assert result.split_sizes[0][2] == FRESH
    assert result.tested.violation_rate <= DELTA + monte_carlo_margin(trials)


@pytest.mark.slow
@pytest.mark.parametrize("scenario,alpha", [("strong", 0.2), ("weak", 0.22), ("weak", 0.25)])
def test_performance_guarantee_on_fresh_data(scenario: str, alpha: float) -> None:
    scores = simulated(scenario, FRESH + CALIBRATION, 1, random_state=11)
    trials = 2000
    result = calibrate.validate(
        scores,
        mode="performance",
        alpha=alpha,
        delta=DELTA,
        trials=trials,
        cal_fraction=CALIBRATION / (FRESH + CALIBRATION),
    )
    assert result.tested.violation_rate <= DELTA + monte_carlo_margin(trials)


@pytest.mark.slow
def test_pareto_filtering_is_more_conservative_with_a_weak_expert() -> None:
    scores = simulated("weak", 1600, 3)
    pareto = calibrate.validate(scores, mode="budget", alpha=0.3, delta=DELTA, trials=2000)
    budget_only = calibrate.validate(scores, mode="budget", alpha=0.3, delta=DELTA, trials=2000, pareto=False)
    assert pareto.tested.violation_rate < budget_only.tested.violation_rate
    assert pareto.tested.mean_realised_budget < budget_only.tested.mean_realised_budget
