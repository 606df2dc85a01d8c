"""The `ctd` command line (SPEC section 3): simulate, calibrate and validate, their outputs, and
clean one-line errors (exit code 2, nothing written) on bad input."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.data._scores import SCORES_COLUMNS, read_scores
from harness.data._simulate import simulate_scores
from harness.data._tables import read_table, write_table

runner = CliRunner()

SUMMARY_KEYS = {
    "trials",
    "violation_rate",
    "violation_ci95",
    "selection_rate",
    "selection_ci95",
    "mean_realised_budget",
    "mean_accuracy",
}
SWEEP_KEYS = ("seed", "policy", "merge", "objective", "budget", "batch_size", "auroc", "accuracy", "realised")
LTT_KEYS = {"threshold", "certified", "pvalues", "k", "n", "kstar", "order", "stopped_at"}
FAST_VALIDATE = ("--trials", "20")
FAST_CALIBRATE = ("--budgets", "0.2,0.5", "--batch-sizes", "32", "--policies", "ctd,dv-topk")


def ctd(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def ctd_process(*args: object) -> subprocess.CompletedProcess[str]:
    """The real console script, in a fresh interpreter."""
    exe = shutil.which("ctd")
    command = [exe] if exe else [sys.executable, "-c", "from harness.cli import main; main()"]
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def assert_ok(result) -> None:
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.exception is None
    assert "Traceback" not in result.output


def assert_clean_error(result, *fragments: str, unwritten: tuple[Path, ...] = ()) -> str:
    """Exit code 2, exactly one stderr line 'error: ...' containing every fragment (a regex with
    word boundaries, so 'line 12' does not match 'line 125'), no traceback, nothing written."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)  # a clean exit, not a crash
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    message = lines[0]
    assert message.startswith("error: "), message
    for fragment in fragments:
        assert re.search(rf"(?<!\w){re.escape(fragment)}(?!\w)", message), (fragment, message)
    for path in unwritten:
        assert not path.exists(), f"{path} was written despite the error"
    return message


def one_json_object(result) -> dict:
    assert_ok(result)
    assert result.stderr == ""
    text = result.stdout
    assert text.endswith("\n") and text.count("\n") == 1, text
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> Path:
    """A good table: 400 test + 400 dev rows under 2 seeds."""
    path = tmp_path_factory.mktemp("good") / "s.parquet"
    assert_ok(ctd("simulate", "--scenario", "weak", "--n", 400, "--seeds", 2, "--out", path))
    return path


@pytest.fixture(scope="module")
def base() -> dict[str, np.ndarray]:
    """Columns of a smaller good table for planting defects: 200 test + 200 dev rows x 2 seeds;
    data rows 0-199 are seed 0's test split."""
    return simulate_scores("strong", 200, 2, random_state=1)


