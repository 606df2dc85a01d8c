"""`build_report`: a run folder built here with the library (simulate, calibrate_scores,
validate_scores) in, report/ out: valid PNGs, captions, tables that agree with the sweep and
with an independent recomputation, graceful gaps, clean errors and atomic, deterministic output;
and a report that reads the stages' files without re-running a sweep or a validation."""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import calibrate

# Private: the recomputation steps.
import calibrate._splits as calibrate_splits
import harness
import harness.report

# Private: figures checked one by one; the build step and the figure pool an interrupt meets.
import harness.report._build
import harness.report._figures
from calibrate import SweepConfig, ValidationConfig
from harness import InputError, calibrate_scores, read_scores, simulate_scores, write_scores

# Private: the summary as `ctd eval` reads it back.
from harness._eval import read_summary
from harness._workers import WorkerPool
from harness.report import (
    build_report,
    figure_workers,
    summary_tables,
)

# Private: the report's tables.
from harness.report._data import Sweep, read_sweep
from harness.report._dv_data import MEAN_V_FRACTIONS
from harness.report._sections import MEAN_V_TABLE_FRACTIONS
from harness.report._summary import MAX_BUDGETS, SUMMARY_BUDGETS, summary_budgets
from harness.run import JOBS, MIN_SELECTION, read_job

# Private: the report's tables, read and recomputed; the validation jobs run one by one.
from harness.stages._validate import run_job

ARCH = "simulated"
BUDGETS = (0.1, 0.2, 0.3, 0.5, 0.8)
BATCH_SIZES = (32, 64)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FULL_FIGURES = (
    "cascade-auroc",
    "cascade-accuracy",
    "realised",
    "validation-levels",
    "validation-budget",
    "validation-performance",
    "mean-v-at-k",
    "dv-topk",
    "merge-overwrite-auroc",
    "merge-overwrite-accuracy",
    "merge-average-auroc",
    "merge-average-accuracy",
)
LEVELS = {"budget": BUDGETS, "performance": (0.1, 0.2, 0.3)}
TRIALS = 50
# Performance control's headline level is left to the validate stage (the smallest certifiable),
# as in a default `ctd eval`.
HEADLINE = {"budget": 0.3, "performance": None}


def _calibrate(run: Path, arch: str, merges: tuple[str, ...]) -> None:
    for merge in merges:
        folder = run / "calibrate" / arch / ("" if merge == "default" else f"merge-{merge}")
        config = SweepConfig(budgets=BUDGETS, batch_sizes=BATCH_SIZES, merge=merge)
        calibrate_scores(run / "scores.parquet", folder, config, arch=arch)


def _validate(run: Path, arch: str) -> None:
    folder = run / "validate" / arch
    folder.mkdir(parents=True, exist_ok=True)
    for job in JOBS:
        run_job(
            run / "scores.parquet",
            folder,
            job,
            arch=arch,
            alphas=LEVELS[job.mode],
            headline_alpha=HEADLINE[job.mode],
            config=ValidationConfig(trials=TRIALS),
        )


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Every input the report reads, one arch, 2 seeds; built once, reported once."""
    run = tmp_path_factory.mktemp("runs") / "full"
    run.mkdir()
    harness.simulate("strong", 400, 2, run / "scores.parquet")
    (run / "config.toml").write_text('name = "full"\n', encoding="utf-8")
    _calibrate(run, ARCH, ("default", "overwrite", "average"))
    _validate(run, ARCH)
    messages: list[str] = []
    build_report(run, progress=messages.append)
    return run, messages


def _write_with_binary_twin(path: Path, *, seeds: int) -> None:
    """A scores table with arch ARCH and its binary-DV twin ARCH-binary."""
    columns = simulate_scores("weak", 300, seeds)
    rng = np.random.default_rng(0)
    v_bin = calibrate.binary_delegation_value(columns["label"], columns["probe"], columns["expert"])
    binary = dict(columns)
    binary["dv"] = np.where(np.isnan(columns["dv"]), np.nan, 0.6 * v_bin + 0.3 * rng.normal(size=v_bin.size))
    binary["arch"] = np.full(v_bin.size, f"{ARCH}-binary")
    write_scores(path, {k: np.concatenate([columns[k], binary[k]]) for k in columns})


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the required inputs, for two archs: a continuous DV probe and its binary-DV twin."""
    run = tmp_path_factory.mktemp("runs") / "sparse"
    run.mkdir()
    _write_with_binary_twin(run / "scores.parquet", seeds=2)
    for arch in (ARCH, f"{ARCH}-binary"):
        _calibrate(run, arch, ("default",))
    # A partial validation folder: one record without its per-trial table, one malformed record.
    folder = run / "validate" / ARCH
    folder.mkdir(parents=True)
    run_job(
        run / "scores.parquet",
        folder,
        JOBS[0],
        arch=ARCH,
        alphas=(0.2,),
        headline_alpha=0.3,
        config=ValidationConfig(trials=20),
    )
    (folder / f"{JOBS[0].name}.parquet").unlink()
    (folder / "performance.json").write_text("{}", encoding="utf-8")
    build_report(run)
    return run


