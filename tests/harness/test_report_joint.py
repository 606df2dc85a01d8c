"""The report's "Joint control" subsection: a run whose validate stage wrote the joint job gets
its table (every joint level, LTT and the empirical selector, rates as the records hold them) and
the budget-accuracy plane figure; a run from before the job renders without either."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import harness
from calibrate import SweepConfig, ValidationConfig
from harness import calibrate_scores
from harness.report import build_report
from harness.run import JOBS, JOINT_JOB, read_joint_job

# Private: the validation jobs run one by one, as the validate stage runs them.
from harness.stages._validate import run_job
from harness.stages._validate_joint import run_joint_job

ARCH = "simulated"
ERRORS = (0.15, 0.25, 0.35)
FIGURE = f"figures/{ARCH}/validation-joint.png"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run with every validation job, the joint one included, and its copy without the joint
    job's files (a run from before it); both reported."""
    run = tmp_path_factory.mktemp("runs") / "joint"
    run.mkdir()
    harness.simulate("strong", 400, 2, run / "scores.parquet")
    calibrate_scores(run / "scores.parquet", run / "calibrate" / ARCH, SweepConfig(budgets=(0.3,)), arch=ARCH)
    folder = run / "validate" / ARCH
    folder.mkdir(parents=True)
    config = ValidationConfig(trials=30)
    for job in JOBS:
        alphas = (0.3,) if job.mode == "budget" else ERRORS
        run_job(
            run / "scores.parquet", folder, job, arch=ARCH, alphas=alphas, headline_alpha=None, config=config
        )
    run_joint_job(
        run / "scores.parquet",
        folder,
        arch=ARCH,
        budget=0.3,
        errors=ERRORS,
        headline_error=None,
        config=config,
    )
    old = run.parent / "before-joint"
    shutil.copytree(run, old)
    for path in (old / "validate" / ARCH).glob(f"{JOINT_JOB}.*"):
        path.unlink()
    for folder in (run, old):
        build_report(folder)
    return {"joint": run, "old": old}


def test_the_subsection_shows_every_joint_level_from_its_record(runs: dict[str, Path]) -> None:
    run = runs["joint"]
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "#### Joint control" in report
    assert report.index("## Guarantee validation") < report.index("#### Joint control")
    record = read_joint_job(run / "validate" / ARCH)
    assert record is not None and len(record.levels) == len(ERRORS)
    numbers = json.loads((run / "report" / "numbers.json").read_text(encoding="utf-8"))
    joint = numbers["archs"][ARCH]["validation"]["joint"]
    assert joint["headline"] == record.headline
    for level, shown in zip(record.levels, joint["levels"], strict=True):
        assert shown["levels"] == level["levels"]
        population = level["population"]
        assert shown["LTT"]["population"]["violation_rate"] == population["violation_rate"]
        assert [shown["LTT"]["population"][k] for k in ("ci_low", "ci_high")] == population["violation_ci95"]
        assert (
            shown["empirical"]["population"]["selection_rate"]
            == level["empirical"]["population"]["selection_rate"]
        )
        # One table row per level: budget, error, then each selector's population rate with its bound.
        high = 100 * population["violation_ci95"][1]
        row = f"| {level['levels']['budget']:g} | {level['levels']['error']:g} | "
        assert any(line.startswith(row) and f"{high:.1f}%]" in line for line in report.splitlines()), row
    with (run / "report" / "tables" / ARCH / "validation-joint.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(ERRORS) * 2 * 2  # levels x selectors x measurements


def test_the_figure_is_a_png_with_its_caption(runs: dict[str, Path]) -> None:
    run = runs["joint"]
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    path = run / "report" / FIGURE
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert f"({FIGURE})" in report and f"(`{FIGURE}`)" in report
    assert "budget-accuracy plane" in report


def test_a_run_without_the_joint_job_renders_without_it(runs: dict[str, Path]) -> None:
    old = runs["old"]
    report = (old / "report" / "report.md").read_text(encoding="utf-8")
    assert "## Guarantee validation" in report and "validation-levels.png" in report
    assert "Joint control" not in report and "joint" not in report.lower().split("## guarantee validation")[1]
    assert not (old / "report" / FIGURE).exists()
    assert not (old / "report" / "tables" / ARCH / "validation-joint.csv").exists()
    numbers = json.loads((old / "report" / "numbers.json").read_text(encoding="utf-8"))
    assert "joint" not in numbers["archs"][ARCH]["validation"]
    assert not any("joint" in m for m in numbers.get("missing", []))


def test_the_plane_plots_each_returned_policy(runs: dict[str, Path]) -> None:
    """The figure's points are the per-trial table's: one per trial that returned a policy."""
    record = read_joint_job(runs["joint"] / "validate" / ARCH)
    assert record is not None
    trials = record.trials_at(record.headline)
    assert trials is not None and trials["selected"].size == 30
    assert np.all(trials["budget_level"] == record.headline["budget"])
