"""Tables too small for any certified threshold: a clean error naming the calibration set's
size and the size the level needs."""

from __future__ import annotations

from pathlib import Path

from cli_checks import (
    assert_clean_error,
    bad_input_commands,
    ctd,
)

from harness import simulate_scores, write_table


def test_too_few_test_rows_per_seed(tmp_path: Path):
    path = write_table(tmp_path / "small.parquet", simulate_scores("strong", 20, 2, random_state=2))
    commands = bad_input_commands(tmp_path, path)
    # 20 test rows: D_cal holds 7, while --budgets 0.2 needs 11 (0.8^11 <= 0.1); 7 rows certify
    # levels from 1 - 0.1^(1/7) = 0.2803 on, which the error names.
    args, unwritten = commands["calibrate"]
    assert_clean_error(
        ctd(*args),
        str(path),
        "20 test rows",
        "D_cal holds 7",
        "11",
        "7 rows certify levels of 0.281 or more",
        unwritten=unwritten,
    )
    # The default budgets start at 0.05, which needs 45.
    folder = tmp_path / "cal2"
    assert_clean_error(ctd("calibrate", "--scores", path, "--out", folder), "45", unwritten=(folder,))
    args, unwritten = commands["validate"]
    assert_clean_error(
        ctd(*args, "--alpha", 0.2), str(path), "D_cal holds 7", "--alpha 0.2", unwritten=unwritten
    )


def test_alpha_too_small_for_the_calibration_set(tmp_path: Path, scores: Path):
    out, folder = tmp_path / "trials.csv", tmp_path / "cal"
    # 400 test rows per seed: D_cal holds 140; alpha 0.01 needs 230 (0.99^230 <= 0.1).
    assert_clean_error(
        ctd("validate", "--scores", scores, "--alpha", 0.01, "--out", out),
        str(scores),
        "D_cal holds 140",
        "230",
        unwritten=(out,),
    )
    assert_clean_error(
        ctd("calibrate", "--scores", scores, "--out", folder, "--budgets", "0.01,0.5"),
        str(scores),
        "--budgets 0.01",
        unwritten=(folder,),
    )
