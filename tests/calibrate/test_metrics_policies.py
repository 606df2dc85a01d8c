"""Metrics (against sklearn / scipy / hand computation) and delegation policies (by definition)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import stats
from sklearn.metrics import roc_auc_score

from calibrate import (
    DEFAULT_BUDGETS,
    accuracy,
    auroc,
    binary_delegation_value,
    cascade_scores,
    delegation_value,
    dv_quality,
    group_table,
    mean_value_at_k,
    median_rank_signal,
    merge_scores,
    predict,
    topk_mask,
    uncertainty_signal,
)

# Private: the candidate grid, unit-tested against its definition.
from calibrate._policies import threshold_grid

SETTINGS = settings(max_examples=200, deadline=None)


def round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def quota(budget: float, size: int) -> int:
    """round-half-up(budget * size) in exact arithmetic on the budget as written (its repr)."""
    return round_half_up(Fraction(repr(budget)) * size)


# --------------------------------------------------------------------------- AUROC and accuracy


def test_auroc_matches_sklearn_with_ties_rowwise() -> None:
    rng = np.random.default_rng(20)
    for _ in range(40):
        rows, n = int(rng.integers(1, 6)), int(rng.integers(2, 80))
        scores = rng.integers(0, 6, (rows, n)) / 5.0  # heavy ties
        labels = rng.integers(0, 2, (rows, n))
        got = auroc(scores, labels)
        assert got.shape == (rows,)
        for r in range(rows):
            if labels[r].min() == labels[r].max():
                assert np.isnan(got[r])
            else:
                assert got[r] == pytest.approx(roc_auc_score(labels[r], scores[r]), abs=1e-12)


def test_auroc_broadcasts_1d_labels_and_continuous_scores() -> None:
    rng = np.random.default_rng(21)
    labels = rng.integers(0, 2, 200)
    scores = rng.normal(size=(7, 200)) + labels
    got = auroc(scores, labels)
    ref = [roc_auc_score(labels, row) for row in scores]
    np.testing.assert_allclose(got, ref, atol=1e-12)
    assert float(auroc(scores[0], labels)) == pytest.approx(ref[0], abs=1e-12)


def test_auroc_single_class_rows_are_nan() -> None:
    scores = np.array([[0.1, 0.4, 0.9], [0.2, 0.3, 0.1], [0.5, 0.5, 0.1]])
    labels = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0]])
    got = auroc(scores, labels)
    assert np.isnan(got[0]) and np.isnan(got[1])
    # Row 3 by hand: positive 0.5 beats 0.1 (1), ties 0.5 (1/2): (1 + 0.5) / 2 = 0.75.
    assert got[2] == pytest.approx(0.75)


@SETTINGS
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([0.0, 0.25, 0.49, 0.5, 0.51, 0.75, 1.0]), st.integers(0, 1)),
        min_size=1,
        max_size=40,
    )
)
def test_accuracy_uses_half_threshold(pairs: list[tuple[float, int]]) -> None:
    s = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    expected = sum((si >= 0.5) == bool(yi) for si, yi in pairs) / len(pairs)
    assert float(accuracy(s, y)) == pytest.approx(expected)
    np.testing.assert_array_equal(predict(s), [si >= 0.5 for si, _ in pairs])


def test_accuracy_example_and_rows() -> None:
    # By hand: predictions [1, 0, 1, 0] against labels [1, 0, 1, 1]: three of four right.
    assert float(accuracy([0.5, 0.49, 0.51, 0.0], [1, 0, 1, 1])) == 0.75
    got = accuracy(np.array([[0.5, 0.5], [0.2, 0.2]]), np.array([1, 0]))
    np.testing.assert_array_equal(got, [0.5, 0.5])


# --------------------------------------------------------------------------- delegation values


def test_delegation_value_by_definition() -> None:
    rng = np.random.default_rng(22)
    y = rng.integers(0, 2, 500)
    p = rng.uniform(size=500).round(2)
    e = rng.uniform(size=500).round(2)
    v = delegation_value(y, p, e)
    # P_m(y | x) = s if y = 1 else 1 - s.
    expected = np.array(
        [(ei if yi else 1 - ei) - (pi if yi else 1 - pi) for yi, pi, ei in zip(y, p, e, strict=True)]
    )
    np.testing.assert_allclose(v, expected, atol=1e-12)
    vb = binary_delegation_value(y, p, e)
    expected_b = [
        float(((pi >= 0.5) != yi) and ((ei >= 0.5) == yi)) for yi, pi, ei in zip(y, p, e, strict=True)
    ]
    np.testing.assert_array_equal(vb, expected_b)
    # At exactly 0.5 a score predicts 1.
    np.testing.assert_array_equal(binary_delegation_value([1, 0], [0.49, 0.5], [0.5, 0.49]), [1.0, 1.0])


def test_dv_quality_matches_numpy_and_scipy() -> None:
    rng = np.random.default_rng(23)
    d = rng.normal(size=300).round(1)  # ties for Spearman
    v = 0.5 * d + rng.normal(size=300)
    q = dv_quality(d, v)
    assert q.n == 300
    assert q.mse == pytest.approx(float(np.mean((d - v) ** 2)), rel=1e-12)
    assert q.spearman == float(stats.spearmanr(d, v)[0])  # the same ranks, the same corrcoef: to the bit
    assert math.isnan(dv_quality([0.3], [0.1]).spearman)
    with pytest.raises(ValueError, match="one length"):
        dv_quality([0.3, 0.4], [0.1])


@pytest.mark.parametrize("seed", range(20))
def test_dv_quality_spearman_is_scipys_to_the_bit(seed: int) -> None:
    """Against scipy.stats.spearmanr on inputs with many ties, few ties and none, of sizes from
    2 up; a constant input or a NaN is NaN, as scipy's (without its warning)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    d = rng.normal(size=n).round(int(rng.integers(0, 3)))
    v = rng.integers(0, int(rng.integers(2, 50)), size=n) * 0.1 + d * rng.uniform(-1, 1)
    expected = float(stats.spearmanr(d, v).statistic) if np.ptp(d) and np.ptp(v) else math.nan
    got = dv_quality(d, v).spearman
    assert got == expected or (math.isnan(got) and math.isnan(expected))
    assert math.isnan(dv_quality(np.full(n, 0.5), v).spearman)
    assert math.isnan(dv_quality(d, np.r_[v[:-1], np.nan]).spearman)


