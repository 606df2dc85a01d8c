"""`--run NAME`: calibrate and validate read the run's scores and write into its folder; an
unknown run or one without scores is a clean error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_checks import (
    CALIBRATE_FILES,
    FAST_CALIBRATE,
    FAST_VALIDATE,
    assert_clean_error,
    check_summary,
    ctd,
    one_json_object,
    read_csv,
)

from harness.report import read_sweep
from harness.run import RunLayout, RunLog, StageStatus


@pytest.fixture
def runs_root(tmp_path: Path, scores: Path, monkeypatch) -> Path:
    root = tmp_path / "runs"
    (root / "exp1").mkdir(parents=True)
    shutil.copy(scores, root / "exp1" / "scores.parquet")
    monkeypatch.setenv("CTD_RUNS_DIR", str(root))
    return root


def test_calibrate_run_writes_the_sweep_its_report_reads(runs_root: Path):
    """calibrate/ARCH/ (not calibrate/, where `ctd report` never looked), and with --merge RULE
    calibrate/ARCH/merge-RULE/ beside it, as the report's merge-control section asks."""
    summary = one_json_object(ctd("calibrate", "--run", "exp1", *FAST_CALIBRATE, "--json"))
    folder = RunLayout(runs_root / "exp1").sweep(summary["arch"]).root
    assert folder.parent == runs_root / "exp1" / "calibrate"
    assert Path(summary["out"]) == folder
    assert Path(summary["scores"]) == runs_root / "exp1" / "scores.parquet"
    assert sorted(p.name for p in folder.iterdir()) == CALIBRATE_FILES  # no staging folder left
    assert len(read_csv(folder / "sweep.csv")) == summary["rows"] == 16
    assert read_sweep(folder).config.budgets == (0.2, 0.5)  # what the report reads

    merged = one_json_object(
        ctd("calibrate", "--run", "exp1", *FAST_CALIBRATE, "--merge", "average", "--json")
    )
    assert Path(merged["out"]) == folder / "merge-average"
    assert {row["merge"] for row in read_csv(folder / "merge-average" / "sweep.csv")} == {"average"}
    assert len(read_csv(folder / "sweep.csv")) == 16  # the default sweep beside it is untouched


def test_calibrate_run_leaves_a_sweep_made_by_ctd_eval_to_ctd_eval(runs_root: Path):
    """Its record and the later stages follow the run's settings, and its next run would replace a
    sweep written here: one line naming the way, nothing written."""
    log = RunLog()
    log.started({})
    log.record("calibrate", StageStatus.RAN, 1.0, "")
    log.write(RunLayout(runs_root / "exp1").run_log)
    assert_clean_error(
        ctd("calibrate", "--run", "exp1", *FAST_CALIBRATE),
        "--run exp1",
        "ctd eval --config",
        "--out",
        unwritten=(runs_root / "exp1" / "calibrate",),
    )
    one_json_object(ctd("calibrate", "--run", "exp1", "--out", runs_root / "mine", *FAST_CALIBRATE, "--json"))


def test_calibrate_run_with_an_unknown_arch_writes_nothing(runs_root: Path):
    assert_clean_error(
        ctd("calibrate", "--run", "exp1", "--arch", "nope", *FAST_CALIBRATE),
        "--arch nope",
        unwritten=(runs_root / "exp1" / "calibrate",),
    )


def test_calibrate_run_with_explicit_out(runs_root: Path, tmp_path: Path):
    out = tmp_path / "elsewhere"
    one_json_object(ctd("calibrate", "--run", "exp1", "--out", out, *FAST_CALIBRATE, "--json"))
    assert (out / "sweep.csv").is_file()
    assert not (runs_root / "exp1" / "calibrate").exists()


def test_validate_run(runs_root: Path):
    record = one_json_object(ctd("validate", "--run", "exp1", *FAST_VALIDATE, "--json"))
    assert Path(record["scores"]) == runs_root / "exp1" / "scores.parquet"
    check_summary(record, 20)


def test_unknown_run_is_a_clean_error(runs_root: Path, tmp_path: Path):
    message = assert_clean_error(
        ctd("calibrate", "--run", "nope", *FAST_CALIBRATE), "nope", unwritten=(runs_root / "nope",)
    )
    assert str(runs_root / "nope") in message
    out = tmp_path / "trials.csv"
    assert_clean_error(ctd("validate", "--run", "nope", "--out", out), "--run nope", unwritten=(out,))


def test_run_without_scores_is_a_clean_error(runs_root: Path):
    (runs_root / "empty").mkdir()
    message = assert_clean_error(
        ctd("calibrate", "--run", "empty", *FAST_CALIBRATE),
        unwritten=(runs_root / "empty" / "calibrate",),
    )
    assert str(runs_root / "empty" / "scores.parquet") in message
