"""P-values for the Learn-then-Test hypotheses H_j: R(lambda_j) > alpha.

Every function here takes integer loss counts, never float means: the NOTES pitfall of
computing k as `mean * n` lets float rounding drop k by one and makes the test
anti-conservative.

References
----------
Angelopoulos, Bates, Candes, Jordan, Lei (2021). Learn then Test: Calibrating predictive
algorithms to achieve risk control. Section 3 (binomial and Hoeffding-Bentkus p-values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "PVALUE_METHODS",
    "CalibrationSize",
    "PValueMethod",
    "ProportionCI",
    "binomial_kstar",
    "binomial_pvalue",
    "calibration_size",
    "clopper_pearson",
    "hoeffding_bentkus_pvalue",
    "min_calibration_size",
    "min_certifiable_level",
    "pvalue_table",
]

# "binomial": the exact tail the paper's text states; "hb": Hoeffding-Bentkus, which the
# authors' code used for performance control (valid for any loss in [0, 1], so never smaller).
PValueMethod = Literal["binomial", "hb"]
PVALUE_METHODS: tuple[str, ...] = get_args(PValueMethod)


def _as_counts(name: str, values: ArrayLike) -> NDArray[np.int64]:
    array = np.asarray(values)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must be integer counts, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _check_level(name: str, value: ArrayLike) -> NDArray[np.float64]:
    array = np.asarray(value, dtype=np.float64)
    if not np.all((array > 0) & (array < 1)):
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return array


def binomial_pvalue(k: ArrayLike, n: ArrayLike, alpha: ArrayLike) -> NDArray[np.float64]:
    """Exact one-sided binomial p-value: p = P(Binomial(n, alpha) <= k).

    Valid for Bernoulli losses (delegation indicator, 0-1 error): under H: R > alpha the
    loss count is stochastically larger than Binomial(n, alpha).

    Parameters
    ----------
    k : int array
        Loss counts, 0 <= k <= n.
    n : int array
        Sample sizes (broadcast against `k`). n = 0 gives p = 1: no evidence.
    alpha : float array in (0, 1)
        Risk levels (broadcast against `k`).

    Returns
    -------
    p : float array of the broadcast shape. k = n gives p = 1; k = 0 gives (1 - alpha)^n.
    """
    k = _as_counts("k", k)
    n = _as_counts("n", n)
    alpha = _check_level("alpha", alpha)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("loss counts must satisfy 0 <= k <= n")
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    # bdtr is the regularised incomplete beta I_{1-alpha}(n-k, k+1); it is defined for
    # k = n (returns 1) and n = 0 (returns 1).
    return np.asarray(special.bdtr(k, n, alpha), dtype=np.float64)


def binomial_kstar(n: ArrayLike, alpha: ArrayLike, delta: ArrayLike) -> NDArray[np.int64]:
    """Largest loss count that still rejects: k* = max{k : P(Binomial(n, alpha) <= k) <= delta}.

    Returns -1 where even k = 0 does not reject, i.e. (1 - alpha)^n > delta. Because k*
    is found with the same tail function as `binomial_pvalue`, `k <= k*` and
    `binomial_pvalue(k, n, alpha) <= delta` agree exactly; k* is reported so that a
    decision can be audited from integer counts alone.
    """
    n = _as_counts("n", n)
    alpha = _check_level("alpha", alpha)
    delta = _check_level("delta", delta)
    n, alpha, delta = np.broadcast_arrays(n, alpha, delta)
    from scipy import special, stats  # scipy loads on first use: `ctd --help` does not pay for it

    # ppf gives the smallest k with cdf(k) >= delta; the answer is that k or the one below.
    # Walk a few steps both ways so that the result is consistent with bdtr exactly.
    guess = np.nan_to_num(stats.binom.ppf(delta, n, alpha), nan=0.0).astype(np.int64)
    k = np.clip(guess, 0, n)
    for _ in range(4):
        up = (k < n) & (special.bdtr(np.minimum(k + 1, n), n, alpha) <= delta)
        k = np.where(up, k + 1, k)
    for _ in range(4):
        down = (k >= 0) & (special.bdtr(np.maximum(k, 0), n, alpha) > delta)
        k = np.where(down, k - 1, k)
    ok_here = (k < 0) | (special.bdtr(np.maximum(k, 0), n, alpha) <= delta)
    ok_above = (k >= n) | (special.bdtr(np.minimum(k + 1, n), n, alpha) > delta)
    if not (np.all(ok_here) and np.all(ok_above)):  # pragma: no cover - defensive
        raise ArithmeticError("k* search did not converge")
    return k.astype(np.int64)


def min_calibration_size(alpha: float, delta: float) -> int:
    """Smallest n for which zero losses reject H: R > alpha at level delta: (1-alpha)^n <= delta."""
    _check_level("alpha", alpha)
    _check_level("delta", delta)
    n = max(int(np.ceil(np.log(delta) / np.log1p(-alpha))) - 1, 0)
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    while special.bdtr(0, n, alpha) > delta:
        n += 1
    return n


def min_certifiable_level(n: int, delta: float) -> float:
    """Smallest alpha that zero losses in n calibration rows certify at level delta:
    alpha* = 1 - delta^(1/n), the root of P(Binomial(n, alpha) <= 0) = (1 - alpha)^n = delta.

    The inverse of `min_calibration_size`: a level alpha can be certified with n rows exactly
    when alpha >= alpha* (the p-value of zero losses falls with alpha), i.e. when
    `min_calibration_size(alpha, delta) <= n`. The float returned is nudged up until the
    binomial tail itself is <= delta, so it is never below the true root.
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _check_level("delta", delta)
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    alpha = float(-np.expm1(np.log(delta) / int(n)))
    while special.bdtr(0, int(n), alpha) > delta:
        alpha = float(np.nextafter(alpha, 1.0))
    return alpha