def copy(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A writable copy; string columns become object arrays so any new value fits."""
    return {k: v.astype(object) if v.dtype.kind == "U" else v.copy() for k, v in columns.items()}


def where(fmt: str, index: int) -> str:
    """How an error names 0-based data row `index`: CSV physical line (header = 1), Parquet row."""
    return f"line {index + 2}" if fmt == "csv" else f"row {index + 1}"


# --- simulate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_simulate_writes_a_readable_table(tmp_path: Path, suffix: str):
    out = tmp_path / "sub" / f"s.{suffix}"
    result = ctd("simulate", "--scenario", "strong", "--n", 120, "--n-dev", 30, "--seeds", 3, "--out", out)
    assert_ok(result)
    assert str(out) in result.stdout
    table = read_scores(out)
    assert len(table.id) == 3 * (120 + 30)
    assert table.seeds == [0, 1, 2]
    assert all(s.n == 120 for s in table.test_scores().values())
    assert set(table.group) == {"anthropic", "mt", "mts", "toolace"}
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_simulate_random_state_and_scenario_change_the_table(tmp_path: Path):
    paths = {}
    for name, extra in {"a": (), "b": (), "c": ("--random-state", 5), "d": ()}.items():
        scenario = "weak" if name == "d" else "strong"
        paths[name] = tmp_path / f"{name}.csv"
        assert_ok(
            ctd("simulate", "--scenario", scenario, "--n", 50, "--seeds", 1, "--out", paths[name], *extra)
        )
    text = {k: p.read_text(encoding="utf-8") for k, p in paths.items()}
    assert text["a"] == text["b"]
    assert text["a"] != text["c"]
    assert text["a"] != text["d"]


# --- validate ----------------------------------------------------------------------------------


def check_summary(summary: dict, trials: int) -> None:
    assert set(summary) >= SUMMARY_KEYS
    assert summary["trials"] == trials
    lo, hi = summary["violation_ci95"]
    assert 0 <= lo <= summary["violation_rate"] <= hi <= 1
    lo, hi = summary["selection_ci95"]
    assert 0 <= lo <= summary["selection_rate"] <= hi <= 1


def test_validate_budget_json(scores: Path):
    record = one_json_object(
        ctd(
            "validate",
            "--scores",
            scores,
            "--mode",
            "budget",
            "--alpha",
            0.3,
            "--delta",
            0.1,
            "--trials",
            40,
            "--json",
        )
    )
    check_summary(record, 40)
    check_summary(record["population"], 40)  # the split minus D_est: what LTT certifies
    assert "fresh" not in record  # only with --eval-scores
    assert record["mode"] == "budget"
    assert record["alpha"] == 0.3 and record["delta"] == 0.1
    assert record["pvalue_method"] == "binomial" and record["seed"] == [0]
    assert record["scores"] == str(scores)
    assert "empirical" not in record
    # Budget control always has "never delegate": every trial selects a policy.
    assert record["selection_rate"] == record["population"]["selection_rate"] == 1.0
    assert 0 <= record["mean_realised_budget"] <= 1
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (60, 140, 200)


def test_validate_performance_json_has_the_empirical_selector(scores: Path):
    record = one_json_object(
        ctd("validate", "--scores", scores, "--mode", "performance", "--alpha", 0.3, "--trials", 30, "--json")
    )
    check_summary(record, 30)
    assert record["mode"] == "performance"
    check_summary(record["empirical"], 30)
    check_summary(record["population"], 30)
    check_summary(record["empirical"]["population"], 30)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_validate_out_writes_one_row_per_trial(scores: Path, tmp_path: Path, suffix: str):
    out = tmp_path / f"trials.{suffix}"
    record = one_json_object(ctd("validate", "--scores", scores, "--trials", 25, "--out", out, "--json"))
    raw = read_table(out)
    assert len(raw) == 25
    assert {"seed", "threshold", "realised", "selected", "violated"} <= set(raw.columns)
    # Trials are spread over both probe seeds.
    assert sorted({int(s) for s in raw.columns["seed"]}) == [0, 1]
    violated = np.array([str(v) in ("True", "true", "1") for v in raw.columns["violated"]])
    assert violated.mean() == pytest.approx(record["violation_rate"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_validate_json_agrees_with_the_same_seed(scores: Path):
    args = ("validate", "--scores", scores, "--trials", 20, "--seed", 3, "--json")
    assert one_json_object(ctd(*args)) == one_json_object(ctd(*args))


@pytest.mark.parametrize("mode", ["budget", "performance"])
def test_validate_prints_a_table_without_json(scores: Path, mode: str):
    result = ctd("validate", "--scores", scores, "--mode", mode, *FAST_VALIDATE)
    assert_ok(result)
    assert "violation rate" in result.stdout and "selected" in result.stdout
    assert "population" in result.stdout and "paper" in result.stdout
    assert "LTT" in result.stdout
    assert ("empirical" in result.stdout) == (mode == "performance")
    assert f"{mode} control" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_validate_fresh_on_the_same_table(scores: Path):
    """--eval-scores adds the 'fresh' measurement and changes no trial; measured on the table
    itself, 'fresh' is the whole split, which holds D_est beside the population's rows."""
    args = ("validate", "--scores", scores, "--mode", "performance", "--alpha", 0.3, "--trials", 30)
    record = one_json_object(ctd(*args, "--eval-scores", scores, "--json"))
    assert record["eval_scores"] == str(scores)
    check_summary(record["fresh"], 30)
    check_summary(record["empirical"]["fresh"], 30)
    assert record["fresh"]["selection_rate"] == record["population"]["selection_rate"]
    assert record["fresh_rows_by_seed"] == {"0": 400, "1": 400}
    without = one_json_object(ctd(*args, "--json"))
    for key in ("population", "violation_rate", "mean_realised_budget"):
        assert without[key] == record[key]  # --eval-scores changes no trial


def test_validate_fresh_table_of_another_draw(scores: Path, tmp_path: Path):
    fresh = tmp_path / "fresh.parquet"
    assert_ok(
        ctd(
            "simulate", "--scenario", "strong", "--n", 3000, "--seeds", 2, "--random-state", 7, "--out", fresh
        )
    )
    record = one_json_object(
        ctd(
            "validate",
            "--scores",
            scores,
            "--eval-scores",
            fresh,
            "--cal-size",
            300,
            "--trials",
            30,
            "--json",
        )
    )
    check_summary(record["fresh"], 30)
    assert record["fresh_rows_by_seed"] == {"0": 3000, "1": 3000}
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (90, 210, 100)


def test_validate_pvalue_and_cal_size(scores: Path):
    record = one_json_object(
        ctd("validate", "--scores", scores, "--pvalue", "hb", "--cal-size", 250, "--trials", 20, "--json")
    )
    assert record["pvalue_method"] == "hb"
    assert (record["n_est"], record["n_cal"], record["n_eval"]) == (75, 175, 150)


@pytest.mark.parametrize(
    "options,fragments",
    [
        (("--cal-size", "400"), ("--cal-size 400", "400 test rows")),
        (("--cal-size", "8"), ("--cal-size 8", "D_cal holds 6", "--alpha 0.3")),
        (("--eval-scores", "missing.parquet"), ("missing.parquet",)),
    ],
)
def test_validate_bad_fresh_options(
    scores: Path, tmp_path: Path, options: tuple[str, ...], fragments: tuple[str, ...]
):
    out = tmp_path / "trials.csv"
    args = [tmp_path / o if o.endswith(".parquet") else o for o in options]
    assert_clean_error(
        ctd("validate", "--scores", scores, *args, *FAST_VALIDATE, "--out", out), *fragments, unwritten=(out,)
    )


@pytest.mark.parametrize(
    "options,fragment", [(("--cal-size", "1"), "--cal-size"), (("--pvalue", "exact"), "--pvalue")]
)
def test_process_validate_usage_errors(scores: Path, options: tuple[str, ...], fragment: str):
    assert_process_error(ctd_process("validate", "--scores", scores, *options, *FAST_VALIDATE), fragment)


def test_validate_fresh_table_without_the_seeds(scores: Path, tmp_path: Path):
    fresh = tmp_path / "one-seed.parquet"
    assert_ok(ctd("simulate", "--scenario", "strong", "--n", 500, "--seeds", 1, "--out", fresh))
    out = tmp_path / "trials.csv"
    assert_clean_error(
        ctd("validate", "--scores", scores, "--eval-scores", fresh, *FAST_VALIDATE, "--out", out),
        "--eval-scores",
        "probe seed 1",
        unwritten=(out,),
    )


# --- calibrate ---------------------------------------------------------------------------------


def test_calibrate_json_and_files(scores: Path, tmp_path: Path):
    out = tmp_path / "cal"
    budgets, batch_sizes = (0.2, 0.35, 0.5), (32, 64)
    policies, objectives = (
        ("ctd", "unc-calibrated", "dv-topk", "oracle-topk", "unc-central"),
        ("auroc", "accuracy"),
    )
    summary = one_json_object(
        ctd(
            "calibrate",
            "--scores",
            scores,
            "--out",
            out,
            "--budgets",
            ",".join(map(str, budgets)),
            "--batch-sizes",
            ",".join(map(str, batch_sizes)),
            "--policies",
            ",".join(policies),
            "--objectives",
            ",".join(objectives),
            "--json",
        )
    )
    seeds = (0, 1)
    expected_rows = len(policies) * len(budgets) * len(batch_sizes) * len(seeds) * len(objectives)
    assert sorted(p.name for p in out.iterdir()) == [
        "baselines.csv",
        "groups.csv",
        "ltt.jsonl",
        "summary.json",
        "sweep.csv",
    ]

    sweep = read_csv(out / "sweep.csv")
    assert len(sweep) == expected_rows == summary["rows"]
    assert set(SWEEP_KEYS) <= set(sweep[0])
    combos = {
        (r["seed"], r["policy"], r["objective"], float(r["budget"]), int(r["batch_size"])) for r in sweep
    }
    assert len(combos) == expected_rows  # each combination exactly once
    assert {r["policy"] for r in sweep} == set(policies)
    assert {r["objective"] for r in sweep} == set(objectives)
    assert {float(r["budget"]) for r in sweep} == set(budgets)
    assert {int(r["batch_size"]) for r in sweep} == set(batch_sizes)
    assert {int(r["seed"]) for r in sweep} == set(seeds)
    assert {r["merge"] for r in sweep} <= {"overwrite", "average"}
    for r in sweep:
        assert 0 <= float(r["auroc"]) <= 1 and 0 <= float(r["accuracy"]) <= 1
        assert 0 <= float(r["realised"]) <= 1

    calibrated = [p for p in policies if p in ("ctd", "unc-calibrated")]
    lines = (out / "ltt.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(calibrated) * len(objectives) * len(seeds) * len(budgets)
    records = [json.loads(line) for line in lines]
    for record in records:
        assert set(record) >= LTT_KEYS
        assert len(record["pvalues"]) == len(record["k"]) == len(record["order"])
        assert set(record["certified"]) <= set(record["order"])
    keys = {(r["policy"], r["objective"], r["seed"], r["alpha"]) for r in records}
    assert len(keys) == len(records)

    on_disk = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert on_disk == summary
    assert summary["policies"] == list(policies) and summary["budgets"] == list(budgets)
    assert summary["seeds"] == list(seeds)

    baselines = read_csv(out / "baselines.csv")
    assert [int(r["seed"]) for r in baselines] == list(seeds)
    assert {"probe_auroc", "probe_accuracy", "expert_auroc", "expert_accuracy"} <= set(baselines[0])


def test_calibrate_budget_range_syntax(scores: Path, tmp_path: Path):
    out = tmp_path / "cal"
    summary = one_json_object(
        ctd(
            "calibrate",
            "--scores",
            scores,
            "--out",
            out,
            "--budgets",
            "0.2:0.6:3",
            "--batch-sizes",
            "64",
            "--json",
        )
    )
    assert summary["budgets"] == [0.2, 0.4, 0.6]
    assert len(read_csv(out / "sweep.csv")) == summary["rows"] == 5 * 3 * 1 * 2 * 2


def test_calibrate_prints_a_table_without_json(scores: Path, tmp_path: Path):
    out = tmp_path / "cal"
    result = ctd("calibrate", "--scores", scores, "--out", out, *FAST_CALIBRATE)
    assert_ok(result)
    for word in ("objective", "policy", "AUROC", "ctd", "dv-topk", "probe only", "expert only"):
        assert word in result.stdout, word
    assert "wrote 16 rows" in result.stdout  # 2 policies x 2 budgets x 1 batch size x 2 seeds x 2 objectives
    assert (out / "sweep.csv").is_file()


# --- --run NAME --------------------------------------------------------------------------------


@pytest.fixture
def runs_root(tmp_path: Path, scores: Path, monkeypatch) -> Path:
    root = tmp_path / "runs"
    (root / "exp1").mkdir(parents=True)
    shutil.copy(scores, root / "exp1" / "scores.parquet")
    monkeypatch.setenv("CTD_RUNS_DIR", str(root))
    return root


def test_calibrate_run_writes_into_the_run_folder(runs_root: Path):
    summary = one_json_object(ctd("calibrate", "--run", "exp1", *FAST_CALIBRATE, "--json"))
    folder = runs_root / "exp1" / "calibrate"
    assert Path(summary["out"]) == folder
    assert Path(summary["scores"]) == runs_root / "exp1" / "scores.parquet"
    assert sorted(p.name for p in folder.iterdir()) == [
        "baselines.csv",
        "groups.csv",
        "ltt.jsonl",
        "summary.json",
        "sweep.csv",
    ]
    assert len(read_csv(folder / "sweep.csv")) == summary["rows"] == 16


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


# --- help --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ((), ("simulate", "calibrate", "validate")),
        (("simulate",), ("--scenario", "--n", "--seeds", "--out")),
        (
            ("calibrate",),
            ("--scores", "--run", "--out", "--budgets", "--batch-sizes", "--policies", "--delta", "--json"),
        ),
        (
            ("validate",),
            (
                "--scores",
                "--run",
                "--mode",
                "--alpha",
                "--delta",
                "--trials",
                "--out",
                "--json",
                "--eval-scores",
                "--cal-size",
                "--pvalue",
                "--seed",
            ),
        ),
    ],
)
def test_help(command: tuple[str, ...], options: tuple[str, ...]):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert_ok(result)
    assert "Usage" in result.stdout
    for option in options:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.stdout), option


