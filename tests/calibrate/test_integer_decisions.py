"""Integer decisions at the boundary: a violation at exactly alpha is not one, and quotas read
fractions as meant (no float over- or under-rounding)."""

from __future__ import annotations

import numpy as np

import calibrate

# Private: the quota rounding, unit-tested.
from calibrate._quota import count_at_most, count_nearest


def test_violation_at_exactly_alpha_is_not_a_violation() -> None:
    rng = np.random.default_rng(1)
    n = 200
    y = rng.integers(0, 2, n)
    p = np.where(rng.random(n) < 0.7, y * 0.8 + 0.1, 1 - (y * 0.8 + 0.1))
    scores = {0: calibrate.Scores(label=y, probe=p, expert=p, dv=rng.normal(size=n))}
    config = calibrate.ValidationConfig(delta=0.1, trials=2000)
    result = calibrate.validate(scores, mode="performance", alpha=0.3, config=config)
    trials = result.per_trial
    n_eval = result.split_sizes[0][2]
    errors = np.rint((1 - trials["accuracy"]) * n_eval).astype(int)
    limit = 30  # floor(0.3 * 100): 1 - (1 - 30/100) is 0.30000000000000004 in floats
    assert n_eval == 100
    assert ((errors == limit) & trials["selected"]).any(), "the boundary must be exercised"
    np.testing.assert_array_equal(trials["violated"], trials["selected"] & (errors > limit))


def test_quotas_read_fractions_as_meant() -> None:
    assert count_nearest(0.29, 50) == 15  # 0.29 * 50 = 14.499999999999998
    assert count_at_most(0.29, 100) == 29  # 0.29 * 100 = 28.999999999999996
    assert count_at_most(0.2222, 1_000_009) == 222_201  # 222201.9998: no over-rounding at scale
    assert count_at_most(0.3, 800) == 240
