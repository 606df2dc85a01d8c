"""FWER procedures against their definitions and against MAPIE; the fallback procedure against the
graphical algorithm it is a shortcut of, and its family-wise error on simulated true nulls; Pareto
filters (2-d and D-d) against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mapie.risk_control.fwer_control import control_fwer as mapie_control_fwer
from numpy.typing import NDArray

from calibrate import FWER_METHODS, FWERResult, binomial_pvalue, clopper_pearson, control_fwer

# Private: the procedures and the Pareto filters, unit-tested one by one.
from calibrate._fwer import Bonferroni, Fallback, FixedSequence, Holm, fwer_procedure
from calibrate._pareto import pareto_front, pareto_members, pareto_rows

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


# --------------------------------------------------------------------------- fallback


def chain_weights(m: int) -> list[float]:
    """The fallback's initial weights: 1/2, 1/4, ..., the last taking the remainder (sum 1)."""
    weights = [2.0 ** -(j + 1) for j in range(m)]
    if m:
        weights[-1] = 2.0 ** -(m - 1)
    return weights


def graphical_procedure(
    p: list[float], delta: float, weights: list[float], edges: list[list[float]]
) -> tuple[list[bool], list[float]]:
    """Bretz et al. (2009), Algorithm 1, in plain loops: while some active H_j has p_j <= its
    level, reject the smallest such j, give its level to the others along the edges, and reroute
    the edges around it. Returns the rejections and each hypothesis's level (at rejection, or
    at the end)."""
    m = len(p)
    level = [delta * w for w in weights]
    g = [row[:] for row in edges]
    active = list(range(m))
    rejected = [False] * m
    final = [float("nan")] * m
    while True:
        ready = [j for j in active if p[j] <= level[j]]
        if not ready:
            break
        j = ready[0]
        rejected[j], final[j] = True, level[j]
        active.remove(j)
        for other in active:
            if g[j][other]:
                level[other] = level[other] + level[j] * g[j][other]
        rerouted = [[0.0] * m for _ in range(m)]
        for a in active:
            for b in active:
                denominator = 1.0 - g[a][j] * g[j][a]
                if a != b and denominator > 0:
                    rerouted[a][b] = (g[a][b] + g[a][j] * g[j][b]) / denominator
        g = rerouted
    for j in active:
        final[j] = level[j]
    return rejected, final


def chain_edges(m: int) -> list[list[float]]:
    """H_j -> H_{j+1} with weight 1; the last hypothesis passes its level nowhere."""
    return [[1.0 if k == j + 1 else 0.0 for k in range(m)] for j in range(m)]


def fallback_pvalues(rng: np.random.Generator, delta: float) -> NDArray[np.float64]:
    """Families with p-values exactly on the fallback's levels (sums of delta / 2^k), ties, and
    continuous values."""
    m = int(rng.integers(1, 16))
    boundaries = [delta * x for x in (1 / 2, 1 / 4, 3 / 4, 1 / 8, 7 / 8, 3 / 8, 1.0)]
    grid = np.array([0.0, *boundaries, 0.5, 1.0])
    p = np.where(rng.uniform(size=m) < 0.6, rng.choice(grid, m), rng.uniform(0, 2 * delta, m))
    return p.astype(np.float64)


def test_fallback_is_the_chain_graph() -> None:
    """Exact agreement of rejections and levels with the graphical algorithm on the chain, one
    family at a time and in a NaN-padded batch."""
    rng = np.random.default_rng(14)
    families, deltas, partial = [], [], 0
    for _ in range(600):
        delta = float(rng.choice([0.05, 0.1, 0.2, rng.uniform(0.01, 0.5)]))
        p = fallback_pvalues(rng, delta)
        rejected, levels = graphical_procedure(p.tolist(), delta, chain_weights(p.size), chain_edges(p.size))
        ours = control_fwer(p, delta, "fallback")
        np.testing.assert_array_equal(ours.rejected, rejected)
        np.testing.assert_array_equal(ours.tested, np.arange(p.size))  # it goes on past a failure
        assert ours.levels.tolist() == levels  # the same floats, not merely close
        failures = np.flatnonzero(~ours.rejected)
        assert ours.stopped_at == (int(failures[0]) if failures.size else None)
        partial += (
            bool(ours.rejected.any()) and bool(failures.size) and bool(ours.rejected[failures[0] :].any())
        )
        if delta == 0.1:
            families.append(p)
            deltas.append(delta)
    assert partial >= 50  # rejections after a failure: what fixed-sequence testing cannot do
    width = max(f.size for f in families)
    batch = np.full((len(families), width), np.nan)
    for r, f in enumerate(families):
        batch[r, : f.size] = f
    found = Fallback().run_batch(batch, 0.1)
    for r, f in enumerate(families):
        one = Fallback().run(f, 0.1)
        row = found.row(r)
        np.testing.assert_array_equal(row.rejected[: f.size], one.rejected)
        assert not row.rejected[f.size :].any()
        assert row.levels.tolist() == one.levels.tolist() and row.stopped_at == one.stopped_at