def _numbers(run: Path) -> dict:
    return json.loads((run / "report" / "numbers.json").read_text(encoding="utf-8"))


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _cells(rows: list[dict[str, str]], column: str, **equal: str) -> list[float]:
    """One column of the CSV rows whose other columns equal the given text."""
    return [float(r[column]) for r in rows if all(r[k] == v for k, v in equal.items())]


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4), image.shape
    assert image.shape[0] > 200 and image.shape[1] > 300, image.shape


# ---------------------------------------------------------------- a complete run


def test_every_figure_is_a_valid_png_with_a_caption(full_run: tuple[Path, list[str]]) -> None:
    run, messages = full_run
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    for name in FULL_FIGURES:
        relative = f"figures/{ARCH}/{name}.png"
        _assert_png(run / "report" / relative)
        assert f"({relative})" in report and f"(`{relative}`)" in report, relative
    assert sorted(p.stem for p in (run / "report" / "figures" / ARCH).iterdir()) == sorted(FULL_FIGURES)
    for section in ("## Summary", "## Guarantee validation", "## Group-conditional results at budget 0.2"):
        assert section in report
    assert "config.toml" in report and 'name = "full"' in report
    assert messages and messages[-1] == "publishing report/"
    # The summary comes first, under the title; the configuration and the warnings after it.
    lines = report.splitlines()
    assert lines.index("## Summary") < 6
    assert (
        report.index("## Summary") < report.index("## Configuration") < report.index("## Degenerate scores")
    )
    # No binary-DV twin: DV top-k by batch size under its own heading, not "Binary vs continuous".
    assert "## Binary vs continuous" not in report
    assert report.index("## DV top-k by batch size") < report.index(f"figures/{ARCH}/dv-topk.png")


def _summary_cell(rows: list[dict[str, str]], metric: str, column: str, part: str = "budget") -> dict:
    (row,) = [r for r in rows if r["part"] == part and r["metric"] == metric and r["column"] == column]
    return row


def test_numbers_agree_with_the_sweep_and_baselines(full_run: tuple[Path, list[str]]) -> None:
    """The summary's columns are the budgets the run swept (five, all shown); CTD and both
    uncertainty baselines are the sweep's cells, and the gains pair each seed's CTD with that
    seed's probe (baselines.csv) or Unc. top-k (sweep.csv)."""
    run, _ = full_run
    summary = _numbers(run)["archs"][ARCH]["summary"]
    assert summary["budgets"] == list(BUDGETS) and summary["budgets_chosen"] == "the budgets asked for"
    sweep = _csv(run / "calibrate" / ARCH / "sweep.csv")
    baselines = {int(r["seed"]): r for r in _csv(run / "calibrate" / ARCH / "baselines.csv")}
    table = _csv(run / "report" / "tables" / "summary.csv")
    assert {r["column"] for r in table if r["part"] == "budget"} == {f"{b:g}" for b in BUDGETS}
    for metric, name in (("auroc", "AUROC"), ("accuracy", "accuracy")):
        for policy, label in (
            ("ctd", "CTD"),
            ("unc-topk", "Unc. top-k"),
            ("unc-calibrated", "Unc. calibrated"),
        ):
            cells = _cells(sweep, metric, policy=policy, objective=metric, budget="0.2", batch_size="64")
            assert len(cells) == 2  # one per seed
            assert summary["at"]["0.2"][f"{policy}_{metric}"] == pytest.approx(np.mean(cells), abs=1e-12)
            shown = float(_summary_cell(table, f"{label} {name}", "0.2")["value"])
            assert shown == pytest.approx(np.mean(cells), abs=1e-12)
        ctd = {
            s: _cells(
                sweep, metric, policy="ctd", objective=metric, budget="0.2", batch_size="64", seed=str(s)
            )[0]
            for s in baselines
        }
        unc = {
            s: _cells(
                sweep, metric, policy="unc-topk", objective=metric, budget="0.2", batch_size="64", seed=str(s)
            )[0]
            for s in baselines
        }
        for versus, label, other in (
            ("probe", "probe", {s: float(r[f"probe_{metric}"]) for s, r in baselines.items()}),
            ("unc-topk", "Unc. top-k", unc),
        ):
            per_seed = [ctd[s] - other[s] for s in sorted(baselines)]
            gain = summary["at"]["0.2"][f"gain_{versus}_{metric}"]
            assert gain["per_seed"] == pytest.approx(per_seed, abs=1e-12)
            row = _summary_cell(table, f"CTD - {label} {name}", "0.2")
            assert float(row["value"]) == pytest.approx(np.mean(per_seed), abs=1e-12)
            assert (float(row["low"]), float(row["high"])) == pytest.approx((min(per_seed), max(per_seed)))
    assert summary["probe_auroc"] == pytest.approx(
        np.mean([float(r["probe_auroc"]) for r in baselines.values()])
    )
    # Budget control's rows at each budget are the validation's own level there.
    found = _numbers(run)["archs"][ARCH]["validation"]["budget-pareto"]["levels"]
    for budget in BUDGETS:
        (level,) = [level for level in found if level["alpha"] == budget]
        row = _summary_cell(table, "Pareto LTT (CTD): violations", f"{budget:g}")
        assert float(row["value"]) == pytest.approx(level["population"]["violation_rate"])


