"""`ctd validate --budget B1,B2 --accuracy A [--abstain H]` on a cascade of experts: the K-stage
joint guarantee validated on a table's expert_K and dv_K columns (or a run's cascade table), its
JSON record, table and per-trial table, and one line for each mistake."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_checks import assert_clean_error, assert_ok, ctd, one_json_object

from harness import read_table, simulate_scores, write_scores


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cascade")
    return write_scores(folder / "c.parquet", simulate_scores("strong", 3000, 1, n_dev=1, stages=2))


def test_the_record_names_each_risk_and_both_selectors(cascade: Path, tmp_path: Path) -> None:
    trials = tmp_path / "trials.parquet"
    record = one_json_object(
        ctd(
            "validate", "--scores", cascade, "--budget", "0.5,0.2", "--accuracy", 0.85, "--abstain", 0.1,
            "--trials", 40, "--cal-size", 600, "--out", trials, "--json",
        )
    )  # fmt: skip
    assert record["mode"] == "cascade" and record["trials"] == 40
    # 1 - 0.85 is 0.15000000000000002 in floats: the level is the decimal meant.
    assert record["levels"] == {"budget-1": 0.5, "budget-2": 0.2, "error": 0.15, "abstain": 0.1}
    for selector in ("ltt", "empirical"):
        assert set(record[selector]["population"]["risk_violations"]) == set(record["levels"])
        low, high = record[selector]["population"]["violation_ci95"]
        assert 0 <= low <= record[selector]["population"]["violation_rate"] <= high <= 1
    columns = {k: np.asarray(v) for k, v in read_table(trials).columns.items()}
    assert columns["ltt_selected"].size == 40
    violated = columns["ltt_population_violated"].astype(bool)
    assert violated.sum() == round(record["ltt"]["population"]["violation_rate"] * 40)


def test_the_table_reads_per_selector_and_measurement(cascade: Path) -> None:
    done = ctd("validate", "--scores", cascade, "--budget", "0.5,0.2", "--accuracy", 0.8, "--trials", 30)
    assert_ok(done)
    assert "cascade of 2 experts: budget-1 0.5, budget-2 0.2, error 0.2" in done.stdout
    assert "empirical" in done.stdout and "LTT's chosen configurations on the population" in done.stdout


def test_a_fresh_table_without_a_seed_is_one_line(tmp_path: Path) -> None:
    two_seeds = write_scores(tmp_path / "s2.parquet", simulate_scores("strong", 200, 2, stages=2))
    one_seed = write_scores(
        tmp_path / "f1.parquet", simulate_scores("strong", 200, 1, stages=2, random_state=1)
    )
    done = ctd("validate", "--scores", two_seeds, "--budget", "0.3,0.15", "--eval-scores", one_seed)
    assert_clean_error(done, "--eval-scores", "no test rows for probe seed 1")


def test_a_run_is_validated_on_its_cascade_table(cascade: Path, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "r" / "cascade"
    folder.mkdir(parents=True)
    (folder / "scores.parquet").write_bytes(cascade.read_bytes())
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs")}
    args = ("validate", "--run", "r", "--budget", "0.5,0.2", "--accuracy", 0.8, "--trials", 20, "--json")
    record = one_json_object(ctd(*args, env=env))
    assert record["scores"] == str(folder / "scores.parquet")
    missing = ctd("validate", "--run", "s", "--budget", "0.5,0.2", env=env)
    assert_clean_error(missing, "--run", "was the run's --expert a cascade")


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (("--budget", "0.5,0.2,0.1"), ("3 budget(s), one per expert", "a cascade of 2")),
        (("--budget", "0.5,0.2", "--fnr", "0.2"), ("takes --accuracy and --abstain, not --fnr",)),
        (("--budget", "0.5,1.2"), ("--budget",)),
        (("--accuracy", "0.8", "--abstain", "0.1"), ("--abstain: give the cascade's budgets too",)),
        (("--budget", "0.5,0.2", "--abstain", "1.5"), ("--abstain",)),
    ],
)
def test_mistakes_are_one_line(cascade: Path, extra: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    assert_clean_error(ctd("validate", "--scores", cascade, *extra), *fragments)
