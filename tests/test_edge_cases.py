"""Edge cases found in review: integer decisions at the boundary, seeds of any sign, several
probe configurations in one table, input checks, and the large-D_est AUROC route."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd

import calibrate
import calibrate._splits as splits_module
from calibrate._quota import count_at_most, count_nearest
from harness import read_scores, scores_from_columns, simulate_scores, write_table

# -------------------------------------------------------------- integer decisions


def test_violation_at_exactly_alpha_is_not_a_violation() -> None:
    rng = np.random.default_rng(1)
    n = 200
    y = rng.integers(0, 2, n)
    p = np.where(rng.random(n) < 0.7, y * 0.8 + 0.1, 1 - (y * 0.8 + 0.1))
    scores = {0: calibrate.Scores(label=y, probe=p, expert=p, dv=rng.normal(size=n))}
    result = calibrate.validate(scores, mode="performance", alpha=0.3, delta=0.1, trials=2000)
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


# -------------------------------------------------------------- FWER and audit records


def test_fixed_sequence_rejects_nan_inside_a_family() -> None:
    with pytest.raises(ValueError, match="NaN"):
        calibrate.control_fwer([0.01, np.nan, 0.01], 0.1)
    with pytest.raises(ValueError, match="prefix"):
        calibrate.FixedSequence().run_batch([[0.01, np.nan, 0.01]], 0.1)


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
        r = calibrate.budget_control(c, alpha=alpha, delta=0.1, pareto=bool(rng.integers(0, 2)))
        reached = r.order if r.stopped_at is None else r.order[: r.stopped_at + 1]
        k = r.k[: reached.size]
        np.testing.assert_array_equal(np.isin(reached, r.certified), k <= r.kstar)
        if r.stopped_at is not None:
            assert r.k[r.stopped_at] > r.kstar


@pytest.mark.parametrize("fwer", ["holm", "bonferroni"])
def test_kstar_is_not_claimed_for_holm_or_bonferroni(fwer: str) -> None:
    c = random_candidates(np.random.default_rng(4))
    r = calibrate.budget_control(c, alpha=0.3, delta=0.1, fwer=fwer)  # type: ignore[arg-type]
    assert r.kstar is None
    assert r.to_dict()["kstar"] is None


# -------------------------------------------------------------- library input checks


def test_scores_reject_bad_values() -> None:
    good = dict(label=np.array([0, 1]), probe=np.array([0.2, 0.8]), expert=np.array([0.1, 0.9]))
    with pytest.raises(ValueError, match="labels"):
        calibrate.Scores(**{**good, "label": np.array([0, 2])}, dv=np.zeros(2))
    with pytest.raises(ValueError, match="probe"):
        calibrate.Scores(**{**good, "probe": np.array([0.2, np.nan])}, dv=np.zeros(2))
    with pytest.raises(ValueError, match="dv"):
        calibrate.Scores(**good, dv=np.array([0.0, np.inf]))


def test_candidates_need_never_delegate_and_consistent_counts() -> None:
    c = random_candidates(np.random.default_rng(5))
    with pytest.raises(ValueError, match="never delegate"):
        calibrate.Candidates(**{**c.__dict__, "thresholds": np.ones_like(c.thresholds)})
    with pytest.raises(ValueError, match="cal_delegated"):
        calibrate.Candidates(**{**c.__dict__, "cal_delegated": c.cal_delegated + c.n_cal + 1})
    with pytest.raises(ValueError, match="shape"):
        calibrate.Candidates(**{**c.__dict__, "est_error": c.est_error[:-1]})


def test_policy_registry_matches_its_literals() -> None:
    assert tuple(calibrate.POLICIES) == calibrate.POLICY_NAMES
    calibrated = tuple(p.name for p in calibrate.POLICIES.values() if p.calibrated)
    assert calibrated == get_args(calibrate.CalibratedPolicyName)


# -------------------------------------------------------------- AUROC routes agree


def test_large_dest_route_matches_the_incremental_path(monkeypatch: pytest.MonkeyPatch) -> None:
    table = scores_from_columns(simulate_scores("weak", 600, 1, n_dev=0))
    scores = table.test_scores()[0]
    splits = calibrate.random_splits(scores.n, 6, 0)
    signal = calibrate.policy_signal(scores, calibrate.POLICIES["ctd"], splits)
    kwargs = dict(merge="overwrite", objective="auroc")
    by_path = calibrate.threshold_candidates(scores, signal, splits, **kwargs)
    monkeypatch.setattr(splits_module, "_PATH_LIMIT", 10)
    by_sort = calibrate.threshold_candidates(scores, signal, splits, **kwargs)
    np.testing.assert_allclose(by_path.est_objective, by_sort.est_objective, rtol=0, atol=1e-12)


# -------------------------------------------------------------- harness and CLI


@pytest.fixture()
def table_path(tmp_path: Path) -> Path:
    path = tmp_path / "s.parquet"
    write_table(path, simulate_scores("weak", 400, 2))
    return path


def test_seeds_of_any_sign(tmp_path: Path) -> None:
    columns = simulate_scores("weak", 400, 2)
    columns["seed"] = columns["seed"] - 1  # seeds -1 and 0
    write_table(tmp_path / "neg.csv", columns)
    result = run_ctd("calibrate", "--scores", "neg.csv", "--out", "o", "--budgets", "0.3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # Negative and positive seeds draw different splits.
    a = calibrate.random_splits(100, 1, [0, -1]).evaluation
    b = calibrate.random_splits(100, 1, [0, 1]).evaluation
    assert not np.array_equal(a, b)


def test_duplicate_csv_header_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "dup.csv").write_text("id,probe,probe\na,0.1,0.2\n")
    result = run_ctd("validate", "--scores", "dup.csv", cwd=tmp_path)
    assert_one_line_error(result, "dup.csv", "line 1", "'probe'", "more than once")


def test_csv_with_a_byte_order_mark_reads(tmp_path: Path, table_path: Path) -> None:
    write_table(tmp_path / "plain.csv", simulate_scores("weak", 50, 1))
    text = (tmp_path / "plain.csv").read_text()
    (tmp_path / "bom.csv").write_text("\ufeff" + text, encoding="utf-8")
    assert read_scores(tmp_path / "bom.csv").id.size == read_scores(tmp_path / "plain.csv").id.size


def test_out_paths_of_the_wrong_kind(tmp_path: Path, table_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    assert_one_line_error(
        run_ctd("calibrate", "--scores", str(table_path), "--out", "afile", cwd=tmp_path),
        "afile",
        "not a folder",
    )
    assert_one_line_error(
        run_ctd("simulate", "--scenario", "weak", "--out", "adir", cwd=tmp_path), "adir", "is a folder"
    )
    assert (tmp_path / "afile").read_text() == ""


def test_several_probe_configurations_need_a_choice(tmp_path: Path) -> None:
    one = simulate_scores("weak", 400, 2)
    two = {k: np.concatenate([v, v]) for k, v in one.items()}
    two["arch"] = np.array(["attention"] * one["id"].size + ["mean"] * one["id"].size)
    write_table(tmp_path / "two.parquet", two)  # ids repeat across archs: allowed
    assert_one_line_error(
        run_ctd("calibrate", "--scores", "two.parquet", "--out", "o", cwd=tmp_path),
        "column 'arch'",
        "--arch",
    )
    assert not (tmp_path / "o").exists()
    chosen = run_ctd(
        "calibrate",
        "--scores",
        "two.parquet",
        "--out",
        "o",
        "--arch",
        "mean",
        "--budgets",
        "0.3",
        cwd=tmp_path,
    )
    assert chosen.returncode == 0, chosen.stderr
    assert_one_line_error(
        run_ctd("validate", "--scores", "two.parquet", "--arch", "mlp", cwd=tmp_path), "--arch mlp"
    )


def test_validation_reports_counts_and_conditional_rates(table_path: Path) -> None:
    table = read_scores(table_path)
    result = calibrate.validate(
        table.test_scores(), mode="performance", alpha=0.25, delta=0.1, trials=60, fwer="holm"
    )
    record = result.to_dict()
    assert record["fwer"] == "holm" and record["merge"] == "overwrite"
    assert record["violations"] == int(result.per_trial["violated"].sum())
    assert record["selections"] == int(result.per_trial["selected"].sum())
    if record["selections"]:
        assert record["conditional_violation_rate"] == record["violations"] / record["selections"]
