"""The expert's prior divided out (`calibrate.ExpertCalibration`): contextual calibration is exactly
Zhao et al.'s p' ~ (p / q, (1 - p) / (1 - q)); the dev fit is the maximum of the Bernoulli
log-likelihood (checked against a brute-force grid); NaN stays NaN; bad input is one ValueError."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate
from calibrate import ExpertCalibration, contextual_calibration, fit_logit_shift


def _zhao(p: np.ndarray, q: float) -> np.ndarray:
    """The paper's rule, written as it is: the two-class vector times diag(q, 1-q)^-1, normalised."""
    high, low = p / q, (1 - p) / (1 - q)
    return high / (high + low)


def test_contextual_divides_out_the_mean_content_free_prior_exactly() -> None:
    calibration = contextual_calibration([0.9, 0.7, 0.8])
    assert calibration.kind == "contextual" and calibration.n == 3
    assert calibration.prior == pytest.approx(0.8)
    assert calibration.shift == pytest.approx(-np.log(0.8 / 0.2))
    p = np.array([0.8, 0.5, 0.95, 0.1, 0.9999])
    np.testing.assert_allclose(calibration.apply(p), _zhao(p, 0.8), rtol=1e-12)
    assert calibration.apply(0.8) == pytest.approx(0.5)  # the prior itself becomes undecided


def test_nan_and_certain_scores_pass_through_and_none_is_the_identity() -> None:
    p = np.array([np.nan, 0.0, 1.0, 0.3])
    shifted = ExpertCalibration("dev", shift=1.0).apply(p)
    assert np.isnan(shifted[0]) and shifted[1] == 0.0 and shifted[2] == 1.0
    assert shifted[3] == pytest.approx(1 / (1 + np.exp(-(np.log(0.3 / 0.7) + 1.0))))
    np.testing.assert_array_equal(ExpertCalibration().apply(p), p)


def test_content_free_failures_are_left_out_and_all_failed_is_an_error() -> None:
    assert contextual_calibration([0.6, np.nan]).prior == pytest.approx(0.6)
    with pytest.raises(ValueError, match="scored none of the content-free inputs"):
        contextual_calibration([np.nan, np.nan])


def _log_likelihood(p: np.ndarray, y: np.ndarray, b: float) -> float:
    q = ExpertCalibration("dev", shift=b).apply(p)
    return float(np.sum(y * np.log(q) + (1 - y) * np.log(1 - q)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_dev_fit_is_the_maximum_likelihood_shift(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = rng.beta(5, 2, size=60)  # a prior leaning high, as the embedded expert's does
    y = (rng.random(60) < 0.35).astype(int)
    fitted = fit_logit_shift(p, y)
    grid = np.linspace(-6, 6, 12001)  # steps of 0.001
    best = grid[np.argmax([_log_likelihood(p, y, b) for b in grid])]
    assert fitted.kind == "dev" and fitted.n == 60
    assert abs(fitted.shift - best) <= 0.001
    assert _log_likelihood(p, y, fitted.shift) >= max(
        _log_likelihood(p, y, b) for b in (best - 1e-3, best + 1e-3)
    )
    # At the optimum the calibrated scores' mean is the labels' mean (the score equation).
    assert fitted.apply(p).mean() == pytest.approx(y.mean(), abs=1e-9)


def test_certain_scores_have_no_say_in_the_dev_fit_and_no_prior_of_exactly_0_or_1_is_divided_out() -> None:
    """A score of exactly 0 or 1 (next-token scoring without the other label's token in the top
    logprobs) is one `apply` keeps: the dev fit maximises the likelihood of the rows it moves,
    whatever the certain rows' labels say."""
    rng = np.random.default_rng(0)
    moved = rng.uniform(0.05, 0.95, 400)
    y_moved = (rng.random(400) < moved).astype(int)  # calibrated already: the best shift is near 0
    # Confident answers, often wrong: 400 at exactly 1 (80% high), 200 at exactly 0 (10% high).
    p = np.concatenate([np.ones(400), np.zeros(200), moved])
    y = np.concatenate([rng.random(400) < 0.8, rng.random(200) < 0.1, y_moved]).astype(int)
    fitted = fit_logit_shift(p, y)
    assert fitted == fit_logit_shift(moved, y_moved) and fitted.n == 400
    grid = np.linspace(-3, 3, 6001)
    best = grid[np.argmax([_log_likelihood(moved, y_moved, b) for b in grid])]
    assert abs(fitted.shift - best) <= 0.001 and abs(fitted.shift) < 0.2
    applied = fitted.apply(p)
    np.testing.assert_array_equal(applied[:600], p[:600])
    assert applied[600:].mean() == pytest.approx(y_moved.mean(), abs=1e-9)
    # The rows it can move all of one label (both labels among the dev rows): no finite shift is
    # best, and the scores stay as they are.
    assert fit_logit_shift(np.array([1.0, 0.0, 0.7]), np.array([0, 1, 1])) == ExpertCalibration(
        "dev", 0.0, n=1
    )
    for certain in (0.0, 1.0):
        with pytest.raises(ValueError, match=f"P\\(high\\) = {certain:g} exactly"):
            contextual_calibration([certain, certain, np.nan])
    assert contextual_calibration([0.0, 1.0]).prior == 0.5  # a mean of certain scores can be divided out


def test_the_dev_fit_leaves_out_failed_rows_and_refuses_one_class() -> None:
    p, y = np.array([0.9, 0.8, np.nan, 0.3]), np.array([1, 0, 1, 0])
    assert fit_logit_shift(p, y).n == 3
    with pytest.raises(ValueError, match="needs both labels"):
        fit_logit_shift(np.array([0.9, 0.8]), np.array([1, 1]))
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        fit_logit_shift(np.array([0.9, 0.8]), np.array([1, 2]))


def test_a_calibration_round_trips_through_json_and_refuses_a_bad_kind() -> None:
    calibration = contextual_calibration([0.7])
    assert ExpertCalibration.from_json(calibration.to_json()) == calibration
    with pytest.raises(ValueError, match="choose from none, contextual, dev"):
        ExpertCalibration("platt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not finite"):
        ExpertCalibration("dev", shift=float("inf"))
    assert calibrate.EXPERT_CALIBRATIONS == ("none", "contextual", "dev")
    assert calibrate.CONTENT_FREE_INPUTS == ("N/A", "", "[MASK]")
