"""`ctd validate --budget A --accuracy B`: joint control validated, its JSON record, its table,
its per-trial table, the one-risk shortcuts and the errors of mixing them with --mode/--alpha."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_checks import FAST_VALIDATE, assert_clean_error, assert_ok, check_summary, ctd, one_json_object

from harness import read_table


def test_joint_json_names_the_levels_and_each_risk(scores: Path, tmp_path: Path):
    trials_table = tmp_path / "trials.parquet"
    record = one_json_object(
        ctd(
            "validate", "--scores", scores, "--budget", 0.5, "--accuracy", 0.8, "--fnr", 0.4,
            "--trials", 30, "--out", trials_table, "--json",
        )
    )  # fmt: skip
    check_summary(record, 30)
    check_summary(record["population"], 30)
    check_summary(record["empirical"], 30)
    assert record["mode"] == "joint" and "alpha" not in record
    # 1 - 0.8 is 0.19999999999999996 in floats: the level is the decimal the user meant.
    assert record["levels"] == {"budget": 0.5, "error": 0.2, "fnr": 0.4}
    assert record["objective"] == "auroc"
    assert set(record["by_risk"]) == {"budget", "error", "fnr"}
    for selectors in record["by_risk"].values():
        assert set(selectors) == {"tested", "empirical"}
        assert set(selectors["tested"]) == {"paper", "population"}
    # Each risk's violations are among the joint ones: the joint count is at least each.
    for risk in ("budget", "error", "fnr"):
        assert record["by_risk"][risk]["tested"]["paper"]["violations"] <= record["violations"]
    table = {k: np.asarray(v) for k, v in read_table(trials_table).columns.items()}
    assert table["seed"].size == 30
    np.testing.assert_array_equal(
        table["population_violated"],
        table["population_budget_violated"]
        | table["population_error_violated"]
        | table["population_fnr_violated"],
    )
    assert set(np.unique(table["error_level"])) == {0.2}


def test_joint_table_prints_per_risk_columns(scores: Path):
    result = ctd(
        "validate",
        "--scores",
        scores,
        "--budget",
        0.5,
        "--accuracy",
        0.8,
        "--selection",
        "budget",
        *FAST_VALIDATE,
    )
    assert_ok(result)
    for fragment in (
        "joint control",
        "budget<=0.5",
        "error<=0.2",
        "budget violated",
        "error violated",
        "empirical",
    ):
        assert fragment in result.stdout


def test_a_level_nothing_is_certified_at_shows_dashes_and_says_so(scores: Path):
    """Accuracy 0.97: LTT returns no policy in any trial. Its means over the trials that did are
    "—", not nan, and a line says its 0% violation rate shows nothing."""
    result = ctd("validate", "--scores", scores, "--budget", 0.5, "--accuracy", 0.97, *FAST_VALIDATE)
    assert_ok(result)
    assert "nan" not in result.stdout
    (ltt,) = [line for line in result.stdout.splitlines() if "LTT" in line and "population" in line]
    assert ltt.count("—") == 2, ltt
    assert "LTT returned no policy in any trial" in result.stdout


@pytest.mark.parametrize(
    ("shortcut", "explicit"),
    [
        (("--budget", 0.3), ("--mode", "budget", "--alpha", 0.3)),
        (("--accuracy", 0.75), ("--mode", "performance", "--alpha", 0.25)),
    ],
)
def test_one_risk_alone_is_the_old_mode(scores: Path, shortcut: tuple, explicit: tuple):
    short = one_json_object(ctd("validate", "--scores", scores, *shortcut, *FAST_VALIDATE, "--json"))
    long = one_json_object(ctd("validate", "--scores", scores, *explicit, *FAST_VALIDATE, "--json"))
    assert short == long


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--budget", 0.3, "--accuracy", 0.8, "--mode", "budget"), ("--mode", "--budget")),
        (("--accuracy", 0.8, "--alpha", 0.2), ("--alpha", "--accuracy")),
        (("--fnr", 0.2, "--alpha", 0.2), ("--alpha", "--fnr")),
        (("--budget", 0.3, "--accuracy", 1.5), ("--accuracy",)),
        (("--budget", 0.0, "--accuracy", 0.8), ("--budget",)),
    ],
)
def test_bad_joint_options_are_one_line(scores: Path, tmp_path: Path, args: tuple, fragments: tuple):
    out = tmp_path / "trials.csv"
    result = ctd("validate", "--scores", scores, *args, *FAST_VALIDATE, "--out", out)
    assert_clean_error(result, *fragments, unwritten=(out,))
