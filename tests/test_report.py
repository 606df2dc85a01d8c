"""`build_report`: a run folder built here with the library (simulate, calibrate_scores,
validate_scores) in, report/ out: valid PNGs, captions, tables that agree with the sweep and
with an independent recomputation, graceful gaps, clean errors and atomic, deterministic output."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

import calibrate
import harness
import harness.report._figures
from calibrate import SweepConfig
from harness import InputError, calibrate_scores, read_scores, simulate_scores, write_scores
from harness.report._build import build_report
from harness.stages._validate import JOBS, read_job, run_job

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
HEADLINE = {"budget": 0.3, "performance": 0.2}


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
            delta=0.1,
            trials=TRIALS,
            pvalue="binomial",
        )


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Every input the report reads, one arch, 2 seeds; built once, reported once."""
    run = tmp_path_factory.mktemp("runs") / "full"
    run.mkdir()
    harness.simulate("strong", 400, 2, run / "scores.parquet")
    (run / "config.toml").write_text('name = "full"\n\n[calibrate]\nsplit_seed = 0\n', encoding="utf-8")
    _calibrate(run, ARCH, ("default", "overwrite", "average"))
    _validate(run, ARCH)
    messages: list[str] = []
    build_report(run, progress=messages.append)
    return run, messages


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the required inputs, for two archs: a continuous DV probe and its binary-DV twin."""
    run = tmp_path_factory.mktemp("runs") / "sparse"
    run.mkdir()
    columns = simulate_scores("weak", 300, 2)
    rng = np.random.default_rng(0)
    v_bin = calibrate.binary_delegation_value(columns["label"], columns["probe"], columns["expert"])
    binary = dict(columns)
    binary["dv"] = np.where(np.isnan(columns["dv"]), np.nan, 0.6 * v_bin + 0.3 * rng.normal(size=v_bin.size))
    binary["arch"] = np.full(v_bin.size, f"{ARCH}-binary")
    write_scores(run / "scores.parquet", {k: np.concatenate([columns[k], binary[k]]) for k in columns})
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
        delta=0.1,
        trials=20,
        pvalue="binomial",
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


def test_numbers_agree_with_the_sweep_and_baselines(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    summary = _numbers(run)["archs"][ARCH]["summary"]
    sweep = _csv(run / "calibrate" / ARCH / "sweep.csv")
    for metric in ("auroc", "accuracy"):
        cells = _cells(sweep, metric, policy="ctd", objective=metric, budget="0.2", batch_size="64")
        assert len(cells) == 2  # one per seed
        assert summary["ctd@0.2"][metric] == pytest.approx(np.mean(cells), abs=1e-12)
    baselines = _csv(run / "calibrate" / ARCH / "baselines.csv")
    assert summary["probe_auroc"] == pytest.approx(np.mean([float(r["probe_auroc"]) for r in baselines]))
    table = _csv(run / "report" / "tables" / "summary.csv")
    assert float(table[0]["CTD AUROC @0.2"]) == pytest.approx(summary["ctd@0.2"]["auroc"])


def test_validation_numbers_come_from_the_records(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    numbers = _numbers(run)["archs"][ARCH]
    for job in JOBS:
        record = read_job(run / "validate" / ARCH, job)
        found = numbers["validation"][job.name]
        assert [level["alpha"] for level in found["levels"]] == sorted(
            {*LEVELS[job.mode], HEADLINE[job.mode]}
        )
        for level, written in zip(found["levels"], record.levels, strict=True):
            assert level["paper"]["violation_rate"] == pytest.approx(written["violation_rate"])
            assert level["population"]["violation_rate"] == pytest.approx(
                written["population"]["violation_rate"]
            )
        assert found["headline"]["alpha"] == HEADLINE[job.mode]
        # The per-trial table has every level, and its rates are the records'.
        trials = record.trials_at(HEADLINE[job.mode])
        assert trials is not None and trials["population_violated"].size == 50
        assert trials["population_violated"].mean() == pytest.approx(
            found["headline"]["population"]["violation_rate"]
        )
    summary = numbers["summary"]["validation"]
    performance = numbers["validation"]["performance"]["headline"]
    assert summary["viol. perf. CTD"] == pytest.approx(performance["population"]["violation_rate"])
    assert summary["sel. perf. empirical"] == pytest.approx(
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
    assert groups["matches_sweep"] is True  # recomputed masks reproduce sweep.csv's realised rates
    assert groups["rows"][0]["mean_v_all"] == pytest.approx(float(rows[0]["mean_v_all"]))


def test_dv_quality_and_mean_v_tables(full_run: tuple[Path, list[str]]) -> None:
    run, _ = full_run
    numbers = _numbers(run)["archs"][ARCH]
    summary = json.loads((run / "calibrate" / ARCH / "summary.json").read_text())
    for row in numbers["dv_quality"]["seeds"]:
        assert row["spearman"] == pytest.approx(summary["dv_quality"][str(row["seed"])]["spearman"])
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
    assert f"no validate/{ARCH}-binary/ folder" in report
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
    assert found["summary"]["validation"]["viol. budget Pareto"] == pytest.approx(rate)
    assert found["summary"]["validation"]["viol. perf. CTD"] is None  # NaN, written as null
    figures = sparse_run / "report" / "figures" / ARCH
    _assert_png(figures / "cascade-auroc.png")
    _assert_png(figures / "validation-levels.png")
    _assert_png(figures / "validation-budget.png")  # empty panels: no per-trial table
    assert "viol. budget Pareto" in report  # the summary still has the column, with dashes


def test_binary_dv_twin_gets_a_comparison(sparse_run: Path) -> None:
    figures = sparse_run / "report" / "figures" / ARCH
    _assert_png(figures / "dv-binary-vs-continuous.png")
    assert not (figures / "dv-topk.png").exists()
    rows = _numbers(sparse_run)["archs"][ARCH]["binary_vs_continuous"]["rows"]
    assert [r["budget"] for r in rows] == [0.1, 0.2, 0.3, 0.5]
    sweep = _csv(sparse_run / "calibrate" / f"{ARCH}-binary" / "sweep.csv")
    cells = _cells(sweep, "auroc", policy="dv-topk", objective="auroc", budget="0.3", batch_size="64")
    assert rows[2]["binary_auroc"] == pytest.approx(np.mean(cells))
    assert "dv-binary-vs-continuous.png" in (sparse_run / "report" / "report.md").read_text(encoding="utf-8")


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

    monkeypatch.setattr(harness.report._figures, "realised_figure", boom)  # after the first figures
    with pytest.raises(RuntimeError, match="interrupted"):
        build_report(run)
    assert (run / "report" / "report.md").read_bytes() == before
    assert not [p.name for p in run.iterdir() if p.name.startswith(".report")]
