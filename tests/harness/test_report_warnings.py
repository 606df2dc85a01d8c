"""The report flags what is vacuous: a degenerate expert or probe (one class for more than 95% of
a split, or scores in a narrow range) in report.md, numbers.json and on the terminal; and the
summary says in words when a violation rate cannot show anything. Runs built here with the real
library (simulate, calibrate_scores, run_job) and reported with the real `build_report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import run_ctd

from calibrate import SweepConfig, ValidationConfig
from harness import calibrate_scores, simulate_scores, write_scores
from harness.data import scores_from_columns
from harness.report import build_report, read_warnings

# Private: the checks behind the report's warnings and notes, and one validation job.
from harness.report._checks import NARROW_SPREAD, ONE_CLASS_SHARE, check_scores
from harness.report._data import read_sweep
from harness.report._summary import batch_notes
from harness.run import JOBS

# Private: one validation job, run on its own.
from harness.stages._validate import run_job

ARCH = "simulated"
N = 400


def _run(
    folder: Path,
    columns: dict[str, np.ndarray],
    *,
    performance_alpha: float | None = None,
    batch_sizes: tuple[int, ...] = (32,),
) -> Path:
    """A run folder with the scores table, a default sweep and (optionally) performance control
    validated at one level; then the report."""
    folder.mkdir(parents=True)
    write_scores(folder / "scores.parquet", columns)
    config = SweepConfig(budgets=(0.1, 0.2, 0.3), batch_sizes=batch_sizes)
    calibrate_scores(folder / "scores.parquet", folder / "calibrate" / ARCH, config, arch=ARCH)
    if performance_alpha is not None:
        (folder / "validate" / ARCH).mkdir(parents=True)
        run_job(
            folder / "scores.parquet",
            folder / "validate" / ARCH,
            next(j for j in JOBS if j.mode == "performance"),
            arch=ARCH,
            alphas=(performance_alpha,),
            headline_alpha=performance_alpha,
            config=ValidationConfig(trials=20),
        )
    build_report(folder)
    return folder


def _columns(**replace: np.ndarray) -> dict[str, np.ndarray]:
    columns = simulate_scores("strong", N, 1)
    columns["arch"] = np.full(columns["label"].size, ARCH)
    return columns | replace


def _numbers(run: Path) -> dict:
    return json.loads((run / "report" / "numbers.json").read_text(encoding="utf-8"))


def test_an_expert_that_calls_everything_high_stakes_is_flagged(tmp_path: Path) -> None:
    """The embedded expert with the stakes-v1 prompt: P(high-stakes) >= 0.75 on every answer. Its
    scores still spread (5-95% range about 0.22), so the warning says its AUROC measures a ranking."""
    size = _columns()["label"].size
    stuck = 0.75 + 0.25 * np.random.default_rng(1).random(size)
    run = _run(tmp_path / "stuck", _columns(expert=stuck))
    warnings = read_warnings(run)
    expert = [w for w in warnings if w.startswith("expert on the test split")]
    assert len(expert) == 1 and "predicts high-stakes for 100.0% of the examples" in expert[0]
    assert "more than 95.0% in one class" in expert[0]
    assert "its AUROC measures a ranking, not a classifier" in expert[0]
    assert "do not measure a working classifier" not in expert[0]
    assert any(w.startswith("expert on the dev split") for w in warnings)
    assert not any(w.startswith("probe") for w in warnings)  # the simulated probe is fine
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert f"> **Warning**: {expert[0]}." in report
    # The summary first, pointing at the warnings below it.
    assert report.index("## Summary") < report.index("## Degenerate scores")
    assert "> 2 warnings about degenerate scores: see *Degenerate scores* below." in report
    checks = _numbers(run)["score_checks"]["checks"]
    assert checks[0]["scorer"] == "expert" and checks[0]["one_class"] is True


def test_a_spread_expert_and_probe_are_not_flagged(tmp_path: Path) -> None:
    run = _run(tmp_path / "spread", _columns())
    assert read_warnings(run) == []
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "No scorer predicts one class for more than 95.0% of a split" in report


def test_narrow_scores_are_flagged_even_when_both_classes_are_predicted(tmp_path: Path) -> None:
    """A probe with scores in [0.46, 0.54): both sides of 0.5, yet they barely vary."""
    size = _columns()["label"].size
    narrow = 0.46 + 0.08 * np.random.default_rng(2).random(size)
    run = _run(tmp_path / "narrow", _columns(probe=narrow))
    probe = [w for w in read_warnings(run) if w.startswith(f"probe {ARCH}, seed 0 on the test split")]
    assert len(probe) == 1 and "5-95% range 0.07" in probe[0] and f"below {NARROW_SPREAD:g}" in probe[0]


@pytest.mark.parametrize(("high", "flagged"), [(95, False), (96, True), (4, True), (5, False)])
def test_one_class_means_more_than_the_share(high: int, flagged: bool) -> None:
    """Exactly 95 of 100 on one side is not flagged; 96 is, on either side."""
    expert = np.r_[np.linspace(0.5, 1, high), np.linspace(0, 0.49, 100 - high)]
    columns = {
        "id": np.array([f"x{i}" for i in range(100)]),
        "group": np.full(100, "g"),
        "split": np.full(100, "test"),
        "label": np.arange(100) % 2,
        "probe": np.linspace(0, 1, 100),
        "expert": expert,
        "dv": np.zeros(100),
        "seed": np.zeros(100, dtype=np.int64),
        "arch": np.full(100, ARCH),
    }
    (check,) = [c for c in check_scores(scores_from_columns(columns)) if c.scorer == "expert"]
    assert ONE_CLASS_SHARE == 0.95
    assert check.one_class is flagged
    assert not check.narrow  # spread over [0, 1]


def test_ctd_returning_no_policy_is_said_in_words(tmp_path: Path) -> None:
    """A probe and an expert right only about 60% of the time: performance control at alpha 0.1
    (accuracy 0.9) certifies nothing, so CTD's 0% violation rate shows nothing."""
    base = _columns()
    rng = np.random.default_rng(3)
    noisy = np.where(rng.random(base["label"].size) < 0.6, base["label"], 1 - base["label"])
    weak = np.clip(0.3 + 0.4 * noisy + 0.05 * rng.normal(size=noisy.size), 0, 1)
    run = _run(tmp_path / "weak", _columns(probe=weak, expert=weak[::-1].copy()), performance_alpha=0.1)
    summary = _numbers(run)["archs"][ARCH]["summary"]["performance"]
    assert summary["ctd"]["selection_rate"] == 0 and summary["rule"] == "given"
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "**What these rates cannot show**" in report
    assert "CTD returned no policy in any trial for accuracy 0.90 (alpha = 0.1)" in report
    assert "performance control at alpha = 0.1 (accuracy >= 0.90, delta = 10%), the level given" in report
    assert "| returned a policy | 0.0% |" in report


