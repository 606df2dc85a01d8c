"""Scores tables at the edges, through the real `ctd`: seeds of any sign, a duplicate CSV
header, a byte-order mark, out paths of the wrong kind, several probe configurations in one
table, and the counts and conditional rates a validation reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd

import calibrate
from harness import read_scores, simulate_scores, write_table


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
    # The table a command reads, as its --out: refused before it is replaced by what is written.
    before = table_path.read_bytes()
    assert_one_line_error(
        run_ctd("validate", "--scores", str(table_path), "--trials", "5", "--out", "s.parquet", cwd=tmp_path),
        "--out s.parquet: is the --scores file",
    )
    assert table_path.read_bytes() == before


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
    config = calibrate.ValidationConfig(delta=0.1, trials=60, fwer="holm")
    result = calibrate.validate(table.test_scores(), mode="performance", alpha=0.25, config=config)
    record = result.to_dict()
    assert record["fwer"] == "holm" and record["merge"] == "overwrite"
    assert record["violations"] == int(result.per_trial["violated"].sum())
    assert record["selections"] == int(result.per_trial["selected"].sum())
    if record["selections"]:
        assert record["conditional_violation_rate"] == record["violations"] / record["selections"]
