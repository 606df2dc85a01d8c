"""FWER procedures against their definitions and against MAPIE; Pareto filter against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mapie.risk_control.fwer_control import control_fwer as mapie_control_fwer
from numpy.typing import NDArray

from calibrate import FWERResult, binomial_pvalue, control_fwer

# Private: the procedures and the Pareto filter, unit-tested one by one.
from calibrate._fwer import Bonferroni, FixedSequence, Holm
from calibrate._pareto import pareto_front

SETTINGS = settings(max_examples=200, deadline=None)

MAPIE_NAMES = {"fixed-sequence": "fixed_sequence", "holm": "bonferroni_holm", "bonferroni": "bonferroni"}


def random_pvalues(rng: np.random.Generator, delta: float) -> NDArray[np.float64]:
    """p-values with ties and values on the decision boundaries (delta, delta/m, delta/(m-i))."""
    m = int(rng.integers(1, 40))
    kind = rng.integers(0, 4)
    if kind == 0:  # continuous
        p = rng.uniform(0, 1, m) ** 3
    elif kind == 1:  # a small grid, with delta itself: many ties and exact boundary hits
        grid = np.array([0.0, delta / m, delta / 2, delta, 0.5, 1.0])
        p = rng.choice(grid, m)
    elif kind == 2:  # Holm boundaries delta / (m - i)
        p = rng.choice(delta / (m - np.arange(m)), m)
        p[rng.uniform(size=m) < 0.2] = 1.0
    else:  # exact binomial p-values from counts, increasing as in a budget sweep
        n = int(rng.integers(5, 300))
        alpha = float(rng.uniform(0.05, 0.6))
        k = np.sort(rng.integers(0, n + 1, m))
        p = binomial_pvalue(k, n, alpha)
    return np.asarray(p, dtype=np.float64)


def holm_by_definition(p: NDArray[np.float64], delta: float) -> NDArray[np.bool_]:
    """Order-free Holm: reject H_j iff every sorted p_(i) <= p_j passes its level delta / (m - i)."""
    m = p.size
    ps = np.sort(p)
    passes = ps <= delta / (m - np.arange(m))
    return np.array([bool(np.all(passes[ps <= pj])) for pj in p], dtype=bool)


def mask(indices: NDArray[np.int64], m: int) -> NDArray[np.bool_]:
    out = np.zeros(m, dtype=bool)
    out[np.asarray(indices, dtype=np.int64)] = True
    return out


# --------------------------------------------------------------------------- fixed sequence


@SETTINGS
@given(
    p=st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.10000001, 0.3, 1.0]), min_size=1, max_size=25),
)
def test_fixed_sequence_stops_at_first_failure(p: list[float]) -> None:
    delta = 0.1
    result = control_fwer(np.array(p, dtype=np.float64), delta, "fixed-sequence")
    failures = [i for i, pi in enumerate(p) if pi > delta]
    stop = failures[0] if failures else None
    n_prefix = len(p) if stop is None else stop
    assert isinstance(result, FWERResult)
    assert result.stopped_at == stop
    np.testing.assert_array_equal(result.rejected, np.arange(len(p)) < n_prefix)
    n_tested = len(p) if stop is None else stop + 1
    np.testing.assert_array_equal(result.tested, np.arange(n_tested))
    np.testing.assert_array_equal(result.levels, np.full(n_tested, delta))
    assert result.n_rejected == n_prefix


def test_fixed_sequence_examples() -> None:
    r = FixedSequence().run([0.01, 0.1, 0.2, 0.0], 0.1)  # p == delta rejects; stop at position 2
    np.testing.assert_array_equal(r.rejected, [True, True, False, False])
    assert r.stopped_at == 2
    np.testing.assert_array_equal(r.tested, [0, 1, 2])
    r = FixedSequence().run([0.5, 0.0], 0.1)
    assert r.n_rejected == 0 and r.stopped_at == 0


@pytest.mark.parametrize("method", ["fixed-sequence", "holm"])
def test_empty_family_rejects_nothing(method: str) -> None:
    r = control_fwer(np.zeros(0), 0.1, method)  # type: ignore[arg-type]
    assert r.rejected.size == 0 and r.tested.size == 0 and r.stopped_at is None


def test_bonferroni_empty_family_rejects_nothing() -> None:
    r = control_fwer(np.zeros(0), 0.1, "bonferroni")
    assert r.rejected.size == 0 and r.tested.size == 0 and r.stopped_at is None


# --------------------------------------------------------------------------- Bonferroni and Holm


def test_bonferroni_and_holm_by_definition() -> None:
    rng = np.random.default_rng(10)
    for _ in range(300):
        delta = float(rng.choice([0.05, 0.1, 0.2, rng.uniform(0.01, 0.5)]))
        p = random_pvalues(rng, delta)
        m = p.size
        bonf = control_fwer(p, delta, "bonferroni")
        np.testing.assert_array_equal(bonf.rejected, p <= delta / m)
        holm = control_fwer(p, delta, "holm")
        np.testing.assert_array_equal(holm.rejected, holm_by_definition(p, delta))
        # Holm tests in ascending p order at levels delta / m, delta / (m - 1), ...
        tested = holm.tested
        assert np.all(np.diff(p[tested]) >= 0)
        np.testing.assert_allclose(holm.levels, delta / (m - np.arange(tested.size)), rtol=1e-15)
        if holm.stopped_at is not None:
            assert holm.stopped_at == tested.size - 1
            assert p[tested[-1]] > holm.levels[-1]
        # Holm is uniformly at least as powerful as Bonferroni.
        assert np.all(holm.rejected >= bonf.rejected)


def test_procedure_instances_equal_names() -> None:
    rng = np.random.default_rng(11)
    p = random_pvalues(rng, 0.1)
    for name, proc in (("fixed-sequence", FixedSequence()), ("bonferroni", Bonferroni()), ("holm", Holm())):
        by_name = control_fwer(p, 0.1, name)
        by_instance = control_fwer(p, 0.1, proc)
        np.testing.assert_array_equal(by_name.rejected, by_instance.rejected)
        assert proc.name == name


def test_control_fwer_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        control_fwer([0.1], 0.1, "nonsense")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        control_fwer([0.1], 0.0)
    with pytest.raises(ValueError):
        control_fwer([0.1], 1.0)
    with pytest.raises(ValueError):
        control_fwer(np.zeros((2, 2)), 0.1)


# --------------------------------------------------------------------------- MAPIE reference


@pytest.mark.parametrize("method", ["fixed-sequence", "holm", "bonferroni"])
def test_control_fwer_matches_mapie(method: str) -> None:
    rng = np.random.default_rng(12)
    n_rejecting = 0
    for _ in range(400):
        delta = float(rng.choice([0.05, 0.1, 0.2, rng.uniform(0.01, 0.5)]))
        p = random_pvalues(rng, delta)
        ours = control_fwer(p, delta, method)  # type: ignore[arg-type]
        ref = mapie_control_fwer(p, delta, fwer_method=MAPIE_NAMES[method])
        np.testing.assert_array_equal(ours.rejected, mask(ref, p.size))
        n_rejecting += bool(ours.rejected.any()) and not bool(ours.rejected.all())
    assert n_rejecting >= 50  # the instances exercise partial rejections, not only all-or-nothing


# --------------------------------------------------------------------------- Pareto front


def pareto_brute_force(b: NDArray[np.float64], o: NDArray[np.float64]) -> set[int]:
    keep = set()
    for i in range(b.size):
        dominated = any(b[j] <= b[i] and o[j] <= o[i] and (b[j] < b[i] or o[j] < o[i]) for j in range(b.size))
        duplicate_before = any(b[j] == b[i] and o[j] == o[i] for j in range(i))
        if not dominated and not duplicate_before:
            keep.add(i)
    return keep


def check_front(b: NDArray[np.float64], o: NDArray[np.float64]) -> None:
    front = pareto_front(b, o)
    assert front.dtype.kind == "i"
    assert len(set(front.tolist())) == front.size
    assert set(front.tolist()) == pareto_brute_force(b, o)
    # Sorted by increasing budget, hence strictly decreasing objective.
    assert np.all(np.diff(b[front]) > 0)
    assert np.all(np.diff(o[front]) < 0)


grid_values = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0])


@SETTINGS
@given(points=st.lists(st.tuples(grid_values, grid_values), min_size=0, max_size=30))
def test_pareto_front_matches_brute_force_on_grid(points: list[tuple[float, float]]) -> None:
    b = np.array([pt[0] for pt in points], dtype=np.float64)
    o = np.array([pt[1] for pt in points], dtype=np.float64)
    check_front(b, o)


@SETTINGS
@given(
    points=st.lists(
        st.tuples(
            st.floats(min_value=-10, max_value=10, allow_nan=False),
            st.floats(min_value=-10, max_value=10, allow_nan=False),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_pareto_front_matches_brute_force_on_floats(points: list[tuple[float, float]]) -> None:
    b = np.array([pt[0] for pt in points], dtype=np.float64) + 0.0  # + 0.0 folds -0.0 into 0.0
    o = np.array([pt[1] for pt in points], dtype=np.float64) + 0.0
    check_front(b, o)


def test_pareto_front_random_large() -> None:
    rng = np.random.default_rng(13)
    for _ in range(30):
        n = int(rng.integers(1, 150))
        b = rng.integers(0, 8, n) / 8.0
        o = rng.integers(0, 8, n) / 8.0
        check_front(b, o)


def test_pareto_front_edges() -> None:
    assert pareto_front(np.zeros(0), np.zeros(0)).size == 0
    np.testing.assert_array_equal(pareto_front([0.3, 0.3, 0.3], [0.2, 0.2, 0.2]), [0])
    np.testing.assert_array_equal(pareto_front([0.0, 0.5, 1.0], [1.0, 0.5, 0.0]), [0, 1, 2])
    np.testing.assert_array_equal(pareto_front([1.0, 0.5, 0.0], [0.0, 0.5, 1.0]), [2, 1, 0])
    with pytest.raises(ValueError):
        pareto_front([0.1, np.nan], [0.1, 0.2])
    with pytest.raises(ValueError):
        pareto_front([0.1, 0.2], [np.nan, 0.2])
    with pytest.raises(ValueError):
        pareto_front([0.1, 0.2], [0.1])