def test_the_terminal_prints_the_summary_as_the_report_shows_it(full_run: tuple[Path, list[str]]) -> None:
    """summary.csv, read back as text the way `ctd eval` reads it, lays out as the report's own
    Markdown tables: a row per metric, a column per budget, a number in every CTD cell."""
    run, _ = full_run
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    tables = summary_tables(read_summary(run / "report" / "tables" / "summary.csv"))
    assert [t.title.split(":")[0].split(" at ")[0] for t in tables] == [ARCH, ARCH]
    for table in tables:
        assert f"**{table.title}**" in report
        for metric, cells in table.rows:
            assert "| " + " | ".join([metric, *cells]) + " |" in report
    budget = tables[0]
    assert budget.columns == [f"{b:g}" for b in BUDGETS]
    metrics = [metric for metric, _ in budget.rows]
    for expected in ("CTD AUROC", "Unc. top-k AUROC", "Unc. calibrated accuracy", "CTD - probe AUROC"):
        assert expected in metrics
    ctd = dict(budget.rows)["CTD AUROC"]
    assert "—" not in ctd and all(re.fullmatch(r"0\.\d{3}", cell) for cell in ctd)
    assert re.fullmatch(
        r"[+-]0\.\d{3} \[[+-]0\.\d{3}, [+-]0\.\d{3}\]", dict(budget.rows)["CTD - probe AUROC"][0]
    )


def test_the_headline_error_level_is_the_smallest_certifiable(full_run: tuple[Path, list[str]]) -> None:
    """No --performance-alpha: the validate stage picks the smallest level at which CTD returned a
    policy in at least MIN_SELECTION of the trials, and the summary and the figure say so."""
    run, _ = full_run
    record = read_job(run / "validate" / ARCH, next(j for j in JOBS if j.mode == "performance"))
    certifiable = [r["alpha"] for r in record.levels if r["selection_rate"] >= MIN_SELECTION]
    assert certifiable, "the simulated strong probe certifies some level"
    assert record.headline_alpha == certifiable[0] and record.headline_rule == "smallest-certifiable"
    performance = _numbers(run)["archs"][ARCH]["summary"]["performance"]
    assert performance["alpha"] == certifiable[0] and performance["rule"] == "smallest-certifiable"
    assert performance["ctd"]["selection_rate"] >= MIN_SELECTION
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert f"performance control at alpha = {certifiable[0]:g}" in report
    assert "the smallest certifiable level (the first at which CTD returned a policy in >= 10%" in report


