"""The report's "Cascade of experts" section: a run folder with a cascade table and the validate
stage's cascade records, built here from simulated tables (no expert server), reported; and a
run without a cascade, whose report is the same bytes as before but for that section."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import harness
from calibrate import SweepConfig
from harness import calibrate_scores, read_table, simulate_scores, write_scores
from harness.report import build_report
from harness.run import RunConfig, RunLayout

# Private: the validate stage's cascade job, run here without the stage around it.
from harness.stages._cascade_validate import run_cascade_validation

ARCH = "simulated"
TRIALS = 40
CONFIG = RunConfig(expert="small", cascade=("large",), trials=TRIALS, budget_alpha=0.3)
SECTION = "## Cascade of experts"


def _run(parent: Path, *, cascade: bool, validated: bool = True) -> Path:
    run = parent / "run"
    run.mkdir(parents=True)
    harness.simulate("strong", 400, 2, run / "scores.parquet")
    config = SweepConfig(budgets=(0.2, 0.3), batch_sizes=(32,), policies=("ctd", "dv-topk"))
    calibrate_scores(run / "scores.parquet", RunLayout(run).sweep(ARCH).root, config, arch=ARCH)
    if cascade:
        layout = RunLayout(run)
        layout.cascade.root.mkdir()
        write_scores(layout.cascade.scores, simulate_scores("strong", 400, 2, stages=2))
        if validated:
            run_cascade_validation(layout, CONFIG)
    build_report(run)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same run with and without a cascade (same folder name: the title names it)."""
    return (
        _run(tmp_path_factory.mktemp("with"), cascade=True),
        _run(tmp_path_factory.mktemp("without"), cascade=False),
    )


def _without_section(text: str) -> str:
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(SECTION))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return "".join(lines[:start] + lines[end:])


def test_the_section_names_the_stages_and_agrees_with_the_record(runs: tuple[Path, Path]) -> None:
    run, _ = runs
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert SECTION in report and "expert 1: small, expert 2: large" in report
    assert "budget-1 0.3, budget-2 0.3" in report
    record = json.loads((RunLayout(run).cascade_validation.record(ARCH)).read_text(encoding="utf-8"))
    assert record["trials"] == TRIALS and record["levels"] == {"budget-1": 0.3, "budget-2": 0.3}
    trials = {
        k: np.asarray(v)
        for k, v in read_table(RunLayout(run).cascade_validation.trials(ARCH)).columns.items()
    }
    rate = record["ltt"]["population"]["violation_rate"]
    assert rate == trials["ltt_population_violated"].astype(bool).mean()
    (row,) = [line for line in report.splitlines() if line.startswith("| LTT | population |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith(f"{100 * rate:.1f}%")
    chosen = trials["ltt_selected"].astype(bool)
    assert cells[5] == f"{100 * trials['ltt_population_calls_1'][chosen].mean():.1f}%"
    figure = run / "report" / "figures" / ARCH / "cascade-experts.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"(`figures/{ARCH}/cascade-experts.png`)" in report
    numbers = json.loads((run / "report" / "numbers.json").read_text(encoding="utf-8"))
    assert numbers["archs"][ARCH]["cascade_experts"]["experts"] == ["small", "large"]


def test_a_run_without_a_cascade_reports_as_before(runs: tuple[Path, Path]) -> None:
    with_cascade, without = runs
    plain = (without / "report" / "report.md").read_text(encoding="utf-8")
    assert SECTION not in plain
    assert _without_section((with_cascade / "report" / "report.md").read_text(encoding="utf-8")) == plain
    numbers = json.loads((without / "report" / "numbers.json").read_text(encoding="utf-8"))
    assert "cascade_experts" not in numbers["archs"][ARCH]
    assert not (without / "report" / "figures" / ARCH / "cascade-experts.png").exists()


def test_a_cascade_without_its_validation_is_said_missing(tmp_path: Path) -> None:
    run = _run(tmp_path, cascade=True, validated=False)
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert SECTION in report and "validate/cascade/simulated.json: no such file" in report
    shutil.rmtree(run)


def test_the_uncertainty_cascade_is_reported_beside_ctd(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """The validate stage's job validates the uncertainty cascade too (its own folder, the same
    trials); its rows follow CTD's and agree with its record. A run validated before it did, with
    no such folder, reports CTD alone and says nothing of it."""
    run, _ = runs
    files = RunLayout(run).cascade_policy_validation("uncertainty")
    record = json.loads(files.record(ARCH).read_text(encoding="utf-8"))
    assert record["policy"] == "uncertainty" and record["trials"] == TRIALS
    ctd = json.loads(RunLayout(run).cascade_validation.record(ARCH).read_text(encoding="utf-8"))
    assert "policy" not in ctd and ctd["levels"] == record["levels"]
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    rows = [line for line in report.splitlines() if line.startswith("| LTT")]
    assert [row.split("|")[1].strip() for row in rows] == ["LTT", "LTT, uncertainty"]
    cells = [c.strip() for c in rows[1].strip("|").split("|")]
    assert cells[2].startswith(f"{100 * record['ltt']['population']['violation_rate']:.1f}%")
    trials = {k: np.asarray(v) for k, v in read_table(files.trials(ARCH)).columns.items()}
    chosen = trials["ltt_selected"].astype(bool)
    assert cells[6] == f"{100 * trials['ltt_population_calls_2'][chosen].mean():.1f}%"
    numbers = json.loads((run / "report" / "numbers.json").read_text(encoding="utf-8"))
    assert numbers["archs"][ARCH]["cascade_experts_uncertainty"]["policy"] == "uncertainty"

    before = tmp_path / "run"
    shutil.copytree(run, before)
    shutil.rmtree(RunLayout(before).cascade_policy_validation("uncertainty").root)
    shutil.rmtree(before / "report")
    build_report(before)
    plain = (before / "report" / "report.md").read_text(encoding="utf-8")
    assert SECTION in plain and "uncertainty" not in plain[plain.index(SECTION) :].split("\n## ")[0]
    assert [line for line in plain.splitlines() if line.startswith("| LTT")] == rows[:1]
