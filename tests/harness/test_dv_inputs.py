"""`ctd dv`'s inputs: the expert scores tables `ctd query` writes, read as the user has them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd

from harness import InputError, write_table
from harness.stages import read_expert_scores


def test_an_empty_expert_cell_is_a_failed_expert(tmp_path: Path) -> None:
    # `ctd query` writes NaN (the expert failed on the row) as an empty CSV cell
    table = write_table(tmp_path / "q.csv", {"id": np.array(["a", "b"]), "expert": np.array([0.25, np.nan])})
    assert "a,0.25" in table.read_text() and "b,\n" in table.read_text().replace("\r\n", "\n")
    scores = read_expert_scores([table])
    assert scores["a"] == 0.25 and math.isnan(scores["b"])


def test_a_non_number_expert_cell_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "q.csv").write_text("id,expert\na,0.5\nb,high\n")
    result = run_ctd(
        "dv", "--probe-dir", "probe", "--expert-scores", "q.csv", "--out", "dv.csv", cwd=tmp_path
    )
    assert_one_line_error(result, "q.csv", "line 3", "'high'", "not a number")
    assert not (tmp_path / "dv.csv").exists()


def test_integer_ids_scored_differently_in_two_tables_are_refused(tmp_path: Path) -> None:
    first = write_table(tmp_path / "a.parquet", {"id": np.array([5, 6]), "expert": np.array([0.1, 0.2])})
    second = write_table(tmp_path / "b.parquet", {"id": np.array([5, 6]), "expert": np.array([0.1, 0.9])})
    with pytest.raises(InputError, match=r"b\.parquet: row 2: id '6' has two different expert scores"):
        read_expert_scores([first, second])