def test_never_delegating_selectors_are_said_in_words(tmp_path: Path) -> None:
    """A probe that is always right: at alpha 0.3 both selectors keep "never delegate", so the
    contrast between them cannot show."""
    label = _columns()["label"]
    perfect = np.where(label == 1, 0.9, 0.1)
    run = _run(tmp_path / "perfect", _columns(probe=perfect), performance_alpha=0.3)
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert 'both selectors return "never delegate" in every trial for accuracy 0.70 (alpha = 0.3)' in report
    assert "CTD returned no policy" not in report


def test_ctd_report_prints_the_warnings_on_the_terminal(tmp_path: Path) -> None:
    size = _columns()["label"].size
    run = _run(tmp_path / "runs" / "stuck", _columns(expert=np.full(size, 0.8)))
    env = {"CTD_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    result = run_ctd("report", "stuck", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    # The summary as the report shows it: a row per metric, a column per budget of the run.
    header = next(line for line in result.stdout.splitlines() if "metric" in line)
    assert [cell.strip() for cell in header.strip("┃│ ").split("┃")][1:] == ["0.1", "0.2", "0.3"]
    for metric in ("CTD AUROC", "Unc. top-k AUROC", "Unc. calibrated AUROC", "CTD - probe AUROC"):
        (line,) = [row for row in result.stdout.splitlines() if row.strip().startswith(f"{metric} ")]
        assert len(re.findall(r"[+-]?0\.\d{3}", line)) >= 3, line
    expert = "warning: expert on the test split"
    lines = [line for line in result.stderr.splitlines() if line.startswith(expert)]
    assert len(lines) == 2  # all 0.8: one class, and a 5-95% range of 0
    assert "predicts high-stakes for 100.0%" in lines[0] and "narrow range" in lines[1]
    assert "do not measure a working classifier" in lines[0]  # one class and no spread: nothing to rank
    assert (run / "report" / "report.md").is_file()


def test_a_target_the_probe_alone_meets_is_said_in_words(tmp_path: Path) -> None:
    """The simulated probe errs on about 30% of the test split: at alpha 0.35 neither selector can
    miss (the probe alone meets it), which the report says; at alpha 0.28 the contrast shows (the
    empirical selector violates, CTD does not) and nothing is said."""
    easy = _run(tmp_path / "easy", _columns(), performance_alpha=0.35)
    said = _numbers(easy)["archs"][ARCH]["cannot_show"]
    assert len(said) == 1 and "neither selector violated accuracy 0.65 (alpha = 0.35)" in said[0]
    assert "because the probe alone (accuracy" in said[0] and "never delegate" not in said[0]
    hard = _run(tmp_path / "hard", _columns(), performance_alpha=0.28)
    numbers = _numbers(hard)["archs"][ARCH]
    assert numbers["summary"]["performance"]["empirical"]["violation_rate"] > 0
    assert numbers["cannot_show"] == []


def test_the_summary_says_where_a_batch_or_a_seed_is_not_what_its_label_says(tmp_path: Path) -> None:
    """The default run's B = 128 was one batch of its 120 evaluation rows, labelled B = 128; a
    budget whose top-k quota rounds to 0 delegated nothing; a seed with one class in its
    evaluation half was left out of the AUROC means under a title counting it."""
    run = _run(tmp_path / "batches", _columns(), batch_sizes=(2, 32, 4096))
    sweep = read_sweep(run / "calibrate" / ARCH)
    n_eval = int(sweep.baselines["n_eval"].min())
    assert n_eval < 4096
    notes = batch_notes(sweep)
    too_big = (
        f"B = 4096 is more than the {n_eval} evaluation rows of a seed: its top-k policies ran on one "
        f"batch of {n_eval} there, not on batches of 4096."
    )
    # round(0.2 x 2) = 0 and round(0.3 x 2) = 1: top-k at B = 2 skips budgets 0.1 and 0.2.
    no_call = (
        "At B = 2 the top-k quota (budget x B, rounded) is 0 for budget 0.2 and below: top-k "
        "delegates nothing there."
    )
    assert notes == [no_call, too_big]
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "**What the batches and seeds hold**" in report and f"- **{ARCH}**: {too_big}" in report
    sweep.baselines["probe_auroc"][0] = np.nan  # as the sweep records a one-class evaluation half
    assert batch_notes(sweep)[-1] == (
        "Seed 0: the evaluation half holds one class, so AUROC is undefined there; the AUROC means "
        "are over the other 0 of 1 seeds (accuracy is over all)."
    )
    assert batch_notes(read_sweep(_run(tmp_path / "plain", _columns()) / "calibrate" / ARCH)) == []
