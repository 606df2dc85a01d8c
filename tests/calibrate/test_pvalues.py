"""Exact binomial p-values, k*, calibration size, Hoeffding-Bentkus and Clopper-Pearson.

References: scipy.stats (boost), mpmath at 50 digits, MAPIE's LTT p-values.

Tolerance note: `binomial_pvalue` uses `scipy.special.bdtr` (cephes) while `scipy.stats.binom.cdf`
uses boost; the two agree to ~2e-11 relative for n <= 5000 and boost itself loses accuracy near
the underflow limit (< 1e-250). So the scipy comparison uses rtol 1e-9 where the reference exceeds
1e-200, and the far tail is checked against mpmath instead.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from mapie.risk_control.methods import compute_hoeffding_bentkus_p_value
from scipy import stats

from calibrate import (
    ProportionCI,
    binomial_pvalue,
    calibration_size,
    clopper_pearson,
    hoeffding_bentkus_pvalue,
    min_calibration_size,
    min_certifiable_level,
)

# Private: k*, unit-tested against the p-values.
from calibrate._pvalues import binomial_kstar

SETTINGS = settings(max_examples=200, deadline=None)

alphas = st.floats(min_value=1e-6, max_value=1 - 1e-6, allow_nan=False)
deltas = st.floats(min_value=1e-4, max_value=0.5, allow_nan=False)


@st.composite
def count_pairs(draw: st.DrawFn, max_n: int = 5000, min_n: int = 0) -> tuple[int, int]:
    n = draw(st.integers(min_value=min_n, max_value=max_n))
    k = draw(st.integers(min_value=0, max_value=n))
    return k, n


def mp_binom_cdf(k: int, n: int, alpha: float) -> mpmath.mpf:
    """P(Binomial(n, alpha) <= k) as a 50-digit sum over the lower tail (alpha taken exactly)."""
    with mpmath.workdps(50):
        a = mpmath.mpf(alpha)
        return mpmath.fsum(mpmath.binomial(n, i) * a**i * (1 - a) ** (n - i) for i in range(k + 1))


def mapie_hb(loss_mean: float, n: int, alpha: float, binary: bool) -> float:
    out = compute_hoeffding_bentkus_p_value(np.array([loss_mean]), n, [alpha], binary=binary)
    assert out.shape == (1, 1)
    return float(out[0, 0])


def mean_with_exact_count(k: int, n: int) -> float:
    """A float r with ceil(n * r) == k, as MAPIE recovers the count from the mean.

    k / n itself sometimes gives ceil(n * (k / n)) = k + 1 through rounding (the pitfall our API
    avoids by taking integer counts); step down by ulps until the product rounds back to k."""
    r = k / n
    while math.ceil(n * r) > k:
        r = float(np.nextafter(r, 0.0))
    return r


# --------------------------------------------------------------------------- binomial_pvalue


@SETTINGS
@given(kn=count_pairs(), alpha=alphas)
def test_binomial_pvalue_matches_scipy(kn: tuple[int, int], alpha: float) -> None:
    k, n = kn
    ours = float(binomial_pvalue(k, n, alpha))
    ref = float(stats.binom.cdf(k, n, alpha))
    assert 0.0 <= ours <= 1.0
    assert abs(ours - ref) <= 1e-10
    if ref > 1e-200:
        assert ours == pytest.approx(ref, rel=1e-9)


def test_binomial_pvalue_vectorised_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    n = rng.integers(0, 3000, size=5000)
    k = np.minimum((rng.uniform(size=n.size) * (n + 1)).astype(np.int64), n)
    alpha = rng.uniform(1e-4, 1 - 1e-4, size=n.size)
    ours = binomial_pvalue(k, n, alpha)
    ref = stats.binom.cdf(k, n, alpha)
    assert ours.shape == k.shape
    big = ref > 1e-200
    np.testing.assert_allclose(ours[big], ref[big], rtol=1e-9)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(kn=count_pairs(max_n=400), alpha=st.floats(min_value=1e-3, max_value=1 - 1e-3))
def test_binomial_pvalue_matches_mpmath(kn: tuple[int, int], alpha: float) -> None:
    k, n = kn
    ref = mp_binom_cdf(k, n, alpha)
    ours = float(binomial_pvalue(k, n, alpha))
    if ref < mpmath.mpf("1e-300"):
        assert ours <= 1e-299
    else:
        assert float(abs(mpmath.mpf(ours) - ref) / ref) <= 1e-11


@SETTINGS
@given(n=st.integers(min_value=0, max_value=10_000), alpha=alphas)
def test_binomial_pvalue_edges(n: int, alpha: float) -> None:
    assert float(binomial_pvalue(n, n, alpha)) == 1.0
    with mpmath.workdps(50):
        zero_losses = (1 - mpmath.mpf(alpha)) ** n
    p0 = float(binomial_pvalue(0, n, alpha))
    if zero_losses > mpmath.mpf("1e-300"):
        assert float(abs(mpmath.mpf(p0) - zero_losses) / zero_losses) <= 1e-11
    assert p0 == pytest.approx((1 - alpha) ** n, rel=1e-9, abs=1e-300)


def test_binomial_pvalue_no_data_is_one() -> None:
    for alpha in (1e-6, 0.1, 0.5, 0.999):
        assert float(binomial_pvalue(0, 0, alpha)) == 1.0


def test_binomial_pvalue_is_monotone_in_k() -> None:
    n = 731
    for alpha in (0.01, 0.2, 0.5, 0.93):
        p = binomial_pvalue(np.arange(n + 1), n, alpha)
        assert np.all(np.diff(p) >= 0)
        assert p[-1] == 1.0


@pytest.mark.parametrize(
    ("k", "n", "alpha", "error"),
    [
        (1.0, 10, 0.1, TypeError),  # float count
        (3, 10.0, 0.1, TypeError),  # float sample size
        (np.array([0.0, 1.0]), 10, 0.1, TypeError),
        (True, 10, 0.1, TypeError),  # bool count
        (np.array([True, False]), 10, 0.1, TypeError),
        (11, 10, 0.1, ValueError),  # k > n
        (-1, 10, 0.1, ValueError),  # k < 0
        (3, 10, 0.0, ValueError),  # alpha outside (0, 1)
        (3, 10, 1.0, ValueError),
        (3, 10, -0.2, ValueError),
        (3, 10, 1.5, ValueError),
        (3, 10, float("nan"), ValueError),
    ],
)
def test_binomial_pvalue_rejects_bad_input(k: object, n: object, alpha: float, error: type) -> None:
    with pytest.raises(error):
        binomial_pvalue(k, n, alpha)


# --------------------------------------------------------------------------- binomial_kstar


@SETTINGS
@given(n=st.integers(min_value=0, max_value=3000), alpha=alphas, delta=deltas)
def test_binomial_kstar_brackets_delta(n: int, alpha: float, delta: float) -> None:
    kstar = int(binomial_kstar(n, alpha, delta))
    assert -1 <= kstar <= n
    if float(binomial_pvalue(0, n, alpha)) > delta:
        assert kstar == -1
    else:
        assert kstar >= 0
        assert float(binomial_pvalue(kstar, n, alpha)) <= delta
        if kstar < n:
            assert float(binomial_pvalue(kstar + 1, n, alpha)) > delta
    # The decision "k <= k*" agrees with "p(k) <= delta" for every possible count.
    k = np.arange(n + 1)
    np.testing.assert_array_equal(k <= kstar, binomial_pvalue(k, n, alpha) <= delta)


def test_binomial_kstar_minus_one_when_zero_losses_do_not_reject() -> None:
    # (1 - 0.1)^10 = 0.3487 > 0.1: not even k = 0 rejects.
    assert (1 - 0.1) ** 10 > 0.1
    assert int(binomial_kstar(10, 0.1, 0.1)) == -1
    assert int(binomial_kstar(0, 0.5, 0.4)) == -1


def test_binomial_kstar_vectorised() -> None:
    rng = np.random.default_rng(1)
    n = rng.integers(0, 2000, size=300)
    alpha = rng.uniform(0.01, 0.9, size=n.size)
    delta = rng.uniform(0.01, 0.3, size=n.size)
    kstar = binomial_kstar(n, alpha, delta)
    assert kstar.shape == n.shape
    for i in range(n.size):
        assert kstar[i] == int(binomial_kstar(int(n[i]), float(alpha[i]), float(delta[i])))


# --------------------------------------------------------------------------- min_calibration_size


@SETTINGS
@given(alpha=st.floats(min_value=1e-3, max_value=0.9), delta=st.floats(min_value=1e-4, max_value=0.9))
def test_min_calibration_size_is_smallest(alpha: float, delta: float) -> None:
    n = min_calibration_size(alpha, delta)
    assert isinstance(n, int)
    with mpmath.workdps(50):
        a, d = mpmath.mpf(alpha), mpmath.mpf(delta)
        at_n = (1 - a) ** n
        below = (1 - a) ** (n - 1) if n > 0 else None
        # Skip knife-edge cases where a float evaluation cannot decide the comparison.
        assume(abs(at_n - d) > d * mpmath.mpf("1e-9"))
        assume(below is None or abs(below - d) > d * mpmath.mpf("1e-9"))
        assert at_n <= d
        assert below is None or below > d
    # Consistency with the p-value used for decisions.
    assert float(binomial_pvalue(0, n, alpha)) <= delta
    if n > 0:
        assert float(binomial_pvalue(0, n - 1, alpha)) > delta


def test_min_calibration_size_known_values() -> None:
    # ceil(log(delta) / log(1 - alpha)) worked out by hand: log(0.1)/log(0.9) = 21.85 -> 22,
    # log(0.05)/log(0.95) = 58.4 -> 59.
    assert min_calibration_size(0.1, 0.1) == 22
    assert min_calibration_size(0.05, 0.05) == 59
    with pytest.raises(ValueError):
        min_calibration_size(0.0, 0.1)
    with pytest.raises(ValueError):
        min_calibration_size(0.1, 1.0)


# --------------------------------------------------------------------------- min_certifiable_level


@SETTINGS
@given(n=st.integers(min_value=1, max_value=100_000), delta=st.floats(min_value=1e-4, max_value=0.9))
def test_min_certifiable_level_is_the_inverse_of_min_calibration_size(n: int, delta: float) -> None:
    level = min_certifiable_level(n, delta)
    assert 0 < level < 1
    # Certified with n rows at that level (the same zero-loss p-value the calibration uses)...
    assert float(binomial_pvalue(0, n, level)) <= delta
    assert min_calibration_size(level, delta) <= n
    # ...and it is the exact root 1 - delta^(1/n) up to the float evaluation of the tail (below
    # the root nothing is certifiable).
    with mpmath.workdps(50):
        root = 1 - mpmath.mpf(delta) ** (1 / mpmath.mpf(n))
        assert abs(mpmath.mpf(level) - root) <= root * mpmath.mpf("1e-9")


def test_min_certifiable_level_known_values() -> None:
    # 14 rows (the D_cal of a 40-row test split) at delta 0.1: 1 - 0.1^(1/14) = 0.15166; 0.15
    # needs 15 rows, 0.16 needs 14. One row certifies only alpha >= 1 - delta.
    assert min_certifiable_level(14, 0.1) == pytest.approx(0.151657, abs=1e-6)
    assert min_calibration_size(0.15, 0.1) == 15 and min_calibration_size(0.16, 0.1) == 14
    assert min_certifiable_level(1, 0.1) == pytest.approx(0.9)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            min_certifiable_level(bad, 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        min_certifiable_level(10, 1.0)


# --------------------------------------------------------------------------- calibration_size


@SETTINGS
@given(
    n=st.integers(min_value=0, max_value=10_000),
    alpha=st.floats(min_value=1e-3, max_value=0.9),
    delta=st.floats(min_value=1e-4, max_value=0.9),
)
def test_calibration_size_decides_as_the_zero_loss_test(n: int, alpha: float, delta: float) -> None:
    size = calibration_size(n, alpha, delta)
    assert size.need == min_calibration_size(alpha, delta)
    assert size.enough == (n >= size.need)
    low = size.lowest_level()
    if n == 0:
        assert low is None
        return
    # The smallest three-decimal level n rows certify: at or above the exact level (so certified
    # itself), and one step below it is not. The step is taken on the grid: `level + 0.001` in
    # floats rounds to 1.0 for a level just above 0.999 (n=1, delta=0.001: the float 0.999 lies
    # below 1 - delta, so low is 1.0, and 0.999 is not certified).
    level = min_certifiable_level(n, delta)
    assert low is not None and level <= low and round(low - 0.001, 3) < level


def test_calibration_size_known_values() -> None:
    # 14 rows at delta 0.1 (min_certifiable_level 0.15166): 0.15 needs 15, 0.16 needs 14.
    short, enough = calibration_size(14, 0.15, 0.1), calibration_size(14, 0.16, 0.1)
    assert (short.enough, short.need, enough.enough, enough.need) == (False, 15, True, 14)
    assert short.lowest_level() == 0.152 and short.lowest_level(2) == 0.16
    assert calibration_size(0, 0.5, 0.1).lowest_level() is None
    with pytest.raises(ValueError):
        calibration_size(10, 0.0, 0.1)


# --------------------------------------------------------------------------- Hoeffding-Bentkus


@SETTINGS
@given(kn=count_pairs(max_n=3000, min_n=1), alpha=st.floats(min_value=1e-3, max_value=1 - 1e-3))
def test_hoeffding_bentkus_matches_mapie(kn: tuple[int, int], alpha: float) -> None:
    k, n = kn
    ours = float(hoeffding_bentkus_pvalue(k, n, alpha))
    ref = mapie_hb(mean_with_exact_count(k, n), n, alpha, binary=False)
    assert 0.0 <= ours <= 1.0
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-200)
    # With the naive mean k / n MAPIE can round the count up to k + 1 and so is never smaller.
    naive = mapie_hb(k / n, n, alpha, binary=False)
    assert ours <= naive * (1 + 1e-9) + 1e-200


@SETTINGS
@given(kn=count_pairs(max_n=3000, min_n=1), alpha=st.floats(min_value=1e-3, max_value=1 - 1e-3))
def test_hoeffding_bentkus_dominates_exact_binomial(kn: tuple[int, int], alpha: float) -> None:
    k, n = kn
    hb = float(hoeffding_bentkus_pvalue(k, n, alpha))
    exact = float(binomial_pvalue(k, n, alpha))
    assert hb >= exact * (1 - 1e-12)


@SETTINGS
@given(kn=count_pairs(max_n=3000, min_n=1), alpha=st.floats(min_value=1e-3, max_value=1 - 1e-3))
def test_mapie_binary_hb_equals_exact_binomial(kn: tuple[int, int], alpha: float) -> None:
    # For 0/1 losses the Hoeffding bound is a Chernoff bound on the same tail, so
    # min(Hoeffding, exact tail) is the exact tail: MAPIE's binary HB is our exact p-value.
    k, n = kn
    ref = mapie_hb(mean_with_exact_count(k, n), n, alpha, binary=True)
    assert float(binomial_pvalue(k, n, alpha)) == pytest.approx(ref, rel=1e-9, abs=1e-200)


def test_hoeffding_bentkus_fractional_loss_sums_match_mapie() -> None:
    rng = np.random.default_rng(2)
    for _ in range(300):
        n = int(rng.integers(1, 2000))
        loss_sum = float(rng.integers(0, n)) + float(rng.uniform(0.05, 0.95))
        alpha = float(rng.uniform(0.01, 0.9))
        ours = float(hoeffding_bentkus_pvalue(loss_sum, n, alpha))
        ref = mapie_hb(loss_sum / n, n, alpha, binary=False)
        assert ours == pytest.approx(ref, rel=1e-9, abs=1e-200)


def test_hoeffding_bentkus_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        hoeffding_bentkus_pvalue(11, 10, 0.1)
    with pytest.raises(ValueError):
        hoeffding_bentkus_pvalue(-0.5, 10, 0.1)
    with pytest.raises(ValueError):
        hoeffding_bentkus_pvalue(1, 10, 1.0)
    with pytest.raises(TypeError):
        hoeffding_bentkus_pvalue(1, 10.0, 0.1)


# --------------------------------------------------------------------------- Clopper-Pearson


@SETTINGS
@given(
    kn=count_pairs(max_n=2000, min_n=1),
    confidence=st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99, 0.999]),
)
def test_clopper_pearson_matches_scipy(kn: tuple[int, int], confidence: float) -> None:
    k, n = kn
    ci = clopper_pearson(k, n, confidence)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    assert isinstance(ci, ProportionCI)
    assert (ci.k, ci.n, ci.confidence) == (k, n, confidence)
    # scipy finds the bounds with a root finder (absolute tolerance about 1e-12); ours are beta
    # quantiles, so compare at scipy's precision and check the defining equations exactly:
    # P(Bin(n, low) >= k) = P(Bin(n, high) <= k) = (1 - confidence) / 2.
    assert ci.low == pytest.approx(ref.low, rel=1e-9, abs=1e-11)
    assert ci.high == pytest.approx(ref.high, rel=1e-9, abs=1e-11)
    tail = (1 - confidence) / 2
    # The beta quantiles are scipy.stats.beta.ppf's, to the bit (scipy.stats is not imported for them).
    assert ci.low == (0.0 if k == 0 else stats.beta.ppf(tail, k, n - k + 1))
    assert ci.high == (1.0 if k == n else stats.beta.ppf(1 - tail, k + 1, n - k))
    if k > 0:
        assert stats.binom.sf(k - 1, n, ci.low) == pytest.approx(tail, rel=1e-7)
    if k < n:
        assert stats.binom.cdf(k, n, ci.high) == pytest.approx(tail, rel=1e-7)
    assert ci.low <= k / n <= ci.high
    assert ci.proportion == k / n


def test_clopper_pearson_default_is_95_percent() -> None:
    ci = clopper_pearson(7, 40)
    ref = stats.binomtest(7, 40).proportion_ci(0.95, method="exact")
    assert ci.confidence == 0.95
    assert ci.low == pytest.approx(ref.low, rel=1e-9)
    assert ci.high == pytest.approx(ref.high, rel=1e-9)


def test_clopper_pearson_edges() -> None:
    assert clopper_pearson(0, 25).low == 0.0
    assert clopper_pearson(25, 25).high == 1.0
    empty = clopper_pearson(0, 0)
    assert (empty.low, empty.high) == (0.0, 1.0)
    assert math.isnan(empty.proportion)
    with pytest.raises(ValueError):
        clopper_pearson(5, 4)
    with pytest.raises(ValueError):
        clopper_pearson(-1, 4)