def test_validation_numbers_come_from_the_records(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    numbers = _numbers(run)["archs"][ARCH]
    for job in JOBS:
        record = read_job(run / "validate" / ARCH, job)
        found = numbers["validation"][job.name]
        assert [level["alpha"] for level in found["levels"]] == sorted(
            {*LEVELS[job.mode], HEADLINE[job.mode]} - {None}
        )
        for level, written in zip(found["levels"], record.levels, strict=True):
            assert level["paper"]["violation_rate"] == pytest.approx(written["violation_rate"])
            assert level["population"]["violation_rate"] == pytest.approx(
                written["population"]["violation_rate"]
            )
        assert found["headline"]["alpha"] == record.headline_alpha
        assert HEADLINE[job.mode] in (None, record.headline_alpha)
        # The per-trial table has every level, and its rates are the records'.
        trials = record.trials_at(record.headline_alpha)
        assert trials is not None and trials["population_violated"].size == 50
        assert trials["population_violated"].mean() == pytest.approx(
            found["headline"]["population"]["violation_rate"]
        )
    summary = numbers["summary"]["performance"]
    performance = numbers["validation"]["performance"]["headline"]
    assert summary["ctd"]["violation_rate"] == pytest.approx(performance["population"]["violation_rate"])
    assert summary["empirical"]["selection_rate"] == pytest.approx(
        performance["empirical"]["population"]["selection_rate"]
    )
    rows = _csv(run / "report" / "tables" / ARCH / "validation.csv")
    # (Pareto + budget-only) x levels + (CTD + empirical) x levels, each measured two ways.
    assert len(rows) == 2 * (2 * len(BUDGETS) + 2 * len(LEVELS["performance"]))
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "**population**" in report and "finite evaluation" in report


def test_group_table_matches_an_independent_recomputation(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    rows = _csv(run / "report" / "tables" / ARCH / "groups.csv")
    table = read_scores(run / "scores.parquet")
    test = table.split == "test"
    assert sorted(r["group"] for r in rows) == sorted(set(table.group[test].tolist()))
    # Mean v and size of one group on the sweep's evaluation halves (split seed 0, one split per
    # seed), from the raw columns.
    group = rows[0]["group"]
    means, count = [], 0
    for seed in table.seeds:
        rows_of_seed = test & (table.seed == seed)
        label, probe, expert = (column[rows_of_seed] for column in (table.label, table.probe, table.expert))
        evaluation = calibrate.random_splits(label.size, 1, [0, seed]).evaluation[0]
        in_group = table.group[rows_of_seed][evaluation] == group
        v = (2 * label - 1) * (expert - probe)
        means.append(v[evaluation][in_group].mean())
        count += int(in_group.sum())
    assert float(rows[0]["mean_v_all"]) == pytest.approx(np.mean(means), abs=1e-12)
    assert int(rows[0]["n"]) == count
    # CTD's delegation rate in that group from the threshold sweep.csv recorded at budget 0.2.
    sweep = _csv(run / "calibrate" / ARCH / "sweep.csv")
    rates = []
    for seed in table.seeds:
        rows_of_seed = test & (table.seed == seed)
        evaluation = calibrate.random_splits(int(rows_of_seed.sum()), 1, [0, seed]).evaluation[0]
        (threshold,) = _cells(
            sweep, "threshold", policy="ctd", objective="auroc", budget="0.2", batch_size="64", seed=str(seed)
        )
        delegated = table.dv[rows_of_seed][evaluation] > threshold
        rates.append(delegated[table.group[rows_of_seed][evaluation] == group].mean())
    assert float(rows[0]["rate_ctd"]) == pytest.approx(np.mean(rates), abs=1e-12)
    groups = _numbers(run)["archs"][ARCH]["groups"]
    assert groups["budget"] == 0.2 and groups["batch_size"] == 64
    assert groups["rows"][0]["mean_v_all"] == pytest.approx(float(rows[0]["mean_v_all"]))
    # The report's table is the mean over seeds of calibrate/<arch>/groups.csv at that budget.
    written = _csv(run / "calibrate" / ARCH / "groups.csv")
    cells = _cells(
        written,
        "delegation_rate",
        policy="unc-topk",
        objective="auroc",
        budget="0.2",
        batch_size="64",
        group=group,
    )
    assert len(cells) == len(table.seeds)
    assert float(rows[0]["rate_unc-topk"]) == pytest.approx(np.mean(cells), abs=1e-12)


def test_dv_quality_and_mean_v_tables(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    numbers = _numbers(run)["archs"][ARCH]
    summary = json.loads((run / "calibrate" / ARCH / "summary.json").read_text())
    table = read_scores(run / "scores.parquet")
    for row in numbers["dv_quality"]["seeds"]:
        assert row["spearman"] == pytest.approx(summary["dv_quality"][str(row["seed"])]["spearman"])
        # The numbers calibrate_scores wrote are dv_quality of the seed's test rows.
        rows = (table.seed == row["seed"]) & (table.split == "test")
        quality = calibrate.dv_quality(
            table.dv[rows], (2 * table.label[rows] - 1) * (table.expert[rows] - table.probe[rows])
        )
        assert row["n"] == quality.n == int(rows.sum())
        assert row["mse"] == pytest.approx(quality.mse, abs=1e-12)
    mean_v = numbers["mean_v_at_k"]
    assert (
        mean_v["oracle"]["0.1"]["mean"] >= mean_v["dv"]["0.1"]["mean"]
    )  # the true ranking is an upper bound
    assert len(_csv(run / "report" / "tables" / ARCH / "mean-v-at-k.csv")) == 3 * 100


def test_rebuild_is_deterministic_and_leaves_no_staging_folder(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    before = (run / "report" / "numbers.json").read_bytes()
    build_report(run)
    assert (run / "report" / "numbers.json").read_bytes() == before
    assert not [p.name for p in run.iterdir() if p.name.startswith(".report")]


# ---------------------------------------------------------------- gaps and errors


def test_missing_optional_inputs_are_said_not_fatal(sparse_run: Path) -> None:
    report = (sparse_run / "report" / "report.md").read_text(encoding="utf-8")
    assert "No config.toml in the run folder." in report
    # The binary-DV twin is not validated (the validate stage skips it), and is not missing.
    assert f"no validate/{ARCH}-binary/ folder" not in report
    assert f"validate/{ARCH}/budget-ltt.json: no such file" in report
    assert f"validate/{ARCH}/performance.json: no per-level records" in report
    assert "| 0.2 | " in report and "| 0.3 | " in report  # the record without trials still has its rows
    assert (
        f"no calibrate/{ARCH}/merge-overwrite/" in report and f"no calibrate/{ARCH}/merge-average/" in report
    )
    numbers = _numbers(sparse_run)
    assert any("merge-average" in m for m in numbers["missing"])
    assert not any(str(sparse_run) in m for m in numbers["missing"])  # paths relative to the run
    found = numbers["archs"][ARCH]
    rate = found["validation"]["budget-pareto"]["headline"]["population"]["violation_rate"]
    assert found["summary"]["at"]["0.3"]["budget-pareto_violation_rate"] == pytest.approx(rate)
    assert found["summary"]["at"]["0.5"]["budget-pareto_violation_rate"] is None  # not validated: null
    assert found["summary"]["performance"] == {}  # no performance record to read
    figures = sparse_run / "report" / "figures" / ARCH
    _assert_png(figures / "cascade-auroc.png")
    _assert_png(figures / "validation-levels.png")
    _assert_png(figures / "validation-budget.png")  # empty panels: no per-trial table
    assert "| Pareto LTT (CTD): violations |" in report  # the summary still has the row, with dashes
    assert "## Binary vs continuous delegation value" in report and "## DV top-k by batch size" not in report


def test_binary_dv_twin_gets_a_comparison(sparse_run: Path) -> None:
    figures = sparse_run / "report" / "figures" / ARCH
    _assert_png(figures / "dv-binary-vs-continuous.png")
    assert not (figures / "dv-topk.png").exists()
    rows = _numbers(sparse_run)["archs"][ARCH]["binary_vs_continuous"]["rows"]
    assert [r["budget"] for r in rows] == [0.1, 0.2, 0.3, 0.5]
    sweep = _csv(sparse_run / "calibrate" / f"{ARCH}-binary" / "sweep.csv")
    cells = _cells(sweep, "auroc", policy="dv-topk", objective="auroc", budget="0.3", batch_size="64")
    assert rows[2]["binary_auroc"] == pytest.approx(np.mean(cells))
    report = (sparse_run / "report" / "report.md").read_text(encoding="utf-8")
    assert "dv-binary-vs-continuous.png" in report
    # Its summary has no validation rows (all dashes, for it is not validated) and says why.
    summary = _csv(sparse_run / "report" / "tables" / "summary.csv")
    twin = [r for r in summary if r["arch"] == f"{ARCH}-binary"]
    assert twin and not any("LTT" in r["metric"] for r in twin)
    assert any("LTT" in r["metric"] for r in summary if r["arch"] == ARCH)
    assert "a binary-DV twin, not validated (see Binary vs continuous)" in twin[0]["title"]
    # The twin is compared here, not validated (the validate stage skips it): it was said to be
    # missing its validate/ folder.
    assert not any(m.startswith(f"{ARCH}-binary: no validate") for m in _numbers(sparse_run)["missing"])


def test_missing_scores_or_sweep_is_one_input_error(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(InputError, match=r"scores\.parquet: no such file") as caught:
        build_report(run)
    assert "\n" not in str(caught.value)
    harness.simulate("strong", 200, 1, run / "scores.parquet")
    with pytest.raises(InputError, match=rf"calibrate/{ARCH}/sweep\.csv: no such file"):
        build_report(run)
    assert not (run / "report").exists()
    assert not [p.name for p in run.iterdir() if p.name.startswith(".report")]


def test_an_interrupted_build_keeps_the_previous_report(
    sparse_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "copy"
    shutil.copytree(sparse_run, run)
    before = (run / "report" / "report.md").read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("interrupted")

    # After every figure is handed to the workers, while they draw: none may land afterwards (a
    # figure's write makes its folder, so a late one would bring the staging folder back), so
    # every worker is gone by the time the build has failed.
    workers: list[subprocess.Popen[bytes]] = []
    real_start = WorkerPool._start

    def watched_start(self: WorkerPool) -> None:
        real_start(self)
        workers.extend(worker.process for worker in self._workers)

    monkeypatch.setattr(WorkerPool, "_start", watched_start)
    monkeypatch.setattr(harness.report._build, "summary_lines", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        build_report(run)
    assert workers and all(process.poll() is not None for process in workers)
    assert (run / "report" / "report.md").read_bytes() == before
    assert not [p.name for p in run.iterdir() if p.name.startswith(".report")]


def test_a_new_report_replaces_the_old_one_whole_and_leaves_nothing_beside_it(
    full_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """report/ is swapped for the new one in one exchange (renameat2 here), the old one removed
    after: no file of the old report stays, and no hidden folder is left in the run folder."""
    run, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "report" / "old-only.txt").write_text("from the report before")
    before = (copy / "report").stat().st_ino
    build_report(copy)
    assert not (copy / "report" / "old-only.txt").exists() and (copy / "report" / "report.md").is_file()
    assert (copy / "report").stat().st_ino != before
    assert not [p.name for p in copy.iterdir() if p.name.startswith(".")]


def test_a_report_stopped_while_it_removes_the_old_one_leaves_it_to_the_next(
    full_run: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped (Ctrl-C, or killed) right after the exchange, as it removes the report it replaced:
    report/ is the new one, and the old one, at the staging path, is removed by the next build."""
    run, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "report" / "old-only.txt").write_text("from the report before")
    rmtree = shutil.rmtree

    def stopped(path: Path, *args: object, **kwargs: object) -> None:
        if (Path(path) / "old-only.txt").exists():
            raise KeyboardInterrupt
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", stopped)
    with pytest.raises(KeyboardInterrupt):
        build_report(copy)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert (copy / "report" / "report.md").is_file() and not (copy / "report" / "old-only.txt").exists()
    (left,) = [p for p in copy.iterdir() if p.name.startswith(".")]
    assert (left / "old-only.txt").is_file()
    build_report(copy)
    assert not [p.name for p in copy.iterdir() if p.name.startswith(".")]


def test_workers_started_ahead_draw_the_same_report(full_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    """`ctd eval` starts the figure workers while it calibrates (`figure_workers().start()`), so
    that their import of matplotlib is done when the report needs them: those very workers draw
    every figure (and are stopped after), and the report is the one a build of its own makes."""
    run, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "report")
    figures = figure_workers()
    figures.start()
    # Private: the processes started ahead, to see that the build used them rather than its own.
    ahead = [worker.process for worker in figures._workers]
    assert ahead and all(process.poll() is None for process in ahead)
    build_report(copy, figures=figures)
    assert all(process.wait(timeout=30) == 0 for process in ahead)  # used, then stopped by the build
    drawn = sorted(p.relative_to(copy / "report") for p in (copy / "report" / "figures").rglob("*.png"))
    assert drawn == sorted(p.relative_to(run / "report") for p in (run / "report" / "figures").rglob("*.png"))
    assert all((copy / "report" / p).read_bytes() == (run / "report" / p).read_bytes() for p in drawn)
    assert _numbers(copy) | {"run": "full"} == _numbers(run)


def test_the_report_leaves_matplotlib_to_its_workers(
    full_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The building process hands every figure to the workers and never imports matplotlib
    itself (the import took most of a second of `ctd eval`'s report stage); the report it
    builds is the same."""
    run, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "report")
    code = (
        "import sys\n"
        "from harness.report import build_report\n"
        f"build_report({str(copy)!r})\n"
        "print('matplotlib' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
    assert sorted((copy / "report" / "figures").rglob("*.png"))
    assert _numbers(copy) | {"run": "full"} == _numbers(run)


# ---------------------------------------------------------------- files in, no stage re-run

# What the report must never call: the sweep, the validation, and the inner steps of the sweep
# that the report once copied to rebuild the group table's masks.
RECOMPUTATION = (
    "sweep",
    "validate",
    "validate_levels",
    "budget_control",
    "threshold_candidates",
    "random_splits",
    "policy_signal",
    "topk_mask",
)


def test_the_report_is_rebuilt_from_the_files_alone(
    full_run: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every binding of the recomputation functions in every loaded calibrate and harness module
    (the public face and the private modules alike) raises; the report is still built, the same."""
    run, _ = full_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "report")
    # policy_signal and threshold_candidates left calibrate's public face: found in their module.
    originals = {
        id(getattr(calibrate, name, None) or getattr(calibrate_splits, name)): name for name in RECOMPUTATION
    }

    def refuse(name: str) -> object:
        def call(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"the report called calibrate.{name}")

        return call

    patched = set()
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in ("calibrate", "harness"):
            continue
        for attribute, value in list(vars(module).items()):
            if id(value) in originals:
                monkeypatch.setattr(module, attribute, refuse(originals[id(value)]))
                patched.add(originals[id(value)])
    assert patched == set(RECOMPUTATION)
    with pytest.raises(AssertionError, match=r"called calibrate\.sweep"):
        calibrate.sweep({})  # the patch is live
    build_report(copy)
    assert _numbers(copy) | {"run": "full"} == _numbers(run)


def test_the_report_code_names_no_recomputation() -> None:
    """Grep-level: harness/report/ names none of the recomputation functions, nor what the
    nearest-budget lookup and the drift check were called."""
    banned = re.compile(
        r"calibrate\.(sweep|validate)\b|\b(validate_levels|budget_control|threshold_candidates|random_splits"
        r"|policy_signal|topk_mask|nearest_budget|matches_sweep|_group_masks)\b"
    )
    folder = Path(harness.report.__file__).parent
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not banned.search(text), (path.name, banned.search(text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("calibrate"):
                assert node.module == "calibrate", (path.name, node.module)  # the public face only
                assert not {a.name for a in node.names} & set(RECOMPUTATION), path.name


def test_the_sweep_config_round_trips_through_summary_json(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    for merge in ("default", "overwrite", "average"):
        folder = run / "calibrate" / ARCH / ("" if merge == "default" else f"merge-{merge}")
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        # Every field, but a setting whose default is None (`accuracy`) only when it is set.
        written = {f.name for f in dataclasses.fields(SweepConfig) if f.default is not None}
        assert written <= set(summary) and "accuracy" not in summary
        expected = SweepConfig(budgets=BUDGETS, batch_sizes=BATCH_SIZES, merge=merge)
        assert read_sweep(folder).config == expected


def test_mean_v_table_fractions_are_points_of_its_grid() -> None:
    assert set(MEAN_V_TABLE_FRACTIONS) <= set(MEAN_V_FRACTIONS.tolist())


def test_budgets_off_the_grid_are_said_not_replaced(tmp_path: Path) -> None:
    """A grid without 0.1 and 0.2 (continuous) or 0.2 (binary twin): the summary shows each
    grid's own budgets, a number in every CTD cell; the tables at fixed budgets (binary
    comparison, groups) leave the missing ones empty and say why; 0.3, on both grids, is read as is."""
    run = tmp_path / "offgrid"
    run.mkdir()
    _write_with_binary_twin(run / "scores.parquet", seeds=1)
    grids = {ARCH: (0.15, 0.25, 0.3, 0.5), f"{ARCH}-binary": (0.1, 0.3, 0.5)}
    for arch, budgets in grids.items():
        config = SweepConfig(budgets=budgets, batch_sizes=(32,))
        calibrate_scores(run / "scores.parquet", run / "calibrate" / arch, config, arch=arch)
    build_report(run)
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    numbers = _numbers(run)["archs"][ARCH]
    summary = numbers["summary"]
    assert summary["budgets"] == [0.15, 0.25, 0.3, 0.5]
    assert _numbers(run)["archs"][f"{ARCH}-binary"]["summary"]["budgets"] == [0.1, 0.3, 0.5]
    sweep = _csv(run / "calibrate" / ARCH / "sweep.csv")
    (auroc,) = _cells(sweep, "auroc", policy="ctd", objective="auroc", budget="0.3", batch_size="32")
    assert summary["at"]["0.3"]["ctd_auroc"] == pytest.approx(auroc)
    rows = _csv(run / "report" / "tables" / "summary.csv")
    ctd = [r for r in rows if r["part"] == "budget" and r["metric"].startswith("CTD")]
    assert len(ctd) == 6 * (4 + 3)  # 2 metrics x (CTD, 2 gains), at 4 and at 3 budgets
    assert all(np.isfinite(float(r["value"])) for r in ctd)
    assert "groups" not in numbers
    assert f"budget 0.2 is not on calibrate/{ARCH}'s budget grid; no group table." in report
    rows = {r["budget"]: r for r in numbers["binary_vs_continuous"]["rows"]}
    assert rows[0.1]["continuous_auroc"] is None and rows[0.1]["binary_auroc"] is not None
    assert rows[0.2]["binary_auroc"] is None and rows[0.3]["binary_auroc"] is not None
    assert f"not on the sweep's grid: 0.1 (calibrate/{ARCH}), 0.2 (calibrate/{ARCH}-binary)" in report


def test_an_older_calibrate_folder(sparse_run: Path, tmp_path: Path) -> None:
    """No groups.csv (written before the sweep had a group table): said, not fatal. A
    summary.json without a SweepConfig field: one InputError naming the file and the field."""
    run = tmp_path / "older"
    shutil.copytree(sparse_run, run)
    (run / "calibrate" / ARCH / "groups.csv").unlink()
    build_report(run)
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert f"no calibrate/{ARCH}/groups.csv (an older `ctd calibrate` wrote this folder" in report
    path = run / "calibrate" / ARCH / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    del summary["split_seed"]
    path.write_text(json.dumps(summary), encoding="utf-8")
    with pytest.raises(InputError, match=r"summary\.json: no 'split_seed' setting"):
        build_report(run)


def _sweep_on(grid: tuple[float, ...]) -> Sweep:
    """A sweep read back with this budget grid (only the budgets matter to the summary's columns)."""
    budgets = np.array(grid, np.float64)
    return Sweep(Path("."), {"budget": budgets}, {}, {}, SweepConfig(budgets=grid), None)


def test_the_summary_shows_the_budgets_asked_for() -> None:
    """The default grid: its headline budgets. A grid of the user's: all of it, or MAX_BUDGETS of
    a long one, evenly spaced and always including both ends."""
    assert summary_budgets(_sweep_on(calibrate.DEFAULT_BUDGETS)) == (
        list(SUMMARY_BUDGETS),
        "headline budgets of the default grid",
    )
    assert summary_budgets(_sweep_on((0.5, 0.7))) == ([0.5, 0.7], "the budgets asked for")
    long = tuple(round(0.05 * k, 2) for k in range(2, 20))  # 0.1 ... 0.95, 18 budgets
    shown, chosen = summary_budgets(_sweep_on(long))
    assert len(shown) == MAX_BUDGETS and shown[0] == 0.1 and shown[-1] == 0.95
    assert set(shown) <= set(long) and chosen == f"{MAX_BUDGETS} of the 18 budgets asked for, evenly spaced"


def test_the_summary_compares_ctd_with_top_k_at_every_batch_size(full_run: tuple[Path, list[str]]) -> None:
    """The paper's comparison is per batch size (top-k's quota is per batch): besides the title's
    largest B, a gain row over Unc. top-k for each smaller one, each the mean of its per-seed
    gains as `paired_gain` computes them."""
    run, _ = full_run
    rows = _csv(run / "report" / "tables" / "summary.csv")
    numbers = _numbers(run)["archs"][ARCH]["summary"]
    for metric, name in (("auroc", "AUROC"), ("accuracy", "accuracy")):
        (row,) = [
            r for r in rows if r["metric"] == f"CTD - Unc. top-k {name}, B = 32" and r["column"] == "0.3"
        ]
        gain = numbers["at"]["0.3"][f"gain_unc-topk_{metric}_b32"]
        assert float(row["value"]) == pytest.approx(gain["mean"]) == pytest.approx(np.mean(gain["per_seed"]))
        assert not [r for r in rows if r["metric"] == f"CTD - Unc. top-k {name}, B = 64"]  # the title's B
    report = (run / "report" / "report.md").read_text(encoding="utf-8")
    assert "| CTD - Unc. top-k AUROC, B = 32 |" in report