def test_mean_value_at_k_by_sorting() -> None:
    rng = np.random.default_rng(24)
    for _ in range(50):
        n = int(rng.integers(1, 120))
        s = rng.integers(0, 5, n).astype(float)  # ties, broken by position
        v = rng.normal(size=n)
        fractions = [0.0, 0.01, 0.1, 0.25, 0.5, 0.95, 1.0, *DEFAULT_BUDGETS[:3]]
        ranked = sorted(range(n), key=lambda i: (-s[i], i))
        expected = []
        for f in fractions:
            k = min(max(quota(f, n), 1), n)
            expected.append(np.mean(v[ranked[:k]]))
        np.testing.assert_allclose(mean_value_at_k(s, v, fractions), expected, rtol=1e-12, atol=1e-12)


def test_group_table_manual() -> None:
    rng = np.random.default_rng(25)
    v = rng.normal(size=60)
    groups = rng.choice(["b", "a", "c"], 60)
    sel_a = rng.uniform(size=60) < 0.3
    sel_b = np.zeros(60, bool)
    sel_b[:5] = True
    rows = group_table(v, groups, {"topk": sel_a, "few": sel_b})
    assert [r.group for r in rows] == sorted(set(groups.tolist()))
    for row in rows:
        members = [i for i in range(60) if groups[i] == row.group]
        assert row.n == len(members)
        assert row.mean_v_all == pytest.approx(sum(v[i] for i in members) / len(members))
        for name, sel in (("topk", sel_a), ("few", sel_b)):
            chosen = [i for i in members if sel[i]]
            assert row.delegation_rate[name] == pytest.approx(len(chosen) / len(members))
            if chosen:
                assert row.mean_v_selected[name] == pytest.approx(sum(v[i] for i in chosen) / len(chosen))
            else:
                assert math.isnan(row.mean_v_selected[name])


# --------------------------------------------------------------------------- merge and cascade


def test_merge_and_cascade_scores() -> None:
    rng = np.random.default_rng(26)
    p, e = rng.uniform(size=50), rng.uniform(size=50)
    delegated = rng.uniform(size=50) < 0.4
    np.testing.assert_array_equal(merge_scores(p, e, "overwrite"), e)
    np.testing.assert_allclose(merge_scores(p, e, "average"), (p + e) / 2)
    for rule, merged in (("overwrite", e), ("average", (p + e) / 2)):
        out = cascade_scores(p, e, delegated, rule)
        expected = [merged[i] if delegated[i] else p[i] for i in range(50)]
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)
    # 2-D delegation masks broadcast against 1-D scores.
    masks = np.stack([np.zeros(50, bool), np.ones(50, bool)])
    out = cascade_scores(p, e, masks, "overwrite")
    np.testing.assert_array_equal(out, np.stack([p, e]))
    with pytest.raises(ValueError):
        merge_scores(p, e, "max")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- signals


