"""FWER and audit records: NaN inside a fixed-sequence family, k* against the fixed sequence
(and not claimed for Holm or Bonferroni), and the checks of a Candidates record."""

from __future__ import annotations

import numpy as np
import pytest

import calibrate

# Private: the batched fixed-sequence procedure, unit-tested.
from calibrate._fwer import FixedSequence


def test_fixed_sequence_rejects_nan_inside_a_family() -> None:
    with pytest.raises(ValueError, match="NaN"):
        calibrate.control_fwer([0.01, np.nan, 0.01], 0.1)
    with pytest.raises(ValueError, match="prefix"):
        FixedSequence().run_batch([[0.01, np.nan, 0.01]], 0.1)


def random_candidates(rng: np.random.Generator, size: int = 30) -> calibrate.Candidates:
    thresholds = np.concatenate([[np.inf], np.sort(rng.normal(size=size - 1))[::-1]])
    n_cal = int(rng.integers(50, 400))
    budget = np.sort(rng.random(size))
    budget[0] = 0.0
    return calibrate.Candidates(
        thresholds=thresholds,
        est_budget=budget,
        est_objective=rng.random(size),
        est_error=rng.random(size),
        cal_delegated=np.sort(rng.integers(0, n_cal + 1, size)),
        cal_errors=rng.integers(0, n_cal + 1, size),
        n_est=100,
        n_cal=n_cal,
    )


def test_kstar_decides_exactly_the_fixed_sequence() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        c = random_candidates(rng)
        alpha = float(rng.uniform(0.05, 0.6))
        r = calibrate.budget_control(
            c, alpha=alpha, control=calibrate.ControlConfig(delta=0.1, pareto=bool(rng.integers(0, 2)))
        )
        reached = r.order if r.stopped_at is None else r.order[: r.stopped_at + 1]
        k = r.k[: reached.size]
        np.testing.assert_array_equal(np.isin(reached, r.certified), k <= r.kstar)
        if r.stopped_at is not None:
            assert r.k[r.stopped_at] > r.kstar


@pytest.mark.parametrize("fwer", ["holm", "bonferroni"])
def test_kstar_is_not_claimed_for_holm_or_bonferroni(fwer: calibrate.FWERMethod) -> None:
    c = random_candidates(np.random.default_rng(4))
    r = calibrate.budget_control(c, alpha=0.3, control=calibrate.ControlConfig(delta=0.1, fwer=fwer))
    assert r.kstar is None
    assert r.to_dict()["kstar"] is None


def test_candidates_need_never_delegate_and_consistent_counts() -> None:
    c = random_candidates(np.random.default_rng(5))
    with pytest.raises(ValueError, match="never delegate"):
        calibrate.Candidates(**{**c.__dict__, "thresholds": np.ones_like(c.thresholds)})
    with pytest.raises(ValueError, match="cal_delegated"):
        calibrate.Candidates(**{**c.__dict__, "cal_delegated": c.cal_delegated + c.n_cal + 1})
    with pytest.raises(ValueError, match="shape"):
        calibrate.Candidates(**{**c.__dict__, "est_error": c.est_error[:-1]})
