"""`ctd calibrate --budget B1,B2 [--accuracy A] [--abstain H]` on a cascade of experts: one row
per seed and level whose rates are the chosen configuration run input by input on the evaluation
half, its JSON summary and table, one line for each mistake, and a one-expert table's sweep
unchanged to the byte (decisions.parquet: its table, rewritten in one piece)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_checks import assert_clean_error, assert_ok, ctd, one_json_object, read_csv

import calibrate
from harness import read_scores, simulate_scores, write_scores

# sha256 of `ctd calibrate`'s files for simulate_scores("weak", 300, 2), --budgets 0.1,0.25,0.5
# --batch-sizes 16,40, computed with main at 1f5edf2, before cascades reached `ctd calibrate`.
PINNED_FILES = {
    "sweep.csv": "2dc64ba07adcebd7772a95ad7af1e598a4984ca7ed84056423cde6f4ae409327",
    # Re-pinned 2026-11-28: the group sums were matrix products, whose BLAS kernel (OpenBLAS's
    # SkylakeX here before, Haswell on this AMD machine) ordered them per CPU; they are now taken in
    # the examples' order (np.bincount), the same bytes whatever OPENBLAS_CORETYPE says.
    "groups.csv": "06e7598f15b6314621146e7c999f44e585913e4c97a8ae00476ebe83709e3421",
    "ltt.jsonl": "3fcf05f9bf21b44ae7f207f9ee80779aa16cd35164f987f7e6984bb875d03e3a",
    "baselines.csv": "de2c61b64f1fa33b73bff50b643d151c0b70a63164622dc8d6d16c2b748c526e",
    "decisions.parquet": "a465dcfa58e289643d712092ceff93c298b2935c70e15dd3f5011e50a459ed8f",
}
# summary.json less its paths and timing (sorted keys), on the same commit.
PINNED_SUMMARY = "4530af4509579e73229f7d9907abb21de2af09c7977147c32978a1a56d715028"


def one_piece_bytes(path: Path) -> bytes:
    """A file's bytes; for decisions.parquet (written one mask group, one row group, at a time
    since 1f5edf2) those of its table written in one piece, as 1f5edf2 wrote it: the same rows
    and schema give the same bytes."""
    if path.suffix != ".parquet":
        return path.read_bytes()
    buffer = io.BytesIO()
    pq.write_table(pq.read_table(path).combine_chunks(), buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cascade") / "c2.parquet"
    args = ("--scenario", "strong", "--stages", 2, "--n", 2000, "--seeds", 2, "--n-dev", 1, "--out", path)
    assert_ok(ctd("simulate", *args))
    return path


def _number(cell: str) -> float:
    return float("nan") if cell == "" else float(cell)


def test_each_row_is_the_chosen_configuration_run_on_the_evaluation_half(
    cascade: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = one_json_object(
        ctd(
            "calibrate", "--scores", cascade, "--out", out, "--budget", "0.5,0.2", "--budget", "0.3,0.1",
            "--accuracy", 0.85, "--abstain", 0.1, "--json",
        )
    )  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["baselines.csv", "summary.json", "sweep.csv"]
    rows = read_csv(out / "sweep.csv")
    assert tuple(rows[0]) == calibrate.cascade_sweep_columns(2)
    assert len(rows) == summary["rows"] == 4  # 2 seeds x 2 levels
    assert [entry["levels"] for entry in summary["by_level"]] == [
        {"budget-1": 0.5, "budget-2": 0.2, "error": 0.15, "abstain": 0.1},
        {"budget-1": 0.3, "budget-2": 0.1, "error": 0.15, "abstain": 0.1},
    ]
    by_seed = read_scores(cascade).cascade_scores()
    certified = 0
    for row in rows:
        scores = by_seed[int(row["seed"])]
        splits = calibrate.random_splits(scores.n, 1, [calibrate.DEFAULT_SPLIT_SEED, int(row["seed"])])
        assert int(row["n_eval"]) == splits.evaluation.shape[1]
        if row["margin"] == "":  # nothing certified: no configuration, no rates
            assert int(row["n_certified"]) == 0 and row["calls_1"] == row["accuracy"] == ""
            continue
        certified += 1
        thresholds = np.array([[_number(row["threshold_1"]), _number(row["threshold_2"])]])
        outcome = calibrate.cascade_outcome(
            scores, splits.evaluation, thresholds, np.array([float(row["margin"])])
        )
        m = outcome.n
        assert [float(row["calls_1"]), float(row["calls_2"])] == [c / m for c in outcome.calls[0]]
        assert (
            float(row["error"]) == outcome.wrong[0] / m
            and float(row["abstained"]) == outcome.abstained[0] / m
        )
        assert float(row["accuracy"]) == 1 - outcome.wrong[0] / m
        assert int(row["n_certified"]) >= 1
    assert certified >= 1  # the loose level certifies on 2,000-row splits


def test_ctd_and_uncertainty_side_by_side(cascade: Path, tmp_path: Path) -> None:
    """--policies ctd,uncertainty: a policy column, CTD's rows those of CTD alone, and per level
    both policies' accuracy, calls per expert and abstentions in the printed summary."""
    args = ("--budget", "0.5,0.2", "--budget", "0.3,0.1", "--accuracy", 0.85, "--abstain", 0.1)
    assert_ok(ctd("calibrate", "--scores", cascade, "--out", tmp_path / "ctd", *args))
    done = ctd(
        "calibrate", "--scores", cascade, "--out", tmp_path / "both", *args, "--policies", "ctd,uncertainty",
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert_ok(done)
    alone, both = read_csv(tmp_path / "ctd" / "sweep.csv"), read_csv(tmp_path / "both" / "sweep.csv")
    assert tuple(both[0]) == calibrate.cascade_sweep_columns(2, policy=True)
    assert [row["policy"] for row in both] == ["ctd", "uncertainty"] * 4
    assert [
        {k: v for k, v in row.items() if k != "policy"} for row in both if row["policy"] == "ctd"
    ] == alone
    summary = json.loads((tmp_path / "both" / "summary.json").read_text(encoding="utf-8"))
    assert summary["policies"] == ["ctd", "uncertainty"]
    assert [(e["policy"], e["levels"]["budget-1"]) for e in summary["by_level"]] == [
        ("ctd", 0.5),
        ("uncertainty", 0.5),
        ("ctd", 0.3),
        ("uncertainty", 0.3),
    ]
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if "per level and policy" in line)
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines[title:] if line.startswith("│")]
    assert [c[:2] for c in cells[:2]] == [
        ["budget-1 0.5, budget-2 0.2, error 0.15, abstain 0.1", "ctd"],
        ["", "uncertainty"],
    ]
    entry = summary["by_level"][1]
    mean = entry["mean"]
    assert cells[1][2:] == [
        f"{entry['seeds_certified']}/{entry['seeds']}",
        *(f"{mean[r]:.3f}" for r in ("accuracy", "calls_1", "calls_2", "abstained")),
    ]
    assert "policies" not in json.loads((tmp_path / "ctd" / "summary.json").read_text(encoding="utf-8"))