def ecdf_right(reference: NDArray[np.float64], x: float) -> float:
    return sum(r <= x for r in reference) / len(reference)


def test_uncertainty_signal_by_definition() -> None:
    rng = np.random.default_rng(27)
    ref = rng.integers(0, 10, 37) / 10.0
    probe = rng.integers(0, 11, 60) / 10.0  # includes values equal to reference points
    got = uncertainty_signal(probe, ref)
    expected = [-abs(ecdf_right(ref, x) - 0.5) for x in probe]
    np.testing.assert_allclose(got, expected, atol=1e-15)
    assert np.all(got <= 0) and np.all(got >= -0.5)


def test_uncertainty_signal_2d_reference_rows() -> None:
    rng = np.random.default_rng(28)
    refs = rng.integers(0, 10, (5, 23)) / 10.0
    probe = rng.integers(0, 11, 40) / 10.0
    got = uncertainty_signal(probe, refs)
    assert got.shape == (5, 40)
    for r in range(5):
        np.testing.assert_array_equal(got[r], uncertainty_signal(probe, refs[r]))


def test_median_rank_signal_by_definition() -> None:
    rng = np.random.default_rng(29)
    for n in (1, 2, 7, 50):
        p = rng.integers(0, 4, n) / 4.0
        rank = [sum(p[j] < p[i] for j in range(n)) + sum(p[j] == p[i] for j in range(i)) for i in range(n)]
        expected = [-abs(r - (n - 1) / 2) for r in rank]
        np.testing.assert_allclose(median_rank_signal(p), expected)


# --------------------------------------------------------------------------- top-k


def topk_reference(signal: NDArray[np.float64], budget: float, batch_size: int) -> NDArray[np.bool_]:
    n = signal.size
    out = np.zeros(n, dtype=bool)
    for start in range(0, n, batch_size):
        idx = list(range(start, min(start + batch_size, n)))
        k = quota(budget, len(idx))
        for i in sorted(idx, key=lambda i: (-signal[i], i))[:k]:
            out[i] = True
    return out


@SETTINGS
@given(
    n=st.integers(min_value=0, max_value=150),
    batch_size=st.integers(min_value=1, max_value=64),
    budgets=st.lists(
        st.sampled_from([*DEFAULT_BUDGETS, 0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_topk_mask_per_batch(n: int, batch_size: int, budgets: list[float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    signal = rng.integers(0, 5, n).astype(float)  # ties go to the earlier input
    got = topk_mask(signal, budgets, batch_size)
    assert got.shape == (len(budgets), n)
    for a, budget in enumerate(budgets):
        np.testing.assert_array_equal(got[a], topk_reference(signal, budget, batch_size))
        for start in range(0, n, batch_size):
            b = min(batch_size, n - start)
            assert int(got[a, start : start + b].sum()) == quota(budget, b)


def test_topk_mask_rejects_bad_batch() -> None:
    with pytest.raises(ValueError):
        topk_mask(np.zeros(5), [0.5], 0)


def test_topk_mask_quota_at_exact_half() -> None:
    mask = topk_mask(np.arange(50.0), [0.29, 0.35], 50)
    assert mask[0].sum() == 15  # 0.29 * 50 = 14.5
    mask = topk_mask(np.arange(90.0), [0.35], 90)
    assert mask[0].sum() == 32  # 0.35 * 90 = 31.5


# --------------------------------------------------------------------------- threshold grid


def test_threshold_grid() -> None:
    rng = np.random.default_rng(30)
    s = rng.integers(0, 7, 40) / 3.0
    grid = threshold_grid(s, 25)
    assert grid.shape == (26,)
    assert np.isposinf(grid[0])
    assert np.all(np.diff(grid) <= 0)
    assert grid[1] == s.max() and grid[-1] == s.min()
    np.testing.assert_allclose(grid[1:], np.quantile(s, np.linspace(1, 0, 25)))
    rows = rng.normal(size=(3, 40))
    grid2 = threshold_grid(rows, 10)
    assert grid2.shape == (3, 11)
    for r in range(3):
        np.testing.assert_allclose(grid2[r], threshold_grid(rows[r], 10))
    assert np.all(np.diff(grid2, axis=-1) <= 0)
    default = threshold_grid(s)
    assert default.shape == (101,) and np.isposinf(default[0])
