"""Joint control checked two ways: against an independent brute-force implementation on small
random instances (exactly the same certified sets, testing order and choice), and by its
guarantee on simulated tables, where a deliberately anti-conservative variant (each risk tested
at delta on its own, the certified sets united) is caught by the same check."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import binom

import calibrate
from calibrate import JointBatch, JointLevel, RiskCounts, ValidationConfig

# Private: the batched candidates joint control takes, built by hand for small instances.
from calibrate._candidates import CandidateBatch
from harness import scores_from_columns, simulate_scores

DELTA = 0.1
# A 95% upper bound this far above delta fails the check (the acceptance margin).
MARGIN = 0.02


# --- the brute-force reference: plain loops, scipy's binomial CDF, itertools for dominance ---


def brute_force(
    c: CandidateBatch,
    risks: list[RiskCounts],
    r: int,
    *,
    objective: str,
    pareto: bool,
    fwer: str,
    delta: float,
) -> tuple[list[int], list[int], int]:
    """(testing order, certified indices sorted, selected index or -1) of trial r."""
    thresholds = [float(x) for x in c.thresholds[r]]
    t = len(thresholds)

    def pvalue(k: int, n: int, alpha: float) -> float:
        return 1.0 if n == 0 else float(binom.cdf(k, n, alpha))

    def est_rate(risk: RiskCounts, j: int) -> float:
        n = int(risk.n_est[r])
        return int(risk.est_losses[r, j]) / max(n, 1)

    budget = [float(x) for x in c.est_budget[r]]
    error = [float(x) for x in c.est_error[r]]
    auroc_risk = [float(x) for x in c.est_objective[r]]
    names = {risk.name for risk in risks}
    points = [[est_rate(risk, j) for risk in risks] for j in range(t)]
    if objective == "auroc":
        points = [[*p, auroc_risk[j]] for j, p in enumerate(points)]
    elif objective == "accuracy" and "error" not in names:
        points = [[*p, error[j]] for j, p in enumerate(points)]
    elif objective == "budget" and "budget" not in names:
        points = [[*p, budget[j]] for j, p in enumerate(points)]
    if len(points[0]) == 1:
        points = [[*p, 0.0] for p in points]

    def dominated(j: int) -> bool:
        for i, j2 in itertools.permutations(range(t), 2):
            if j2 != j:
                continue
            a, b = points[i], points[j]
            if all(x <= y for x, y in zip(a, b, strict=True)) and any(
                x < y for x, y in zip(a, b, strict=True)
            ):
                return True
            if a == b and i < j:  # exact duplicates: the smallest index stays
                return True
        return False

    members = [j for j in range(t) if not (pareto and dominated(j))]
    est_p = {
        j: max(pvalue(int(risk.est_losses[r, j]), int(risk.n_est[r]), risk.alpha) for risk in risks)
        for j in members
    }
    order = sorted(members, key=lambda j: (est_p[j], budget[j], -thresholds[j], j))
    cal_p = [
        max(pvalue(int(risk.cal_losses[r, j]), int(risk.n_cal[r]), risk.alpha) for risk in risks)
        for j in order
    ]
    certified: list[int] = []
    if fwer == "fixed-sequence":
        for j, p in zip(order, cal_p, strict=True):
            if p > delta:
                break
            certified.append(j)
    else:  # fallback: weight 2^-(i+1), the last member 2^-(m-1); a rejection passes its level on
        carried, m = 0.0, len(order)
        for i, (j, p) in enumerate(zip(order, cal_p, strict=True)):
            weight = 2.0 ** -(i + 1) if i < m - 1 else 2.0 ** -(m - 1)
            level = delta * weight + carried
            carried = level if p <= level else 0.0
            if p <= level:
                certified.append(j)
    keys = {
        "auroc": lambda j: (auroc_risk[j], budget[j], j),
        "accuracy": lambda j: (error[j], budget[j], j),
        "budget": lambda j: (budget[j], error[j], j),
    }[objective]
    selected = min(certified, key=keys) if certified else -1
    return order, sorted(certified), selected


def random_instance(
    rng: np.random.Generator, trials: int, risk_names: tuple[str, ...]
) -> tuple[CandidateBatch, list[RiskCounts]]:
    """Small random candidates: few thresholds, small splits, coarse rates so that ties happen."""
    t = int(rng.integers(2, 8))
    n_est, n_cal = int(rng.integers(4, 25)), int(rng.integers(5, 50))
    finite = -np.sort(-rng.integers(0, 4, size=(trials, t - 1)) / 4.0, axis=1)
    thresholds = np.concatenate([np.full((trials, 1), np.inf), finite], axis=1)
    est_delegated = rng.integers(0, n_est + 1, size=(trials, t))
    est_wrong = rng.integers(0, n_est + 1, size=(trials, t))
    cal_delegated = rng.integers(0, max(1, n_cal // 2), size=(trials, t))
    cal_wrong = rng.integers(0, max(1, n_cal // 2), size=(trials, t))
    c = CandidateBatch(
        thresholds=thresholds,
        est_budget=est_delegated / n_est,
        est_objective=rng.integers(0, 4, size=(trials, t)) / 8.0,
        est_error=est_wrong / n_est,
        cal_delegated=cal_delegated,
        cal_errors=cal_wrong,
        n_est=n_est,
        n_cal=n_cal,
    )
    levels = {name: float(rng.choice([0.2, 0.3, 0.45, 0.6])) for name in risk_names}
    risks = []
    for name in risk_names:
        if name == "budget":
            counts = (est_delegated, np.full(trials, n_est), cal_delegated, np.full(trials, n_cal))
        elif name == "error":
            counts = (est_wrong, np.full(trials, n_est), cal_wrong, np.full(trials, n_cal))
        else:  # the positives of each split: their number varies per trial, and may be 0
            pos_est, pos_cal = (
                rng.integers(0, n_est + 1, size=trials),
                rng.integers(0, n_cal + 1, size=trials),
            )
            est = rng.integers(0, pos_est[:, None] + 1, size=(trials, t))
            cal = (rng.random((trials, t)) * (pos_cal[:, None] // 2 + 1)).astype(np.int64)
            counts = (est, pos_est, cal, pos_cal)
        risks.append(RiskCounts(name, levels[name], *(np.asarray(x, np.int64) for x in counts)))  # type: ignore[arg-type]
    return c, risks


@pytest.mark.parametrize("fwer", ["fixed-sequence", "fallback"])
@pytest.mark.parametrize("pareto", [True, False], ids=["pareto", "all"])
@pytest.mark.parametrize("risk_names", [("budget", "error"), ("budget", "error", "fnr"), ("error", "fnr")])
def test_joint_control_equals_brute_force(fwer: str, pareto: bool, risk_names: tuple[str, ...]) -> None:
    rng = np.random.default_rng([30, len(risk_names), pareto, fwer == "fallback"])
    compared = certified_any = 0
    for _ in range(40):
        c, risks = random_instance(rng, 8, risk_names)
        objective = str(rng.choice(calibrate.JOINT_OBJECTIVES))
        delta = float(rng.choice([0.05, 0.1, 0.3]))
        control = calibrate.ControlConfig(delta=delta, fwer=fwer, pareto=pareto)  # type: ignore[arg-type]
        batch = calibrate.joint_control_batch(c, risks, objective=objective, control=control)  # type: ignore[arg-type]
        for r in range(len(c)):
            order, certified, selected = brute_force(
                c, risks, r, objective=objective, pareto=pareto, fwer=fwer, delta=delta
            )
            n = int(batch.n_candidates[r])
            assert batch.order[r, :n].tolist() == order
            assert np.flatnonzero(batch.certified[r]).tolist() == certified
            assert int(batch.selected[r]) == selected
            compared += 1
            certified_any += bool(certified)
    assert compared == 320
    assert 30 < certified_any < 300  # both outcomes are exercised


def test_candidate_risks_are_the_candidates_counts() -> None:
    c, risks = random_instance(np.random.default_rng(1), 4, ("budget", "error"))
    built = calibrate.candidate_risks(c, budget=risks[0].alpha, error=risks[1].alpha)
    for mine, theirs in zip(risks, built, strict=True):
        for name in ("est_losses", "n_est", "cal_losses", "n_cal"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))


# --- the guarantee on simulated tables, and an anti-conservative variant caught by it ---


def union_of_single_risk_tests(c: CandidateBatch, risks, *, objective, control, members=None) -> JointBatch:
    """Anti-conservative on purpose: each risk tested alone at delta (its own LTT), and a
    threshold certified when ANY one test certifies it; selection by the same D_est objective.
    `members` (the joint family) is not used: each risk alone has its own."""
    alone = [calibrate.joint_control_batch(c, [risk], objective=objective, control=control) for risk in risks]
    certified = np.logical_or.reduce([batch.certified for batch in alone])
    keys = {"auroc": (c.est_objective, c.est_budget), "accuracy": (c.est_error, c.est_budget)}
    primary, secondary = keys.get(objective, (c.est_budget, c.est_error))
    index = np.broadcast_to(np.arange(certified.shape[1]), certified.shape)
    best = np.lexsort(
        (index, np.where(certified, secondary, np.inf), np.where(certified, primary, np.inf)), axis=1
    )[:, 0]
    selected = np.where(certified.any(axis=1), best, -1)
    threshold = np.where(selected >= 0, np.take_along_axis(c.thresholds, best[:, None], axis=1)[:, 0], np.nan)
    return replace(alone[0], certified=certified, selected=selected, threshold=threshold)


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[int, calibrate.Scores]]:
    return {
        scenario: scores_from_columns(
            simulate_scores(scenario, 4000, 1, n_dev=0, random_state=3)
        ).test_scores()  # type: ignore[arg-type]
        for scenario in ("strong", "weak")
    }


LEVELS = (JointLevel(0.3, 0.25), JointLevel(0.5, 0.2), JointLevel(0.2, 0.22))
CONFIG = ValidationConfig(trials=200, cal_size=800, delta=DELTA)


def upper_bounds(results) -> list[float]:
    return [r.tested.population.violation.high for r in results]


@pytest.mark.parametrize("scenario", ["strong", "weak"])
def test_joint_guarantee_holds_and_the_union_variant_is_caught(
    scenario: str, tables: dict[str, dict[int, calibrate.Scores]]
) -> None:
    by_seed = tables[scenario]
    real = calibrate.validate_joint(by_seed, levels=LEVELS, config=CONFIG)
    assert max(upper_bounds(real)) <= DELTA + MARGIN, upper_bounds(real)
    assert sum(r.tested.population.selections for r in real) > 150  # certifies often enough to test
    union = calibrate.validate_joint(
        by_seed, levels=LEVELS, config=CONFIG, procedure=union_of_single_risk_tests
    )
    assert max(upper_bounds(union)) > DELTA + MARGIN  # the same check fails the variant
    assert max(r.tested.population.violation.low for r in union) > DELTA  # and clearly so


def test_fnr_joins_the_test(tables: dict[str, dict[int, calibrate.Scores]]) -> None:
    by_seed = tables["strong"]
    fresh = scores_from_columns(simulate_scores("strong", 3000, 1, n_dev=0, random_state=4)).test_scores()
    config = replace(CONFIG, trials=64)
    (plain,) = calibrate.validate_joint(by_seed, levels=[JointLevel(0.5, 0.2)], config=config)
    (strict,) = calibrate.validate_joint(
        by_seed, levels=[JointLevel(0.5, 0.2, 0.1)], config=config, fresh=fresh
    )
    # A tight false-negative level only removes thresholds: never more selections.
    assert strict.tested.population.selections <= plain.tested.population.selections
    assert strict.levels == {"budget": 0.5, "error": 0.2, "fnr": 0.1}
    record = strict.to_dict()
    assert record["mode"] == "joint" and "alpha" not in record
    assert set(record["by_risk"]) == {"budget", "error", "fnr"}  # type: ignore[arg-type]
    trials = strict.per_trial
    # The joint violation is the union of the per-risk ones, trial by trial.
    either = trials["population_budget_violated"] | trials["population_error_violated"]
    np.testing.assert_array_equal(trials["population_violated"], either | trials["population_fnr_violated"])
    # The fresh false-negative rate is the positives the chosen cascade misses, recounted here.
    table = fresh[0]
    merged = calibrate.merge_scores(table.probe, table.expert, calibrate.POLICIES["ctd"].merge)
    positive = table.label == 1
    checked = 0
    for prefix in ("", "empirical_"):
        for r in np.flatnonzero(trials[f"{prefix}selected"]):
            final = np.where(table.dv > trials[f"{prefix}threshold"][r], merged, table.probe)
            missed = int((positive & (final < 0.5)).sum())
            assert trials[f"{prefix}fresh_fnr"][r] == missed / positive.sum()
            assert trials[f"{prefix}fresh_fnr_violated"][r] == (missed > np.floor(0.1 * positive.sum()))
            checked += 1
    assert checked > 0


def test_levels_together_equal_levels_one_at_a_time(tables: dict[str, dict[int, calibrate.Scores]]) -> None:
    """validate_joint computes each Pareto family once per set of risks and shares it across
    levels and selectors: every per-trial column equals a run of each level on its own."""
    by_seed = tables["weak"]
    levels = (JointLevel(0.3, 0.2), JointLevel(0.5, None), JointLevel(0.3, 0.2, 0.2), JointLevel(0.2, 0.25))
    config = replace(CONFIG, trials=48)
    together = calibrate.validate_joint(by_seed, levels=levels, config=config)
    for level, joint in zip(levels, together, strict=True):
        (alone,) = calibrate.validate_joint(by_seed, levels=[level], config=config)
        # (with an fnr level among them, every level also reports its fnr columns)
        assert alone.per_trial.keys() <= joint.per_trial.keys()
        for column, values in alone.per_trial.items():
            np.testing.assert_array_equal(joint.per_trial[column], values, err_msg=f"{level} {column}")
