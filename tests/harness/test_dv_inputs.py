"""`ctd dv`'s inputs: the expert scores tables `ctd query` writes, read as the user has them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd

from harness import InputError, write_table
from harness.data.builtin import builtin_dir
from harness.stages import read_expert_scores


def test_an_empty_expert_cell_is_a_failed_expert(tmp_path: Path) -> None:
    # `ctd query` writes NaN (the expert failed on the row) as an empty CSV cell
    table = write_table(tmp_path / "q.csv", {"id": np.array(["a", "b"]), "expert": np.array([0.25, np.nan])})
    assert "a,0.25" in table.read_text() and "b,\n" in table.read_text().replace("\r\n", "\n")
    scores = read_expert_scores([table])
    assert scores["a"] == 0.25 and math.isnan(scores["b"])


def test_a_non_number_expert_cell_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "q.csv").write_text("id,expert\na,0.5\nb,high\n")
    result = run_ctd(
        "dv", "--probe-dir", "probe", "--expert-scores", "q.csv", "--out", "dv.csv", cwd=tmp_path
    )
    assert_one_line_error(result, "q.csv", "line 3", "'high'", "not a number")
    assert not (tmp_path / "dv.csv").exists()


def test_a_probe_dir_without_probe_scores_is_named_as_the_option(tmp_path: Path) -> None:
    (tmp_path / "q.csv").write_text("id,expert\na,0.5\n")
    (tmp_path / "empty").mkdir()
    for probe_dir in ("missing", "empty"):
        result = run_ctd(
            "dv", "--probe-dir", probe_dir, "--expert-scores", "q.csv", "--out", "dv.csv", cwd=tmp_path
        )
        assert_one_line_error(result, f"--probe-dir {probe_dir}", "ctd probe", "probe_scores.parquet")
    assert not (tmp_path / "dv.csv").exists()


def test_integer_ids_scored_differently_in_two_tables_are_refused(tmp_path: Path) -> None:
    first = write_table(tmp_path / "a.parquet", {"id": np.array([5, 6]), "expert": np.array([0.1, 0.2])})
    second = write_table(tmp_path / "b.parquet", {"id": np.array([5, 6]), "expert": np.array([0.1, 0.9])})
    with pytest.raises(InputError, match=r"b\.parquet: row 2: id '6' has two different expert scores"):
        read_expert_scores([first, second])


def _write_rows(path: Path, rows: list[dict]) -> None:
    """`rows` as a JSONL file, numbered 0, 1, ... as files of one group often are."""
    lines = [
        json.dumps({"inputs": r["inputs"], "ids": str(i), "labels": r["labels"]}) for i, r in enumerate(rows)
    ]
    path.write_text("".join(line + "\n" for line in lines))


@pytest.fixture(scope="module")
def two_group_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ctd probe` on dev and test files of two groups (da, db) whose ids both run 0..7: the probe
    stage names them "da/0", "db/0", ... (the embedded model, one arch, one seed, short inputs)."""
    folder = tmp_path_factory.mktemp("two_groups")
    rows = [json.loads(line) for line in (builtin_dir() / "train.jsonl").read_text().splitlines()]
    high = [r for r in rows if r["labels"] == "high-stakes"]
    low = [r for r in rows if r["labels"] == "low-stakes"]
    files = {"train": 6, "da": 4, "db": 4, "ta": 4, "tb": 4}
    start = 0
    for name, half in files.items():
        _write_rows(folder / f"{name}.jsonl", high[start : start + half] + low[start : start + half])
        start += half
    spec = "train=train.jsonl dev=da:da.jsonl,db:db.jsonl test=da:ta.jsonl,db:tb.jsonl"
    env = {"CTD_STORE": str(folder / "store"), "HF_HUB_OFFLINE": "1"}
    args = ("--arch", "mean", "--seeds", "0", "--epochs", "2", "--max-tokens", "32")
    result = run_ctd("probe", "--data", spec, "--out", "probe", *args, cwd=folder, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return folder


def test_group_qualified_probe_ids_find_their_query_tables(two_group_probe: Path) -> None:
    folder = two_group_probe
    # What `ctd query --data da.jsonl` (and db.jsonl) writes: the file's own ids, 0..7
    for group, base in (("da", 0.1), ("db", 0.5)):
        write_table(
            folder / f"q_{group}.csv",
            {"id": np.array([str(i) for i in range(8)]), "expert": base + np.arange(8) / 20},
        )
    result = run_ctd(
        "dv", "--probe-dir", "probe", "--expert-scores", "da:q_da.csv", "--expert-scores", "db:q_db.csv",
        "--out", "dv.csv", "--epochs", "2", cwd=folder,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    dv = (folder / "dv.csv").read_text()
    assert "db/7" in dv and "da/0" in dv
    # One table only: the other group's examples are named as plain strings, as the probe names them
    missing = run_ctd(
        "dv", "--probe-dir", "probe", "--expert-scores", "da:q_da.csv", "--out", "dv2.csv", cwd=folder
    )
    assert_one_line_error(missing, "no score for dev example 'db/0'")
    assert "np.str_" not in missing.stderr and not (folder / "dv2.csv").exists()
