"""`ctd validate`: its JSON record, its per-trial table, the fresh-table and p-value options,
and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_checks import (
    FAST_VALIDATE,
    assert_clean_error,
    assert_ok,
    assert_process_error,
    check_summary,
    ctd,
    ctd_process,
    one_json_object,
)

from harness import read_table


def test_validate_budget_json(scores: Path):
    record = one_json_object(
        ctd(
            "validate",
            "--scores",
            scores,
            "--mode",
            "budget",
            "--alpha",
            0.3,
            "--delta",
            0.1,
            "--trials",
            40,
            "--json",
        )
    )
    check_summary(record, 40)
    check_summary(record["population"], 40)  # the split minus D_est: what LTT certifies
    assert "fresh" not in record  # only with --eval-scores
    assert record["mode"] == "budget"
    assert record["alpha"] == 0.3 and record["delta"] == 0.1
    assert record["pvalue_method"] == "binomial" and record["seed"] == [0]
    assert record["scores"] == str(scores)
    assert "empirical" not in record
    # Budget control always has "never delegate": every trial selects a policy.
    assert record["selection_rate"] == record["population"]["selection_rate"] == 1.0
    assert 0 <= record["mean_realised_budget"] <= 1
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (60, 140, 200)


def test_validate_performance_json_has_the_empirical_selector(scores: Path):
    record = one_json_object(
        ctd("validate", "--scores", scores, "--mode", "performance", "--alpha", 0.3, "--trials", 30, "--json")
    )
    check_summary(record, 30)
    assert record["mode"] == "performance"
    check_summary(record["empirical"], 30)
    check_summary(record["population"], 30)
    check_summary(record["empirical"]["population"], 30)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_validate_out_writes_one_row_per_trial(scores: Path, tmp_path: Path, suffix: str):
    out = tmp_path / f"trials.{suffix}"
    record = one_json_object(ctd("validate", "--scores", scores, "--trials", 25, "--out", out, "--json"))
    raw = read_table(out)
    assert len(raw) == 25
    assert {"seed", "threshold", "realised", "selected", "violated"} <= set(raw.columns)
    # Trials are spread over both probe seeds.
    assert sorted({int(s) for s in raw.columns["seed"]}) == [0, 1]
    violated = np.array([str(v) in ("True", "true", "1") for v in raw.columns["violated"]])
    assert violated.mean() == pytest.approx(record["violation_rate"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_validate_json_agrees_with_the_same_seed(scores: Path):
    args = ("validate", "--scores", scores, "--trials", 20, "--seed", 3, "--json")
    assert one_json_object(ctd(*args)) == one_json_object(ctd(*args))


@pytest.mark.parametrize("mode", ["budget", "performance"])
def test_validate_prints_a_table_without_json(scores: Path, mode: str):
    result = ctd("validate", "--scores", scores, "--mode", mode, *FAST_VALIDATE)
    assert_ok(result)
    assert "violation rate" in result.stdout and "selected" in result.stdout
    assert "population" in result.stdout and "paper" in result.stdout
    assert "LTT" in result.stdout
    assert ("empirical" in result.stdout) == (mode == "performance")
    assert f"{mode} control" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_validate_fresh_on_the_same_table(scores: Path):
    """--eval-scores adds the 'fresh' measurement and changes no trial; measured on the table
    itself, 'fresh' is the whole split, which holds D_est beside the population's rows."""
    args = ("validate", "--scores", scores, "--mode", "performance", "--alpha", 0.3, "--trials", 30)
    record = one_json_object(ctd(*args, "--eval-scores", scores, "--json"))
    assert record["eval_scores"] == str(scores)
    check_summary(record["fresh"], 30)
    check_summary(record["empirical"]["fresh"], 30)
    assert record["fresh"]["selection_rate"] == record["population"]["selection_rate"]
    assert record["fresh_rows_by_seed"] == {"0": 400, "1": 400}
    without = one_json_object(ctd(*args, "--json"))
    for key in ("population", "violation_rate", "mean_realised_budget"):
        assert without[key] == record[key]  # --eval-scores changes no trial


def test_validate_fresh_table_of_another_draw(scores: Path, tmp_path: Path):
    fresh = tmp_path / "fresh.parquet"
    assert_ok(
        ctd(
            "simulate", "--scenario", "strong", "--n", 3000, "--seeds", 2, "--random-state", 7, "--out", fresh
        )
    )
    record = one_json_object(
        ctd(
            "validate",
            "--scores",
            scores,
            "--eval-scores",
            fresh,
            "--cal-size",
            300,
            "--trials",
            30,
            "--json",
        )
    )
    check_summary(record["fresh"], 30)
    assert record["fresh_rows_by_seed"] == {"0": 3000, "1": 3000}
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (90, 210, 100)


def test_validate_pvalue_and_cal_size(scores: Path):
    record = one_json_object(
        ctd("validate", "--scores", scores, "--pvalue", "hb", "--cal-size", 250, "--trials", 20, "--json")
    )
    assert record["pvalue_method"] == "hb"
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (75, 175, 150)


@pytest.mark.parametrize(
    "options,fragments",
    [
        (("--cal-size", "400"), ("--cal-size 400", "400 test rows")),
        (("--cal-size", "8"), ("--cal-size 8", "D_cal holds 6", "--alpha 0.3")),
        (("--eval-scores", "missing.parquet"), ("missing.parquet",)),
    ],
)
def test_validate_bad_fresh_options(
    scores: Path, tmp_path: Path, options: tuple[str, ...], fragments: tuple[str, ...]
):
    out = tmp_path / "trials.csv"
    args = [tmp_path / o if o.endswith(".parquet") else o for o in options]
    assert_clean_error(
        ctd("validate", "--scores", scores, *args, *FAST_VALIDATE, "--out", out), *fragments, unwritten=(out,)
    )


@pytest.mark.parametrize(
    "options,fragment", [(("--cal-size", "1"), "--cal-size"), (("--pvalue", "exact"), "--pvalue")]
)
def test_process_validate_usage_errors(scores: Path, options: tuple[str, ...], fragment: str):
    assert_process_error(ctd_process("validate", "--scores", scores, *options, *FAST_VALIDATE), fragment)


def test_validate_fresh_table_without_the_seeds(scores: Path, tmp_path: Path):
    fresh = tmp_path / "one-seed.parquet"
    assert_ok(ctd("simulate", "--scenario", "strong", "--n", 500, "--seeds", 1, "--out", fresh))
    out = tmp_path / "trials.csv"
    assert_clean_error(
        ctd("validate", "--scores", scores, "--eval-scores", fresh, *FAST_VALIDATE, "--out", out),
        "--eval-scores",
        "probe seed 1",
        unwritten=(out,),
    )
