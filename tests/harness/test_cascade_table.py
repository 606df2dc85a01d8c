"""A K-stage cascade's scores table: the later stages' columns (expert_k, dv_k), simulated, written,
read back and checked, with the first stage's columns unchanged by them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import calibrate
from harness import InputError, read_scores, simulate_scores, write_scores
from harness.data import scores_from_columns, stage_columns, write_table
from tests.ctd_cli import run_ctd


@pytest.mark.parametrize("scenario", ["strong", "weak"])
def test_later_stages_leave_the_first_stages_columns_as_they_were(scenario: str) -> None:
    one = simulate_scores(scenario, 300, 2)
    three = simulate_scores(scenario, 300, 2, stages=3)
    assert set(three) == set(one) | {"expert_2", "dv_2", "expert_3", "dv_3"}
    for name, values in one.items():
        np.testing.assert_array_equal(three[name], values, err_msg=name)


def test_each_later_expert_is_better_and_its_dv_score_tracks_its_value() -> None:
    cascade = scores_from_columns(simulate_scores("strong", 4000, 1, stages=3)).cascade_scores()[0]
    errors = [float((calibrate.predict(s) != cascade.label).mean()) for s in cascade.stage_scores]
    assert errors == sorted(errors, reverse=True), errors
    for k in range(cascade.stages):
        value = (2 * cascade.label - 1) * (cascade.stage_scores[k + 1] - cascade.stage_scores[k])
        assert np.corrcoef(value, cascade.dv[k])[0, 1] > 0.1


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_cascade_table_round_trips(tmp_path: Path, suffix: str) -> None:
    columns = simulate_scores("weak", 200, 2, stages=2)
    table = read_scores(write_scores(tmp_path / f"t{suffix}", columns))
    assert table.stages == 2
    for name in ("expert", "dv", *stage_columns(2)):
        np.testing.assert_array_equal(table.columns()[name], columns[name])
    by_seed = table.cascade_scores()
    assert sorted(by_seed) == [0, 1] and by_seed[0].experts.shape == (2, 200)
    # A one-expert table read as a cascade is a cascade of one.
    single = read_scores(write_scores(tmp_path / f"s{suffix}", simulate_scores("weak", 200, 1)))
    assert single.stages == 1 and single.cascade_scores()[0].stages == 1


def test_a_missing_partner_column_is_one_line_naming_it(tmp_path: Path) -> None:
    columns = simulate_scores("strong", 50, 1, stages=3)
    del columns["dv_2"]
    path = tmp_path / "t.csv"
    write_table(path, columns)
    with pytest.raises(
        InputError, match=r"missing column 'dv_2' \(a cascade of 3 experts has expert_2, dv_2"
    ):
        read_scores(path)


def test_a_later_score_outside_the_unit_interval_names_its_row(tmp_path: Path) -> None:
    columns = simulate_scores("strong", 50, 1, stages=2)
    columns["expert_2"][7] = 1.5
    path = write_scores(tmp_path / "t.csv", columns)
    with pytest.raises(InputError, match=r"column 'expert_2', line 9: 1.5 is outside \[0, 1\]"):
        read_scores(path)


def test_ctd_simulate_writes_a_cascade_and_refuses_too_many_stages(tmp_path: Path) -> None:
    done = run_ctd(
        "simulate", "--scenario", "strong", "--stages", "2", "--n", "100", "--out", "c.csv", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "2 experts" in done.stdout
    assert read_scores(tmp_path / "c.csv").stages == 2
    refused = run_ctd("simulate", "--scenario", "strong", "--stages", "9", "--out", "d.csv", cwd=tmp_path)
    assert refused.returncode == 2 and "--stages" in refused.stderr
    assert not (tmp_path / "d.csv").exists()


def test_a_stage_numbered_below_two_is_one_line(tmp_path: Path) -> None:
    columns = simulate_scores("strong", 50, 1, stages=2)
    columns["expert_1"], columns["dv_1"] = columns.pop("expert_2"), columns.pop("dv_2")
    path = tmp_path / "t.parquet"
    write_table(path, columns)
    with pytest.raises(
        InputError, match=r"column 'expert_1': the first expert's columns are 'expert' and 'dv'"
    ):
        read_scores(path)