# --- bad tables --------------------------------------------------------------------------------

ROW = 123  # planted defects sit in data row 123 (0-based), inside seed 0's test split


def _drop(name: str) -> Callable[[dict], tuple[dict, int | None, tuple[str, ...]]]:
    def make(c):
        del c[name]
        return c, None, (f"'{name}'",)

    return make


def _set(name: str, value: object, *fragments: str) -> Callable[[dict], tuple[dict, int | None, tuple]]:
    def make(c):
        c[name][ROW] = value
        return c, ROW, (f"column '{name}'", *fragments)

    return make


def _duplicate_id(c):
    c["id"][ROW] = c["id"][ROW - 100]
    return c, ROW, ("column 'id'", str(c["id"][ROW]))


def _text_in_probe(c):
    c["probe"] = np.array([repr(float(v)) for v in c["probe"]], dtype=object)  # a string column
    c["probe"][ROW] = "abc"
    return c, ROW, ("column 'probe'", "'abc' is not a number")


def _no_test_rows(c):
    dev = c["split"] == "dev"
    return {k: v[dev] for k, v in c.items()}, None, ("'test'",)


def _one_label(c):
    c["label"][(c["seed"] == 1) & (c["split"] == "test")] = 0
    return c, None, ("column 'label'", "seed 1")


