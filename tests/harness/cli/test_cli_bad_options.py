"""Bad options and input paths for calibrate and validate: one clean error line, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import (
    FAST_CALIBRATE,
    FAST_VALIDATE,
    assert_clean_error,
    bad_input_commands,
    ctd,
)

from harness import SCORES_COLUMNS


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
@pytest.mark.parametrize("option", ["--alpha", "--delta"])
def test_validate_level_outside_unit_interval(tmp_path: Path, scores: Path, option: str, value: str):
    out = tmp_path / "trials.csv"
    result = ctd("validate", "--scores", scores, option, value, *FAST_VALIDATE, "--out", out)
    assert_clean_error(result, option, f"{float(value):g}", "outside (0, 1)", unwritten=(out,))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--delta", "0", "outside (0, 1)"),
        ("--delta", "1", "outside (0, 1)"),
        ("--delta", "1.5", "outside (0, 1)"),
        ("--delta", "-0.1", "outside (0, 1)"),
        ("--budgets", "0,0.5", "0 is outside (0, 1)"),
        ("--budgets", "0.2,1", "1 is outside (0, 1)"),
        ("--budgets", "1.5", "1.5 is outside (0, 1)"),
        ("--budgets", "-0.1,0.2", "-0.1 is outside (0, 1)"),
        ("--budgets", "0:0.5:3", "0 is outside (0, 1)"),
        ("--budgets", "abc", "expected numbers"),
        ("--budgets", ",", "item 1 is empty"),
        ("--budgets", " ", "no values"),
        ("--policies", "ctd,bogus", "'bogus'"),
        ("--policies", "CTD", "'CTD'"),
        ("--objectives", "auroc,f1", "'f1'"),
        ("--batch-sizes", "0", "positive integers"),
        ("--batch-sizes", "32,x", "expected integers"),
        ("--accuracy", "0", "0 is outside (0, 1)"),
        ("--accuracy", "1", "1 is outside (0, 1)"),
        ("--accuracy", "1.5", "1.5 is outside (0, 1)"),
        ("--accuracy", "-0.1", "-0.1 is outside (0, 1)"),
        ("--accuracy", "nan", "nan is outside (0, 1)"),
        # 140 D_cal rows of 400 x 0.5 x 0.7 cannot certify an error of 0.01 at delta 0.1 (needs 230).
        ("--accuracy", "0.99", "the error level 0.01"),
    ],
)
def test_calibrate_bad_option(tmp_path: Path, scores: Path, option: str, value: str, fragment: str):
    folder = tmp_path / "cal"
    args = {"--budgets": "0.2,0.5", "--batch-sizes": "32", "--policies": "ctd", option: value}
    flat = [item for pair in args.items() for item in pair]
    result = ctd("calibrate", "--scores", scores, "--out", folder, *flat)
    assert_clean_error(result, option, fragment, unwritten=(folder,))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_missing_file(tmp_path: Path, command: str):
    for name in ("nope.parquet", "nope.csv"):
        path = tmp_path / name
        args, unwritten = bad_input_commands(tmp_path, path)[command]
        assert_clean_error(ctd(*args), str(path), "no such file", unwritten=unwritten)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("garbage.parquet", bytes(range(256)) * 4, "not a readable Parquet file"),
        ("empty.parquet", b"", "not a readable Parquet file"),
        ("scores.csv.parquet", b"id,group\n1,2\n", "not a readable Parquet file"),
        ("empty.csv", b"", "empty file"),
        ("latin1.csv", "id,gr\xe9oupe\n".encode("latin-1"), "not UTF-8"),
        ("header-only.csv", (",".join(SCORES_COLUMNS) + "\n").encode(), "no rows"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_unreadable_file(tmp_path: Path, command: str, name: str, content: bytes, fragment: str):
    path = tmp_path / name
    path.write_bytes(content)
    args, unwritten = bad_input_commands(tmp_path, path)[command]
    assert_clean_error(ctd(*args), str(path), fragment, unwritten=unwritten)
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_folder_given_as_scores(tmp_path: Path):
    folder = tmp_path / "a-folder.parquet"
    folder.mkdir()
    args, unwritten = bad_input_commands(tmp_path, folder)["validate"]
    assert_clean_error(ctd(*args), str(folder), "folder", unwritten=unwritten)


def test_scores_and_run_are_exclusive(tmp_path: Path, scores: Path):
    out = tmp_path / "trials.csv"
    assert_clean_error(ctd("validate", "--out", out), "--scores", "--run", unwritten=(out,))
    assert_clean_error(
        ctd("validate", "--scores", scores, "--run", "x", "--out", out), "--scores", "--run", unwritten=(out,)
    )


def test_calibrate_needs_an_output_folder(scores: Path):
    assert_clean_error(ctd("calibrate", "--scores", scores, *FAST_CALIBRATE), "--out")