def test_fallback_by_name_and_edges() -> None:
    assert "fallback" in FWER_METHODS and isinstance(fwer_procedure("fallback"), Fallback)
    r = control_fwer([0.2, 0.05, 0.1], 0.2, "fallback")  # levels 0.1, 0.05 (no carry), 0.05 + 0.05
    np.testing.assert_array_equal(r.rejected, [False, True, True])
    assert r.levels.tolist() == [0.1, 0.05, 0.1] and r.stopped_at == 0
    one = control_fwer([0.1], 0.1, "fallback")  # one hypothesis: the whole level
    assert one.rejected.tolist() == [True] and one.levels.tolist() == [0.1]
    empty = control_fwer(np.zeros(0), 0.1, "fallback")
    assert empty.rejected.size == 0 and empty.stopped_at is None


def passing_on_after_failure(p: NDArray[np.float64], delta: float) -> NDArray[np.bool_]:
    """Broken: H_j's level goes on to H_{j+1} whether or not H_j was rejected."""
    rejected = np.zeros(p.shape, bool)
    for r in range(p.shape[0]):
        carried = 0.0
        for j, w in enumerate(chain_weights(p.shape[1])):
            level = delta * w + carried
            rejected[r, j] = p[r, j] <= level
            carried = level
    return rejected


def weights_summing_to_two(p: NDArray[np.float64], delta: float) -> NDArray[np.bool_]:
    """Broken: the chain graph with every initial weight doubled."""
    rejected = np.zeros(p.shape, bool)
    weights = [2 * w for w in chain_weights(p.shape[1])]
    edges = chain_edges(p.shape[1])
    for r in range(p.shape[0]):
        rejected[r] = graphical_procedure(p[r].tolist(), delta, weights, edges)[0]
    return rejected


def family_wise_error(procedure, delta: float) -> tuple[int, int]:
    """Families of 8 hypotheses, a random 0 to 3 of them false (p-values near 0), the rest true
    nulls with independent uniform p-values: how many families reject a true null."""
    rng = np.random.default_rng(15)
    families, m = 8000, 8
    false = rng.uniform(size=(families, m)) < rng.integers(0, 4, families)[:, None] / m
    p = np.where(false, rng.uniform(size=(families, m)) ** 8, rng.uniform(size=(families, m)))
    rejected = procedure(p, delta)
    return int((rejected & ~false).any(axis=1).sum()), families


# The acceptance rule for a guarantee: the 95% Clopper-Pearson upper bound of the
# simulated violation rate at most delta + 0.02.
SLACK = 0.02


def test_fallback_family_wise_error_at_most_delta() -> None:
    delta = 0.1
    errors, families = family_wise_error(lambda p, d: Fallback().run_batch(p, d).rejected, delta)
    assert clopper_pearson(errors, families).high <= delta + SLACK
    assert errors / families > delta / 2  # the simulation is close to the bound, so it can catch a breach


@pytest.mark.parametrize("broken", [passing_on_after_failure, weights_summing_to_two])
def test_broken_fallbacks_are_caught(broken) -> None:
    errors, families = family_wise_error(broken, 0.1)
    assert clopper_pearson(errors, families).high > 0.1 + SLACK


# --------------------------------------------------------------------------- Pareto in D dimensions


def members_brute_force(x: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Per row: not dominated (another point <= everywhere, < somewhere), and no exact
    duplicate at a smaller index."""
    rows, n, _ = x.shape
    keep = np.zeros((rows, n), bool)
    for r in range(rows):
        for i in range(n):
            dominated = any(np.all(x[r, j] <= x[r, i]) and np.any(x[r, j] < x[r, i]) for j in range(n))
            duplicate_before = any(np.array_equal(x[r, j], x[r, i]) for j in range(i))
            keep[r, i] = not dominated and not duplicate_before
    return keep


@pytest.mark.parametrize("dimensions", [1, 3, 4])
def test_pareto_members_match_brute_force(dimensions: int) -> None:
    """Points on a coarse grid (many ties and exact duplicates); 150 rows span several chunks."""
    rng = np.random.default_rng(16 + dimensions)
    for n in (0, 1, 2, 7, 30):
        x = rng.integers(0, 4, (150, n, dimensions)) / 4.0
        np.testing.assert_array_equal(pareto_members(x), members_brute_force(x))
    continuous = rng.uniform(size=(20, 25, dimensions))
    np.testing.assert_array_equal(pareto_members(continuous), members_brute_force(continuous))


def test_pareto_members_in_two_dimensions_are_pareto_rows() -> None:
    rng = np.random.default_rng(17)
    x = rng.integers(0, 5, (200, 20, 2)) / 5.0
    order, keep = pareto_rows(x[:, :, 0], x[:, :, 1])
    expected = np.zeros(x.shape[:2], bool)
    np.put_along_axis(expected, order, keep, axis=1)
    found = pareto_members(x)
    np.testing.assert_array_equal(found, expected)
    np.testing.assert_array_equal(found, members_brute_force(x))


def test_pareto_members_bad_input() -> None:
    with pytest.raises(ValueError, match="3-d"):
        pareto_members(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="NaN"):
        pareto_members(np.array([[[0.1, np.nan, 0.2]]]))