BAD_TABLES = {
    "missing-expert-column": _drop("expert"),
    "missing-id-column": _drop("id"),
    "label-2": _set("label", 2, "2 is not 0 or 1"),
    "label-minus-1": _set("label", -1, "-1 is not 0 or 1"),
    "probe-above-1": _set("probe", 1.5, "1.5 is outside [0, 1]"),
    "expert-below-0": _set("expert", -0.25, "-0.25 is outside [0, 1]"),
    "nan-probe": _set("probe", np.nan, "missing value"),
    "nan-expert": _set("expert", np.nan, "missing value"),
    "nan-dv-on-a-test-row": _set("dv", np.nan, "missing value"),
    "inf-dv": _set("dv", np.inf, "infinite value"),
    "bad-split": _set("split", "train", "'train'"),
    "text-in-probe": _text_in_probe,
    "duplicate-id": _duplicate_id,
    "no-test-rows": _no_test_rows,
    "one-label-only": _one_label,
}


def _commands(tmp_path: Path, path: Path) -> dict[str, tuple[list[object], tuple[Path, ...]]]:
    trials, folder = tmp_path / "trials.csv", tmp_path / "cal"
    return {
        "validate": (["validate", "--scores", path, *FAST_VALIDATE, "--out", trials], (trials,)),
        "calibrate": (["calibrate", "--scores", path, "--out", folder, *FAST_CALIBRATE], (folder,)),
    }