def test_the_table_and_the_run_default_folder(cascade: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "r" / "cascade").mkdir(parents=True)
    (runs / "r" / "cascade" / "scores.parquet").write_bytes(cascade.read_bytes())
    done = ctd(
        "calibrate", "--run", "r", "--budget", "0.5,0.2", "--accuracy", 0.85, env={"CTD_RUNS_DIR": str(runs)}
    )
    assert_ok(done)
    assert "cascade of 2 experts" in done.stdout and "certified in" in done.stdout
    assert "alone: probe accuracy" in done.stdout
    assert len(read_csv(runs / "r" / "cascade" / "calibrate" / "sweep.csv")) == 2


def test_one_expert_with_budget_is_a_one_stage_cascade(tmp_path: Path) -> None:
    path = write_scores(tmp_path / "s.parquet", simulate_scores("strong", 1000, 2))
    summary = one_json_object(
        ctd("calibrate", "--scores", path, "--out", tmp_path / "o", "--budget", 0.3, "--json")
    )
    assert summary["stages"] == 1 and summary["rows"] == 2
    assert tuple(read_csv(tmp_path / "o" / "sweep.csv")[0]) == calibrate.cascade_sweep_columns(1)


def test_a_one_expert_sweep_is_the_same_bytes(tmp_path: Path) -> None:
    path = write_scores(tmp_path / "s.parquet", simulate_scores("weak", 300, 2))
    out = tmp_path / "out"
    assert_ok(
        ctd(
            "calibrate", "--scores", path, "--out", out, "--budgets", "0.1,0.25,0.5", "--batch-sizes", "16,40"
        )
    )
    for name, digest in PINNED_FILES.items():
        assert hashlib.sha256(one_piece_bytes(out / name)).hexdigest() == digest, name
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for volatile in ("scores", "out", "table", "groups_table", "elapsed_s"):
        summary.pop(volatile)
    assert hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest() == PINNED_SUMMARY


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (("--budget", "0.5,0.2,0.1"), ("3 budget(s), one per expert", "a cascade of 2")),
        (("--budget", "0.5,0.2", "--budget", "0.3"), ("--budget", "one budget per expert, got 1 and 2")),
        (("--budget", "0.5,1.2"), ("--budget",)),
        (("--budget", "0.1:0.5:2"), ("--budget '0.1:0.5:2'", "not a START:STOP:COUNT range")),
        (("--budget", "0.5,x"), ("--budget '0.5,x'", "one number per expert")),
        (("--budget", "0.5,0.2", "--budget", "0.5,0.2"), ("--budget 0.5,0.2: given twice",)),
        (("--budget", "0.5,0.2", "--abstain", "1.5"), ("--abstain",)),
        (
            ("--budget", "0.5,0.2", "--policies", "ctd,unc-topk"),
            ("--policies: unknown value 'unc-topk'", "ctd, uncertainty"),
        ),
        (("--budget", "0.5,0.2", "--policies", "ctd,ctd"), ("--policies 'ctd,ctd': item 2 repeats 'ctd'",)),
        (("--budget", "0.5,0.2", "--objectives", "accuracy"), ("--objectives", "does not apply")),
        (("--budget", "0.5,0.2", "--budgets", "0.2"), ("--budgets", "does not apply to a cascade")),
        (("--abstain", "0.1"), ("--abstain: give the cascade's budgets too",)),
        (("--budget", "0.001,0.2"), ("--budget (expert 1) 0.001", "needs at least")),
        ((), ("a cascade of 2 experts", "--budget B1,B2", "one each")),
    ],
)
def test_bad_input_is_one_line(
    cascade: Path, tmp_path: Path, extra: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    assert_clean_error(
        ctd("calibrate", "--scores", cascade, "--out", out, *extra), *fragments, unwritten=(out,)
    )


def test_a_run_without_a_cascade_table_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs" / "r").mkdir(parents=True)
    done = ctd("calibrate", "--run", "r", "--budget", "0.5,0.2", env={"CTD_RUNS_DIR": str(tmp_path / "runs")})
    assert_clean_error(done, "--run", "was the run's --expert a cascade")
