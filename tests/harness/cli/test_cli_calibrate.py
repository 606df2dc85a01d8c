"""`ctd calibrate`: its JSON summary and files, the budget range syntax, and its table."""

from __future__ import annotations

import json
from pathlib import Path

from cli_checks import (
    CALIBRATE_FILES,
    FAST_CALIBRATE,
    LTT_KEYS,
    SWEEP_KEYS,
    assert_ok,
    ctd,
    one_json_object,
    read_csv,
)


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
    assert sorted(p.name for p in out.iterdir()) == CALIBRATE_FILES

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


def test_calibrate_with_accuracy_certifies_jointly(scores: Path, tmp_path: Path):
    """--accuracy: ltt.jsonl holds joint records at (budget, 1 - accuracy); a row without a
    certified threshold has empty metrics and n_certified 0; the summary and the printed table
    say over how many rows the means run."""
    out = tmp_path / "cal"
    args = ("calibrate", "--scores", scores, "--out", out, *FAST_CALIBRATE, "--accuracy", "0.7")
    summary = one_json_object(ctd(*args, "--fwer", "fallback", "--json"))
    assert summary["accuracy"] == 0.7 and summary["error_level"] == 0.3 and summary["fwer"] == "fallback"
    records = [json.loads(line) for line in (out / "ltt.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 1 * 2 * 2 * 2  # ctd x objectives x seeds x budgets
    assert {r["mode"] for r in records} == {"joint"} and {r["fwer"] for r in records} == {"fallback"}
    assert {(r["levels"]["budget"], r["levels"]["error"]) for r in records} == {(0.2, 0.3), (0.5, 0.3)}
    rows = [r for r in read_csv(out / "sweep.csv") if r["policy"] == "ctd"]
    empty = [r for r in rows if r["threshold"] == ""]
    assert 0 < len(empty) < len(rows)  # both kinds of row (3 of the 4 budget x seed cells certify)
    assert all(r["n_certified"] == "0" and r["auroc"] == r["realised"] == "" for r in empty)
    assert all(int(r["n_certified"]) > 0 and 0 <= float(r["realised"]) <= 1 for r in rows if r not in empty)
    found = summary["policies_found"]
    assert sum(found[o]["ctd"]["with_policy"] for o in found) == len(rows) - len(empty)
    printed = ctd(*args)
    assert_ok(printed)
    assert "with policy" in printed.stdout and "joint with error <= 0.3" in printed.stdout