@dataclass(frozen=True)
class CalibrationSize:
    """Whether `n` calibration rows can certify level `alpha` at `delta`: a threshold is certified
    only when its losses reject H: R > alpha, and the fewest (zero) do so exactly when
    (1 - alpha)^n <= delta, i.e. when `n` is at least `need` (`min_calibration_size`)."""

    n: int
    alpha: float
    delta: float
    need: int

    @property
    def enough(self) -> bool:
        """Some threshold can be certified at `alpha` with `n` rows."""
        return self.n >= self.need

    def lowest_level(self, decimals: int = 3) -> float | None:
        """The smallest level with `decimals` decimals that `n` rows can certify at `delta`:
        `min_certifiable_level` rounded up (so that it is certifiable itself); None without rows."""
        if self.n < 1:
            return None
        scale = 10**decimals
        return math.ceil(min_certifiable_level(self.n, self.delta) * scale) / scale


def calibration_size(n: int, alpha: float, delta: float) -> CalibrationSize:
    """Can `n` calibration rows certify `alpha` at `delta`, and how many would: the one place
    every refusal of a too small D_cal asks (ValueError when alpha or delta is not in (0, 1))."""
    return CalibrationSize(n=n, alpha=alpha, delta=delta, need=min_calibration_size(alpha, delta))


def _h1(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """Bernoulli KL divergence h1(a, b) = a log(a/b) + (1-a) log((1-a)/(1-b)), with 0 log 0 = 0."""
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    return special.xlogy(a, a / b) + special.xlogy(1 - a, (1 - a) / (1 - b))


def hoeffding_bentkus_pvalue(loss_sum: ArrayLike, n: ArrayLike, alpha: ArrayLike) -> NDArray[np.float64]:
    """Hoeffding-Bentkus p-value for losses in [0, 1]:
    p = min(exp(-n h1(min(R, alpha), alpha)), e * P(Binomial(n, alpha) <= ceil(n R))), R = sum/n.

    `loss_sum` is the sum of the n losses (not their mean), so that for 0/1 losses the
    Bentkus term is evaluated at the exact integer count.
    """
    loss_sum = np.asarray(loss_sum, dtype=np.float64)
    n = _as_counts("n", n)
    alpha = _check_level("alpha", alpha)
    if np.any(loss_sum < 0) or np.any(loss_sum > n):
        raise ValueError("loss sums must lie in [0, n] for losses in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        r_hat = np.where(n > 0, loss_sum / np.maximum(n, 1), 0.0)
        hoeffding = np.exp(-n * _h1(np.minimum(r_hat, alpha), alpha))
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    bentkus = np.e * special.bdtr(np.ceil(loss_sum).astype(np.int64), n, alpha)
    return np.minimum(np.minimum(hoeffding, bentkus), 1.0)


def pvalue_table(method: PValueMethod, n: int, alpha: float) -> NDArray[np.float64]:
    """p_k for every loss count k = 0..n of a Bernoulli loss: shape (n + 1,), non-decreasing in k.

    Every count a test can meet lies in 0..n, so callers tabulate once per (n, alpha) and look
    counts up: `pvalue_table(m, n, a)[k]` equals the p-value function at (k, n, a) exactly.
    """
    counts = np.arange(int(n) + 1, dtype=np.int64)
    if method == "binomial":
        return binomial_pvalue(counts, int(n), alpha)
    if method == "hb":
        return hoeffding_bentkus_pvalue(counts, int(n), alpha)
    raise ValueError(f"unknown p-value method {method!r}; choose one of {PVALUE_METHODS}")


@dataclass(frozen=True)
class ProportionCI:
    """A binomial proportion k/n with its two-sided Clopper-Pearson interval."""

    k: int
    n: int
    confidence: float
    low: float
    high: float

    @property
    def proportion(self) -> float:
        return self.k / self.n if self.n else float("nan")


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> ProportionCI:
    """Exact (Clopper-Pearson) interval: [Beta_{a/2}(k, n-k+1), Beta_{1-a/2}(k+1, n-k)], a = 1-confidence."""
    k, n = int(k), int(n)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    # The inverse regularised incomplete beta function is Beta(a, b)'s quantile: what
    # scipy.stats.beta.ppf computes (the same Boost routine), without importing scipy.stats.
    from scipy import special  # scipy loads on first use: `ctd --help` does not pay for it

    tail = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, tail))
    high = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1.0 - tail))
    if n == 0:
        low, high = 0.0, 1.0
    return ProportionCI(k=k, n=n, confidence=confidence, low=low, high=high)
