"""The real console script in a fresh interpreter: clean errors and a JSON record on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from cli_checks import (
    ROW,
    assert_process_error,
    check_summary,
    copy,
    ctd_process,
)

from harness import write_table


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