@pytest.mark.parametrize("command", ["validate", "calibrate"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_bad_table(tmp_path: Path, base, case: str, fmt: str, command: str):
    columns, row, fragments = BAD_TABLES[case](copy(base))
    path = write_table(tmp_path / f"bad.{fmt}", columns)
    args, unwritten = _commands(tmp_path, path)[command]
    located = (where(fmt, row),) if row is not None else ()
    message = assert_clean_error(ctd(*args), str(path), *fragments, *located, unwritten=unwritten)
    if case == "duplicate-id":
        assert f"first at {where(fmt, ROW - 100)}" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("column", ["label", "probe", "seed", "group"])
def test_parquet_null_cell(tmp_path: Path, base, column: str):
    columns = copy(base)
    arrays = {k: pa.array(v.tolist() if v.dtype == object else v) for k, v in columns.items()}
    mask = np.zeros(len(columns[column]), bool)
    mask[ROW] = True
    arrays[column] = pa.array(columns[column].tolist(), mask=mask)
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table(arrays), path)
    args, unwritten = _commands(tmp_path, path)["validate"]
    fragment = "empty value" if column == "group" else "missing value"
    assert_clean_error(
        ctd(*args), str(path), f"column '{column}'", f"row {ROW + 1}", fragment, unwritten=unwritten
    )


def test_same_id_in_other_split_or_seed_is_fine(tmp_path: Path, base):
    columns = copy(base)
    test0 = np.flatnonzero((columns["split"] == "test") & (columns["seed"] == 0))
    dev0 = np.flatnonzero((columns["split"] == "dev") & (columns["seed"] == 0))
    columns["id"][dev0[:50]] = columns["id"][test0[:50]]  # same ids in dev and test of seed 0
    seed0 = columns["id"][columns["seed"] == 0].tolist()
    assert len(set(seed0)) == len(seed0) - 50  # 50 ids repeat across the splits of seed 0
    path = write_table(tmp_path / "ok.csv", columns)
    record = one_json_object(ctd("validate", "--scores", path, *FAST_VALIDATE, "--json"))
    check_summary(record, 20)


def _edit_csv(path: Path, index: int, column: str, text: str) -> None:
    """Replace one cell of data row `index` (0-based) in a CSV without quoted fields."""
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    fields = lines[index + 1].rstrip("\r\n").split(",")
    fields[SCORES_COLUMNS.index(column)] = text
    lines[index + 1] = ",".join(fields) + "\r\n"
    path.write_bytes("".join(lines).encode("utf-8"))


CSV_CELLS = [
    ("probe", "abc", "'abc' is not a number"),
    ("expert", "0.5x", "'0.5x' is not a number"),
    ("label", "yes", "'yes' is not a number"),
    ("label", "0.5", "0.5 is not 0 or 1"),
    ("seed", "1.5", "1.5 is not an integer"),
    ("seed", "x1", "'x1' is not a number"),
    ("probe", "nan", "missing value"),
    ("expert", "NaN", "missing value"),
    ("probe", "", "missing value"),
    ("probe", "inf", "outside [0, 1]"),
    ("id", "", "empty value"),
]


@pytest.mark.parametrize("command", ["validate", "calibrate"])
@pytest.mark.parametrize(("column", "text", "fragment"), CSV_CELLS)
def test_bad_csv_cell(tmp_path: Path, base, column: str, text: str, fragment: str, command: str):
    path = write_table(tmp_path / "bad.csv", base)
    _edit_csv(path, ROW, column, text)
    args, unwritten = _commands(tmp_path, path)[command]
    assert_clean_error(
        ctd(*args), str(path), f"column '{column}'", fragment, f"line {ROW + 2}", unwritten=unwritten
    )


def test_csv_line_numbers_count_blank_lines(tmp_path: Path, base):
    path = write_table(tmp_path / "bad.csv", base)
    _edit_csv(path, ROW, "probe", "oops")
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    lines[5:5] = ["\r\n"] * 3  # three blank lines before the bad row
    path.write_bytes("".join(lines).encode("utf-8"))
    assert path.read_text(encoding="utf-8").splitlines()[ROW + 4].startswith(str(base["id"][ROW]))
    args, unwritten = _commands(tmp_path, path)["validate"]
    assert_clean_error(ctd(*args), str(path), "column 'probe'", f"line {ROW + 5}", unwritten=unwritten)


def test_csv_row_with_wrong_field_count(tmp_path: Path, base):
    path = write_table(tmp_path / "bad.csv", base)
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    lines[ROW + 1] = lines[ROW + 1].rstrip("\r\n") + ",extra\r\n"
    path.write_bytes("".join(lines).encode("utf-8"))
    args, unwritten = _commands(tmp_path, path)["calibrate"]
    assert_clean_error(ctd(*args), str(path), f"line {ROW + 2}", "10 fields", unwritten=unwritten)


# --- too small for any certified threshold -----------------------------------------------------


def test_too_few_test_rows_per_seed(tmp_path: Path):
    path = write_table(tmp_path / "small.parquet", simulate_scores("strong", 20, 2, random_state=2))
    commands = _commands(tmp_path, path)
    # 20 test rows: D_cal holds 7, while --budgets 0.2 needs 11 (0.8^11 <= 0.1).
    args, unwritten = commands["calibrate"]
    assert_clean_error(ctd(*args), str(path), "20 test rows", "D_cal holds 7", "11", unwritten=unwritten)
    # The default budgets start at 0.05, which needs 45.
    folder = tmp_path / "cal2"
    assert_clean_error(ctd("calibrate", "--scores", path, "--out", folder), "45", unwritten=(folder,))
    args, unwritten = commands["validate"]
    assert_clean_error(
        ctd(*args, "--alpha", 0.2), str(path), "D_cal holds 7", "--alpha 0.2", unwritten=unwritten
    )


def test_alpha_too_small_for_the_calibration_set(tmp_path: Path, scores: Path):
    out, folder = tmp_path / "trials.csv", tmp_path / "cal"
    # 400 test rows per seed: D_cal holds 140; alpha 0.01 needs 230 (0.99^230 <= 0.1).
    assert_clean_error(
        ctd("validate", "--scores", scores, "--alpha", 0.01, "--out", out),
        str(scores),
        "D_cal holds 140",
        "230",
        unwritten=(out,),
    )
    assert_clean_error(
        ctd("calibrate", "--scores", scores, "--out", folder, "--budgets", "0.01,0.5"),
        str(scores),
        "--budgets 0.01",
        unwritten=(folder,),
    )


# --- bad options -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
@pytest.mark.parametrize("option", ["--alpha", "--delta"])
def test_validate_level_outside_unit_interval(tmp_path: Path, scores: Path, option: str, value: str):
    out = tmp_path / "trials.csv"
    result = ctd("validate", "--scores", scores, option, value, *FAST_VALIDATE, "--out", out)
    assert_clean_error(result, option, f"{float(value):g}", "outside (0, 1)", unwritten=(out,))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--delta", "0", "outside (0, 1)"),
        ("--delta", "1", "outside (0, 1)"),
        ("--delta", "1.5", "outside (0, 1)"),
        ("--delta", "-0.1", "outside (0, 1)"),
        ("--budgets", "0,0.5", "0 is outside (0, 1)"),
        ("--budgets", "0.2,1", "1 is outside (0, 1)"),
        ("--budgets", "1.5", "1.5 is outside (0, 1)"),
        ("--budgets", "-0.1,0.2", "-0.1 is outside (0, 1)"),
        ("--budgets", "0:0.5:3", "0 is outside (0, 1)"),
        ("--budgets", "abc", "expected numbers"),
        ("--budgets", ",", "no values"),
        ("--policies", "ctd,bogus", "'bogus'"),
        ("--policies", "CTD", "'CTD'"),
        ("--objectives", "auroc,f1", "'f1'"),
        ("--batch-sizes", "0", "positive integers"),
        ("--batch-sizes", "32,x", "expected integers"),
    ],
)
def test_calibrate_bad_option(tmp_path: Path, scores: Path, option: str, value: str, fragment: str):
    folder = tmp_path / "cal"
    args = {"--budgets": "0.2,0.5", "--batch-sizes": "32", "--policies": "ctd", option: value}
    flat = [item for pair in args.items() for item in pair]
    result = ctd("calibrate", "--scores", scores, "--out", folder, *flat)
    assert_clean_error(result, option, fragment, unwritten=(folder,))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_missing_file(tmp_path: Path, command: str):
    for name in ("nope.parquet", "nope.csv"):
        path = tmp_path / name
        args, unwritten = _commands(tmp_path, path)[command]
        assert_clean_error(ctd(*args), str(path), "no such file", unwritten=unwritten)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("garbage.parquet", bytes(range(256)) * 4, "not a readable Parquet file"),
        ("empty.parquet", b"", "not a readable Parquet file"),
        ("scores.csv.parquet", b"id,group\n1,2\n", "not a readable Parquet file"),
        ("empty.csv", b"", "empty file"),
        ("latin1.csv", "id,gr\xe9oupe\n".encode("latin-1"), "not UTF-8"),
        ("header-only.csv", (",".join(SCORES_COLUMNS) + "\n").encode(), "no rows"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_unreadable_file(tmp_path: Path, command: str, name: str, content: bytes, fragment: str):
    path = tmp_path / name
    path.write_bytes(content)
    args, unwritten = _commands(tmp_path, path)[command]
    assert_clean_error(ctd(*args), str(path), fragment, unwritten=unwritten)
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_folder_given_as_scores(tmp_path: Path):
    folder = tmp_path / "a-folder.parquet"
    folder.mkdir()
    args, unwritten = _commands(tmp_path, folder)["validate"]
    assert_clean_error(ctd(*args), str(folder), "folder", unwritten=unwritten)


def test_scores_and_run_are_exclusive(tmp_path: Path, scores: Path):
    out = tmp_path / "trials.csv"
    assert_clean_error(ctd("validate", "--out", out), "--scores", "--run", unwritten=(out,))
    assert_clean_error(
        ctd("validate", "--scores", scores, "--run", "x", "--out", out), "--scores", "--run", unwritten=(out,)
    )


def test_calibrate_needs_an_output_folder(scores: Path):
    assert_clean_error(ctd("calibrate", "--scores", scores, *FAST_CALIBRATE), "--out")


# --- the real console script -------------------------------------------------------------------


def assert_process_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ")
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    return proc.stderr


def test_process_bad_csv_row(tmp_path: Path, base):
    columns = copy(base)
    columns["label"][ROW] = 2
    path = write_table(tmp_path / "bad.csv", columns)
    folder = tmp_path / "cal"
    proc = ctd_process("calibrate", "--scores", path, "--out", folder, "--budgets", "0.2,0.5")
    assert_process_error(proc, str(path), "column 'label'", f"line {ROW + 2}:")
    assert not folder.exists()


def test_process_garbage_parquet_and_bad_alpha(tmp_path: Path, scores: Path):
    path = tmp_path / "garbage.parquet"
    path.write_bytes(b"\x00garbage" * 100)
    out = tmp_path / "trials.csv"
    assert_process_error(ctd_process("validate", "--scores", path, "--out", out), str(path), "Parquet")
    assert_process_error(
        ctd_process("validate", "--scores", scores, "--alpha", "1.5", "--out", out), "--alpha", "outside"
    )
    assert not out.exists()


def test_process_validate_json(scores: Path):
    proc = ctd_process("validate", "--scores", scores, "--trials", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.count("\n") == 1
    check_summary(json.loads(proc.stdout), 20)
