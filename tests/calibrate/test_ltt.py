"""Learn-then-Test controllers and the per-threshold statistics they consume.

The controllers are checked against a reference written from SPEC section 4: brute-force Pareto
filter, explicit testing order, exact binomial p-values from integer counts, fixed-sequence
testing (cross-checked with MAPIE) and the selection rule.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from mapie.risk_control.fwer_control import control_fwer as mapie_control_fwer
from numpy.typing import NDArray
from sklearn.metrics import roc_auc_score

import calibrate
from calibrate import (
    POLICIES,
    Candidates,
    ControlConfig,
    ControlResult,
    Scores,
    SweepConfig,
    binomial_pvalue,
    budget_control,
    empirical_control,
    performance_control,
    policy_signal,
    random_splits,
    sweep,
    threshold_candidates,
    uncertainty_signal,
)

# Private: k* and the candidates the controllers consume, unit-tested.
from calibrate._pvalues import binomial_kstar

# --------------------------------------------------------------------------- helpers


def pareto_brute_force(b: NDArray[np.float64], o: NDArray[np.float64]) -> list[int]:
    keep = []
    for i in range(b.size):
        dominated = any(b[j] <= b[i] and o[j] <= o[i] and (b[j] < b[i] or o[j] < o[i]) for j in range(b.size))
        duplicate_before = any(b[j] == b[i] and o[j] == o[i] for j in range(i))
        if not dominated and not duplicate_before:
            keep.append(i)
    return keep


def fst_prefix(pvalues: NDArray[np.float64], delta: float) -> int:
    """Number of hypotheses rejected by fixed-sequence testing: the run of p <= delta from the start."""
    n = 0
    for p in pvalues:
        if p > delta:
            break
        n += 1
    return n


def argmin_by(indices: list[int], *keys: NDArray[np.float64]) -> int:
    return min(indices, key=lambda i: (*(float(key[i]) for key in keys), i))


def random_candidates(rng: np.random.Generator) -> Candidates:
    """Hand-built statistics with ties everywhere; index 0 is "never delegate"."""
    t = int(rng.integers(2, 40))
    n_cal = int(rng.choice([5, 12, 25, 60, 150, 400, 1000]))
    n_est = int(rng.integers(10, 300))
    thresholds = np.concatenate([[np.inf], np.sort(rng.integers(0, 12, t - 1) / 4.0)[::-1]])
    if rng.uniform() < 0.5:  # realistic: budget grows as the threshold falls
        m = np.sort(rng.integers(0, n_est + 1, t))
        m[0] = 0
    else:  # arbitrary
        m = rng.integers(0, n_est + 1, t)
        m[0] = 0
    est_budget = m / n_est
    est_objective = rng.integers(0, 8, t) / 8.0
    est_objective[0] = 0.75
    est_error = rng.integers(0, 8, t) / 20.0
    noise = rng.integers(-3, 4, t)
    cal_delegated = np.clip(np.round(est_budget * n_cal).astype(np.int64) + noise, 0, n_cal)
    cal_delegated[0] = 0
    cal_errors = rng.binomial(n_cal, rng.uniform(0.0, 0.5, t)).astype(np.int64)
    return Candidates(
        thresholds=thresholds.astype(np.float64),
        est_budget=est_budget.astype(np.float64),
        est_objective=est_objective,
        est_error=est_error,
        cal_delegated=cal_delegated,
        cal_errors=cal_errors,
        n_est=n_est,
        n_cal=n_cal,
    )


def random_level(rng: np.random.Generator) -> tuple[float, float]:
    return float(rng.uniform(0.03, 0.6)), float(rng.choice([0.05, 0.1, 0.2]))


def random_scores(rng: np.random.Generator, n: int) -> Scores:
    label = rng.integers(0, 2, n)
    sign = 2 * label - 1
    probe = np.clip(np.round(0.5 + 0.15 * sign + rng.normal(0, 0.25, n), 2), 0, 1)
    expert = np.clip(np.round(0.5 + 0.3 * sign + rng.normal(0, 0.2, n), 2), 0, 1)
    value = sign * (expert - probe)
    dv = np.round(value + rng.normal(0, 0.2, n), 1)  # coarse: many ties in the signal
    return Scores(label=label.astype(np.int64), probe=probe, expert=expert, dv=dv)


def check_budget_control(c: Candidates, alpha: float, delta: float, pareto: bool) -> ControlResult:
    """Everything budget_control promises, from a reference computation."""
    r = budget_control(c, alpha=alpha, control=ControlConfig(delta=delta, pareto=pareto))
    family = pareto_brute_force(c.est_budget, c.est_objective) if pareto else list(range(c.thresholds.size))
    expected_order = sorted(family, key=lambda i: (c.est_budget[i], -c.thresholds[i], i))
    np.testing.assert_array_equal(r.order, expected_order)
    assert np.all(np.diff(c.est_budget[r.order]) >= 0)  # conservative -> aggressive
    k = c.cal_delegated[r.order]
    np.testing.assert_array_equal(r.k, k)
    assert r.k.dtype.kind == "i"
    np.testing.assert_array_equal(r.pvalues, binomial_pvalue(k, c.n_cal, alpha))
    n_rej = fst_prefix(r.pvalues, delta)
    assert r.certified.tolist() == list(r.order[:n_rej])
    assert r.stopped_at == (None if n_rej == len(r.order) else n_rej)
    assert r.kstar == int(binomial_kstar(c.n_cal, alpha, delta))
    np.testing.assert_array_equal(r.k[:n_rej] <= r.kstar, np.ones(n_rej, bool))
    assert (r.n, r.n_cal, r.n_est) == (c.n_cal, c.n_cal, c.n_est)
    assert (r.mode, r.alpha, r.delta, r.pareto, r.fwer) == ("budget", alpha, delta, pareto, "fixed-sequence")
    certified = r.certified.tolist()
    if not certified:
        expected = int(np.flatnonzero(np.isposinf(c.thresholds))[0])
    elif pareto:
        expected = argmin_by(certified, c.est_objective, c.est_budget)
    else:
        expected = argmin_by(certified, -c.est_budget, c.thresholds)
    assert r.selected == expected
    assert r.threshold == float(c.thresholds[expected])
    assert r.has_policy
    return r


def check_performance_control(c: Candidates, alpha: float, delta: float, pareto: bool) -> ControlResult:
    r = performance_control(c, alpha=alpha, control=ControlConfig(delta=delta, pareto=pareto))
    family = pareto_brute_force(c.est_budget, c.est_error) if pareto else list(range(c.thresholds.size))
    expected_order = sorted(family, key=lambda i: (c.est_error[i], c.est_budget[i], i))
    np.testing.assert_array_equal(r.order, expected_order)
    k = c.cal_errors[r.order]
    np.testing.assert_array_equal(r.k, k)
    np.testing.assert_array_equal(r.pvalues, binomial_pvalue(k, c.n_cal, alpha))
    n_rej = fst_prefix(r.pvalues, delta)
    assert r.certified.tolist() == list(r.order[:n_rej])
    assert r.mode == "performance"
    if n_rej == 0:
        assert r.threshold is None and r.selected is None and not r.has_policy
    else:
        expected = argmin_by(r.certified.tolist(), c.est_budget, c.est_error)
        assert r.selected == expected
        assert r.threshold == float(c.thresholds[expected])
        assert r.has_policy
    return r


# --------------------------------------------------------------------------- budget control


@pytest.mark.parametrize("pareto", [True, False])
def test_budget_control_against_reference(pareto: bool) -> None:
    rng = np.random.default_rng(40 + pareto)
    outcomes = {"none": 0, "some": 0}
    for _ in range(250):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        r = check_budget_control(c, alpha, delta, pareto)
        outcomes["some" if r.certified.size else "none"] += 1
    assert min(outcomes.values()) >= 20  # both branches are exercised


def test_budget_control_returns_never_delegate_when_nothing_certified() -> None:
    rng = np.random.default_rng(42)
    c = random_candidates(rng)
    # (1 - 0.1)^5 = 0.59 > 0.1: even zero delegations on 5 calibration points certify nothing.
    c = Candidates(
        **{
            **c.__dict__,
            "n_cal": 5,
            "cal_delegated": np.zeros_like(c.cal_delegated),
            "cal_errors": np.minimum(c.cal_errors, 5),
        }
    )
    for pareto in (True, False):
        r = budget_control(c, alpha=0.1, control=ControlConfig(delta=0.1, pareto=pareto))
        assert r.certified.size == 0
        assert r.stopped_at == 0
        assert r.selected == 0 and math.isinf(r.threshold) and r.threshold > 0
        assert r.has_policy


def test_budget_control_certified_set_matches_mapie() -> None:
    rng = np.random.default_rng(43)
    partial = 0
    for _ in range(300):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        r = budget_control(
            c, alpha=alpha, control=ControlConfig(delta=delta, pareto=bool(rng.integers(0, 2)))
        )
        pvalues = binomial_pvalue(c.cal_delegated[r.order], c.n_cal, alpha)
        rejected = mapie_control_fwer(pvalues, delta, fwer_method="fixed_sequence")
        assert sorted(r.certified.tolist()) == sorted(r.order[rejected].tolist())
        partial += 0 < r.certified.size < r.order.size
    assert partial >= 30


def test_budget_control_holm_matches_mapie() -> None:
    rng = np.random.default_rng(44)
    for _ in range(150):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        r = budget_control(c, alpha=alpha, control=ControlConfig(delta=delta, fwer="holm"))
        assert r.fwer == "holm"
        pvalues = binomial_pvalue(c.cal_delegated[r.order], c.n_cal, alpha)
        np.testing.assert_array_equal(r.pvalues, pvalues)
        rejected = mapie_control_fwer(pvalues, delta, fwer_method="bonferroni_holm")
        assert sorted(r.certified.tolist()) == sorted(r.order[rejected].tolist())


def test_budget_control_rejects_bad_levels() -> None:
    c = random_candidates(np.random.default_rng(45))
    for alpha, delta in ((0.0, 0.1), (1.0, 0.1), (0.1, 0.0), (0.1, 1.0)):
        with pytest.raises(ValueError):
            budget_control(c, alpha=alpha, control=ControlConfig(delta=delta))


# --------------------------------------------------------------------------- performance control


@pytest.mark.parametrize("pareto", [True, False])
def test_performance_control_against_reference(pareto: bool) -> None:
    rng = np.random.default_rng(46 + pareto)
    outcomes = {"none": 0, "some": 0}
    for _ in range(250):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        r = check_performance_control(c, alpha, delta, pareto)
        outcomes["some" if r.has_policy else "none"] += 1
    assert min(outcomes.values()) >= 20


def test_performance_control_matches_mapie() -> None:
    rng = np.random.default_rng(48)
    for _ in range(150):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        r = performance_control(c, alpha=alpha, control=ControlConfig(delta=delta))
        pvalues = binomial_pvalue(c.cal_errors[r.order], c.n_cal, alpha)
        rejected = mapie_control_fwer(pvalues, delta, fwer_method="fixed_sequence")
        assert sorted(r.certified.tolist()) == sorted(r.order[rejected].tolist())


# --------------------------------------------------------------------------- empirical control


@pytest.mark.parametrize("pareto", [True, False])
def test_empirical_control_accepts_plug_in_risk(pareto: bool) -> None:
    rng = np.random.default_rng(49 + pareto)
    for _ in range(250):
        c = random_candidates(rng)
        alpha = float(rng.uniform(0.03, 0.6))
        r = empirical_control(c, alpha=alpha, control=ControlConfig(pareto=pareto))
        family = pareto_brute_force(c.est_budget, c.est_error) if pareto else list(range(c.thresholds.size))
        order = sorted(family, key=lambda i: (c.est_error[i], c.est_budget[i], i))
        np.testing.assert_array_equal(r.order, order)
        bound = Fraction(alpha) * c.n_cal  # exact: k <= alpha * n_cal
        accepted = [i for i in order if Fraction(int(c.cal_errors[i])) <= bound]
        assert r.certified.tolist() == accepted
        assert r.kstar == math.floor(bound)
        assert r.mode == "empirical" and r.fwer == "none"
        if accepted:
            assert r.selected == argmin_by(accepted, c.est_budget, c.est_error)
            assert r.threshold == float(c.thresholds[r.selected])
        else:
            assert r.selected is None and r.threshold is None and not r.has_policy


def test_empirical_control_accepts_error_equal_to_alpha() -> None:
    c = Candidates(
        thresholds=np.array([np.inf, 0.5]),
        est_budget=np.array([0.0, 0.5]),
        est_objective=np.array([0.3, 0.2]),
        est_error=np.array([0.3, 0.2]),
        cal_delegated=np.array([0, 50]),
        cal_errors=np.array([40, 29]),
        n_est=100,
        n_cal=100,
    )
    assert 29 / 100 == 0.29
    r = empirical_control(c, alpha=0.29)
    assert r.certified.tolist() == [1]


# --------------------------------------------------------------------------- audit records


def test_control_results_are_json_serialisable() -> None:
    rng = np.random.default_rng(51)
    saw_inf = saw_none = False
    for _ in range(60):
        c = random_candidates(rng)
        alpha, delta = random_level(rng)
        for r in (
            budget_control(c, alpha=alpha, control=ControlConfig(delta=delta)),
            budget_control(c, alpha=alpha, control=ControlConfig(delta=delta, pareto=False)),
            performance_control(c, alpha=alpha, control=ControlConfig(delta=delta)),
        ):
            record = json.loads(json.dumps(r.to_dict(), allow_nan=False))
            assert record["order"] == r.order.tolist()
            assert record["certified"] == r.certified.tolist()
            assert record["k"] == r.k.tolist()
            assert record["pvalues"] == r.pvalues.tolist()
            assert record["selected"] == r.selected
            if r.threshold is None:
                assert record["threshold"] is None
                saw_none = True
            elif math.isinf(r.threshold):
                assert record["threshold"] == "inf"
                saw_inf = True
            else:
                assert record["threshold"] == r.threshold
        emp = empirical_control(c, alpha=alpha)
        record = json.loads(json.dumps(emp.to_dict()))  # NaN delta / p-values: plain json.dumps
        assert record["mode"] == "empirical" and record["certified"] == emp.certified.tolist()
    assert saw_inf and saw_none


# --------------------------------------------------------------------------- threshold_candidates


def expected_candidate_stats(
    scores: Scores,
    signal_row: NDArray[np.float64],
    est: NDArray[np.int64],
    cal: NDArray[np.int64],
    thresholds: NDArray[np.float64],
    merge: str,
    objective: str,
) -> dict[str, NDArray]:
    y = scores.label.astype(bool)
    out: dict[str, list] = {k: [] for k in ("budget", "error", "objective", "cal_delegated", "cal_errors")}
    merged = (scores.expert if merge == "overwrite" else (scores.probe + scores.expert) / 2).astype(float)
    for lam in thresholds:
        d_est = signal_row[est] > lam
        cascade_est = np.where(d_est, merged[est], scores.probe[est])
        error = float(np.mean((cascade_est >= 0.5) != y[est]))
        out["budget"].append(d_est.mean())
        out["error"].append(error)
        if objective == "auroc":
            one_class = y[est].all() or not y[est].any()
            out["objective"].append(1.0 if one_class else 1.0 - roc_auc_score(y[est], cascade_est))
        else:
            out["objective"].append(error)
        d_cal = signal_row[cal] > lam
        cascade_cal = np.where(d_cal, merged[cal], scores.probe[cal])
        out["cal_delegated"].append(int(d_cal.sum()))
        out["cal_errors"].append(int(np.sum((cascade_cal >= 0.5) != y[cal])))
    return {k: np.asarray(v) for k, v in out.items()}


def check_candidates(
    scores: Scores, signal: NDArray[np.float64], merge: str, objective: str, n_grid: int, seed: int
) -> None:
    splits = random_splits(scores.n, 3, seed)
    batch = threshold_candidates(scores, signal, splits, merge=merge, objective=objective, n_grid=n_grid)
    assert len(batch) == 3
    for r, c in enumerate(batch):
        row = signal[0] if signal.shape[0] == 1 else signal[r]
        est, cal = splits.est[r], splits.cal[r]
        assert (c.n_est, c.n_cal) == (est.size, cal.size)
        # Thresholds: +inf, then quantiles of the signal on D_est at levels 1, ..., 0.
        assert c.thresholds.shape == (n_grid + 1,) and np.isposinf(c.thresholds[0])
        np.testing.assert_allclose(
            c.thresholds[1:], np.quantile(row[est], np.linspace(1, 0, n_grid)), rtol=1e-12
        )
        ref = expected_candidate_stats(scores, row, est, cal, c.thresholds, merge, objective)
        np.testing.assert_allclose(c.est_budget, ref["budget"], rtol=0, atol=1e-15)
        np.testing.assert_allclose(c.est_error, ref["error"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(c.est_objective, ref["objective"], rtol=0, atol=1e-12)
        assert c.cal_delegated.dtype.kind == "i" and c.cal_errors.dtype.kind == "i"
        np.testing.assert_array_equal(c.cal_delegated, ref["cal_delegated"])
        np.testing.assert_array_equal(c.cal_errors, ref["cal_errors"])


@pytest.mark.parametrize("objective", ["auroc", "accuracy"])
@pytest.mark.parametrize("merge", ["overwrite", "average"])
@pytest.mark.parametrize("policy", ["ctd", "unc-calibrated"])
def test_threshold_candidates_recomputed(policy: str, merge: str, objective: str) -> None:
    rng = np.random.default_rng(60)
    scores = random_scores(rng, 170)
    splits = random_splits(scores.n, 3, 7)
    signal = policy_signal(scores, POLICIES[policy], splits)
    if policy == "ctd":
        assert signal.shape == (1, scores.n)  # the DV signal is shared by all trials
    else:
        assert signal.shape == (3, scores.n)
        # Per trial: -|F(probe) - 0.5| with F the ECDF of the probe scores on that trial's D_est.
        for r in range(3):
            np.testing.assert_array_equal(
                signal[r], uncertainty_signal(scores.probe, scores.probe[splits.est[r]])
            )
    check_candidates(scores, signal, merge, objective, n_grid=15, seed=7)


def test_threshold_candidates_default_grid() -> None:
    rng = np.random.default_rng(61)
    scores = random_scores(rng, 300)
    splits = random_splits(scores.n, 3, 8)
    signal = policy_signal(scores, POLICIES["ctd"], splits)
    check_candidates(scores, signal, "overwrite", "auroc", n_grid=100, seed=8)


def test_threshold_candidates_one_class_est_counts_as_auroc_zero() -> None:
    rng = np.random.default_rng(62)
    n = 80
    scores = Scores(
        label=np.ones(n, dtype=np.int64),
        probe=rng.uniform(size=n).round(2),
        expert=rng.uniform(size=n).round(2),
        dv=rng.normal(size=n).round(1),
    )
    splits = random_splits(n, 2, 9)
    for c in threshold_candidates(scores, scores.dv[None, :], splits, merge="overwrite", objective="auroc"):
        np.testing.assert_array_equal(c.est_objective, np.ones_like(c.est_objective))


def test_controllers_on_computed_candidates() -> None:
    rng = np.random.default_rng(63)
    scores = random_scores(rng, 400)
    splits = random_splits(scores.n, 6, 10)
    for policy in ("ctd", "unc-calibrated"):
        signal = policy_signal(scores, POLICIES[policy], splits)
        for objective in ("auroc", "accuracy"):
            batch = threshold_candidates(
                scores, signal, splits, merge=POLICIES[policy].merge, objective=objective, n_grid=30
            )
            for c in batch:
                for alpha in (0.05, 0.2, 0.5):
                    check_budget_control(c, alpha, 0.1, pareto=True)
                    check_budget_control(c, alpha, 0.1, pareto=False)
                    check_performance_control(c, alpha, 0.1, pareto=True)


# --------------------------------------------------------------------------- sweep


def quota(budget: float, size: int) -> int:
    return math.floor(Fraction(repr(budget)) * size + Fraction(1, 2))


def test_sweep_table_shape_and_topk_rates() -> None:
    rng = np.random.default_rng(64)
    seeds = (0, 3)
    scores_by_seed = {s: random_scores(rng, 241) for s in seeds}
    config = SweepConfig(
        budgets=(0.05, 0.25, 0.476316, 0.9),
        policies=(*calibrate.DEFAULT_POLICIES, "unc-central"),
        batch_sizes=(32, 50),
        n_grid=20,
    )
    result = sweep(scores_by_seed, config)
    table = result.table
    n_rows = (
        len(config.policies)
        * len(config.budgets)
        * len(config.batch_sizes)
        * len(seeds)
        * len(config.objectives)
    )
    assert set(table) == set(calibrate.SWEEP_COLUMNS)
    assert all(len(col) == n_rows for col in table.values())
    n_eval = 241 - 120  # the evaluation half: n - floor(n / 2)
    for i in range(n_rows):
        policy, b, budget = str(table["policy"][i]), int(table["batch_size"][i]), float(table["budget"][i])
        mechanism = POLICIES[policy].mechanism
        if mechanism == "topk":
            sizes = [min(b, n_eval - s) for s in range(0, n_eval, b)]
            expected = sum(quota(budget, size) for size in sizes) / n_eval
            assert table["realised"][i] == pytest.approx(expected, abs=1e-12)
            assert np.isnan(table["threshold"][i])
        elif mechanism == "central":
            assert table["realised"][i] == pytest.approx(quota(budget, n_eval) / n_eval, abs=1e-12)
        else:
            assert 0.0 <= table["realised"][i] <= 1.0
            assert not np.isnan(table["threshold"][i])
            assert table["n_certified"][i] >= 0
    n_calibrated = sum(POLICIES[p].calibrated for p in config.policies)
    assert len(result.ltt) == n_calibrated * len(config.objectives) * len(seeds) * len(config.budgets)
    json.dumps(result.ltt, allow_nan=False)
